//! `cmpoll run`: the loop, its events, its faults and its signals, with the real binary.

use std::time::{Duration, Instant};

use serde_json::json;
use test_apiserver::{
    ConfigMap, Credential, Fault, Kubeconfig, Match, Route, TOKEN, TestApiserver, USER,
};

use crate::util::{Cmpoll, Daemon, SOON, eventually, spec_hash};

/// A module whose one key is `config.alloy`.
fn alloy(ns: &str, name: &str, v: &str) -> ConfigMap {
    crate::util::labelled(ns, name).data("config.alloy", v)
}

fn hash(v: &str) -> String {
    spec_hash(&[("config.alloy", v.as_bytes())])
}

/// An event without the fields that depend on the run (uid, resourceVersion).
fn short(e: &serde_json::Value) -> serde_json::Value {
    let mut e = e.clone();
    if let Some(o) = e.as_object_mut() {
        o.remove("uid");
        o.remove("resourceVersion");
    }
    e
}

fn added(ns: &str, name: &str, v: &str) -> serde_json::Value {
    json!({"type": "added", "module": format!("{ns}/{name}"), "kind": "ConfigMap", "namespace": ns, "name": name,
           "hash": hash(v), "files": {"config.alloy": v}})
}

fn synced(modules: u64, added: u64, updated: u64, removed: u64) -> impl Fn(&serde_json::Value) {
    move |e: &serde_json::Value| {
        assert_eq!(e["type"], "synced", "{e}");
        assert_eq!(
            (
                e["modules"].as_u64(),
                e["added"].as_u64(),
                e["updated"].as_u64(),
                e["removed"].as_u64()
            ),
            (Some(modules), Some(added), Some(updated), Some(removed)),
            "{e}"
        );
    }
}

#[test]
fn events_follow_the_cluster_exactly() {
    let s = TestApiserver::start();
    s.put(alloy("apps", "b", "b1"));
    s.put(alloy("apps", "a", "a1"));
    s.put(ConfigMap::new("apps", "other").data("x", "y"));
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "50ms"]);

    let first = d.batch(SOON);
    assert_eq!(first.len(), 3);
    assert_eq!(short(&first[0]), added("apps", "a", "a1"));
    assert_eq!(short(&first[1]), added("apps", "b", "b1"));
    let obj = s.get("apps", "a").unwrap();
    assert_eq!(first[0]["uid"], obj.uid.as_str());
    assert_eq!(
        first[0]["resourceVersion"],
        obj.resource_version.to_string()
    );
    synced(2, 2, 0, 0)(&first[2]);
    assert_eq!(first[2]["poll"], 1);

    // An update.
    s.put(alloy("apps", "a", "a2"));
    let b = d.batch(SOON);
    assert_eq!(b.len(), 2);
    assert_eq!(
        short(&b[0]),
        json!({"type": "updated", "module": "apps/a", "kind": "ConfigMap", "namespace": "apps", "name": "a",
               "hash": hash("a2"), "files": {"config.alloy": "a2"}})
    );
    synced(2, 0, 1, 0)(&b[1]);

    // A label-only edit and a delete + re-create with the same content: silence.
    s.put(
        alloy("apps", "a", "a2")
            .label("team", "x")
            .annotation("note", "y"),
    );
    s.delete("apps", "b");
    s.put(alloy("apps", "b", "b1"));
    d.quiet_through(&s, 2, 1);

    // Removal by deletion and by a label that no longer matches, then an addition.
    s.delete("apps", "a");
    s.put(
        ConfigMap::new("apps", "b")
            .label("cmpoll.io/module", "false")
            .data("config.alloy", "b1"),
    );
    let b = d.batch(SOON);
    assert_eq!(
        b[..2].iter().map(short).collect::<Vec<_>>(),
        [
            json!({"type": "removed", "module": "apps/a", "kind": "ConfigMap", "namespace": "apps", "name": "a", "hash": hash("a2")}),
            json!({"type": "removed", "module": "apps/b", "kind": "ConfigMap", "namespace": "apps", "name": "b", "hash": hash("b1")}),
        ]
    );
    synced(0, 0, 0, 2)(&b[2]);
    s.put(alloy("web", "c", "c1"));
    let b = d.batch(SOON);
    assert_eq!(short(&b[0]), added("web", "c", "c1"));
    synced(1, 1, 0, 0)(&b[1]);
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn an_empty_cluster_still_gets_a_first_batch() {
    let s = TestApiserver::start();
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "50ms"]);
    let b = d.batch(SOON);
    assert_eq!(b.len(), 1);
    synced(0, 0, 0, 0)(&b[0]);
    d.quiet_through(&s, 2, 1);
    d.stop();
}

