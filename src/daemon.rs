//! `cmpoll run`: the loop. Poll on an interval, diff against the last complete snapshot,
//! hand the batch to the sinks in order, and never act on a failed poll.
//!
//! The main thread waits on one channel for everything that can happen: a signal
//! (forwarded by the signal thread), a finished poll (from the poll thread), a deadline.
//! So a SIGTERM is acted on at once even while a request hangs, and the wait between polls
//! costs nothing. The `Store` (snapshot and spool) travels to the poll thread with each job
//! and comes back with its result: only one side holds it at a time, without locks.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::backoff::{self, Backoff, Rng};
use crate::batch::{Control, Delivery, Observers, View};
use crate::error::Error;
use crate::locks::Recover;
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;
use crate::ops::process;
use crate::ops::signals::{self, Signal};
use crate::ops::systemd::Notifier;
use crate::poll::store::Store;
use crate::poll::{self, PollStats, Polled, Poller};

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub interval: Duration,
    pub jitter: f64,
    /// One poll, every sink applied, then exit.
    pub once: bool,
    /// With `once`: a failed reload is a warning, not exit 1 (`cmpoll sidecar` with
    /// `METHOD=LIST`: an init container runs before the agent it would reload is up).
    pub once_tolerates_reloads: bool,
    /// What is selected and where it goes, for the start-up line.
    pub summary: String,
}

/// What the loop reports to: health, metrics, systemd.
pub struct Ops {
    pub health: Arc<Mutex<Health>>,
    pub metrics: Arc<Mutex<Metrics>>,
    pub notifier: Notifier,
}

/// What the main loop waits for.
enum Msg {
    Signal(Signal),
    Polled(Box<Finished>),
}

/// A finished poll: the store back, and the result.
struct Finished {
    store: Store,
    number: u64,
    result: Result<Polled, poll::Error>,
    took: Duration,
    /// The source talks to a `cmpoll serve` hub.
    hub: bool,
}

/// A poll the loop asks of the poll thread: the store, and the poll's number.
struct Turn {
    store: Store,
    number: u64,
}

/// The loop wakes at least this often, so health sees it alive.
const HEARTBEAT: Duration = Duration::from_secs(60);
/// How far a hub's followers spread their first try after losing it (a hub restarting,
/// a rollout; each later try over twice the span before): their lists then reach the
/// other hub, or this one again, over this span.
const HUB_SPREAD: Duration = Duration::from_secs(10);
/// Between two polls of a `cmpoll serve` hub that holds them: the hub does the waiting.
const AFTER_WAITING: Duration = Duration::from_millis(100);
/// How long a stop waits for `--report-events` to send what it still holds.
const REPORTS_AT_STOP: Duration = Duration::from_secs(5);

