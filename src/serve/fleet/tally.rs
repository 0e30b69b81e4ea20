//! The fleet's state made (`view.rs` says what it is): each follower's state about each
//! object its scopes select, read off how far its watch came, and its reported exceptions
//! in place of that.
//!
//! Followers are grouped into classes — the same scopes at the same positions, one wait,
//! gone or not: a fleet on one selector is one class, two while a change spreads — and
//! each filter is matched against the objects once, each class counted on what its scopes
//! select (an object two of a follower's scopes select counts once, at the newest of their
//! positions), then the exceptions one by one: objects × classes, not objects ×
//! followers. Within `view::MATCHES` object visits in all, the classes most followed
//! first; the followers of those left (many scopes of few followers each: not a fleet)
//! are `unread`, in no state.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::intake::{By, Holding};
use super::state::{Fleet, Follower, Served, ServedSince};
use super::view::{
    Counts, MATCHES, Names, Object, Refused, SHOWN, SHOWN_REFUSALS, State, Version, View, Which,
};
use crate::poll::hash::Hash;
use crate::serve::held::{Held, HeldObject};
use crate::serve::watch::Filter;
use crate::source::Resource;

/// An object's key while the view is made: its kind, namespace and name.
type Key<'a> = (Resource, &'a str, &'a str);

/// What makes followers one class: their scopes' words and positions, their wait, gone.
type ClassKey<'a> = (Vec<(&'a str, u64)>, Duration, bool);

/// Followers the same to the view.
struct Class<'a> {
    /// Their scopes: filter, its words (`Scope::key`), position.
    scopes: Vec<(&'a Filter, &'a str, u64)>,
    wait: Duration,
    gone: bool,
    count: usize,
    /// The first of its followers by name (for the names shown).
    names: Vec<&'a str>,
    /// Its worst state over the objects it follows.
    worst: State,
    /// Whether the view's budget went as far as it.
    counted: bool,
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

