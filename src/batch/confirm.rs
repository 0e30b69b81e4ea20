//! `--confirm`'s state, a unit of its own: the modules delivered and not yet confirmed by
//! the agent (`unconfirmed`), whether a batch reached the sinks since it was last asked
//! (`due`), and the put-backs a sink could not take (`owed`). After the sinks took a batch,
//! `Confirm::ask` asks the agent whether it took what it was given and returns what must
//! go back (`Back`): it calls no sink. The delivery spools that (`Backs::spool`), runs its
//! events (`Backs::events`) through the same `deliver` loop as any batch, asks the agent
//! again about what went back (`Backs::ask_again`), and hands back what a sink could not
//! take (`Backs::settle`: owed, tried again after the next poll; the record says it is
//! unwritten, `/readyz` and `cmpoll status`).

use std::collections::{BTreeSet, HashMap};

use super::event::{Change, Event};
use super::observe::Record;
use super::rejected::Rejected;
use super::sink::Fatal;
use crate::poll::hash::Hash;
use crate::poll::snapshot::{Entry, Snapshot};
use crate::poll::spool::{ObjectRef, Spool};
use crate::poll::store::Store;
use crate::reason::Rejection;
use crate::source::Resource;
use crate::validate::{Gate, Good, Unasked};

/// `--confirm`'s state across polls.
#[derive(Default)]
pub struct Confirm {
    /// The gate confirms (`--confirm` given): without it nothing is kept (50,000 first
    /// modules kept here cost 14 MB for nothing).
    on: bool,
    /// Delivered modules the agent could not be asked about yet (asked again after every
    /// poll until it answers), each with the hash delivered.
    unconfirmed: HashMap<String, Unconfirmed>,
    /// A batch with changes reached the sinks and the agent has not been asked since (it
    /// is also how the agent hears of a batch).
    due: bool,
    /// Put-backs a sink could not take, made again after every poll.
    owed: HashMap<String, Owed>,
}

/// A module delivered, not yet confirmed by the agent.
struct Unconfirmed {
    hash: Hash,
    /// What the sinks held before it (read before they replaced it).
    good: Option<Good>,
    /// Put back if the agent cannot be asked (not in a run's first batch).
    withdrawable: bool,
}

/// A put-back a sink could not take: the hash refused, which the sinks may still hold,
/// and what they go back to (none: away).
struct Owed {
    refused: Hash,
    good: Option<Good>,
}

/// One module going back: to `good`, or away; refused for `why` (none: withdrawn, or a
/// put-back owed since an earlier poll); the agent asked again once it went back.
pub struct Back {
    id: String,
    good: Option<Good>,
    why: Option<String>,
    ask_again: bool,
}

impl Confirm {
    /// `on`: the gate confirms.
    pub fn new(on: bool) -> Confirm {
        Confirm {
            on,
            ..Confirm::default()
        }
    }

    /// Nothing delivered is waiting to be asked about.
    #[cfg(test)]
    pub fn is_idle(&self) -> bool {
        self.unconfirmed.is_empty()
    }

    /// The version the sinks hold now of each module `events` add or update, read before
    /// the sinks replace it (a shelved one is read from the folder).
    pub fn goods(&self, events: &[Event], current: &Snapshot, spool: &Spool) -> Goods {
        let mut goods = HashMap::new();
        if !self.on {
            return goods;
        }
        for e in events {
            if e.change != Change::Updated && e.change != Change::Added {
                continue;
            }
            let Some(old) = current.modules.get(e.id) else {
                continue;
            };
            match spool.read(old.loc) {
                Ok((meta, files)) => {
                    let good = Good {
                        uid: meta.uid,
                        resource_version: meta.resource_version,
                        files,
                    };
                    goods.insert(e.id.to_string(), good);
                }
                Err(err) => log::warn!(
                    "--confirm: cannot read the last good version of {} back: {err}",
                    e.id
                ),
            }
        }
        goods
    }

    /// A batch reached the sinks; its additions and updates are to be asked about.
    pub fn delivered(&mut self, events: &[Event], first: bool) {
        self.due |= events.iter().any(Event::is_change);
        if !self.on {
            return;
        }
        for e in events {
            if matches!(e.change, Change::Added | Change::Updated) {
                let pending = Unconfirmed {
                    hash: e.entry.hash,
                    good: None,
                    withdrawable: !first,
                };
                self.unconfirmed.insert(e.id.to_string(), pending);
            }
        }
    }

