#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::runs::{RETELL, new_in, positions};
use super::*;
use crate::serve::fleet::intake::By;

fn text(hash: &str, modules: &[(&str, u8)]) -> Composition {
    Composition {
        content: String::new(),
        hash: hash.into(),
        encoded: Default::default(),
        gzipped: Default::default(),
        // Module i on lines 10i+1 to 10i+9.
        spans: (0..modules.len())
            .map(|i| (10 * i + 1, 10 * i + 9))
            .collect(),
        modules: (modules.iter()).map(|(k, v)| version(k, *v)).collect(),
    }
}

fn version(key: &str, v: u8) -> Version {
    Version {
        key: key.into(),
        hash: crate::poll::hash::Hash([v; 32]),
        rv: u64::from(v),
    }
}

fn reported(status: Status, message: &str) -> Reported {
    Reported {
        status,
        message: message.into(),
    }
}

/// Alloy's calls around a change, as the research saw them: the poll (old hash echoed,
/// new text sent), then the notify (new hash echoed, its status).
struct Alloy<'c> {
    c: &'c Collectors,
    attributes: Attributes,
}

impl Alloy<'_> {
    fn get(&self, echoed: &str, status: Option<&Reported>, sent: &Composition) {
        let asked = Asked {
            attributes: &self.attributes,
            hash: echoed,
            status,
            sent: Some(sent),
            at: 0,
        };
        self.c.asked("ns/pod", "x", asked, Instant::now());
    }

    fn kept(&self) -> Collector {
        self.c.get("ns/pod", "x").unwrap()
    }
}

