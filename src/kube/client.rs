//! `kube::Client`: GET requests to the apiserver over ureq and our TLS connector.
//!
//! One request function, not one per call site: it adds `Accept`, `User-Agent` and the
//! credential, retries once right away after a 401 if the credential could be refreshed,
//! turns a non-2xx answer into `Error::Api` with the `Status` reason and message, and hands
//! a 2xx body to the caller as a reader capped at `--max-response-bytes` (counted after gzip
//! decoding, so a compression bomb is capped too). It never reads an unbounded body and
//! never puts a credential in an error.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::PathBuf;
use std::time::Duration;

use rustls::pki_types::ServerName;
use ureq::unversioned::resolver::DefaultResolver;
use ureq::unversioned::transport::{ConnectProxyConnector, Connector as _, TcpConnector};

use super::Error;
use super::auth::{Auth, Credential, Stamp};
use super::config::Config;
use super::proxy;
use super::tls::{self, Identity, TlsConnector, Trust};

/// How much of an error body is read to find the `Status` in it.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// Client behaviour that is not part of `kube::Config`.
#[derive(Clone, Debug)]
pub struct Options {
    /// Per request, connect to last body byte.
    pub timeout: Duration,
    pub max_response_bytes: u64,
    /// Send a credential over plain `http://`.
    pub allow_insecure_http: bool,
    /// Marked while a request runs, for `/healthz`.
    pub in_flight: crate::health::InFlight,
}

/// What the client has done, for metrics.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Requests by status code (`"error"` when there was no answer).
    pub requests: BTreeMap<String, u64>,
    /// Response body bytes read (after gzip decoding).
    pub response_bytes: u64,
}

pub struct Client {
    agent: ureq::Agent,
    /// What the agent is built from, to build it again when a certificate changes.
    transport: Transport,
    server: String,
    auth: Auth,
    options: Options,
    pub stats: Stats,
}

/// The parts of the HTTP agent that can change while cmpoll runs: the CA (a CA file is
/// re-read when it changes) and the client certificate (an exec plugin may issue a new one).
struct Transport {
    /// Always `Pem` or `Insecure` here: the platform bundle is read once, up front.
    trust: Trust,
    ca_file: Option<(PathBuf, Option<Stamp>)>,
    /// The kubeconfig's own client certificate; an exec plugin's replaces it.
    identity: Option<Identity>,
    /// `Auth::identity`'s counter when the agent was built.
    identity_changes: u64,
    server_name: Option<ServerName<'static>>,
    proxy: Option<ureq::Proxy>,
    disable_compression: bool,
    origin: String,
}

/// An HTTP agent over cmpoll's TLS connector: no redirects, the given proxy only (never
/// one from ureq's own reading of the environment), status codes as answers (not errors),
/// `timeout` from connect to the last body byte.
pub fn agent(
    tls_config: std::sync::Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
    timeout: Duration,
    disable_compression: bool,
    proxy: Option<ureq::Proxy>,
) -> ureq::Agent {
    let connector =
        ().chain(ConnectProxyConnector::default())
            .chain(TcpConnector::default())
            .chain(TlsConnector {
                config: tls_config,
                server_name,
            });
    let mut builder = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .https_only(false)
        .proxy(proxy)
        .max_redirects(0)
        .user_agent(format!("cmpoll/{}", env!("CARGO_PKG_VERSION")))
        .timeout_global(Some(timeout))
        .max_idle_connections_per_host(2);
    if disable_compression {
        builder = builder.accept_encoding(ureq::config::AutoHeaderValue::None);
    }
    ureq::Agent::with_parts(builder.build(), connector, DefaultResolver::default())
}

impl Transport {
    /// An agent presenting `issued` (an exec plugin's certificate) or the configured one.
    fn agent(&self, issued: Option<&Identity>, timeout: Duration) -> Result<ureq::Agent, String> {
        let identity = issued.or(self.identity.as_ref());
        let config = tls::client_config(&self.trust, identity, &|_| None)
            .map_err(|e| format!("{}: {e}", self.origin))?;
        Ok(agent(
            config,
            self.server_name.clone(),
            timeout,
            self.disable_compression,
            self.proxy.clone(),
        ))
    }
}

