//! `cmpoll serve`: one poll for a fleet. A hub polls the apiserver as `cmpoll run` does
//! (the same source, selection, credentials and list modes: metadata lists in protobuf
//! after a first full list, GETs of what changed) and serves its last complete poll over
//! HTTPS as the apiserver's own read API for what it selected, so that a thousand agents
//! list the hub instead of the apiserver. See docs/serve.md for the contract.
//!
//! The parts: `held.rs` (what a hub holds: objects as served, by scope, with their
//! versions), `request.rs` (what a request asks), `auth.rs` with `reviews.rs` (TokenReview
//! and SubjectAccessReview, cached), `render.rs` and `status.rs` (answers and refusals in
//! the apiserver's words), `discovery.rs`, and `hub.rs`, which answers each request. This
//! file runs the poll loop beside the HTTPS server (`crate::https`): a failed poll changes
//! nothing; a complete one is published whole and wakes the followers waiting for it.

pub mod accounts;
pub mod auth;
pub mod authn;
pub mod authz;
pub mod discovery;
pub mod event;
pub mod fleet;
pub mod held;
pub mod history;
pub mod hub;
pub mod impersonate;
pub mod issuer;
pub mod jwt;
pub mod kept;
pub mod query;
pub mod remotecfg;
pub mod render;
pub mod renders;
pub mod request;
pub mod reviewer;
pub mod reviews;
pub mod rollout;
pub mod status;
pub mod telling;
#[cfg(test)]
mod testing;
pub mod user;
pub mod validated;
pub mod views;
pub mod watch;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};

use self::held::{Gather, Held};
use self::hub::Hub;
use self::reviewer::HubLane;
use crate::backoff::{self, Backoff, Rng};
use crate::batch::Observers;
use crate::error::Error;
use crate::https::http::Budget;
use crate::https::lanes::Lane;
use crate::https::server::{Bodies, Handle, Limits, Post, Server, Sizes};
use crate::https::tls;
use crate::kube;
use crate::locks::Recover;
use crate::ops::health::{Health, InFlight};
use crate::ops::metrics::{Features, Metrics, ServerCounts};
use crate::source::origin::{self, Origin};
use crate::source::{Resources, Source};

/// What `cmpoll serve` runs with (from `settings::serve`).
#[derive(Clone, Debug)]
pub struct Options {
    pub source: origin::Options,
    pub interval: Duration,
    pub jitter: f64,
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// After SIGTERM: not ready, the followers let go over this window, spread; then the
    /// end.
    pub drain: Duration,
    /// `--token-audience`: tokens for it verified by the hub (`issuer.rs`).
    pub token_audience: Option<String>,
    /// `--authorize-per-service-account`.
    pub per_service_account: bool,
    /// `--validate`: every client is served each object's newest version that passed.
    pub validate: Option<crate::validate::Options>,
    /// `--state-dir`: what `--validate` remembers across restarts.
    pub state_dir: Option<PathBuf>,
    /// `--report-events`: one Event per object and version refused (`telling.rs`).
    pub report_events: bool,
    /// `--rollout`, `--rollout-wait`, `--rollout-state` (`rollout/`): `None` without
    /// `--rollout` (no rollouts; the annotation is ignored).
    pub rollout: Option<rollout::steps::Settings>,
    /// `--remotecfg`, `--remotecfg-arguments` (`remotecfg/`): `None` without them.
    pub remotecfg: Option<remotecfg::root::Paths>,
}

/// How often the hub makes what there is to tell its objects' authors (its refusals, the
/// fleet's): a view of every follower, not made at every poll.
const TELL_EVERY: Duration = Duration::from_secs(2);

/// Workers of each review lane (tokens nobody knows; accesses not kept): the reviews made
/// at once at most, each with a client of its own.
const REVIEWERS: usize = 4;

