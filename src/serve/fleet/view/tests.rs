use std::time::{Duration, Instant};

use super::super::intake::{By, Checked, Holding, Refusal};
use super::*;
use crate::poll::hash::Hash;
use crate::serve::fleet::state::Scope;
use crate::serve::testing::{filter, item, kinds, poll};
use crate::source::Resource;
use std::sync::Arc;

/// A poll of `team-a`'s objects (name, version), listed at the hub's version `at`, each
/// module's content its version.
fn held_at(at: u64, rvs: &[(&str, u64)]) -> Held {
    use crate::source::{Content, ModuleFile};
    let items = (rvs.iter())
        .map(|(n, rv)| {
            let mut i = item("team-a", n, *rv, &[("team", n)]);
            i.files = vec![ModuleFile {
                key: "k".into(),
                content: Content::Text(rv.to_string()),
            }];
            i
        })
        .collect();
    poll(&Held::empty(kinds()), 1, &[(None, at)], items)
}

fn held(rvs: &[(&str, u64)]) -> Held {
    held_at(10, rvs)
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

/// `name` follows every configmap of `team-a` from the hub's version `position`.
fn watches(fleet: &Fleet, name: &str, position: u64, wait: u64, now: Instant) {
    let f = filter("/api/v1/namespaces/team-a/configmaps", "");
    fleet
        .following(
            name,
            Arc::new(Scope::new(f.clone(), position)),
            Some(wait),
            now,
        )
        .unwrap();
}

/// A follower is current once its watch has the hub's version the served one came with,
/// updating before, behind after two of its waits since the hub serves it; a follower
/// whose hash covers other keys (`--keys`) reports nothing and is current by its watch.
#[test]
fn a_follower_is_current_once_its_watch_has_the_version() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let fleet = Fleet::new(t0);
    let v1 = held_at(10, &[("x", 5)]);
    fleet.served(&v1, t0);
    for i in 0..3 {
        watches(&fleet, &format!("node-{i}"), 10, 10, t0);
    }
    let (o, totals) = fleet.objects(&v1, t0, Which::All);
    assert_eq!((o.len(), o[0].counts.current, totals.current), (1, 3, 3));
    // A new version at the hub's version 20: node-0's watch has it, the others not yet.
    let v2 = held_at(20, &[("x", 15)]);
    fleet.served(&v2, at(100));
    watches(&fleet, "node-0", 20, 10, at(100));
    for i in 1..3 {
        fleet.seen_name(&format!("node-{i}"), None, at(100));
    }
    let (o, _) = fleet.objects(&v2, at(110), Which::All);
    let c = o[0].counts;
    assert_eq!((c.current, c.updating, c.behind), (1, 2, 0), "{c:?}");
    let v: Vec<_> = (o[0].versions.iter())
        .map(|v| (v.hash.clone(), v.followers))
        .collect();
    assert_eq!(v, [(Some(hash_of(&v2, "x").to_string()), 1)]);
    // The version at 19 is not enough; at 20 it is.
    watches(&fleet, "node-1", 19, 10, at(110));
    for i in 0..3 {
        fleet.seen_name(&format!("node-{i}"), None, at(121));
    }
    let (o, totals) = fleet.objects(&v2, at(121), Which::All);
    let c = o[0].counts;
    assert_eq!((c.current, c.behind), (1, 2), "{c:?}");
    assert_eq!(o[0].behind.names, ["node-1", "node-2"]);
    assert_eq!((totals.current, totals.behind), (1, 2));
    watches(&fleet, "node-1", 20, 10, at(121));
    let (o, _) = fleet.objects(&v2, at(121), Which::All);
    assert_eq!((o[0].counts.current, o[0].counts.behind), (2, 1));
}

/// A version the hub publishes later than its resourceVersion (its `--validate` passed it
/// then) is had from the hub's version that published it, not from its own.
#[test]
fn a_version_published_late_is_had_from_the_hubs_version_then() {
    let t0 = Instant::now();
    let fleet = Fleet::new(t0);
    let v = held_at(30, &[("x", 5)]);
    fleet.served(&v, t0);
    watches(&fleet, "node-0", 29, 10, t0);
    watches(&fleet, "node-1", 30, 10, t0);
    let (o, _) = fleet.objects(&v, t0, Which::All);
    assert_eq!((o[0].counts.current, o[0].counts.updating), (1, 1));
}

