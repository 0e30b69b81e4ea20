//! `cmpoll run -- AGENT ARGS…`: supervise the agent, the way tini or s6 would.
//!
//! The agent starts after the first batch has gone through every sink (so the output
//! folder is complete when it first reads it), in its own process group, inheriting
//! cmpoll's environment, stdout and stderr. With `--child-stdin events` every (re)started
//! agent first receives the current modules as `added` events and one `synced`, then the
//! live batches. The stdin feed is disk-backed: cmpoll appends to an unlinked file and a
//! writer thread streams it into the pipe, so an agent that stops reading never blocks the
//! loop and costs disk, not memory; one that falls more than `FEED_SLACK` behind its first
//! full state, or whose events cannot be queued, is restarted (and gets the full state
//! again). `--reload-signal` goes after each batch with changes, only to an agent that was
//! running before the batch. Restarts back off from 1 s, doubling to 30 s, reset after a
//! minute of running. On shutdown the signal is forwarded to the agent's process group,
//! then SIGKILL after the grace period. Starting a process is behind `Spawner`, so this
//! logic is unit-tested with fake agents.

mod agent;
mod feed;

use std::io;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

pub use self::agent::{Agent, Processes, Spawner};
pub use self::feed::FEED_SLACK;
use self::feed::Feed;

use crate::backoff::{Backoff, Rng};
use crate::batch::{self, Batch, Control, Fatal, Outcome, Sink, Synced, View, lines};
use crate::ops::process::{self, Exit};
use crate::ops::signals::Signal;
use crate::sink::reloads::ReloadResults;

const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// `--child-stdin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildStdin {
    Events,
    Null,
}

impl crate::words::Words for ChildStdin {
    const WORDS: &'static [(&'static str, Self)] =
        &[("events", ChildStdin::Events), ("null", ChildStdin::Null)];
}

/// `--restart`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    Always,
    OnFailure,
    Never,
}

impl crate::words::Words for Restart {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("always", Restart::Always),
        ("on-failure", Restart::OnFailure),
        ("never", Restart::Never),
    ];
}

#[derive(Clone, Debug)]
pub struct Options {
    pub argv: Vec<String>,
    pub stdin: ChildStdin,
    pub reload_signal: Option<Signal>,
    pub restart: Restart,
    pub grace: Duration,
    /// Where the stdin feed's file goes (the output folder's `.cmpoll`, or `$TMPDIR`).
    pub feed_dir: Option<PathBuf>,
}

struct Running {
    agent: Box<dyn Agent>,
    started: Instant,
    feed: Option<Feed>,
    /// Why cmpoll stopped it, if it did.
    stopping: Stopping,
}

/// Why cmpoll itself stopped a running agent: then it is restarted whatever `--restart`
/// says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stopping {
    No,
    /// It fell behind or missed a batch: restart at once (it gets the full state).
    Recycle,
    /// It could not be given its state: restart after the backoff.
    Retry,
}

pub struct Supervisor {
    opts: Options,
    spawner: Box<dyn Spawner>,
    running: Option<Running>,
    /// The first batch has gone through the sinks: the agent may start.
    ready: bool,
    restart_at: Option<Instant>,
    backoff: Backoff,
    /// Agents started so far (restarts are the ones after the first).
    spawns: u64,
    restarts: Counter,
    reloads: ReloadResults,
}

impl Supervisor {
    pub fn new(
        opts: Options,
        spawner: Box<dyn Spawner>,
        restarts: Counter,
        reloads: ReloadResults,
    ) -> Supervisor {
        Supervisor {
            opts,
            spawner,
            running: None,
            ready: false,
            restart_at: None,
            backoff: Backoff::new(BACKOFF_START, BACKOFF_MAX, 0.0, Rng::new(0)),
            spawns: 0,
            restarts,
            reloads,
        }
    }

