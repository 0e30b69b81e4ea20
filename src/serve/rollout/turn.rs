//! One turn of the rollouts, at each complete poll (`Rollouts::turn`): the record read
//! (`READ_IDLE` apart when nothing rolls), what it says applied to what each cohort is
//! served (`pieces.rs`; a change waits for a poll newer than what the watchers were told),
//! the hub's decisions planned (`plan.rs`) and written when they change the record, when
//! its beat is due, or when a change waits for a write to list past; and the poll's views.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::lookups::{
    Ids, annotation_of, decisions, empty, from_views, gate_of, keyed, lowest_of, reread,
};
use super::pieces::{Pieces, Plan};
use super::plan::{Context, Seen, plan};
use super::record::{self, RECORD_KEY, Rollout, stable_key};
use super::steps::{ANNOTATION, Steps};
use super::store::{Stored, Wrote};
use super::{BEAT, HUB_FORGOTTEN, HUB_GONE, READ_IDLE, Rollouts};
use crate::serve::fleet::Fleet;
use crate::serve::held::{Held, HeldObject};
use crate::serve::validated::{memory, with_annotation};
use crate::serve::views::Views;
use crate::source::Resource;

/// What the record asks of one object's cohorts.
enum Wanted {
    /// The object as polled, to every client, untold apart.
    Plain,
    /// Each cohort keeps what it is served (a version not recorded yet).
    Keep,
    /// Each range of cohorts its source.
    Plan(Plan),
}

/// What a turn gives the poll loop.
pub struct Turn {
    /// The poll's views (`None`: the record was never read: nothing may be served yet).
    pub views: Option<Views>,
    /// Kinds the next poll must list past a version (a change waits for it).
    pub behind: Vec<(Resource, u64)>,
    /// The decisions this hub wrote (`started`, `advanced`, `completed`, `refused`,
    /// `ended`), for its metrics.
    pub wrote: Vec<&'static str>,
    /// Objects rolling out, and refused, now.
    pub counts: (usize, usize),
}

impl Rollouts {
    /// The views of `judged` (a complete poll, as `--validate` serves it), after `prev`
    /// (what was served before), with the gate read off `fleet`.
    pub fn turn(&mut self, judged: Arc<Held>, prev: &Views, fleet: &Fleet) -> Turn {
        let now = Instant::now();
        // Read at every poll while a rollout runs or a version is new here; else every
        // `READ_IDLE` (another hub's decisions, a record edited).
        let news = self.news(&judged, prev);
        let due = self.clock.last_read.is_none_or(|t| now >= t + READ_IDLE)
            || self.state.record.rollouts.values().any(|r| r.rolling())
            || news;
        let read_at = self
            .state
            .stored
            .as_ref()
            .map(|s| s.resource_version.clone());
        let fresh = !due || self.read(now);
        // The gates are asked (each a pass over the followers) when something may have
        // moved: a new version here, a record another hub wrote, or every `DECIDE_EVERY`.
        let moved = news
            || read_at
                != self
                    .state
                    .stored
                    .as_ref()
                    .map(|s| s.resource_version.clone())
            || self
                .clock
                .last_decide
                .is_none_or(|t| now >= t + self.clock.decide_every);
        if self.state.stored.is_none() {
            return Turn {
                views: None,
                behind: Vec::new(),
                wrote: Vec::new(),
                counts: (0, 0),
            };
        }
        let (waits, told) = self.apply(&judged, prev);
        let views = self.views(&judged, prev);
        self.published = true;
        let fence = waits && self.fence <= told;
        if fresh && (moved || fence) {
            self.clock.last_decide = Some(now);
            self.decide(&judged, &views, fleet, fence);
        }
        let behind = match waits {
            true => (judged.scopes.iter())
                .map(|s| (s.kind, self.fence.max(told + 1)))
                .collect(),
            false => Vec::new(),
        };
        let rolling = (self.state.record.rollouts.values())
            .filter(|r| r.rolling())
            .count();
        Turn {
            views: Some(views),
            behind,
            wrote: std::mem::take(&mut self.wrote),
            counts: (rolling, self.state.record.rollouts.len() - rolling),
        }
    }

