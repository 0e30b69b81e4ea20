//! cmpoll: poll labelled Kubernetes ConfigMaps and hand them to an agent.
//!
//! Data flow, one poll:
//!
//! ```text
//! cli → settings → kube::Config → kube::Client (or source::manifests) → poll (all pages,
//!     all namespaces) → module (filter keys, validate, hash) → snapshot → diff(prev, next)
//!     → batch → sinks [outdir → child (stdin/signal) → reload_url → stdout]
//!     → health + metrics + sd_notify
//! ```
//!
//! Module contents never sit in memory as a whole: the poll streams items into the spool
//! (`spool.rs`) and the snapshot keeps hashes and locations only.

pub mod backoff;
pub mod cli;
pub mod daemon;
pub mod error;
pub mod event;
pub mod hash;
pub mod health;
pub mod kube;
pub mod list;
pub mod logging;
pub mod manifests;
pub mod metrics;
pub mod module;
pub mod poll;
pub mod secret;
pub mod selector;
pub mod server;
pub mod settings;
pub mod signals;
pub mod sink;
pub mod snapshot;
pub mod source;
pub mod spool;
pub mod systemd;
pub mod validation;

use std::io::Write;

use cli::Command;
use error::Error;
use kube::client::Options;
use poll::Poller;
use settings::{Mode, Settings, SourceSettings};
use snapshot::Snapshot;
use source::api::ApiSource;
use source::manifests::ManifestSource;
use spool::Spool;

/// Runs a parsed command; `env` is the process environment (a parameter for tests).
pub fn main(command: Command, env: &dyn Fn(&str) -> Option<String>) -> Result<(), Error> {
    let settings = Settings::from_args(&command, env)?;
    logging::init(settings.log_format);
    let in_flight = health::InFlight::default();
    let poller = Poller::new(source(&settings, env, &in_flight)?);
    match &settings.command {
        Mode::List { json } => list(poller, *json),
        Mode::Run(run) => daemon(poller, run, settings.client.timeout, in_flight, env),
    }
}

/// `cmpoll run`: builds the sinks in SPEC's order and runs the loop.
fn daemon(
    poller: Poller,
    run: &settings::RunSettings,
    timeout: std::time::Duration,
    in_flight: health::InFlight,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), Error> {
    use std::sync::{Arc, Mutex};
    let backoff_cap = backoff::cap(run.interval);
    let health = Arc::new(Mutex::new(health::Health::new(
        run.interval,
        backoff_cap,
        timeout,
        in_flight,
    )));
    let metrics = Arc::new(Mutex::new(metrics::Metrics::new()));
    if let Some(addr) = run.listen {
        let endpoints = server::Endpoints {
            health: health.clone(),
            metrics: metrics.clone(),
        };
        server::start(addr, endpoints).map_err(Error::Config)?;
    }
    // SPEC's order: output directory → child stdin → reload signal → reload URL → stdout.
    let mut sinks: Vec<Box<dyn sink::Sink>> = Vec::new();
    let (mut spool_dir, mut child, mut reload) = (None, None, None);
    if let Some(dir) = &run.out_dir {
        let out = sink::outdir::OutDir::open(sink::outdir::Options {
            dir: dir.clone(),
            layout: run.layout,
            ext: run.ext.clone(),
            file_mode: run.file_mode,
            old_version_ttl: run.old_version_ttl,
        })
        .map_err(Error::Config)?;
        spool_dir = Some(sink::outdir::meta_dir(dir));
        sinks.push(Box::new(out));
    }
    if !run.agent.is_empty() {
        let supervisor = sink::child::Supervisor::new(sink::child::Options {
            argv: run.agent.clone(),
            stdin_events: run.child_stdin == settings::ChildStdin::Events,
            reload_signal: run.reload_signal,
            restart: run.restart,
            grace: run.shutdown_grace,
            spool_dir: spool_dir.clone(),
        });
        child = Some(supervisor.status());
        sinks.push(Box::new(supervisor));
    }
    if let Some(url) = &run.reload_url {
        let sink = sink::reload_url::ReloadUrl::new(
            url,
            &run.reload_method,
            run.reload_ca_file.as_deref(),
            timeout,
            env,
        )
        .map_err(Error::Config)?;
        reload = Some(sink.status());
        sinks.push(Box::new(sink));
    }
    let others = run.out_dir.is_some() || !run.agent.is_empty() || run.reload_url.is_some();
    if run.stdout_events || !others {
        sinks.push(Box::new(sink::stdout::StdoutSink::new(std::io::stdout())));
    }
    let spool = Spool::new(spool_dir.as_deref()).map_err(|e| Error::Config(e.to_string()))?;
    let ops = daemon::Ops {
        health,
        metrics,
        notifier: systemd::Notifier::from_env(env),
        child,
        reload,
    };
    daemon::Daemon::new(run.clone(), sinks, ops).run(poller, spool)
}

/// Builds the source the settings ask for; configuration problems exit 2.
fn source(
    settings: &Settings,
    env: &dyn Fn(&str) -> Option<String>,
    in_flight: &health::InFlight,
) -> Result<Box<dyn source::Source>, Error> {
    let mut selection = settings.selection.clone();
    match &settings.source {
        SourceSettings::Manifests(dir) => {
            if settings.client.namespace_from_context {
                return Err(Error::Usage(
                    "--namespace-from-context: not used with --manifests (use --namespace)".into(),
                ));
            }
            if settings.client.metadata_first {
                log::info!("--metadata-first: not used with --manifests");
            }
            Ok(Box::new(ManifestSource::new(dir.clone(), selection)))
        }
        SourceSettings::Api(flags) => {
            let config = kube::Config::resolve(flags, env).map_err(Error::Config)?;
            if settings.client.namespace_from_context && selection.namespaces.is_empty() {
                let ns = config.namespace.clone().ok_or_else(|| {
                    Error::Config(format!(
                        "--namespace-from-context: {} has no namespace",
                        config.origin
                    ))
                })?;
                log::info!("listing namespace \"{ns}\" (from {})", config.origin);
                selection.namespaces = vec![ns];
            }
            let options = Options {
                timeout: settings.client.timeout,
                max_response_bytes: settings.client.max_response_bytes,
                allow_insecure_http: settings.client.allow_insecure_http,
                in_flight: in_flight.clone(),
            };
            let client = kube::Client::new(&config, options, env).map_err(Error::Config)?;
            log::debug!("apiserver {} ({})", config.server, config.origin);
            Ok(Box::new(ApiSource::new(
                client,
                selection,
                settings.client.page_size,
                settings.client.metadata_first,
            )))
        }
    }
}

/// `cmpoll list`: one poll, then print; a failed poll prints nothing and exits 1.
fn list(mut poller: Poller, json: bool) -> Result<(), Error> {
    let mut spool = Spool::new(None).map_err(|e| Error::Runtime(e.to_string()))?;
    let (snapshot, stats) = poller.poll(&Snapshot::default(), &mut spool)?;
    log::debug!(
        "{}: {} configmaps, {} modules, {} rejected, {} without selected keys",
        poller.describe(),
        stats.items,
        stats.modules,
        stats.rejected,
        stats.without_keys
    );
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let written = if json {
        list::json(&snapshot, &spool, &mut out)
    } else {
        list::table(&snapshot, &mut out)
    }
    .and_then(|()| out.flush());
    match written {
        Ok(()) => Ok(()),
        // `cmpoll list | head`: the reader left; that is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Error::Runtime(format!("cannot write to stdout: {e}"))),
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
}
