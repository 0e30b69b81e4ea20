//! The ureq agent every request goes through: cmpoll's TLS connector (`tls.rs`), an
//! optional CONNECT proxy chosen by the caller (never one ureq finds in the environment),
//! no redirects, HTTP status codes as answers rather than errors, and one deadline from
//! connect to the last body byte.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use ureq::unversioned::resolver::DefaultResolver;
use ureq::unversioned::transport::{ConnectProxyConnector, Connector as _, TcpConnector};

use super::tls::TlsConnector;

/// How to build an agent.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub tls: Arc<rustls::ClientConfig>,
    /// The name the server's certificate is checked against, when not the URL's host.
    pub server_name: Option<ServerName<'static>>,
    /// Connect to last body byte.
    pub timeout: Duration,
    /// No `Accept-Encoding: gzip`.
    pub disable_compression: bool,
    pub proxy: Option<ureq::Proxy>,
}

pub fn agent(o: AgentOptions) -> ureq::Agent {
    let connector =
        ().chain(ConnectProxyConnector::default())
            .chain(TcpConnector::default())
            .chain(TlsConnector {
                config: o.tls,
                server_name: o.server_name,
            });
    let mut builder = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .https_only(false)
        .proxy(o.proxy)
        .max_redirects(0)
        .user_agent(format!("cmpoll/{}", env!("CARGO_PKG_VERSION")))
        .timeout_global(Some(o.timeout))
        .max_idle_connections_per_host(2);
    if o.disable_compression {
        builder = builder.accept_encoding(ureq::config::AutoHeaderValue::None);
    }
    ureq::Agent::with_parts(builder.build(), connector, DefaultResolver::default())
}
