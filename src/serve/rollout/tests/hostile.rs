//! What a fresh read of the rollouts found (each a sequence that broke them before its
//! fix): a hub behind, the Secret emptied or edited by hand or by someone who may write
//! it, a report from the future, a follower gone to the other hub, one namespace filling
//! the table, an object made again, annotations asking for view after view.

use super::*;

/// Two hubs on one store.
fn two_hubs(steps: &str) -> (Loop, Loop) {
    let shared = Shared::default();
    let hub = |name: &str| {
        let mut l = Loop::new(steps, MemoryStore::default());
        l.rollouts = quick(Rollouts::new(
            settings(steps),
            name.into(),
            Box::new(shared.clone()),
        ));
        l
    };
    (hub("hub-1"), hub("hub-2"))
}

/// The data `name`'s cohort is served of `a` on `l`, if any.
fn data(l: &Loop, name: &str) -> Option<String> {
    let o = (l.views.view(cohort(name)).1).get(crate::source::Resource::ConfigMaps, "ns", "a")?;
    let json: serde_json::Value = serde_json::from_slice(&o.raw.json).unwrap();
    Some(json["data"]["k"].as_str().unwrap().to_string())
}

#[test]
fn a_hub_whose_poll_is_behind_decides_nothing_about_the_version() {
    let (low, high) = low_and_high();
    let (mut one, mut two) = two_hubs("50%,100%");
    one.rollouts.settings.wait = Duration::from_secs(3600);
    two.rollouts.settings.wait = Duration::from_secs(3600);
    one.follows(&low, 100);
    one.follows(&high, 100);
    one.poll(100, 50);
    two.poll(101, 50);
    one.poll(110, 105);
    one.poll(120, 105);
    assert_eq!(one.served(&low).0, "105");
    // Hub 2 still lists 50 (its list began before the write, its cache is behind).
    two.rollouts.clock.last_read = None;
    two.poll(104, 50);
    let r = &two.rollouts.state.record.rollouts["configmap/ns/a"];
    assert!(
        r.rolling(),
        "not ended by a hub that has not seen it: {r:?}"
    );
    for listed in [130, 140] {
        one.poll(listed, 105);
        assert_eq!(one.served(&high).0, "50", "never to everyone at once");
    }
    two.poll(131, 105);
    one.poll(150, 105);
    assert_eq!(one.served(&low).0, "105");
    assert_eq!(one.served(&high).0, "50");
    assert_eq!(two.served(&low).0, "105");
    assert_eq!(two.served(&high).0, "50");
}

#[test]
fn the_secret_emptied_by_hand_moves_no_one() {
    let (low, high) = low_and_high();
    let store = MemoryStore::default();
    let mut l = Loop::new("50%,100%", store.clone());
    l.rollouts.settings.wait = Duration::from_secs(3600);
    l.follows(&low, 100);
    l.follows(&high, 100);
    l.poll(100, 50);
    l.poll(110, 105);
    l.poll(120, 105);
    let rv = store.stored().unwrap().resource_version;
    let mut hand = store.clone();
    store::Store::write(&mut hand, Some(&rv), &Default::default()).unwrap();
    for listed in [130, 140, 150] {
        l.poll(listed, 105);
        assert_eq!(l.served(&high).0, "50", "not to every client");
        assert_eq!(l.served(&low).0, "105", "nor back");
    }
    // The hub records it again, from where it stood.
    assert!(l.rollouts.state.record.rollouts["configmap/ns/a"].rolling());
}

#[test]
fn a_stable_version_missing_from_the_secret_deletes_nothing() {
    let (low, high) = low_and_high();
    let store = MemoryStore::default();
    let mut l = Loop::new("50%,100%", store.clone());
    l.rollouts.settings.wait = Duration::from_secs(3600);
    l.follows(&low, 100);
    l.follows(&high, 100);
    l.poll(100, 50);
    l.poll(110, 105);
    l.poll(120, 105);
    let s = store.stored().unwrap();
    let mut stripped = s.data.clone();
    stripped.retain(|k, _| !k.starts_with(record::STABLE_PREFIX));
    let mut hand = store.clone();
    store::Store::write(&mut hand, Some(&s.resource_version), &stripped).unwrap();
    // A hub started now has no copy of its own.
    let mut fresh = Loop::new("50%,100%", store.clone());
    fresh.rollouts.settings.wait = Duration::from_secs(3600);
    fresh.follows(&low, 100);
    fresh.follows(&high, 100);
    for listed in [150, 160] {
        fresh.poll(listed, 105);
        // It cannot serve the last good version it never had: the version as polled,
        // never the object gone.
        assert_eq!(data(&fresh, &high).as_deref(), Some("105"));
    }
    // The hub that served it still has its own copy: it serves it above the step.
    for listed in [150, 160] {
        l.poll(listed, 105);
        assert_eq!(data(&l, &high).as_deref(), Some("50"));
        assert_eq!(data(&l, &low).as_deref(), Some("105"));
    }
}

