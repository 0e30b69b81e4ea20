//! Processes cmpoll starts: the agent's process group, the PID-1 reaping rule, the
//! last-resort kill, and short commands run to completion within a deadline (`--on-change`,
//! `--validate`).
//!
//! As PID 1 (a container's init), cmpoll must reap orphaned grandchildren, but reaping
//! "any child" would take an exec credential plugin's exit status from under the code
//! waiting for it. So a plugin run holds `children()` shared from spawn to exit status, and
//! the agent's supervisor reaps any child only while it can hold it exclusively.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

use rustix::process::{
    Pid, WaitId, WaitIdOptions, WaitOptions, kill_process_group, wait, waitid, waitpid,
};

use super::signals::Signal;
use crate::locks::Recover;

static CHILDREN: RwLock<()> = RwLock::new(());

/// The running agent's process group, for the signal thread's last-resort SIGKILL.
static AGENT_GROUP: AtomicI32 = AtomicI32::new(0);

/// Held by whoever waits for a particular child (an exec plugin) until it has its status.
pub fn children() -> RwLockReadGuard<'static, ()> {
    CHILDREN.read().recover()
}

/// Finds a program as execvp(3) would: a command with a `/` is taken as given, one without
/// is looked up on `path` (`PATH`). Why not, in words for an error message.
pub fn find_program(command: &str, path: Option<&str>) -> Result<std::path::PathBuf, String> {
    if command.contains('/') {
        let p = std::path::PathBuf::from(command);
        return if !p.exists() {
            Err("not found".into())
        } else if !is_executable(&p) {
            Err("not an executable file".into())
        } else {
            Ok(p)
        };
    }
    path.unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| std::path::Path::new(d).join(command))
        .find(|p| is_executable(p))
        .ok_or_else(|| "not found on PATH".into())
}

/// A regular file with an execute bit.
pub fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether this process is PID 1.
pub fn is_pid1() -> bool {
    rustix::process::getpid().as_raw_nonzero().get() == 1
}

/// How a child ended: its exit code, or the signal that killed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl Exit {
    /// The status as a shell shows it: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        self.code.unwrap_or_else(|| 128 + self.signal.unwrap_or(0))
    }

    pub fn success(self) -> bool {
        self.code == Some(0)
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exited with status {c}"),
            (None, Some(s)) => write!(f, "was killed by {}", Signal(s)),
            _ => f.write_str("ended"),
        }
    }
}

/// How a bounded command ended.
#[derive(Debug)]
pub struct Finished {
    /// `None`: killed (with its process group) at the deadline.
    pub exit: Option<Exit>,
    /// What `Capture` kept: stdout and stderr together, or stdout alone, at most the bytes
    /// asked for (the rest is read and dropped, so the command never blocks on a full pipe).
    pub output: Vec<u8>,
    /// Whether the output ended (a process that left the group may hold the pipe open:
    /// it is not waited for long).
    pub complete: bool,
}

/// Where each line of a command's stderr goes (`Capture::Split`).
pub type Lines = Box<dyn FnMut(&[u8]) + Send>;

/// What becomes of a bounded command's stdout and stderr.
pub enum Capture {
    /// As `cmd` says (inherited unless set).
    Inherit,
    /// Both through one pipe, the first N bytes kept (a validator, whose output is its
    /// message).
    Merged(usize),
    /// Stdout kept (the first N bytes), stderr handed over line by line (an exec plugin,
    /// whose stdout is a credential and whose stderr is for the log).
    Split(usize, Lines),
}

/// Why a bounded command did not run to an end.
#[derive(Debug)]
pub enum RunError {
    /// It could not be started (`NotFound`: no such program).
    Start(std::io::Error),
    /// Something failed around it (a pipe, waiting for it).
    Other(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Start(e) => write!(f, "cannot start it: {e}"),
            RunError::Other(e) => f.write_str(e),
        }
    }
}

/// Runs `cmd` in its own process group, stdin from /dev/null, and waits for it at most
/// `timeout`, then kills the group; once it has exited, what it left running in its group
/// is killed too. `capture` says what becomes of its output. The one runner of commands
/// that must end: `--on-change`, `--validate`, exec credential plugins.
pub fn run_bounded(
    mut cmd: std::process::Command,
    timeout: std::time::Duration,
    capture: Capture,
) -> Result<Finished, RunError> {
    use std::io::{BufRead as _, Read as _};
    use std::os::unix::process::CommandExt as _;
    use std::time::{Duration, Instant};

    let pipe = || std::io::pipe().map_err(|e| RunError::Other(format!("cannot make a pipe: {e}")));
    cmd.stdin(std::process::Stdio::null()).process_group(0);
    let (keep, out, err) = match capture {
        Capture::Inherit => (0, None, None),
        Capture::Merged(keep) => {
            let (r, w) = pipe()?;
            let w2 = w
                .try_clone()
                .map_err(|e| RunError::Other(format!("cannot make a pipe: {e}")))?;
            cmd.stdout(w).stderr(w2);
            (keep, Some(r), None)
        }
        Capture::Split(keep, line) => {
            let (r, w) = pipe()?;
            let (er, ew) = pipe()?;
            cmd.stdout(w).stderr(ew);
            (keep, Some(r), Some((er, line)))
        }
    };
    // Hold off PID-1 reaping from spawn to exit status.
    let _held = children();
    let spawned = cmd.spawn();
    // The write ends live in `cmd`: dropped now, so the readers see EOF when the command
    // (and whatever it started) is done.
    drop(cmd);
    let mut child = spawned.map_err(RunError::Start)?;
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut r) = out {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut buf = [0u8; 8192];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let room = keep.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
            let _ = tx.send(out);
        });
    } else {
        drop(tx);
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    if let Some((er, mut line)) = err {
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(er).split(b'\n') {
                let Ok(l) = l else { break };
                line(&l);
            }
            drop(done_tx);
        });
    } else {
        drop(done_tx);
    }
    let deadline = Instant::now() + timeout;
    let pid = Pid::from_raw(child.id() as i32).ok_or(RunError::Other("no process id".into()))?;
    let status = |s: std::process::ExitStatus| {
        use std::os::unix::process::ExitStatusExt as _;
        Exit {
            code: s.code(),
            signal: s.signal(),
        }
    };
    let exit = loop {
        // Seen ended but not reaped: the zombie keeps its PID, so its process group id
        // cannot have gone to anyone else when what it left running there is killed.
        let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        match waitid(WaitId::Pid(pid), opts) {
            Ok(Some(_)) => {
                let _ = kill_process_group(pid, rustix::process::Signal::KILL);
                let s = child
                    .wait()
                    .map_err(|e| RunError::Other(format!("cannot wait for it: {e}")))?;
                break Some(status(s));
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = kill_process_group(pid, rustix::process::Signal::KILL);
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(RunError::Other(format!("cannot wait for it: {e}"))),
        }
    };
    // A process that left the group may still hold a pipe: not waited for long.
    let got = rx.recv_timeout(Duration::from_secs(1));
    let _ = done_rx.recv_timeout(Duration::from_secs(1));
    let complete = !matches!(got, Err(std::sync::mpsc::RecvTimeoutError::Timeout));
    Ok(Finished {
        exit,
        output: got.unwrap_or_default(),
        complete,
    })
}