/// A reported exception stands in place of what the follower's watch says of that object:
/// a refusal of the served version (told by the resourceVersion first, else the hash), a
/// version held instead; the counts, versions and names say so.
#[test]
fn an_exception_stands_in_place_of_the_watch() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let fleet = Fleet::new(t0);
    let v = held_at(10, &[("x", 5)]);
    fleet.served(&v, t0);
    let (served, own) = (hash_of(&v, "x"), Hash([9; 32]));
    for i in 0..5 {
        watches(&fleet, &format!("node-{i}"), 10, 10, t0);
    }
    // node-0 refused it (by its resourceVersion), node-1 too (by its hash), node-2 refused
    // another version (rv 4), node-3 holds an older one.
    let mut by_rv = holds("x", Some(own), Some(own));
    by_rv.holds[0].refused.as_mut().unwrap().resource_version = Some(5);
    fleet.take("node-0", None, by_rv, t0);
    fleet.take("node-1", None, holds("x", None, Some(served)), t0);
    let mut other = holds("x", Some(own), Some(own));
    other.holds[0].refused.as_mut().unwrap().resource_version = Some(4);
    fleet.take("node-2", None, other, t0);
    fleet.take("node-3", None, holds("x", Some(own), None), t0);
    let (o, totals) = fleet.objects(&v, at(5), Which::All);
    let c = o[0].counts;
    assert_eq!(
        (c.current, c.refused, c.updating, c.behind),
        (1, 2, 2, 0),
        "{c:?}"
    );
    let refused: Vec<&str> = o[0].refused.iter().map(|r| &*r.follower).collect();
    assert_eq!(refused, ["node-0", "node-1"]);
    assert_eq!(
        (o[0].refused[0].by, &*o[0].refused[0].reason),
        ("confirm", "agent said no")
    );
    let versions: Vec<_> = (o[0].versions.iter())
        .map(|v| (v.hash.clone(), v.followers))
        .collect();
    assert_eq!(
        versions,
        [
            (Some(own.to_string()), 3),
            (None, 1),
            (Some(served.to_string()), 1)
        ]
    );
    assert_eq!((totals.current, totals.refused, totals.updating), (1, 2, 2));
    // Two waits on, the two holding another version are behind, named by their reports.
    for i in 0..5 {
        fleet.seen_name(&format!("node-{i}"), None, at(21));
    }
    let (o, _) = fleet.objects(&v, at(21), Which::All);
    assert_eq!(o[0].behind.names, ["node-2", "node-3"]);
    assert_eq!((o[0].counts.behind, o[0].behind.more), (2, 0));
}

/// A follower counts for the objects its scope selects, not the others; an object no
/// follower follows, or the hub does not serve, is not shown.
#[test]
fn a_follower_counts_for_what_its_scope_selects() {
    let t0 = Instant::now();
    let fleet = Fleet::new(t0);
    let v = held(&[("x", 5), ("y", 6)]);
    fleet.served(&v, t0);
    let only_x = filter(
        "/api/v1/namespaces/team-a/configmaps",
        "labelSelector=team%3Dx",
    );
    fleet
        .following("a", Arc::new(Scope::new(only_x.clone(), 10)), Some(10), t0)
        .unwrap();
    let elsewhere = filter("/api/v1/namespaces/team-b/configmaps", "");
    fleet
        .following(
            "b",
            Arc::new(Scope::new(elsewhere.clone(), 10)),
            Some(10),
            t0,
        )
        .unwrap();
    fleet.take(
        "c",
        None,
        holds("gone-object", Some(Hash([0; 32])), None),
        t0,
    );
    let (o, totals) = fleet.objects(&v, t0, Which::All);
    assert_eq!(o.iter().map(|o| &*o.name).collect::<Vec<_>>(), ["x"]);
    assert_eq!(o[0].counts.current, 1);
    assert_eq!((totals.current, fleet.size().0), (3, 3));
}