    /// Asks the agent (through `gate`) about the modules delivered and not yet confirmed
    /// (`goods`: what the sinks held before this poll's batch; `current`, what the store
    /// holds; `next`, the poll's snapshot). What must go back, which it does not put back:
    /// each module it refused is rejected (remembered by the gate as a validator's
    /// refusal is) and goes back to its last good version (the one the sinks held before
    /// it, else what the gate remembers), or away if it had none, and the agent is asked
    /// once more about those, so that it takes the folder as it now is. An agent that
    /// cannot be asked (down, or unable to start: perhaps because of what the batch
    /// brought) gets back what it had before the batch, which comes again with the next
    /// poll; a run's first batch stays (the folder had most of it before), asked about
    /// again. Until the agent is asked again, `/readyz` fails as after a failed reload.
    /// The put-backs owed are made again as long as the cluster holds what was refused.
    /// `record` hears what the agent said.
    pub fn ask(
        &mut self,
        gate: Option<&mut Gate>,
        current: &Snapshot,
        next: &Snapshot,
        goods: Goods,
        record: &mut Record,
    ) -> Vec<Back> {
        // Delivered now: asked about, with what the sinks held before.
        for (id, good) in goods {
            if let Some(u) = self.unconfirmed.get_mut(&id) {
                u.good = Some(good);
            }
        }
        // Gone, or changed since (the new version is asked about when delivered).
        // (A rejected module's last good version, delivered again, is what the store
        // keeps: `current`.)
        self.unconfirmed.retain(|id, u| {
            let holds = |s: &Snapshot| s.modules.get(id).is_some_and(|e| e.hash == u.hash);
            holds(next) || holds(current)
        });
        let mut back = self.owed_back(next);
        let Some(gate) = gate.filter(|g| g.confirms()) else {
            return back;
        };
        if self.unconfirmed.is_empty() && !self.due {
            return back;
        }
        let mut asked: Vec<&str> = self.unconfirmed.keys().map(String::as_str).collect();
        asked.sort_unstable();
        let asking = std::time::Instant::now();
        let answer = gate.confirm(&asked);
        record.asked.push(asked_agent(&answer));
        match answer {
            Ok(refused) => {
                log::info!(
                    "--confirm: the agent took the batch and answered for {} module(s), refusing {} ({:?})",
                    asked.len(),
                    refused.len(),
                    asking.elapsed()
                );
                back.extend(self.refused(gate, next, refused, record));
            }
            Err(why) => {
                record.validations.push("error");
                // (Not inside the log macro: it skips its arguments below its level.)
                let withdrawn = self.withdrawn(next, &mut back);
                log::warn!("{why}; {withdrawn}");
            }
        }
        back
    }

    /// The put-backs owed whose refused version the cluster (`next`) still holds (a
    /// newer version is a batch of its own, asked about when delivered), by module.
    fn owed_back(&mut self, next: &Snapshot) -> Vec<Back> {
        let mut back: Vec<Back> = (std::mem::take(&mut self.owed).into_iter())
            .filter(|(id, o)| next.modules.get(id).is_some_and(|e| e.hash == o.refused))
            .map(|(id, o)| Back {
                id,
                good: o.good,
                why: None,
                ask_again: true,
            })
            .collect();
        back.sort_by(|a, b| a.id.cmp(&b.id));
        back
    }

    /// The agent answered, refusing `refused`: everything asked about is confirmed; each
    /// refused version still in the cluster goes back (the gate remembers the refusal).
    fn refused(
        &mut self,
        gate: &mut Gate,
        next: &Snapshot,
        refused: Vec<Rejection>,
        record: &mut Record,
    ) -> Vec<Back> {
        let mut unconfirmed = std::mem::take(&mut self.unconfirmed);
        self.due = false;
        (refused.into_iter())
            .filter_map(|r| {
                let (id, why) = (r.module, r.reason);
                let entry = next.modules.get(&id)?;
                let pending = unconfirmed.remove(&id)?;
                if pending.hash != entry.hash {
                    // Its last good version (a refused one's): nothing to go back to.
                    log::warn!(
                        "--confirm: the agent refuses the last good version of {id} too: {why}"
                    );
                    return None;
                }
                gate.refuse(&id, entry.hash, &why, pending.good);
                record.validations.push("fail");
                Some(Back {
                    good: gate.good(&id).cloned(),
                    id,
                    why: Some(why),
                    ask_again: true,
                })
            })
            .collect()
    }

    /// The agent could not be asked: what a batch brought (not a last good version
    /// written again, nor a run's first batch) is withdrawn into `back`; the rest is
    /// asked about again. What happened, for the log line.
    fn withdrawn(&mut self, next: &Snapshot, back: &mut Vec<Back>) -> String {
        let (withdrawn, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unconfirmed)
            .into_iter()
            .partition(|(id, u)| {
                u.withdrawable && next.modules.get(id).is_some_and(|e| e.hash == u.hash)
            });
        self.unconfirmed = kept.into_iter().collect();
        let said = format!(
            "{} module(s) go back to what the agent had before, and come again with the next poll; {} asked about again",
            withdrawn.len(),
            self.unconfirmed.len()
        );
        back.extend(withdrawn.into_iter().map(|(id, u)| Back {
            id,
            good: u.good,
            why: None,
            ask_again: false,
        }));
        said
    }
}

