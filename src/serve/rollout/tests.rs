//! Rollouts turn by turn, as a hub's poll loop runs them: a record kept in memory
//! (`MemoryStore`), followers in a `Fleet`, the views published into a timeline whose
//! history is what watchers are sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::store::MemoryStore;
use super::*;
use crate::serve::fleet::Fleet;
use crate::serve::fleet::state::Scope;
use crate::serve::held::Held;
use crate::serve::history::History;
use crate::serve::testing::{filter, item, kinds, poll};
use crate::serve::views::{Views, cohort};

/// `ns/a` at `rv`, its one key `k` holding the version written (`rv`): each version a
/// new hash, as the apiserver's lists give them.
fn a(rv: u64) -> crate::source::Item {
    let mut i = item("ns", "a", rv, &[]);
    i.files = vec![crate::source::ModuleFile {
        key: "k".into(),
        content: crate::source::Content::Text(rv.to_string()),
    }];
    i
}

/// Two follower names, one in each half of the cohorts.
fn low_and_high() -> (String, String) {
    let names: Vec<String> = (0..64).map(|i| format!("ns/pod-{i}")).collect();
    let low = names.iter().find(|n| cohort(n) < 0.5).unwrap().clone();
    let high = names.iter().find(|n| cohort(n) >= 0.5).unwrap().clone();
    (low, high)
}

fn settings(steps: &str) -> Settings {
    Settings {
        steps: steps::Steps::parse(steps).unwrap(),
        wait: Duration::ZERO,
        state_namespace: "cmpoll".into(),
        state_name: "cmpoll-rollouts".into(),
    }
}

/// `r`, asking its gates at every turn (a test's turns come faster than `DECIDE_EVERY`).
fn quick(mut r: Rollouts) -> Rollouts {
    r.clock.decide_every = Duration::ZERO;
    r
}

/// A hub's loop, as far as rollouts go.
struct Loop {
    rollouts: Rollouts,
    fleet: Fleet,
    views: Views,
    upstream: Held,
    history: History,
    n: u64,
}

impl Loop {
    fn new(steps: &str, store: MemoryStore) -> Loop {
        let r = quick(Rollouts::new(
            settings(steps),
            "hub-0".into(),
            Box::new(store),
        ));
        Loop {
            rollouts: r,
            fleet: Fleet::default(),
            views: Views::one(Arc::new(Held::empty(kinds()))),
            upstream: Held::empty(kinds()),
            history: History::default(),
            n: 0,
        }
    }

    /// A poll listed at `listed` that found `a` at `rv`: its views published.
    fn poll(&mut self, listed: u64, rv: u64) -> Vec<(String, super::super::views::Band)> {
        self.n += 1;
        let held = poll(&self.upstream, self.n, &[(None, listed)], vec![a(rv)]);
        self.upstream = poll(&self.upstream, self.n, &[(None, listed)], vec![a(rv)]);
        let turn = self.rollouts.turn(Arc::new(held), &self.views, &self.fleet);
        let views = turn.views.expect("the record was read");
        let before = self.history.kind(crate::source::Resource::ConfigMaps).end();
        self.history.record_views(&self.views, &views);
        self.views = views;
        let kept = self.history.kind(crate::source::Resource::ConfigMaps);
        (kept.after(before).unwrap())
            .map(|c| (c.after.as_ref().unwrap().resource_version.clone(), c.band))
            .collect()
    }

    /// The data a client of cohort `h` is served of `a` (its `k`: the version written).
    fn served(&self, name: &str) -> (String, String) {
        let o = self
            .views
            .view(cohort(name))
            .1
            .get(crate::source::Resource::ConfigMaps, "ns", "a");
        let o = o.expect("served");
        let json: serde_json::Value = serde_json::from_slice(&o.raw.json).unwrap();
        (
            json["data"]["k"].as_str().unwrap().to_string(),
            o.resource_version.clone(),
        )
    }

    /// `name` follows every ConfigMap, its watch at `at`.
    fn follows(&self, name: &str, at: u64) {
        let scope = Arc::new(Scope::new(filter("/api/v1/configmaps", ""), at));
        self.fleet
            .following(name, scope, Some(30), Instant::now())
            .unwrap();
    }
}

