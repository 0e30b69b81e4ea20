//! What changed between a hub's polls, kept for its watchers, as the apiserver's watch
//! cache keeps its events: each complete poll's difference from the last — an object
//! added, at a new resourceVersion, or gone — as a `Change`, in resourceVersion order, in
//! a bounded history per kind. A watch from resourceVersion R is served the changes after
//! R; once changes after R have been dropped (or R is older than the hub's first poll,
//! which never saw what came before it), R is too old: `410 Expired`.
//!
//! A change's resourceVersion is its object's (an object gone has none of its own: its
//! change carries the version of the list that saw it gone). A hub listing several
//! namespaces lists each at its own resourceVersion, so a change is released to watchers
//! only once every scope of its kind has been listed past it (the kind's `watermark`, the
//! oldest of its scopes' lists): watchers see versions that never go back, and a watch
//! resumed from any version it was given misses nothing. With one scope a kind (all
//! namespaces, the default) every change is released at its poll.
//!
//! Each event's JSON is made once for every watcher (`HeldObject::event`, `Change::deleted`).

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::event::{Type, frame, trim_newline, with_resource_version};
use super::held::{Held, HeldObject};
use super::render;
use super::request::Form;
use super::views::{Band, Views};
use crate::https::http::Body;
use crate::source::Resource;

/// Changes kept per kind at most, and for how long at most beyond the newest
/// `KEEP_ALWAYS` (the apiserver keeps at least 100 events and drops them past 75 s).
pub const MAX_CHANGES: usize = 10_000;
pub const KEEP_ALWAYS: usize = 1_000;
pub const MAX_AGE: Duration = Duration::from_secs(300);
/// What the changes of a kind may keep alive, at most, in bytes (each the JSON of the
/// version it brings and of the one it replaced, each twice: the object, and its event
/// made for watchers), the newest always kept: 300 changes of a 900 KiB ConfigMap once
/// kept 542 MiB (issue 56.4).
pub const MAX_BYTES: usize = 64 << 20;

/// One change between two polls.
#[derive(Debug)]
pub struct Change {
    /// Its place in the kind's history (for a watcher's cursor).
    pub seq: u64,
    /// Its resourceVersion.
    pub rv: u64,
    /// The state the hub served before (a change or a removal).
    pub before: Option<Arc<HeldObject>>,
    /// The state it serves now (an addition or a change).
    pub after: Option<Arc<HeldObject>>,
    /// When the poll that found it ended.
    pub at: Instant,
    /// The number of the poll that found it: a state served from that poll or a later
    /// one already shows it.
    pub poll: u64,
    /// The clients it is for, by cohort (`views.rs`): every client but during rollouts.
    pub band: Band,
    /// `DELETED` of `before` at `rv`, per form, made once.
    deleted: [OnceLock<Body>; 2],
}

impl Change {
    /// The bytes it keeps alive, as the history counts them (`MAX_BYTES`).
    pub fn weight(&self) -> usize {
        let json = |o: &Option<Arc<HeldObject>>| o.as_ref().map_or(0, |o| o.raw.json.len());
        // The version it brings, and its event; the one it replaced (a deletion's `DELETED`
        // is made of it), which an older change may count too: a bound, not a sum.
        2 * json(&self.after) + 2 * json(&self.before) + 256
    }
}

impl Change {
    fn new(
        rv: u64,
        before: Option<Arc<HeldObject>>,
        after: Option<Arc<HeldObject>>,
        found: (Instant, u64),
    ) -> Change {
        Change {
            seq: 0,
            rv,
            before,
            after,
            at: found.0,
            poll: found.1,
            band: Band::ALL,
            deleted: Default::default(),
        }
    }

    /// The event a watcher selecting objects with `passes` sees of it, if any: an object
    /// that starts passing is `ADDED`, one that stops is `DELETED` (its last state, at
    /// this change's version), as the watch cache sends them.
    pub fn event(
        &self,
        kind: Resource,
        form: Form,
        passes: impl Fn(&HeldObject) -> bool,
    ) -> Option<Body> {
        let before = self.before.as_deref().is_some_and(&passes);
        let after = self.after.as_deref().is_some_and(&passes);
        match (before, after, &self.after) {
            (false, true, Some(o)) => Some(render::event(kind, form, Type::Added, o)),
            (true, true, Some(o)) => Some(render::event(kind, form, Type::Modified, o)),
            (true, false, _) => Some(self.deleted(kind, form)),
            _ => None,
        }
    }