/// Parked (waiting), streaming (watching) or being-written requests one follower's token
/// may hold: a follower holds a watch of each scope it follows (each namespace of each
/// kind: 128 namespaces of both kinds), and one token no more than a sixty-fourth of the
/// hub's connections.
pub const MAX_HELD: usize = 256;

/// What one identity's connections may hold together beyond its largest (the answers they
/// are written, a render shared by several of them counted once, 16 KiB a connection at
/// least): a token that never reads its answers holds this much and one answer more.
pub const MAX_PINNED: usize = 32 << 20;

/// What the connections no identity holds (token-less: handshaking, not authenticated,
/// refused) may hold together: 4,096 of them at 16 KiB each.
pub const MAX_LOOSE: usize = 64 << 20;

/// What the whole report bodies being answered may hold together: 32 of the largest (one
/// arriving is its connection's own bytes, `bodies`).
pub const MAX_BODIES: usize = 32 << 20;

/// Workers that make the TLS handshakes (their crypto), at a lower priority than the
/// server's thread.
const HANDSHAKERS: usize = 2;

/// What the whole bodies of collectors' calls (`--remotecfg`) being answered may hold
/// together: a budget of their own, apart from `MAX_BODIES`. They are read before their
/// token is checked (a `GetConfig` after a load echoes the whole content it loaded, up to
/// `remotecfg::service::MAX_CALL`): while one arrives it is its connection's own bytes
/// (its owner's share, or the token-less connections', `MAX_LOOSE`, where the silent for
/// longest goes first), so clients that announce large bodies and stall fill neither this
/// budget nor the followers' reports'; only whole bodies take from it (then 503,
/// Retry-After).
pub const MAX_CALL_BODIES: usize = 32 << 20;

/// The bodies the hub reads: a follower's report (`hub_protocol::REPORT_PATH`), and with
/// `--remotecfg` each Connect call of a collector (`MAX_CALL_BODIES`).
pub(crate) fn bodies(remotecfg: bool) -> Vec<Post> {
    let mut posts = vec![Post {
        path: crate::hub_protocol::REPORT_PATH,
        cert: false,
        // A follower reports now and then, beside its watch: its report's connection
        // is not kept for the next one (10,000 of them idle would pin their buffers).
        close: true,
        max: crate::hub_protocol::MAX_REPORT,
        // Read before its token is checked: a report's body is its connection's own bytes
        // until whole (`Post`), so token-less clients that announce reports and stall
        // fill nothing a follower's report needs.
        budget: Some(Budget::new(MAX_BODIES)),
    }];
    if remotecfg {
        let calls = Budget::new(MAX_CALL_BODIES);
        // A collector's next call comes within its poll frequency (10 s at least, 1 m by
        // default): its connection is kept, as a follower's watch is.
        posts.extend(remotecfg::connect::PATHS.map(|(path, _)| Post {
            path,
            cert: false,
            close: false,
            max: remotecfg::service::MAX_CALL,
            budget: Some(calls.clone()),
        }));
    }
    posts
}