    /// Whether `judged` holds a version its clients above every cut are not served (a
    /// rollout may start).
    fn news(&self, judged: &Held, prev: &Views) -> bool {
        keyed(judged).any(|(kind, key, o)| {
            if (prev.top.by_key(kind, key)).is_some_and(|p| p.hash == o.hash) {
                return false;
            }
            let id = memory::id(kind, &o.namespace, &o.name);
            let refused = (self.state.record.rollouts.get(&id))
                .is_some_and(|r| r.refused.is_some() && o.hash.is(&r.hash));
            !refused
        })
    }

    /// Reads the Secret: `false` when it could not be (the last one read stands).
    fn read(&mut self, now: Instant) -> bool {
        match self.store.read() {
            Ok(stored) => {
                self.clock.last_read = Some(now);
                self.error = None;
                let stored = stored.unwrap_or_else(empty);
                self.take(stored, now);
                true
            }
            Err(e) => {
                if self.error.as_ref() != Some(&e) {
                    log::warn!(
                        "--rollout: cannot read {}: {e}; every rollout holds where it is",
                        self.store.describe()
                    );
                }
                self.error = Some(e);
                false
            }
        }
    }

    /// `stored` is the Secret now: its record, its stable versions, the hubs' beats.
    fn take(&mut self, stored: Stored, now: Instant) {
        let (rec, dropped) = match stored.data.get(RECORD_KEY) {
            Some(json) => record::read(json),
            None => Default::default(),
        };
        for d in dropped {
            self.say_once(format!("{}: {d}", self.store.describe()));
        }
        // When this hub first saw each rollout's current step (its own clock).
        let seen = &mut self.clock.steps_seen;
        seen.retain(|id, (h, st, _)| {
            (rec.rollouts.get(id)).is_some_and(|r| r.rolling() && r.hash == *h && r.step == *st)
        });
        for (id, r) in rec.rollouts.iter().filter(|(_, r)| r.rolling()) {
            seen.entry(id.clone())
                .or_insert((r.hash.clone(), r.step, now));
        }
        for (name, h) in &rec.hubs {
            let moved = self.clock.beats.get(name).is_none_or(|(b, _)| *b != h.beat);
            if moved {
                self.clock.beats.insert(name.clone(), (h.beat, now));
            }
        }
        self.state
            .stables
            .retain(|id, _| rec.rollouts.contains_key(id));
        for (id, r) in &rec.rollouts {
            let Some(from) = &r.from else { continue };
            if self.state.stables.get(id).is_some_and(|(h, _)| h == from) {
                continue;
            }
            let blob = stored.data.get(&stable_key(id));
            match blob.map(|json| reread(id, json)) {
                Some(Ok(o)) if o.hash.is(from) => {
                    self.state
                        .stables
                        .insert(id.clone(), (from.clone(), Arc::new(o)));
                }
                Some(Ok(_)) => self.say_once(format!("{id}: its stable version is another")),
                Some(Err(e)) => self.say_once(e),
                None => self.say_once(format!("{id}: its stable version is missing")),
            }
        }
        self.state.record = rec;
        self.state.stored = Some(stored);
    }

