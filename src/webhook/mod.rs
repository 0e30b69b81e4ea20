//! `cmpoll webhook`: a validating admission webhook that runs `--validate` on the ConfigMap
//! (or Secret) being created or updated, so that `kubectl apply` of a module the agent
//! would refuse is denied on the author's terminal with the validator's own words.
//!
//! HTTPS from rustls (`tls.rs`: the certificate re-read when it changes), HTTP/1.1 parsed by
//! httparse (`http.rs`), one thread per connection up to `MAX_CONNECTIONS` (the apiserver
//! keeps a few alive and sends a review per request; more are closed at once), synchronous
//! like the rest of cmpoll. Each review (`review.rs`) is staged and validated as `cmpoll
//! run` does it. It fails open (allowed, with a warning) when the validator cannot run or
//! times out: the daemon's own `--validate` still guards the agent. `/healthz`, `/readyz`
//! (503 while the validator cannot run) and `/metrics` on the same port, over HTTPS.

mod http;
pub mod review;
pub mod tls;

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::{ServerConfig, ServerConnection, StreamOwned};
use signal_hook::consts::{SIGINT, SIGTERM};

use self::http::{Answer, Conn, Failed};
use self::review::Decision;
use crate::error::Error;
use crate::ops::metrics::{Metrics, Results};
use crate::source::Selection;
use crate::validate::{self, Stage, Verdict};

/// Connections served at once; more are closed as they come.
pub const MAX_CONNECTIONS: usize = 64;
/// A write of an answer at most.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// What the webhook runs with (from `settings::webhook`).
#[derive(Debug)]
pub struct Options {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `--selector`, `--keys`, `--resource`.
    pub selection: Selection,
    pub validate: validate::Options,
}

/// What every connection shares.
struct Webhook {
    selection: Selection,
    validate: validate::Options,
    stage: Stage,
    metrics: Mutex<Metrics>,
    reviews: Results,
    /// Why the validator cannot run, from the last review that ran it.
    cannot_run: Mutex<Option<String>>,
}

/// Serves until SIGTERM or SIGINT.
pub fn run(opts: Options) -> Result<(), Error> {
    let certs =
        Arc::new(tls::Reloading::new(opts.cert.clone(), opts.key.clone()).map_err(Error::Config)?);
    let config = certs.config().map_err(Error::Config)?;
    let listener = TcpListener::bind(opts.listen)
        .map_err(|e| Error::Config(format!("--listen {}: cannot listen: {e}", opts.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("--listen {}: {e}", opts.listen)))?;
    let stage = Stage::new(None).map_err(Error::Config)?;
    let metrics = Metrics::new();
    metrics.expect(&crate::ops::metrics::Features {
        webhook: true,
        ..Default::default()
    });
    let reviews = metrics.webhook_reviews();
    let hook = Arc::new(Webhook {
        selection: opts.selection,
        validate: opts.validate,
        stage,
        metrics: Mutex::new(metrics),
        reviews,
        cannot_run: Mutex::new(None),
    });
    log::info!(
        "cmpoll webhook {}: serving /validate, /healthz, /readyz and /metrics over HTTPS on {bound}; {} with --validate (timeout {})",
        env!("CARGO_PKG_VERSION"),
        hook.selection.describe(),
        humantime::format_duration(hook.validate.timeout)
    );
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGTERM, SIGINT] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Error::Runtime(format!("cannot handle signals: {e}")))?;
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Runtime(format!("--listen {bound}: {e}")))?;
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    log::warn!("{MAX_CONNECTIONS} connections open: closing the one from {peer}");
                    continue;
                }
                active.fetch_add(1, Ordering::Relaxed);
                let (hook, config, slot) = (hook.clone(), config.clone(), active.clone());
                let spawned = std::thread::Builder::new()
                    .name("webhook".into())
                    .spawn(move || {
                        if let Err(e) = connection(stream, config, &hook) {
                            log::debug!("connection from {peer}: {e}");
                        }
                        slot.fetch_sub(1, Ordering::Relaxed);
                    });
                if let Err(e) = spawned {
                    // The connection was dropped with the closure: it holds no slot.
                    active.fetch_sub(1, Ordering::Relaxed);
                    log::warn!("cannot serve {peer}: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => log::warn!("--listen {bound}: {e}"),
        }
    }
    log::info!(
        "stopping: {} connection(s) open",
        active.load(Ordering::Relaxed)
    );
    Ok(())
}

