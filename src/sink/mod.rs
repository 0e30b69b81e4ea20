//! Sinks: who hears about a batch. Every batch goes through them in SPEC's fixed order
//! (output directory → child stdin → reload signal → reload URL → stdout events), so
//! whoever hears of a batch finds the directory already written.
//!
//! A batch carries events with spool locations, not contents: a sink reads a module's
//! files when it needs them, one module at a time.

pub mod atomic;
pub mod outdir;
pub mod stdout;

use std::io;

use crate::event::{self, Synced};
use crate::module::File;
use crate::snapshot::{Change, Event};
use crate::spool::Spool;

/// The events of one poll, closed by `synced`.
pub struct Batch<'a> {
    pub events: Vec<Event>,
    pub synced: Synced,
    pub spool: &'a Spool,
}

impl Batch<'_> {
    /// A module's files (for `added` and `updated` events).
    pub fn files(&self, e: &Event) -> io::Result<Vec<File>> {
        self.spool.get(e.entry.loc)
    }

    pub fn has_changes(&self) -> bool {
        !self.events.is_empty()
    }

    /// The batch as JSON lines (events then `synced`), each `\n`-terminated, one module's
    /// contents at a time.
    pub fn write_lines(&self, out: &mut dyn io::Write) -> io::Result<()> {
        for e in &self.events {
            let mut line = match e.change {
                Change::Removed => event::removed(&e.id, &e.entry),
                Change::Added | Change::Updated => {
                    event::module(Some(e.change.as_str()), &e.id, &e.entry, &self.files(e)?)
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

/// What a sink could not apply: modules it failed to write (they are retried next poll and
/// later sinks do not hear of them).
#[derive(Debug, Default)]
pub struct Outcome {
    pub failed: Vec<String>,
}

pub trait Sink {
    fn name(&self) -> &'static str;
    fn apply(&mut self, batch: &Batch) -> Result<Outcome, Fatal>;
    /// Called after every poll, with or without a batch (housekeeping).
    fn tick(&mut self) {}
}
