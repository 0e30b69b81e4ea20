//! Processes cmpoll starts: the agent's process group, the PID-1 reaping rule, and the
//! last-resort kill.
//!
//! As PID 1 (a container's init), cmpoll must reap orphaned grandchildren, but reaping
//! "any child" would take an exec credential plugin's exit status from under the code
//! waiting for it. So a plugin run holds `children()` shared from spawn to exit status, and
//! the agent's supervisor reaps any child only while it can hold it exclusively.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

use rustix::process::{Pid, WaitOptions, kill_process_group, wait, waitpid};

use super::signals::Signal;

static CHILDREN: RwLock<()> = RwLock::new(());

/// The running agent's process group, for the signal thread's last-resort SIGKILL.
static AGENT_GROUP: AtomicI32 = AtomicI32::new(0);

/// Held by whoever waits for a particular child (an exec plugin) until it has its status.
pub fn children() -> RwLockReadGuard<'static, ()> {
    CHILDREN.read().unwrap_or_else(|p| p.into_inner())
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
