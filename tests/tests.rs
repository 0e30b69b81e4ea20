//! cmpoll's integration tests: one test binary (ripgrep-style), the real `cmpoll` binary
//! against the test apiserver (`tests/apiserver`).

// A test binary: unwrapping is how it fails loudly.
#![allow(clippy::unwrap_used)]

// The harness: the real binary, the test apiserver, fake hubs, oracles' helpers.
mod util;

// Real nginx and Prometheus read what cmpoll delivers.
mod agents;
// Alloy modules, proved with a real Grafana Alloy.
mod alloy_modules;
// The supervised agent (`run -- AGENT`) and its signals.
mod child;
// Every credential source, in SPEC's order.
mod credentials;
// The shipped Grafana dashboard, its queries parsed by promtool.
mod dashboard;
// The Debian package: lintian, dpkg, systemd-analyze.
mod deb;
// The systemd unit, the manifests (schemas, checkov), the Dockerfile.
mod deploy;
// `docs/` describes what is built: flags, metrics, links.
mod docs;
// Every injectable apiserver fault, in every phase, against every sink.
mod faults;
// A follower against a scripted hub: cuts, stale events, 410s, silence.
mod follow;
// The shipped images, run by a real OCI runtime.
mod image;
// Kubeconfigs, kubectl as the oracle.
mod kubectl_parity;
// `cmpoll list` end to end.
mod list;
// `--list-mode`: metadata lists and GETs of what changed.
mod metadata;
// SPEC's "Never" section under hostile answers, crashes, slow clients.
mod never;
// Exec plugins, CONNECT proxies, a rotating CA file.
mod offcluster;
// Endpoints, metrics, sd_notify and JSON logs across a daemon's life.
mod ops;
// `--out-dir`: layouts, atomic switches, ownership, crashes.
mod outdir;
// Each shipped Deployment run as a kubelet would, simulated (tests/cluster: a real one).
mod pod;
// Against the real kube-apiserver (its metrics and audit log as the oracle).
mod real;
// `--reload-url` against real local endpoints.
mod reload;
// `cmpoll run`: the loop, its events, faults and signals.
mod run;
// `--resource secrets`: binary files, modes, no value anywhere readable.
mod secrets;
// `cmpoll sidecar` configured by k8s-sidecar's variables alone.
mod sidecar;
// K8s-sidecar itself as the oracle of `cmpoll sidecar`.
mod sidecar_oracle;
// ~1,000 ConfigMaps under churn and faults (ignored by default).
mod soak;
// `cmpoll status` against a real daemon.
mod status;
// `--fetch-url-keys` against a web server of the test's own.
mod urls;
// `--validate`: real validators, the last known good version.
mod validate;
// The output folder on a tmpfs with a size limit.
mod volume;
// `cmpoll webhook` under hostile clients.
mod webhook;
