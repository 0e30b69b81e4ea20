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
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::batch::Outcome;
    use crate::batch::observe::Observers;
    use crate::ledger::Ledger;
    use crate::ops::health::{Health, InFlight};
    use crate::ops::metrics::Metrics;
    use crate::source::Resource;

    type Heard = Arc<Mutex<Vec<String>>>;

    /// A sink that writes down what it hears (`name: type id, …`), failing to write the
    /// modules in `fail` (those in `fail_back` only in a batch that rejects them: a
    /// `--confirm` put-back) and refusing those in `refuse`.
    struct Recorder {
        name: &'static str,
        heard: Heard,
        fail: Vec<&'static str>,
        fail_back: Vec<&'static str>,
        refuse: Vec<&'static str>,
    }

    impl Sink for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }

        fn apply(&mut self, b: &Batch) -> Result<Outcome, Fatal> {
            let seen: Vec<String> = b
                .events
                .iter()
                .map(|e| format!("{} {}", e.change.as_str(), e.id))
                .collect();
            self.heard.lock().unwrap().push(format!(
                "{}: {} | {} modules",
                self.name,
                seen.join(", "),
                b.synced.modules
            ));
            let has = |id: &&&str| b.events.iter().any(|e| e.id == **id && e.is_change());
            let rejects = |id: &&&str| (b.events.iter()).any(|e| e.id == **id && !e.is_change());
            let back = self.fail_back.iter().filter(|id| rejects(id));
            Ok(Outcome {
                unwritten: (self.fail.iter().chain(back))
                    .filter(has)
                    .map(|s| Unwritten::new(*s, "no room"))
                    .collect(),
                rejected: (self.refuse.iter().filter(has))
                    .map(|s| Rejection::new(*s, format!("{s} clashes")))
                    .collect(),
            })
        }
    }

    fn sink(name: &'static str, heard: &Heard) -> Recorder {
        Recorder {
            name,
            heard: heard.clone(),
            fail: Vec::new(),
            fail_back: Vec::new(),
            refuse: Vec::new(),
        }
    }

    /// A delivery and the observers that read its records, committing as the daemon does.
    struct Run {
        d: Delivery,
        observers: Observers,
    }

    impl std::ops::Deref for Run {
        type Target = Delivery;
        fn deref(&self) -> &Delivery {
            &self.d
        }
    }

    impl std::ops::DerefMut for Run {
        fn deref_mut(&mut self) -> &mut Delivery {
            &mut self.d
        }
    }

    impl Run {
        /// `Delivery::commit`, the observers reading the record, then the store.
        fn commit(
            &mut self,
            store: &mut Store,
            next: Snapshot,
            number: u64,
            stats: &PollStats,
            took: Duration,
        ) -> Result<Record, Fatal> {
            let c = self.d.commit(store, next, number, stats, took)?;
            (self.observers).committed(&c.record, &store.spool, c.polled(), &store.snapshot);
            Ok(c.into_store(store))
        }
    }

    fn delivery(gate: Option<Gate>, sinks: Vec<Recorder>) -> Run {
        let sinks: Vec<Box<dyn Sink>> = sinks.into_iter().map(|s| Box::new(s) as _).collect();
        let d = Duration::from_secs(30);
        let health = Health::new(d, d, d, InFlight::default());
        let metrics = Metrics::new();
        let observers = Observers::new(Arc::new(Mutex::new(health)), Arc::new(Mutex::new(metrics)));
        Run {
            d: Delivery::new(gate, sinks),
            observers,
        }
    }

    /// `d`, recording what its sinks hold in `ledger` (`/status`).
    fn recording(mut d: Run, ledger: &Arc<Mutex<Ledger>>) -> Run {
        let o = &d.observers;
        let observers = Observers::new(o.health.clone(), o.metrics.clone());
        let names = Delivery::sink_names(&d.sinks);
        d.observers = observers.recording(Some(ledger.clone()), names);
        d
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap()
    }

    /// A poll's snapshot: (id, value of key `k`), contents in `store`'s spool.
    fn poll(store: &mut Store, modules: &[(&str, &str)]) -> Snapshot {
        let mut snap = Snapshot::default();
        for (id, v) in modules {
            let entry = crate::poll::testing::entry(&mut store.spool, v);
            snap.modules.insert(id, entry);
        }
        snap
    }

    fn commit(d: &mut Run, store: &mut Store, modules: &[(&str, &str)], n: u64) -> Vec<String> {
        let next = poll(store, modules);
        let stats = PollStats::default();
        (d.commit(store, next, n, &stats, Duration::ZERO)
            .unwrap()
            .unwritten)
            .into_iter()
            .map(|u| u.module)
            .collect()
    }

    /// A `/status` ledger of ConfigMaps (its sinks named by `recording`).
    fn ledger() -> Ledger {
        Ledger::new(
            String::new(),
            String::new(),
            Duration::from_secs(30),
            crate::source::Resources::one(Resource::ConfigMaps),
            Default::default(),
        )
    }

    fn take(heard: &Heard) -> Vec<String> {
        std::mem::take(&mut *heard.lock().unwrap())
    }

    fn held_value(store: &Store, id: &str) -> Option<String> {
        let e = store.snapshot.modules.get(id)?;
        let files = store.spool.get(e.loc).unwrap();
        Some(String::from_utf8(files[0].content.bytes().to_vec()).unwrap())
    }

    /// Sinks hear a batch in SPEC's order; a module one could not write is heard of by no
    /// later sink, keeps its previous version in the snapshot, and goes again next poll.
    #[test]
    fn deliver_in_order_and_a_failed_write_stops_there() {
        let heard = Heard::default();
        let mut first = sink("outdir", &heard);
        first.fail = vec!["ns/b"];
        let mut d = delivery(None, vec![first, sink("stdout", &heard)]);
        let mut store = Store::new(Spool::memory());
        let unwritten = commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/b", "1")], 1);
        assert_eq!(unwritten, ["ns/b"]);
        assert_eq!(
            take(&heard),
            [
                "outdir: added ns/a, added ns/b | 2 modules",
                "stdout: added ns/a | 1 modules"
            ]
        );
        assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
        assert_eq!(held_value(&store, "ns/b"), None, "not written: absent");
        // Fixed by the next poll: tried again, as an addition.
        d.sinks.clear();
        d.sinks.push(Box::new(sink("outdir", &heard)));
        d.sinks.push(Box::new(sink("stdout", &heard)));
        let unwritten = commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/b", "1")], 2);
        assert!(unwritten.is_empty());
        assert_eq!(
            take(&heard),
            [
                "outdir: added ns/b | 2 modules",
                "stdout: added ns/b | 2 modules"
            ]
        );
    }

    /// An update a sink could not write keeps the version the sinks have.
    #[test]
    fn settle_keeps_the_previous_version_of_what_was_not_taken() {
        let heard = Heard::default();
        let mut d = delivery(None, vec![sink("outdir", &heard)]);
        let mut store = Store::new(Spool::memory());
        commit(&mut d, &mut store, &[("ns/a", "1")], 1);
        let mut failing = sink("outdir", &heard);
        failing.fail = vec!["ns/a"];
        d.sinks = vec![Box::new(failing)];
        commit(&mut d, &mut store, &[("ns/a", "2")], 2);
        assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
    }

    /// A sink's refusal (a flat name clash) reaches later sinks as `rejected`, once per
    /// content; a poll that brings nothing new reaches no sink; a new content is news.
    #[test]
    fn a_refusal_is_announced_once_per_content() {
        let heard = Heard::default();
        let mut first = sink("outdir", &heard);
        first.refuse = vec!["ns/c"];
        let mut d = delivery(None, vec![first, sink("stdout", &heard)]);
        let mut store = Store::new(Spool::memory());
        commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/c", "1")], 1);
        assert_eq!(
            take(&heard),
            [
                "outdir: added ns/a, added ns/c | 2 modules",
                "stdout: added ns/a, rejected ns/c | 1 modules"
            ]
        );
        assert_eq!(d.rejected_modules(), 1);
        assert_eq!(held_value(&store, "ns/c"), None);
        // The same content again: the first sink refuses it again (it hears a count that
        // assumes it takes it), unannounced to the later ones.
        commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/c", "1")], 2);
        assert_eq!(take(&heard), ["outdir: added ns/c | 2 modules"]);
        // Another content: announced again.
        commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/c", "2")], 3);
        assert_eq!(
            take(&heard),
            [
                "outdir: added ns/c | 2 modules",
                "stdout: rejected ns/c | 1 modules"
            ]
        );
        // Gone from the cluster: no longer rejected.
        commit(&mut d, &mut store, &[("ns/a", "1")], 4);
        assert_eq!(d.rejected_modules(), 0);
    }

    /// What a commit returns is what happened, for the observers: each sink's take, the
    /// rejections announced now (not those announced before), what was published again,
    /// what a sink could not write, and every module rejected now.
    #[test]
    fn a_commit_records_what_happened() {
        let heard = Heard::default();
        let mut first = sink("outdir", &heard);
        first.refuse = vec!["ns/c"];
        first.fail = vec!["ns/b"];
        let mut d = delivery(None, vec![first, sink("stdout", &heard)]);
        let mut store = Store::new(Spool::memory());
        let stats = PollStats::default();
        let poll_n = |d: &mut Run, store: &mut Store, m: &[(&str, &str)], n| {
            let next = poll(store, m);
            d.commit(store, next, n, &stats, Duration::ZERO).unwrap()
        };
        let modules = [("ns/a", "1"), ("ns/b", "1"), ("ns/c", "1")];
        let r = poll_n(&mut d, &mut store, &modules, 1);
        let took: Vec<_> = (r.took.iter())
            .map(|t| (t.sink, t.events, t.unwritten))
            .collect();
        assert_eq!(
            took,
            [(0, 3, 1), (1, 2, 0)],
            "outdir: 3 events, 1 unwritten; stdout: 2"
        );
        assert_eq!(r.announced, [Rejection::new("ns/c", "ns/c clashes")]);
        assert_eq!(r.unwritten, [Unwritten::new("ns/b", "no room")]);
        assert_eq!(r.rejected, [Rejection::new("ns/c", "ns/c clashes")]);
        assert_eq!(
            r.synced.map(|s| (s.modules, s.added, s.rejected)),
            Some((1, 1, 1))
        );
        assert!(r.accepted.is_empty());
        // The same refusal again: not announced again, still rejected; ns/b written now.
        d.sinks[0] = Box::new(Recorder {
            refuse: vec!["ns/c"],
            ..sink("outdir", &heard)
        });
        let r = poll_n(&mut d, &mut store, &modules, 2);
        assert!(r.announced.is_empty(), "{:?}", r.announced);
        assert_eq!(r.rejected.len(), 1);
        assert!(r.unwritten.is_empty());
        // No longer refused: published again.
        d.sinks[0] = Box::new(sink("outdir", &heard));
        let modules = [("ns/a", "1"), ("ns/b", "1"), ("ns/c", "2")];
        let r = poll_n(&mut d, &mut store, &modules, 3);
        assert_eq!(r.accepted, ["ns/c"]);
        assert!(r.rejected.is_empty());
        // Nothing changed: no sink hears of it, and the record says so.
        let r = poll_n(&mut d, &mut store, &modules, 4);
        assert!(r.synced.is_none() && r.took.is_empty());
    }

    /// The first batch always reaches the sinks, even empty; a later poll without changes
    /// reaches none.
    #[test]
    fn the_first_batch_always_goes_out_and_an_idle_poll_never() {
        let heard = Heard::default();
        let mut d = delivery(None, vec![sink("stdout", &heard)]);
        let mut store = Store::new(Spool::memory());
        commit(&mut d, &mut store, &[], 1);
        assert_eq!(take(&heard), ["stdout:  | 0 modules"]);
        commit(&mut d, &mut store, &[], 2);
        commit(&mut d, &mut store, &[("ns/a", "1")], 3);
        commit(&mut d, &mut store, &[("ns/a", "1")], 4);
        assert_eq!(take(&heard), ["stdout: added ns/a | 1 modules"]);
        // Issue 50.6: what --confirm would ask the agent about is kept only with it (50,000
        // first modules cost 14 MB of it otherwise).
        assert!(d.confirm.is_idle(), "no --confirm, nothing kept to ask");
        commit(&mut d, &mut store, &[], 5);
        assert_eq!(take(&heard), ["stdout: removed ns/a | 0 modules"]);
    }

    /// A gate running `command`, and `confirm` after delivery.
    fn gate(command: &str, confirm: Option<String>) -> Gate {
        Gate::open(crate::validate::Options {
            command: command.into(),
            timeout: Duration::from_secs(10),
            jobs: 1,
            meta_dir: None,
            ext: String::new(),
            template: None,
            kinds: Default::default(),
            confirm,
            out_dir: None,
        })
        .unwrap()
    }

    /// The gate screens before any sink: a refused version never reaches one (a
    /// `rejected` event does), the sinks keep what they had, and readiness hears that the
    /// validator ran.
    #[test]
    fn screen_holds_back_what_the_validator_refuses() {
        let gate = gate("! grep -q bad \"$CMPOLL_MODULE_DIR\"/k", None);
        let heard = Heard::default();
        let mut d = delivery(Some(gate), vec![sink("stdout", &heard)]);
        let mut store = Store::new(Spool::memory());
        commit(&mut d, &mut store, &[("ns/a", "good"), ("ns/b", "good")], 1);
        take(&heard);
        d.observers.health().set_validator(Some("stale".into()));
        commit(
            &mut d,
            &mut store,
            &[("ns/a", "bad"), ("ns/b", "good 2")],
            2,
        );
        assert_eq!(
            take(&heard),
            ["stdout: rejected ns/a, updated ns/b | 2 modules"]
        );
        assert_eq!(held_value(&store, "ns/a").as_deref(), Some("good"));
        assert_eq!(held_value(&store, "ns/b").as_deref(), Some("good 2"));
        assert_eq!(d.observers.health().validator(), None, "it ran");
        commit(
            &mut d,
            &mut store,
            &[("ns/a", "good again"), ("ns/b", "good 2")],
            3,
        );
        assert_eq!(take(&heard), ["stdout: updated ns/a | 2 modules"]);
    }

    /// `--confirm`: the agent is asked after every batch with changes; what it refuses
    /// goes back to its last good version in every sink (an update) or away (a new
    /// module), is announced as `rejected`, stays held back while its content does not
    /// change, and the agent is asked again (so it takes the folder back). An agent that
    /// cannot be asked gets back what it had before the batch (it may be down because of
    /// it), and the batch comes again with the next poll.
    #[test]
    fn what_the_agent_refuses_goes_back_to_its_last_good_version() {
        let dir = tempfile::tempdir().unwrap();
        let asked = dir.path().join("asked");
        let down = dir.path().join("down");
        // Refuses the modules the file `refuse` names; cannot be asked while `down` is.
        let confirm = format!(
            "test -e {down} && exit 3; printf '%s' \"$CMPOLL_MODULES\" | tr '\\n' ' ' >> {asked}; echo >> {asked}; for m in $CMPOLL_MODULES; do grep -qx \"$m\" {dir}/refuse 2>/dev/null && echo \"$m it failed to build\"; done; true",
            down = down.display(),
            asked = asked.display(),
            dir = dir.path().display(),
        );
        let gate = gate("true", Some(confirm));
        let heard = Heard::default();
        let mut d = delivery(
            Some(gate),
            vec![sink("outdir", &heard), sink("stdout", &heard)],
        );
        let ledger = Arc::new(Mutex::new(ledger()));
        d = recording(d, &ledger);
        // What /status says each sink was last given (poll, events), and how asking went.
        let last_given = || {
            (lock(&ledger).sinks.iter())
                .map(|s| s.delivered.map(|(_, poll, changes, _)| (poll, changes)))
                .collect::<Vec<_>>()
        };
        let asking = |d: &Run| {
            (lock(&d.observers.health).reloads().all().into_iter())
                .map(|(path, r, _)| (path, r.is_ok()))
                .collect::<Vec<_>>()
        };
        let mut store = Store::new(Spool::memory());
        let asked_lines = || {
            let s = std::fs::read_to_string(&asked).unwrap_or_default();
            std::fs::remove_file(&asked).ok();
            s.lines().map(str::to_string).collect::<Vec<_>>()
        };
        commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/b", "1")], 1);
        take(&heard);
        assert_eq!(asked_lines(), ["ns/a ns/b "]);
        std::fs::write(dir.path().join("refuse"), "ns/a\nns/c\n").unwrap();
        commit(
            &mut d,
            &mut store,
            &[("ns/a", "2"), ("ns/b", "1"), ("ns/c", "1")],
            2,
        );
        assert_eq!(
            take(&heard),
            [
                "outdir: updated ns/a, added ns/c | 3 modules",
                "stdout: updated ns/a, added ns/c | 3 modules",
                "outdir: removed ns/c, updated ns/a, rejected ns/a, rejected ns/c | 2 modules",
                "stdout: removed ns/c, updated ns/a, rejected ns/a, rejected ns/c | 2 modules",
            ]
        );
        // Asked about the batch, then about what went back (to take the folder again).
        assert_eq!(asked_lines(), ["ns/a ns/c ", "ns/a "]);
        // The sinks were last given the put-back (two events went back, two rejected).
        assert_eq!(last_given(), [Some((2, 4)), Some((2, 4))]);
        assert_eq!(asking(&d), [("--confirm".to_string(), true)]);
        assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
        assert_eq!(held_value(&store, "ns/c"), None);
        assert_eq!(d.rejected_modules(), 2);
        // The refused contents stay held back, unannounced, and nobody is asked.
        commit(
            &mut d,
            &mut store,
            &[("ns/a", "2"), ("ns/b", "1"), ("ns/c", "1")],
            3,
        );
        assert_eq!(take(&heard), Vec::<String>::new());
        assert_eq!(asked_lines(), Vec::<String>::new());
        // An agent that cannot be asked: delivered, then put back.
        std::fs::write(&down, "").unwrap();
        commit(
            &mut d,
            &mut store,
            &[("ns/a", "3"), ("ns/b", "1"), ("ns/c", "1")],
            4,
        );
        assert_eq!(
            take(&heard),
            [
                "outdir: updated ns/a | 2 modules",
                "stdout: updated ns/a | 2 modules",
                "outdir: updated ns/a | 2 modules",
                "stdout: updated ns/a | 2 modules",
            ]
        );
        assert_eq!(asked_lines(), Vec::<String>::new(), "down");
        assert_eq!(asking(&d), [("--confirm".to_string(), false)], "not ready");
        assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
        assert_eq!(d.rejected_modules(), 1, "not rejected: withdrawn");
        // Up again: "3" comes again, is refused, and goes back to "1".
        std::fs::remove_file(&down).unwrap();
        commit(
            &mut d,
            &mut store,
            &[("ns/a", "3"), ("ns/b", "1"), ("ns/c", "1")],
            5,
        );
        assert_eq!(asked_lines(), ["ns/a ", "ns/a "]);
        assert_eq!(
            take(&heard),
            [
                "outdir: updated ns/a | 2 modules",
                "stdout: updated ns/a | 2 modules",
                "outdir: updated ns/a, rejected ns/a | 2 modules",
                "stdout: updated ns/a, rejected ns/a | 2 modules",
            ]
        );
        assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
        // Accepted at last: "4" stays.
        std::fs::write(dir.path().join("refuse"), "").unwrap();
        commit(
            &mut d,
            &mut store,
            &[("ns/a", "4"), ("ns/b", "1"), ("ns/c", "1")],
            6,
        );
        assert_eq!(asked_lines(), ["ns/a "]);
        assert_eq!(held_value(&store, "ns/a").as_deref(), Some("4"));
        assert_eq!(d.rejected_modules(), 1, "ns/c only");
        assert_eq!(asking(&d), [("--confirm".to_string(), true)], "ready again");
    }

    /// A refused module a sink could not take back is what that sink holds: unwritten
    /// (`/readyz`, `/status`), held at the refused version, and put back after the next
    /// poll; later sinks hear only of the rejection until then.
    #[test]
    fn a_put_back_a_sink_cannot_take_is_unwritten_and_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let asked = dir.path().join("asked");
        let confirm = format!(
            "echo \"$CMPOLL_MODULES\" >> {asked}; for m in $CMPOLL_MODULES; do grep -qx \"$m\" {dir}/refuse 2>/dev/null && echo \"$m it failed to build\"; done; true",
            asked = asked.display(),
            dir = dir.path().display(),
        );
        let heard = Heard::default();
        let mut outdir = sink("outdir", &heard);
        outdir.fail_back = vec!["ns/a"];
        let mut d = delivery(
            Some(gate("true", Some(confirm))),
            vec![outdir, sink("stdout", &heard)],
        );
        let ledger = Arc::new(Mutex::new(ledger()));
        d = recording(d, &ledger);
        let mut store = Store::new(Spool::memory());
        let asked_lines = || {
            let s = std::fs::read_to_string(&asked).unwrap_or_default();
            std::fs::remove_file(&asked).ok();
            s.lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/b", "1")], 1);
        take(&heard);
        asked_lines();
        std::fs::write(dir.path().join("refuse"), "ns/a\n").unwrap();
        let unwritten = commit(&mut d, &mut store, &[("ns/a", "2"), ("ns/b", "1")], 2);
        assert_eq!(unwritten, ["ns/a"], "readiness hears of it");
        assert_eq!(
            take(&heard),
            [
                "outdir: updated ns/a | 2 modules",
                "stdout: updated ns/a | 2 modules",
                "outdir: updated ns/a, rejected ns/a | 2 modules",
                "stdout: rejected ns/a | 2 modules",
            ]
        );
        assert_eq!(
            held_value(&store, "ns/a").as_deref(),
            Some("2"),
            "as the sink"
        );
        assert_eq!(
            (lock(&ledger).unwritten.keys()).collect::<Vec<_>>(),
            ["ns/a"],
            "/status"
        );
        assert_eq!(d.rejected_modules(), 1);
        assert_eq!(
            asked_lines(),
            ["ns/a"],
            "not asked again: nothing went back"
        );
        // The next poll (nothing changed in the cluster) puts it back, and asks again.
        let unwritten = commit(&mut d, &mut store, &[("ns/a", "2"), ("ns/b", "1")], 3);
        assert!(unwritten.is_empty(), "{unwritten:?}");
        assert_eq!(
            take(&heard),
            [
                "outdir: updated ns/a | 2 modules",
                "stdout: updated ns/a | 2 modules",
            ]
        );
        assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
        assert!(lock(&ledger).unwritten.is_empty());
        assert_eq!(asked_lines(), ["ns/a"]);
        assert_eq!(d.rejected_modules(), 1, "still rejected");
        // Once back, nothing more goes out.
        commit(&mut d, &mut store, &[("ns/a", "2"), ("ns/b", "1")], 4);
        assert_eq!(take(&heard), Vec::<String>::new());
        assert_eq!(asked_lines(), Vec::<String>::new());
    }

    /// A run's first batch is not put back when the agent cannot be asked (the folder
    /// held most of it before the start; an agent slow to start must not lose it): it is
    /// asked about again after the next poll.
    #[test]
    fn a_first_batch_stays_when_the_agent_cannot_be_asked() {
        let dir = tempfile::tempdir().unwrap();
        let down = dir.path().join("down");
        std::fs::write(&down, "").unwrap();
        let confirm = format!(
            "test -e {down} && exit 3; echo \"$CMPOLL_MODULES\" > {dir}/asked",
            down = down.display(),
            dir = dir.path().display()
        );
        let heard = Heard::default();
        let mut d = delivery(
            Some(gate("true", Some(confirm))),
            vec![sink("outdir", &heard)],
        );
        let mut store = Store::new(Spool::memory());
        commit(&mut d, &mut store, &[("ns/a", "1")], 1);
        assert_eq!(take(&heard), ["outdir: added ns/a | 1 modules"]);
        assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
        std::fs::remove_file(&down).unwrap();
        commit(&mut d, &mut store, &[("ns/a", "1")], 2);
        assert_eq!(take(&heard), Vec::<String>::new());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("asked")).unwrap(),
            "ns/a\n\n"
        );
    }
}