#[test]
fn a_refusal_reported_before_the_version_was_served_refuses_nothing() {
    let (low, high) = low_and_high();
    let mut l = Loop::new("50%,100%", MemoryStore::default());
    l.rollouts.settings.wait = Duration::from_secs(3600);
    l.follows(&high, 100);
    l.follows(&low, 100);
    refuses(&l.fleet, &low, u64::MAX);
    l.poll(100, 50);
    l.poll(110, 105);
    l.poll(120, 105);
    l.poll(130, 105);
    let r = &l.rollouts.state.record.rollouts["configmap/ns/a"];
    assert!(r.refused.is_none(), "{r:?}");
    // A refusal of the version as it was served is one.
    refuses(&l.fleet, &low, 120);
    l.poll(140, 105);
    assert!(
        l.rollouts.state.record.rollouts["configmap/ns/a"]
            .refused
            .is_some()
    );
}

#[test]
fn a_follower_long_gone_from_this_hub_no_longer_holds_its_step() {
    let (low, high) = low_and_high();
    let (mut one, mut two) = two_hubs("50%,100%");
    // Hub 1 heard from `low` ten minutes ago (its watch moved to hub 2).
    let past = Instant::now() - Duration::from_secs(600);
    one.fleet = Fleet::new(past);
    let scope = Arc::new(Scope::new(filter("/api/v1/configmaps", ""), 100));
    one.fleet.following(&low, scope, Some(30), past).unwrap();
    two.follows(&high, 100);
    one.poll(100, 50);
    two.poll(101, 50);
    one.poll(110, 105);
    two.poll(111, 105);
    one.poll(120, 105);
    two.poll(121, 105);
    two.follows(&low, 121);
    for n in 0..4 {
        one.poll(130 + 10 * n, 105);
        two.poll(131 + 10 * n, 105);
    }
    let r = &two.rollouts.state.record.rollouts["configmap/ns/a"];
    assert!(r.step == 1 || r.done.is_some(), "{r:?}");
}

#[test]
fn one_namespace_cannot_fill_the_table_for_the_others() {
    let (low, _) = low_and_high();
    let mut st = settings("1%,10%,50%,100%");
    st.wait = Duration::from_secs(3600);
    let mut r = Rollouts::new(st, "hub-0".into(), Box::new(MemoryStore::default()));
    let fleet = Fleet::default();
    let scope = Arc::new(Scope::new(filter("/api/v1/configmaps", ""), 0));
    fleet
        .following(&low, scope, Some(30), Instant::now())
        .unwrap();
    let spam = |rv: u64| -> Vec<crate::source::Item> {
        (0..record::MAX_ROLLOUTS)
            .map(|i| {
                let mut it = item("spam", &format!("s{i:04}"), rv, &[]);
                it.files = vec![crate::source::ModuleFile {
                    key: "k".into(),
                    content: crate::source::Content::Text(rv.to_string()),
                }];
                it
            })
            .collect()
    };
    let mut views = Views::one(Arc::new(Held::empty(kinds())));
    let mut up = Held::empty(kinds());
    let mut turn = |listed: u64, spam_rv: u64, a_rv: u64, n: u64| {
        let mut items = spam(spam_rv);
        items.push(a(a_rv));
        let held = poll(&up, n, &[(None, listed)], items.clone());
        up = poll(&up, n, &[(None, listed)], items);
        views = r.turn(Arc::new(held), &views, &fleet).views.unwrap();
        views.clone()
    };
    turn(100, 10, 50, 1);
    turn(200, 150, 50, 2);
    let mut last = None;
    for n in 0..3 {
        last = Some(turn(300 + 10 * n, 150, 250, 3 + n));
    }
    let views = last.unwrap();
    let o = (views.view(cohort(&low)).1)
        .get(crate::source::Resource::ConfigMaps, "ns", "a")
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&o.raw.json).unwrap();
    assert_eq!(json["data"]["k"], "250", "ns/a rolls out beside the spam");
}

#[test]
fn an_object_made_again_with_the_same_content_stays_for_everyone() {
    let (low, high) = low_and_high();
    let mut l = Loop::new("50%,100%", MemoryStore::default());
    l.rollouts.settings.wait = Duration::from_secs(3600);
    l.follows(&low, 100);
    l.follows(&high, 100);
    l.poll(100, 50);
    l.n += 1;
    let held = poll(&l.upstream, l.n, &[(None, 110)], vec![]);
    l.upstream = poll(&l.upstream, l.n, &[(None, 110)], vec![]);
    let t = l.rollouts.turn(Arc::new(held), &l.views, &l.fleet);
    l.views = t.views.unwrap();
    for listed in [120, 130, 140] {
        l.n += 1;
        let mut again = a(50);
        again.resource_version = "115".into();
        let held = poll(&l.upstream, l.n, &[(None, listed)], vec![again.clone()]);
        l.upstream = poll(&l.upstream, l.n, &[(None, listed)], vec![again]);
        let t = l.rollouts.turn(Arc::new(held), &l.views, &l.fleet);
        l.views = t.views.unwrap();
    }
    assert_eq!(data(&l, &low).as_deref(), Some("50"));
    assert_eq!(data(&l, &high).as_deref(), Some("50"));
}

