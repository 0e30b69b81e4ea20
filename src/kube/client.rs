//! `kube::Client`: requests to the apiserver (GETs for the lists; POST and PATCH for
//! `--report-events`; POST and PUT for the hub's rollout state) over ureq and our TLS
//! connector.
//!
//! One request function, not one per call site: it adds `Accept`, `User-Agent` and the
//! credential, retries once right away after a 401 if the credential could be refreshed,
//! turns a non-2xx answer into `Error::Api` with the `Status` reason and message, and hands
//! a 2xx body to the caller as a `Body`: a reader capped at `--max-response-bytes` (counted
//! after gzip decoding, so a compression bomb is capped too), marked in flight for
//! `/healthz` until it is dropped, whose read errors `Failure` classifies (`client/body.rs`). It never reads
//! an unbounded body and never puts a credential in an error. Requests and bytes are
//! counted into the shared metric handles it was given.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use rustls::pki_types::ServerName;

use super::auth::{Auth, Credential, Stamp};
use super::config::{Config, PlainHttp};
use super::error::Error;
use super::error::{api_error, classify};
use super::proxy;
use crate::http::tls::{self, Identity, Trust};
use crate::hub_protocol::{HUB_HEADER, WAIT_HEADER};
use crate::ops::health::InFlight;
use crate::ops::metrics::{ApiCounters, Metrics};

mod body;

use body::InFlightMark;
pub use body::{Body, Failure};

/// How much of an error body is read to find the `Status` in it.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// Client behaviour that is not part of `kube::Config` (plain data, from flags).
#[derive(Clone, Debug)]
pub struct Options {
    /// Per request, connect to last body byte.
    pub timeout: Duration,
    pub max_response_bytes: u64,
    /// Send a credential over plain `http://`.
    pub allow_insecure_http: bool,
}

/// What the client reports into while it runs.
#[derive(Clone, Debug, Default)]
pub struct Handles {
    /// Marked while a request runs, for `/healthz`.
    pub in_flight: InFlight,
    /// Requests by status code and response bytes, counted here.
    pub counters: ApiCounters,
}

impl Handles {
    /// The poll's client: its requests counted into `metrics` and marked in `in_flight`,
    /// which `/healthz` reads.
    pub fn polling(metrics: &Metrics, in_flight: &InFlight) -> Handles {
        Handles {
            in_flight: in_flight.clone(),
            counters: metrics.api(),
        }
    }

    /// Any other client (events, reviews, the issuer's keys, `cmpoll list`): counted into
    /// `metrics`, in flight on its own, so that a slow call of its never looks like a
    /// hung poll to `/healthz`.
    pub fn apart(metrics: &Metrics) -> Handles {
        Handles::polling(metrics, &InFlight::default())
    }
}

/// A request's method, and the body it carries (never shown by `Debug`: a Secret's data
/// may be in it).
#[derive(Clone)]
pub enum Method {
    Get,
    Post {
        content_type: &'static str,
        body: Vec<u8>,
    },
    Patch {
        content_type: &'static str,
        body: Vec<u8>,
    },
    /// A whole object replaced (with its `metadata.resourceVersion`: the apiserver's
    /// optimistic concurrency).
    Put {
        content_type: &'static str,
        body: Vec<u8>,
    },
}

impl std::fmt::Debug for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, sent) = match self {
            Method::Get => return f.write_str("Get"),
            Method::Post { content_type, body } => ("Post", (content_type, body.len())),
            Method::Patch { content_type, body } => ("Patch", (content_type, body.len())),
            Method::Put { content_type, body } => ("Put", (content_type, body.len())),
        };
        write!(
            f,
            "{name} {{ content_type: {:?}, body: {} bytes }}",
            sent.0, sent.1
        )
    }
}

/// `req` with `headers`.
fn with<B>(mut req: ureq::RequestBuilder<B>, headers: &[(&str, &str)]) -> ureq::RequestBuilder<B> {
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req
}

