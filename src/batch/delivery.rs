//! One successful poll made into a batch and delivered: the events that turn what the
//! sinks hold into the poll's snapshot (every module `added` in a run's first batch), the
//! gate (`--validate`) rejecting what it refuses, the sinks in SPEC's order, and the new
//! snapshot made current except for what was rejected or left unwritten (which keeps its
//! previous version, so the next poll tries again). Never called for a failed poll.
//!
//! The delivery only does the work and writes down what happened (`observe::Record`): the
//! rejected modules have a room of their own (`rejected.rs`), `--confirm`'s state another
//! (`confirm.rs`: it says what must go back, and the delivery puts it back through the
//! same `deliver` loop as any batch). The observers (log, metrics, readiness, Events,
//! `/status`; `observe.rs`) are not the delivery's: whoever commits reads them the record
//! (`Committed`) before the store takes the poll's snapshot.

use std::collections::BTreeSet;
use std::time::Duration;

use super::confirm::{Back, Backs, Confirm, Reverted};
use super::event::{self, Change, Event, Synced};
use super::observe::{Record, SinkTook};
use super::rejected::{self, Rejected};
use super::sink::{Batch, Fatal, Sink};
use crate::fetch::Fetcher;
use crate::hub_report::Refusal;
use crate::poll::PollStats;
use crate::poll::snapshot::{Entry, Snapshot};
use crate::poll::spool::{ObjectRef, Spool};
use crate::poll::store::Store;
use crate::reason::{Rejection, Unwritten};
use crate::validate::Gate;

/// What delivers the batches of one run.
pub struct Delivery {
    /// `--fetch-url-keys`: before the gate.
    fetcher: Option<Fetcher>,
    /// `--validate`: between a batch and the sinks.
    gate: Option<Gate>,
    /// In SPEC's order; the daemon also ticks, finishes and shuts them down.
    pub sinks: Vec<Box<dyn Sink>>,
    /// Batches so far (the first one always reaches the sinks).
    batches: u64,
    /// Modules rejected now.
    rejected: Rejected,
    /// `--confirm`'s state.
    confirm: Confirm,
}

impl Delivery {
    pub fn new(gate: Option<Gate>, sinks: Vec<Box<dyn Sink>>) -> Delivery {
        let confirm = Confirm::new(gate.as_ref().is_some_and(Gate::confirms));
        Delivery {
            fetcher: None,
            gate,
            sinks,
            batches: 0,
            rejected: Rejected::default(),
            confirm,
        }
    }

    /// Fetches `.url` keys of added and updated modules with `fetcher`.
    pub fn fetching(mut self, fetcher: Option<Fetcher>) -> Delivery {
        self.fetcher = fetcher;
        self
    }

    /// The sinks' names, in order (`/status`).
    pub fn sink_names(sinks: &[Box<dyn Sink>]) -> Vec<String> {
        sinks.iter().map(|s| s.name().to_string()).collect()
    }