/// `--confirm`: the version the sinks held of each module a batch adds or updates, read
/// before they replaced it.
pub type Goods = HashMap<String, Good>;

/// What goes back, made ready for the sinks: `gone`, the versions the sinks hold now
/// (each refused or withdrawn); `goods`, the good versions spooled for them to read (a
/// module without one goes away).
pub struct Backs {
    back: Vec<Back>,
    pub gone: Snapshot,
    pub goods: Snapshot,
    kinds: HashMap<String, Option<Resource>>,
}

impl Backs {
    /// Spools the good version of each module in `back` the cluster (`next`) still has.
    pub fn spool(back: Vec<Back>, next: &Snapshot, spool: &mut Spool) -> Result<Backs, Fatal> {
        let (mut goods, mut gone) = (Snapshot::default(), Snapshot::default());
        let mut kinds = HashMap::new();
        for b in &back {
            let Some(entry) = next.modules.get(&b.id) else {
                continue;
            };
            let kind = spool.meta(entry.loc).map(|m| m.kind).ok();
            if let (Some(kind), Some(g)) = (kind, &b.good) {
                let object = ObjectRef::new(kind, &g.uid, &g.resource_version);
                let loc = (spool.put(&object, &g.files)).map_err(|e| {
                    Fatal(format!(
                        "--confirm: cannot spool {}'s last good version: {e}",
                        b.id
                    ))
                })?;
                let hash = Hash::of(g.files.iter().map(|f| (f.key.as_str(), f.content.bytes())));
                let resource_version = g.resource_version.as_str().into();
                let good = Entry {
                    hash,
                    loc,
                    resource_version,
                };
                goods.modules.insert(&b.id, good);
            }
            kinds.insert(b.id.clone(), kind);
            gone.modules.insert(&b.id, entry.clone());
        }
        Ok(Backs {
            back,
            gone,
            goods,
            kinds,
        })
    }

