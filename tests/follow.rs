//! A follower watching a hub (issue 48.2), against a scripted hub (`util::fakehub`) that
//! does what the real one never does on purpose: a stream cut in the middle of an event,
//! an event and a bookmark older than what the follower holds, a 410 at a chosen moment,
//! and a hub that refuses watch. The real hub is followed in `tests/real/follow.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::util::fakehub::{
    FakeHub, asked_rv, bookmark, configmap, event, expired, hold, list, watch, watch_open,
};
use crate::util::{Cmpoll, Daemon, spec_hash};

/// `cmpoll run` following `hub` (plain HTTP, with a token) in namespace `team`, every
/// second, its events on stdout.
fn follower(hub: &FakeHub) -> Daemon {
    follower_with(hub, &[])
}

/// `follower`, with `more` flags.
fn follower_with(hub: &FakeHub, more: &[&str]) -> Daemon {
    let c = Cmpoll::new();
    let token = c.write("token", "follower-token");
    Daemon::start(
        c,
        &[
            "--server",
            &hub.url,
            "--allow-insecure-http",
            "--token-file",
            token.to_str().unwrap(),
            "--namespace",
            "team",
            "--interval",
            "1s",
            "--stdout-events",
        ]
        .iter()
        .chain(more)
        .copied()
        .collect::<Vec<_>>(),
    )
}

fn hash(v: &str) -> String {
    spec_hash(&[("k", v.as_bytes())])
}

