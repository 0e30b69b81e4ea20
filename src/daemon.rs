//! `cmpoll run`: the loop. Poll on an interval, diff against the last complete snapshot,
//! hand the batch to the sinks in order, and never act on a failed poll.
//!
//! The main thread waits on one channel for everything that can happen: a signal
//! (forwarded by the signal thread), a finished poll (from the poll thread), a deadline.
//! So a SIGTERM is acted on at once even while a request hangs, and the wait between polls
//! costs nothing. The snapshot and the spool travel to the poll thread with each job and
//! come back with its result: only one side holds them at a time, without locks.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::backoff::{Backoff, Rng};
use crate::error::Error;
use crate::event::Synced;
use crate::health::Health;
use crate::kube;
use crate::metrics::Metrics;
use crate::poll::{PollStats, Poller};
use crate::settings::RunSettings;
use crate::signals::{self, Signal};
use crate::sink::child::ChildStatus;
use crate::sink::reload_url::ReloadStatus;
use crate::sink::{Batch, Control, Sink, View};
use crate::snapshot::{Change, Snapshot};
use crate::spool::Spool;
use crate::systemd::Notifier;

/// What the main loop waits for.
pub enum Msg {
    Signal(Signal),
    Polled(Box<Polled>),
}

/// The snapshot and spool, owned by whoever works on them.
pub struct State {
    pub snapshot: Snapshot,
    pub spool: Spool,
}

/// A finished poll: the state back, and the result.
pub struct Polled {
    pub state: State,
    pub number: u64,
    pub result: Result<(Snapshot, PollStats), kube::Error>,
    pub took: Duration,
    /// The source's running request totals by status code, and response bytes.
    pub requests: BTreeMap<String, u64>,
    pub response_bytes: u64,
}

/// What the daemon reports to and reads from: health, metrics, systemd, and the sinks'
/// own status (agent restarts and signals, reload URL calls).
pub struct Ops {
    pub health: Arc<Mutex<Health>>,
    pub metrics: Arc<Mutex<Metrics>>,
    pub notifier: Notifier,
    pub child: Option<Arc<Mutex<ChildStatus>>>,
    pub reload: Option<Arc<Mutex<ReloadStatus>>>,
}

/// The loop wakes at least this often, so health sees it alive.
const HEARTBEAT: Duration = Duration::from_secs(60);

struct Job {
    state: State,
    number: u64,
}