    /// The events that put them into the sinks: each module to its good version or away,
    /// and a `rejected` for each refused (remembered in `rejected`; `record` hears it is
    /// announced), removals first, then by module name (SPEC's order).
    pub fn events(&self, rejected: &mut Rejected, record: &mut Record) -> Vec<Event<'_>> {
        let mut events = Vec::new();
        for b in &self.back {
            let id = b.id.as_str();
            let Some(entry) = self.gone.modules.get(id) else {
                continue;
            };
            match self.goods.modules.get(id) {
                Some(good) => events.push(Event::new(Change::Updated, id, good)),
                None => events.push(Event::new(Change::Removed, id, entry)),
            }
            let Some(why) = &b.why else {
                continue;
            };
            let shows = matches!(self.kinds.get(id), Some(Some(k)) if k.shows_contents());
            let then = "; back to its last good version";
            rejected.remember(id, (entry.hash, entry.resource_version), why, shows, then);
            record.announced.push(Rejection::new(id, why.as_str()));
            let mut r = Event::new(Change::Added, id, entry);
            r.reject(why.clone());
            events.push(r);
        }
        events.sort_by(|a, b| {
            (a.change != Change::Removed, a.id).cmp(&(b.change != Change::Removed, b.id))
        });
        events
    }

    /// Once they went back (but for `unwritten`), the agent is asked again about them, if
    /// one of them asks for it (`record` hears whether it could be asked).
    pub fn ask_again(&self, gate: &Gate, unwritten: &BTreeSet<String>, record: &mut Record) {
        let again = |b: &Back| b.ask_again && !unwritten.contains(&b.id);
        if !self.back.iter().any(again) {
            return;
        }
        let ids: Vec<&str> = (self.goods.modules.iter())
            .map(|(id, _)| id)
            .filter(|id| !unwritten.contains(*id))
            .collect();
        let answer = gate.confirm(&ids);
        record.asked.push(asked_agent(&answer));
        match answer {
            Ok(again) if again.is_empty() => {}
            Ok(again) => log::warn!(
                "--confirm: the agent refuses the last good version of {} too",
                (again.iter().map(|r| r.module.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Err(why) => log::warn!("{why} (after going back to the last good versions)"),
        }
    }

    /// What the store must hold instead of the poll's snapshot for the modules that went
    /// back. One a sink could not take back (`unwritten`) stays as the sinks hold it (the
    /// refused version: its good version leaves `spool`) and is owed to `confirm`.
    pub fn settle(
        self,
        unwritten: &BTreeSet<String>,
        confirm: &mut Confirm,
        spool: &mut Spool,
    ) -> Reverted {
        let mut reverted = Vec::new();
        for b in self.back {
            let Some(refused) = self.gone.modules.get(&b.id) else {
                continue;
            };
            let good = self.goods.modules.get(&b.id).cloned();
            if unwritten.contains(&b.id) {
                // A sink holds the refused version still: so does the store.
                if let Some(g) = good {
                    spool.release(g.loc);
                }
                let owed = Owed {
                    refused: refused.hash,
                    good: b.good,
                };
                confirm.owed.insert(b.id, owed);
                continue;
            }
            reverted.push((b.id, good));
        }
        Reverted(reverted)
    }
}

/// What the store holds, once a poll is committed, of each module the agent refused (the
/// good version the sinks went back to, or nothing).
#[derive(Default)]
pub struct Reverted(Vec<(String, Option<Entry>)>);

impl Reverted {
    /// Made part of `next`, so that the commit releases and keeps the spool's contents as
    /// it does for any other: what `store` held is released unless it still holds it.
    pub fn into_next(self, next: &mut Snapshot, store: &mut Store) {
        for (id, holds) in self.0 {
            let refused = match holds {
                Some(good) => next.modules.insert(&id, good),
                None => next.modules.remove(&id),
            };
            if let Some(r) = refused
                && (store.snapshot.modules.get(&id)).is_none_or(|c| c.loc != r.loc)
            {
                store.spool.release(r.loc);
            }
        }
    }
}

/// `--confirm` asked the agent, which reloads when asked: readiness hears whether it could
/// be asked, as of a reload path.
fn asked_agent(answer: &Result<Vec<Rejection>, Unasked>) -> Result<(), String> {
    answer.as_ref().map(|_| ()).map_err(Unasked::reason)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A gate whose agent refuses `ns/a` (`--confirm`), or cannot be asked (`down`).
    fn gate(down: bool) -> Gate {
        let confirm = match down {
            true => "exit 3",
            false => "for m in $CMPOLL_MODULES; do [ $m = ns/a ] && echo \"$m no\"; done; true",
        };
        Gate::open(crate::validate::Options {
            command: "true".into(),
            timeout: Duration::from_secs(10),
            jobs: 1,
            meta_dir: None,
            ext: String::new(),
            template: None,
            kinds: Default::default(),
            confirm: Some(confirm.into()),
            out_dir: None,
        })
        .unwrap()
    }

    fn ids(back: &[Back]) -> Vec<(&str, Option<&str>, bool)> {
        (back.iter())
            .map(|b| (b.id.as_str(), b.why.as_deref(), b.ask_again))
            .collect()
    }

    /// `ask` says what must go back, and keeps what it still waits for: what the agent
    /// refused (asked about again once back), or, when it cannot be asked, what a later
    /// batch brought (not a run's first batch, asked about again).
    #[test]
    fn ask_returns_what_must_go_back() {
        let mut spool = Spool::memory();
        let mut next = Snapshot::default();
        next.modules
            .insert("ns/a", crate::poll::testing::entry(&mut spool, "1"));
        next.modules
            .insert("ns/b", crate::poll::testing::entry(&mut spool, "1"));
        let events: Vec<Event> = (next.modules.iter())
            .map(|(id, e)| Event::new(Change::Added, id, e))
            .collect();
        let current = Snapshot::default();
        let mut record = Record::default();
        // The agent answers: ns/a goes back (away: no good version), ns/b is confirmed.
        let mut c = Confirm::new(true);
        c.delivered(&events, false);
        let back = c.ask(
            Some(&mut gate(false)),
            &current,
            &next,
            Goods::new(),
            &mut record,
        );
        assert_eq!(
            ids(&back),
            [("ns/a", Some("refused by the agent: no"), true)]
        );
        assert!(c.unconfirmed.is_empty() && !c.due);
        assert_eq!(record.asked, [Ok(())]);
        // Not asked again: nothing was delivered since.
        let again = c.ask(
            Some(&mut gate(false)),
            &current,
            &next,
            Goods::new(),
            &mut record,
        );
        assert!(again.is_empty() && record.asked.len() == 1);
        // The agent cannot be asked: a later batch is withdrawn, a first one stays.
        for (first, withdrawn) in [(false, 2), (true, 0)] {
            let mut c = Confirm::new(true);
            c.delivered(&events, first);
            let back = c.ask(
                Some(&mut gate(true)),
                &current,
                &next,
                Goods::new(),
                &mut record,
            );
            assert_eq!(back.len(), withdrawn, "first: {first}");
            assert!(back.iter().all(|b| b.why.is_none() && !b.ask_again));
            assert_eq!(c.unconfirmed.len(), 2 - withdrawn);
        }
    }
}