/// As PID 1: reaps every child that ended and returns `pid`'s exit if it was among them.
/// While an exec plugin runs, only `pid` is waited for (orphans wait for the next call).
pub fn reap_as_pid1(pid: Pid) -> Option<Exit> {
    let exit = |status: rustix::process::WaitStatus| Exit {
        code: status.exit_status(),
        signal: status.terminating_signal(),
    };
    let Ok(_exclusive) = CHILDREN.try_write() else {
        return match waitpid(Some(pid), WaitOptions::NOHANG) {
            Ok(Some((_, status))) => Some(exit(status)),
            _ => None,
        };
    };
    let mut mine = None;
    // `wait`, not `waitpid(None)`: the latter is waitpid(0), this process group only, and
    // orphans are in others.
    while let Ok(Some((reaped, status))) = wait(WaitOptions::NOHANG) {
        if reaped == pid {
            mine = Some(exit(status));
        } else {
            log::debug!("reaped orphan {}", reaped.as_raw_nonzero());
        }
    }
    mine
}

/// Records the agent's process group (`None`: no agent runs).
pub fn set_agent_group(pid: Option<Pid>) {
    AGENT_GROUP.store(
        pid.map_or(0, |p| p.as_raw_nonzero().get()),
        Ordering::Release,
    );
}

/// Kills the agent's process group at once (a second SIGTERM: cmpoll exits immediately).
pub fn kill_agent_now() {
    if let Some(pid) = Pid::from_raw(AGENT_GROUP.load(Ordering::Acquire)) {
        let _ = kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> std::process::Command {
        let mut c = std::process::Command::new("/bin/sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn bounded_runs_keep_output_and_kill_the_group_at_the_deadline() {
        let t = std::time::Duration::from_secs(10);
        let f = run_bounded(
            sh("echo out; echo err >&2; exit 3"),
            t,
            Capture::Merged(4096),
        )
        .unwrap();
        assert_eq!(f.exit.unwrap().code, Some(3));
        assert_eq!(String::from_utf8(f.output).unwrap(), "out\nerr\n");
        let f = run_bounded(sh("yes | head -c 100000"), t, Capture::Merged(10)).unwrap();
        assert_eq!(
            f.output, b"y\ny\ny\ny\ny\n",
            "the first bytes, the rest drained"
        );
        let start = std::time::Instant::now();
        let short = std::time::Duration::from_millis(200);
        let f = run_bounded(
            sh("sleep 30 & sleep 30; echo never"),
            short,
            Capture::Merged(64),
        )
        .unwrap();
        assert!(f.exit.is_none(), "killed");
        assert!(f.output.is_empty());
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "children killed too"
        );
    }

    /// Issue 25: stdout kept, stderr line by line (an exec plugin's shape); what it left
    /// behind in its group is killed when it exits; a missing program is `Start`.
    #[test]
    fn split_output_and_what_a_command_leaves_behind() {
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = lines.clone();
        let capture = Capture::Split(
            64,
            Box::new(move |l: &[u8]| seen.lock().unwrap().push(String::from_utf8_lossy(l).into())),
        );
        let t = std::time::Duration::from_secs(10);
        let start = std::time::Instant::now();
        let f = run_bounded(
            sh("echo cred; echo a >&2; echo b >&2; sleep 30 &"),
            t,
            capture,
        )
        .unwrap();
        assert_eq!(f.exit.unwrap().code, Some(0));
        assert_eq!(f.output, b"cred\n");
        assert!(
            f.complete,
            "the leftover sleep was killed, the pipes closed"
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(*lines.lock().unwrap(), ["a", "b"]);
        let missing = std::process::Command::new("/no/such/program");
        match run_bounded(missing, t, Capture::Inherit) {
            Err(RunError::Start(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exits_as_a_shell_shows_them() {
        let code = Exit {
            code: Some(3),
            signal: None,
        };
        let killed = Exit {
            code: None,
            signal: Some(9),
        };
        assert_eq!((code.shell_code(), killed.shell_code()), (3, 137));
        assert_eq!(killed.to_string(), "was killed by SIGKILL");
        assert_eq!(code.to_string(), "exited with status 3");
    }
}
