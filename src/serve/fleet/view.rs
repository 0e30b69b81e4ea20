//! The fleet's state per served object, read off the followers' scopes and exceptions
//! (`state.rs`) against what the hub serves now (`Held`): for each object some follower
//! follows, its served version, how many followers hold each version, and each
//! follower's state — `current` (its watch has the served version, or it reported
//! holding it), `updating` (not yet, for less than two of its waits since the hub serves
//! this one), `behind` (for longer), `refused` (it reported its `--validate` or its agent
//! refused the served version), `gone` (silent past its wait and a margin:
//! `Fleet::gone`); a follower's reported exception about an object stands in place of
//! what its watch says, in that order of precedence: gone, refused, current, behind,
//! updating. A follower follows the objects its scopes select (its watch's namespace and
//! selectors: one whose own `--keys` select nothing of an object holds that version of
//! it, empty). Names are shown up to `SHOWN`, refusals up to `SHOWN_REFUSALS`, each with
//! a count of the rest. Also each follower's own state (its worst over its objects) for
//! `/metrics`. `objects` is what an Event per object and version is written from
//! (`Which::Refused`: only what it needs).
//!
//! Cost: followers are grouped into classes (one scope at one position, one wait, gone
//! or not) and each class is matched against the objects once: objects × classes, not
//! objects × followers, and exceptions one by one.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::intake::{By, Holding};
use super::state::{Fleet, Follower, Served, ServedSince};
use crate::poll::hash::Hash;
use crate::serve::held::{Held, HeldObject};
use crate::serve::watch::Filter;
use crate::source::Resource;

/// Names shown per list (behind, gone) at most.
pub const SHOWN: usize = 5;
/// Refusals shown per object at most.
pub const SHOWN_REFUSALS: usize = 10;

/// Object visits one view makes at most, matching its followers' filters and counting
/// their classes (some 4 million: a fleet of 10,000 objects on a few selectors uses a
/// hundredth of it).
pub const MATCHES: usize = 1 << 22;

/// A follower's state about one object, or its own (its worst).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Current,
    Updating,
    Behind,
    Refused,
    Gone,
}

impl State {
    pub const ALL: [State; 5] = [
        State::Current,
        State::Updating,
        State::Behind,
        State::Refused,
        State::Gone,
    ];

    pub fn word(self) -> &'static str {
        match self {
            State::Current => "current",
            State::Updating => "updating",
            State::Behind => "behind",
            State::Refused => "refused",
            State::Gone => "gone",
        }
    }
}

/// Followers per state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub current: usize,
    pub updating: usize,
    pub behind: usize,
    pub refused: usize,
    pub gone: usize,
}

impl Counts {
    fn slot(&mut self, s: State) -> &mut usize {
        match s {
            State::Current => &mut self.current,
            State::Updating => &mut self.updating,
            State::Behind => &mut self.behind,
            State::Refused => &mut self.refused,
            State::Gone => &mut self.gone,
        }
    }

    fn add(&mut self, s: State) {
        self.add_n(s, 1);
    }

    fn add_n(&mut self, s: State, n: usize) {
        *self.slot(s) += n;
    }

    fn sub(&mut self, s: State) {
        let n = self.slot(s);
        *n = n.saturating_sub(1);
    }

    pub fn get(&self, s: State) -> usize {
        match s {
            State::Current => self.current,
            State::Updating => self.updating,
            State::Behind => self.behind,
            State::Refused => self.refused,
            State::Gone => self.gone,
        }
    }
}

/// One follower's refusal of the served version, as shown.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Refused {
    pub follower: String,
    pub by: &'static str,
    pub reason: String,
}

/// Some names, and how many more there are.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Names {
    pub names: Vec<String>,
    pub more: usize,
}

/// A version and how many followers hold it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Version {
    /// `None`: they hold none (a new module they refused).
    pub hash: Option<String>,
    pub followers: usize,
}

