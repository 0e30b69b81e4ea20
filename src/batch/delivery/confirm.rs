//! `--confirm`: after the sinks took a batch, the agent is asked whether it took what it
//! was given; what it refuses goes back, through the same `deliver` loop as any batch, to
//! its last good version (or away), and what a sink could not take back is owed: the
//! record says it is unwritten (`/readyz`, `cmpoll status`) and the next poll tries again.

use std::collections::HashMap;

use super::{Delivery, Going, Owed, Unconfirmed};
use crate::batch::event::{Change, Event};
use crate::batch::observe::Record;
use crate::batch::rejected::Rejected;
use crate::batch::sink::Fatal;
use crate::poll::hash::Hash;
use crate::poll::snapshot::{Entry, Snapshot};
use crate::poll::spool::{ObjectRef, Spool};
use crate::poll::store::Store;
use crate::reason::Rejection;
use crate::source::Resource;
use crate::validate::{Gate, Good, Unasked};

impl Delivery {
    /// `--confirm`: the version the sinks hold now of each module this batch adds or
    /// updates, read before the sinks replace it (a shelved one is read from the folder).
    pub(super) fn goods(
        &self,
        going: &Going,
        current: &Snapshot,
        spool: &Spool,
    ) -> HashMap<String, Good> {
        let mut goods = HashMap::new();
        if !self.gate.as_ref().is_some_and(Gate::confirms) {
            return goods;
        }
        for e in &going.events {
            if e.change != Change::Updated && e.change != Change::Added {
                continue;
            }
            let Some(old) = current.modules.get(e.id) else {
                continue;
            };
            match spool.read(old.loc) {
                Ok((meta, files)) => {
                    goods.insert(
                        e.id.to_string(),
                        Good {
                            uid: meta.uid,
                            resource_version: meta.resource_version,
                            files,
                        },
                    );
                }
                Err(err) => log::warn!(
                    "--confirm: cannot read the last good version of {} back: {err}",
                    e.id
                ),
            }
        }
        goods
    }

