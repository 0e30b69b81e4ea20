//! `--on-change CMD`: run `/bin/sh -c CMD` after each batch with changes, once the output
//! directory is written (k8s-sidecar's `SCRIPT`; `nginx -s reload`, a script).
//!
//! The command gets `CMPOLL_ADDED`, `CMPOLL_UPDATED`, `CMPOLL_REMOVED` (counts) and
//! `CMPOLL_OUT_DIR` (absolute) in its environment, no stdin, and cmpoll's stderr for its
//! output (stdout carries events). It runs in its own process group, which is killed after
//! `--reload-timeout`. A non-zero exit, a signal or the timeout is a failed reload
//! (readiness, metrics); it runs again with the next batch with changes. The daemon waits
//! for it: the next sinks hear of the batch after the agent has reloaded.

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Batch, Fatal, Outcome, ReloadReport, Sink};
use crate::ops::process;
use crate::poll::event::Change;

#[derive(Clone, Debug)]
pub struct Options {
    pub command: String,
    /// `--reload-timeout`.
    pub timeout: Duration,
    /// `--out-dir`, made absolute for `CMPOLL_OUT_DIR`.
    pub out_dir: Option<PathBuf>,
}

pub struct OnChange {
    o: Options,
    report: ReloadReport,
    /// The last run's failure, for `--once`.
    last: Result<(), String>,
}

impl OnChange {
    pub fn new(o: Options, report: ReloadReport) -> OnChange {
        OnChange {
            o,
            report,
            last: Ok(()),
        }
    }

    fn run(&self, added: usize, updated: usize, removed: usize) -> Result<(), String> {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(&self.o.command)
            .env("CMPOLL_ADDED", added.to_string())
            .env("CMPOLL_UPDATED", updated.to_string())
            .env("CMPOLL_REMOVED", removed.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::io::stderr()))
            .process_group(0);
        if let Some(dir) = &self.o.out_dir {
            let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
            cmd.env("CMPOLL_OUT_DIR", abs);
        }
        // Hold off PID-1 reaping from spawn to exit status (ops::process).
        let _held = process::children();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start /bin/sh: {e}"))?;
        let deadline = Instant::now() + self.o.timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("exited with {status}")),
                Ok(None) if Instant::now() >= deadline => {
                    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                        let _ =
                            rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                    }
                    let _ = child.wait();
                    return Err(format!(
                        "killed after --reload-timeout {}",
                        humantime::format_duration(self.o.timeout)
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(format!("cannot wait for it: {e}")),
            }
        }
    }
}

impl Sink for OnChange {
    fn apply(&mut self, batch: &Batch) -> Result<Outcome, Fatal> {
        if !batch.has_changes() {
            return Ok(Outcome::default());
        }
        let count = |c: Change| batch.events.iter().filter(|e| e.change == c).count();
        let (added, updated, removed) = (
            count(Change::Added),
            count(Change::Updated),
            count(Change::Removed),
        );
        let result = self.run(added, updated, removed);
        match &result {
            Ok(()) => log::info!("--on-change: ran (poll {})", batch.synced.poll),
            Err(e) => log::warn!("--on-change failed: {e} (poll {})", batch.synced.poll),
        }
        self.report.report("--on-change", result.clone());
        self.last = result;
        Ok(Outcome::default())
    }

    fn finish(&mut self) -> Result<(), String> {
        self.last.clone().map_err(|e| format!("--on-change: {e}"))
    }
}