/// Names are shown up to `SHOWN`, with a count of the rest; gone after a wait and the
/// margin.
#[test]
fn names_are_bounded() {
    let t0 = Instant::now();
    let fleet = Fleet::new(t0);
    let v = held(&[("x", 5)]);
    fleet.served(&v, t0);
    for i in 0..12 {
        watches(&fleet, &format!("n{i:02}"), 3, 1, t0);
    }
    let (o, _) = fleet.objects(&v, t0 + Duration::from_secs(30), Which::All);
    assert_eq!(o[0].counts.behind, 12);
    assert_eq!(o[0].behind.names, ["n00", "n01", "n02", "n03", "n04"]);
    assert_eq!(o[0].behind.more, 7);
    let (o, _) = fleet.objects(&v, t0 + Duration::from_secs(62), Which::All);
    assert_eq!((o[0].counts.gone, o[0].gone.more), (12, 7));
}

/// `Which::Refused` reads only the objects some follower refused, with the fleet's whole
/// counts on them; nothing when none is refused.
#[test]
fn refused_reads_only_what_was_refused() {
    let t0 = Instant::now();
    let fleet = Fleet::new(t0);
    let v = held(&[("x", 5), ("y", 6)]);
    fleet.served(&v, t0);
    for i in 0..3 {
        watches(&fleet, &format!("node-{i}"), 10, 10, t0);
    }
    assert!(fleet.objects(&v, t0, Which::Refused).0.is_empty());
    fleet.take("node-1", None, holds("y", None, Some(hash_of(&v, "y"))), t0);
    let (o, _) = fleet.objects(&v, t0, Which::Refused);
    assert_eq!(o.iter().map(|o| &*o.name).collect::<Vec<_>>(), ["y"]);
    assert_eq!((o[0].counts.current, o[0].counts.refused), (2, 1));
    assert_eq!(fleet.objects(&v, t0, Which::All).0.len(), 2);
}

/// A view's work is bounded: the filters and classes most followed are read first, and
/// the followers of those past the budget are counted as unread, not matched.
#[test]
fn a_view_reads_the_most_followed_first_within_its_budget() {
    let t0 = Instant::now();
    let fleet = Fleet::new(t0);
    let v = held(&[("x", 5), ("y", 6)]);
    fleet.served(&v, t0);
    for i in 0..3 {
        watches(&fleet, &format!("node-{i}"), 10, 10, t0);
    }
    // Two followers on selectors of their own.
    for (n, sel) in [("odd-1", "team%3Dx"), ("odd-2", "team%3Dy")] {
        let f = filter(
            "/api/v1/namespaces/team-a/configmaps",
            &format!("labelSelector={sel}"),
        );
        fleet
            .following(n, Arc::new(Scope::new(f, 10)), Some(10), t0)
            .unwrap();
    }
    let all = fleet.view_within(&v, t0, Which::All, MATCHES);
    assert_eq!((all.unread, all.totals.current), (0, 5));
    // Room for the fleet's filter (2 objects) and its class (2): the others are unread.
    let some = fleet.view_within(&v, t0, Which::All, 4);
    assert_eq!(some.unread, 2);
    assert_eq!(some.totals.current, 3, "the unread are in no state");
    let counts: Vec<usize> = some.objects.iter().map(|o| o.counts.current).collect();
    assert_eq!(counts, [3, 3]);
    // And one more: odd-1's filter (2 visits) and class (1).
    let more = fleet.view_within(&v, t0, Which::All, 7);
    assert_eq!(more.unread, 1);
    let counts: Vec<usize> = more.objects.iter().map(|o| o.counts.current).collect();
    assert_eq!(counts, [4, 3]);
}

/// A follower whose two scopes select one object counts once for it, at the newer of
/// their positions.
#[test]
fn overlapping_scopes_count_once() {
    let t0 = Instant::now();
    let fleet = Fleet::new(t0);
    let v = held_at(20, &[("x", 15)]);
    fleet.served(&v, t0);
    let all = filter("/api/v1/namespaces/team-a/configmaps", "");
    let only_x = filter(
        "/api/v1/namespaces/team-a/configmaps",
        "labelSelector=team%3Dx",
    );
    fleet
        .following("a", Arc::new(Scope::new(all, 10)), Some(10), t0)
        .unwrap();
    fleet
        .following("a", Arc::new(Scope::new(only_x, 20)), Some(10), t0)
        .unwrap();
    let (o, totals) = fleet.objects(&v, t0, Which::All);
    let c = o[0].counts;
    assert_eq!((c.current, c.updating), (1, 0), "{c:?}");
    assert_eq!(totals.current, 1);
}