/// The (type, module, hash) of a batch's events but `synced`.
fn changes(batch: &[serde_json::Value]) -> Vec<(String, String, String)> {
    (batch.iter())
        .filter(|e| e["type"] != "synced")
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["module"].as_str().unwrap().to_string(),
                e["hash"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every Never of a watching follower, in one sequence: a watch cut in the middle of an
/// event changes nothing (the next watch asks from the same version, and the complete
/// event before the cut was not taken either); an event (a deletion too) and a bookmark
/// older than what it holds are not taken; a 410 is a relist, taken whole.
#[test]
fn a_watching_follower_takes_only_complete_changes_and_never_goes_back() {
    let lists = Arc::new(Mutex::new(0));
    let watches = Arc::new(Mutex::new(0));
    let (l, w) = (lists.clone(), watches.clone());
    let hub = FakeHub::start(move |line| {
        if !line.contains("watch=true") {
            *l.lock().unwrap() += 1;
            return match *l.lock().unwrap() {
                1 => list(10, &[configmap("team", "a", 10, "1")]),
                _ => list(
                    20,
                    &[
                        configmap("team", "a", 18, "4"),
                        configmap("team", "b", 19, "1"),
                    ],
                ),
            };
        }
        *w.lock().unwrap() += 1;
        let n = *w.lock().unwrap();
        match n {
            // A complete change, then the next cut in its middle, no bookmark.
            1 => watch(
                &[
                    event("MODIFIED", &configmap("team", "a", 11, "2")),
                    event("ADDED", &configmap("team", "b", 11, "x")),
                ],
                Some(30),
            ),
            // An event older than what it holds, then a change, then a deletion older
            // than what it holds (issue 56.3: a hub that held a change back released it
            // to a follower past it), committed.
            2 => watch(
                &[
                    event("MODIFIED", &configmap("team", "a", 9, "old")),
                    event("MODIFIED", &configmap("team", "a", 12, "3")),
                    event("DELETED", &configmap("team", "a", 10, "3")),
                    bookmark(12),
                ],
                None,
            ),
            // A bookmark older than what it holds: nothing changed, nothing goes back.
            3 => watch(&[bookmark(8)], None),
            4 => watch(&[expired()], None),
            _ => {
                std::thread::sleep(Duration::from_millis(300));
                watch(&[bookmark(20)], None)
            }
        }
    });
    let d = follower(&hub);
    let within = Duration::from_secs(20);
    assert_eq!(
        changes(&d.batch(within)),
        vec![("added".into(), "team/a".into(), hash("1"))]
    );
    assert_eq!(
        changes(&d.batch(within)),
        vec![("updated".into(), "team/a".into(), hash("3"))],
        "neither the cut watch's complete event nor the older ones"
    );
    assert_eq!(
        changes(&d.batch(within)),
        vec![
            ("updated".into(), "team/a".into(), hash("4")),
            ("added".into(), "team/b".into(), hash("1"))
        ],
        "the relist after the 410, whole"
    );
    crate::util::eventually("a watch after the relist", Duration::from_secs(10), || {
        hub.watches().len() >= 5
    });
    let asked: Vec<Option<u64>> = hub.watches().iter().map(|l| asked_rv(l)).take(5).collect();
    assert_eq!(
        asked,
        vec![Some(10), Some(10), Some(12), Some(12), Some(20)],
        "each watch from the version held: {:?}",
        hub.requests.lock().unwrap()
    );
    assert_eq!(
        *lists.lock().unwrap(),
        2,
        "one list at the start, one after the 410"
    );
    d.stop();
}

/// A hub that does not watch (an older one: 405) is followed with lists, as before.
#[test]
fn a_hub_that_refuses_watch_is_followed_with_lists() {
    let hub = FakeHub::start(move |line| {
        if line.contains("watch=true") {
            let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"watch is not supported on resources of kind \"configmaps\"","reason":"MethodNotAllowed","details":{"kind":"configmaps"},"code":405}"#;
            return format!(
                "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: application/json\r\nx-cmpoll-hub: old\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes();
        }
        list(10, &[configmap("team", "a", 10, "1")])
    });
    let d = follower(&hub);
    assert_eq!(changes(&d.batch(Duration::from_secs(20))).len(), 1);
    crate::util::eventually("lists after the refusal", Duration::from_secs(20), || {
        let r = hub.requests.lock().unwrap();
        r.iter().filter(|l| !l.contains("watch=true")).count() >= 3
    });
    assert_eq!(hub.watches().len(), 1, "asked once");
    assert!(
        d.stderr().contains("following it with waiting lists"),
        "{}",
        d.stderr()
    );
    d.stop();
}

/// A hub that goes quiet on a held watch (frozen, or its connection blackholed: the
/// stream stays open and nothing comes) is given up once its wait plus 10 s pass without a
/// bookmark: the poll fails and `/readyz` says so (ready before), and the next watch, from
/// the version held, brings the change (ready again). (A follower that waited on the
/// stream for ever would hold its modules behind a hub that no longer serves, ready all
/// the while: k8s-sidecar#621's dead watch.)
#[test]
fn a_hub_that_goes_quiet_on_its_watch_is_given_up() {
    let watches = Arc::new(Mutex::new(0));
    let w = watches.clone();
    let hub = FakeHub::start(move |line| {
        if !line.contains("watch=true") {
            return list(10, &[configmap("team", "a", 10, "1")]);
        }
        *w.lock().unwrap() += 1;
        match *w.lock().unwrap() {
            // One bookmark, then nothing on an open connection.
            1 => hold(watch_open(&[bookmark(10)], None)),
            _ => {
                // Back, after a while (the follower is not ready meanwhile).
                std::thread::sleep(Duration::from_secs(2));
                hold(watch_open(
                    &[
                        event("MODIFIED", &configmap("team", "a", 11, "2")),
                        bookmark(11),
                    ],
                    None,
                ))
            }
        }
    });
    let listen = format!("127.0.0.1:{}", crate::util::tools::free_port());
    let d = follower_with(&hub, &["--listen", &listen]);
    assert_eq!(changes(&d.batch(Duration::from_secs(20))).len(), 1);
    let started = std::time::Instant::now();
    let readyz = || crate::util::http::get(&listen, "/readyz");
    // Ready while the hub answers (health hears of a poll after its sinks do).
    crate::util::http::until(&listen, "/readyz", 200);
    crate::util::eventually(
        "/readyz says the hub went quiet",
        Duration::from_secs(30),
        || {
            let (code, text) = readyz();
            code == 503 && text.contains("the last poll of the hub failed")
        },
    );
    let batch = d.batch(Duration::from_secs(40));
    let took = started.elapsed();
    assert_eq!(
        changes(&batch),
        vec![("updated".into(), "team/a".into(), hash("2"))]
    );
    let log = d.stderr();
    assert!(log.contains("said nothing on its watch"), "{log}");
    // Its wait is 1 s (the interval): given up after 11 s, not before.
    assert!(took >= Duration::from_secs(10), "{took:?}\n{log}");
    let asked: Vec<Option<u64>> = hub.watches().iter().map(|l| asked_rv(l)).collect();
    assert_eq!(asked, vec![Some(10), Some(10)], "{log}");
    crate::util::http::until(&listen, "/readyz", 200);
    d.stop();
}

/// A follower holding a watch sends no request for up to an hour, but takes a rotated
/// token file when the file changes, and says so (the kubelet's rotation is in the log
/// when it happens): the watch held all the while, no request made since the rotation.
#[test]
fn a_rotated_token_is_taken_while_a_watch_is_held() {
    let hub = FakeHub::start(move |line| match line.contains("watch=true") {
        true => hold(watch_open(&[bookmark(10)], None)),
        false => list(10, &[configmap("team", "a", 10, "1")]),
    });
    let d = follower(&hub);
    assert_eq!(changes(&d.batch(Duration::from_secs(20))).len(), 1);
    crate::util::eventually("the watch held", Duration::from_secs(10), || {
        hub.watches().len() == 1
    });
    let asked = hub.requests.lock().unwrap().len();
    let token = d.cmd.path("token");
    std::fs::write(token.with_file_name("token.new"), "rotated-token").unwrap();
    std::fs::rename(token.with_file_name("token.new"), &token).unwrap();
    crate::util::eventually("the re-read logged", Duration::from_secs(5), || {
        d.stderr()
            .contains("token file re-read (changed): using the new token")
    });
    let log = d.stderr();
    assert!(!log.contains("said nothing on its watch"), "{log}");
    assert_eq!(hub.requests.lock().unwrap().len(), asked, "{log}");
    d.stop();
}

/// A poll that fails in one scope after another scope's held watch gave it a change keeps
/// nothing of it, the change included: the next poll watches that scope again from the
/// version it holds, and the hub's history sends the change again. (Held at once, the
/// change would have been lost: the next watch would start past it.)
#[test]
fn a_change_taken_by_a_poll_that_fails_elsewhere_comes_again() {
    let (team, other) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(0)));
    let (t, o) = (team.clone(), other.clone());
    let hub = FakeHub::start(move |line| {
        let team_scope = line.contains("/namespaces/team/");
        if !line.contains("watch=true") {
            return match team_scope {
                true => list(10, &[configmap("team", "a", 10, "1")]),
                false => list(10, &[]),
            };
        }
        if team_scope {
            *t.lock().unwrap() += 1;
            return hold(watch_open(
                &[
                    event("MODIFIED", &configmap("team", "a", 11, "2")),
                    bookmark(11),
                ],
                None,
            ));
        }
        *o.lock().unwrap() += 1;
        match *o.lock().unwrap() {
            // The other scope's first watch fails: the poll fails after team's change.
            1 => b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nx-cmpoll-hub: fake\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops".to_vec(),
            _ => hold(watch_open(&[bookmark(10)], None)),
        }
    });
    // After "team" in the scopes' order (namespaces are listed sorted).
    let d = follower_with(&hub, &["--namespace", "zz"]);
    let within = Duration::from_secs(30);
    assert_eq!(
        changes(&d.batch(within)),
        vec![("added".into(), "team/a".into(), hash("1"))]
    );
    assert_eq!(
        changes(&d.batch(within)),
        vec![("updated".into(), "team/a".into(), hash("2"))],
        "the change of the failed poll, again\n{}",
        d.stderr()
    );
    let team_watches: Vec<Option<u64>> = (hub.watches().iter())
        .filter(|l| l.contains("/namespaces/team/"))
        .map(|l| asked_rv(l))
        .collect();
    assert_eq!(
        team_watches,
        vec![Some(10), Some(10)],
        "watched again from what it held"
    );
    assert!(*other.lock().unwrap() >= 2);
    d.stop();
}