/// A status is kept with the hash it was reported for, until another comes (Alloy sends
/// it once); `FAILED` names the module versions the collector had not confirmed.
#[test]
fn a_failure_is_about_the_versions_new_to_the_collector() {
    let c = Collectors::default();
    let a = Alloy {
        c: &c,
        attributes: Attributes::from([("team".to_string(), "a".to_string())]),
    };
    let (h1, h2) = (
        text("h1", &[("a/x", 1), ("b/y", 1)]),
        text("h2", &[("a/x", 2), ("b/y", 1), ("c/z", 1)]),
    );
    c.register("ns/pod", "x", "alloy", &a.attributes, Instant::now());
    // The first call after a start: UNSET, no status.
    a.get("", Some(&reported(Status::Unset, "")), &h1);
    assert_eq!(a.kept().status, None, "UNSET is no status");
    a.get("h1", Some(&reported(Status::Applied, "")), &h1);
    assert_eq!(a.kept().applied.unwrap().hash, "h1");
    assert_eq!(c.status()["applied"], 1);
    // A new text it cannot load: a/x's new version and c/z are what it refused.
    a.get("h1", None, &h2);
    let long = "e".repeat(5000);
    a.get("h2", Some(&reported(Status::Failed, &long)), &h2);
    a.get("h2", None, &h2);
    let kept = a.kept();
    let (r, hash) = kept.status.clone().unwrap();
    assert_eq!((r.status, hash.as_str()), (Status::Failed, "h2"));
    assert!(r.message.len() <= KEPT_MESSAGE, "{}", r.message.len());
    let refused: Vec<(&str, u8)> = kept
        .refused
        .iter()
        .map(|v| (&*v.key, v.hash.0[0]))
        .collect();
    assert_eq!(refused, [("a/x", 2), ("c/z", 1)]);
    assert_eq!(kept.applied.unwrap().hash, "h1", "it still runs h1");
    let page = c.status();
    assert_eq!(
        (page["applied"].as_u64(), page["failedCount"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(page["failed"][0]["collector"], "ns/pod");
    assert_eq!(
        page["failed"][0]["modules"],
        serde_json::json!(["a/x", "c/z"])
    );
    // Alloy's diagnostics point into c/z's lines (21 to 29): c/z alone. Into a/x's
    // lines (1 to 9) too: both. Into b/y's, which it runs, alone: none.
    let h3 = text("h3", &[("a/x", 2), ("b/y", 1), ("c/z", 2)]);
    a.get("h2", None, &h3);
    a.get(
        "h3",
        Some(&reported(Status::Failed, "25:3: bad; 4:1: other")),
        &h3,
    );
    assert_eq!(
        a.kept()
            .refused
            .iter()
            .map(|v| (&*v.key, v.hash.0[0]))
            .collect::<Vec<_>>(),
        [("a/x", 2), ("c/z", 2)]
    );
    a.get("h3", Some(&reported(Status::Failed, "25:3: bad")), &h3);
    assert_eq!(
        a.kept()
            .refused
            .iter()
            .map(|v| (&*v.key, v.hash.0[0]))
            .collect::<Vec<_>>(),
        [("c/z", 2)]
    );
    a.get(
        "h3",
        Some(&reported(Status::Failed, "15:3: in b/y, held")),
        &h3,
    );
    assert!(
        a.kept().refused.is_empty(),
        "b/y is no new version: none of the new ones"
    );
    // Its fetch failing while it runs h1: FAILED about nothing it was sent anew.
    a.get("h1", None, &h1);
    a.get(
        "h1",
        Some(&reported(Status::Failed, "unavailable: 503")),
        &h1,
    );
    assert!(a.kept().refused.is_empty());
    // Another identity's "x" is another collector.
    assert!(c.get("ns/other", "x").is_none());
    c.forget("ns/pod", "x");
    assert!(c.get("ns/pod", "x").is_none());
}

/// Full: the collector heard from longest ago makes room, of the identity that holds the
/// most; one identity holds its share at most, whatever ids and attributes it cycles, and
/// evicts none of the others' collectors.
#[test]
fn the_map_is_bounded_and_shared() {
    let c = Collectors::default();
    let t = Instant::now();
    let a = Attributes::new();
    for i in 0..MAX_COLLECTORS - 1 {
        let pod = format!("ns/pod-{i}");
        c.register(&pod, "x", "", &a, t + Duration::from_millis(i as u64));
    }
    // The first one, heard from again, is not the oldest any more.
    c.register("ns/pod-0", "x", "", &a, t + Duration::from_secs(3600));
    // A token cycling ids with the largest attributes a request may carry.
    let big: Attributes = (0..crate::serve::remotecfg::messages::MAX_ATTRIBUTES)
        .map(|i| (format!("{i:0256}"), "v".repeat(1024)))
        .collect();
    for i in 0..IDENTITY_COLLECTORS + 10 {
        let at = t + Duration::from_secs(3601 + i as u64);
        c.register("user:evil", &i.to_string(), "", &big, at);
    }
    assert!(c.len() <= MAX_COLLECTORS);
    let guard = c.kept.lock().unwrap();
    let kept = &guard.0;
    let evil = kept.iter().filter(|(k, _)| k.0 == "user:evil").count();
    assert!(kept.bytes() <= MAX_KEPT_BYTES, "{}", kept.bytes());
    assert!(evil > 0 && evil * 80_000 <= IDENTITY_BYTES, "{evil}");
    drop(guard);
    let pods = (0..MAX_COLLECTORS - 1)
        .filter(|i| c.get(&format!("ns/pod-{i}"), "x").is_some())
        .count();
    assert_eq!(pods, MAX_COLLECTORS - 1, "no pod's collector was evicted");
}

/// Only the position that opens each of Alloy's diagnostics (`LINE:COL: message`, joined
/// by `; `) points into a module: a module quoting `57:1:` in its own error text blames no
/// other module's lines.
#[test]
fn only_a_diagnostics_opening_position_counts() {
    assert_eq!(
        positions("3:5: invalid value \"see 57:1: here\"; -: no position"),
        [3]
    );
    assert_eq!(positions("25:3: bad; 4:1: other"), [25, 4]);
    assert_eq!(positions("7: no column"), [7]);
    assert!(positions("loading: 25:3: bad").is_empty());
    assert!(positions("unavailable: 503 Service Unavailable").is_empty());
    assert!(positions("12:x: not a column").is_empty());
}

/// What a collector says (its id, the hash it echoes, Alloy's message) reaches the log and
/// `/status` with its control characters escaped: no forged line, no colour.
#[test]
fn a_collectors_words_forge_no_log_line() {
    let c = Collectors::default();
    let a = Alloy {
        c: &c,
        attributes: Attributes::new(),
    };
    let h1 = text("h1", &[("a/x", 1)]);
    a.get("", None, &h1);
    let forged = "1:1: bad\n2026-12-07T20:00:00Z INFO all is well \u{1b}[2J";
    a.get("h1", Some(&reported(Status::Failed, forged)), &h1);
    let (r, hash) = a.kept().status.unwrap();
    assert!(
        !r.message.contains('\n') && !r.message.contains('\u{1b}'),
        "{}",
        r.message
    );
    assert!(r.message.contains("\\n2026"), "{}", r.message);
    let (_, line) = told(
        ("ns/pod\nx", "id\r\n"),
        &(r.clone(), format!("{hash}\u{1b}[31m")),
        1,
    );
    assert!(!line.chars().any(char::is_control), "{line}");
    assert!(
        line.contains("id\\r\\n of ns/pod\\nx failed to apply h1\\u{1b}"),
        "{line}"
    );
    assert_eq!(
        c.status()["failed"][0]["message"],
        serde_json::json!(r.message)
    );
}

/// `/status` names the first `SHOWN` failed collectors by (identity, id), whatever their
/// hashes and messages, and counts them all.
#[test]
fn status_shows_the_first_failed_by_identity_and_id() {
    let c = Collectors::default();
    let n = SHOWN + 5;
    for i in 0..n {
        // Hashes fall as ids rise: an order by anything but (identity, id) shows others.
        let sent = text(&format!("h{:02}", n - i), &[("a/x", 1)]);
        let id = format!("{i:02}");
        let get = |hash: &str, status: Option<&Reported>| {
            let asked = Asked {
                attributes: &Attributes::new(),
                hash,
                status,
                sent: Some(&sent),
                at: 0,
            };
            c.asked("who", &id, asked, Instant::now());
        };
        get("", None);
        get(&sent.hash, Some(&reported(Status::Failed, "1:1: no")));
    }
    let page = c.status();
    assert_eq!(page["failedCount"], n);
    let ids: Vec<&str> = (page["failed"].as_array().unwrap().iter())
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..SHOWN).map(|i| format!("{i:02}")).collect();
    assert_eq!(ids, want);
}

/// Review 61 (second), finding 3: the versions of a failed text new to a collector are
/// found in one walk of both lists (in key order), not one search of the confirmed list per
/// module sent: 10,000 modules cost at most 20,000 comparisons.
#[test]
fn a_failures_new_versions_are_found_in_one_walk() {
    let m = 10_000;
    let key = |i: usize| -> Box<str> { format!("ns/m{i:05}").into() };
    let sent: Vec<Version> = (0..m).map(|i| version(&key(i), 1)).collect();
    // It confirmed every other one, and one more at another version.
    let mut held: Vec<Version> = (0..m).step_by(2).map(|i| version(&key(i), 1)).collect();
    held[0] = version(&key(0), 2);
    let mut compared = 0;
    let new = new_in(&sent, &held, |a, b| {
        compared += 1;
        a.cmp(b)
    });
    let expected: Vec<usize> = (0..m).filter(|i| i % 2 == 1 || *i == 0).collect();
    assert_eq!(new, expected);
    assert!(
        compared <= sent.len() + held.len(),
        "{compared} comparisons"
    );
    assert_eq!(new_in(&sent, &[], |a, b| a.cmp(b)).len(), m);
    assert!(new_in(&sent, &sent, |a, b| a.cmp(b)).is_empty());
}

/// Review 61 (second), finding 7: a token sending a new `FAILED` message at every call has
/// `LINES_BURST` lines at `info`, then one a minute; the others go to `debug`, and another
/// identity's line is still said.
#[test]
fn failed_lines_are_rate_limited_per_identity() {
    let c = Collectors::default();
    let sent = text("h1", &[("a/x", 1)]);
    let t = Instant::now();
    let fail = |who: &str, i: usize, at: Instant| {
        let status = reported(Status::Failed, &format!("1:1: no {i}"));
        let asked = Asked {
            attributes: &Attributes::new(),
            hash: "h1",
            status: Some(&status),
            sent: Some(&sent),
            at: 0,
        };
        c.asked(who, "x", asked, at).0
    };
    let levels: Vec<_> = (0..20).map(|i| fail("flood", i, t)).collect();
    let info = levels
        .iter()
        .filter(|l| **l == Some(log::Level::Info))
        .count();
    assert_eq!(info, LINES_BURST as usize, "{levels:?}");
    assert_eq!(levels[19], Some(log::Level::Debug));
    assert_eq!(fail("other", 0, t), Some(log::Level::Info));
    assert_eq!(
        fail("flood", 99, t + Duration::from_secs(61)),
        Some(log::Level::Info)
    );
}

/// Review 61 (second), finding 4: the module lists the collectors hold are counted, once
/// each however many hold them, given back with their last holder, and bounded: a list
/// over `MAX_LIST_BYTES` is not kept (its collector keeps the hash alone).
#[test]
fn module_lists_are_counted_once_and_bounded() {
    let c = Collectors::default();
    let t = Instant::now();
    let ask = |id: &str, sent: &Composition| {
        let asked = Asked {
            attributes: &Attributes::new(),
            hash: "",
            status: None,
            sent: Some(sent),
            at: 0,
        };
        c.asked("who", id, asked, t);
    };
    let one = text("h1", &[("a/x", 1), ("a/y", 1)]);
    let n = lists::bytes(&one.modules);
    for id in 0..100 {
        ask(&id.to_string(), &one);
    }
    assert_eq!(c.list_bytes(), n, "one list, however many hold it");
    // The same set made again (its text left the cache): a second list.
    let again = text("h1", &[("a/x", 1), ("a/y", 1)]);
    ask("new", &again);
    assert_eq!(c.list_bytes(), 2 * n);
    let other = text("h2", &[("a/x", 2)]);
    for id in 0..100 {
        ask(&id.to_string(), &other);
    }
    let m = lists::bytes(&other.modules);
    assert_eq!(
        c.list_bytes(),
        n + m,
        "the first given back with its last holder"
    );
    c.forget("who", "new");
    assert_eq!(c.list_bytes(), m);
    // A list over the bound: its collector keeps the hash alone.
    let keys: Vec<String> = (0..lists::MAX_LIST_BYTES / 64)
        .map(|i| format!("a/{i:07}"))
        .collect();
    let huge: Vec<(&str, u8)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    let huge = text("h3", &huge);
    ask("huge", &huge);
    assert_eq!(c.list_bytes(), m);
    let kept = c.get("who", "huge").unwrap().sent.unwrap();
    assert_eq!((kept.hash.as_str(), kept.modules.len()), ("h3", 0));
}

/// What the fleet is told of a collector's calls (`fleet::collected`), made as
/// `service::get_config` makes them (the status first, then what it is sent): the hub's
/// version of the text it echoes (what it runs, but for a `FAILED`'s exceptions), the
/// namespaces of a new text, a text it runs — once it says `APPLIED` for it, or echoes its
/// hash with no `FAILED` of it (Alloy says `APPLIED` once, then runs each text it loads
/// without a word; a hub that never heard it takes the hash) — the exceptions of one it
/// failed, once; its fetch failing is no refusal; a wait once its calls are `APART`.
#[test]
fn the_fleet_hears_what_a_collector_runs_and_refuses() {
    let c = Collectors::default();
    let t = Instant::now();
    let call = |echoed: &str, status: Option<&Reported>, sent: &Composition, at: u64, s: u64| {
        let now = t + Duration::from_secs(s);
        let asked = Asked {
            attributes: &Attributes::new(),
            hash: echoed,
            status,
            sent: None,
            at: 0,
        };
        let first = c.asked("ns/pod", "x", asked, now).1;
        let asked = Asked {
            status: None,
            sent: Some(sent),
            at,
            ..asked
        };
        let then = c.asked("ns/pod", "x", asked, now).1;
        if matches!(first.change, Some(Change::Failed(_))) {
            assert_eq!(then.change, None, "a call says one thing");
        }
        Word {
            at: then.at.or(first.at),
            wait: then.wait,
            namespaces: then.namespaces,
            change: first.change.or(then.change),
        }
    };
    let ns = |n: &[&str]| Some(n.iter().map(|x| Box::from(*x)).collect::<Vec<_>>());
    let (h1, h2) = (
        text("h1", &[("a/x", 1)]),
        text("h2", &[("a/x", 1), ("b/y", 1)]),
    );
    let h3 = text("h3", &[("a/x", 1), ("b/y", 2), ("c/z", 1)]);
    let w = call("", Some(&reported(Status::Unset, "")), &h1, 3, 0);
    assert_eq!((w.at, w.change, w.wait), (None, None, None));
    assert_eq!(w.namespaces, ns(&["a"]));
    let w = call("h1", Some(&reported(Status::Applied, "")), &h1, 4, 0);
    assert_eq!((w.at, w.namespaces), (Some(4), None));
    assert_eq!(w.change, Some(Change::Applied(h1.modules.clone())));
    // Polled 10 s later: a new text; then its hash echoed, no status (it ran it).
    let w = call("h1", None, &h2, 6, 10);
    assert_eq!((w.at, w.change, w.wait), (None, None, Some(10)));
    assert_eq!(w.namespaces, ns(&["a", "b"]));
    let w = call("h2", None, &h2, 6, 10);
    assert_eq!((w.at, w.wait), (Some(6), None));
    assert_eq!(w.change, Some(Change::Applied(h2.modules.clone())));
    let w = call("h2", None, &h2, 7, 20);
    assert_eq!((w.at, w.change, w.wait), (Some(7), None, Some(10)));
    // h3 fails in c/z's lines (21 to 29): b/y's and c/z's new versions are exceptions,
    // c/z's refused, told once; it runs h2 but for them.
    call("h2", None, &h3, 8, 30);
    let w = call(
        "h3",
        Some(&reported(Status::Failed, "22:1: bad")),
        &h3,
        8,
        30,
    );
    assert_eq!(w.at, Some(8));
    let Some(Change::Failed(holds)) = w.change else {
        panic!("{:?}", w.change)
    };
    let told: Vec<_> = (holds.iter())
        .map(|h| {
            let refused = h
                .refused
                .as_ref()
                .map(|r| (r.hash.0[0], r.resource_version));
            (&*h.key, h.hash.map(|x| x.0[0]), h.resource_version, refused)
        })
        .collect();
    assert_eq!(
        told,
        [
            ("b/y", Some(1), Some(1), None),
            ("c/z", None, None, Some((1, Some(1))))
        ]
    );
    assert_eq!(holds[1].refused.as_ref().unwrap().by, By::Confirm);
    assert_eq!(&*holds[1].refused.as_ref().unwrap().reason, "22:1: bad");
    let again = call(
        "h3",
        Some(&reported(Status::Failed, "22:1: bad")),
        &h3,
        9,
        40,
    );
    assert_eq!((again.at, again.change), (Some(9), None), "said once");
    let w = call("h3", None, &h3, 9, 50);
    assert_eq!((w.at, w.change), (Some(9), None));
    // A new text failing with the same words: Alloy says nothing (its status did not
    // change), so the hash it echoes is of a text it failed too.
    let h5 = text("h5", &[("a/x", 1), ("b/y", 2), ("c/z", 2)]);
    call("h3", None, &h5, 10, 55);
    let w = call("h5", None, &h5, 10, 55);
    assert_eq!(w.at, Some(10));
    let Some(Change::Failed(holds)) = w.change else {
        panic!("{:?}", w.change)
    };
    let refused: Vec<&str> = (holds.iter())
        .filter(|h| h.refused.is_some())
        .map(|h| &*h.key)
        .collect();
    assert_eq!(refused, ["c/z"]);
    // Its fetch failing, about the text it was sent: no refusal, and what it runs is not
    // known until it says APPLIED.
    let h4 = text("h4", &[("a/x", 2)]);
    call("h5", None, &h4, 11, 60);
    let unavailable = reported(Status::Failed, "unavailable: 503 Service Unavailable");
    let w = call("h4", Some(&unavailable), &h4, 11, 60);
    assert_eq!((w.at, w.change), (None, None));
    assert!(c.get("ns/pod", "x").unwrap().refused.is_empty());
    let w = call("h4", None, &h4, 12, 70);
    assert_eq!((w.at, w.change), (None, None));
    let w = call("h4", Some(&reported(Status::Applied, "")), &h4, 12, 80);
    assert_eq!(w.at, Some(12));
    assert_eq!(w.change, Some(Change::Applied(h4.modules.clone())));
    // A hub that never heard this collector takes the hash it echoes.
    let fresh = Collectors::default();
    let asked = Asked {
        attributes: &Attributes::new(),
        hash: "h2",
        status: None,
        sent: Some(&h2),
        at: 12,
    };
    let w = fresh.asked("ns/pod", "x", asked, t).1;
    assert_eq!(w.at, Some(12));
    assert_eq!(w.change, Some(Change::Applied(h2.modules.clone())));
    // One that heard a FAILED before it knew the text: the text's exceptions made once it
    // does, every module (it confirmed none), the pointed one refused.
    let fresh = Collectors::default();
    let failed = reported(Status::Failed, "12:1: bad");
    let first = Asked {
        status: Some(&failed),
        sent: None,
        at: 0,
        ..asked
    };
    assert_eq!(fresh.asked("ns/pod", "x", first, t).1.change, None);
    let w = fresh.asked("ns/pod", "x", asked, t).1;
    assert_eq!(w.at, Some(12));
    let Some(Change::Failed(holds)) = w.change else {
        panic!("{:?}", w.change)
    };
    let told: Vec<(&str, bool)> = (holds.iter())
        .map(|h| (&*h.key, h.refused.is_some()))
        .collect();
    assert_eq!(told, [("a/x", false), ("b/y", true)]);
}

/// What the fleet did not take is told with the next word, unless that one says newer.
#[test]
fn what_the_fleet_did_not_take_is_told_next() {
    let c = Collectors::default();
    let t = Instant::now();
    let h1 = text("h1", &[("a/x", 1)]);
    let asked = Asked {
        attributes: &Attributes::new(),
        hash: "",
        status: None,
        sent: Some(&h1),
        at: 3,
    };
    let w = c.asked("ns/pod", "x", asked, t).1;
    assert_eq!(w.namespaces, Some(vec!["a".into()]));
    c.untold("ns/pod", "x", w, t);
    let again = Asked {
        hash: "h1",
        ..asked
    };
    let w = c.asked("ns/pod", "x", again, t).1;
    assert_eq!(w.namespaces, Some(vec!["a".into()]), "told again");
    assert_eq!(w.change, Some(Change::Applied(h1.modules.clone())));
    let w = c.asked("ns/pod", "x", again, t).1;
    assert_eq!((w.namespaces, w.change), (None, None), "told once");
    // Every RETELL, the namespaces again.
    let w = c.asked("ns/pod", "x", again, t + RETELL).1;
    assert_eq!(w.namespaces, Some(vec!["a".into()]));
}