fn spawn_poller(mut poller: Poller, tx: Sender<Msg>) -> Result<Sender<Job>, Error> {
    let (jobs, rx) = mpsc::channel::<Job>();
    thread::Builder::new()
        .name("poll".into())
        .spawn(move || {
            for mut job in rx {
                let started = Instant::now();
                let result = poller.poll(&job.state.snapshot, &mut job.state.spool);
                let (requests, response_bytes) = poller.counters();
                let done = Polled {
                    state: job.state,
                    number: job.number,
                    result,
                    took: started.elapsed(),
                    requests,
                    response_bytes,
                };
                if tx.send(Msg::Polled(Box::new(done))).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| Error::Runtime(format!("cannot start the poll thread: {e}")))?;
    Ok(jobs)
}

pub struct Daemon {
    run: RunSettings,
    sinks: Vec<Box<dyn Sink>>,
    ops: Ops,
    backoff: Backoff,
    /// Successful polls so far (the first one always emits a batch).
    batches: u64,
    /// The number of the poll the current snapshot came from.
    last_poll: u64,
}

impl Daemon {
    pub fn new(run: RunSettings, sinks: Vec<Box<dyn Sink>>, ops: Ops) -> Daemon {
        let backoff = Backoff::new(run.interval, run.jitter, Rng::from_time());
        Daemon {
            run,
            sinks,
            ops,
            backoff,
            batches: 0,
            last_poll: 0,
        }
    }

    /// Runs until SIGTERM/SIGINT (or, with `--once`, one poll).
    pub fn run(mut self, poller: Poller, spool: Spool) -> Result<(), Error> {
        let (tx, rx) = mpsc::channel();
        let signal_tx = tx.clone();
        signals::forward(
            move |s| {
                let _ = signal_tx.send(Msg::Signal(s));
            },
            crate::sink::child::kill_agent_now,
        )
        .map_err(|e| Error::Runtime(format!("cannot handle signals: {e}")))?;
        log::info!(
            "polling {} every {} (jitter {})",
            poller.describe(),
            humantime::format_duration(self.run.interval),
            self.run.jitter
        );
        let jobs = spawn_poller(poller, tx)?;
        self.event_loop(&rx, &jobs, spool)
    }

    fn event_loop(
        &mut self,
        rx: &Receiver<Msg>,
        jobs: &Sender<Job>,
        spool: Spool,
    ) -> Result<(), Error> {
        let mut state = Some(State {
            snapshot: Snapshot::default(),
            spool,
        });
        let mut next_poll = Instant::now();
        let mut polls = 0u64;
        let mut poll_again = false;
        let mut next_watchdog = Instant::now();
        loop {
            self.health().loop_at = Instant::now();
            if let Some(every) = self.ops.notifier.watchdog_every()
                && Instant::now() >= next_watchdog
            {
                // Only a loop that is really alive pets the watchdog.
                let live = self
                    .health()
                    .liveness(Instant::now(), std::time::SystemTime::now());
                match live {
                    Ok(()) => self.ops.notifier.send("WATCHDOG=1"),
                    Err(why) => log::warn!("not alive, not notifying the watchdog: {why}"),
                }
                next_watchdog = crate::backoff::after(Instant::now(), every);
            }
            if let Some(st) = state.take_if(|_| Instant::now() >= next_poll) {
                polls += 1;
                jobs.send(Job {
                    state: st,
                    number: polls,
                })
                .map_err(|_| Error::Runtime("the poll thread stopped".into()))?;
            }
            // While a poll is out only a message or a sink's deadline moves things on.
            let watchdog = self.ops.notifier.watchdog_every().map(|_| next_watchdog);
            let deadline = self
                .sinks
                .iter()
                .filter_map(|s| s.deadline())
                .chain(state.as_ref().map(|_| next_poll))
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
                    if state.is_some() {
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
                Some(Msg::Polled(done)) => {
                    let done = *done;
                    let mut st = done.state;
                    self.metrics()
                        .apiserver(&done.requests, done.response_bytes);
                    let wait = match done.result {
                        Ok((next, stats)) => {
                            let (synced, unwritten) = self
                                .commit(&mut st, next, done.number, &stats, done.took)
                                .map_err(|e| {
                                    self.shutdown(None);
                                    Error::Runtime(e)
                                })?;
                            self.last_poll = done.number;
                            self.polled_ok(&st, &stats, synced, done.took);
                            self.metrics().write_failures(unwritten.len());
                            if self.run.once {
                                self.shutdown(None);
                                if !unwritten.is_empty() {
                                    return Err(Error::Runtime(format!(
                                        "{} module(s) could not be written: {} (see the warnings above)",
                                        unwritten.len(),
                                        unwritten.join(", ")
                                    )));
                                }
                                return Ok(());
                            }
                            self.backoff.after_success()
                        }
                        Err(e) => {
                            self.polled_err(&e, done.took);
                            if self.run.once {
                                return Err(e.into());
                            }
                            let wait = self.backoff.after_failure(e.retry_after());
                            log::warn!(
                                "poll {} failed: {e}; next attempt in {}",
                                done.number,
                                humantime::format_duration(round(wait))
                            );
                            wait
                        }
                    };
                    state = Some(st);
                    next_poll = if poll_again {
                        poll_again = false;
                        Instant::now()
                    } else {
                        crate::backoff::after(Instant::now(), wait)
                    };
                }
            }
            // Housekeeping after anything: reap an agent, restart it, expire old versions.
            let exit = self.tick(state.as_ref())?;
            self.observe_sinks();
            if let Some(code) = exit {
                self.shutdown(None);
                return if code == 0 {
                    Ok(())
                } else {
                    Err(Error::Exit(code))
                };
            }
        }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.ops.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn metrics(&self) -> std::sync::MutexGuard<'_, Metrics> {
        self.ops.metrics.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn polled_ok(&mut self, st: &State, stats: &PollStats, synced: Option<Synced>, took: Duration) {
        let first = !self.health().first_batch;
        {
            let mut h = self.health();
            h.first_batch = true;
            h.last_success = Some(Instant::now());
            h.last_error = None;
            h.modules = st.snapshot.len();
        }
        {
            let m = self.metrics();
            m.poll_succeeded(took, st.snapshot.len(), stats.rejected);
            if let Some(s) = synced {
                m.events(s.added, s.updated, s.removed);
            }
        }
        let status = format!("STATUS={} modules", st.snapshot.len());
        if first {
            self.ops.notifier.send(&format!("READY=1\n{status}"));
        } else {
            self.ops.notifier.send(&status);
        }
    }

    fn polled_err(&mut self, e: &kube::Error, took: Duration) {
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

    /// Takes the sinks' own totals into metrics and their last reload into health.
    fn observe_sinks(&mut self) {
        let child = self
            .ops
            .child
            .as_ref()
            .map(|c| c.lock().unwrap_or_else(|p| p.into_inner()).clone());
        let reload = self
            .ops
            .reload
            .as_ref()
            .map(|r| r.lock().unwrap_or_else(|p| p.into_inner()).clone());
        let mut last = Vec::new();
        {
            let mut m = self.metrics();
            if let Some(c) = &child {
                m.child_restarts(c.restarts);
                m.reloads("signal", c.signals_ok, c.signals_failed);
                last.extend(c.last_signal.clone());
            }
            if let Some(r) = &reload {
                m.reloads("url", r.successes, r.failures);
                last.extend(r.last.clone());
            }
        }
        // Any failing reload path makes cmpoll unready.
        let combined = match last.iter().find(|r| r.is_err()) {
            Some(err) => Some(err.clone()),
            None => last.first().cloned(),
        };
        self.health().reload = combined;
    }

    /// Ticks every sink; `Some(code)` when one asks cmpoll to exit.
    fn tick(&mut self, state: Option<&State>) -> Result<Option<i32>, Error> {
        let view = state.map(|st| View {
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
    /// the new snapshot current (except for modules a sink could not write).
    fn commit(
        &mut self,
        st: &mut State,
        mut next: Snapshot,
        number: u64,
        stats: &PollStats,
        took: Duration,
    ) -> Result<(Option<Synced>, Vec<String>), String> {
        let first = self.batches == 0;
        self.batches += 1;
        let mut events = st.snapshot.diff(&next);
        if events.is_empty() && !first {
            log::debug!(
                "poll {number}: no changes ({} modules, {took:?})",
                next.len()
            );
            st.snapshot = next;
            return Ok((None, Vec::new()));
        }
        let mut batch = Batch {
            events: Vec::new(),
            synced: Synced::default(),
            spool: &st.spool,
            first,
        };
        let mut dead = Vec::new();
        let mut unwritten: Vec<String> = Vec::new();
        for sink in &mut self.sinks {
            batch.synced = counts(&events, next.len(), number);
            batch.events = std::mem::take(&mut events);
            let outcome = sink.apply(&batch).map_err(|f| f.0)?;
            events = std::mem::take(&mut batch.events);
            unwritten.extend(outcome.failed.iter().cloned());
            for id in &outcome.failed {
                // Not written: later sinks do not hear of it and the snapshot keeps what
                // was there before, so the next poll tries again.
                events.retain(|e| &e.id != id);
                let unwritten = match st.snapshot.modules.get(id) {
                    Some(old) => next.modules.insert(id.clone(), old.clone()),
                    None => next.modules.remove(id),
                };
                if let Some(e) = unwritten
                    && st
                        .snapshot
                        .modules
                        .get(id)
                        .is_none_or(|old| old.loc != e.loc)
                {
                    dead.push(e.loc);
                }
            }
            if events.is_empty() && !first {
                break;
            }
        }
        for loc in dead {
            st.spool.release(loc);
        }
        let synced = counts(&events, next.len(), number);
        log::info!(
            "poll {number}: {} modules, {} added, {} updated, {} removed ({} configmaps, {} rejected, {took:?})",
            synced.modules,
            synced.added,
            synced.updated,
            synced.removed,
            stats.items,
            stats.rejected,
        );
        for e in &events {
            if matches!(e.change, Change::Updated | Change::Removed)
                && let Some(old) = st.snapshot.modules.get(&e.id)
            {
                st.spool.release(old.loc);
            }
        }
        st.snapshot = next;
        if st.spool.wants_compaction() {
            let State { snapshot, spool } = st;
            if let Err(e) = spool.compact(snapshot.modules.values_mut().map(|e| &mut e.loc)) {
                return Err(format!("cannot compact the spool: {e}"));
            }
        }
        unwritten.sort();
        unwritten.dedup();
        Ok((Some(synced), unwritten))
    }
}

fn counts(events: &[crate::snapshot::Event], modules: usize, poll: u64) -> Synced {
    let n = |c: Change| events.iter().filter(|e| e.change == c).count();
    Synced {
        modules,
        added: n(Change::Added),
        updated: n(Change::Updated),
        removed: n(Change::Removed),
        poll,
    }
}

/// Milliseconds are enough for a log line.
fn round(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