/// Changes for a scripted hub to send, each its version and events.
type Queue = Arc<Mutex<Vec<(u64, Vec<String>)>>>;

/// A hub whose watches bring the changes `queue` holds (each the events of one
/// change, committed by a bookmark at `rv`; version 0: a 500, a failed poll), one a
/// watch, and otherwise a bookmark after a while: each watch a poll that ends, so that a
/// test can count polls by watches.
fn scripted_changes(queue: Queue) -> FakeHub {
    let rv = Arc::new(Mutex::new(10));
    FakeHub::start(move |line| {
        if !line.contains("watch=true") {
            return list(10, &[configmap("team", "a", 10, "1")]);
        }
        let next = {
            let mut c = queue.lock().unwrap();
            (!c.is_empty()).then(|| c.remove(0))
        };
        match next {
            Some((0, _)) => b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nx-cmpoll-hub: fake\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops".to_vec(),
            Some((at, mut events)) => {
                *rv.lock().unwrap() = at;
                events.push(bookmark(at));
                watch(&events, None)
            }
            None => {
                std::thread::sleep(Duration::from_millis(200));
                watch(&[bookmark(*rv.lock().unwrap())], None)
            }
        }
    })
}

/// Waits until `hub` has seen `more` watches beyond those it has seen now: polls that
/// committed, and so the moment a report would have gone.
fn polls_pass(hub: &FakeHub, more: usize) {
    let seen = hub.watches().len();
    crate::util::eventually("later polls", Duration::from_secs(20), || {
        hub.watches().len() >= seen + more
    });
}

