//! One successful poll made into a batch and delivered: the events that turn what the
//! sinks hold into the poll's snapshot (every module `added` in a run's first batch), the
//! gate (`--validate`) holding back what it rejects, the sinks in SPEC's order, and the
//! new snapshot made current except for what a sink did not take (which keeps its previous
//! version, so the next poll tries again). A rejection is announced once per content, not
//! once per poll. Never called for a failed poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::gate::Gate;
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;
use crate::poll::PollStats;
use crate::poll::event::{self, Change, Event, Synced};
use crate::poll::hash::Hash;
use crate::poll::snapshot::Snapshot;
use crate::poll::store::Store;
use crate::sink::{Batch, Sink};

/// What delivers the batches of one run.
pub struct Delivery {
    /// `--validate`: between a batch and the sinks.
    gate: Option<Gate>,
    /// In SPEC's order; the daemon also ticks, finishes and shuts them down.
    pub sinks: Vec<Box<dyn Sink>>,
    /// Batches so far (the first one always reaches the sinks).
    batches: u64,
    /// Modules held back (`rejected`), by the hash held back.
    rejected: HashMap<String, Hash>,
    health: Arc<Mutex<Health>>,
    metrics: Arc<Mutex<Metrics>>,
}

impl Delivery {
    pub fn new(
        gate: Option<Gate>,
        sinks: Vec<Box<dyn Sink>>,
        health: Arc<Mutex<Health>>,
        metrics: Arc<Mutex<Metrics>>,
    ) -> Delivery {
        Delivery {
            gate,
            sinks,
            batches: 0,
            rejected: HashMap::new(),
            health,
            metrics,
        }
    }

    /// Modules held back now (`cmpoll_rejected_modules`).
    pub fn rejected_modules(&self) -> usize {
        self.rejected.len()
    }