/// Each fault: no event while it lasts, the daemon stays up, and a change made during the
/// fault is reported once it clears.
#[test]
fn retry_after_is_a_floor_for_the_next_poll() {
    let s = TestApiserver::start();
    s.put(alloy("a", "one", "1"));
    // The floor is itself capped at the backoff cap, min(10 × interval, 5 min): 2 s here.
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "200ms"]);
    d.batch(SOON);
    s.fault(Match::lists(), Fault::TooManyRequests(1), 1);
    let hit = Instant::now();
    while !s.requests().iter().any(|r| r.status == 429) {
        assert!(hit.elapsed() < SOON);
        std::thread::sleep(Duration::from_millis(5));
    }
    // The next attempt after the 429.
    let after = |reqs: &[test_apiserver::Recorded]| {
        reqs.iter()
            .position(|r| r.status == 429)
            .is_some_and(|i| i + 1 < reqs.len())
    };
    eventually("the next poll after the 429", SOON, || after(&s.requests()));
    let reqs = s.requests();
    let i = reqs.iter().position(|r| r.status == 429).unwrap();
    let next = &reqs[i + 1];
    let gap = next.at.duration_since(reqs[i].at);
    assert!(
        gap >= Duration::from_millis(950),
        "waited {gap:?} after Retry-After: 1"
    );
    d.stop();
}

#[test]
fn an_expired_continue_token_never_yields_a_partial_batch() {
    let s = TestApiserver::start();
    for i in 0..5 {
        s.put(alloy("p", &format!("m{i}"), "v"));
    }
    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "50ms", "--page-size", "2"],
    );
    assert_eq!(d.batch(SOON).len(), 6);
    // Every continue token is now too old: each poll falls back to one unpaged list.
    s.fault_always(
        Match::continue_pages(),
        Fault::Status(
            410,
            "Expired".into(),
            "The provided continue parameter is too old to display a consistent list result."
                .into(),
        ),
    );
    s.put(alloy("p", "m3", "changed"));
    let b = d.batch(SOON);
    assert_eq!(
        b.len(),
        2,
        "exactly the change, no removals from missing pages: {b:?}"
    );
    assert_eq!(b[0]["module"], "p/m3");
    assert_eq!(b[0]["type"], "updated");
    // Each poll: a first page, a 410 on the next, one unpaged list.
    d.quiet_through(&s, 2, 2);
    d.stop();
}

#[test]
fn steady_state_is_served_from_the_watch_cache() {
    let s = TestApiserver::start();
    s.put(alloy("a", "one", "1"));
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "30ms"]);
    d.batch(SOON);
    while s.requests().len() < 6 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let reqs = s.requests();
    assert_eq!(reqs[0].param("resourceVersion"), Some("0"));
    assert_eq!(reqs[0].param("resourceVersionMatch"), None);
    for r in &reqs[1..5] {
        assert_eq!(
            r.param("resourceVersionMatch"),
            Some("NotOlderThan"),
            "{r:?}"
        );
        assert_eq!(
            r.param("resourceVersion"),
            Some(s.revision().to_string().as_str())
        );
        assert_eq!(r.param("limit"), None);
    }
    assert!(
        reqs.iter().all(|r| r.route == Route::Cache),
        "no poll reached etcd"
    );
    d.stop();
}