    /// `--confirm`: a batch reached the sinks; its additions and updates are to be asked
    /// about (only with `--confirm`: 50,000 first modules kept here cost 14 MB for
    /// nothing).
    pub(super) fn delivered(&mut self, events: &[Event], first: bool) {
        self.confirm_due |= events.iter().any(Event::is_change);
        if !self.gate.as_ref().is_some_and(Gate::confirms) {
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

    /// `--confirm`: asks the agent about the modules delivered and not yet confirmed.
    /// Each it refused is rejected (remembered as a validator's refusal is) and goes back
    /// to its last good version in every sink (the one the sinks held before it, else what
    /// the gate remembers), or away if it had none; then the agent is asked once more,
    /// about those, so that it takes the folder as it now is. An agent that cannot be
    /// asked (down, or unable to start: perhaps because of what the batch brought) gets
    /// back what it had before the batch, and the batch comes again with the next poll;
    /// a run's first batch stays (the folder had most of it before), asked about again.
    /// Until the agent is asked again, `/readyz` fails as after a failed reload. A
    /// put-back a sink could not take (`owed`) is made again after every poll, as long as
    /// the cluster holds what was refused.
    /// What the store must hold instead of `next` for the modules put back (`record`
    /// hears what the agent said and what a sink could not take back).
    pub(super) fn confirm(
        &mut self,
        store: &mut Store,
        next: &Snapshot,
        goods: HashMap<String, Good>,
        held: usize,
        record: &mut Record,
    ) -> Result<Reverted, Fatal> {
        // Delivered now: asked about, with what the sinks held before.
        for (id, good) in goods {
            if let Some(u) = self.unconfirmed.get_mut(&id) {
                u.good = Some(good);
            }
        }
        // Gone, or changed since (the new version is asked about when delivered).
        // (A rejected module's last good version, delivered again, is what the store
        // keeps: `current`.)
        let current = &store.snapshot;
        self.unconfirmed.retain(|id, u| {
            let holds = |s: &Snapshot| s.modules.get(id).is_some_and(|e| e.hash == u.hash);
            holds(next) || holds(current)
        });
        // Owed, and the cluster still holds what was refused (a newer version is a
        // batch of its own, asked about when delivered).
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
        let Some(gate) = self.gate.as_mut().filter(|g| g.confirms()) else {
            return self.put_back(store, next, back, held, record);
        };
        if self.unconfirmed.is_empty() && !self.confirm_due {
            return self.put_back(store, next, back, held, record);
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
                let mut unconfirmed = std::mem::take(&mut self.unconfirmed);
                self.confirm_due = false;
                back.extend(refused.into_iter().filter_map(|r| {
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
                }));
                self.put_back(store, next, back, held, record)
            }
            Err(why) => {
                record.validations.push("error");
                // What a batch brought (not a last good version written again).
                let (withdrawn, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unconfirmed)
                    .into_iter()
                    .partition(|(id, u)| {
                        u.withdrawable && next.modules.get(id).is_some_and(|e| e.hash == u.hash)
                    });
                self.unconfirmed = kept.into_iter().collect();
                log::warn!(
                    "{why}; {} module(s) go back to what the agent had before, and come again with the next poll; {} asked about again",
                    withdrawn.len(),
                    self.unconfirmed.len()
                );
                back.extend(withdrawn.into_iter().map(|(id, u)| Back {
                    id,
                    good: u.good,
                    why: None,
                    ask_again: false,
                }));
                self.put_back(store, next, back, held, record)
            }
        }
    }

    /// Puts `back` into every sink, through the same `deliver` loop as any batch: the
    /// good version spooled for them to read, or a removal; a `rejected` event for each
    /// refused. Then the agent is asked again about what went back. A module a sink could
    /// not take back stays as the sinks hold it (the refused version: the store says so,
    /// and the record says it is unwritten) and is owed, tried again after the next poll.
    /// What the store must hold for the others.
    fn put_back(
        &mut self,
        store: &mut Store,
        next: &Snapshot,
        back: Vec<Back>,
        held: usize,
        record: &mut Record,
    ) -> Result<Reverted, Fatal> {
        let mut reverted = Reverted::new();
        if back.is_empty() {
            return Ok(reverted);
        }
        let (mut goods, mut gone) = (Snapshot::default(), Snapshot::default());
        let mut kinds = HashMap::new();
        for b in &back {
            let Some(entry) = next.modules.get(&b.id) else {
                continue;
            };
            let kind = store.spool.meta(entry.loc).map(|m| m.kind).ok();
            if let (Some(kind), Some(g)) = (kind, &b.good) {
                let object = ObjectRef::new(kind, &g.uid, &g.resource_version);
                let loc = (store.spool.put(&object, &g.files)).map_err(|e| {
                    Fatal(format!(
                        "--confirm: cannot spool {}'s last good version: {e}",
                        b.id
                    ))
                })?;
                let hash = Hash::of(g.files.iter().map(|f| (f.key.as_str(), f.content.bytes())));
                let resource_version = g.resource_version.as_str().into();
                goods.modules.insert(
                    &b.id,
                    Entry {
                        hash,
                        loc,
                        resource_version,
                    },
                );
            }
            kinds.insert(b.id.clone(), kind);
            gone.modules.insert(&b.id, entry.clone());
        }
        let events = back_events(&back, &gone, &goods, &kinds, &mut self.rejected, record);
        let mut going = Going::new(events);
        // What the sinks hold but for what this batch takes back.
        let others = held.saturating_sub(gone.len());
        let holds = |kept: &_| others + super::sinks_hold(kept, &gone, &goods);
        self.deliver(&mut going, &store.spool, false, &holds, record)?;
        let unwritten = going.unwritten_ids();
        for u in &going.unwritten {
            log::warn!(
                "--confirm: {} could not be put back to its last good version: {}; tried again after the next poll",
                u.module,
                u.error
            );
        }
        record
            .unwritten
            .extend(std::mem::take(&mut going.unwritten));
        drop(going);
        let ask_again = back
            .iter()
            .any(|b| b.ask_again && !unwritten.contains(&b.id));
        if ask_again && let Some(gate) = &self.gate {
            let ids: Vec<&str> = (goods.modules.iter())
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
        for b in &back {
            let Some(refused) = gone.modules.get(&b.id) else {
                continue;
            };
            let good = goods.modules.get(&b.id).cloned();
            if unwritten.contains(&b.id) {
                // A sink holds the refused version still: so does the store.
                if let Some(g) = good {
                    store.spool.release(g.loc);
                }
                let owed = Owed {
                    refused: refused.hash,
                    good: b.good.clone(),
                };
                self.owed.insert(b.id.clone(), owed);
                continue;
            }
            reverted.push((b.id.clone(), good));
        }
        Ok(reverted)
    }
}

/// The events that put `back` into the sinks: each module to its good version (`goods`)
/// or away, and a `rejected` for each refused (remembered in `rejected`), removals first,
/// then by module name (SPEC's order).
fn back_events<'a>(
    back: &'a [Back],
    gone: &'a Snapshot,
    goods: &'a Snapshot,
    kinds: &HashMap<String, Option<Resource>>,
    rejected: &mut Rejected,
    record: &mut Record,
) -> Vec<Event<'a>> {
    let mut events = Vec::new();
    for b in back {
        let id = b.id.as_str();
        let Some(entry) = gone.modules.get(id) else {
            continue;
        };
        match goods.modules.get(id) {
            Some(good) => events.push(Event::new(Change::Updated, id, good)),
            None => events.push(Event::new(Change::Removed, id, entry)),
        }
        let Some(why) = &b.why else {
            continue;
        };
        let shows = matches!(kinds.get(id), Some(Some(k)) if k.shows_contents());
        let then = "; back to its last good version";
        rejected.remember(id, entry.hash, why, shows, then);
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

/// One module going back: to `good`, or away; refused for `why` (none: withdrawn, or a
/// put-back owed since an earlier poll); the agent asked again once it went back.
struct Back {
    id: String,
    good: Option<Good>,
    why: Option<String>,
    ask_again: bool,
}

/// `--confirm`: what the store holds, once a poll is committed, of each module the agent
/// refused (the good version the sinks went back to, or nothing).
pub(super) type Reverted = Vec<(String, Option<Entry>)>;

/// `--confirm` asked the agent, which reloads when asked: readiness hears whether it could
/// be asked, as of a reload path.
fn asked_agent(answer: &Result<Vec<Rejection>, Unasked>) -> Result<(), String> {
    answer.as_ref().map(|_| ()).map_err(Unasked::reason)
}
