//! `cmpoll run`: the loop. Poll on an interval, diff against the last complete snapshot,
//! hand the batch to the sinks in order, and never act on a failed poll.
//!
//! The main thread waits on one channel for everything that can happen: a signal
//! (forwarded by the signal thread), a finished poll (from the poll thread), a deadline.
//! So a SIGTERM is acted on at once even while a request hangs, and the wait between polls
//! costs nothing. The `Store` (snapshot and spool) travels to the poll thread with each job
//! and comes back with its result: only one side holds it at a time, without locks.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::backoff::{self, Backoff, Rng};
use crate::error::Error;
use crate::gate::Gate;
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;
use crate::ops::process;
use crate::ops::signals::{self, Signal};
use crate::ops::systemd::Notifier;
use crate::poll::event::{self, Change, Event, Synced};
use crate::poll::hash::Hash;
use crate::poll::snapshot::Snapshot;
use crate::poll::store::Store;
use crate::poll::{self, PollStats, Polled, Poller};
use crate::sink::{Batch, Control, Sink, View};

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub interval: Duration,
    pub jitter: f64,
    /// One poll, every sink applied, then exit.
    pub once: bool,
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
    Polled(Box<Done>),
}

/// A finished poll: the store back, and the result.
struct Done {
    store: Store,
    number: u64,
    result: Result<Polled, poll::Error>,
    took: Duration,
}

struct Job {
    store: Store,
    number: u64,
}

/// The loop wakes at least this often, so health sees it alive.
const HEARTBEAT: Duration = Duration::from_secs(60);