#[test]
fn a_lagging_cache_504_falls_back_to_resource_version_zero() {
    let s = TestApiserver::start();
    s.put(alloy("a", "one", "1"));
    let behind = s.revision();
    s.bump_revision();
    s.bump_revision();
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "30ms"]);
    d.batch(SOON);
    // Another apiserver, whose cache is two revisions behind what cmpoll saw.
    s.freeze_cache_at(behind);
    s.clear_requests();
    let started = Instant::now();
    while !s.requests().iter().any(|r| r.status == 504) {
        assert!(started.elapsed() < SOON, "no 504: {:?}", s.requests());
        std::thread::sleep(Duration::from_millis(5));
    }
    eventually("the fallback after the 504", SOON, || {
        let reqs = s.requests();
        reqs.iter()
            .position(|r| r.status == 504)
            .is_some_and(|i| i + 1 < reqs.len())
    });
    let reqs = s.requests();
    let i = reqs.iter().position(|r| r.status == 504).unwrap();
    assert_eq!(reqs[i].param("resourceVersionMatch"), Some("NotOlderThan"));
    assert_eq!(
        reqs[i + 1].param("resourceVersion"),
        Some("0"),
        "the fallback, at once"
    );
    assert_eq!(reqs[i + 1].status, 200);
    // Each poll: the 504 and the fallback.
    d.quiet_through(&s, 2, 2);
    assert!(d.stderr().contains("Too large resource version"));
    d.stop();
}

#[test]
fn a_rotated_token_file_is_picked_up_without_a_restart() {
    let s = TestApiserver::start();
    s.put(alloy("a", "one", "1"));
    let c = Cmpoll::new();
    let token = c.write("token", TOKEN);
    let kc = s.write_kubeconfig(
        &c.path("kubeconfig"),
        &Kubeconfig::with(Credential::TokenFile(token.clone())),
    );
    let d = Daemon::start(
        c.env("KUBECONFIG", kc.to_str().unwrap()),
        &["--interval", "50ms"],
    );
    d.batch(SOON);
    // Kubelet's atomic swap: a new file renamed over the old one; the old token revoked.
    s.add_token("rotated-token", USER);
    let next = token.with_file_name("token.new");
    std::fs::write(&next, "rotated-token\n").unwrap();
    std::fs::rename(&next, &token).unwrap();
    s.revoke_token(TOKEN);
    s.put(alloy("a", "one", "2"));
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "updated");
    assert_eq!(
        s.requests().last().unwrap().bearer.as_deref(),
        Some("rotated-token")
    );
    d.stop();
}

#[test]
fn a_401_re_reads_the_token_file_and_retries_at_once() {
    let s = TestApiserver::start();
    s.put(alloy("a", "one", "1"));
    let c = Cmpoll::new();
    let token = c.write("token", TOKEN);
    let kc = s.write_kubeconfig(
        &c.path("kubeconfig"),
        &Kubeconfig::with(Credential::TokenFile(token.clone())),
    );
    let d = Daemon::start(
        c.env("KUBECONFIG", kc.to_str().unwrap()),
        &["--interval", "1h"],
    );
    d.batch(SOON);
    // The file is rewritten in place with its old size and mtime (same inode): nothing but
    // the 401 tells cmpoll to read it again.
    let mtime = std::fs::metadata(&token).unwrap().modified().unwrap();
    s.add_token("cmpoll-test-tokeX", USER);
    std::fs::write(&token, "cmpoll-test-tokeX").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&token)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    s.revoke_token(TOKEN);
    s.put(alloy("a", "one", "2"));
    s.clear_requests();
    d.signal("HUP");
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "updated");
    let codes: Vec<u16> = s.requests().iter().map(|r| r.status).collect();
    // The (metadata) list: 401, one retry right away, then the GET of what changed.
    assert_eq!(codes, [401, 200, 200], "one retry, right away");
    d.stop();
}

