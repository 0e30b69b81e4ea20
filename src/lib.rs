//! cmpoll: poll labelled Kubernetes ConfigMaps and hand them to an agent.
//!
//! Data flow, one poll:
//!
//! ```text
//! cli → settings (one entry per command) → source::origin::open → kube::Client (or
//!     source::manifests) → source (list, all pages, all namespaces) → poll (module:
//!     filter keys, validate, hash) → snapshot → batch::Delivery [diff → screen (.url
//!     fetches, --validate) → the sinks in order: outdir → child (stdin/signal) →
//!     on_change → reload_url → stdout → settle → --confirm] → a Record, which the
//!     daemon hands batch::Observers → log, ledger, report (Events), ops (health, metrics,
//!     sd_notify)
//! ```
//!
//! `cmpoll serve` (a hub) polls with the same source, keeps each object's JSON as served
//! (`serve::held`) and answers the read API over `https` (`serve::hub`), reviewing every
//! request's token and access with the apiserver; its followers are `cmpoll run`.
//!
//! The tree follows it, top layer first: `cli`/`settings` (what was asked), the commands
//! (`daemon`, `list`, `webhook/`, `serve/`, `status/`), `sink/` (who hears of a batch), `batch/`
//! (what a batch is and how it is delivered: the `Sink` trait lives here, with its
//! caller), `validate/`, `fetch`, `report` (Events), `hub_report/` (a follower's report
//! to its hub), `ledger` and `template`, `poll/`
//! (modules, snapshots, the spool), `source/` (what it lists), `kube/` and `http/`
//! (reaching the apiserver), and the building blocks (`ops/`, `atomic`, `reason`, `names`,
//! `idmap`, …). No arrow runs back up, between layers or between the rooms of a folder
//! (`tools/imports.py`). Module contents never sit in memory as a whole: the poll streams
//! items into the spool and the snapshot keeps hashes and locations only.
//!
//! Only what other programs use is `pub` (the binary: `cli`, `error`, `ops`; the fuzz
//! targets: `poll`, `source`, `selector`; `tests/real/events.rs`: `kube`, `report`); every
//! other module is private, so that the compiler sees what nothing uses.

mod atomic;
mod backoff;
mod batch;
pub mod cli;
mod daemon;
pub mod error;
mod fetch;
mod http;
mod https;
mod hub_protocol;
mod hub_report;
mod idmap;
pub mod kube;
mod ledger;
mod list;
mod locks;
mod names;
pub mod ops;
pub mod poll;
mod reason;
pub mod report;
mod secret;
pub mod selector;
mod serve;
mod settings;
mod sink;
pub mod source;
mod status;
mod template;
mod validate;
mod webhook;
mod words;

use std::sync::{Arc, Mutex};

use crate::locks::Recover;
use cli::Command;
use error::Error;
use ops::health::{Health, InFlight};
use ops::metrics::Metrics;
use poll::Poller;
use poll::spool::Spool;
use poll::store::Store;
use settings::RunSettings;

/// Runs a parsed command; `env` is the process environment and `names` its variable
/// names (parameters, for tests). Each command reads its own settings from its own
/// arguments: a command wired to another's settings does not compile.
pub fn run(
    command: Command,
    env: &dyn Fn(&str) -> Option<String>,
    names: &[String],
) -> Result<(), Error> {
    // Before anything can fail: even a usage error reaches the journal with its priority.
    let journal = ops::logging::detect_journal(env);
    match command {
        Command::Run(args) => run_daemon(settings::run(&args, env)?, journal, names, env),
        Command::Sidecar(_) => run_daemon(settings::sidecar(env)?, journal, names, env),
        Command::List(args) => {
            let s = settings::list(&args, env)?;
            ops::logging::init(s.logging, journal);
            warn_unknown(names, env);
            let metrics = Metrics::new();
            let handles = kube::client::Handles::apart(&metrics);
            let source = source::origin::open(&s.source, handles, env).map_err(Error::Config)?;
            list::run(Poller::new(source), s.json)
        }
        Command::Webhook(args) => {
            let w = settings::webhook(&args, env)?;
            ops::logging::init(w.logging, journal);
            warn_unknown(names, env);
            webhook::run(w.webhook)
        }
        Command::Serve(args) => {
            let s = settings::serve(&args, env)?;
            ops::logging::init(s.logging, journal);
            warn_unknown(names, env);
            serve::run(s.serve, env)
        }
        Command::Status(args) => status::run(settings::status(&args, env)?, env),
    }
}

