//! The fleet's state per served object, read off what the followers reported (`state.rs`)
//! against what the hub serves now (`Held`): for each object some follower holds, its
//! served version, how many followers hold each version, and each follower's state —
//! `current` (holds the served version), `updating` (holds another, for less than two of
//! its waits since the hub serves this one), `behind` (for longer), `refused` (its
//! `--validate` or agent refused the served version), `gone` (silent past its wait and a
//! margin: `Fleet::gone`), in that order of precedence: gone, refused, current, behind,
//! updating. Names are shown up to `SHOWN`, refusals up to `SHOWN_REFUSALS`, each with a
//! count of the rest. Also each follower's own state (its worst over its objects) for
//! `/metrics`. `objects` is what an Event per object and version will be written from.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::intake::{By, Holding};
use super::state::{Fleet, Follower};
use crate::poll::hash::Hash;
use crate::serve::held::Held;
use crate::source::Resource;

/// Names shown per list (behind, gone) at most.
pub const SHOWN: usize = 5;
/// Refusals shown per object at most.
pub const SHOWN_REFUSALS: usize = 10;

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
    fn add(&mut self, s: State) {
        *match s {
            State::Current => &mut self.current,
            State::Updating => &mut self.updating,
            State::Behind => &mut self.behind,
            State::Refused => &mut self.refused,
            State::Gone => &mut self.gone,
        } += 1;
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

impl Names {
    fn add(&mut self, name: &str) {
        match self.names.len() < SHOWN {
            true => self.names.push(name.to_string()),
            false => self.more += 1,
        }
    }
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

/// What is kept about one object while the followers are read.
struct Tally {
    served: Hash,
    served_rv: Option<u64>,
    since: Option<Instant>,
    counts: Counts,
    versions: HashMap<Option<Hash>, usize>,
    refused: Vec<Refused>,
    refused_more: usize,
    behind: Names,
    gone: Names,
}

/// `f`'s state about `h`, whose served version is `served`, served since `since`.
fn state_of(
    fleet: &Fleet,
    f: &Follower,
    h: &Holding,
    (served, served_rv): (&Hash, Option<u64>),
    since: Option<Instant>,
    now: Instant,
) -> State {
    // The version served, told by its resourceVersion first (a follower's hash covers only
    // the keys it selects, under its own names), else by the hash.
    let is_served = |hash: Option<&Hash>, rv: Option<u64>| match (rv, served_rv) {
        (Some(rv), Some(s)) => rv == s,
        _ => hash == Some(served),
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
    // Two of its waits since the hub serves this version (or since the follower was
    // last heard from, when the hub's own restart is later: `since` is its first poll).
    let lag = since.map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
    match lag > 2 * f.wait() {
        true => State::Behind,
        false => State::Updating,
    }
}

impl Fleet {
    /// The fleet's state of each object the hub serves that some follower holds, in
    /// (kind, namespace, name) order; and how many followers are in each state (each
    /// follower counted once, by its worst state; one holding nothing served is current
    /// unless gone).
    pub fn objects(&self, held: &Held, now: Instant) -> (Vec<Object>, Counts) {
        let followers = self.read(now);
        let mut tallies: HashMap<(Resource, &str), Tally> = HashMap::new();
        let mut totals = Counts::default();
        let mut names: Vec<(&str, &Follower)> =
            followers.map.iter().map(|(n, f)| (&**n, f)).collect();
        // Names in order, so that the few shown are the same from one view to the next.
        names.sort_unstable_by_key(|(n, _)| *n);
        for (name, f) in names {
            let mut worst = match self.gone(f, now) {
                true => State::Gone,
                false => State::Current,
            };
            for h in f.holds.iter() {
                let (ns, n) = h.names();
                let Some(o) = held.get(h.kind, ns, n) else {
                    continue;
                };
                let t = tallies.entry((h.kind, &h.key)).or_insert_with(|| Tally {
                    served: o.hash,
                    served_rv: o.resource_version.parse().ok(),
                    since: self.served_since(h.kind, &h.key, &o.hash),
                    counts: Counts::default(),
                    versions: HashMap::new(),
                    refused: Vec::new(),
                    refused_more: 0,
                    behind: Names::default(),
                    gone: Names::default(),
                });
                let s = state_of(self, f, h, (&t.served, t.served_rv), t.since, now);
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
                    State::Behind => t.behind.add(name),
                    State::Gone => t.gone.add(name),
                    State::Current | State::Updating => {}
                }
            }
            totals.add(worst);
        }
        let mut objects: Vec<Object> = (tallies.into_iter())
            .map(|((kind, key), t)| {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                let mut versions: Vec<Version> = (t.versions.into_iter())
                    .map(|(h, n)| Version {
                        hash: h.map(|h| h.to_string()),
                        followers: n,
                    })
                    .collect();
                versions.sort_by(|a, b| b.followers.cmp(&a.followers).then(a.hash.cmp(&b.hash)));
                Object {
                    kind: kind.singular(),
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    served: t.served.to_string(),
                    counts: t.counts,
                    versions,
                    refused: t.refused,
                    refused_more: t.refused_more,
                    behind: t.behind,
                    gone: t.gone,
                }
            })
            .collect();
        objects
            .sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
        (objects, totals)
    }

    /// The `fleet` section of the hub's `/status`.
    pub fn status(&self, held: Option<&Held>, now: Instant) -> serde_json::Value {
        let (kept, bytes) = self.size();
        let truncated = (self.read(now).map.values())
            .filter(|f| f.truncated)
            .count();
        let (objects, totals) = match held {
            Some(h) => self.objects(h, now),
            None => (Vec::new(), Counts::default()),
        };
        serde_json::json!({
            "followers": kept,
            "bytes": bytes,
            "truncated": truncated,
            "states": totals,
            "objects": objects,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::intake::{Checked, Refusal};
    use super::*;
    use crate::serve::testing::{item, kinds, poll};

    /// A poll of `team-a`'s objects (name, version), each module's content its version.
    fn held(rvs: &[(&str, u64)]) -> Held {
        use crate::source::{Content, ModuleFile};
        let items = (rvs.iter())
            .map(|(n, rv)| {
                let mut i = item("team-a", n, *rv, &[]);
                i.files = vec![ModuleFile {
                    key: "k".into(),
                    content: Content::Text(rv.to_string()),
                }];
                i
            })
            .collect();
        poll(&Held::empty(kinds()), 1, &[(None, 10)], items)
    }

    fn hash_of(h: &Held, name: &str) -> Hash {
        h.get(Resource::ConfigMaps, "team-a", name).unwrap().hash
    }

    fn holds(name: &str, hash: Option<Hash>, refused: Option<Hash>) -> Checked {
        Checked {
            holds: vec![Holding {
                kind: Resource::ConfigMaps,
                key: format!("team-a/{name}").into(),
                hash,
                resource_version: None,
                refused: refused.map(|h| {
                    Box::new(Refusal {
                        hash: h,
                        resource_version: None,
                        by: By::Confirm,
                        reason: "agent said no".into(),
                    })
                }),
            }],
            truncated: false,
        }
    }

    /// A follower whose hash covers other keys (`--keys`) or names (a flat layout's) than
    /// the hub's is told by the resourceVersion it reports: current at the served one,
    /// refused when its refusal names it; without one, by the hash.
    #[test]
    fn a_follower_is_told_by_the_resource_version_it_holds() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        let v = held(&[("x", 5)]);
        fleet.served(&v, t0);
        let own = Hash([9; 32]);
        let with_rv = |rv: u64, refused: Option<u64>| {
            let mut c = holds("x", Some(own), refused.map(|_| own));
            c.holds[0].resource_version = Some(rv);
            if let (Some(r), Some(rv)) = (c.holds[0].refused.as_mut(), refused) {
                r.resource_version = Some(rv);
            }
            c
        };
        fleet.take("a", Some(10), with_rv(5, None), t0);
        fleet.take("b", Some(10), with_rv(4, Some(5)), t0);
        fleet.take("c", Some(10), with_rv(4, None), t0);
        fleet.take("d", Some(10), holds("x", Some(own), None), t0);
        let c = fleet.objects(&v, t0).0[0].counts;
        assert_eq!((c.current, c.refused, c.updating), (1, 1, 2), "{c:?}");
    }

    /// The counts per version and state; behind only after two of the follower's waits
    /// since the hub serves the version; gone after its wait and the margin.
    #[test]
    fn counts_behind_after_two_intervals_and_gone() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let fleet = Fleet::new(t0);
        let v1 = held(&[("x", 5)]);
        fleet.served(&v1, t0);
        let old = hash_of(&v1, "x");
        for i in 0..4 {
            fleet.take(
                &format!("node-{i}"),
                Some(10),
                holds("x", Some(old), None),
                t0,
            );
        }
        let (objects, totals) = fleet.objects(&v1, t0);
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0].counts.current, 4);
        assert_eq!(totals.current, 4);
        // A new version, served from t=100: node-0 takes it, node-1 refuses it, node-2
        // reports nothing new, node-3 stops being heard from.
        let v2 = held(&[("x", 6)]);
        fleet.served(&v2, at(100));
        let new = hash_of(&v2, "x");
        assert_ne!(old, new);
        for i in 0..3 {
            fleet.seen_name(&format!("node-{i}"), None, at(100));
        }
        fleet.take("node-0", None, holds("x", Some(new), None), at(101));
        fleet.take("node-1", None, holds("x", Some(old), Some(new)), at(101));
        let (o, _) = fleet.objects(&v2, at(110));
        let c = o[0].counts;
        assert_eq!(
            (c.current, c.refused, c.updating, c.gone, c.behind),
            (1, 1, 1, 1, 0)
        );
        assert_eq!(o[0].served, new.to_string());
        assert_eq!(o[0].refused[0].follower, "node-1");
        assert_eq!(
            (o[0].refused[0].by, &*o[0].refused[0].reason),
            ("confirm", "agent said no")
        );
        assert_eq!(o[0].gone.names, ["node-3"]);
        let v: Vec<_> = o[0]
            .versions
            .iter()
            .map(|v| (v.hash.clone(), v.followers))
            .collect();
        assert_eq!(v, [(Some(old.to_string()), 3), (Some(new.to_string()), 1)]);
        // Two waits (20 s) after t=100, node-2 is behind (heard from meanwhile).
        for i in 0..3 {
            fleet.seen_name(&format!("node-{i}"), None, at(120));
        }
        let (o, _) = fleet.objects(&v2, at(120));
        assert_eq!(o[0].counts.behind, 0, "not more than two waits yet");
        let (o, totals) = fleet.objects(&v2, at(121));
        assert_eq!(o[0].counts.behind, 1);
        assert_eq!(o[0].behind.names, ["node-2"]);
        assert_eq!(
            (totals.current, totals.refused, totals.behind, totals.gone),
            (1, 1, 1, 1)
        );
    }

    /// An object no follower holds is not shown; one the hub no longer serves neither.
    #[test]
    fn only_served_objects_that_followers_hold() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        let v = held(&[("x", 5), ("y", 6)]);
        fleet.served(&v, t0);
        fleet.take(
            "a",
            None,
            holds("gone-object", Some(Hash([0; 32])), None),
            t0,
        );
        fleet.take("b", None, holds("x", Some(hash_of(&v, "x")), None), t0);
        let (o, totals) = fleet.objects(&v, t0);
        assert_eq!(o.iter().map(|o| &*o.name).collect::<Vec<_>>(), ["x"]);
        assert_eq!(totals.current, 2);
    }

    /// Names are shown up to `SHOWN`, with a count of the rest.
    #[test]
    fn names_are_bounded() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        let v = held(&[("x", 5)]);
        fleet.served(&v, t0);
        for i in 0..12 {
            fleet.take(
                &format!("n{i:02}"),
                Some(1),
                holds("x", Some(Hash([0; 32])), None),
                t0,
            );
        }
        let (o, _) = fleet.objects(&v, t0 + Duration::from_secs(30));
        assert_eq!(o[0].counts.behind, 12);
        assert_eq!(o[0].behind.names, ["n00", "n01", "n02", "n03", "n04"]);
        assert_eq!(o[0].behind.more, 7);
        let (o, _) = fleet.objects(&v, t0 + Duration::from_secs(62));
        assert_eq!((o[0].counts.gone, o[0].gone.more), (12, 7));
    }
}