fn spawn_poller(mut poller: Poller, tx: Sender<Msg>) -> Result<Sender<Turn>, Error> {
    let (jobs, rx) = mpsc::channel::<Turn>();
    thread::Builder::new()
        .name("poll".into())
        .spawn(move || {
            for mut job in rx {
                let started = Instant::now();
                let result = poller.poll(&job.store.snapshot, &mut job.store.spool);
                let done = Finished {
                    store: job.store,
                    number: job.number,
                    result,
                    took: started.elapsed(),
                    hub: poller.hub_waits(),
                };
                if tx.send(Msg::Polled(Box::new(done))).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| Error::Runtime(format!("cannot start the poll thread: {e}")))?;
    Ok(jobs)
}

/// After a finished poll: go on (with the store back and the wait before the next poll),
/// or stop with this result.
enum Next {
    Poll(Store, Duration),
    Stop(Result<(), Error>),
}

pub struct Daemon {
    opts: Options,
    /// The gate and the sinks (`batch/delivery.rs`).
    delivery: Delivery,
    /// Who hears what each poll and each commit did (`batch/observe.rs`).
    observers: Observers,
    ops: Ops,
    backoff: Backoff,
    /// The number of the poll the current snapshot came from.
    last_poll: u64,
}

impl Daemon {
    pub fn new(opts: Options, delivery: Delivery, observers: Observers, ops: Ops) -> Daemon {
        let backoff = Backoff::polls(opts.interval, opts.jitter, Rng::from_time());
        Daemon {
            opts,
            delivery,
            observers,
            ops,
            backoff,
            last_poll: 0,
        }
    }

    /// Runs until SIGTERM/SIGINT (or, with `--once`, one poll).
    pub fn run(mut self, poller: Poller, store: Store) -> Result<(), Error> {
        let (tx, rx) = mpsc::channel();
        let signal_tx = tx.clone();
        signals::forward(
            move |s| {
                let _ = signal_tx.send(Msg::Signal(s));
            },
            process::kill_agent_now,
        )
        .map_err(|e| Error::Runtime(format!("cannot handle signals: {e}")))?;
        log::info!(
            "cmpoll {}: polling {} every {} (jitter {}){}",
            env!("CARGO_PKG_VERSION"),
            poller.describe(),
            humantime::format_duration(self.opts.interval),
            self.opts.jitter,
            self.opts.summary
        );
        let jobs = spawn_poller(poller, tx)?;
        self.event_loop(&rx, &jobs, store)
    }

    fn event_loop(
        &mut self,
        rx: &Receiver<Msg>,
        jobs: &Sender<Turn>,
        store: Store,
    ) -> Result<(), Error> {
        let mut store = Some(store);
        let mut next_poll = Instant::now();
        let mut polls = 0u64;
        let mut poll_again = false;
        let mut next_watchdog = Instant::now();
        loop {
            self.observers.loop_turned();
            self.watchdog(&mut next_watchdog);
            if let Some(st) = store.take_if(|_| Instant::now() >= next_poll) {
                polls += 1;
                jobs.send(Turn {
                    store: st,
                    number: polls,
                })
                .map_err(|_| Error::Runtime("the poll thread stopped".into()))?;
            }
            // While a poll is out only a message or a sink's deadline moves things on.
            let watchdog = self.ops.notifier.watchdog_every().map(|_| next_watchdog);
            let deadline = (self.delivery.sinks.iter())
                .filter_map(|s| s.deadline())
                .chain(store.as_ref().map(|_| next_poll))
                .chain(watchdog)
                .min();
            let wait = deadline
                .map_or(HEARTBEAT, |d| d.saturating_duration_since(Instant::now()))
                .min(HEARTBEAT);
            let msg = match rx.recv_timeout(wait) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::Runtime("the poll thread stopped".into()));
                }
            };
            match msg {
                None | Some(Msg::Signal(Signal::CHLD)) => {}
                Some(Msg::Signal(Signal::HUP)) => {
                    log::info!("SIGHUP: polling now");
                    if store.is_some() {
                        next_poll = Instant::now();
                    } else {
                        poll_again = true;
                    }
                }
                Some(Msg::Signal(s)) => {
                    log::info!("{s}: stopping");
                    self.shutdown(Some(s));
                    return Ok(());
                }
                Some(Msg::Polled(done)) => match self.polled(*done) {
                    Next::Stop(result) => return result,
                    Next::Poll(st, wait) => {
                        store = Some(st);
                        let wait = if std::mem::take(&mut poll_again) {
                            Duration::ZERO
                        } else {
                            wait
                        };
                        next_poll = backoff::after(Instant::now(), wait);
                    }
                },
            }
            // Housekeeping after anything: reap an agent, restart it, expire old versions.
            if let Some(code) = self.tick(store.as_ref())? {
                self.shutdown(None);
                return if code == 0 {
                    Ok(())
                } else {
                    Err(Error::Exit(code))
                };
            }
        }
    }

    /// Only a loop that is really alive pets systemd's watchdog.
    fn watchdog(&self, next: &mut Instant) {
        let Some(every) = self.ops.notifier.watchdog_every() else {
            return;
        };
        if Instant::now() < *next {
            return;
        }
        let live = self
            .health()
            .liveness(Instant::now(), std::time::SystemTime::now());
        match live {
            Ok(()) => self.ops.notifier.send("WATCHDOG=1"),
            Err(why) => log::warn!("not alive, not notifying the watchdog: {why}"),
        }
        *next = backoff::after(Instant::now(), every);
    }

    /// A finished poll: a successful one goes through the sinks; a failed one only backs
    /// off. With `--once`, the end.
    fn polled(&mut self, done: Finished) -> Next {
        let mut store = done.store;
        self.observers.following_hub(done.hub);
        let polled = match done.result {
            Ok(p) => p,
            Err(e) => {
                self.polled_err(&e, done.number, done.took);
                if self.opts.once {
                    return Next::Stop(Err(Error::Runtime(e.to_string())));
                }
                // A hub that turned this follower away to admit it later (its review
                // budgets: a hub that just started) says when: as told, no failure. A hub
                // that restarts cuts every follower's waiting list at once: each tries
                // again at a moment of its own within 10 s (then 20, 40…), not together,
                // and soon after the hub is back.
                let wait = match (e.hub_asks_to_wait(), done.hub) {
                    (Some(after), _) => self.backoff.told(after),
                    (None, true) => {
                        (self.backoff).after_failure_spread(e.retry_after(), HUB_SPREAD)
                    }
                    (None, false) => self.backoff.after_failure(e.retry_after()),
                };
                log::warn!(
                    "poll {} failed: {e}; next attempt in {}",
                    done.number,
                    humantime::format_duration(round(wait))
                );
                return Next::Poll(store, wait);
            }
        };
        let stats = polled.stats;
        let committed =
            (self.delivery).commit(&mut store, polled.snapshot, done.number, &stats, done.took);
        let record = match committed {
            Ok(c) => {
                // Before the store takes the poll's snapshot: the spool has its contents.
                let held = &store.snapshot;
                (self.observers).committed(&c.record, &store.spool, c.polled(), held);
                let refused = self.delivery.refusals();
                let record = c.into_store(&mut store);
                // After: the store holds what the sinks hold.
                (self.observers).holding(&store.snapshot, &record, refused);
                record
            }
            Err(e) => {
                self.shutdown(None);
                return Next::Stop(Err(Error::Runtime(e.0)));
            }
        };
        self.last_poll = done.number;
        self.polled_ok(&store, &stats, done.number, done.took);
        let unwritten = record.unwritten;
        if self.opts.once {
            // Everything delivered, reload calls included, or exit 1 (SPEC).
            let mut problems: Vec<String> = (self.delivery.sinks.iter_mut())
                .filter_map(|s| s.finish().err())
                .collect();
            if self.opts.once_tolerates_reloads {
                for p in problems.drain(..) {
                    log::warn!("{p} (not an error here: METHOD=LIST)");
                }
            }
            self.shutdown(None);
            let validator = self.health().validator().map(str::to_string);
            if let Some(why) = validator {
                problems.insert(0, format!("--validate: {why}"));
            }
            if !unwritten.is_empty() {
                problems.insert(
                    0,
                    format!(
                        "{} module(s) could not be written: {} (see the warnings above)",
                        unwritten.len(),
                        (unwritten.iter().map(|u| u.module.as_str()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
            }
            if problems.is_empty() {
                return Next::Stop(Ok(()));
            }
            return Next::Stop(Err(Error::Runtime(problems.join("; "))));
        }
        let wait = self.backoff.after_success();
        // A hub holds the next poll until it has something newer (or the wait runs out):
        // it waits there, not here.
        Next::Poll(store, if stats.hub_waits { AFTER_WAITING } else { wait })
    }

    fn health(&self) -> MutexGuard<'_, Health> {
        self.ops.health.lock().recover()
    }

    fn polled_ok(&mut self, store: &Store, stats: &PollStats, number: u64, took: Duration) {
        let modules = store.snapshot.len();
        let first = (self.observers).poll_succeeded(number, took, modules, stats.invalid);
        let status = format!("STATUS={modules} modules");
        if first {
            self.ops.notifier.send(&format!("READY=1\n{status}"));
        } else {
            self.ops.notifier.send(&status);
        }
    }

    fn polled_err(&mut self, e: &poll::Error, number: u64, took: Duration) {
        (self.observers).poll_failed(number, took, e.to_string());
        let modules = self.health().modules();
        self.ops
            .notifier
            .send(&format!("STATUS={modules} modules; last poll failed: {e}"));
    }

    /// Ticks every sink; `Some(code)` when one asks cmpoll to exit.
    fn tick(&mut self, store: Option<&Store>) -> Result<Option<i32>, Error> {
        let view = store.map(|st| View {
            snapshot: &st.snapshot,
            spool: &st.spool,
            poll: self.last_poll,
        });
        for sink in &mut self.delivery.sinks {
            match sink.tick(view.as_ref()) {
                Ok(Control::Continue) => {}
                Ok(Control::Exit(code)) => return Ok(Some(code)),
                Err(f) => return Err(Error::Runtime(f.0)),
            }
        }
        Ok(None)
    }

    fn shutdown(&mut self, signal: Option<Signal>) {
        self.ops.notifier.send("STOPPING=1");
        for sink in &mut self.delivery.sinks {
            sink.shutdown(signal);
        }
        // What --report-events still holds (a rejection of a `--once` run) goes out now,
        // for a bounded time.
        self.observers.finish_reports(REPORTS_AT_STOP);
    }
}

/// Milliseconds are enough for a log line.
fn round(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
