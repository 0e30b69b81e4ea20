//! The history over made-up polls: what each poll adds, which versions a watch may start
//! from, what a watcher's selector turns a change into.

use super::*;
use crate::serve::held::Held;
use crate::serve::testing::{item, kinds, poll};

/// The events a watcher of everything would get from place `seq`: (type, name, rv).
fn events(h: &History, seq: u64) -> Vec<(String, String, u64)> {
    let kept = h.kind(Resource::ConfigMaps);
    kept.after(seq)
        .unwrap()
        .filter_map(|c| {
            let body = c.event(Resource::ConfigMaps, Form::Full, |_| true)?;
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            Some((
                v["type"].as_str().unwrap().to_string(),
                v["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                v["object"]["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap(),
            ))
        })
        .collect()
}

fn e(t: &str, name: &str, rv: u64) -> (String, String, u64) {
    (t.to_string(), name.to_string(), rv)
}

#[test]
fn each_poll_adds_its_difference_in_resource_version_order() {
    let mut h = History::default();
    let empty = Held::empty(kinds());
    let p1 = poll(
        &empty,
        1,
        &[(None, 10)],
        vec![item("a", "x", 5, &[]), item("a", "y", 7, &[])],
    );
    h.record(&empty, &p1);
    let kept = h.kind(Resource::ConfigMaps);
    assert_eq!((kept.oldest, kept.watermark, kept.end()), (10, 10, 0));
    // A watch from before the hub's first poll is too old; from it, nothing yet.
    assert_eq!(kept.from(9), Start::TooOld(10));
    assert_eq!(kept.from(10), Start::Seq(0));
    let p2 = poll(
        &p1,
        2,
        &[(None, 20)],
        vec![item("a", "y", 15, &[]), item("b", "z", 12, &[])],
    );
    h.record(&p1, &p2);
    // x gone (at the list's version), y changed, z added: in resourceVersion order.
    assert_eq!(
        events(&h, 0),
        vec![
            e("ADDED", "z", 12),
            e("MODIFIED", "y", 15),
            e("DELETED", "x", 20)
        ]
    );
    let kept = h.kind(Resource::ConfigMaps);
    assert_eq!(kept.watermark, 20);
    assert_eq!(kept.from(12), Start::Seq(1));
    assert_eq!(kept.from(19), Start::Seq(2));
    assert_eq!(kept.from(20), Start::Seq(3));
    // Nothing changed: no change, the watermark moves on.
    let p3 = poll(
        &p2,
        3,
        &[(None, 30)],
        vec![item("a", "y", 15, &[]), item("b", "z", 12, &[])],
    );
    h.record(&p2, &p3);
    assert_eq!(h.kind(Resource::ConfigMaps).end(), 3);
    assert_eq!(h.kind(Resource::ConfigMaps).watermark, 30);
}

#[test]
fn with_several_scopes_a_change_waits_until_every_scope_is_listed_past_it() {
    let mut h = History::default();
    let empty = Held::empty(kinds());
    let p1 = poll(&empty, 1, &[(Some("a"), 90), (Some("b"), 95)], vec![]);
    h.record(&empty, &p1);
    // a listed at 110 with x at 108; b listed at 100 with w at 99 (and, unseen yet, a
    // change at 105 would be below b's next list).
    let p2 = poll(
        &p1,
        2,
        &[(Some("a"), 110), (Some("b"), 100)],
        vec![item("a", "x", 108, &[]), item("b", "w", 99, &[])],
    );
    h.record(&p1, &p2);
    assert_eq!(
        events(&h, 0),
        vec![e("ADDED", "w", 99)],
        "x waits for b's list"
    );
    let p3 = poll(
        &p2,
        3,
        &[(Some("a"), 120), (Some("b"), 115)],
        vec![
            item("a", "x", 108, &[]),
            item("b", "w", 99, &[]),
            item("b", "v", 104, &[]),
        ],
    );
    h.record(&p2, &p3);
    assert_eq!(
        events(&h, 0),
        vec![
            e("ADDED", "w", 99),
            e("ADDED", "v", 104),
            e("ADDED", "x", 108)
        ],
        "versions never go back"
    );
}

#[test]
fn a_watchers_selector_turns_a_change_into_what_it_sees() {
    let mut h = History::default();
    let empty = Held::empty(kinds());
    let team = [("team", "a")];
    let p1 = poll(&empty, 1, &[(None, 10)], vec![item("a", "x", 5, &team)]);
    h.record(&empty, &p1);
    let p2 = poll(&p1, 2, &[(None, 20)], vec![item("a", "x", 15, &[])]);
    h.record(&p1, &p2);
    let p3 = poll(&p2, 3, &[(None, 30)], vec![item("a", "x", 25, &team)]);
    h.record(&p2, &p3);
    let kept = h.kind(Resource::ConfigMaps);
    let of_team = |o: &HeldObject| o.label("team") == Some("a");
    let seen: Vec<serde_json::Value> = (kept.after(0).unwrap())
        .filter_map(|c| c.event(Resource::ConfigMaps, Form::Full, of_team))
        .map(|b| serde_json::from_slice(&b).unwrap())
        .collect();
    // It left the selector: DELETED with its last state, at the change's version; then
    // it came back: ADDED.
    assert_eq!(seen[0]["type"], "DELETED");
    assert_eq!(seen[0]["object"]["metadata"]["labels"]["team"], "a");
    assert_eq!(seen[0]["object"]["metadata"]["resourceVersion"], "15");
    assert_eq!(seen[0]["object"]["data"]["k"], "5", "its last state");
    assert_eq!(seen[1]["type"], "ADDED");
    assert_eq!(seen[1]["object"]["kind"], "ConfigMap");
    assert_eq!(seen.len(), 2);
}

#[test]
fn a_bounded_history_makes_old_versions_too_old() {
    let mut h = History::default();
    let mut prev = Held::empty(kinds());
    let first = poll(&prev, 1, &[(None, 1)], vec![]);
    h.record(&prev, &first);
    prev = first;
    for n in 2..(MAX_CHANGES as u64 + 10) {
        let next = poll(
            &prev,
            n,
            &[(None, n * 10)],
            vec![item("a", "x", n * 10 - 5, &[])],
        );
        h.record(&prev, &next);
        prev = next;
    }
    let kept = h.kind(Resource::ConfigMaps);
    assert!(kept.after(0).is_none(), "the start is gone");
    assert!(matches!(kept.from(20), Start::TooOld(_)));
    assert!(matches!(kept.from(kept.watermark), Start::Seq(_)));
}

#[test]
fn the_resource_version_is_set_where_apimachinery_writes_it() {
    let json = br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"resourceVersion","resourceVersion":"12","labels":{"resourceVersion":"x"}},"data":{"resourceVersion":"7"}}"#;
    let out = with_resource_version(json, 99);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"resourceVersion","resourceVersion":"99","labels":{"resourceVersion":"x"}},"data":{"resourceVersion":"7"}}"#
    );
}