/// How the hub holds its clients: a fleet of followers, each with a keep-alive connection
/// and, between changes, one request waiting; requests whose reviews are kept are
/// answered on one lane, reviews are waited for on two others (`auth`).
fn limits(counts: ServerCounts, posts: Vec<Post>) -> Limits {
    let busy = |r: status::StatusError| {
        r.answer()
            .with(crate::hub_protocol::HUB_HEADER, env!("CARGO_PKG_VERSION"))
    };
    let workers_queue = |lane| match lane {
        // Answered on the server's thread (`inline`): a worker for nothing.
        HubLane::Answer => (1, 4096),
        HubLane::Authenticate => (REVIEWERS, 64),
        HubLane::Authorize => (REVIEWERS, 1024),
        HubLane::Render => (2, 4096),
    };
    let lane = |l: HubLane| Lane {
        name: l.name(),
        workers: workers_queue(l).0,
        queue: workers_queue(l).1,
        busy: busy(status::StatusError::too_many_requests()),
    };
    Limits {
        max_connections: 16_384,
        request_deadline: Duration::from_secs(10),
        idle: Duration::from_secs(120),
        write_deadline: Duration::from_secs(60),
        max_head: crate::https::http::MAX_HEAD,
        // The bodies of `posts` are the ones read (any other request is answered without
        // its body: a POST elsewhere is a 401, 403 or 405); one over its path's bound is a
        // 413 from its head; each path's whole bodies take from its own budget (`bodies`:
        // then 503, Retry-After), so the server's (`max_bodies`) is a floor no hub path
        // uses.
        max_body: posts.iter().map(|p| p.max).max().unwrap_or(0),
        bodies: Bodies::Post(posts),
        max_bodies: MAX_BODIES,
        keep_alive: true,
        lanes: HubLane::ALL.map(lane).to_vec(),
        max_held: MAX_HELD,
        max_pinned: MAX_PINNED,
        max_loose: MAX_LOOSE,
        handshakes: Sizes {
            workers: HANDSHAKERS,
            queue: 128,
        },
        inline: true,
        panicked: busy(status::StatusError::internal_error(
            "this request caused cmpoll serve to panic; its log has the details",
        )),
        counts,
    }
}

/// Serves until SIGTERM or SIGINT.
pub fn run(opts: Options, env: &dyn Fn(&str) -> Option<String>) -> Result<(), Error> {
    let metrics = Metrics::new();
    let counts = metrics.server();
    metrics.expect(&Features {
        polls: false,
        serve: true,
        validate: opts.validate.is_some(),
        report_events: opts.report_events,
        ..Features::default()
    });
    let in_flight = InFlight::default();
    let mut source_opts = opts.source.clone();
    source_opts.raw = true;
    source_opts.short_watch = true;
    source_opts.wait = None;
    let handles = kube::client::Handles::polling(&metrics, &in_flight);
    let source = origin::open(&source_opts, handles, env).map_err(Error::Config)?;
    let Origin::Api(flags) = &opts.source.origin else {
        return Err(Error::Config(
            "cmpoll serve: needs an apiserver (not --manifests)".into(),
        ));
    };
    let config = kube::Config::resolve(flags, env).map_err(Error::Config)?;
    let mut clients = Vec::new();
    for _ in 0..2 * REVIEWERS {
        let handles = kube::client::Handles::apart(&metrics);
        clients.push(
            kube::Client::new(&config, opts.source.client.clone(), handles, env)
                .map_err(Error::Config)?,
        );
    }
    let issuer = verifier(&opts, &config, &metrics, env)?;
    let auth = auth::Auth::new(
        Box::new(reviews::ApiReviewer::new(clients)),
        metrics.decisions(),
        counts.clone(),
    )
    .verifying(issuer)
    .per_service_account(opts.per_service_account);
    let served = metrics.served();
    let health = Health::new(
        opts.interval,
        backoff::cap(opts.interval),
        opts.source.client.timeout,
        in_flight,
    );
    let kinds = opts.source.selection.resources;
    let remote = remote_config(&opts, &config, &metrics, env)?;
    let posts = bodies(remote.is_some());
    let hub = Arc::new(
        Hub::new(
            kinds,
            Arc::new(Mutex::new(health)),
            Arc::new(Mutex::new(metrics)),
            auth,
            served,
        )
        .with_remotecfg(remote),
    );
    let certs =
        Arc::new(tls::Reloading::new(opts.cert.clone(), opts.key.clone()).map_err(Error::Config)?);
    let tls_config = certs.config(None).map_err(Error::Config)?;
    let listener = TcpListener::bind(opts.listen)
        .map_err(|e| Error::Config(format!("--listen {}: cannot listen: {e}", opts.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("--listen {}: {e}", opts.listen)))?;
    let stop = stopped_by_signals()?;
    let (server, handle) = Server::new(
        listener,
        Some(tls_config),
        hub.clone(),
        limits(counts, posts),
    )
    .map_err(|e| Error::Runtime(format!("--listen {bound}: {e}")))?;
    log::info!(
        "cmpoll serve {}: polling {} every {} (jitter {}): {}; serving it over HTTPS on {bound} (/api/v1, /healthz, /readyz, /metrics, /status{})",
        env!("CARGO_PKG_VERSION"),
        source.describe(),
        humantime::format_duration(opts.interval),
        opts.jitter,
        opts.source.selection.describe(),
        match opts.remotecfg {
            Some(_) => ", /collector.v1.CollectorService",
            None => "",
        },
    );
    let (validated, teller) = judging(&opts, &config, &hub, env)?;
    let poller = PollLoop {
        source,
        validated,
        teller,
        rollouts: rolling(&opts, &config, &hub, env)?,
        upstream: None,
        cannot: None,
        observers: Observers::new(hub.health.clone(), hub.metrics.clone()),
        hub: hub.clone(),
        handle: handle.clone(),
        kinds,
        pace: Pace {
            interval: opts.interval,
            jitter: opts.jitter,
            drain: opts.drain,
        },
    };
    let poll_stop = stop.clone();
    std::thread::Builder::new()
        .name("poll".into())
        .spawn(move || poller.run(&poll_stop))
        .map_err(|e| Error::Runtime(format!("cannot start the poll thread: {e}")))?;
    // Stopped by the poll thread once the drain is over (`Handle::stop`).
    server.run(&AtomicBool::new(false));
    log::info!("stopped");
    Ok(())
}

/// Set by SIGTERM or SIGINT: the first signal drains (`PollLoop::run`); a second one while
/// it does stops at once, as the signal's default action.
fn stopped_by_signals() -> Result<Arc<AtomicBool>, Error> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGTERM, SIGINT] {
        signal_hook::flag::register_conditional_default(sig, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()))
            .map_err(|e| Error::Runtime(format!("cannot handle signals: {e}")))?;
    }
    Ok(stop)
}