    /// Starts the agent and sends it the current state.
    fn spawn(&mut self, view: &View, now: Instant) -> Result<(), String> {
        let argv = &self.opts.argv;
        let stdin = self.opts.stdin == ChildStdin::Events;
        let mut agent = self
            .spawner
            .spawn(argv, stdin)
            .map_err(|e| format!("cannot start the agent '{}': {e}", argv[0]))?;
        log::info!("agent started: {} (pid {})", argv.join(" "), agent.pid());
        let feed = match agent.take_stdin() {
            Some(pipe) => Some(
                Feed::start(pipe, self.opts.feed_dir.as_deref())
                    .map_err(|e| format!("cannot feed the agent's stdin: {e}"))?,
            ),
            None => None,
        };
        let mut running = Running {
            agent,
            started: now,
            feed,
            stopping: Stopping::No,
        };
        let replayed = running
            .feed
            .as_mut()
            .map(|feed| replay(feed, view).map(|size| feed.bound = size + FEED_SLACK));
        if let Some(Err(e)) = replayed {
            // It would run without the state: stop it, reaped and retried later.
            running.stopping = Stopping::Retry;
            let _ = running.agent.signal_group(Signal::KILL);
            self.running = Some(running);
            return Err(format!("cannot send the agent its state: {e}"));
        }
        self.running = Some(running);
        Ok(())
    }

    /// Handles an exit: restart (with backoff) or ask the daemon to stop.
    fn exited(&mut self, exit: Exit, now: Instant) -> Control {
        let Some(running) = self.running.take() else {
            return Control::Continue;
        };
        if let Some(feed) = &running.feed {
            feed.close();
        }
        process::set_agent_group(None);
        let restart = match self.opts.restart {
            Restart::Always => true,
            Restart::OnFailure => !exit.success(),
            Restart::Never => false,
        };
        match running.stopping {
            Stopping::No if !restart => {
                log::info!(
                    "agent {exit}; not restarting it (--restart {})",
                    crate::words::Words::word(self.opts.restart)
                );
                return Control::Exit(exit.shell_code());
            }
            Stopping::Recycle => self.restart_at = Some(now),
            Stopping::Retry => {
                let wait = self.backoff.after_failure(None);
                self.restart_at = Some(crate::backoff::after(now, wait));
            }
            Stopping::No => {
                if now.saturating_duration_since(running.started) >= STABLE_AFTER {
                    self.backoff.reset();
                }
                let wait = self.backoff.after_failure(None);
                log::warn!(
                    "agent {exit}; restarting it in {}",
                    humantime::format_duration(wait)
                );
                self.restart_at = Some(crate::backoff::after(now, wait));
            }
        }
        Control::Continue
    }

    /// Stops the agent on purpose so that it starts again with the full state.
    fn recycle(&mut self, why: &str) {
        let Some(running) = &mut self.running else {
            return;
        };
        log::warn!("{why}; restarting it (it gets the full state again)");
        running.stopping = Stopping::Recycle;
        let _ = running.agent.signal_group(Signal::TERM);
    }

    /// Queues the batch's events on the agent's stdin; why the agent must restart, if so.
    fn queue(&mut self, batch: &Batch) -> Option<String> {
        let feed = self.running.as_ref()?.feed.as_ref()?;
        let mut lines = Vec::new();
        let queued = batch::lines::write(batch, &mut lines, true).and_then(|()| feed.push(&lines));
        // An agent that missed a batch, or is too far behind to catch up, would drift
        // from the cluster for good.
        match queued {
            Err(e) => Some(format!("cannot queue events for the agent ({e})")),
            Ok(()) if feed.lag() > feed.bound => Some(format!(
                "the agent is {} MiB behind on its stdin",
                feed.lag() >> 20
            )),
            Ok(()) => None,
        }
    }

    fn reload_signal(&mut self, sig: Signal) {
        let Some(running) = &mut self.running else {
            return;
        };
        let result = running.agent.signal(sig);
        match &result {
            Ok(()) => log::debug!("sent {sig} to the agent"),
            Err(e) => log::warn!("cannot send {sig} to the agent: {e}"),
        }
        self.reloads.done("signal", result);
    }