/// One TLS connection, request after request.
fn connection(stream: TcpStream, config: Arc<ServerConfig>, hook: &Webhook) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_DEADLINE))?;
    let tls = ServerConnection::new(config).map_err(io::Error::other)?;
    let mut s = Tls(StreamOwned::new(tls, stream));
    let mut conn = Conn::default();
    loop {
        let req = match conn.read(&mut s) {
            Ok(r) => r,
            Err(Failed::Gone) => return Ok(()),
            Err(Failed::Answer(a)) => return http::write(&mut s, &a, true),
        };
        let answer = hook.answer(&req.method, &req.path, &req.body);
        http::write(&mut s, &answer, req.close)?;
        if req.close {
            return Ok(());
        }
    }
}

struct Tls(StreamOwned<ServerConnection, TcpStream>);

impl io::Read for Tls {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl io::Write for Tls {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl http::Stream for Tls {
    fn set_read_timeout(&mut self, t: Duration) -> io::Result<()> {
        self.0.sock.set_read_timeout(Some(t))
    }
}

impl Webhook {
    fn answer(&self, method: &str, path: &str, body: &[u8]) -> Answer {
        match (method, path) {
            ("POST", "/validate") => self.review(body),
            ("GET", "/healthz") => Answer::text(200, "ok\n"),
            ("GET", "/readyz") => match &*self.cannot_run.lock().unwrap_or_else(|p| p.into_inner())
            {
                None => Answer::text(200, "ready\n"),
                Some(why) => Answer::text(503, format!("{why}\n")),
            },
            ("GET", "/metrics") => Answer {
                status: 200,
                content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
                body: (self.metrics.lock().unwrap_or_else(|p| p.into_inner()))
                    .render()
                    .into_bytes(),
            },
            (_, "/validate" | "/healthz" | "/readyz" | "/metrics") => {
                Answer::text(405, "method not allowed\n")
            }
            _ => Answer::text(404, "not found\n"),
        }
    }

    /// `POST /validate`.
    fn review(&self, body: &[u8]) -> Answer {
        let req = match review::decode(body) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("/validate: {e}");
                return Answer::text(400, format!("{e}\n"));
            }
        };
        let started = Instant::now();
        let what = format!(
            "{} of {} {}/{}",
            req.operation, req.resource.resource, req.namespace, req.name
        );
        let decision = match review::module(&req, &self.selection) {
            Err(why) => Decision::Skip(why),
            Ok(m) => {
                let verdict = self
                    .stage
                    .validate(&self.validate, &m.id(), &m.hash, &m.files);
                *self.cannot_run.lock().unwrap_or_else(|p| p.into_inner()) = match &verdict {
                    Verdict::Error(why) => Some(format!("validator cannot run: {why}")),
                    _ => None,
                };
                review::decide(&m, verdict)
            }
        };
        let took = started.elapsed();
        match &decision {
            Decision::Skip(why) => log::debug!("{what}: allowed, not validated ({why})"),
            Decision::Allow => log::info!("{what}: allowed ({took:?})"),
            Decision::Deny(why) => log::info!(
                "{what}: denied ({took:?}): {}",
                why.lines().next().unwrap_or("")
            ),
            Decision::FailOpen(why) => log::warn!("{what}: {why}"),
        }
        self.reviews.record(decision.result());
        Answer {
            status: 200,
            content_type: "application/json",
            body: review::encode(&req.uid, &decision).to_string().into_bytes(),
        }
    }
}
