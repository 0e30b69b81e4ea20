//! Sinks: who hears about a batch. Every batch goes through them in SPEC's fixed order
//! (output directory → child stdin → reload signal → `--on-change` → reload URL → stdout
//! events), so
//! whoever hears of a batch finds the directory already written.
//!
//! Each sink defines its own `Options`; `open` builds the sinks those options ask for, in
//! that order. A batch carries events with spool locations, not contents: a sink reads a
//! module's files when it needs them, one module at a time.

pub mod atomic;
pub mod child;
pub mod on_change;
pub mod outdir;
pub mod reload_url;
pub mod stdout;

use std::io;
use std::time::Instant;

use crate::ops::health::ReloadOutcomes;
use crate::ops::metrics::Reloads;
use crate::ops::signals::Signal;
use crate::poll::event::{self, Change, Event, Synced};
use crate::poll::snapshot::Snapshot;
use crate::poll::spool::{Shelf, Spool};
use crate::source::ModuleFile;

/// The events of one poll, closed by `synced`.
pub struct Batch<'a> {
    pub events: Vec<Event<'a>>,
    pub synced: Synced,
    pub spool: &'a Spool,
    /// The first batch since cmpoll started (always sent, even without changes).
    pub first: bool,
}

impl Batch<'_> {
    /// A module's files (for `added` and `updated` events).
    pub fn files(&self, e: &Event) -> io::Result<Vec<ModuleFile>> {
        self.spool.get(e.entry.loc)
    }

    /// Whether anything was added, updated or removed (a batch of only `rejected` events
    /// calls for no reload).
    pub fn has_changes(&self) -> bool {
        self.events.iter().any(Event::is_change)
    }

    /// The added, updated and removed events, without the rejected ones.
    pub fn changes(&'_ self) -> impl Iterator<Item = &'_ Event<'_>> {
        self.events.iter().filter(|e| e.is_change())
    }

    /// The batch as JSON lines (events then `synced`), each `\n`-terminated, one module's
    /// contents at a time; without `secrets`, a Secret's events carry its hash only
    /// (stdout ends up in logs; an agent's stdin does not).
    pub fn write_lines(&self, out: &mut dyn io::Write, secrets: bool) -> io::Result<()> {
        for e in &self.events {
            let hash = &e.entry.hash;
            let mut line = match e.change {
                Change::Removed => {
                    let meta = self.spool.meta(e.entry.loc)?;
                    event::removed(e.id, hash, meta.kind)
                }
                Change::Rejected => {
                    let meta = self.spool.meta(e.entry.loc)?;
                    let reason = e.reason.as_deref().unwrap_or("");
                    // A Secret's validator output may quote it: stdout ends up in logs.
                    if secrets || meta.kind.shows_contents() {
                        event::rejected(e.id, (hash, &meta), reason)
                    } else {
                        let reason = crate::secret::redact_reason(reason);
                        event::rejected(e.id, (hash, &meta), &reason)
                    }
                }
                Change::Added | Change::Updated => {
                    let event = Some(e.change.as_str());
                    let meta = self.spool.meta(e.entry.loc)?;
                    if secrets || meta.kind.shows_contents() {
                        let files = self.spool.get(e.entry.loc)?;
                        event::module(event, e.id, (hash, &meta), Some(&files))
                    } else {
                        event::module(event, e.id, (hash, &meta), None)
                    }
                }
            };
            line.push(b'\n');
            out.write_all(&line)?;
        }
        let mut line = event::synced(&self.synced);
        line.push(b'\n');
        out.write_all(&line)
    }
}

/// A sink's failure that must stop the daemon (its reader is gone for good).
#[derive(Debug)]
pub struct Fatal(pub String);

/// What a sink could not apply: modules it failed to write, and why (they are retried next
/// poll and later sinks do not hear of them), and modules it refuses as they are (a `flat` name
/// clash: module and reason; later sinks hear a `rejected` event instead).
#[derive(Debug, Default)]
pub struct Outcome {
    pub failed: Vec<(String, String)>,
    pub rejected: Vec<(String, String)>,
}

/// The current modules, for a sink that needs all of them (a restarted child).
pub struct View<'a> {
    pub snapshot: &'a Snapshot,
    pub spool: &'a Spool,
    /// The poll that produced the snapshot.
    pub poll: u64,
}

/// What a sink asks of the daemon after a tick.
#[derive(Debug, PartialEq, Eq)]
pub enum Control {
    Continue,
    /// Stop cmpoll with this exit code (the agent ended and is not to be restarted).
    Exit(i32),
}