#[test]
fn a_version_reaches_the_first_cohort_then_every_client() {
    let (low, high) = low_and_high();
    let mut l = Loop::new("50%,100%", MemoryStore::default());
    l.follows(&low, 100);
    l.follows(&high, 100);
    assert_eq!(
        l.poll(100, 50).len(),
        0,
        "the first poll is served as it is"
    );
    assert_eq!(l.served(&low), ("50".into(), "50".into()));
    // Written at 105: recorded, served to nobody yet.
    let changes = l.poll(110, 105);
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!(l.rollouts.state.record.rollouts.len(), 1);
    assert_eq!(l.served(&low).0, "50");
    // The next poll applies it: the first cohort alone, at the poll's version.
    let changes = l.poll(120, 105);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].0, "120");
    assert!(changes[0].1.has(cohort(&low)) && !changes[0].1.has(cohort(&high)));
    assert_eq!(l.served(&low), ("105".into(), "120".into()));
    assert_eq!(l.served(&high), ("50".into(), "50".into()));
    // The low follower has not taken it: the step holds.
    l.poll(130, 105);
    assert_eq!(l.rollouts.state.record.rollouts["configmap/ns/a"].step, 0);
    assert_eq!(l.served(&high).0, "50");
    // It has: the next step (every client), applied at the poll after.
    l.follows(&low, 120);
    l.poll(140, 105);
    assert_eq!(l.rollouts.state.record.rollouts["configmap/ns/a"].step, 1);
    let changes = l.poll(150, 105);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(changes[0].1.has(cohort(&high)) && !changes[0].1.has(cohort(&low)));
    assert_eq!(l.served(&high), ("105".into(), "150".into()));
    assert_eq!(
        l.served(&low),
        ("105".into(), "120".into()),
        "kept: no event"
    );
    // Every follower holds it: done (recorded so a while), nothing more sent.
    l.follows(&high, 150);
    l.poll(160, 105);
    let r = &l.rollouts.state.record.rollouts["configmap/ns/a"];
    assert!(r.done.is_some(), "{r:?}");
    assert!(l.poll(170, 105).is_empty());
    // A later write with no rollout left to run: every client at its own version.
    let mut s = settings("none");
    s.wait = Duration::ZERO;
    l.rollouts.settings = s;
    let changes = l.poll(200, 190);
    // One change per cohort that held another version before (a watcher's selectors
    // read the version it replaces), each the object as the apiserver served it.
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(changes.iter().all(|(rv, _)| rv == "190"));
    assert!(changes.iter().any(|(_, b)| b.has(cohort(&low))));
    assert!(changes.iter().any(|(_, b)| b.has(cohort(&high))));
    assert!(l.rollouts.tracked.is_empty(), "told apart no more");
    assert!(l.views.cuts.is_empty());
}

#[test]
fn nothing_is_served_before_the_record_is_read_and_nothing_moves_while_it_cannot_be() {
    let (low, _) = low_and_high();
    let mut store = MemoryStore::default();
    store.fail(Some("forbidden".into()));
    let mut l = Loop::new("50%,100%", store);
    l.follows(&low, 100);
    let held = poll(&Held::empty(kinds()), 1, &[(None, 100)], vec![a(50)]);
    let turn = l.rollouts.turn(Arc::new(held), &l.views, &l.fleet);
    assert!(turn.views.is_none());
    assert_eq!(l.rollouts.error(), Some("forbidden"));
}

/// `name` reports refusing (its `--confirm`) `a` as it was served it at `rv`.
fn refuses(fleet: &Fleet, name: &str, rv: u64) {
    use crate::serve::fleet::intake::{By, Checked, Holding, Refusal};
    let hash = crate::poll::hash::Hash::of([("k", b"x".as_slice())]);
    let report = Checked {
        holds: vec![Holding {
            kind: crate::source::Resource::ConfigMaps,
            key: "ns/a".into(),
            hash: None,
            resource_version: None,
            refused: Some(Box::new(Refusal {
                hash,
                resource_version: Some(rv),
                by: By::Confirm,
                reason: "alloy: cannot build".into(),
            })),
        }],
        truncated: false,
    };
    fleet.take(name, Some(30), report, Instant::now());
}

