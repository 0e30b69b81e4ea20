//! What a running daemon holds, and why: the last poll, each sink's last delivery and
//! reload, every module of the last complete poll with its state (`delivered`, `rejected`
//! with the reason, `unwritten` with the error). The loop and the batch write it; `/status`
//! renders it as `status::answer::StatusReport`, the JSON shape `cmpoll status` reads back (from
//! a daemon, or made from an output folder's own record).
//!
//! It guarantees that a Secret's validator output never appears: a Secret's rejection is
//! recorded with `reason::redacted` already applied. It holds per module only what the
//! snapshot holds (56 bytes and the id), replaced at each poll.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::ops::health::ReloadOutcomes;
use crate::poll::hash::Hash;
use crate::poll::snapshot::{Modules, Rv};
use crate::source::Resources;

/// What `/status` reads, shared by the loop, the batch and the server.
#[derive(Debug)]
pub struct Ledger {
    pub source: String,
    pub selector: String,
    pub interval: Duration,
    /// What is listed: the kind of a module whose id does not name one.
    pub resources: Resources,
    pub last_poll: Option<PollRecord>,
    pub last_success: Option<SystemTime>,
    pub sinks: Vec<SinkRecord>,
    /// The last complete poll's modules (the cluster's content), `None` before one.
    pub modules: Option<Modules>,
    /// Rejected: the reason (a Secret's: its exit status only).
    pub rejected: BTreeMap<String, String>,
    /// A sink could not write them in the last batch: the hash and resourceVersion
    /// attempted (for a removal, the ones removed), and the error.
    pub unwritten: BTreeMap<String, (Option<(Hash, Rv)>, String)>,
    /// Every reload path's last outcome (readiness reads the same).
    pub reloads: ReloadOutcomes,
}

/// The last poll: its number, when it ended, how long it took, and why it failed.
#[derive(Clone, Debug)]
pub struct PollRecord {
    pub number: u64,
    pub at: SystemTime,
    pub took: Duration,
    pub error: Option<String>,
}

/// A sink (by `Sink::name`) and its last delivery: when, the poll, the events in the
/// batch, and how many of them it left unwritten.
#[derive(Clone, Debug)]
pub struct SinkRecord {
    pub name: String,
    pub delivered: Option<(SystemTime, u64, usize, usize)>,
}

impl Ledger {
    pub fn new(
        source: String,
        selector: String,
        interval: Duration,
        resources: Resources,
        reloads: ReloadOutcomes,
    ) -> Ledger {
        Ledger {
            source,
            selector,
            interval,
            resources,
            last_poll: None,
            last_success: None,
            sinks: Vec::new(),
            modules: None,
            rejected: BTreeMap::new(),
            unwritten: BTreeMap::new(),
            reloads,
        }
    }

    /// The sinks, in order, by the names `Sink::name` gives.
    pub fn sinks(&mut self, names: Vec<String>) {
        self.sinks = (names.into_iter())
            .map(|name| SinkRecord {
                name,
                delivered: None,
            })
            .collect();
    }

    /// A poll ended: with an error, or with a snapshot (`modules`).
    pub fn polled(&mut self, number: u64, took: Duration, outcome: Result<(), String>) {
        let at = SystemTime::now();
        if outcome.is_ok() {
            self.last_success = Some(at);
        }
        self.last_poll = Some(PollRecord {
            number,
            at,
            took,
            error: outcome.err(),
        });
    }

    /// Sink `index` took the batch of poll `poll`: `changes` events, `unwritten` of them
    /// not written.
    pub fn delivered(&mut self, index: usize, poll: u64, changes: usize, unwritten: usize) {
        if let Some(s) = self.sinks.get_mut(index) {
            s.delivered = Some((SystemTime::now(), poll, changes, unwritten));
        }
    }

    /// The modules of a complete poll, what is rejected and why, and what a sink could
    /// not write (empty when no batch went out: nothing is waiting to be written then).
    pub fn modules(
        &mut self,
        modules: Modules,
        rejected: BTreeMap<String, String>,
        unwritten: BTreeMap<String, (Option<(Hash, Rv)>, String)>,
    ) {
        self.modules = Some(modules);
        self.rejected = (rejected.into_iter())
            .map(|(id, why)| {
                let why = match self.kind_of(&id) {
                    "Secret" => crate::reason::redacted(&why),
                    _ => why,
                };
                (id, why)
            })
            .collect();
        self.unwritten = unwritten;
    }

    /// `ConfigMap` or `Secret`: from the id when one cmpoll lists both kinds.
    pub fn kind_of(&self, id: &str) -> &'static str {
        self.resources.kind_of(id).kind()
    }
}
