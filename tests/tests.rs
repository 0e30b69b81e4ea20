//! cmpoll's integration tests: one test binary (ripgrep-style), the real `cmpoll` binary
//! against the test apiserver (`tests/apiserver`).

// A test binary: unwrapping is how it fails loudly.
#![allow(clippy::unwrap_used)]

mod util;

mod agents;
mod alloy_modules;
mod child;
mod credentials;
mod dashboard;
mod deb;
mod deploy;
mod docs;
mod faults;
mod follow;
mod image;
mod kubectl_parity;
mod list;
mod metadata;
mod never;
mod offcluster;
mod ops;
mod outdir;
mod pod;
mod real;
mod reload;
mod run;
mod secrets;
mod sidecar;
mod sidecar_oracle;
mod soak;
mod status;
mod urls;
mod validate;
mod volume;
mod webhook;
