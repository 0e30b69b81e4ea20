//! What a sink is: what it is handed (`Batch`: the events of one poll, closed by `synced`;
//! `View`: every module, for a sink that needs them all), what it answers (`Outcome`:
//! what it could not write and what it refuses; `Fatal`: its reader is gone for good), and
//! the `Sink` trait the delivery drives, in SPEC's order. The sinks themselves are
//! `crate::sink`, above this layer: they know this file, it knows none of them.

use std::io;
use std::time::Instant;

use super::event::{Event, Synced};
use crate::ops::signals::Signal;
use crate::poll::snapshot::Snapshot;
use crate::poll::spool::Spool;
use crate::reason::{Rejection, Unwritten};
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
}

/// A sink's failure that must stop the daemon (its reader is gone for good).
#[derive(Debug)]
pub struct Fatal(pub String);

/// What a sink could not apply: modules it could not write, and why (`unwritten`: they
/// keep their previous version, are retried next poll, and later sinks do not hear of
/// them), and modules it refuses as they are (`rejected`: a `flat` name clash, module and
/// reason; later sinks hear a `rejected` event instead).
#[derive(Debug, Default)]
pub struct Outcome {
    pub unwritten: Vec<Unwritten>,
    pub rejected: Vec<Rejection>,
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