    /// The record applied to what each cohort is served; whether some change waits for a
    /// newer poll, and the newest version the watchers may have been told.
    fn apply(&mut self, judged: &Arc<Held>, prev: &Views) -> (bool, u64) {
        let told = (prev.top.scopes.iter())
            .map(|s| s.listed)
            .max()
            .unwrap_or(0);
        let mut waits = false;
        let mut next = BTreeMap::new();
        // The objects neither told apart nor recorded, served above every cut as polled,
        // stay so (`Wanted::Plain`): the pass looks only at the others.
        let looked = Ids::of(self.tracked.keys().chain(self.state.record.rollouts.keys()));
        for (kind, key, o) in keyed(judged) {
            if !looked.has(kind, key)
                && (prev.top.by_key(kind, key)).is_some_and(|d| d.hash == o.hash)
            {
                continue;
            }
            let id = memory::id(kind, &o.namespace, &o.name);
            let at = judged
                .versions(kind, Some(&o.namespace))
                .map_or(0, |v| v.listed);
            let kept = self.tracked.remove(&id);
            let done = match &kept {
                Some(p) => p.source_at(f64::INFINITY).cloned(),
                None => prev.top.get(kind, &o.namespace, &o.name).cloned(),
            };
            // Deleted and made again with the same content (`kubectl replace --force`):
            // what every client was served.
            let done = done.or_else(|| self.recreated(&id, o));
            let wanted = self.wanted(&id, o, kept.as_ref(), done.as_ref());
            let current = match (kept, &wanted) {
                (Some(p), _) => p,
                (None, Wanted::Plain) => continue,
                (None, _) => from_views(prev, kind, o),
            };
            let moved = match wanted {
                Wanted::Keep => Some(current.clone()),
                Wanted::Plan(plan) => current.moved_to(&plan, told, at),
                Wanted::Plain => {
                    current.moved_to(&vec![(f64::INFINITY, Some(o.clone()))], told, at)
                }
            };
            let pieces = match moved {
                Some(p) => p,
                None => {
                    waits = true;
                    current
                }
            };
            if !pieces.only(o) {
                next.insert(id, pieces);
            }
        }
        self.tracked = next;
        self.forget_deleted(judged, prev);
        (waits, told)
    }

    /// `o` (polled under `id`, not served before) if it is an object deleted a moment ago
    /// made again with the same content.
    fn recreated(&self, id: &str, o: &Arc<HeldObject>) -> Option<Arc<HeldObject>> {
        let (gone, _) = self.clock.deleted.get(id)?;
        (gone.hash == o.hash).then(|| o.clone())
    }

    /// Keeps what `prev` served that `judged` no longer holds, for `DELETED_KEPT`.
    fn forget_deleted(&mut self, judged: &Held, prev: &Views) {
        let now = Instant::now();
        self.clock
            .deleted
            .retain(|_, (_, t)| now < *t + super::DELETED_KEPT);
        for (kind, key, o) in keyed(&prev.top) {
            if judged.by_key(kind, key).is_none() && self.clock.deleted.len() < 4096 {
                let id = memory::id(kind, &o.namespace, &o.name);
                self.clock.deleted.insert(id, (o.clone(), now));
            }
        }
    }

    /// What the record asks each cohort be served of `o`, whose cohorts are served
    /// `kept` (if told apart) and, above every cut, `done`.
    fn wanted(
        &self,
        id: &str,
        o: &Arc<HeldObject>,
        kept: Option<&Pieces>,
        done: Option<&Arc<HeldObject>>,
    ) -> Wanted {
        let hash = o.hash.to_string();
        let rv: u64 = o.resource_version.parse().unwrap_or(0);
        // The stable version: the one this hub served itself, else the Secret's copy.
        let stable = |r: &Rollout| -> Option<Option<Arc<HeldObject>>> {
            let Some(from) = &r.from else {
                return Some(None);
            };
            if let Some(d) = done.filter(|d| d.hash.is(from)) {
                return Some(Some(d.clone()));
            }
            let (h, s) = self.state.stables.get(id)?;
            (h == from).then(|| Some(s.clone()))
        };
        match self.state.record.rollouts.get(id) {
            // Not listed that far yet: every cohort keeps its version (a hub that served
            // nothing yet serves what it listed: nothing kept is no object at all).
            Some(r) if rv < r.rv && self.published => Wanted::Keep,
            Some(r) if rv < r.rv => Wanted::Plain,
            Some(r) if r.hash == hash && r.done.is_some() => {
                Wanted::Plan(vec![(f64::INFINITY, Some(o.clone()))])
            }
            Some(r) if r.hash == hash && r.rolling() => {
                // A stable version this hub cannot have (the Secret's copy gone, and it
                // served none itself: it started since): the version as polled, to every
                // client, rather than the object gone for those above the step (said).
                let Some(stable) = stable(r) else {
                    return Wanted::Plain;
                };
                // The last step's threshold is above every cohort: the top view too.
                let below = if r.below >= 1.0 {
                    f64::INFINITY
                } else {
                    r.below
                };
                Wanted::Plan(vec![(below, Some(o.clone())), (f64::INFINITY, stable)])
            }
            Some(r) if r.hash == hash => match stable(r) {
                Some(s) => {
                    let held = s.map(|s| Arc::new(with_annotation(&s, &o.hash)));
                    Wanted::Plan(vec![(f64::INFINITY, held)])
                }
                // Refused, and no good version to serve: what every cohort has, or (a
                // hub started since) none.
                None => Wanted::Keep,
            },
            // A newer write after a rollout done, with none to run: to every client.
            Some(r) if r.done.is_some() && self.steps_of(o).is_none() => Wanted::Plain,
            // A newer write the record does not have yet: every cohort keeps its version.
            Some(_) => Wanted::Keep,
            None if done.is_some_and(|d| d.hash == o.hash) => Wanted::Plain,
            None if !self.published || self.steps_of(o).is_none() => Wanted::Plain,
            // Told apart, and no record of why (the Secret emptied, or not read yet):
            // every cohort keeps its version until a record says otherwise.
            None if kept.is_some() => Wanted::Keep,
            // A new version not recorded yet: every cohort keeps its version.
            None => Wanted::Keep,
        }
    }