    fn deleted(&self, kind: Resource, form: Form) -> Body {
        self.deleted[form_slot(form)]
            .get_or_init(|| {
                let o = self.before.as_deref().or(self.after.as_deref());
                let object = o.map(|o| render::object(kind, form, o)).unwrap_or_default();
                let object = with_resource_version(&object, self.rv);
                frame(Type::Deleted.word(), trim_newline(&object))
            })
            .clone()
    }
}

fn form_slot(form: Form) -> usize {
    match form {
        Form::Full => 0,
        Form::Metadata => 1,
    }
}
/// One kind's history.
#[derive(Debug, Default)]
pub struct Kept {
    changes: VecDeque<Arc<Change>>,
    /// Changes found but not released: a scope of the kind has not been listed past them.
    pending: Vec<Change>,
    /// Every change up to this version has been released (the oldest of the kind's
    /// lists): what bookmarks carry.
    pub watermark: u64,
    /// A watch from a version older than this misses changes: too old.
    pub oldest: u64,
    next_seq: u64,
    /// What `changes` keep alive (`Change::weight`).
    bytes: usize,
}

/// Where a watch from a version starts, or why it cannot.
#[derive(Debug, PartialEq, Eq)]
pub enum Start {
    /// Read the changes from this place on.
    Seq(u64),
    /// Too old: the version the history goes back to.
    TooOld(u64),
}

impl Kept {
    /// Where a watch from `rv` starts.
    pub fn from(&self, rv: u64) -> Start {
        if rv < self.oldest {
            return Start::TooOld(self.oldest);
        }
        let i = self.changes.partition_point(|c| c.rv <= rv);
        Start::Seq(self.changes.get(i).map_or(self.next_seq, |c| c.seq))
    }

    /// The place after every change released so far.
    pub fn end(&self) -> u64 {
        self.next_seq
    }

    /// The changes from place `seq` on (`None`: some of them are gone).
    pub fn after(&self, seq: u64) -> Option<impl Iterator<Item = &Arc<Change>>> {
        let first = self.changes.front().map_or(self.next_seq, |c| c.seq);
        if seq < first {
            return None;
        }
        let skip = usize::try_from(seq - first).unwrap_or(usize::MAX);
        Some(self.changes.iter().skip(skip))
    }

    fn release(&mut self, watermark: u64, now: Instant) {
        self.watermark = self.watermark.max(watermark);
        let mut ready: Vec<Change> = Vec::new();
        let mut held = Vec::new();
        for c in self.pending.drain(..) {
            if c.rv <= self.watermark {
                ready.push(c);
            } else {
                held.push(c);
            }
        }
        self.pending = held;
        ready.sort_by_key(|c| c.rv);
        for mut c in ready {
            c.seq = self.next_seq;
            self.next_seq += 1;
            self.bytes += c.weight();
            self.changes.push_back(Arc::new(c));
        }
        while self.changes.len() > MAX_CHANGES
            || (self.bytes > MAX_BYTES && self.changes.len() > 1)
            || (self.changes.len() > KEEP_ALWAYS
                && self
                    .changes
                    .front()
                    .is_some_and(|c| now.saturating_duration_since(c.at) > MAX_AGE))
        {
            if let Some(gone) = self.changes.pop_front() {
                self.bytes = self.bytes.saturating_sub(gone.weight());
                self.oldest = self.oldest.max(gone.rv);
            }
        }
    }

    /// The bytes its changes keep alive (`Change::weight`).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The changes it keeps.
    pub fn count(&self) -> usize {
        self.changes.len()
    }

    /// The newest change held back (a scope of the kind not yet listed past it).
    pub fn held_back(&self) -> Option<u64> {
        self.pending.iter().map(|c| c.rv).max()
    }
}

/// Every kind's history.
#[derive(Debug, Default)]
pub struct History {
    kinds: [Kept; 2],
    /// Whether a poll has been recorded (the first sets where the history begins).
    begun: bool,
}

impl History {
    pub fn kind(&self, kind: Resource) -> &Kept {
        &self.kinds[kind.index()]
    }

    /// What changed from `prev` to `next` (a complete poll after it).
    #[cfg(test)]
    pub fn record(&mut self, prev: &Held, next: &Held) {
        self.record_in(&[], &|_| prev, &|_| next);
    }