    /// Turns a successful poll into a batch, applies it to the sinks in order, and makes
    /// the new snapshot current (except for modules a sink could not write, which it
    /// returns).
    pub fn commit(
        &mut self,
        store: &mut Store,
        next: Snapshot,
        number: u64,
        stats: &PollStats,
        took: Duration,
    ) -> Result<(Option<Synced>, Vec<String>), String> {
        let first = self.batches == 0;
        self.batches += 1;
        // The first batch has every module as added (the output folder reconciles with it),
        // whatever the store was seeded with (a rejected module's last good version).
        let empty = Snapshot::default();
        let base = if first { &empty } else { &store.snapshot };
        let mut events = event::diff(base, &next);
        // Modules no sink published: not written, or held back.
        let mut unwritten: Vec<String> = Vec::new();
        let mut held_back: Vec<String> = Vec::new();
        if let Some(gate) = &mut self.gate {
            let screened = gate.screen(&events, &store.spool, &store.snapshot, &next);
            {
                let m = self.metrics.lock().unwrap_or_else(|p| p.into_inner());
                for r in &screened.runs {
                    m.validation(r);
                }
            }
            if let Some(can_run) = screened.can_run {
                let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
                h.validator = can_run;
            }
            for (id, reason) in screened.rejected {
                held_back.push(id.clone());
                hold_back(&mut self.rejected, &mut events, &id, reason);
                // A restart seeded its last good version: that is what the sinks hold,
                // so this run's first batch announces it, before the rejection.
                if first
                    && let Some(good) = store.snapshot.modules.get(&id)
                    && let Some(at) = events.iter().position(|e| e.id == id)
                {
                    events.insert(at, Event::new(Change::Added, &id, good));
                }
            }
        }
        // No change, or only rejections already announced: no sink hears of this poll, and
        // what is held back keeps its previous version.
        if events.is_empty() && !first {
            log::debug!(
                "poll {number}: no changes ({} modules, {took:?})",
                next.len()
            );
            // A module gone from the cluster is no longer held back.
            self.rejected.retain(|id, _| next.modules.contains_key(id));
            store
                .commit(next, &[], &held_back)
                .map_err(|e| e.to_string())?;
            return Ok((None, Vec::new()));
        }
        let mut batch = Batch {
            events,
            synced: Synced::default(),
            spool: &store.spool,
            first,
        };
        for sink in &mut self.sinks {
            let modules = held(&[&unwritten, &held_back], &store.snapshot, &next);
            batch.synced = counts(&batch.events, modules, number);
            let outcome = sink.apply(&batch).map_err(|f| f.0)?;
            // Not written: later sinks do not hear of it, and the snapshot keeps what was
            // there before, so the next poll tries again.
            batch.events.retain(|e| !outcome.failed.contains(&e.id));
            unwritten.extend(outcome.failed);
            for (id, reason) in outcome.rejected {
                held_back.push(id.clone());
                hold_back(&mut self.rejected, &mut batch.events, &id, reason);
            }
            if batch.events.is_empty() && !first {
                break;
            }
        }
        unwritten.sort();
        unwritten.dedup();
        let applied = std::mem::take(&mut batch.events);
        let modules = held(&[&unwritten, &held_back], &store.snapshot, &next);
        let synced = counts(&applied, modules, number);
        // A module whose cluster content was published, or that is gone, is no longer
        // held back (a last good version announced at start is not its cluster content).
        let published = |id: &String| {
            applied.iter().any(|e| {
                &e.id == id
                    && e.is_change()
                    && next.modules.get(id).map(|n| n.hash) == Some(e.entry.hash)
            })
        };
        self.rejected
            .retain(|id, _| next.modules.contains_key(id) && !published(id));
        let line = format!(
            "poll {number}: {} modules, {} added, {} updated, {} removed, {} rejected ({} objects, {} not modules, {took:?})",
            synced.modules,
            synced.added,
            synced.updated,
            synced.removed,
            synced.rejected,
            stats.items,
            stats.rejected,
        );
        if applied.is_empty() && !first {
            log::debug!("{line}");
        } else {
            log::info!("{line}");
        }
        // What the sinks did not take keeps its previous version in the snapshot.
        let kept: Vec<String> = unwritten.iter().chain(&held_back).cloned().collect();
        store
            .commit(next, &applied, &kept)
            .map_err(|e| e.to_string())?;
        Ok((Some(synced), unwritten))
    }
}

/// A sink held `id` back: its event becomes `rejected` (announced and logged once per
/// content), or goes if this content was already announced.
fn hold_back(
    rejected: &mut HashMap<String, Hash>,
    events: &mut Vec<Event>,
    id: &str,
    reason: String,
) {
    let Some(i) = events.iter().position(|e| e.id == id) else {
        return;
    };
    let hash = events[i].entry.hash;
    if rejected.get(id) == Some(&hash) {
        events.remove(i);
        return;
    }
    log::warn!("module {id} rejected: {reason}");
    rejected.insert(id.to_string(), hash);
    events[i].reject(reason);
}

/// How many modules the sinks hold once `next` is applied but for `unwritten` (and held
/// back): a module that could not be added stays absent, one that could not be removed
/// stays.
fn held(unwritten: &[&Vec<String>], current: &Snapshot, next: &Snapshot) -> usize {
    let (mut n, has) = (next.len(), |s: &Snapshot, id: &String| {
        s.modules.contains_key(id)
    });
    for id in unwritten.iter().flat_map(|v| v.iter()) {
        match (has(current, id), has(next, id)) {
            (false, true) => n -= 1,
            (true, false) => n += 1,
            _ => {}
        }
    }
    n
}

fn counts(events: &[event::Event], modules: usize, poll: u64) -> Synced {
    let n = |c: Change| events.iter().filter(|e| e.change == c).count();
    Synced {
        modules,
        added: n(Change::Added),
        updated: n(Change::Updated),
        removed: n(Change::Removed),
        rejected: n(Change::Rejected),
        poll,
    }
}
