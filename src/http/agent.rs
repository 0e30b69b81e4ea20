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
    /// How long an idle connection is kept for the next request (`SHORT_IDLE` but for the
    /// apiserver).
    pub keep_idle: Duration,
}

/// ureq's own default: reload URLs, `.url` keys and `cmpoll status` are asked seldom.
pub const SHORT_IDLE: Duration = Duration::from_secs(15);

/// The apiserver's connection is kept between polls up to a minute (the default 30 s
/// interval reuses it): a new TCP connection and TLS handshake cost the real apiserver
/// about 2 ms of CPU, as much as the metadata list itself (`bench --only
/// apiserver-requests`). Under the apiserver's own 90 s idle limit
/// (k8s.io/apiserver/pkg/server/secure_serving.go) and the idle timeouts of the usual load
/// balancers in front of it; one closed meanwhile is noticed before it is used (ureq probes
/// a pooled connection) and a new one made.
pub const APISERVER_IDLE: Duration = Duration::from_secs(60);

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
        // A hub's short watches of several scopes are open together (`source::api`).
        .max_idle_connections_per_host(8)
        .max_idle_age(o.keep_idle);
    if o.disable_compression {
        builder = builder.accept_encoding(ureq::config::AutoHeaderValue::None);
    }
    ureq::Agent::with_parts(builder.build(), connector, DefaultResolver::default())
}
