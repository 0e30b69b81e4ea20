//! Sinks: who hears about a batch. Every batch goes through them in SPEC's fixed order
//! (output directory → child stdin → reload signal → `--on-change` → reload URL → stdout
//! events), so whoever hears of a batch finds the directory already written.
//!
//! Each sink implements `batch::Sink` and defines its own `Options`; this file gathers
//! those options and `open` builds the sinks they ask for, in that order. The sinks import
//! nothing from here (`reloads.rs` is the one handle three of them share). A batch carries
//! events with spool locations, not contents: a sink reads a module's files when it needs
//! them, one module at a time.

pub mod child;
pub mod on_change;
pub mod outdir;
pub mod reload_url;
pub mod reloads;
pub mod stdout;

use std::io;

use self::reloads::ReloadResults;
use crate::batch::Sink;
use crate::poll::spool::Shelf;

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

    /// Whether a sink reloads the agent: a reload signal to the supervised agent,
    /// `--on-change`, `--reload-url`.
    pub fn has_reloads(&self) -> bool {
        (self.agent.as_ref()).is_some_and(|a| a.reload_signal.is_some())
            || self.on_change.is_some()
            || self.reload_url.is_some()
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
    pub reloads: ReloadResults,
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
        let out = outdir::OutDir::open(o.clone())?.with_progress(handles.writing.clone());
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
