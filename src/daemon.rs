//! `cmpoll run`: the loop. Poll on an interval, diff against the last complete snapshot,
//! hand the batch to the sinks in order, and never act on a failed poll.
//!
//! The main thread waits on one channel for everything that can happen: a signal
//! (forwarded by the signal thread), a finished poll (from the poll thread), a deadline.
//! So a SIGTERM is acted on at once even while a request hangs, and the wait between polls
//! costs nothing. The snapshot and the spool travel to the poll thread with each job and
//! come back with its result: only one side holds them at a time, without locks.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use crate::backoff::{Backoff, Rng};
use crate::error::Error;
use crate::event::Synced;
use crate::kube;
use crate::poll::{PollStats, Poller};
use crate::settings::RunSettings;
use crate::signals::{self, Signal};
use crate::sink::{Batch, Control, Sink, View};
use crate::snapshot::{Change, Snapshot};
use crate::spool::Spool;

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
}

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
                let done = Polled {
                    state: job.state,
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

pub struct Daemon {
    run: RunSettings,
    sinks: Vec<Box<dyn Sink>>,
    backoff: Backoff,
    /// Successful polls so far (the first one always emits a batch).
    batches: u64,
    /// The number of the poll the current snapshot came from.
    last_poll: u64,
}

impl Daemon {
    pub fn new(run: RunSettings, sinks: Vec<Box<dyn Sink>>) -> Daemon {
        let backoff = Backoff::new(run.interval, run.jitter, Rng::from_time());
        Daemon {
            run,
            sinks,
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
        loop {
            if let Some(st) = state.take_if(|_| Instant::now() >= next_poll) {
                polls += 1;
                jobs.send(Job {
                    state: st,
                    number: polls,
                })
                .map_err(|_| Error::Runtime("the poll thread stopped".into()))?;
            }
            // While a poll is out only a message or a sink's deadline moves things on.
            let deadline = self
                .sinks
                .iter()
                .filter_map(|s| s.deadline())
                .chain(state.as_ref().map(|_| next_poll))
                .min();
            let wait = deadline.map_or(Duration::from_secs(3600), |d| {
                d.saturating_duration_since(Instant::now())
            });
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
                    let wait = match done.result {
                        Ok((next, stats)) => {
                            self.commit(&mut st, next, done.number, &stats, done.took)
                                .map_err(|e| {
                                    self.shutdown(None);
                                    Error::Runtime(e)
                                })?;
                            self.last_poll = done.number;
                            if self.run.once {
                                self.shutdown(None);
                                return Ok(());
                            }
                            self.backoff.after_success()
                        }
                        Err(e) => {
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
                        Instant::now() + wait
                    };
                }
            }
            // Housekeeping after anything: reap an agent, restart it, expire old versions.
            if let Some(code) = self.tick(state.as_ref())? {
                self.shutdown(None);
                return if code == 0 {
                    Ok(())
                } else {
                    Err(Error::Exit(code))
                };
            }
        }
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
    ) -> Result<(), String> {
        let first = self.batches == 0;
        self.batches += 1;
        let mut events = st.snapshot.diff(&next);
        if events.is_empty() && !first {
            log::debug!(
                "poll {number}: no changes ({} modules, {took:?})",
                next.len()
            );
            st.snapshot = next;
            return Ok(());
        }
        let mut batch = Batch {
            events: Vec::new(),
            synced: Synced::default(),
            spool: &st.spool,
            first,
        };
        let mut dead = Vec::new();
        for sink in &mut self.sinks {
            batch.synced = counts(&events, next.len(), number);
            batch.events = std::mem::take(&mut events);
            let outcome = sink.apply(&batch).map_err(|f| f.0)?;
            events = std::mem::take(&mut batch.events);
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
        Ok(())
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