/// The fleet's state of one served object.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Object {
    /// `configmap`, `secret`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// The version the hub serves.
    pub served: String,
    pub counts: Counts,
    /// Each version held, most held first.
    pub versions: Vec<Version>,
    pub refused: Vec<Refused>,
    #[serde(rename = "refusedMore")]
    pub refused_more: usize,
    pub behind: Names,
    pub gone: Names,
}

/// The fleet's state.
#[derive(Debug, Default)]
pub struct View {
    pub objects: Vec<Object>,
    pub totals: Counts,
    /// Followers left out by the view's budget (`MATCHES`).
    pub unread: usize,
}

/// Which objects a view reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// Every object some follower follows.
    All,
    /// Only those whose served version some follower refused (what the Events tell).
    Refused,
}

/// An object's key while the view is made: its kind, namespace and name.
type Key<'a> = (Resource, &'a str, &'a str);

/// Followers the same to the view: one scope (its filter), at one position, with one
/// wait, gone or not — a fleet of followers on one selector is a class or two, so a
/// view costs objects × classes, not objects × followers.
struct Class<'a> {
    filter: &'a Filter,
    /// Its filter in words (`Scope::key`).
    key: &'a str,
    position: u64,
    wait: Duration,
    gone: bool,
    count: usize,
    /// The first of its followers by name (for the names shown).
    names: Vec<&'a str>,
    /// Its worst state over the objects it follows.
    worst: State,
}

/// What is kept about one object while the followers are read.
struct Tally<'a> {
    served: Served,
    counts: Counts,
    versions: HashMap<Option<Hash>, usize>,
    refused: Vec<Refused>,
    refused_more: usize,
    /// Classes behind, or gone, on it.
    behind: Vec<usize>,
    gone: Vec<usize>,
    /// Followers it has an exception of, and the names behind or gone by theirs.
    excepted: HashSet<&'a str>,
    behind_named: Vec<&'a str>,
    gone_named: Vec<&'a str>,
}

impl Tally<'_> {
    fn new(served: Served) -> Self {
        Tally {
            served,
            counts: Counts::default(),
            versions: HashMap::new(),
            refused: Vec::new(),
            refused_more: 0,
            behind: Vec::new(),
            gone: Vec::new(),
            excepted: HashSet::new(),
            behind_named: Vec::new(),
            gone_named: Vec::new(),
        }
    }
}

/// The state of a follower whose scope is at `position`, with `wait`, about an object
/// served as `served`: current once its watch has the version (`Served::from`), else
/// updating for two of its waits since the hub serves it, then behind.
fn by_position(position: u64, wait: Duration, gone: bool, served: &Served, now: Instant) -> State {
    if gone {
        return State::Gone;
    }
    if position >= served.from {
        return State::Current;
    }
    lagging(wait, served, now)
}

/// Updating, or behind once two of `wait` passed since the hub serves `served`.
fn lagging(wait: Duration, served: &Served, now: Instant) -> State {
    match now.saturating_duration_since(served.since) > 2 * wait {
        true => State::Behind,
        false => State::Updating,
    }
}

/// `f`'s state about `h`, an exception it reported, whose served version is `served`.
fn by_exception(fleet: &Fleet, f: &Follower, h: &Holding, served: &Served, now: Instant) -> State {
    // The version served, told by its resourceVersion first (a follower's hash covers only
    // the keys it selects, under its own names), else by the hash.
    let is_served = |hash: Option<&Hash>, rv: Option<u64>| match rv {
        Some(rv) => rv == served.rv,
        None => hash == Some(&served.hash),
    };
    if fleet.gone(f, now) {
        return State::Gone;
    }
    if (h.refused.as_ref()).is_some_and(|r| is_served(Some(&r.hash), r.resource_version)) {
        return State::Refused;
    }
    if is_served(h.hash.as_ref(), h.resource_version) {
        return State::Current;
    }
    lagging(f.wait(), served, now)
}