/// Issue 59: a follower reports to its hub what it holds otherwise than served — once
/// after its first batch (nothing: it holds what it was served), with its token and its
/// wait; nothing while nothing changes; the same again after a failed poll of the hub
/// (which may have restarted); nothing after an update it takes (the hub reads that off
/// its watch); and its `--validate` refusal of a newer version (it still holds the good
/// one), the reason and the refused hash with it.
#[test]
fn a_follower_reports_what_it_holds_when_it_changes() {
    let queue = Arc::new(Mutex::new(Vec::new()));
    let hub = scripted_changes(queue.clone());
    let d = follower_with(&hub, &["--validate", "! grep -rq reject-me ."]);
    let within = Duration::from_secs(20);
    assert_eq!(changes(&d.batch(within)).len(), 1);
    let reported = |n: usize| {
        crate::util::eventually_explained(
            &format!("{n} report(s)"),
            within,
            || hub.reports.lock().unwrap().len() >= n,
            || format!("{:?}\n{}", hub.reported(), d.stderr()),
        );
        hub.reported()
    };
    let first = &reported(1)[0];
    assert_eq!(first, &serde_json::json!({"modules": []}));
    let posted = hub.reports.lock().unwrap()[0].clone();
    assert_eq!(posted.header("x-cmpoll-wait"), Some("1"), "{posted:?}");
    assert_eq!(posted.header("content-type"), Some("application/json"));
    assert_eq!(
        posted.header("authorization"),
        Some("Bearer follower-token")
    );
    // Two polls later, nothing changed: nothing sent.
    polls_pass(&hub, 2);
    assert_eq!(hub.reported().len(), 1, "unchanged: {:?}", hub.reported());
    queue.lock().unwrap().push((0, vec![]));
    assert_eq!(&reported(2)[1], first, "after a failed poll");
    queue.lock().unwrap().push((
        11,
        vec![event("MODIFIED", &configmap("team", "a", 11, "2"))],
    ));
    assert_eq!(
        changes(&d.batch(within)),
        vec![("updated".into(), "team/a".into(), hash("2"))]
    );
    // Taken as served: nothing to tell, two polls on.
    polls_pass(&hub, 2);
    assert_eq!(hub.reported().len(), 2, "taken: {:?}", hub.reported());
    queue.lock().unwrap().push((
        12,
        vec![event("MODIFIED", &configmap("team", "a", 12, "reject-me"))],
    ));
    assert_eq!(
        changes(&d.batch(within)),
        vec![("rejected".into(), "team/a".into(), hash("reject-me"))]
    );
    let refused = &reported(3)[2]["modules"][0];
    assert_eq!(
        refused["hash"],
        hash("2"),
        "it holds the good one: {refused}"
    );
    assert_eq!(refused["refused"]["hash"], hash("reject-me"), "{refused}");
    assert_eq!(
        refused["resourceVersion"], "11",
        "the version held: {refused}"
    );
    assert_eq!(
        refused["refused"]["resourceVersion"], "12",
        "the version refused: {refused}"
    );
    assert_eq!(refused["refused"]["by"], "validate", "{refused}");
    let reason = refused["refused"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("validator exited with status 1"),
        "{reason}"
    );
    polls_pass(&hub, 2);
    assert_eq!(
        hub.reported().len(),
        3,
        "{}",
        serde_json::to_string(&hub.reported()).unwrap()
    );
    d.stop();
}