#[test]
fn what_a_writer_of_the_secret_names_as_stable_is_not_served_over_the_hubs_own() {
    let (low, high) = low_and_high();
    let store = MemoryStore::default();
    let mut l = Loop::new("50%,100%", store.clone());
    l.rollouts.settings.wait = Duration::from_secs(3600);
    l.follows(&low, 100);
    l.follows(&high, 100);
    l.poll(100, 50);
    let evil = crate::poll::hash::Hash::of([("k", b"evil".as_slice())]).to_string();
    let blob = br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","resourceVersion":"999999"},"data":{"k":"evil"}}"#;
    let rec = serde_json::json!({"rollouts": {"configmap/ns/a": {
        "hash": format!("sha256:{}", "0".repeat(64)), "from": evil, "steps": [0.5, 1.0],
        "step": 0, "below": 0.5, "since": 4_000_000_000u64, "wait": 60}}, "hubs": {}});
    let mut d = std::collections::BTreeMap::new();
    d.insert(
        record::RECORD_KEY.to_string(),
        serde_json::to_vec(&rec).unwrap(),
    );
    d.insert(record::stable_key("configmap/ns/a"), blob.to_vec());
    let mut hand = store.clone();
    let rv = store.stored().map(|s| s.resource_version);
    store::Store::write(&mut hand, rv.as_deref(), &d).unwrap();
    for listed in [110, 120, 130] {
        l.rollouts.clock.last_read = None;
        l.poll(listed, 50);
        assert_ne!(data(&l, &high).as_deref(), Some("evil"));
        assert_ne!(data(&l, &low).as_deref(), Some("evil"));
    }
}

#[test]
fn annotations_cannot_ask_for_a_view_each() {
    fn annotated(name: &str, rv: u64, steps: &str) -> crate::source::Item {
        let metadata = serde_json::json!({"name": name, "namespace": "ns",
            "resourceVersion": rv.to_string(), "annotations": {"cmpoll.io/rollout": steps}})
        .to_string();
        let json = format!("{{\"metadata\":{metadata},\"data\":{{\"k\":\"{rv}\"}}}}");
        let m = "{\"metadata\":".len();
        let mut i = item("ns", name, rv, &[]);
        i.raw = Some(crate::source::RawObject {
            json: json.as_bytes().into(),
            metadata: m..m + metadata.len(),
        });
        i.files = vec![crate::source::ModuleFile {
            key: "k".into(),
            content: crate::source::Content::Text(rv.to_string()),
        }];
        i
    }
    let mut st = settings("none");
    st.wait = Duration::from_secs(60);
    let mut r = Rollouts::new(st, "hub-0".into(), Box::new(MemoryStore::default()));
    let fleet = Fleet::default();
    let n = 60u64;
    let items = |rv: u64| {
        (0..n)
            .map(|i| {
                annotated(
                    &format!("o{i:04}"),
                    rv + i,
                    &format!("0.{:03}%,100%", i + 1),
                )
            })
            .collect::<Vec<_>>()
    };
    let mut views = Views::one(Arc::new(Held::empty(kinds())));
    let mut up = Held::empty(kinds());
    for (k, (listed, rv)) in [(10_000u64, 100u64), (20_000, 10_000), (30_000, 10_000)]
        .into_iter()
        .enumerate()
    {
        let held = poll(&up, k as u64 + 1, &[(None, listed)], items(rv));
        up = poll(&up, k as u64 + 1, &[(None, listed)], items(rv));
        views = r.turn(Arc::new(held), &views, &fleet).views.unwrap();
    }
    assert!(
        views.cuts.len() <= plan::MAX_CUTS,
        "{} views",
        views.cuts.len() + 1
    );
    let rolling = r
        .state
        .record
        .rollouts
        .values()
        .filter(|x| x.rolling())
        .count();
    assert_eq!(rolling, plan::MAX_CUTS, "the others wait");
}

#[test]
fn a_hub_started_behind_the_record_serves_what_it_listed_not_nothing() {
    let (low, high) = low_and_high();
    let store = MemoryStore::default();
    let mut l = Loop::new("50%,100%", store.clone());
    l.rollouts.settings.wait = Duration::from_secs(3600);
    l.follows(&low, 100);
    l.follows(&high, 100);
    l.poll(100, 50);
    l.poll(110, 105);
    l.poll(120, 105);
    // A hub started now whose first list is older than the record's version.
    let mut fresh = Loop::new("50%,100%", store.clone());
    fresh.poll(108, 50);
    assert_eq!(data(&fresh, &low).as_deref(), Some("50"));
    assert_eq!(data(&fresh, &high).as_deref(), Some("50"));
    // Once it lists the version, it serves the step the record says.
    fresh.poll(130, 105);
    fresh.poll(140, 105);
    assert_eq!(data(&fresh, &low).as_deref(), Some("105"));
    assert_eq!(data(&fresh, &high).as_deref(), Some("50"));
}