/// The view being made: the classes, each follower's, each object's tally.
struct Making<'a> {
    fleet: &'a Fleet,
    held: &'a Held,
    served: &'a ServedSince,
    now: Instant,
    /// With `Which::Refused`, the objects to read.
    only: Option<HashSet<Key<'a>>>,
    classes: Vec<Class<'a>>,
    /// Each follower's class (in name order; `None`: it follows no scope).
    class_of: Vec<Option<usize>>,
    tallies: HashMap<Key<'a>, Tally<'a>>,
    /// What is left of the view's budget.
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

    /// Each follower into its class (`followers` in name order).
    fn classes(&mut self, followers: &[(&'a str, &'a Follower)]) {
        let mut index: HashMap<ClassKey<'a>, usize> = HashMap::new();
        for (name, f) in followers {
            if f.scopes.is_empty() {
                self.class_of.push(None);
                continue;
            }
            let (wait, gone) = (f.wait(), self.fleet.gone(f, self.now));
            let mut scopes: Vec<(&'a Filter, &'a str, u64)> = (f.scopes.iter())
                .map(|s| (&s.filter, &*s.key, s.position()))
                .collect();
            scopes.sort_unstable_by(|a, b| (a.1, a.2).cmp(&(b.1, b.2)));
            let key = (
                scopes.iter().map(|(_, k, p)| (*k, *p)).collect(),
                wait,
                gone,
            );
            let i = *index.entry(key).or_insert_with(|| {
                self.classes.push(Class {
                    scopes,
                    wait,
                    gone,
                    count: 0,
                    names: Vec::new(),
                    worst: State::Current,
                    counted: false,
                });
                self.classes.len() - 1
            });
            let c = &mut self.classes[i];
            c.count += 1;
            if c.names.len() < 2 * SHOWN {
                c.names.push(name);
            }
            self.class_of.push(Some(i));
        }
    }

    /// Each class counted on each object its scopes select (each filter matched once,
    /// when first needed), the classes most followed first, within the budget.
    fn count_classes(&mut self) {
        let mut matched: HashMap<&'a str, Vec<(Resource, &'a HeldObject)>> = HashMap::new();
        let mut order: Vec<usize> = (0..self.classes.len()).collect();
        order.sort_by_key(|i| std::cmp::Reverse(self.classes[*i].count));
        for i in order {
            let scopes = self.classes[i].scopes.clone();
            let mut fits = true;
            for (filter, key, _) in &scopes {
                if !matched.contains_key(key) {
                    match self.select(filter) {
                        Some(objects) => matched.insert(key, objects),
                        None => {
                            fits = false;
                            break;
                        }
                    };
                }
            }
            if !fits {
                continue;
            }
            let visits: usize = (scopes.iter())
                .map(|(_, k, _)| matched.get(k).map_or(0, Vec::len))
                .sum();
            if visits > self.budget {
                continue;
            }
            self.budget -= visits;
            // Each object once, at the newest position of the scopes that select it.
            let mut at: HashMap<Key<'a>, (&'a HeldObject, u64)> = HashMap::new();
            for (_, key, position) in &scopes {
                for (kind, o) in matched.get(key).into_iter().flatten() {
                    let k = (*kind, o.namespace.as_str(), o.name.as_str());
                    let e = at.entry(k).or_insert((*o, *position));
                    e.1 = e.1.max(*position);
                }
            }
            self.count_class(i, at);
        }
    }

    /// Class `i` counted on each object it follows, `at` its position for it.
    fn count_class(&mut self, i: usize, at: HashMap<Key<'a>, (&'a HeldObject, u64)>) {
        let c = &self.classes[i];
        let (wait, gone, count, now) = (c.wait, c.gone, c.count, self.now);
        let mut worst = State::Current;
        for ((kind, _, _), (o, position)) in at {
            let Some(t) = self.tally(kind, o) else {
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
        let c = &mut self.classes[i];
        c.worst = worst;
        c.counted = true;
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

    /// `f`'s exceptions (its class `class`), each in place of what its scopes say of that
    /// object; its worst state over them.
    fn exceptions(&mut self, name: &'a str, f: &'a Follower, class: Option<usize>) -> State {
        let mut worst = State::Current;
        let (now, fleet, held) = (self.now, self.fleet, self.held);
        // Its class as the view took it (the server's thread moves positions on meanwhile).
        let class = class.map(|c| &self.classes[c]);
        if class.is_some_and(|c| !c.counted) {
            // Past the view's budget: unread, in no state.
            return worst;
        }
        let taken = class.map(|c| (c.scopes.clone(), c.wait, c.gone));
        for h in f.holds.iter() {
            let (ns, n) = h.names();
            let Some(o) = held.get(h.kind, ns, n) else {
                continue;
            };
            // What its class counted of it, taken back: at the newest of its scopes that
            // select it.
            let base = taken.as_ref().and_then(|(scopes, wait, gone)| {
                let position = (scopes.iter())
                    .filter(|(filter, _, _)| filter.kind == h.kind && filter.passes(o))
                    .map(|(_, _, position)| *position)
                    .max()?;
                Some((position, *wait, *gone))
            });
            let Some(t) = self.tally(h.kind, o) else {
                continue;
            };
            if let Some((position, wait, gone)) = base {
                let s = by_position(position, wait, gone, &t.served, now);
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
    pub(in crate::serve::fleet) fn view_within(
        &self,
        held: &Held,
        now: Instant,
        which: Which,
        budget: usize,
    ) -> View {
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
                class_of: Vec::new(),
                tallies: HashMap::new(),
                budget,
            };
            m.classes(&by_name);
            m.count_classes();
            let (mut totals, mut unread) = (Counts::default(), 0);
            for (i, (name, f)) in by_name.iter().enumerate() {
                let class = m.class_of[i];
                let mut worst = match self.gone(f, now) {
                    true => State::Gone,
                    false => State::Current,
                };
                worst = worst.max(m.exceptions(name, f, class));
                match class.map(|c| &m.classes[c]) {
                    Some(c) if !c.counted => unread += 1,
                    Some(c) => totals.add(worst.max(c.worst)),
                    None => totals.add(worst),
                }
            }
            View {
                objects: m.made(),
                totals,
                unread,
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
