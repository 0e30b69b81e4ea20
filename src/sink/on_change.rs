//! `--on-change CMD`: run `/bin/sh -c CMD` after each batch with changes, once the output
//! directory is written (k8s-sidecar's `SCRIPT`; `nginx -s reload`, a script).
//!
//! The command gets `CMPOLL_ADDED`, `CMPOLL_UPDATED`, `CMPOLL_REMOVED` (counts) and
//! `CMPOLL_OUT_DIR` (absolute) in its environment, no stdin, and cmpoll's stderr for its
//! output (stdout carries events). It runs in its own process group, which is killed after
//! `--reload-timeout`. A non-zero exit, a signal or the timeout is a failed reload
//! (readiness, metrics); it runs again with the next batch with changes. The daemon waits
//! for it: the next sinks hear of the batch after the agent has reloaded.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::batch::event::Change;
use crate::batch::{Batch, Fatal, Outcome, Sink};
use crate::ops::process;
use crate::sink::reloads::ReloadResults;

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
    results: ReloadResults,
    /// The last run's failure, for `--once`.
    last: Result<(), String>,
}

impl OnChange {
    pub fn new(o: Options, results: ReloadResults) -> OnChange {
        OnChange {
            o,
            results,
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
            .stdout(Stdio::from(std::io::stderr()));
        if let Some(dir) = &self.o.out_dir {
            let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
            cmd.env("CMPOLL_OUT_DIR", abs);
        }
        let done = process::run_bounded(cmd, self.o.timeout, process::Capture::Inherit)
            .map_err(|e| format!("/bin/sh: {e}"))?;
        match done.exit {
            Some(exit) if exit.success() => Ok(()),
            Some(exit) => Err(exit.to_string()),
            None => Err(format!(
                "killed after --reload-timeout {}",
                humantime::format_duration(self.o.timeout)
            )),
        }
    }
}

impl Sink for OnChange {
    fn name(&self) -> &'static str {
        "on-change"
    }

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
        self.results.done("--on-change", result.clone());
        self.last = result;
        Ok(Outcome::default())
    }

    fn finish(&mut self) -> Result<(), String> {
        self.last.clone().map_err(|e| format!("--on-change: {e}"))
    }
}