/// A hub that takes no reports (404: an older one) hears none again from this follower,
/// though what it holds changes; the follower says so once, at info, and goes on.
#[test]
fn a_hub_that_takes_no_reports_hears_none_again() {
    let queue = Arc::new(Mutex::new(Vec::new()));
    let hub = scripted_changes(queue.clone());
    *hub.report_status.lock().unwrap() = 404;
    let d = follower_with(&hub, &["--validate", "! grep -rq reject-me ."]);
    let within = Duration::from_secs(20);
    assert_eq!(changes(&d.batch(within)).len(), 1);
    crate::util::eventually("a report", within, || hub.reported().len() == 1);
    // A refusal, which a hub that takes reports would hear of.
    queue.lock().unwrap().push((
        11,
        vec![event("MODIFIED", &configmap("team", "a", 11, "reject-me"))],
    ));
    assert_eq!(
        changes(&d.batch(within)),
        vec![("rejected".into(), "team/a".into(), hash("reject-me"))]
    );
    polls_pass(&hub, 3);
    assert_eq!(hub.reported().len(), 1, "{:?}", hub.reported());
    let log = d.stderr();
    assert_eq!(log.matches("takes no reports").count(), 1, "{log}");
    assert!(!log.contains("follower-token"), "{log}");
    d.stop();
}

/// A hub that fails the reports (500): each is tried again with backoff, the warning said
/// once for the kind of failure, never the token, each try counted.
#[test]
fn a_failing_report_is_retried_and_warned_about_once() {
    let hub = scripted_changes(Arc::default());
    *hub.report_status.lock().unwrap() = 500;
    let listen = format!("127.0.0.1:{}", crate::util::tools::free_port());
    let d = follower_with(&hub, &["--listen", &listen]);
    let within = Duration::from_secs(20);
    assert_eq!(changes(&d.batch(within)).len(), 1);
    let errors = || {
        let metrics = crate::util::http::get(&listen, "/metrics").1;
        assert!(
            metrics.contains("cmpoll_hub_reports_total{result=\"ok\"} 0"),
            "{metrics}"
        );
        (metrics.lines())
            .find_map(|l| l.strip_prefix("cmpoll_hub_reports_total{result=\"error\"} "))
            .and_then(|n| n.parse::<u64>().ok())
    };
    crate::util::eventually("three tries, counted", within, || errors() >= Some(3));
    assert!(hub.reported().len() >= 3);
    let log = d.stderr();
    let warned = log
        .matches("cannot report to the hub what this follower holds")
        .count();
    assert_eq!(warned, 1, "{log}");
    assert!(log.contains("500"), "{log}");
    assert!(!log.contains("follower-token"), "{log}");
    let reported = hub.reported();
    assert!(reported.iter().all(|r| r == &reported[0]), "{reported:?}");
    d.stop();
}