    /// What changed from `prev` to `next` (the views of a complete poll after them), for
    /// each band of clients whose views differ: a change the same for several bands side
    /// by side is one change for them all.
    pub fn record_views(&mut self, prev: &Views, next: &Views) {
        let cuts = prev.joint_cuts(next);
        self.record_in(&cuts, &|h| prev.view(h).1, &|h| next.view(h).1);
    }

    /// What changed in each band between `cuts` from the view `prev` gives its clients to
    /// the one `next` gives them (the top view: `next(f64::INFINITY)`).
    fn record_in<'a>(&mut self, cuts: &[f64], prev: &Pick<'a>, next: &Pick<'a>) {
        let now = Instant::now();
        let top = next(f64::INFINITY);
        for kind in [Resource::ConfigMaps, Resource::Secrets] {
            if !top.serves(kind) {
                continue;
            }
            let Some(v) = top.versions(kind, None) else {
                continue;
            };
            let kept = &mut self.kinds[kind.index()];
            if !self.begun {
                // The first poll: nothing before it is known.
                kept.oldest = v.listed;
                kept.watermark = v.listed;
                continue;
            }
            banded((prev, next), cuts, kind, (now, top.poll), &mut kept.pending);
            kept.release(v.listed, now);
        }
        self.begun |= top.poll > 0 && !top.scopes.is_empty();
    }
}

/// The view a client of a cohort is served.
type Pick<'a> = dyn Fn(f64) -> &'a Held + 'a;

/// The changes of `kind` from `views.0` to `views.1` in each band between `cuts`, those
/// alike in bands side by side made one.
fn banded(
    views: (&Pick, &Pick),
    cuts: &[f64],
    kind: Resource,
    at: (Instant, u64),
    out: &mut Vec<Change>,
) {
    let (prev, next) = views;
    let mut lo = 0.0;
    let mut open: Vec<Change> = Vec::new();
    for hi in cuts.iter().copied().chain([f64::INFINITY]) {
        let band = Band { lo, hi };
        let mut found = Vec::new();
        diff(prev(lo), next(lo), kind, at, &mut found);
        let mut still: Vec<Change> = Vec::new();
        for mut c in found {
            c.band = band;
            match open.iter().position(|o| alike(o, &c)) {
                Some(i) => {
                    let mut o = open.swap_remove(i);
                    o.band.hi = hi;
                    still.push(o);
                }
                None => still.push(c),
            }
        }
        // A change not found again in this band ends where it was.
        out.append(&mut open);
        open = still;
        lo = hi;
    }
    out.append(&mut open);
}

/// Whether two changes bring the same objects, at one version.
fn alike(a: &Change, b: &Change) -> bool {
    let same = |x: &Option<Arc<HeldObject>>, y: &Option<Arc<HeldObject>>| match (x, y) {
        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
        (None, None) => true,
        _ => false,
    };
    a.rv == b.rv && same(&a.before, &b.before) && same(&a.after, &b.after)
}

/// The changes of `kind` from `prev` to `next`, both in the apiserver's order.
fn diff(prev: &Held, next: &Held, kind: Resource, at: (Instant, u64), out: &mut Vec<Change>) {
    let rv = |o: &HeldObject| o.resource_version.parse::<u64>().unwrap_or(0);
    let gone_at = |o: &HeldObject| {
        next.versions(kind, Some(&o.namespace))
            .map_or(0, |v| v.listed)
    };
    // Keyed as held (`namespace/name`): no key made per object, per band, per poll.
    let mut old = prev.keyed(kind).peekable();
    let mut new = next.keyed(kind).peekable();
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((a, _)), Some((b, _))) => a.cmp(b),
        };
        match order {
            std::cmp::Ordering::Less => {
                let Some((_, a)) = old.next() else { break };
                out.push(Change::new(gone_at(a), Some(a.clone()), None, at));
            }
            std::cmp::Ordering::Greater => {
                let Some((_, b)) = new.next() else { break };
                out.push(Change::new(rv(b), None, Some(b.clone()), at));
            }
            std::cmp::Ordering::Equal => {
                let (Some((_, a)), Some((_, b))) = (old.next(), new.next()) else {
                    break;
                };
                if !Arc::ptr_eq(a, b) && a.resource_version != b.resource_version {
                    out.push(Change::new(rv(b), Some(a.clone()), Some(b.clone()), at));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
