#![allow(clippy::unwrap_used)]

use super::*;
use crate::poll::hash::Hash;
use crate::serve::fleet::gate::{Gate, Step};
use crate::serve::fleet::intake::{By, Refusal};
use crate::serve::held::Held;
use crate::serve::testing::{item, kinds, poll};
use std::time::Duration;

fn version(key: &str, v: u8, rv: u64) -> Version {
    Version {
        key: key.into(),
        hash: Hash([v; 32]),
        rv,
    }
}

/// A step of `a/x` at rv 7, served to every cohort at hub version 7.
fn gate(fleet: &Fleet, held: &Held, now: Instant) -> Gate {
    let step = Step {
        kind: Resource::ConfigMaps,
        object: held.get(Resource::ConfigMaps, "a", "x").unwrap(),
        below: 1.0,
        served_at: &|_| Some(7),
        served: &[7],
        lowest: false,
    };
    fleet.gate(&step, now)
}

fn refusing(key: &str, held: Option<(u8, u64)>, refused: (u8, u64)) -> Holding {
    Holding {
        kind: Resource::ConfigMaps,
        key: key.into(),
        hash: held.map(|(v, _)| Hash([v; 32])),
        resource_version: held.map(|(_, rv)| rv),
        refused: Some(Box::new(Refusal {
            hash: Hash([refused.0; 32]),
            resource_version: Some(refused.1),
            by: By::Confirm,
            reason: "9:1: no".into(),
        })),
    }
}

/// A collector counts in a step's gate as a follower does: not holding before a text
/// with the step's version runs (its position), refusing it once Alloy fails it (its
/// exception, kept while it runs texts that hold the module), holding it once it runs it.
#[test]
fn a_collectors_word_is_a_followers_report_to_the_gate() {
    let held = poll(
        &Held::empty(kinds()),
        1,
        &[(None, 7)],
        vec![item("a", "x", 7, &[])],
    );
    let fleet = Fleet::new(Instant::now());
    let now = Instant::now();
    // Each word 3 s after the last: within the report budget.
    let ticks = std::cell::Cell::new(0);
    let tick = || {
        ticks.set(ticks.get() + 3);
        now + Duration::from_secs(ticks.get())
    };
    let at = |at: u64| Word {
        at: Some(at),
        ..Word::default()
    };
    // A call before it is sent any module: it follows nothing, holds no step.
    fleet.collected("ns/pod", Word::default(), tick());
    assert_eq!(gate(&fleet, &held, now).followers, 0);
    // Sent a text of modules of `b` alone: not a follower of `a`'s objects.
    let sent = |ns: &[&str]| Word {
        namespaces: Some(ns.iter().map(|n| Box::from(*n)).collect()),
        ..Word::default()
    };
    fleet.collected("ns/pod", sent(&["b"]), tick());
    assert_eq!(gate(&fleet, &held, now).followers, 0);
    // Sent one with `a`'s: a follower of the step, holding nothing yet.
    fleet.collected("ns/pod", sent(&["a", "b"]), tick());
    let g = gate(&fleet, &held, now);
    assert_eq!((g.followers, g.holding, g.refused), (1, 0, None));
    // It failed the text with a/x at rv 7: refused, by its agent, with Alloy's words.
    let failed = Word {
        change: Some(Change::Failed(vec![refusing("a/x", Some((1, 3)), (2, 7))])),
        ..Word::default()
    };
    fleet.collected("ns/pod", failed, tick());
    let g = gate(&fleet, &held, now);
    let refused = g.refused.unwrap();
    assert_eq!(
        (refused.0.as_str(), refused.1, refused.2.as_str()),
        ("ns/pod", By::Confirm, "9:1: no")
    );
    // It runs a text that holds a/x at its last good version (rv 3), answered at 8:
    // the refusal stays.
    let good = Word {
        change: Some(Change::Applied(Arc::new([version("a/x", 1, 3)]))),
        ..at(8)
    };
    fleet.collected("ns/pod", good, tick());
    assert!(gate(&fleet, &held, now).refused.is_some(), "still refused");
    // A text without a/x: nothing refused, nothing else excepted; it holds what the hub
    // serves from its position (8 ≥ 7) on.
    let other = Word {
        change: Some(Change::Applied(Arc::new([version("b/y", 1, 4)]))),
        ..at(8)
    };
    fleet.collected("ns/pod", other, tick());
    let g = gate(&fleet, &held, now);
    assert_eq!((g.followers, g.holding, g.refused), (1, 1, None));
    // A failed text that holds a/x at rv 7 without refusing it (Alloy pointed elsewhere):
    // it runs rv 3 of it, so it does not hold the step's version.
    let unrun = Holding {
        refused: None,
        ..refusing("a/x", Some((1, 3)), (2, 7))
    };
    let failed = Word {
        change: Some(Change::Failed(vec![unrun])),
        ..Word::default()
    };
    fleet.collected("ns/pod", failed, tick());
    let g = gate(&fleet, &held, now);
    assert_eq!((g.followers, g.holding, g.refused), (1, 0, None));
}

