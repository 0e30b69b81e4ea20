//! `cmpoll run -- AGENT ARGS…`: supervise the agent, the way tini or s6 would.
//!
//! The agent starts after the first batch has gone through every sink (so the output
//! folder is complete when it first reads it), in its own process group, inheriting
//! cmpoll's environment, stdout and stderr. With `--child-stdin events` every (re)started
//! agent first receives the current modules as `added` events and one `synced`, then the
//! live batches. The stdin feed is disk-backed: cmpoll appends to an unlinked file and a
//! writer thread streams it into the pipe, so an agent that stops reading never blocks the
//! loop and costs disk, not memory; one that falls more than `FEED_SLACK` behind its first
//! full state is restarted (and gets the full state again). `--reload-signal` goes after
//! each batch with changes, only to an agent that was running before the batch. Restarts
//! back off from 1 s, doubling to 30 s, reset after a minute of running. On shutdown the
//! signal is forwarded to the agent's process group, then SIGKILL after the grace period.
//! As PID 1, cmpoll also reaps orphaned grandchildren.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, WaitOptions, kill_process, kill_process_group, wait};

use super::{Batch, Control, Fatal, Outcome, Sink, View};
use crate::event::{self, Synced};
use crate::settings::Restart;
use crate::signals::Signal;

/// How far past its first full state an agent may fall behind on stdin before a restart.
pub const FEED_SLACK: u64 = 8 << 20;
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// The running agent's process group, for the signal thread's last-resort SIGKILL.
static AGENT_GROUP: AtomicI32 = AtomicI32::new(0);

/// Kills the agent's process group at once (a second SIGTERM: cmpoll exits immediately).
pub fn kill_agent_now() {
    let pgid = AGENT_GROUP.load(Ordering::Acquire);
    if let Some(pid) = Pid::from_raw(pgid) {
        let _ = kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub argv: Vec<String>,
    pub stdin_events: bool,
    pub reload_signal: Option<Signal>,
    pub restart: Restart,
    pub grace: Duration,
    /// Where the stdin feed's file goes (the output folder's `.cmpoll`, or `$TMPDIR`).
    pub spool_dir: Option<PathBuf>,
}

/// What health and metrics read.
#[derive(Clone, Debug, Default)]
pub struct ChildStatus {
    pub restarts: u64,
    pub running: bool,
    /// The last reload signal: `None` before any, `Some(Err)` if it could not be delivered.
    pub last_signal: Option<Result<(), String>>,
    pub signals_ok: u64,
    pub signals_failed: u64,
}

struct FeedState {
    appended: u64,
    written: u64,
    closed: bool,
    broken: bool,
}

/// Stdin events for one agent: appended to a file, streamed into the pipe by a thread.
struct Feed {
    shared: Arc<(Mutex<FeedState>, Condvar)>,
    file: Arc<File>,
    /// Bytes of the initial full state, plus `FEED_SLACK`: falling further behind restarts.
    bound: u64,
}

impl Feed {
    fn start(stdin: ChildStdin, dir: Option<&std::path::Path>) -> io::Result<Feed> {
        let file = Arc::new(match dir {
            Some(d) => tempfile::tempfile_in(d)?,
            None => tempfile::tempfile()?,
        });
        let shared = Arc::new((
            Mutex::new(FeedState {
                appended: 0,
                written: 0,
                closed: false,
                broken: false,
            }),
            Condvar::new(),
        ));
        let (s, f) = (shared.clone(), file.clone());
        thread::Builder::new()
            .name("agent-stdin".into())
            .spawn(move || feed(stdin, &s, &f))?;
        Ok(Feed {
            shared,
            file,
            bound: FEED_SLACK,
        })
    }

    fn push(&self, bytes: &[u8]) -> io::Result<()> {
        let (lock, cv) = &*self.shared;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        self.file.write_all_at(bytes, st.appended)?;
        st.appended += bytes.len() as u64;
        cv.notify_all();
        Ok(())
    }

    /// Bytes appended but not yet taken by the agent.
    fn lag(&self) -> u64 {
        let st = self.shared.0.lock().unwrap_or_else(|p| p.into_inner());
        st.appended - st.written
    }

    fn close(&self) {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        cv.notify_all();
    }
}

fn feed(mut stdin: ChildStdin, shared: &(Mutex<FeedState>, Condvar), file: &File) {
    let (lock, cv) = shared;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let (from, to) = {
            let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
            while st.written == st.appended && !st.closed {
                st = cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.closed {
                return;
            }
            (st.written, st.appended)
        };
        let n = ((to - from) as usize).min(buf.len());
        let written = file
            .read_exact_at(&mut buf[..n], from)
            .and_then(|()| stdin.write_all(&buf[..n]));
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        if written.is_err() {
            st.broken = true;
            return;
        }
        st.written += n as u64;
        if st.written == st.appended {
            // Caught up: start the file over.
            if file.set_len(0).is_ok() {
                st.written = 0;
                st.appended = 0;
            }
        }
    }
}

struct Running {
    child: Child,
    pid: Pid,
    started: Instant,
    feed: Option<Feed>,
    /// Stopped on purpose (fell behind): restart at once, without backoff.
    recycled: bool,
}

pub struct Supervisor {
    opts: Options,
    running: Option<Running>,
    /// The first batch has gone through the sinks: the agent may start.
    ready: bool,
    restart_at: Option<Instant>,
    backoff: Duration,
    /// Agents started so far (restarts are the ones after the first).
    spawns: u64,
    pid1: bool,
    status: Arc<Mutex<ChildStatus>>,
}

/// An exit status as a shell shows it: the code, or 128 + the signal.
fn exit_code(code: Option<i32>, signal: Option<i32>) -> i32 {
    code.unwrap_or_else(|| 128 + signal.unwrap_or(0))
}

fn describe(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by {}", Signal(s)),
        _ => "ended".into(),
    }
}