#[test]
fn sighup_polls_now_and_sigterm_exits_zero_mid_interval() {
    let s = TestApiserver::start();
    s.put(alloy("a", "one", "1"));
    let mut d = Daemon::start(Cmpoll::against(&s), &["--interval", "1h"]);
    d.batch(SOON);
    s.put(alloy("a", "one", "2"));
    // With an hour's interval nothing polls until the SIGHUP.
    let lists = s.requests().len();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.requests().len(), lists, "no poll before the SIGHUP");
    d.signal("HUP");
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "updated");
    let t = Instant::now();
    d.signal("TERM");
    assert_eq!(d.wait(Duration::from_secs(1)), Some(0));
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn sigterm_does_not_wait_for_a_hanging_request() {
    let s = TestApiserver::start();
    s.fault_always(Match::lists(), Fault::Delay(Duration::from_secs(30)));
    let mut d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "1s", "--timeout", "60s"],
    );
    while s.requests().is_empty() && d.is_running() {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    d.signal("INT");
    assert_eq!(d.wait(Duration::from_secs(2)), Some(0));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[test]
fn a_closed_stdout_stops_cmpoll_with_a_message() {
    let s = TestApiserver::start();
    s.put(alloy("a", "one", "1"));
    let c = Cmpoll::against(&s).args(&["run", "--interval", "20ms"]);
    let mut child = c.spawn();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 64];
    std::io::Read::read(&mut out, &mut buf).unwrap();
    drop(out);
    s.put(alloy("a", "one", "2"));
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("stdout was closed (its reader went away)"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn once_polls_applies_and_exits() {
    let s = TestApiserver::start();
    s.put(alloy("a", "one", "1"));
    let run = Cmpoll::against(&s).args(&["run", "--once"]).run().success();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[1].starts_with(r#"{"type":"synced","modules":1,"added":1"#));
    s.fault(Match::lists(), Fault::InternalError, 1);
    let run = Cmpoll::against(&s)
        .args(&["run", "--once"])
        .run()
        .failure(1);
    assert!(run.stdout.is_empty(), "a failed poll emits nothing");
    assert!(run.error_line().contains("500 InternalError"));
}

#[test]
fn logs_one_line_per_batch_and_per_failure_none_per_idle_poll() {
    let s = TestApiserver::start();
    s.put(alloy("a", "one", "1"));
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "20ms"]);
    d.batch(SOON);
    // Idle polls, one that fails, and idle polls again: each proved by the lists served.
    d.quiet_through(&s, 5, 1);
    s.fault(Match::lists(), Fault::InternalError, 1);
    eventually("the failed poll", SOON, || {
        s.requests().iter().any(|r| r.status == 500)
    });
    d.quiet_through(&s, 5, 1);
    eventually("its warning", SOON, || d.stderr().contains("WARN"));
    let err = d.stderr();
    let batch_lines = err
        .lines()
        .filter(|l| l.contains("INFO") && l.contains(" modules, "))
        .count();
    let warn_lines = err.lines().filter(|l| l.contains("WARN")).count();
    assert_eq!((batch_lines, warn_lines), (1, 1), "{err}");
    assert!(
        err.lines().count() <= 4,
        "idle polls are quiet at info: {err}"
    );
    d.stop();
}

#[test]
fn manifests_folders_are_polled_too() {
    let c = Cmpoll::new();
    c.write("m/a.yaml", "kind: ConfigMap\nmetadata: {name: a, namespace: apps, labels: {cmpoll.io/module: 'true'}}\ndata: {k: one}\n");
    let dir = c.path("m");
    let d = c.daemon(&["--interval", "30ms", "--manifests", dir.to_str().unwrap()]);
    assert_eq!(d.batch(SOON)[0]["files"]["k"], "one");
    std::fs::write(dir.join("a.yaml"), "kind: ConfigMap\nmetadata: {name: a, namespace: apps, labels: {cmpoll.io/module: 'true'}}\ndata: {k: two}\n").unwrap();
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["files"]["k"].as_str()),
        (Some("updated"), Some("two"))
    );
    d.stop();
}

/// A ConfigMap without a key `--keys` selects is not a module, and that is logged once per
/// version of it, not once per poll.
#[test]
fn a_configmap_without_selected_keys_is_logged_once_per_version() {
    let s = TestApiserver::start();
    let none = |v: &str| {
        ConfigMap::new("a", "none")
            .label("cmpoll.io/module", "true")
            .data("k", v)
    };
    s.put(none("v"));
    s.put(
        ConfigMap::new("a", "some")
            .label("cmpoll.io/module", "true")
            .data("x.alloy", "1"),
    );
    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "20ms", "--keys", "*.alloy"],
    );
    let b = d.batch(SOON);
    assert_eq!(b.len(), 2, "only a/some is a module: {b:?}");
    d.quiet_through(&s, 5, 1);
    let said = |log: &str| {
        log.matches("configmap a/none: none of its 1 keys matches --keys")
            .count()
    };
    assert_eq!(said(&d.stderr()), 1, "{}", d.stderr());
    s.put(none("changed"));
    d.quiet_through(&s, 3, 1);
    assert_eq!(
        said(&d.stderr()),
        2,
        "a new version is said again\n{}",
        d.stderr()
    );
    d.stop();
}