    /// The steps of `o`: its annotation's, else the hub's (`None`: no rollout).
    fn steps_of(&self, o: &HeldObject) -> Option<Vec<f64>> {
        let own = annotation_of(o, ANNOTATION).and_then(|v| Steps::parse(&v).ok());
        let steps = own.unwrap_or_else(|| self.settings.steps.clone());
        (!steps.is_none()).then(|| steps.fractions().to_vec())
    }

    /// The views of `judged` as each cohort is served it.
    fn views(&self, judged: &Arc<Held>, prev: &Views) -> Views {
        if self.tracked.is_empty() {
            return Views::one(judged.clone());
        }
        let mut cuts: Vec<f64> = self.tracked.values().flat_map(|p| p.cuts()).collect();
        cuts.sort_by(f64::total_cmp);
        cuts.dedup();
        let told_apart = Ids::of(self.tracked.keys());
        let view = |h: f64, before: &Held| {
            judged.picked(before, |kind, key, o| {
                if !told_apart.has(kind, key) {
                    return Some(o.clone());
                }
                let id = memory::id(kind, &o.namespace, &o.name);
                match self.tracked.get(&id) {
                    Some(p) => p.at(h).cloned(),
                    None => Some(o.clone()),
                }
            })
        };
        let mut lo = 0.0;
        let mut out = Vec::new();
        for c in cuts {
            out.push((c, Arc::new(view(lo, prev.view(lo).1))));
            lo = c;
        }
        Views {
            top: Arc::new(view(f64::INFINITY, &prev.top)),
            cuts: out,
        }
    }

    /// Plans this turn's decisions and writes them (or the beat, when due or when a
    /// change waits for a write to list past).
    fn decide(&mut self, judged: &Arc<Held>, views: &Views, fleet: &Fleet, fence: bool) {
        let now = Instant::now();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // The objects a plan looks at: those recorded, and those whose version is new
        // (the plan leaves every other as it is).
        let recorded = Ids::of(self.state.record.rollouts.keys());
        let seen: Vec<Seen> = keyed(judged)
            .filter_map(|(kind, key, o)| {
                let done = views.top.by_key(kind, key);
                if !recorded.has(kind, key) && done.is_some_and(|d| d.hash == o.hash) {
                    return None;
                }
                Some(Seen {
                    done,
                    steps: self.steps_of(o).unwrap_or_default(),
                    fallback: self.settings.steps.fractions().to_vec(),
                    id: memory::id(kind, &o.namespace, &o.name),
                    object: o,
                })
            })
            .collect();
        let (started, beats, me) = (self.clock.started, &self.clock.beats, self.me.clone());
        let live = |name: &str| {
            name == me
                || now < started + HUB_GONE
                || beats.get(name).is_some_and(|(_, t)| now < *t + HUB_GONE)
        };
        let tracked = &self.tracked;
        let mut gate = |id: &str, r: &Rollout| gate_of(fleet, judged, tracked, id, r, now);
        let mut lowest = |id: &str| lowest_of(fleet, judged, id, now);
        let steps_seen = &self.clock.steps_seen;
        let waited = |id: &str, r: &Rollout| {
            let seen = steps_seen
                .get(id)
                .filter(|(h, s, _)| *h == r.hash && *s == r.step);
            seen.is_some_and(|(_, _, t)| now >= *t + Duration::from_secs(r.wait))
        };
        let mut cx = Context {
            me: &me,
            now: wall,
            wait: self.settings.wait.as_secs(),
            live: &live,
            gate: &mut gate,
            lowest: &mut lowest,
            waited: &waited,
        };
        let mut planned = plan(&self.state.record, &seen, &mut cx);
        let forgotten = |name: &str| {
            name != me
                && now >= started + HUB_FORGOTTEN
                && beats
                    .get(name)
                    .is_none_or(|(_, t)| now >= *t + HUB_FORGOTTEN)
        };
        planned.record.hubs.retain(|name, _| !forgotten(name));
        let rolling = planned.record.rollouts.values().any(Rollout::rolling);
        let beat_due = rolling && self.clock.last_write.is_none_or(|t| now >= t + BEAT);
        if planned.record == self.state.record && !beat_due && !fence {
            return;
        }
        let stables: Vec<(String, Vec<u8>)> = (planned.stables.iter())
            .map(|(id, o)| (id.clone(), o.raw.json.to_vec()))
            .collect();
        self.write(planned.record, stables, now);
    }