pub struct Client {
    agent: ureq::Agent,
    /// `Impersonate-*` headers sent with every request.
    impersonate: Vec<(String, String)>,
    /// What the agent is built from, to build it again when a certificate changes.
    transport: Transport,
    server: String,
    auth: Auth,
    options: Options,
    handles: Handles,
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

impl Transport {
    /// An agent presenting `issued` (an exec plugin's certificate) or the configured one.
    fn agent(&self, issued: Option<&Identity>, timeout: Duration) -> Result<ureq::Agent, String> {
        let identity = issued.or(self.identity.as_ref());
        let config = tls::client_config(&self.trust, identity, &|_| None)
            .map_err(|e| format!("{}: {e}", self.origin))?;
        Ok(crate::http::agent(crate::http::AgentOptions {
            tls: config,
            server_name: self.server_name.clone(),
            timeout,
            disable_compression: self.disable_compression,
            proxy: self.proxy.clone(),
            keep_idle: crate::http::APISERVER_IDLE,
        }))
    }
}

impl Client {
    /// Builds the TLS config and HTTP agent; errors are configuration errors.
    pub fn new(
        config: &Config,
        options: Options,
        handles: Handles,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Client, String> {
        let mut credential = config.credential.clone();
        let mut identity = config.identity.clone();
        let has_any = credential != Credential::None || identity.is_some();
        if config.server.starts_with("http://") && has_any && !options.allow_insecure_http {
            match config.plain_http {
                PlainHttp::Refuse => {
                    return Err(format!(
                        "{}: refusing to send credentials to '{}' over plain http (use https, or --allow-insecure-http if you really mean it)",
                        config.origin, config.server
                    ));
                }
                PlainHttp::Anonymous => {
                    log::warn!(
                        "{}: '{}' is plain http: no credentials are sent, as kubectl sends none (--allow-insecure-http sends them)",
                        config.origin,
                        config.server
                    );
                    credential = Credential::None;
                    identity = None;
                }
            }
        }
        let auth = Auth::new(credential.clone()).map_err(|e| format!("{}: {e}", config.origin))?;
        if let Credential::Exec(plugin) = &credential {
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
                crate::http::url::redact(p)
            );
        }
        let transport = Transport {
            trust: tls::resolve_trust(&config.trust, env)?,
            ca_file: config
                .ca_file
                .clone()
                .map(|p| (p.clone(), super::auth::stamp(&p))),
            identity,
            identity_changes: 0,
            server_name,
            proxy: match proxy {
                Some(p) => Some(ureq::Proxy::new(&p).map_err(|e| {
                    format!(
                        "{}: proxy {}: {e}",
                        config.origin,
                        crate::http::url::redact(&p)
                    )
                })?),
                None => None,
            },
            disable_compression: config.disable_compression,
            origin: config.origin.clone(),
        };
        let agent = transport.agent(None, options.timeout)?;
        Ok(Client {
            agent,
            impersonate: config
                .impersonate
                .as_ref()
                .map(|i| i.headers())
                .unwrap_or_default(),
            transport,
            server: config.server.clone(),
            auth,
            options,
            handles,
        })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// `--timeout`: per request.
    pub fn timeout(&self) -> Duration {
        self.options.timeout
    }

    /// Picks up a rotated token file and a rotated CA file: done before every request,
    /// and by each poll, so a rotation is taken (and logged) when the file changes, not at
    /// the next request, which a follower's held watch may put off for half an hour.
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
        // This version is seen, read or not: a file that cannot be read warns once.
        self.transport.ca_file = Some((path.clone(), now));
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

    /// Before each request: a token or CA file that changed is read again (a `stat`
    /// each), so that a client that never polls — the hub's review clients — sends the
    /// rotated token and trusts the rotated CA, not the first until the apiserver refuses
    /// it; an exec plugin runs when due and, if it issued a new client certificate, the
    /// agent is rebuilt so the next connection presents it.
    fn prepare(&mut self, action: &str) -> Result<(), Error> {
        self.refresh_credentials();
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

    /// GETs `path` (with its query); a 2xx answer's body, or the typed error.
    pub fn get(&mut self, path: &str, accept: &str, action: &str) -> Result<Body, Error> {
        self.request(Method::Get, path, accept, action)
    }

    /// GETs a list from a `cmpoll serve` hub, asking it to hold the request until it has a
    /// list newer than the `resourceVersion` in `path` or `wait` has passed (`WAIT_HEADER`):
    /// the list, or `Waited::NotModified` (the hub's 304: nothing newer). The request may
    /// take `wait` plus `--timeout`.
    pub fn get_waiting(
        &mut self,
        path: &str,
        accept: &str,
        action: &str,
        wait: Duration,
    ) -> Result<Waited, Error> {
        let how = How {
            wait: Some(wait),
            ..How::default()
        };
        self.exchange(Method::Get, path, accept, action, how)
    }

    /// Opens a held watch of a `cmpoll serve` hub (`WAIT_HEADER`: a
    /// bookmark at least every `wait`), which may last `lasts` (its `timeoutSeconds`):
    /// its body, to be read as long as that plus `--timeout`, capped as every body is,
    /// and not marked in flight (it outlives the poll that opened it).
    pub fn watch_held(
        &mut self,
        path: &str,
        action: &str,
        wait: Duration,
        lasts: Duration,
    ) -> Result<Body, Error> {
        let how = How {
            wait: Some(wait),
            lasts: Some(lasts),
        };
        match self.exchange(Method::Get, path, "application/json", action, how)? {
            Waited::Body(mut body) => {
                body._mark = None;
                Ok(*body)
            }
            Waited::NotModified => Err(Error::Decode {
                action: action.to_string(),
                cause: "a 304 to a watch".into(),
            }),
        }
    }

    /// Opens a watch of the apiserver that it ends itself within `lasts` (its
    /// `timeoutSeconds`): its body, to be read to its end within that plus `--timeout`,
    /// marked in flight as a list is (it is part of the poll that opened it).
    pub fn watch_briefly(
        &mut self,
        path: &str,
        action: &str,
        lasts: Duration,
    ) -> Result<Body, Error> {
        let how = How {
            lasts: Some(lasts),
            ..How::default()
        };
        match self.exchange(Method::Get, path, "application/json", action, how)? {
            Waited::Body(body) => Ok(*body),
            Waited::NotModified => Err(Error::Decode {
                action: action.to_string(),
                cause: "a 304 to a watch".into(),
            }),
        }
    }

    /// Sends `method` (with its body) to `path`; a 2xx answer's body, or the typed error.
    /// The same credential, retry after a 401, caps and counters as `get`.
    pub fn request(
        &mut self,
        method: Method,
        path: &str,
        accept: &str,
        action: &str,
    ) -> Result<Body, Error> {
        match self.exchange(method, path, accept, action, How::default())? {
            Waited::Body(body) => Ok(*body),
            Waited::NotModified => Err(Error::Decode {
                action: action.to_string(),
                cause: "304 Not Modified to a request that did not ask to wait".into(),
            }),
        }
    }

    /// POSTs `body` (JSON) to a `cmpoll serve` hub's `path`, with `WAIT_HEADER` = `wait`
    /// as the follower's lists send it, within `--timeout`: `Ok` when taken (a 2xx, its
    /// body drained so the connection is kept), else the typed error.
    pub fn post_to_hub(
        &mut self,
        path: &str,
        body: Vec<u8>,
        wait: Duration,
        action: &str,
    ) -> Result<(), Error> {
        // The header says the wait; the request itself lasts no longer than any other.
        let how = How {
            wait: Some(wait),
            lasts: Some(Duration::ZERO),
        };
        let method = Method::Post {
            content_type: "application/json",
            body,
        };
        match self.exchange(method, path, "application/json", action, how)? {
            Waited::Body(mut body) => {
                let _ = std::io::copy(
                    &mut (&mut *body).take(ERROR_BODY_LIMIT),
                    &mut std::io::sink(),
                );
                Ok(())
            }
            Waited::NotModified => Err(Error::Decode {
                action: action.to_string(),
                cause: "304 Not Modified to a report".into(),
            }),
        }
    }

    fn exchange(
        &mut self,
        method: Method,
        path: &str,
        accept: &str,
        action: &str,
        how: How,
    ) -> Result<Waited, Error> {
        let url = format!("{}{path}", self.server);
        let wait = how.wait;
        let timeout = match how.lasts.or(wait) {
            Some(w) => self.options.timeout.saturating_add(w),
            None => self.options.timeout,
        };
        let wait_secs = wait.map(|w| w.as_secs().max(1).to_string());
        let mut retried = false;
        let mark = InFlightMark::start(&self.handles.in_flight);
        self.prepare(action)?;
        loop {
            let mut headers: Vec<(&str, &str)> = vec![("Accept", accept)];
            let auth = self.auth.header();
            if let Some(h) = &auth {
                headers.push(("Authorization", h.expose()));
            }
            for (k, v) in &self.impersonate {
                headers.push((k, v));
            }
            if let Some(w) = &wait_secs {
                headers.push((WAIT_HEADER, w));
            }
            let sent = match &method {
                Method::Get if how.lasts.or(wait).is_some() => with(self.agent.get(&url), &headers)
                    .config()
                    .timeout_global(Some(timeout))
                    .build()
                    .call(),
                Method::Get => with(self.agent.get(&url), &headers).call(),
                Method::Post { content_type, body } => with(self.agent.post(&url), &headers)
                    .header("Content-Type", *content_type)
                    .send(&body[..]),
                Method::Patch { content_type, body } => with(self.agent.patch(&url), &headers)
                    .header("Content-Type", *content_type)
                    .send(&body[..]),
                Method::Put { content_type, body } => with(self.agent.put(&url), &headers)
                    .header("Content-Type", *content_type)
                    .send(&body[..]),
            };
            let resp = match sent {
                Ok(r) => r,
                Err(e) => {
                    self.handles.counters.request("error");
                    return Err(classify(
                        e,
                        action,
                        &self.server,
                        timeout,
                        self.options.max_response_bytes,
                    ));
                }
            };
            let code = resp.status().as_u16();
            self.handles.counters.request(&code.to_string());
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
            let media_type = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            let hub = resp.headers().contains_key(HUB_HEADER);
            let body = resp.into_body();
            if code == 304 && wait.is_some() && hub {
                return Ok(Waited::NotModified);
            }
            if !(200..300).contains(&code) {
                let mut text = Vec::new();
                let _ = body
                    .into_with_config()
                    .limit(ERROR_BODY_LIMIT)
                    .reader()
                    .read_to_end(&mut text);
                self.handles.counters.bytes(text.len() as u64);
                return Err(
                    api_error(action, code, &reason_phrase, &text, retry_after).with_hub(hub)
                );
            }
            let limit = self.options.max_response_bytes;
            return Ok(Waited::Body(Box::new(Body {
                reader: body.into_with_config().limit(limit).reader(),
                media_type,
                hub,
                counters: self.handles.counters.clone(),
                failure: Failure {
                    action: action.to_string(),
                    server: self.server.clone(),
                    timeout,
                    limit,
                },
                _mark: Some(mark),
            })));
        }
    }
}

/// How long a request may last: a waiting list or a held watch at a hub (`WAIT_HEADER`),
/// a watch the apiserver ends itself (`lasts`).
#[derive(Clone, Copy, Debug, Default)]
struct How {
    /// `WAIT_HEADER`: how long a hub may wait.
    wait: Option<Duration>,
    /// How long the answer may last beyond `--timeout` (else `wait`).
    lasts: Option<Duration>,
}

/// What a list request that may wait gets.
pub enum Waited {
    Body(Box<Body>),
    /// The hub had nothing newer within the wait.
    NotModified,
}