/// Collectors sharing a token are one follower: one's text that runs the refused version
/// does not take back another's refusal; positions only move on; a word with no change
/// touches no exception.
#[test]
fn collectors_of_one_token_keep_each_others_refusals() {
    let fleet = Fleet::new(Instant::now());
    let now = Instant::now();
    let failed = Word {
        namespaces: Some(vec!["a".into(), "b".into()]),
        change: Some(Change::Failed(vec![refusing("a/x", None, (2, 7))])),
        ..Word::default()
    };
    fleet.collected("alloy", failed, now);
    let runs = Word {
        at: Some(9),
        change: Some(Change::Applied(Arc::new([
            version("a/x", 2, 7),
            version("b/y", 1, 2),
        ]))),
        ..Word::default()
    };
    fleet.collected("alloy", runs, now);
    let back = Word {
        at: Some(6),
        ..Word::default()
    };
    fleet.collected("alloy", back, now);
    let followers = fleet.read(now);
    let f = followers.map.get("alloy").unwrap();
    assert_eq!(f.scopes.len(), 2);
    assert!(f.scopes.iter().all(|s| s.position() == 9), "never back");
    assert_eq!(f.holds.len(), 1);
    let h = &f.holds[0];
    assert_eq!(
        (
            &*h.key,
            h.resource_version,
            h.refused.as_ref().unwrap().hash
        ),
        ("a/x", Some(7), Hash([2; 32]))
    );
}

/// A follower's scopes and exceptions of the same name stay: a collector's text changes
/// only the ConfigMaps' scopes without selector, and its exceptions only ConfigMaps'.
#[test]
fn a_followers_own_scopes_and_secrets_stay() {
    let fleet = Fleet::new(Instant::now());
    let now = Instant::now();
    let filter =
        crate::serve::testing::filter("/api/v1/namespaces/a/configmaps", "labelSelector=x%3Dy");
    let theirs = Arc::new(Scope::new(filter, 3));
    fleet.following("ns/pod", theirs, Some(30), now).unwrap();
    let secret = Holding {
        kind: Resource::Secrets,
        ..refusing("a/x", None, (1, 1))
    };
    let failed = Word {
        namespaces: Some(vec!["a".into()]),
        change: Some(Change::Failed(vec![
            secret.clone(),
            refusing("a/x", None, (2, 7)),
        ])),
        ..Word::default()
    };
    fleet.collected("ns/pod", failed, now);
    let text = Word {
        namespaces: Some(vec!["c".into()]),
        change: Some(Change::Applied(Arc::new([version("c/z", 1, 2)]))),
        at: Some(4),
        ..Word::default()
    };
    fleet.collected("ns/pod", text, now);
    let followers = fleet.read(now);
    let f = followers.map.get("ns/pod").unwrap();
    let scopes: Vec<(Option<&str>, bool, u64)> = (f.scopes.iter())
        .map(|s| {
            (
                s.filter.namespace.as_deref(),
                s.filter.plain(),
                s.position(),
            )
        })
        .collect();
    assert_eq!(scopes, [(Some("a"), false, 3), (Some("c"), true, 4)]);
    assert_eq!(&*f.holds, [secret]);
}

/// Past `MAX_REPORT_MODULES` exceptions, the refusals are kept first.
#[test]
fn refusals_are_kept_first() {
    let mut holds: Vec<Holding> = (0..MAX_REPORT_MODULES + 10)
        .map(|i| Holding {
            refused: None,
            ..refusing(&format!("a/m{i:05}"), Some((1, 1)), (1, 1))
        })
        .collect();
    holds.push(refusing("z/last", None, (2, 2)));
    let (kept, cut) = bounded(holds);
    assert!(cut);
    assert_eq!(kept.len(), MAX_REPORT_MODULES);
    assert_eq!(&*kept[MAX_REPORT_MODULES - 1].key, "z/last");
}

/// Holds are merged by key, in key order.
#[test]
fn failures_merge_by_key() {
    let a = refusing("a/x", None, (1, 1));
    let b = refusing("b/y", None, (1, 1));
    let c = refusing("c/z", None, (1, 1));
    let b2 = refusing("b/y", Some((1, 1)), (2, 2));
    let out = merged(&[a.clone(), b], vec![b2.clone(), c.clone()]);
    assert_eq!(out, [a, b2, c]);
}

/// A token that changes its status at every call writes the followers' lock within the
/// report budget: past `REPORT_BURST`, a change is dropped until the budget refills.
#[test]
fn changes_are_taken_within_the_report_budget() {
    let fleet = Fleet::new(Instant::now());
    let now = Instant::now();
    let failing = |i: u8| Word {
        namespaces: Some(vec!["a".into()]),
        change: Some(Change::Failed(vec![refusing(
            "a/x",
            None,
            (i, u64::from(i)),
        )])),
        ..Word::default()
    };
    let refused = |fleet: &Fleet| {
        let followers = fleet.read(now);
        let f = followers.map.get("ns/pod").unwrap();
        f.holds[0].refused.as_ref().unwrap().hash.0[0]
    };
    let burst = crate::serve::fleet::state::REPORT_BURST as u8;
    for i in 1..=burst + 3 {
        let taken = fleet.collected("ns/pod", failing(i), now);
        assert_eq!(
            taken,
            i <= burst,
            "{i}: the caller tells what was not taken again"
        );
    }
    let moved = Word {
        namespaces: Some(vec!["b".into()]),
        ..Word::default()
    };
    assert!(
        !fleet.collected("ns/pod", moved, now),
        "what it follows is rated too"
    );
    // A word past the budget moves no position: it waits with its change.
    let position = |fleet: &Fleet| {
        let followers = fleet.read(now);
        followers.map.get("ns/pod").unwrap().scopes[0].position()
    };
    let before = position(&fleet);
    let later = Word {
        at: Some(before + 100),
        ..failing(7)
    };
    assert!(!fleet.collected("ns/pod", later, now));
    assert_eq!(position(&fleet), before);
    assert_eq!(refused(&fleet), burst, "the changes past the burst dropped");
    fleet.collected("ns/pod", failing(99), now + Duration::from_secs(10));
    assert_eq!(refused(&fleet), 99, "taken once the budget refilled");
}