/// `cmpoll run` and `cmpoll sidecar`: the source, the parts the loop reports to, then the
/// loop.
fn run_daemon(
    settings: RunSettings,
    journal: bool,
    names: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), Error> {
    ops::logging::init(settings.logging, journal);
    warn_unknown(names, env);
    for (level, note) in &settings.notes {
        log::log!(*level, "{note}");
    }
    let metrics = Metrics::new();
    metrics.expect(&ops::metrics::Features {
        polls: true,
        reloads: settings.sinks.has_reloads(),
        validate: settings.validate.is_some(),
        report_events: settings.report_events,
        webhook: false,
        serve: false,
    });
    let in_flight = InFlight::default();
    let handles = kube::client::Handles::polling(&metrics, &in_flight);
    let source = source::origin::open(&settings.source, handles, env).map_err(Error::Config)?;
    let mut naming = settings.naming.clone();
    if let Some(root) = &naming.folder_root {
        let absolute = std::path::absolute(root)
            .map_err(|e| Error::Config(format!("--out-dir '{}': {e}", root.display())))?;
        naming.folder_root = Some(absolute);
    }
    let poller = Poller::new(source).naming(naming);
    // A hub may hold a poll for its wait before the request's own timeout runs.
    let timeout =
        (settings.source.client.timeout).saturating_add(settings.source.wait.unwrap_or_default());
    let mut run = settings;
    run.daemon.summary = format!(
        ": {}; delivering to {}",
        run.source.selection.describe(),
        run.sinks.describe()
    );
    let reporter = match run.report_events {
        true => Some(reporter(&run.source, &metrics, env)?),
        false => None,
    };
    let resources = run.source.selection.resources;
    let ledger = run.listen.map(|_| {
        ledger::Ledger::new(
            poller.describe(),
            run.source.selection.labels.as_str().to_string(),
            run.daemon.interval,
            resources,
            ops::health::ReloadOutcomes::default(),
        )
    });
    let hub_reports = match run.daemon.once {
        false => hub_reports(&run.source, run.daemon.interval, &metrics, env)?,
        true => None,
    };
    let parts = Parts {
        metrics,
        in_flight,
        reporter,
        hub_reports,
        ledger,
    };
    daemon(poller, &run, timeout, parts, env)
}

/// A `CMPOLL_*` variable that names no flag: a typo must not pass silently.
fn warn_unknown(names: &[String], env: &dyn Fn(&str) -> Option<String>) {
    let vars: Vec<(&str, String)> = (names.iter())
        .filter_map(|name| Some((name.as_str(), env(name)?)))
        .collect();
    let vars = vars.iter().map(|(name, value)| (*name, value.as_str()));
    for warning in cli::unknown_variables(vars) {
        log::warn!("{warning}");
    }
}