/// An object whose JSON is `size` bytes.
fn big(name: &str, rv: u64, size: usize) -> crate::source::Item {
    let mut i = item("a", name, rv, &[]);
    if let Some(raw) = i.raw.as_mut() {
        let mut json = raw.json.to_vec();
        json.truncate(json.len() - 1);
        json.extend_from_slice(format!(",\"pad\":\"{}\"}}", "x".repeat(size)).as_bytes());
        raw.json = json.into();
    }
    i
}

/// Issue 56.4: the history is bounded in bytes, not only in changes: a large object
/// changed again and again keeps at most `MAX_BYTES` of its versions alive (the newest
/// always), and a watch from a version it dropped is too old.
#[test]
fn the_history_keeps_a_bounded_number_of_bytes() {
    let mut h = History::default();
    let mut prev = Held::empty(kinds());
    let size = 900 << 10;
    for n in 1..=300u64 {
        let next = poll(&prev, n, &[(None, 100 + n)], vec![big("x", 100 + n, size)]);
        h.record(&prev, &next);
        prev = next;
    }
    let kept = h.kind(Resource::ConfigMaps);
    assert!(kept.bytes() <= MAX_BYTES, "{} bytes", kept.bytes());
    let changes = kept.count();
    let each = 4 * size;
    assert!(
        changes >= MAX_BYTES / each - 1 && changes <= MAX_BYTES / each + 1,
        "{changes}"
    );
    assert_eq!(kept.from(150), Start::TooOld(kept.oldest));
    assert!(matches!(kept.from(399), Start::Seq(_)));
    // One change larger than the bound alone is still kept: the newest always is.
    let next = poll(&prev, 301, &[(None, 500)], vec![big("x", 500, MAX_BYTES)]);
    h.record(&prev, &next);
    let kept = h.kind(Resource::ConfigMaps);
    assert_eq!(kept.from(499), Start::Seq(kept.end() - 1));
}
