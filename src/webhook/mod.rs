//! `cmpoll webhook`: a validating admission webhook that runs `--validate` on the ConfigMap
//! (or Secret) being created or updated, so that `kubectl apply` of a module the agent
//! would refuse is denied on the author's terminal with the validator's own words.
//!
//! HTTPS from `crate::https` (the certificate re-read when it changes; with
//! `--client-ca-file`, only the apiserver's client certificate is reviewed, any other
//! client refused from its request's head, its body never read; probes need none): one
//! thread holds every connection within short deadlines and a worker pool validates, so a
//! client that opens connections and stalls them cannot keep the apiserver's reviews
//! waiting; the bodies read take `MAX_BODIES` at most together. Each review (`review.rs`)
//! is staged and validated as `cmpoll run` does it. It fails open (allowed, with a
//! warning) when the validator cannot run or times out: the daemon's own `--validate` still
//! guards the agent. `/healthz`, `/readyz` (503 while the validator cannot run) and
//! `/metrics` on the same port, over HTTPS.

pub mod review;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};

use self::review::Decision;
use crate::error::Error;
use crate::https::http::{Answer, Request};
use crate::https::lanes::Lane;
use crate::https::server::{Bodies, Call, Handler, Limits, Peer, Post, Reply, Server, Sizes};
use crate::https::tls;
use crate::locks::Recover;
use crate::ops::metrics::{Metrics, Results, ServerCounts};
use crate::source::Selection;
use crate::validate::{self, Stage, Verdict};

/// A review's body at most: an AdmissionReview of a 1 MiB ConfigMap and its old version,
/// as JSON.
pub const MAX_BODY: usize = 16 << 20;

/// What all the reviews' bodies take at once, from their head until they are answered:
/// two of the largest, or hundreds of ordinary ones (decoded, a body takes about three
/// times its bytes: well within the chart's 256 Mi).
pub const MAX_BODIES: usize = 32 << 20;

/// What the webhook runs with (from `settings::webhook`).
#[derive(Debug)]
pub struct Options {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `--client-ca-file`: only clients with a certificate this CA signed (the apiserver's).
    pub client_ca: Option<PathBuf>,
    /// `--selector`, `--keys`, `--resource`.
    pub selection: Selection,
    pub validate: validate::Options,
}

/// How the webhook holds its clients: the apiserver opens a few keep-alive connections and
/// sends each review at once; whatever else connects is held to short deadlines and gives
/// way (see `https::server`). A body is read only for `POST /validate`, and with
/// `--client-ca-file` (`cert`) only from a client that presented a certificate the CA
/// signed: the apiserver's connections are then its own identity, never let go for
/// token-less ones, and nothing else can make the webhook hold a body.
fn limits(counts: ServerCounts, cert: bool) -> Limits {
    Limits {
        max_connections: 1024,
        request_deadline: Duration::from_secs(5),
        idle: Duration::from_secs(90),
        write_deadline: Duration::from_secs(10),
        max_head: crate::https::http::MAX_HEAD,
        max_body: MAX_BODY,
        bodies: Bodies::Post(vec![Post {
            path: "/validate",
            cert,
            // The apiserver sends review after review: its connection stays.
            close: false,
            max: MAX_BODY,
            budget: None,
        }]),
        max_bodies: MAX_BODIES,
        keep_alive: true,
        // Probes and scrapes on one lane, reviews (the validator may take its timeout)
        // on another: a validator that hangs never holds up /healthz.
        lanes: vec![
            Lane {
                name: "probes",
                workers: 2,
                queue: 64,
                busy: Answer::text(503, "too many requests at once; try again\n"),
            },
            Lane {
                name: "reviews",
                workers: 8,
                queue: 128,
                busy: Answer::text(503, "too many reviews at once; try again\n"),
            },
        ],
        max_held: usize::MAX,
        max_pinned: 32 << 20,
        // 1,024 stalled connections with a whole head each would hold 48 MiB.
        max_loose: 32 << 20,
        handshakes: Sizes {
            workers: 1,
            queue: 64,
        },
        inline: false,
        panicked: Answer::text(
            500,
            "this review caused cmpoll webhook to panic; its log has the details\n",
        ),
        counts,
    }
}

/// The lane reviews are made on.
const REVIEWS: usize = 1;

/// What every connection shares.
struct Webhook {
    /// `--client-ca-file` was given: `/validate` needs a client certificate it signed.
    needs_client_cert: bool,
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
    let config = certs
        .config(opts.client_ca.as_deref())
        .map_err(Error::Config)?;
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
    let counts = metrics.server();
    let hook = Arc::new(Webhook {
        needs_client_cert: opts.client_ca.is_some(),
        selection: opts.selection,
        validate: opts.validate,
        stage,
        metrics: Mutex::new(metrics),
        reviews,
        cannot_run: Mutex::new(None),
    });
    log::info!(
        "cmpoll webhook {}: serving /validate, /healthz, /readyz and /metrics over HTTPS on {bound}{}; {} with --validate (timeout {})",
        env!("CARGO_PKG_VERSION"),
        match &opts.client_ca {
            Some(ca) => format!(" to clients with a certificate from '{}'", ca.display()),
            None => String::new(),
        },
        hook.selection.describe(),
        humantime::format_duration(hook.validate.timeout)
    );
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGTERM, SIGINT] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Error::Runtime(format!("cannot handle signals: {e}")))?;
    }
    let cert = hook.needs_client_cert;
    let (server, _handle) = Server::new(listener, Some(config), hook, limits(counts, cert))
        .map_err(|e| Error::Runtime(format!("--listen {bound}: {e}")))?;
    server.run(&stop);
    log::info!("stopping");
    Ok(())
}

impl Handler for Webhook {
    fn handle(&self, req: &Request, peer: &Peer, call: Call) -> Reply {
        // The TLS layer checked any certificate presented; a review needs one (probes and
        // scrapes need none). Refused before its body is read (`Bodies::Post`) and before
        // it waits for a reviewer.
        if self.needs_client_cert && req.path == "/validate" && peer.cert.is_none() {
            log::warn!(
                "/validate from {} without a client certificate: refused",
                peer.addr
            );
            return Reply::Answer(Answer::text(
                403,
                "a client certificate signed by --client-ca-file is needed\n",
            ));
        }
        if req.path == "/validate" && req.method == "POST" && call.lane != REVIEWS {
            return Reply::Lane(REVIEWS);
        }
        Reply::Answer(self.answer(&req.method, &req.path, &req.body))
    }
}

impl Webhook {
    fn answer(&self, method: &str, path: &str, body: &[u8]) -> Answer {
        match (method, path) {
            ("POST", "/validate") => self.review(body),
            ("GET", "/healthz") => Answer::text(200, "ok\n"),
            ("GET", "/readyz") => match &*self.cannot_run.lock().recover() {
                None => Answer::text(200, "ready\n"),
                Some(why) => Answer::text(503, format!("{why}\n")),
            },
            ("GET", "/metrics") => Answer::metrics((self.metrics.lock().recover()).render()),
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
                *self.cannot_run.lock().recover() = match &verdict {
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
        Answer::json(
            200,
            review::encode(&req.uid, &decision).to_string().into_bytes(),
        )
    }
}