impl Supervisor {
    pub fn new(opts: Options) -> Supervisor {
        Supervisor {
            opts,
            running: None,
            ready: false,
            restart_at: None,
            backoff: BACKOFF_START,
            spawns: 0,
            pid1: rustix::process::getpid().as_raw_nonzero().get() == 1,
            status: Arc::new(Mutex::new(ChildStatus::default())),
        }
    }

    pub fn status(&self) -> Arc<Mutex<ChildStatus>> {
        self.status.clone()
    }

    fn set_status(&self, f: impl FnOnce(&mut ChildStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Starts the agent and sends it the current state.
    fn spawn(&mut self, view: &View) -> Result<(), String> {
        let argv = &self.opts.argv;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .process_group(0)
            .stdin(if self.opts.stdin_events {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the agent '{}': {e}", argv[0]))?;
        let pid = Pid::from_child(&child);
        AGENT_GROUP.store(pid.as_raw_nonzero().get(), Ordering::Release);
        let feed = match child.stdin.take() {
            Some(stdin) => Some(
                Feed::start(stdin, self.opts.spool_dir.as_deref())
                    .map_err(|e| format!("cannot feed the agent's stdin: {e}"))?,
            ),
            None => None,
        };
        log::info!(
            "agent started: {} (pid {})",
            argv.join(" "),
            pid.as_raw_nonzero()
        );
        let mut running = Running {
            child,
            pid,
            started: Instant::now(),
            feed,
            recycled: false,
        };
        if let Some(feed) = &mut running.feed {
            let size =
                replay(feed, view).map_err(|e| format!("cannot send the agent its state: {e}"))?;
            feed.bound = size + FEED_SLACK;
        }
        self.running = Some(running);
        self.set_status(|s| s.running = true);
        Ok(())
    }

    /// Collects the agent's exit, if it exited (and, as PID 1, every orphan's).
    fn reap(&mut self) -> Option<(Option<i32>, Option<i32>)> {
        let running = self.running.as_mut()?;
        let exclusive = crate::kube::exec::CHILDREN.try_write();
        if self.pid1 && exclusive.is_err() {
            // An exec credential plugin is running: reaping any child could take its exit
            // status from under it. Only the agent now; orphans at the next tick.
            return match rustix::process::waitpid(Some(running.pid), WaitOptions::NOHANG) {
                Ok(Some((_, status))) => Some((status.exit_status(), status.terminating_signal())),
                _ => None,
            };
        }
        if self.pid1 {
            let mut mine = None;
            // `wait`, not `waitpid(None)`: the latter is waitpid(0), this process group
            // only, and orphans are in others.
            while let Ok(Some((pid, status))) = wait(WaitOptions::NOHANG) {
                if pid == running.pid {
                    mine = Some((status.exit_status(), status.terminating_signal()));
                } else {
                    log::debug!("reaped orphan {}", pid.as_raw_nonzero());
                }
            }
            return mine;
        }
        match running.child.try_wait() {
            Ok(Some(st)) => {
                use std::os::unix::process::ExitStatusExt;
                Some((st.code(), st.signal()))
            }
            Ok(None) => None,
            Err(e) => {
                log::warn!("cannot wait for the agent: {e}");
                None
            }
        }
    }

    fn stop_feed(running: &Running) {
        if let Some(feed) = &running.feed {
            feed.close();
        }
    }

    /// Handles an exit: restart (with backoff) or ask the daemon to stop.
    fn exited(&mut self, code: Option<i32>, signal: Option<i32>) -> Control {
        let Some(running) = self.running.take() else {
            return Control::Continue;
        };
        Self::stop_feed(&running);
        AGENT_GROUP.store(0, Ordering::Release);
        self.set_status(|s| s.running = false);
        let what = describe(code, signal);
        let failed = code != Some(0);
        let restart = match self.opts.restart {
            Restart::Always => true,
            Restart::OnFailure => failed,
            Restart::Never => false,
        };
        if !restart && !running.recycled {
            log::info!(
                "agent {what}; not restarting it (--restart {:?})",
                self.opts.restart
            );
            return Control::Exit(exit_code(code, signal));
        }
        if running.recycled {
            self.restart_at = Some(Instant::now());
        } else {
            if running.started.elapsed() >= STABLE_AFTER {
                self.backoff = BACKOFF_START;
            }
            log::warn!(
                "agent {what}; restarting it in {}",
                humantime::format_duration(self.backoff)
            );
            self.restart_at = Some(Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        }
        Control::Continue
    }

    /// Signals the agent's whole process group.
    fn signal_group(&self, sig: Signal) {
        if let (Some(r), Some(s)) = (&self.running, sig.to_rustix())
            && let Err(e) = kill_process_group(r.pid, s)
        {
            log::warn!("cannot send {sig} to the agent: {e}");
        }
    }
}

/// Writes the full state as `added` events and one `synced`; returns its size in bytes.
fn replay(feed: &Feed, view: &View) -> io::Result<u64> {
    let mut total = 0;
    for (id, entry) in &view.snapshot.modules {
        let files = view.spool.get(entry.loc)?;
        let mut line = event::module(Some("added"), id, entry, &files);
        line.push(b'\n');
        feed.push(&line)?;
        total += line.len() as u64;
    }
    let n = view.snapshot.len();
    let mut line = event::synced(&Synced {
        modules: n,
        added: n,
        updated: 0,
        removed: 0,
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
        let Some(running) = &mut self.running else {
            return Ok(Outcome::default());
        };
        if let Some(feed) = &running.feed {
            let mut lines = Vec::new();
            let queued = batch
                .write_lines(&mut lines)
                .and_then(|()| feed.push(&lines));
            // An agent that missed a batch, or is too far behind to catch up, would drift
            // from the cluster for good: restart it, and it gets the full state again.
            let why = match queued {
                Err(e) => Some(format!("cannot queue events for the agent ({e})")),
                Ok(()) if feed.lag() > feed.bound => Some(format!(
                    "the agent is {} MiB behind on its stdin",
                    feed.lag() >> 20
                )),
                Ok(()) => None,
            };
            if let Some(why) = why {
                log::warn!("{why}; restarting it (it gets the full state again)");
                running.recycled = true;
                if let Some(s) = Signal::TERM.to_rustix() {
                    let _ = kill_process_group(running.pid, s);
                }
                return Ok(Outcome::default());
            }
        }
        if batch.has_changes()
            && let Some(sig) = self.opts.reload_signal
        {
            let result = match sig.to_rustix() {
                Some(s) => kill_process(running.pid, s).map_err(|e| e.to_string()),
                None => Err(format!("{sig} cannot be sent")),
            };
            match &result {
                Ok(()) => log::debug!("sent {sig} to the agent"),
                Err(e) => log::warn!("cannot send {sig} to the agent: {e}"),
            }
            self.set_status(|s| {
                match result {
                    Ok(()) => s.signals_ok += 1,
                    Err(_) => s.signals_failed += 1,
                }
                s.last_signal = Some(result);
            });
        }
        Ok(Outcome::default())
    }

    fn tick(&mut self, view: Option<&View>) -> Result<Control, Fatal> {
        if let Some((code, signal)) = self.reap()
            && let Control::Exit(code) = self.exited(code, signal)
        {
            return Ok(Control::Exit(code));
        }
        let due = self.restart_at.is_none_or(|at| Instant::now() >= at);
        if self.ready
            && self.running.is_none()
            && due
            && let Some(view) = view
        {
            let first = self.spawns == 0;
            self.restart_at = None;
            match self.spawn(view) {
                Ok(()) => {
                    self.spawns += 1;
                    if !first {
                        self.set_status(|s| s.restarts += 1);
                    }
                }
                // A command that cannot start at all is a configuration error.
                Err(e) if first => return Err(Fatal(e)),
                Err(e) => {
                    log::warn!(
                        "{e}; trying again in {}",
                        humantime::format_duration(self.backoff)
                    );
                    self.restart_at = Some(Instant::now() + self.backoff);
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        Ok(Control::Continue)
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
        if self.running.is_none() {
            return;
        }
        let sig = signal.unwrap_or(Signal::TERM);
        log::info!("stopping the agent: {sig} to its process group");
        self.signal_group(sig);
        let deadline = crate::backoff::after(Instant::now(), self.opts.grace);
        while Instant::now() < deadline {
            if let Some((code, sig)) = self.reap() {
                log::info!("agent {}", describe(code, sig));
                if let Some(r) = self.running.take() {
                    Self::stop_feed(&r);
                }
                AGENT_GROUP.store(0, Ordering::Release);
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        log::warn!(
            "the agent did not stop within {}; SIGKILL to its process group",
            humantime::format_duration(self.opts.grace)
        );
        self.signal_group(Signal::KILL);
        while self.running.is_some() && self.reap().is_none() {
            thread::sleep(Duration::from_millis(10));
        }
        if let Some(r) = self.running.take() {
            Self::stop_feed(&r);
        }
        AGENT_GROUP.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_as_a_shell_shows_them() {
        assert_eq!(exit_code(Some(3), None), 3);
        assert_eq!(exit_code(None, Some(15)), 143);
        assert_eq!(describe(None, Some(9)), "was killed by SIGKILL");
        assert_eq!(describe(Some(0), None), "exited with status 0");
    }
}