    /// Writes `rec` (this hub's beat moved) with the stable versions it needs.
    fn write(&mut self, mut rec: record::Record, added: Vec<(String, Vec<u8>)>, now: Instant) {
        let known = self.state.stored.clone().unwrap_or_else(empty);
        rec.hubs.entry(self.me.clone()).or_default().beat += 1;
        let mut data: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (id, r) in &rec.rollouts {
            // A done rollout's stable version is no one's any more.
            if r.from.is_none() || r.done.is_some() {
                continue;
            }
            let key = stable_key(id);
            let blob = (added.iter().find(|(a, _)| a == id).map(|(_, b)| b.clone()))
                .or_else(|| known.data.get(&key).cloned());
            if let Some(b) = blob {
                data.insert(key, b);
            }
        }
        // Past the Secret's bound (its stable versions and its record, as written): the
        // newest rollouts wait for room (they start later).
        let size = |d: &BTreeMap<String, Vec<u8>>, rec: &record::Record| {
            d.values().map(Vec::len).sum::<usize>()
                + serde_json::to_vec(rec).map_or(usize::MAX, |j| j.len())
        };
        let started: Vec<String> = added.iter().map(|(id, _)| id.clone()).collect();
        for id in started.iter().rev() {
            if size(&data, &rec) <= record::MAX_BYTES {
                break;
            }
            data.remove(&stable_key(id));
            rec.rollouts.remove(id);
            self.say_once(format!(
                "{id}: no room in {} for its stable version: its rollout waits",
                self.store.describe()
            ));
        }
        if size(&data, &rec) > record::MAX_BYTES {
            // Still too large (the record itself): nothing is written, nothing advances.
            let why = format!("the rollouts' state would pass {} bytes", record::MAX_BYTES);
            self.say_once(why.clone());
            self.error = Some(why);
            return;
        }
        let json = serde_json::to_vec(&rec).unwrap_or_default();
        data.insert(RECORD_KEY.into(), json);
        let rv = self
            .state
            .stored
            .as_ref()
            .map(|k| k.resource_version.clone())
            .filter(|r| !r.is_empty());
        match self.store.write(rv.as_deref(), &data) {
            Ok(Wrote::Done(stored)) => {
                self.error = None;
                let was = std::mem::take(&mut self.state.record);
                self.wrote.extend(decisions(&was, &rec));
                self.clock.last_write = Some(now);
                self.fence = stored.resource_version.parse().unwrap_or(self.fence);
                self.take(stored, now);
            }
            // Another hub wrote first: read again at the next turn, decide again.
            Ok(Wrote::Conflict) => self.clock.last_read = None,
            Err(e) => {
                if self.error.as_ref() != Some(&e) {
                    log::warn!(
                        "--rollout: cannot write {}: {e}; every rollout holds where it is",
                        self.store.describe()
                    );
                }
                self.error = Some(e);
            }
        }
    }
}