    /// Turns a successful poll into a batch, applies it to the sinks in order, and makes
    /// the new snapshot current (except for modules rejected or left unwritten, which keep
    /// their previous version). The steps: `fetch` (`.url` keys), `screen` (the events,
    /// through `--validate`), `deliver` (the sinks in SPEC's order), `settle` (what is no
    /// longer rejected, the counts), `confirm` (`--confirm`). What happened (the record)
    /// is returned with the poll's snapshot, which `Committed::into_store` makes current
    /// once the observers read them.
    pub fn commit(
        &mut self,
        store: &mut Store,
        mut next: Snapshot,
        number: u64,
        stats: &PollStats,
        took: Duration,
    ) -> Result<Committed, Fatal> {
        let first = self.batches == 0;
        self.batches += 1;
        let mut record = Record {
            poll: number,
            first,
            objects: stats.items,
            not_modules: stats.invalid,
            poll_took: took,
            ..Record::default()
        };
        let unfetched = self.fetch(store, &mut next, first);
        // The batch's events borrow both snapshots; the store takes `next` once they are
        // gone, with the modules that keep their previous version.
        // The first batch has every module as added (the output folder reconciles with
        // it), whatever the store was seeded with (a rejected module's last good version).
        let empty = Snapshot::default();
        let (kept, goods) = {
            let (current, spool) = (&store.snapshot, &store.spool);
            let base = if first { &empty } else { current };
            let mut going = Going::new(event::diff(base, &next));
            self.screen(&mut going, current, spool, &next, unfetched, &mut record);
            // `--confirm`: what the sinks go back to if the agent refuses a module.
            let goods = self.confirm.goods(&going.events, current, spool);
            // No change, or only rejections already announced: no sink hears of this
            // poll, and what is rejected keeps its previous version.
            if going.events.is_empty() && !first {
                // A module gone from the cluster is no longer rejected.
                self.rejected.forget_gone(&next);
            } else {
                let holds = |kept: &_| sinks_hold(kept, current, &next);
                self.deliver(&mut going, spool, first, &holds, &mut record)?;
                let modules = sinks_hold(&going.kept(), current, &next);
                record.synced = Some(counts(&going.events, modules, number));
                record.accepted = self.rejected.settle(&going.events, &next);
                self.confirm.delivered(&going.events, first);
            }
            let kept: Vec<String> = going.kept().into_iter().collect();
            record.unwritten = going.unwritten;
            (kept, goods)
        };
        // What the agent refused goes back to its last good version (`held`: how many
        // modules the sinks hold now).
        let held = record.synced.map_or(store.snapshot.len(), |s| s.modules);
        let gate = self.gate.as_mut();
        let back = (self.confirm).ask(gate, &store.snapshot, &next, goods, &mut record);
        let reverted = self.put_back(store, &next, back, held, &mut record)?;
        // A sink that could not take a module back holds what was refused. Two sinks that
        // failed: the first one's error.
        record.unwritten = once_each(std::mem::take(&mut record.unwritten));
        record.rejected = self.rejected.all();
        Ok(Committed {
            record,
            next,
            kept,
            first,
            reverted,
        })
    }

    /// `--fetch-url-keys`: the `.url` keys of each module added or updated since what the
    /// sinks hold (every module, in a run's first batch) are fetched, and the module's
    /// contents in `next` replaced by what they fetched (its hash stays: it covers the
    /// URL). The modules whose fetch failed, and why: they are rejected.
    fn fetch(&self, store: &mut Store, next: &mut Snapshot, first: bool) -> Vec<Rejection> {
        let mut failed = Vec::new();
        let Some(fetcher) = &self.fetcher else {
            return failed;
        };
        let Store {
            snapshot: current,
            spool,
            ..
        } = store;
        next.modules.for_each_mut(|id, entry| {
            let old = current.modules.get(id);
            if !first && old.is_some_and(|o| o.hash == entry.hash) {
                return;
            }
            let fetched =
                spool
                    .read(entry.loc)
                    .map_err(|e| e.to_string())
                    .and_then(|(meta, files)| {
                        let Some(files) = fetcher.fetch(&files)? else {
                            return Ok(None);
                        };
                        let object = ObjectRef::new(meta.kind, &meta.uid, &meta.resource_version);
                        spool
                            .put(&object, &files)
                            .map(Some)
                            .map_err(|e| e.to_string())
                    });
            match fetched {
                Ok(Some(loc)) => {
                    // What was spooled before the fetch is nobody's now.
                    if old.is_none_or(|o| o.loc != entry.loc) {
                        spool.release(entry.loc);
                    }
                    entry.loc = loc;
                }
                Ok(None) => {}
                Err(why) => failed.push(Rejection::new(id, why)),
            }
        });
        failed
    }