/// The view being made: followers by name, the classes, each object's tally.
struct Making<'a> {
    fleet: &'a Fleet,
    held: &'a Held,
    served: &'a ServedSince,
    now: Instant,
    /// With `Which::Refused`, the objects to read.
    only: Option<HashSet<Key<'a>>>,
    classes: Vec<Class<'a>>,
    /// Each follower's classes (in name order): `spans[i]` of `of`.
    of: Vec<usize>,
    spans: Vec<(usize, usize)>,
    tallies: HashMap<Key<'a>, Tally<'a>>,
    /// Followers left out of the counts by the view's budget, and what is left of it.
    unread: usize,
    budget: usize,
}

impl<'a> Making<'a> {
    /// The tally of `o`, made when first met (`None`: not served, or not read).
    fn tally(&mut self, kind: Resource, o: &'a HeldObject) -> Option<&mut Tally<'a>> {
        let key = (kind, o.namespace.as_str(), o.name.as_str());
        if self.only.as_ref().is_some_and(|only| !only.contains(&key)) {
            return None;
        }
        if !self.tallies.contains_key(&key) {
            let served = self.served[kind.index()].get(o.key().as_str())?;
            self.tallies.insert(key, Tally::new(*served));
        }
        self.tallies.get_mut(&key)
    }

    /// Each follower into its classes (`followers` in name order).
    fn classes(&mut self, followers: &[(&'a str, &'a Follower)]) {
        let mut index: HashMap<(&str, u64, Duration, bool), usize> = HashMap::new();
        for (name, f) in followers {
            let (wait, gone) = (f.wait(), self.fleet.gone(f, self.now));
            let start = self.of.len();
            for s in &f.scopes {
                let key = (&*s.key, s.position(), wait, gone);
                let i = *index.entry(key).or_insert_with(|| {
                    self.classes.push(Class {
                        filter: &s.filter,
                        key: &s.key,
                        position: s.position(),
                        wait,
                        gone,
                        count: 0,
                        names: Vec::new(),
                        worst: State::Current,
                    });
                    self.classes.len() - 1
                });
                let c = &mut self.classes[i];
                c.count += 1;
                if c.names.len() < 2 * SHOWN {
                    c.names.push(name);
                }
                self.of.push(i);
            }
            self.spans.push((start, self.of.len()));
        }
    }

    /// Each class counted on each object its filter selects (each filter matched against
    /// the objects once, when first needed): the classes most followed first, within the
    /// view's budget of object visits; the followers of those left (many scopes of few
    /// followers each: not a fleet) are counted as `unread`.
    fn count_classes(&mut self) {
        let mut matched: HashMap<&'a str, Vec<(Resource, &'a HeldObject)>> = HashMap::new();
        let mut order: Vec<usize> = (0..self.classes.len()).collect();
        order.sort_by_key(|i| std::cmp::Reverse(self.classes[*i].count));
        for i in order {
            let c = &self.classes[i];
            let (key, filter, count) = (c.key, c.filter, c.count);
            if !matched.contains_key(key) {
                match self.select(filter) {
                    Some(objects) => matched.insert(key, objects),
                    None => {
                        self.unread += count;
                        continue;
                    }
                };
            }
            let objects = &matched[key];
            if objects.len() > self.budget {
                self.unread += count;
                continue;
            }
            self.budget -= objects.len();
            let c = &self.classes[i];
            let (position, wait, gone) = (c.position, c.wait, c.gone);
            let mut worst = State::Current;
            for (kind, o) in objects {
                let now = self.now;
                let Some(t) = self.tally(*kind, o) else {
                    continue;
                };
                let s = by_position(position, wait, gone, &t.served, now);
                worst = worst.max(s);
                t.counts.add_n(s, count);
                match s {
                    State::Current => *t.versions.entry(Some(t.served.hash)).or_default() += count,
                    State::Behind => t.behind.push(i),
                    State::Gone => t.gone.push(i),
                    State::Updating | State::Refused => {}
                }
            }
            self.classes[i].worst = worst;
        }
    }