/// Always: which tokens the cluster signed decides the budget their reviews draw on; with
/// `--token-audience`, tokens for it are verified here.
fn verifier(
    opts: &Options,
    config: &kube::Config,
    metrics: &Metrics,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<issuer::Issuer>, Error> {
    let handles = kube::client::Handles::apart(metrics);
    let client = kube::Client::new(config, opts.source.client.clone(), handles, env)
        .map_err(Error::Config)?;
    if let Some(audience) = &opts.token_audience {
        log::info!(
            "--token-audience {audience}: tokens for it are verified here, against the service-account issuer's keys"
        );
    }
    let issuer = issuer::Issuer::new(opts.token_audience.clone(), read_from(client));
    issuer.prefetch();
    Ok(Some(issuer))
}

/// `--validate` and `--report-events`: the hub's judge, and the thread that tells authors.
fn judging(
    opts: &Options,
    config: &kube::Config,
    hub: &Hub,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<validated::Validated>, Option<telling::Teller>), Error> {
    let validated = match &opts.validate {
        Some(v) => {
            if opts.state_dir.is_none() {
                log::warn!(
                    "--validate without --state-dir: the verdicts and the last good versions held back are forgotten when the hub stops, and a restarted hub does not serve an object whose newest version it refuses"
                );
            }
            let opened = validated::Validated::open(v.clone(), opts.state_dir.as_deref());
            Some(opened.map_err(Error::Config)?)
        }
        None => None,
    };
    let teller = match opts.report_events {
        true => {
            let handles = kube::client::Handles::apart(&hub.metrics.lock().recover());
            let client = kube::Client::new(config, opts.source.client.clone(), handles, env)
                .map_err(Error::Config)?;
            let results = hub.metrics.lock().recover().event_reports();
            let instance = crate::report::instance(env);
            let writer = telling::Writer::new(
                telling::KubeEvents(client),
                instance,
                opts.interval,
                results,
            );
            Some(telling::Teller::start(writer).map_err(Error::Runtime)?)
        }
        false => None,
    };
    Ok((validated, teller))
}

/// `--remotecfg`: the service, its root read (a ConfigMap's with a client of its own).
fn remote_config(
    opts: &Options,
    config: &kube::Config,
    metrics: &Metrics,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<remotecfg::service::Remotecfg>, Error> {
    let Some(paths) = opts.remotecfg.clone() else {
        return Ok(None);
    };
    let fetch = match &paths.root {
        remotecfg::root::Location::ConfigMap(_) => {
            let handles = kube::client::Handles::apart(metrics);
            let client = kube::Client::new(config, opts.source.client.clone(), handles, env)
                .map_err(|e| Error::Config(format!("--remotecfg: {e}")))?;
            Some(read_bounded(client, remotecfg::root::configmap::MAX_ANSWER))
        }
        remotecfg::root::Location::File(_) => None,
    };
    let files = remotecfg::root::RootFiles::open(paths, fetch).map_err(Error::Config)?;
    Ok(Some(remotecfg::service::Remotecfg::new(files)))
}

/// `--rollout`: the rollouts, their state in the Secret `--rollout-state` names.
fn rolling(
    opts: &Options,
    config: &kube::Config,
    hub: &Hub,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<rollout::Rollouts>, Error> {
    let Some(settings) = &opts.rollout else {
        return Ok(None);
    };
    let handles = kube::client::Handles::apart(&hub.metrics.lock().recover());
    let client = kube::Client::new(config, opts.source.client.clone(), handles, env)
        .map_err(Error::Config)?;
    let store =
        rollout::store::KubeStore::new(client, &settings.state_namespace, &settings.state_name);
    let me = crate::report::instance(env);
    log::info!(
        "--rollout {}: new versions roll out in steps, held {} each; their state in {}",
        settings.steps,
        humantime::format_duration(settings.wait),
        rollout::store::Store::describe(&store),
    );
    Ok(Some(rollout::Rollouts::new(
        settings.clone(),
        me,
        Box::new(store),
    )))
}

/// Reads a path of the apiserver with `client` (the issuer's discovery and keys).
fn read_from(client: kube::Client) -> issuer::Fetch {
    read_bounded(client, 1 << 20)
}

/// Reads a path of the apiserver with `client`, `max` bytes of it at most.
fn read_bounded(client: kube::Client, max: u64) -> issuer::Fetch {
    let client = Mutex::new(client);
    Box::new(move |path: &str, accept: &str| {
        use std::io::Read as _;
        let mut c = client.lock().recover();
        let body = (c.get(path, accept, &format!("read {path}"))).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        (body.take(max).read_to_end(&mut out)).map_err(|e| format!("{path}: {e}"))?;
        Ok(out)
    })
}

/// The poll loop.
struct PollLoop {
    source: Box<dyn Source>,
    /// `--validate`: what each poll is served as.
    validated: Option<validated::Validated>,
    /// `--report-events`.
    teller: Option<telling::Teller>,
    /// `--rollout`: what each cohort is served of each poll.
    rollouts: Option<rollout::Rollouts>,
    /// With `--validate` or `--rollout`, the last complete poll as listed (what is served
    /// may differ): the next poll's previous.
    upstream: Option<Arc<Held>>,
    /// Why the validator cannot run, as last said.
    cannot: Option<String>,
    /// What a poll's outcome tells readiness and metrics (as `cmpoll run`'s loop does).
    observers: Observers,
    hub: Arc<Hub>,
    handle: Handle,
    kinds: Resources,
    pace: Pace,
}

/// How often the hub polls, and how long it lets its followers go when it stops.
struct Pace {
    interval: Duration,
    jitter: f64,
    drain: Duration,
}

impl PollLoop {
    /// Polls until `stop` (a signal), then drains: not ready, the followers let go over
    /// the drain window (still served meanwhile: a change reaches those not yet gone),
    /// then the server stops.
    fn run(mut self, stop: &AtomicBool) {
        let mut backoff = Backoff::polls(self.pace.interval, self.pace.jitter, Rng::from_time());
        let mut number = 0u64;
        let mut ends: Option<Instant> = None;
        loop {
            if ends.is_none() && stop.load(Ordering::Relaxed) {
                ends = Some(self.start_draining());
            }
            if ends.is_some_and(|t| Instant::now() >= t) {
                break;
            }
            number += 1;
            let wait = self.poll(number, &mut backoff);
            if let Some(r) = &self.hub.remotecfg {
                // `--remotecfg configmap:NS/NAME`: its root read again.
                r.refresh_root(Instant::now());
            }
            let mut until = backoff::after(Instant::now(), wait);
            loop {
                if ends.is_none() && stop.load(Ordering::Relaxed) {
                    ends = Some(self.start_draining());
                }
                until = ends.map_or(until, |e| e.min(until));
                if Instant::now() >= until {
                    break;
                }
                self.observers.loop_turned();
                let left = until.saturating_duration_since(Instant::now());
                std::thread::sleep(left.min(Duration::from_millis(200)));
            }
        }
        self.handle.stop();
    }

    /// With `--validate`, `held` as served: each object at its newest good version;
    /// `None` while the hub has published nothing and some object of it is neither judged
    /// nor has a good version (served now, it would be missing: removed, to its followers).
    fn judged(&mut self, held: Held, served: &Held) -> Option<Held> {
        let Some(v) = &mut self.validated else {
            return Some(held);
        };
        let held = Arc::new(held);
        self.upstream = Some(held.clone());
        let (served, judged) = v.judge(&held, served);
        self.hub.validation(v.status(&held, &judged));
        let held = served;
        {
            let m = self.observers.metrics();
            for r in &judged.runs {
                m.validation(r);
            }
            m.rejected_modules(judged.held_back);
        }
        // A validator that cannot run holds back what it could not judge; the hub goes on
        // serving every good version (its readiness is its polls'): said when it changes.
        if judged.cannot != self.cannot {
            match &judged.cannot {
                Some(why) => log::warn!(
                    "--validate: {why}; the versions it could not judge are held back until it can"
                ),
                None if self.cannot.is_some() => log::info!("--validate: the validator runs again"),
                None => {}
            }
            self.cannot = judged.cannot.clone();
        }
        if judged.unsettled > 0 && self.hub.current().is_none() {
            let why = match &judged.cannot {
                Some(why) => format!(": the validator cannot run ({why})"),
                None => String::new(),
            };
            let said = format!(
                "--validate: {} objects not judged yet{why}: not ready; the first poll is served once each is judged or has a good version",
                judged.unsettled
            );
            self.observers.health().failed(said.clone());
            log::debug!("{said}");
            return None;
        }
        Some(held)
    }

    /// With `--rollout`, `held` as each cohort is served it (`None`: the rollouts' state
    /// was never read; the hub is not ready).
    fn rolled_out(&mut self, held: Held) -> Option<views::Views> {
        let Some(r) = &mut self.rollouts else {
            return Some(views::Views::one(Arc::new(held)));
        };
        let held = Arc::new(held);
        if self.validated.is_none() {
            // What the next poll takes over unread is what was listed, not what a cohort
            // is served.
            self.upstream = Some(held.clone());
        }
        let prev = (self.hub.views())
            .unwrap_or_else(|| views::Views::one(Arc::new(Held::empty(self.kinds))));
        let turn = r.turn(held, &prev, self.hub.fleet());
        self.hub.rollouts(r.status());
        self.hub.rollout_metrics(turn.counts, &turn.wrote);
        for (kind, rv) in turn.behind {
            self.source.behind(kind, rv);
        }
        if turn.views.is_none() {
            let why = r.error().unwrap_or("not read yet");
            let said = format!("--rollout: the rollouts' state cannot be read: {why}; not ready");
            self.observers.health().failed(said.clone());
            log::debug!("{said}");
        }
        turn.views
    }

    /// `--report-events`: what there is to tell now — the versions the hub refused, and
    /// those its followers refused — handed to the thread that writes the Events.
    fn tell(&self) {
        let Some(t) = self.teller.as_ref().filter(|t| t.due(TELL_EVERY)) else {
            return;
        };
        let mut notices = match (&self.validated, &self.upstream) {
            (Some(v), Some(upstream)) => v.notices(upstream),
            _ => Vec::new(),
        };
        notices.extend(self.hub.fleet_notices());
        if let (Some(r), Some(served)) = (&self.rollouts, self.hub.current()) {
            notices.extend(r.notices(&served));
        }
        t.tell(notices);
    }

    /// Not ready from now on; the followers let go over the drain window. When it ends.
    fn start_draining(&mut self) -> Instant {
        self.observers.stopping();
        log::info!(
            "stopping: not ready; letting the followers go over {}",
            humantime::format_duration(self.pace.drain)
        );
        self.handle.drain(self.pace.drain);
        backoff::after(Instant::now(), self.pace.drain)
    }

    /// One poll: published whole when complete; the wait before the next.
    fn poll(&mut self, number: u64, backoff: &mut Backoff) -> Duration {
        let started = Instant::now();
        self.observers.loop_turned();
        let served = (self.hub.current()).unwrap_or_else(|| Arc::new(Held::empty(self.kinds)));
        let prev = self.upstream.clone().unwrap_or_else(|| served.clone());
        let mut gather = Gather::new(&prev);
        let listed = self.source.list(prev.as_ref(), &mut gather);
        let retry_after = listed.as_ref().err().and_then(|e| e.retry_after());
        let result = listed
            .map_err(|e| e.to_string())
            .and_then(|()| gather.finish(number));
        // What a short watch took moves on only with a complete poll.
        self.source.polled(result.is_ok());
        let took = started.elapsed();
        match result {
            Ok(held) => {
                let Some(held) = self.judged(held, &served) else {
                    // Judging the first poll: published once nothing in it is unjudged.
                    return self.pace.interval.min(Duration::from_millis(200));
                };
                let Some(views) = self.rolled_out(held) else {
                    // The rollouts' state never read: nothing may be served yet.
                    return self.pace.interval;
                };
                let objects = views.top.len();
                if self.observers.poll_succeeded(number, took, objects, 0) {
                    log::info!("poll {number}: serving {objects} objects");
                }
                if self.hub.publish_views(views) {
                    log::debug!("poll {number}: {objects} objects, changed: waking the followers");
                    self.handle.notify();
                }
                if let Some(v) = &mut self.validated {
                    v.keep_good();
                }
                self.tell();
                // A change held back (a scope listed before a write another one saw):
                // the next poll takes every scope of its kind past it.
                for (kind, rv) in self.hub.held_back() {
                    log::debug!(
                        "poll {number}: a change of {} at {rv} held back",
                        kind.plural()
                    );
                    self.source.behind(kind, rv);
                }
                // A short watch heard of changes as the wait would have: part of it.
                let watched = took.min(self.source.watches_briefly());
                backoff.after_success().saturating_sub(watched)
            }
            Err(e) => {
                self.observers.poll_failed(number, took, e.clone());
                let wait = backoff.after_failure(retry_after);
                log::warn!(
                    "poll {number} failed: {e}; serving the last complete poll; next attempt in {}",
                    humantime::format_duration(Duration::from_millis(wait.as_millis() as u64))
                );
                wait
            }
        }
    }
}