/// Why reading a 2xx body failed: an I/O error (classified by `get`: the cap, a timeout,
/// a connection cut) or an error already typed by the reader (a decode error).
#[derive(Debug)]
pub enum ReadFailure {
    Io(io::Error),
    Fail(Error),
}

impl From<Error> for ReadFailure {
    fn from(e: Error) -> Self {
        ReadFailure::Fail(e)
    }
}

/// The answer body of a successful request, capped and counted.
pub struct Body<'a> {
    inner: Box<dyn Read + 'a>,
    counted: &'a mut u64,
}

impl Read for Body<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        *self.counted += n as u64;
        Ok(n)
    }
}

impl Client {
    /// Builds the TLS config and HTTP agent; errors are configuration errors.
    pub fn new(
        config: &Config,
        options: Options,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Client, String> {
        let auth =
            Auth::new(config.credential.clone()).map_err(|e| format!("{}: {e}", config.origin))?;
        if config.server.starts_with("http://")
            && auth.sends_secret()
            && !options.allow_insecure_http
        {
            return Err(format!(
                "{}: refusing to send credentials to '{}' over plain http (use https, or --allow-insecure-http if you really mean it)",
                config.origin, config.server
            ));
        }
        if let Credential::Exec(plugin) = &config.credential {
            plugin.locate(env)?;
        }
        let server_name = match &config.tls_server_name {
            Some(n) => Some(
                ServerName::try_from(n.clone())
                    .map_err(|e| format!("{}: tls-server-name '{n}': {e}", config.origin))?,
            ),
            None => None,
        };
        let proxy = proxy::choose(&config.server, config.proxy_url.as_deref(), env)
            .map_err(|e| format!("{}: {e}", config.origin))?;
        if let Some(p) = &proxy {
            log::info!(
                "reaching {} through the proxy {}",
                config.server,
                proxy::redact(p)
            );
        }
        let transport =
            Transport {
                trust: tls::resolve_trust(&config.trust, env)?,
                ca_file: config
                    .ca_file
                    .clone()
                    .map(|p| (p.clone(), super::auth::stamp(&p))),
                identity: config.identity.clone(),
                identity_changes: 0,
                server_name,
                proxy: match proxy {
                    Some(p) => Some(ureq::Proxy::new(&p).map_err(|e| {
                        format!("{}: proxy {}: {e}", config.origin, proxy::redact(&p))
                    })?),
                    None => None,
                },
                disable_compression: config.disable_compression,
                origin: config.origin.clone(),
            };
        let agent = transport.agent(None, options.timeout)?;
        Ok(Client {
            agent,
            transport,
            server: config.server.clone(),
            auth,
            options,
            stats: Stats::default(),
        })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// `--timeout`: per request.
    pub fn timeout(&self) -> Duration {
        self.options.timeout
    }

    /// Before a poll: picks up a rotated token file and a rotated CA file.
    pub fn refresh_credentials(&mut self) {
        self.auth.refresh_if_changed();
        self.reread_ca();
    }

    /// Re-reads the CA file if it changed; a bad new file keeps the old CA, with a warning.
    fn reread_ca(&mut self) {
        let Some((path, seen)) = &self.transport.ca_file else {
            return;
        };
        let now = super::auth::stamp(path);
        if now == *seen || now.is_none() {
            return;
        }
        let path = path.clone();
        let previous = std::mem::replace(
            &mut self.transport.trust,
            match std::fs::read(&path) {
                Ok(pem) => Trust::Pem {
                    pem,
                    origin: format!("'{}'", path.display()),
                },
                Err(e) => {
                    log::warn!(
                        "cannot re-read CA file '{}' ({e}); keeping the previous CA",
                        path.display()
                    );
                    return;
                }
            },
        );
        self.transport.ca_file = Some((path.clone(), now));
        match self
            .transport
            .agent(self.auth.identity().0, self.options.timeout)
        {
            Ok(agent) => {
                self.agent = agent;
                log::info!(
                    "CA file '{}' changed: verifying the apiserver with the new CA",
                    path.display()
                );
            }
            Err(e) => {
                log::warn!("{e}; keeping the previous CA");
                self.transport.trust = previous;
            }
        }
    }

    /// Runs an exec plugin when due and, if it issued a new client certificate, rebuilds
    /// the agent so the next connection presents it.
    fn prepare(&mut self, action: &str) -> Result<(), Error> {
        self.auth
            .prepare(std::time::SystemTime::now())
            .map_err(|e| Error::Credentials(format!("cannot {action}: {e}")))?;
        self.use_issued_identity()
            .map_err(|e| Error::Credentials(format!("cannot {action}: {e}")))
    }

    fn use_issued_identity(&mut self) -> Result<(), String> {
        let (identity, changes) = self.auth.identity();
        if changes == self.transport.identity_changes {
            return Ok(());
        }
        self.agent = self.transport.agent(identity, self.options.timeout)?;
        self.transport.identity_changes = changes;
        Ok(())
    }

    fn count(&mut self, code: &str) {
        *self.stats.requests.entry(code.to_string()).or_default() += 1;
    }

    /// GETs `path` (with its query) and hands a 2xx body to `read`.
    pub fn get<T>(
        &mut self,
        path: &str,
        accept: &str,
        action: &str,
        mut read: impl FnMut(&mut Body<'_>) -> Result<T, ReadFailure>,
    ) -> Result<T, Error> {
        let url = format!("{}{path}", self.server);
        let mut retried = false;
        // Marked from the first byte out to the last byte in, whatever the outcome.
        struct Mark(crate::health::InFlight);
        impl Drop for Mark {
            fn drop(&mut self) {
                self.0.stop();
            }
        }
        self.options.in_flight.start();
        let _mark = Mark(self.options.in_flight.clone());
        self.prepare(action)?;
        loop {
            let mut req = self.agent.get(&url).header("Accept", accept);
            if let Some(h) = self.auth.header() {
                req = req.header("Authorization", h.expose());
            }
            let resp = match req.call() {
                Ok(r) => r,
                Err(e) => {
                    self.count("error");
                    return Err(self.transport_error(e, action));
                }
            };
            let code = resp.status().as_u16();
            self.count(&code.to_string());
            if code == 401 && !retried && self.auth.refresh_after_unauthorized() {
                log::info!("{action}: 401 Unauthorized; retrying once with the renewed credential");
                retried = true;
                if let Err(e) = self.use_issued_identity() {
                    return Err(Error::Credentials(format!("cannot {action}: {e}")));
                }
                continue;
            }
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let reason_phrase = resp.status().canonical_reason().unwrap_or("").to_string();
            let body = resp.into_body();
            if !(200..300).contains(&code) {
                let mut text = Vec::new();
                let _ = body
                    .into_with_config()
                    .limit(ERROR_BODY_LIMIT)
                    .reader()
                    .read_to_end(&mut text);
                self.stats.response_bytes += text.len() as u64;
                return Err(api_error(action, code, &reason_phrase, &text, retry_after));
            }
            let (timeout, limit) = (self.options.timeout, self.options.max_response_bytes);
            let mut body = Body {
                inner: Box::new(body.into_with_config().limit(limit).reader()),
                counted: &mut self.stats.response_bytes,
            };
            return match read(&mut body) {
                Ok(t) => Ok(t),
                Err(ReadFailure::Fail(e)) => Err(e),
                Err(ReadFailure::Io(e)) => {
                    Err(classify_io(e, action, &self.server, timeout, limit))
                }
            };
        }
    }

    fn transport_error(&self, e: ureq::Error, action: &str) -> Error {
        classify(
            e,
            action,
            &self.server,
            self.options.timeout,
            self.options.max_response_bytes,
        )
    }
}

/// Classifies an I/O error met while reading a body (the cap, a timeout, a cut).
fn classify_io(e: io::Error, action: &str, server: &str, timeout: Duration, limit: u64) -> Error {
    if e.get_ref().is_some_and(|r| r.is::<ureq::Error>()) {
        // Wrapped by ureq's body reader: unwrap and classify like a request error.
        return classify(ureq::Error::from(e), action, server, timeout, limit);
    }
    classify(ureq::Error::Io(e), action, server, timeout, limit)
}

fn classify(e: ureq::Error, action: &str, server: &str, timeout: Duration, limit: u64) -> Error {
    let action = action.to_string();
    let server = server.to_string();
    match e {
        ureq::Error::Timeout(_) => Error::Timeout {
            action,
            server,
            after: timeout,
        },
        ureq::Error::BodyExceedsLimit(_) => Error::TooLarge { action, limit },
        ureq::Error::Io(io) => {
            let cause = match io.get_ref().and_then(|r| r.downcast_ref::<rustls::Error>()) {
                Some(tls) => format!("TLS: {tls}"),
                None if io.kind() == io::ErrorKind::UnexpectedEof => {
                    "the connection closed before the answer was complete".into()
                }
                None => io.to_string(),
            };
            Error::Transport {
                action,
                server,
                cause,
            }
        }
        ureq::Error::HostNotFound => Error::Transport {
            action,
            server,
            cause: "host not found".into(),
        },
        other => Error::Transport {
            action,
            server,
            cause: other.to_string(),
        },
    }
}

/// The typed error for a non-2xx answer, from its `Status` body when it has one.
fn api_error(
    action: &str,
    code: u16,
    phrase: &str,
    body: &[u8],
    retry_after: Option<Duration>,
) -> Error {
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Status {
        kind: String,
        message: String,
        reason: String,
        details: Option<Details>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct Details {
        causes: Vec<Cause>,
        retry_after_seconds: Option<u64>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Cause {
        reason: String,
    }
    let status: Status = serde_json::from_slice(body).unwrap_or_default();
    let (reason, message, causes, detail_retry) =
        if status.kind == "Status" || !status.reason.is_empty() {
            let d = status.details.unwrap_or_default();
            (
                status.reason,
                status.message,
                d.causes.into_iter().map(|c| c.reason).collect(),
                d.retry_after_seconds,
            )
        } else {
            // A plain-text body (the APF 429, a proxy's error page): its first line, bounded.
            let text = String::from_utf8_lossy(body);
            let line: String = text
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .chars()
                .take(200)
                .collect();
            (String::new(), line, Vec::new(), None)
        };
    Error::Api {
        action: action.to_string(),
        code,
        reason: if reason.is_empty() {
            phrase.to_string()
        } else {
            reason
        },
        message,
        retry_after: retry_after.or(detail_retry.map(Duration::from_secs)),
        causes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::fixture;

    #[test]
    fn status_bodies_become_typed_errors() {
        let e = api_error(
            "list configmaps",
            403,
            "Forbidden",
            &fixture("status-403-namespace.json"),
            None,
        );
        assert_eq!(e.code(), Some(403));
        assert!(e.to_string().starts_with(
            "apiserver refused to list configmaps: 403 Forbidden: configmaps is forbidden: User"
        ));
        let e = api_error(
            "list",
            504,
            "Gateway Timeout",
            &fixture("status-504-too-large-resource-version.json"),
            None,
        );
        assert!(e.is_too_large_resource_version());
        assert_eq!(
            e.retry_after(),
            Some(Duration::from_secs(1)),
            "from details"
        );
        let e = api_error(
            "list",
            410,
            "Gone",
            &fixture("status-410-continue-expired.json"),
            None,
        );
        assert!(e.is_expired());
        let e = api_error(
            "list",
            429,
            "Too Many Requests",
            &fixture("apf-429-body.txt"),
            Some(Duration::from_secs(4)),
        );
        assert_eq!(
            e.to_string(),
            "apiserver refused to list: 429 Too Many Requests: Too many requests, please try again later."
        );
        assert_eq!(e.retry_after(), Some(Duration::from_secs(4)));
        let e = api_error("list", 502, "Bad Gateway", b"", None);
        assert_eq!(e.to_string(), "apiserver failed to list: 502 Bad Gateway");
    }
}