    /// `tick` at `now`.
    fn tick_at(&mut self, view: Option<&View>, now: Instant) -> Result<Control, Fatal> {
        if let Some(exit) = self.running.as_mut().and_then(|r| r.agent.try_wait())
            && let Control::Exit(code) = self.exited(exit, now)
        {
            return Ok(Control::Exit(code));
        }
        let due = self.restart_at.is_none_or(|at| now >= at);
        let (Some(view), true, true, None) = (view, self.ready, due, &self.running) else {
            return Ok(Control::Continue);
        };
        let first = self.spawns == 0;
        self.restart_at = None;
        let spawned = self.spawn(view, now);
        if spawned.is_ok() || self.running.is_some() {
            self.spawns += 1;
            if !first {
                self.restarts.inc();
            }
        }
        match spawned {
            Ok(()) => {}
            // A command that cannot start at all is a configuration error.
            Err(e) if first && self.running.is_none() => return Err(Fatal(e)),
            // Started but not fed: it was killed, and `exited` schedules the retry.
            Err(e) if self.running.is_some() => log::warn!("{e}; trying again later"),
            Err(e) => {
                let wait = self.backoff.after_failure(None);
                log::warn!("{e}; trying again in {}", humantime::format_duration(wait));
                self.restart_at = Some(crate::backoff::after(now, wait));
            }
        }
        Ok(Control::Continue)
    }

    fn reap_until(&mut self, deadline: Instant) -> bool {
        while Instant::now() < deadline {
            if let Some(exit) = self.running.as_mut().and_then(|r| r.agent.try_wait()) {
                log::info!("agent {exit}");
                return true;
            }
            thread::sleep(Duration::from_millis(10));
        }
        false
    }
}

/// Writes the full state as `added` events and one `synced`; returns its size in bytes.
fn replay(feed: &Feed, view: &View) -> io::Result<u64> {
    let mut total = 0;
    for (id, entry) in view.snapshot.modules.iter() {
        let (meta, files) = view.spool.read(entry.loc)?;
        let mut line = lines::module(Some("added"), id, (&entry.hash, &meta), Some(&files));
        line.push(b'\n');
        feed.push(&line)?;
        total += line.len() as u64;
    }
    let n = view.snapshot.len();
    let mut line = lines::synced(&Synced {
        modules: n,
        added: n,
        updated: 0,
        removed: 0,
        rejected: 0,
        poll: view.poll,
    });
    line.push(b'\n');
    feed.push(&line)?;
    Ok(total + line.len() as u64)
}

impl Sink for Supervisor {
    fn name(&self) -> &'static str {
        "agent"
    }

    fn apply(&mut self, batch: &Batch) -> Result<Outcome, Fatal> {
        // The agent starts after the first batch (see `tick`); until then nothing to tell.
        self.ready = true;
        if self.running.is_none() {
            return Ok(Outcome::default());
        }
        if let Some(why) = self.queue(batch) {
            self.recycle(&why);
            return Ok(Outcome::default());
        }
        if batch.has_changes()
            && let Some(sig) = self.opts.reload_signal
        {
            self.reload_signal(sig);
        }
        Ok(Outcome::default())
    }

    fn tick(&mut self, view: Option<&View>) -> Result<Control, Fatal> {
        self.tick_at(view, Instant::now())
    }

    fn deadline(&self) -> Option<Instant> {
        let restart = self.restart_at.filter(|_| self.ready);
        // While the agent runs, look at it now and then even without SIGCHLD (as PID 1 a
        // missed signal must not leave zombies).
        let watch = self
            .running
            .as_ref()
            .map(|_| Instant::now() + Duration::from_secs(5));
        match (restart, watch) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn shutdown(&mut self, signal: Option<Signal>) {
        let Some(running) = &mut self.running else {
            return;
        };
        let sig = signal.unwrap_or(Signal::TERM);
        log::info!("stopping the agent: {sig} to its process group");
        if let Err(e) = running.agent.signal_group(sig) {
            log::warn!("cannot send {sig} to the agent: {e}");
        }
        let grace = self.opts.grace;
        if !self.reap_until(crate::backoff::after(Instant::now(), grace)) {
            log::warn!(
                "the agent did not stop within {}; SIGKILL to its process group",
                humantime::format_duration(grace)
            );
            if let Some(r) = &mut self.running {
                let _ = r.agent.signal_group(Signal::KILL);
            }
            while !self.reap_until(Instant::now() + Duration::from_secs(1)) {}
        }
        if let Some(r) = self.running.take()
            && let Some(feed) = &r.feed
        {
            feed.close();
        }
        process::set_agent_group(None);
    }
}

#[cfg(test)]
mod tests;