pub trait Sink {
    /// What `cmpoll status` calls it: `out-dir`, `agent`, `on-change`, `reload-url`, `stdout`.
    fn name(&self) -> &'static str;
    /// Applies a batch, in SPEC's sink order.
    fn apply(&mut self, batch: &Batch) -> Result<Outcome, Fatal>;
    /// Housekeeping: after every poll, on SIGCHLD, and at `deadline`. `view` is the current
    /// state, or `None` while a poll is out (a sink that needs it waits for the next tick).
    fn tick(&mut self, _view: Option<&View>) -> Result<Control, Fatal> {
        Ok(Control::Continue)
    }
    /// When this sink next needs a tick, if ever.
    fn deadline(&self) -> Option<Instant> {
        None
    }
    /// cmpoll is stopping because of `signal` (or `None`: its own decision).
    fn shutdown(&mut self, _signal: Option<Signal>) {}
    /// `--once`: wait for what this sink delivers in the background; what was not.
    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// Where a reload path reports each outcome: readiness and the reload counter.
#[derive(Clone, Debug, Default)]
pub struct ReloadReport {
    pub outcomes: ReloadOutcomes,
    pub counter: Reloads,
}

impl ReloadReport {
    pub fn report(&self, path: &str, outcome: Result<(), String>) {
        self.counter.record(outcome.is_ok());
        self.outcomes.report(path, outcome);
    }
}

/// Every sink's options: what `cmpoll run` delivers to.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub out_dir: Option<outdir::Options>,
    pub agent: Option<child::Options>,
    pub on_change: Option<on_change::Options>,
    pub reload_url: Option<reload_url::Options>,
    /// JSON lines on stdout (`--stdout-events`, or no other sink).
    pub stdout: bool,
    /// Whether stdout events carry contents for some modules (a ConfigMap's: a Secret's
    /// never, stdout ends up in logs).
    pub stdout_contents: bool,
}

impl Options {
    /// Whether a sink reads every module's contents in a run's first batch: stdout events
    /// with contents, or an agent fed its state on stdin.
    pub fn reads_every_module_at_start(&self) -> bool {
        (self.stdout && self.stdout_contents)
            || (self.agent.as_ref()).is_some_and(|a| a.stdin == child::ChildStdin::Events)
    }

    /// For the start-up line: every sink, in order.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(o) = &self.out_dir {
            let layout = crate::words::Words::word(o.layout);
            parts.push(format!("--out-dir {} ({layout} layout)", o.dir.display()));
        }
        if let Some(a) = &self.agent {
            parts.push(format!("agent '{}'", a.argv.join(" ")));
        }
        if self.on_change.is_some() {
            parts.push("--on-change".to_string());
        }
        if let Some(r) = &self.reload_url {
            let urls: Vec<String> = r.urls.iter().map(|u| crate::http::url::redact(u)).collect();
            parts.push(format!("--reload-url {}", urls.join(", ")));
        }
        if self.stdout {
            parts.push("stdout events".to_string());
        }
        parts.join(", ")
    }
}

/// The shared handles sinks count and report into.
#[derive(Clone, Debug, Default)]
pub struct Handles {
    pub reloads: ReloadReport,
    pub child_restarts: prometheus_client::metrics::counter::Counter,
    /// How far the output folder is into a batch (readiness says it).
    pub writing: crate::ops::health::Writing,
}

/// What `open` made: the sinks, and the output folder's shelf.
pub type Opened = (Vec<Box<dyn Sink>>, Option<Box<dyn Shelf>>);

/// Builds the sinks `opts` ask for, in SPEC's order, and the output folder's shelf (see
/// `poll::spool`); problems are start-up errors.
pub fn open(
    opts: &Options,
    handles: &Handles,
    env: &dyn Fn(&str) -> Option<String>,
    trust_record: bool,
) -> Result<Opened, String> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    let mut shelf = None;
    if let Some(o) = &opts.out_dir {
        let out = outdir::OutDir::open(o.clone())?.reporting(handles.writing.clone());
        // Where every module is read back in the first batch anyway, the first poll reads
        // them back too, keeping the cluster's copy of any the folder lost.
        let proofs = trust_record.then(|| out.proofs());
        shelf = outdir::shelf(o, proofs);
        sinks.push(Box::new(out));
    }
    if let Some(o) = &opts.agent {
        sinks.push(Box::new(child::Supervisor::new(
            o.clone(),
            Box::new(child::Processes),
            handles.child_restarts.clone(),
            handles.reloads.clone(),
        )));
    }
    if let Some(o) = &opts.on_change {
        sinks.push(Box::new(on_change::OnChange::new(
            o.clone(),
            handles.reloads.clone(),
        )));
    }
    if let Some(o) = &opts.reload_url {
        sinks.push(Box::new(reload_url::ReloadUrl::new(
            o,
            handles.reloads.clone(),
            env,
        )?));
    }
    if opts.stdout {
        sinks.push(Box::new(stdout::StdoutSink::new(io::stdout())));
    }
    Ok((sinks, shelf))
}