#[test]
fn a_refusal_in_the_first_step_sends_its_cohort_back_and_holds_the_others() {
    let (low, high) = low_and_high();
    let mut l = Loop::new("50%,100%", MemoryStore::default());
    l.follows(&low, 100);
    l.follows(&high, 100);
    l.poll(100, 50);
    l.poll(110, 105);
    l.poll(120, 105);
    assert_eq!(l.served(&low), ("105".into(), "120".into()));
    // The low follower's agent refuses it: recorded at the next turn, applied at the one
    // after — back to the last good version for the cohort, held back for everyone.
    refuses(&l.fleet, &low, 120);
    l.poll(130, 105);
    let r = l.rollouts.state.record.rollouts["configmap/ns/a"].clone();
    let x = r.refused.as_ref().expect("refused");
    assert_eq!(
        (x.follower.as_str(), x.by.as_str(), x.step),
        (low.as_str(), "confirm", 0)
    );
    let changes = l.poll(140, 105);
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(l.served(&low), ("50".into(), "140".into()));
    assert_eq!(l.served(&high), ("50".into(), "140".into()));
    let top = l
        .views
        .top
        .get(crate::source::Resource::ConfigMaps, "ns", "a")
        .unwrap();
    let text = String::from_utf8_lossy(&top.raw.json).to_string();
    assert!(
        text.contains(&format!("\"cmpoll.io/held-back\":\"{}\"", r.hash)),
        "{text}"
    );
    // However long it is held: never the refused version.
    l.follows(&low, 140);
    l.follows(&high, 140);
    for n in 0..5 {
        assert!(l.poll(150 + n, 105).is_empty());
    }
    assert_eq!(l.served(&high).0, "50");
    // A newer write starts again from the first step.
    l.poll(200, 190);
    assert!(
        l.rollouts.state.record.rollouts["configmap/ns/a"]
            .refused
            .is_none()
    );
    l.poll(210, 190);
    assert_eq!(l.served(&low).0, "190");
    assert_eq!(l.served(&high).0, "50");
}

/// A store two hubs share.
#[derive(Clone, Default)]
struct Shared(Arc<std::sync::Mutex<MemoryStore>>);

impl store::Store for Shared {
    fn read(&mut self) -> Result<Option<store::Stored>, String> {
        self.0.lock().unwrap().read()
    }
    fn write(
        &mut self,
        rv: Option<&str>,
        data: &std::collections::BTreeMap<String, Vec<u8>>,
    ) -> Result<store::Wrote, String> {
        self.0.lock().unwrap().write(rv, data)
    }
    fn describe(&self) -> String {
        "secret shared".into()
    }
}

#[test]
fn two_hubs_serve_one_step_and_a_restarted_hub_goes_on_from_it() {
    let (low, high) = low_and_high();
    let shared = Shared::default();
    let hub = |name: &str| {
        let mut l = Loop::new("50%,100%", MemoryStore::default());
        l.rollouts = quick(Rollouts::new(
            settings("50%,100%"),
            name.into(),
            Box::new(shared.clone()),
        ));
        l
    };
    let (mut one, mut two) = (hub("hub-1"), hub("hub-2"));
    one.follows(&low, 100);
    two.follows(&high, 100);
    one.poll(100, 50);
    two.poll(101, 50);
    // Hub 1 sees the write first and records it; hub 2 reads it and serves the same step.
    one.poll(110, 105);
    two.poll(111, 105);
    one.poll(120, 105);
    two.poll(121, 105);
    for l in [&one, &two] {
        assert_eq!(l.served(&low).0, "105");
        assert_eq!(l.served(&high).0, "50");
    }
    // Hub 2 has no follower in the step (it votes that it holds); hub 1's follower has
    // not taken it: the step holds on both.
    one.poll(130, 105);
    two.poll(131, 105);
    assert_eq!(one.rollouts.state.record.rollouts["configmap/ns/a"].step, 0);
    // Hub 1 restarts: it serves the same step at once, and it does not start again.
    let mut again = hub("hub-1");
    again.follows(&low, 100);
    again.poll(140, 105);
    assert_eq!(again.served(&low).0, "105");
    assert_eq!(again.served(&high).0, "50");
    assert_eq!(
        again.rollouts.state.record.rollouts["configmap/ns/a"].step,
        0
    );
    // Its follower takes it (from the restarted hub): the next step, on both hubs.
    again.follows(&low, 140);
    again.poll(150, 105);
    two.poll(151, 105);
    again.poll(160, 105);
    two.poll(161, 105);
    two.poll(171, 105);
    for l in [&again, &two] {
        assert_eq!(l.served(&high).0, "105", "{:?}", l.rollouts.state.record);
    }
}

#[test]
fn a_newer_write_moves_the_first_cohort_on_and_never_back() {
    let (low, high) = low_and_high();
    let mut l = Loop::new("50%,100%", MemoryStore::default());
    l.follows(&low, 100);
    l.follows(&high, 100);
    l.poll(100, 50);
    l.poll(110, 105);
    l.poll(120, 105);
    assert_eq!(l.served(&low).0, "105");
    // Written again while the first step runs: recorded from the first step again; until
    // then the cohort keeps what it has — never the stable version in between.
    let changes = l.poll(200, 190);
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!(l.served(&low).0, "105");
    let r = &l.rollouts.state.record.rollouts["configmap/ns/a"];
    assert_eq!(r.step, 0);
    let changes = l.poll(210, 190);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(l.served(&low), ("190".into(), "210".into()));
    assert_eq!(l.served(&high), ("50".into(), "50".into()));
}

mod hostile;