/// `--report-events`: a client of its own (same credentials as the source's) on a thread
/// of its own, so that recording never holds up a poll.
fn reporter(
    source: &source::origin::Options,
    metrics: &Metrics,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<report::Reporter, Error> {
    let source::origin::Origin::Api(flags) = &source.origin else {
        return Err(Error::Config(
            "--report-events: needs an apiserver (not used with --manifests)".into(),
        ));
    };
    let config = kube::Config::resolve(flags, env).map_err(Error::Config)?;
    let handles = kube::client::Handles::apart(metrics);
    let client =
        kube::Client::new(&config, source.client.clone(), handles, env).map_err(Error::Config)?;
    report::Reporter::start(
        report::KubeApi(client),
        report::instance(env),
        metrics.event_reports(),
    )
    .map_err(Error::Config)
}

/// A follower's reports to its hub (`hub_report`): a client of its own (the source's
/// credentials, CA, TLS and proxy) on a thread of its own, idle until the source turns out
/// to be a hub. None from `--manifests`.
fn hub_reports(
    source: &source::origin::Options,
    interval: std::time::Duration,
    metrics: &Metrics,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<hub_report::HubReports>, Error> {
    let source::origin::Origin::Api(flags) = &source.origin else {
        return Ok(None);
    };
    let config = kube::Config::resolve(flags, env).map_err(Error::Config)?;
    let handles = kube::client::Handles::apart(metrics);
    let client =
        kube::Client::new(&config, source.client.clone(), handles, env).map_err(Error::Config)?;
    let hub = hub_report::KubeHub {
        client,
        wait: source.wait.unwrap_or(interval),
    };
    let results = metrics.hub_reports();
    results.expect(&["ok", "error"]);
    hub_report::HubReports::start(hub, results)
        .map(Some)
        .map_err(Error::Config)
}

/// What `cmpoll run` is made with besides its settings.
struct Parts {
    metrics: Metrics,
    in_flight: InFlight,
    reporter: Option<report::Reporter>,
    /// A follower's reports to its hub.
    hub_reports: Option<hub_report::HubReports>,
    /// `/status`, with `--listen`.
    ledger: Option<ledger::Ledger>,
}

/// `cmpoll run`: the endpoints, the sinks in SPEC's order, and the loop.
fn daemon(
    poller: Poller,
    run: &RunSettings,
    timeout: std::time::Duration,
    parts: Parts,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), Error> {
    let Parts {
        metrics,
        in_flight,
        reporter,
        hub_reports,
        ledger,
    } = parts;
    let interval = run.daemon.interval;
    let health = Health::new(interval, backoff::cap(interval), timeout, in_flight)
        .live_after_first_batch(run.health.live_after_first_batch);
    // The ledger reads the same reload outcomes as readiness.
    let ledger = ledger.map(|mut l| {
        l.reloads = health.reloads().clone();
        Arc::new(Mutex::new(l))
    });
    let handles = sink::Handles {
        reloads: sink::reloads::ReloadResults {
            outcomes: health.reloads().clone(),
            counter: metrics.reloads(),
        },
        child_restarts: metrics.child_restarts(),
        writing: health.writing().clone(),
    };
    let health = Arc::new(Mutex::new(health));
    let metrics = Arc::new(Mutex::new(metrics));
    if let Some(addr) = run.listen {
        let status = ledger.clone().map(|l| {
            let health = health.clone();
            Arc::new(move |query: &str| {
                let query = status::answer::Query::parse(query)?;
                let answer = {
                    let l = l.lock().recover();
                    let h = health.lock().recover();
                    status::answer::answer(&l, &h, &query)
                };
                Ok(serde_json::to_string_pretty(&answer).unwrap_or_default() + "\n")
            }) as https::endpoints::StatusReporter
        });
        let endpoints = https::endpoints::Endpoints {
            health: health.clone(),
            metrics: metrics.clone(),
            status,
        };
        listen(addr, endpoints, &run.health)?;
    }
    // Where a sink, or fetching `.url` keys, reads every module back in the first batch
    // anyway, the output folder's record is not taken as proof of what it holds.
    let trust_record = !run.sinks.reads_every_module_at_start() && run.fetch.is_none();
    let (sinks, shelf) =
        sink::open(&run.sinks, &handles, env, trust_record).map_err(Error::Config)?;
    let spool_dir = run
        .sinks
        .out_dir
        .as_ref()
        .map(|o| sink::outdir::meta_dir(&o.dir));
    let mut spool = Spool::new(spool_dir.as_deref()).map_err(|e| Error::Config(e.to_string()))?;
    // Delivered modules are read back from the folder: not kept twice on its volume.
    if let Some(shelf) = shelf {
        spool = spool.with_shelf(shelf);
    }
    let ops = daemon::Ops {
        health,
        metrics,
        notifier: ops::systemd::Notifier::from_env(env),
    };
    let mut store = Store::new(spool);
    if run.daemon.once {
        store = store.without_shelving();
    }
    let gate = match &run.validate {
        Some(o) => {
            let g = validate::Gate::open(o.clone()).map_err(Error::Config)?;
            g.seed(&mut store)
                .map_err(|e| Error::Config(format!("--validate: {e}")))?;
            Some(g)
        }
        None => None,
    };
    let fetcher = match &run.fetch {
        Some(o) => Some(fetch::Fetcher::new(o.clone(), env).map_err(Error::Config)?),
        None => None,
    };
    let names = batch::Delivery::sink_names(&sinks);
    let observers = batch::Observers::new(ops.health.clone(), ops.metrics.clone())
        .reporting(reporter)
        .recording(ledger, names)
        .telling_hub(hub_reports, run.source.selection.resources);
    let delivery = batch::Delivery::new(gate, sinks).fetching(fetcher);
    daemon::Daemon::new(run.daemon.clone(), delivery, observers, ops).run(poller, store)
}

/// Starts the endpoints on `addr`, or (`cmpoll sidecar`) on the fallback address where
/// the pod has no IPv6; a port already in use is a warning there, two sidecars in one pod
/// being what charts do.
fn listen(
    addr: std::net::SocketAddr,
    endpoints: https::endpoints::Endpoints,
    rules: &settings::HealthRules,
) -> Result<(), Error> {
    let result =
        https::endpoints::start(addr, endpoints.clone()).or_else(|e| match rules.fallback {
            Some(fallback) if e.no_such_family() => https::endpoints::start(fallback, endpoints),
            _ => Err(e),
        });
    match result {
        Ok(_) => Ok(()),
        Err(e) if rules.busy_is_warning => {
            log::warn!("{e}; going on without /healthz, /readyz and /metrics");
            Ok(())
        }
        Err(e) => Err(Error::Config(e.to_string())),
    }
}

/// Helpers for unit tests.
#[cfg(test)]
pub(crate) mod testutil {
    /// A file of `tests/fixtures/kube-api`.
    pub fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/kube-api/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Hands out a body `.1` bytes at a time, so every boundary falls somewhere odd.
    pub struct Dribble<'a>(pub &'a [u8], pub usize);

    impl std::io::Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }
}