    /// The batch's events, screened: what could not be fetched (`unfetched`) and what the
    /// gate refuses is rejected.
    fn screen<'a>(
        &mut self,
        going: &mut Going<'a>,
        current: &'a Snapshot,
        spool: &Spool,
        next: &'a Snapshot,
        unfetched: Vec<Rejection>,
        record: &mut Record,
    ) {
        let mut refused = unfetched;
        if let Some(gate) = &mut self.gate {
            let wanted: Vec<(&str, &Entry)> = (going.events.iter())
                .filter(|e| matches!(e.change, Change::Added | Change::Updated))
                .map(|e| (e.id, e.entry))
                .collect();
            let screened = gate.screen(&wanted, spool, current, next);
            record.validations.extend(screened.runs);
            record.runnable = screened.runnable;
            refused.extend(screened.rejected);
        }
        for r in refused {
            let id = r.module.clone();
            going.rejected.push(id.clone());
            self.reject(&mut going.events, spool, r, record);
            if record.first {
                rejected::announce_last_good(&mut going.events, current, &id);
            }
        }
    }

    /// `rejection`'s event becomes `rejected` (the record hears of it), or goes if this
    /// content was announced already.
    fn reject(
        &mut self,
        events: &mut Vec<Event>,
        spool: &Spool,
        r: Rejection,
        record: &mut Record,
    ) {
        if self.rejected.reject(spool, events, r.clone()) {
            record.announced.push(r);
        }
    }

    /// The batch through every sink in order. A module a sink could not write is heard of
    /// by no later sink (and keeps its previous version); one a sink refuses (a `flat`
    /// name clash) reaches the later sinks as `rejected`. `first`: a run's first batch
    /// (every sink hears of it); `holds`: how many modules the sinks hold once the batch
    /// is applied but for the modules given.
    fn deliver<'a>(
        &mut self,
        going: &mut Going<'a>,
        spool: &'a Spool,
        first: bool,
        holds: &dyn Fn(&BTreeSet<String>) -> usize,
        record: &mut Record,
    ) -> Result<(), Fatal> {
        let mut batch = Batch {
            events: std::mem::take(&mut going.events),
            synced: Synced::default(),
            spool,
            first,
        };
        for index in 0..self.sinks.len() {
            batch.synced = counts(&batch.events, holds(&going.kept()), record.poll);
            let outcome = self.sinks[index].apply(&batch)?;
            record.took.push(SinkTook {
                sink: index,
                events: batch.events.len(),
                unwritten: outcome.unwritten.len(),
            });
            // Not written: later sinks do not hear of it, and the snapshot keeps what was
            // there before, so the next poll tries again.
            // (A rejection of it is still announced.)
            let unwritten = |e: &Event| outcome.unwritten.iter().any(|u| u.module == e.id);
            batch.events.retain(|e| !(e.is_change() && unwritten(e)));
            going.unwritten.extend(outcome.unwritten);
            for r in outcome.rejected {
                going.rejected.push(r.module.clone());
                self.reject(&mut batch.events, spool, r, record);
            }
            if batch.events.is_empty() && !first {
                break;
            }
        }
        going.events = batch.events;
        Ok(())
    }

    /// `--confirm`: puts `back` into every sink, through the same `deliver` loop as any
    /// batch (`held`: how many modules the sinks hold now), then asks the agent again
    /// about what went back. A module a sink could not take back stays as the sinks hold
    /// it (the refused version: the store says so, and the record says it is unwritten)
    /// and is owed, tried again after the next poll. What the store must hold for the
    /// others.
    fn put_back(
        &mut self,
        store: &mut Store,
        next: &Snapshot,
        back: Vec<Back>,
        held: usize,
        record: &mut Record,
    ) -> Result<Reverted, Fatal> {
        if back.is_empty() {
            return Ok(Reverted::default());
        }
        let backs = Backs::spool(back, next, &mut store.spool)?;
        let mut going = Going::new(backs.events(&mut self.rejected, record));
        // What the sinks hold but for what this batch takes back.
        let others = held.saturating_sub(backs.gone.len());
        let holds = |kept: &_| others + sinks_hold(kept, &backs.gone, &backs.goods);
        self.deliver(&mut going, &store.spool, false, &holds, record)?;
        let unwritten = going.unwritten_ids();
        for u in &going.unwritten {
            log::warn!(
                "--confirm: {} could not be put back to its last good version: {}; tried again after the next poll",
                u.module,
                u.error
            );
        }
        record.unwritten.extend(going.unwritten);
        if let Some(gate) = &self.gate {
            backs.ask_again(gate, &unwritten, record);
        }
        Ok(backs.settle(&unwritten, &mut self.confirm, &mut store.spool))
    }

    /// The refusals of the gate (`--validate`, `--confirm`) of the version rejected now,
    /// in no order: what a follower reports. (Not the poll's snapshot: a watch's poll
    /// after a rejection has the version the sinks kept, and a version the gate refused
    /// before a newer one was rejected otherwise, or could not be validated, is not the
    /// newest served.)
    pub fn refusals(&self) -> Vec<Refusal> {
        let Some(gate) = &self.gate else {
            return Vec::new();
        };
        (gate.refused())
            .filter(|(id, r)| self.rejected.hash(id) == Some(r.hash))
            .map(|(id, r)| Refusal {
                module: id.to_string(),
                hash: r.hash,
                resource_version: self.rejected.resource_version(id),
                reason: r.reason.clone(),
            })
            .collect()
    }

    /// Modules rejected now (`cmpoll_rejected_modules`).
    #[cfg(test)]
    pub fn rejected_modules(&self) -> usize {
        self.rejected.len()
    }
}