    /// The objects `filter` selects, of those read, from the budget (`None`: past it).
    fn select(&mut self, filter: &'a Filter) -> Option<Vec<(Resource, &'a HeldObject)>> {
        let held = self.held;
        let candidates: Vec<&'a HeldObject> = match &self.only {
            Some(only) => (only.iter())
                .filter(|(kind, _, _)| *kind == filter.kind)
                .filter_map(|(kind, ns, name)| held.get(*kind, ns, name))
                .map(|o| &**o)
                .collect(),
            None => (held.objects(filter.kind, filter.namespace.as_deref()))
                .map(|o| &**o)
                .collect(),
        };
        self.budget = self.budget.checked_sub(candidates.len())?;
        let selected = (candidates.into_iter())
            .filter(|o| filter.passes(o))
            .map(|o| (filter.kind, o))
            .collect();
        Some(selected)
    }

    /// `f`'s exceptions, each in place of what its scopes say of that object; its worst
    /// state over them.
    fn exceptions(&mut self, name: &'a str, f: &'a Follower) -> State {
        let mut worst = State::Current;
        let (now, fleet, held) = (self.now, self.fleet, self.held);
        for h in f.holds.iter() {
            let (ns, n) = h.names();
            let Some(o) = held.get(h.kind, ns, n) else {
                continue;
            };
            // What its scopes say of it, taken back: the newest of those that follow it.
            let base = (f.scopes.iter())
                .filter(|s| s.filter.kind == h.kind && s.filter.passes(o))
                .map(|s| s.position())
                .max();
            let gone = fleet.gone(f, now);
            let Some(t) = self.tally(h.kind, o) else {
                continue;
            };
            if let Some(position) = base {
                let s = by_position(position, f.wait(), gone, &t.served, now);
                t.counts.sub(s);
                if s == State::Current {
                    let n = t.versions.entry(Some(t.served.hash)).or_default();
                    *n = n.saturating_sub(1);
                }
            }
            t.excepted.insert(name);
            let s = by_exception(fleet, f, h, &t.served, now);
            worst = worst.max(s);
            t.counts.add(s);
            *t.versions.entry(h.hash).or_default() += 1;
            match s {
                State::Refused if t.refused.len() < SHOWN_REFUSALS => {
                    let r = h.refused.as_ref().map(|r| (r.by, r.reason.to_string()));
                    let (by, reason) = r.unwrap_or((By::Validate, String::new()));
                    t.refused.push(Refused {
                        follower: name.to_string(),
                        by: by.word(),
                        reason,
                    });
                }
                State::Refused => t.refused_more += 1,
                State::Behind => t.behind_named.push(name),
                State::Gone => t.gone_named.push(name),
                State::Current | State::Updating => {}
            }
        }
        worst
    }

    /// The names shown of the classes `classes` and the followers `named`, but those
    /// excepted: in order, at most `SHOWN`, with how many more there are of `all`.
    fn names(
        &self,
        classes: &[usize],
        named: &[&str],
        excepted: &HashSet<&str>,
        all: usize,
    ) -> Names {
        let mut names: Vec<&str> = (classes.iter())
            .flat_map(|i| self.classes[*i].names.iter().copied())
            .filter(|n| !excepted.contains(n))
            .chain(named.iter().copied())
            .collect();
        names.sort_unstable();
        names.dedup();
        names.truncate(SHOWN);
        Names {
            more: all.saturating_sub(names.len()),
            names: names.into_iter().map(str::to_string).collect(),
        }
    }
}

impl Fleet {
    /// The fleet's state of each object the hub serves that some follower follows (or, with
    /// `Which::Refused`, of those some follower refused), in (kind, namespace, name)
    /// order; and how many followers are in each state (each follower counted once, by its
    /// worst state; one following nothing served is current unless gone).
    pub fn objects(&self, held: &Held, now: Instant, which: Which) -> (Vec<Object>, Counts) {
        let v = self.view(held, now, which);
        (v.objects, v.totals)
    }

    /// `objects`, and how many followers the view's budget left out (`MATCHES`).
    pub fn view(&self, held: &Held, now: Instant, which: Which) -> View {
        self.view_within(held, now, which, MATCHES)
    }