fn spawn_poller(mut poller: Poller, tx: Sender<Msg>) -> Result<Sender<Job>, Error> {
    let (jobs, rx) = mpsc::channel::<Job>();
    thread::Builder::new()
        .name("poll".into())
        .spawn(move || {
            for mut job in rx {
                let started = Instant::now();
                let result = poller.poll(&job.store.snapshot, &mut job.store.spool);
                let done = Done {
                    store: job.store,
                    number: job.number,
                    result,
                    took: started.elapsed(),
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
    /// `--validate`: between a batch and the sinks.
    gate: Option<Gate>,
    sinks: Vec<Box<dyn Sink>>,
    ops: Ops,
    backoff: Backoff,
    /// Successful polls so far (the first one always emits a batch).
    batches: u64,
    /// The number of the poll the current snapshot came from.
    last_poll: u64,
    /// Modules held back (`rejected`), by the hash held back: a rejection is announced
    /// once per content, not once per poll.
    rejected: HashMap<String, Hash>,
}

impl Daemon {
    pub fn new(opts: Options, gate: Option<Gate>, sinks: Vec<Box<dyn Sink>>, ops: Ops) -> Daemon {
        let backoff = Backoff::polls(opts.interval, opts.jitter, Rng::from_time());
        Daemon {
            opts,
            gate,
            sinks,
            ops,
            backoff,
            batches: 0,
            last_poll: 0,
            rejected: HashMap::new(),
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
        jobs: &Sender<Job>,
        store: Store,
    ) -> Result<(), Error> {
        let mut store = Some(store);
        let mut next_poll = Instant::now();
        let mut polls = 0u64;
        let mut poll_again = false;
        let mut next_watchdog = Instant::now();
        loop {
            self.health().loop_at = Instant::now();
            self.watchdog(&mut next_watchdog);
            if let Some(st) = store.take_if(|_| Instant::now() >= next_poll) {
                polls += 1;
                jobs.send(Job {
                    store: st,
                    number: polls,
                })
                .map_err(|_| Error::Runtime("the poll thread stopped".into()))?;
            }
            // While a poll is out only a message or a sink's deadline moves things on.
            let watchdog = self.ops.notifier.watchdog_every().map(|_| next_watchdog);
            let deadline = (self.sinks.iter())
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
    fn polled(&mut self, done: Done) -> Next {
        let mut store = done.store;
        let polled = match done.result {
            Ok(p) => p,
            Err(e) => {
                self.polled_err(&e, done.took);
                if self.opts.once {
                    return Next::Stop(Err(Error::Runtime(e.to_string())));
                }
                let wait = self.backoff.after_failure(e.retry_after());
                log::warn!(
                    "poll {} failed: {e}; next attempt in {}",
                    done.number,
                    humantime::format_duration(round(wait))
                );
                return Next::Poll(store, wait);
            }
        };
        let stats = polled.stats;
        let committed = self.commit(&mut store, polled.snapshot, done.number, &stats, done.took);
        let (synced, unwritten) = match committed {
            Ok(c) => c,
            Err(e) => {
                self.shutdown(None);
                return Next::Stop(Err(Error::Runtime(e)));
            }
        };
        self.last_poll = done.number;
        self.polled_ok(&store, &stats, synced, done.took);
        self.metrics().write_failures(unwritten.len());
        if self.opts.once {
            // Everything delivered, reload calls included, or exit 1 (SPEC).
            let mut problems: Vec<String> = (self.sinks.iter_mut())
                .filter_map(|s| s.finish().err())
                .collect();
            self.shutdown(None);
            let validator = self.health().validator.clone();
            if let Some(why) = validator {
                problems.insert(0, format!("--validate: {why}"));
            }
            if !unwritten.is_empty() {
                problems.insert(
                    0,
                    format!(
                        "{} module(s) could not be written: {} (see the warnings above)",
                        unwritten.len(),
                        unwritten.join(", ")
                    ),
                );
            }
            if problems.is_empty() {
                return Next::Stop(Ok(()));
            }
            return Next::Stop(Err(Error::Runtime(problems.join("; "))));
        }
        Next::Poll(store, self.backoff.after_success())
    }

    fn health(&self) -> MutexGuard<'_, Health> {
        self.ops.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn metrics(&self) -> MutexGuard<'_, Metrics> {
        self.ops.metrics.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn polled_ok(
        &mut self,
        store: &Store,
        stats: &PollStats,
        synced: Option<Synced>,
        took: Duration,
    ) {
        let modules = store.snapshot.len();
        let first = {
            let mut h = self.health();
            let first = !h.first_batch;
            h.first_batch = true;
            h.last_success = Some(Instant::now());
            h.last_error = None;
            h.modules = modules;
            first
        };
        {
            let m = self.metrics();
            m.poll_succeeded(took, modules, stats.rejected);
            if let Some(s) = synced {
                m.events(&[
                    ("added", s.added),
                    ("updated", s.updated),
                    ("removed", s.removed),
                    ("rejected", s.rejected),
                ]);
            }
            m.rejected_modules(self.rejected.len());
        }
        let status = format!("STATUS={modules} modules");
        if first {
            self.ops.notifier.send(&format!("READY=1\n{status}"));
        } else {
            self.ops.notifier.send(&status);
        }
    }

    fn polled_err(&mut self, e: &poll::Error, took: Duration) {
        self.metrics().poll_failed(took);
        let modules = {
            let mut h = self.health();
            h.last_error = Some(e.to_string());
            h.modules
        };
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
        for sink in &mut self.sinks {
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
        for sink in &mut self.sinks {
            sink.shutdown(signal);
        }
    }

    /// Turns a successful poll into a batch, applies it to the sinks in order, and makes
    /// the new snapshot current (except for modules a sink could not write, which it
    /// returns).
    fn commit(
        &mut self,
        store: &mut Store,
        next: Snapshot,
        number: u64,
        stats: &PollStats,
        took: Duration,
    ) -> Result<(Option<Synced>, Vec<String>), String> {
        let first = self.batches == 0;
        self.batches += 1;
        // The first batch has every module as added (the output folder reconciles with it),
        // whatever the store was seeded with (a rejected module's last good version).
        let empty = Snapshot::default();
        let base = if first { &empty } else { &store.snapshot };
        let mut events = event::diff(base, &next);
        // Modules no sink published: not written, or held back.
        let mut unwritten: Vec<String> = Vec::new();
        let mut held_back: Vec<String> = Vec::new();
        if let Some(gate) = &mut self.gate {
            let screened = gate.screen(&events, &store.spool, &store.snapshot, &next);
            {
                let m = self.ops.metrics.lock().unwrap_or_else(|p| p.into_inner());
                for r in &screened.runs {
                    m.validation(r);
                }
            }
            if let Some(can_run) = screened.can_run {
                let mut h = self.ops.health.lock().unwrap_or_else(|p| p.into_inner());
                h.validator = can_run;
            }
            for (id, reason) in screened.rejected {
                held_back.push(id.clone());
                hold_back(&mut self.rejected, &mut events, &id, reason);
                // A restart seeded its last good version: that is what the sinks hold,
                // so this run's first batch announces it, before the rejection.
                if first
                    && let Some(good) = store.snapshot.modules.get(&id)
                    && let Some(at) = events.iter().position(|e| e.id == id)
                {
                    events.insert(at, Event::new(Change::Added, &id, good));
                }
            }
        }
        // No change, or only rejections already announced: no sink hears of this poll, and
        // what is held back keeps its previous version.
        if events.is_empty() && !first {
            log::debug!(
                "poll {number}: no changes ({} modules, {took:?})",
                next.len()
            );
            // A module gone from the cluster is no longer held back.
            self.rejected.retain(|id, _| next.modules.contains_key(id));
            store
                .commit(next, &[], &held_back)
                .map_err(|e| e.to_string())?;
            return Ok((None, Vec::new()));
        }
        let mut batch = Batch {
            events,
            synced: Synced::default(),
            spool: &store.spool,
            first,
        };
        for sink in &mut self.sinks {
            let modules = held(&[&unwritten, &held_back], &store.snapshot, &next);
            batch.synced = counts(&batch.events, modules, number);
            let outcome = sink.apply(&batch).map_err(|f| f.0)?;
            // Not written: later sinks do not hear of it, and the snapshot keeps what was
            // there before, so the next poll tries again.
            batch.events.retain(|e| !outcome.failed.contains(&e.id));
            unwritten.extend(outcome.failed);
            for (id, reason) in outcome.rejected {
                held_back.push(id.clone());
                hold_back(&mut self.rejected, &mut batch.events, &id, reason);
            }
            if batch.events.is_empty() && !first {
                break;
            }
        }
        unwritten.sort();
        unwritten.dedup();
        let applied = std::mem::take(&mut batch.events);
        let modules = held(&[&unwritten, &held_back], &store.snapshot, &next);
        let synced = counts(&applied, modules, number);
        // A module whose cluster content was published, or that is gone, is no longer
        // held back (a last good version announced at start is not its cluster content).
        let published = |id: &String| {
            applied.iter().any(|e| {
                &e.id == id
                    && e.is_change()
                    && next.modules.get(id).map(|n| n.hash) == Some(e.entry.hash)
            })
        };
        self.rejected
            .retain(|id, _| next.modules.contains_key(id) && !published(id));
        let line = format!(
            "poll {number}: {} modules, {} added, {} updated, {} removed, {} rejected ({} objects, {} not modules, {took:?})",
            synced.modules,
            synced.added,
            synced.updated,
            synced.removed,
            synced.rejected,
            stats.items,
            stats.rejected,
        );
        if applied.is_empty() && !first {
            log::debug!("{line}");
        } else {
            log::info!("{line}");
        }
        // What the sinks did not take keeps its previous version in the snapshot.
        let kept: Vec<String> = unwritten.iter().chain(&held_back).cloned().collect();
        store
            .commit(next, &applied, &kept)
            .map_err(|e| e.to_string())?;
        Ok((Some(synced), unwritten))
    }
}

/// A sink held `id` back: its event becomes `rejected` (announced and logged once per
/// content), or goes if this content was already announced.
fn hold_back(
    rejected: &mut HashMap<String, Hash>,
    events: &mut Vec<Event>,
    id: &str,
    reason: String,
) {
    let Some(i) = events.iter().position(|e| e.id == id) else {
        return;
    };
    let hash = events[i].entry.hash;
    if rejected.get(id) == Some(&hash) {
        events.remove(i);
        return;
    }
    log::warn!("module {id} rejected: {reason}");
    rejected.insert(id.to_string(), hash);
    events[i].reject(reason);
}

/// How many modules the sinks hold once `next` is applied but for `unwritten` (and held
/// back): a module that could not be added stays absent, one that could not be removed
/// stays.
fn held(unwritten: &[&Vec<String>], current: &Snapshot, next: &Snapshot) -> usize {
    let (mut n, has) = (next.len(), |s: &Snapshot, id: &String| {
        s.modules.contains_key(id)
    });
    for id in unwritten.iter().flat_map(|v| v.iter()) {
        match (has(current, id), has(next, id)) {
            (false, true) => n -= 1,
            (true, false) => n += 1,
            _ => {}
        }
    }
    n
}

fn counts(events: &[event::Event], modules: usize, poll: u64) -> Synced {
    let n = |c: Change| events.iter().filter(|e| e.change == c).count();
    Synced {
        modules,
        added: n(Change::Added),
        updated: n(Change::Updated),
        removed: n(Change::Removed),
        rejected: n(Change::Rejected),
        poll,
    }
}

/// Milliseconds are enough for a log line.
fn round(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