/// A commit done but for the store: what happened (`record`), for the observers to read
/// with the poll's snapshot (`polled`) and what the store holds still, before
/// `into_store` makes the new snapshot current.
#[must_use]
pub struct Committed {
    pub record: Record,
    next: Snapshot,
    /// The modules that keep their previous version.
    kept: Vec<String>,
    first: bool,
    /// `--confirm`: what the sinks went back to.
    reverted: Reverted,
}

impl Committed {
    /// The poll's snapshot (the cluster's content; the spool has its contents until
    /// `into_store`).
    pub fn polled(&self) -> &Snapshot {
        &self.next
    }

    /// Makes the new snapshot current in `store` (but for what keeps its previous
    /// version, and with what the sinks went back to). The record.
    pub fn into_store(self, store: &mut Store) -> Record {
        let mut next = self.next;
        // The store holds what the sinks now hold of what went back.
        self.reverted.into_next(&mut next, store);
        store.commit(next, &self.kept, self.first);
        self.record
    }
}

/// A batch on its way through `commit`: its events (what the sinks take, in the end),
/// and the modules no sink published.
#[derive(Debug, Default)]
struct Going<'a> {
    events: Vec<Event<'a>>,
    /// A sink could not write them, and why: retried next poll.
    unwritten: Vec<Unwritten>,
    /// Rejected (by the gate, or a sink): announced once per content.
    rejected: Vec<String>,
}

impl<'a> Going<'a> {
    fn new(events: Vec<Event<'a>>) -> Going<'a> {
        Going {
            events,
            ..Going::default()
        }
    }

    /// The modules left unwritten, each once.
    fn unwritten_ids(&self) -> BTreeSet<String> {
        self.unwritten.iter().map(|u| u.module.clone()).collect()
    }

    /// The modules that keep their previous version: unwritten or rejected, each once.
    fn kept(&self) -> BTreeSet<String> {
        let mut kept = self.unwritten_ids();
        kept.extend(self.rejected.iter().cloned());
        kept
    }
}

/// How many modules the sinks hold once `next` is applied but for `kept` (unwritten or
/// rejected): a module that could not be added stays absent, one that could not be
/// removed stays.
fn sinks_hold(kept: &BTreeSet<String>, current: &Snapshot, next: &Snapshot) -> usize {
    let (mut n, has) = (next.len(), |s: &Snapshot, id: &String| {
        s.modules.contains_key(id)
    });
    for id in kept {
        match (has(current, id), has(next, id)) {
            (false, true) => n -= 1,
            (true, false) => n += 1,
            _ => {}
        }
    }
    n
}

/// Each module once (the first one's error: the first sink that failed), in order.
fn once_each(unwritten: Vec<Unwritten>) -> Vec<Unwritten> {
    let mut seen = BTreeSet::new();
    let mut once: Vec<Unwritten> = (unwritten.into_iter())
        .filter(|u| seen.insert(u.module.clone()))
        .collect();
    once.sort();
    once
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

#[cfg(test)]
mod tests;
