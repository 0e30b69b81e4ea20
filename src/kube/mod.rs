//! Reaching the apiserver. Config is data, the client is transport (kube-rs's split):
//! `Config::resolve` decides, from flags, kubeconfig files and the environment, where the
//! apiserver is and how to authenticate, without any I/O beyond reading those files;
//! `Client` turns a `Config` into HTTPS requests (through `crate::http`) and typed errors.
//! What the answers mean is the source's business (`crate::source`).

pub mod auth;
pub mod client;
pub mod config;
pub mod context;
pub mod exec;
pub mod impersonate;
pub mod incluster;
pub mod kubeconfig;
pub mod proxy;

pub mod error;

pub use client::Client;
pub use config::Config;
pub use error::Error;
