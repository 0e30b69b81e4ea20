//! HTTP and TLS for everything cmpoll calls: the apiserver (`kube::Client`) and reload URLs
//! (`sink::reload_url`). One place builds the agent (rustls through our connector, no
//! redirects, no proxy from ureq's own reading of the environment, status codes as answers)
//! and one place makes URLs fit for a log line.

pub mod agent;
pub mod tls;
pub mod url;

pub use agent::{APISERVER_IDLE, AgentOptions, SHORT_IDLE, agent};