    /// `view`, within `budget` object visits.
    fn view_within(&self, held: &Held, now: Instant, which: Which, budget: usize) -> View {
        let followers = self.read(now);
        let mut by_name: Vec<(&str, &Follower)> =
            followers.map.iter().map(|(n, f)| (&**n, f)).collect();
        let only = match which {
            Which::All => None,
            Which::Refused => {
                let only = refused(self, held, &by_name, now);
                if only.is_empty() {
                    return View::default();
                }
                Some(only)
            }
        };
        // Names in order, so that the few shown are the same from one view to the next.
        by_name.sort_unstable_by_key(|(n, _)| *n);
        self.served_now(|served| {
            let mut m = Making {
                fleet: self,
                held,
                served,
                now,
                only,
                classes: Vec::new(),
                of: Vec::new(),
                spans: Vec::new(),
                tallies: HashMap::new(),
                unread: 0,
                budget,
            };
            m.classes(&by_name);
            m.count_classes();
            let mut totals = Counts::default();
            for (i, (name, f)) in by_name.iter().enumerate() {
                let mut worst = match self.gone(f, now) {
                    true => State::Gone,
                    false => State::Current,
                };
                worst = worst.max(m.exceptions(name, f));
                let (from, to) = m.spans[i];
                for c in &m.of[from..to] {
                    worst = worst.max(m.classes[*c].worst);
                }
                totals.add(worst);
            }
            View {
                objects: m.made(),
                totals,
                unread: m.unread,
            }
        })
    }
}

/// The objects whose served version some follower, not gone, refused.
fn refused<'a>(
    fleet: &Fleet,
    held: &'a Held,
    followers: &[(&str, &Follower)],
    now: Instant,
) -> HashSet<Key<'a>> {
    let mut out = HashSet::new();
    fleet.served_now(|served| {
        for (_, f) in followers.iter().filter(|(_, f)| !f.holds.is_empty()) {
            for h in f.holds.iter().filter(|h| h.refused.is_some()) {
                let (ns, n) = h.names();
                let Some(o) = held.get(h.kind, ns, n) else {
                    continue;
                };
                let Some(s) = served[h.kind.index()].get(&*h.key) else {
                    continue;
                };
                if by_exception(fleet, f, h, s, now) == State::Refused {
                    out.insert((h.kind, o.namespace.as_str(), o.name.as_str()));
                }
            }
        }
    });
    out
}

impl Making<'_> {
    /// The objects, in (kind, namespace, name) order.
    fn made(&self) -> Vec<Object> {
        let mut objects: Vec<Object> = (self.tallies.iter())
            .map(|((kind, ns, name), t)| {
                let mut versions: Vec<Version> = (t.versions.iter())
                    .filter(|(_, n)| **n > 0)
                    .map(|(h, n)| Version {
                        hash: h.map(|h| h.to_string()),
                        followers: *n,
                    })
                    .collect();
                versions.sort_by(|a, b| b.followers.cmp(&a.followers).then(a.hash.cmp(&b.hash)));
                Object {
                    kind: kind.singular(),
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    served: t.served.hash.to_string(),
                    counts: t.counts,
                    versions,
                    refused: t.refused.clone(),
                    refused_more: t.refused_more,
                    behind: self.names(&t.behind, &t.behind_named, &t.excepted, t.counts.behind),
                    gone: self.names(&t.gone, &t.gone_named, &t.excepted, t.counts.gone),
                }
            })
            .collect();
        objects
            .sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
        objects
    }
}

impl Fleet {
    /// The `fleet` section of the hub's `/status`.
    pub fn status(&self, held: Option<&Held>, now: Instant) -> serde_json::Value {
        let (kept, bytes) = self.size();
        let truncated = (self.read(now).map.values())
            .filter(|f| f.truncated)
            .count();
        let v = match held {
            Some(h) => self.view(h, now, Which::All),
            None => View::default(),
        };
        serde_json::json!({
            "followers": kept,
            "bytes": bytes,
            "truncated": truncated,
            "unread": v.unread,
            "states": v.totals,
            "objects": v.objects,
        })
    }
}

#[cfg(test)]
mod tests;
