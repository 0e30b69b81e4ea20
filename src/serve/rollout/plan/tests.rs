use super::*;
use crate::poll::hash::Hash;
use crate::serve::fleet::intake::By;
use crate::source::RawObject;

fn obj(rv: u64, data: &str) -> Arc<HeldObject> {
    let meta = format!(r#"{{"name":"a","namespace":"ns","resourceVersion":"{rv}"}}"#);
    let json = format!(r#"{{"metadata":{meta},"data":{{"k":"{data}"}}}}"#);
    Arc::new(HeldObject::new(
        "ns".into(),
        "a".into(),
        rv.to_string(),
        Vec::new(),
        RawObject {
            json: json.into_bytes().into_boxed_slice(),
            metadata: 12..12 + meta.len(),
        },
        Hash::of([("k", data.as_bytes())]),
    ))
}

const ID: &str = "configmap/ns/a";
const STEPS: [f64; 3] = [0.01, 0.5, 1.0];

/// A plan of `record` with `objects`, for hub `me` at `now`, every hub live, the gate
/// `gate` and the lowest cohort `lowest`.
fn planned(
    record: &Record,
    objects: &[Seen],
    now: u64,
    gate: Gate,
    lowest: Option<f64>,
) -> Planned {
    let live = |_: &str| true;
    let mut g = |_: &str, _: &Rollout| gate.clone();
    let mut l = |_: &str| lowest;
    let waited = |_: &str, _: &Rollout| true;
    let mut cx = Context {
        me: "hub-0",
        now,
        wait: 10,
        live: &live,
        gate: &mut g,
        lowest: &mut l,
        waited: &waited,
    };
    plan(record, objects, &mut cx)
}

fn seen<'a>(o: &'a Arc<HeldObject>, done: Option<&'a Arc<HeldObject>>) -> Seen<'a> {
    Seen {
        id: ID.into(),
        object: o,
        done,
        steps: STEPS.to_vec(),
        fallback: STEPS.to_vec(),
    }
}

fn holding(n: u32) -> Gate {
    Gate {
        followers: n,
        holding: n,
        ..Gate::default()
    }
}

#[test]
fn a_new_version_starts_at_the_first_step_from_what_is_served() {
    let (old, new) = (obj(10, "old"), obj(12, "new"));
    // The version served: nothing to do.
    let p = planned(
        &Record::default(),
        &[seen(&old, Some(&old))],
        100,
        holding(0),
        None,
    );
    assert!(p.record.rollouts.is_empty());
    // A new one: step 1 from the old one, whose JSON the plan asks to keep.
    let p = planned(
        &Record::default(),
        &[seen(&new, Some(&old))],
        100,
        holding(0),
        Some(0.3),
    );
    let r = &p.record.rollouts[ID];
    assert_eq!((r.step, r.since, r.wait), (0, 100, 10));
    assert_eq!(r.hash, new.hash.to_string());
    assert_eq!(r.from, Some(old.hash.to_string()));
    assert!(
        r.below > 0.3 && r.below < 0.300_001,
        "above the one follower: {}",
        r.below
    );
    assert_eq!(p.stables.len(), 1);
    assert!(Arc::ptr_eq(&p.stables[0].1, &old));
    // Steps `none`: nothing recorded, it goes to everyone.
    let mut s = seen(&new, Some(&old));
    s.steps.clear();
    assert!(
        planned(&Record::default(), &[s], 100, holding(0), None)
            .record
            .rollouts
            .is_empty()
    );
}

#[test]
fn a_step_advances_once_held_its_wait_with_every_follower_holding() {
    let (old, new) = (obj(10, "old"), obj(12, "new"));
    let start = planned(
        &Record::default(),
        &[seen(&new, Some(&old))],
        100,
        holding(0),
        None,
    );
    let rec = start.record;
    assert_eq!(rec.rollouts[ID].below, 0.01);
    // Within the wait: held, though every follower holds it.
    let p = planned(&rec, &[seen(&new, Some(&old))], 109, holding(3), None);
    assert_eq!(p.record.rollouts[ID].step, 0);
    assert!(p.record.hubs["hub-0"].votes[ID].holds);
    // One follower does not hold it yet: held.
    let one_short = Gate {
        followers: 3,
        holding: 2,
        ..Gate::default()
    };
    let p = planned(&rec, &[seen(&new, Some(&old))], 200, one_short, None);
    assert_eq!(p.record.rollouts[ID].step, 0);
    // Held its wait, every follower holding it, this hub the only one: the next step.
    let p = planned(&rec, &[seen(&new, Some(&old))], 110, holding(3), None);
    let r = &p.record.rollouts[ID];
    assert_eq!((r.step, r.since, r.below), (1, 110, 0.5));
    // The last step done: the rollout ends.
    let mut last = p.record.clone();
    last.rollouts.get_mut(ID).unwrap().step = 2;
    last.rollouts.get_mut(ID).unwrap().below = 2.0;
    let p = planned(&last, &[seen(&new, Some(&old))], 200, holding(3), None);
    assert_eq!(p.record.rollouts[ID].done, Some(200), "{:?}", p.record);
    assert!(p.record.hubs["hub-0"].votes.is_empty());
    // Kept for every hub to apply, then forgotten.
    let p = planned(
        &p.record,
        &[seen(&new, Some(&new))],
        200 + DONE_KEPT - 1,
        holding(3),
        None,
    );
    assert!(p.record.rollouts.contains_key(ID));
    let p = planned(
        &p.record,
        &[seen(&new, Some(&new))],
        200 + DONE_KEPT,
        holding(3),
        None,
    );
    assert!(p.record.rollouts.is_empty());
}

#[test]
fn another_live_hubs_vote_holds_the_step() {
    let (old, new) = (obj(10, "old"), obj(12, "new"));
    let mut rec = planned(
        &Record::default(),
        &[seen(&new, Some(&old))],
        100,
        holding(0),
        None,
    )
    .record;
    rec.hubs.insert(
        "hub-1".into(),
        super::super::record::Hub {
            beat: 4,
            votes: [(
                ID.to_string(),
                Vote {
                    hash: new.hash.to_string(),
                    step: 0,
                    holds: false,
                    followers: 5,
                    holding: 4,
                },
            )]
            .into(),
        },
    );
    let p = planned(&rec, &[seen(&new, Some(&old))], 200, holding(3), None);
    assert_eq!(
        p.record.rollouts[ID].step, 0,
        "hub-1's followers do not all hold it"
    );
    let voted = p.record;
    // hub-1 gone: its vote no longer counts.
    let live = |h: &str| h != "hub-1";
    let mut g = |_: &str, _: &Rollout| holding(3);
    let mut l = |_: &str| None;
    let waited = |_: &str, _: &Rollout| true;
    let mut cx = Context {
        me: "hub-0",
        now: 200,
        wait: 10,
        live: &live,
        gate: &mut g,
        lowest: &mut l,
        waited: &waited,
    };
    let p = plan(&voted, &[seen(&new, Some(&old))], &mut cx);
    assert_eq!(p.record.rollouts[ID].step, 1);
}

#[test]
fn a_refusal_stops_the_rollout_and_a_newer_write_starts_again() {
    let (old, new, newer) = (obj(10, "old"), obj(12, "new"), obj(14, "newer"));
    let rec = planned(
        &Record::default(),
        &[seen(&new, Some(&old))],
        100,
        holding(0),
        None,
    )
    .record;
    let refused = Gate {
        followers: 1,
        refused: Some(("ns/pod-7".into(), By::Confirm, "alloy: cannot build".into())),
        ..Gate::default()
    };
    let p = planned(&rec, &[seen(&new, Some(&old))], 101, refused, None);
    let r = &p.record.rollouts[ID];
    let x = r.refused.as_ref().unwrap();
    assert_eq!(
        (x.step, x.follower.as_str(), x.by.as_str()),
        (0, "ns/pod-7", "confirm")
    );
    assert!(!p.record.hubs["hub-0"].votes.contains_key(ID));
    // Refused stays refused, however long.
    let p = planned(
        &p.record,
        &[seen(&new, Some(&old))],
        10_000,
        holding(9),
        None,
    );
    assert!(p.record.rollouts[ID].refused.is_some());
    // A newer write: step 1 again, from the same stable version.
    let p = planned(
        &p.record,
        &[seen(&newer, Some(&old))],
        10_001,
        holding(0),
        None,
    );
    let r = &p.record.rollouts[ID];
    assert!(r.refused.is_none());
    assert_eq!((r.step, r.hash.clone()), (0, newer.hash.to_string()));
    assert_eq!(r.from, Some(old.hash.to_string()));
    assert!(
        p.stables.is_empty(),
        "the stable version is in the Secret already"
    );
    // The stable version written back ends it; the object gone ends it.
    let back = obj(16, "old");
    let q = planned(
        &p.record,
        &[seen(&back, Some(&old))],
        10_002,
        holding(0),
        None,
    );
    assert!(q.record.rollouts.is_empty());
    let q = planned(&p.record, &[], 10_002, holding(0), None);
    assert!(q.record.rollouts.is_empty());
}

#[test]
fn thresholds_take_in_one_follower_and_the_last_step_everyone() {
    assert_eq!(threshold(0.01, None), 0.01);
    assert_eq!(threshold(0.01, Some(0.005)), 0.01);
    let t = threshold(0.01, Some(0.7));
    assert!(t > 0.7 && t - 0.7 < 1e-12);
    assert_eq!(threshold(1.0, Some(0.7)), 2.0);
}
