//! Starting the agent: `Spawner` and `Agent` are the seam between the supervisor's logic
//! and real processes (`Processes`), so that logic is unit-tested with fake agents. A real
//! agent runs in its own process group; as PID 1 its exit is collected by the reaper that
//! also reaps orphans (`ops::process`).

use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use rustix::process::{Pid, kill_process, kill_process_group};

use crate::ops::process::{self, Exit};
use crate::ops::signals::Signal;

/// Starts agents.
pub trait Spawner {
    /// Starts `argv` in its own process group, with a pipe on its stdin if `stdin`.
    fn spawn(&mut self, argv: &[String], stdin: bool) -> io::Result<Box<dyn Agent>>;
}

/// A started agent.
pub trait Agent {
    fn pid(&self) -> i32;
    /// Its stdin, once (with a pipe).
    fn take_stdin(&mut self) -> Option<Box<dyn Write + Send>>;
    /// How it ended, if it has.
    fn try_wait(&mut self) -> Option<Exit>;
    /// Sends `sig` to the agent itself.
    fn signal(&mut self, sig: Signal) -> Result<(), String>;
    /// Sends `sig` to its whole process group.
    fn signal_group(&mut self, sig: Signal) -> Result<(), String>;
}

/// Real processes.
pub struct Processes;

impl Spawner for Processes {
    fn spawn(&mut self, argv: &[String], stdin: bool) -> io::Result<Box<dyn Agent>> {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).process_group(0).stdin(if stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let child = cmd.spawn()?;
        let pid = Pid::from_child(&child);
        process::set_agent_group(Some(pid));
        Ok(Box::new(Process {
            child,
            pid,
            pid1: process::is_pid1(),
        }))
    }
}

struct Process {
    child: Child,
    pid: Pid,
    pid1: bool,
}

impl Agent for Process {
    fn pid(&self) -> i32 {
        self.pid.as_raw_nonzero().get()
    }

    fn take_stdin(&mut self) -> Option<Box<dyn Write + Send>> {
        let stdin = self.child.stdin.take()?;
        Some(Box::new(stdin))
    }

    fn try_wait(&mut self) -> Option<Exit> {
        if self.pid1 {
            return process::reap_as_pid1(self.pid);
        }
        match self.child.try_wait() {
            Ok(Some(st)) => {
                use std::os::unix::process::ExitStatusExt;
                Some(Exit {
                    code: st.code(),
                    signal: st.signal(),
                })
            }
            Ok(None) => None,
            Err(e) => {
                log::warn!("cannot wait for the agent: {e}");
                None
            }
        }
    }

    fn signal(&mut self, sig: Signal) -> Result<(), String> {
        let s = sig
            .to_rustix()
            .ok_or_else(|| format!("{sig} cannot be sent"))?;
        kill_process(self.pid, s).map_err(|e| e.to_string())
    }

    fn signal_group(&mut self, sig: Signal) -> Result<(), String> {
        let s = sig
            .to_rustix()
            .ok_or_else(|| format!("{sig} cannot be sent"))?;
        kill_process_group(self.pid, s).map_err(|e| e.to_string())
    }
}
