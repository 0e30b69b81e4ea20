//! Followers that watch the hub (issue 48.2), on the real apiserver: `cmpoll run` whose
//! role lets it `watch` follows a hub by watching it — a change arrives as the hub's poll
//! finds it, as one event, never as a list — and two hubs behind one address never take
//! it back in time. (The Never clauses against a hub that misbehaves: `tests/follow.rs`.)

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_apiserver::real::RealApiserver;

use super::hub::*;
use super::*;
use crate::util::{Cmpoll, Daemon, SOON, eventually_explained};

/// What a follower's role grants it: the hub authorizes `watch` too.
fn watch_rules() -> Value {
    json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get", "watch"]}])
}

fn counter(hub: &Hub, scraper: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let (_, _, metrics) = get(&hub.url(), &hub.ca, scraper, "/metrics", &[]);
    metric_sum(&String::from_utf8_lossy(&metrics), name, labels)
}

/// A follower with a 5-minute interval, allowed to watch, sees each change within the
/// hub's interval: it holds one watch that carries every change (no request a change), it
/// never waits on a list, and each change costs it one event and a bookmark, not the list.
#[test]
fn a_follower_that_may_watch_follows_its_hub_by_watching() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-follow");
    let put = |v: &str| put_module(k, &ns, "m", "k.yaml", v);
    put("one");
    for i in 0..50 {
        // Others in the scope: a list would carry them all.
        put_module(k, &ns, &format!("other-{i}"), "k.yaml", &"x".repeat(2000));
    }
    let hub = start_hub(
        k,
        &hub_account(k, &ns, "hub"),
        &["--namespace", &ns, "--interval", "1s"],
    );
    let token = follower(k, &ns, "reader", watch_rules(), false);
    let scraper = scraper(k, &ns);
    let c = Cmpoll::new();
    let kubeconfig = hub_kubeconfig(&c, &hub, &token, "hub.kubeconfig");
    let listen = format!("127.0.0.1:{}", crate::util::tools::free_port());
    let d = Daemon::start(
        c.env("KUBECONFIG", kubeconfig.to_str().unwrap()),
        &["--namespace", &ns, "--interval", "5m", "--listen", &listen],
    );
    let first = d.batch(SOON);
    assert_eq!(first.len(), 52, "51 modules and synced");
    let watches = || {
        counter(
            &hub,
            &scraper,
            "cmpoll_serve_watches_total",
            &[("by", "follower")],
        )
    };
    let waits = || counter(&hub, &scraper, "cmpoll_serve_waits_total", &[]);
    // What the follower read from its hub (bodies, after gzip decoding).
    let read = || {
        let (_, text) = crate::util::http::get(&listen, "/metrics");
        metric_sum(&text, "cmpoll_apiserver_response_bytes_total", &[])
    };
    let connections = || counter(&hub, &scraper, "cmpoll_serve_connections_total", &[]);
    let (waited, before) = (waits(), read());
    let accepted = connections();
    let mut delays = Vec::new();
    for round in ["two", "three", "four"] {
        std::thread::sleep(Duration::from_millis(300));
        let at = Instant::now();
        put(round);
        let batch = d.batch(Duration::from_secs(20));
        delays.push(at.elapsed());
        assert_eq!(batch.len(), 2, "{batch:?}");
        assert_eq!(batch[0]["type"], "updated");
        assert_eq!(batch[0]["files"]["k.yaml"], round);
    }
    // The scrape that reads this count is one connection; the follower kept its own.
    let new = connections() - accepted - 1.0;
    let per_change = (read() - before) / 3.0;
    eprintln!(
        "write to follower: {delays:?}; {per_change} bytes read a change; {new} new connections"
    );
    assert_eq!(
        new, 0.0,
        "the follower keeps its connection: {new} new ones for 3 changes"
    );
    assert!(
        delays.iter().all(|d| *d < Duration::from_secs(5)),
        "{delays:?}"
    );
    assert_eq!(watches(), 1.0, "one held watch carried the three changes");
    assert_eq!(waits(), waited, "it never waited on a list");
    // What it read for a change: the event (about 1 KiB) and a bookmark, not a list of 51
    // objects (100 KiB).
    assert!(
        per_change > 100.0 && per_change < 3000.0,
        "{per_change} bytes a change"
    );
    let log = d.stderr();
    assert!(!log.contains("WARN"), "{log}");
    d.stop();
}

/// Two hubs behind one address, one of them behind: a watching follower that holds the
/// newer hub's state and finds itself on the older one takes nothing from it (its watch
/// from the version it holds sees nothing newer there: no module goes back), and takes
/// the newer state again from the newer hub.
#[test]
fn a_watching_follower_never_goes_back_between_two_hubs() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-two-watch");
    let put = |v: &str| put_module(k, &ns, "m", "k.yaml", v);
    put("old");
    let hub_token = hub_account(k, &ns, "hub");
    let behind = start_hub(k, &hub_token, &["--namespace", &ns, "--interval", "1h"]);
    put("new");
    let ahead = start_hub(k, &hub_token, &["--namespace", &ns, "--interval", "1s"]);
    let c = Cmpoll::new();
    let both = c.write("hubs-ca.crt", &(behind.ca_pem.clone() + &ahead.ca_pem));
    let token = follower(k, &ns, "reader", watch_rules(), false);
    let token_file = c.write("token", &token);
    let switch = Switch::new(vec![ahead.port, behind.port]);
    let d = Daemon::start(
        c,
        &[
            "--server",
            &format!("https://127.0.0.1:{}", switch.port),
            "--ca-file",
            both.to_str().unwrap(),
            "--token-file",
            token_file.to_str().unwrap(),
            "--namespace",
            &ns,
            "--interval",
            "2s",
        ],
    );
    let first = d.batch(SOON);
    assert_eq!(first[0]["files"]["k.yaml"], "new", "{first:?}");
    // Let it watch the hub ahead once, then move it to the hub behind.
    std::thread::sleep(Duration::from_secs(3));
    switch.to(1);
    let quiet = Instant::now() + Duration::from_secs(10);
    while Instant::now() < quiet {
        if let Ok(e) = d_event(&d, Duration::from_millis(200)) {
            panic!("the follower took an older answer: {e}\n{}", d.stderr());
        }
    }
    switch.to(0);
    put("newer");
    let batch = d.batch(Duration::from_secs(40));
    assert_eq!(
        batch[0]["files"]["k.yaml"],
        "newer",
        "{batch:?}\n{}",
        d.stderr()
    );
    eventually_explained(
        "it watched",
        Duration::from_secs(1),
        || !d.stderr().contains("following it with waiting lists"),
        || d.stderr(),
    );
    drop(behind);
    drop(ahead);
}

/// Issue 49.3: a hub told to stop (SIGTERM) is not ready at once, so that its Service sends
/// it no one new, then lets its watchers go over its drain window, spread — each stream
/// ends at a moment of its own, so that its followers reconnect to the other hubs spread,
/// not at one instant — and exits 0 when the window is over.
#[test]
fn a_stopping_hub_lets_its_watchers_go_spread_over_its_drain_window() {
    let Some((_one, k)) = cluster_alone() else {
        return;
    };
    let ns = k.namespace("hub-drain");
    put_module(k, &ns, "m", "k.yaml", "one");
    let mut hub = start_hub(
        k,
        &hub_account(k, &ns, "hub"),
        &["--namespace", &ns, "--drain-window", "6s"],
    );
    let token = follower(k, &ns, "reader", watch_rules(), false);
    let path = format!("/api/v1/namespaces/{ns}/configmaps?watch=true&resourceVersion=0");
    let mut watchers: Vec<super::watch::Watching> = (0..16)
        .map(|_| super::watch::Watching::start(&hub.url(), &hub.ca, &token, &path, &[], 120))
        .collect();
    crate::util::eventually("every watcher has the state", SOON, || {
        watchers.iter().all(|w| !w.events().is_empty())
    });
    let sent = Instant::now();
    hub.d.signal("TERM");
    let readyz = || {
        let (code, _, body) = get(&hub.url(), &hub.ca, "", "/readyz", &[]);
        (code, String::from_utf8_lossy(&body).to_string())
    };
    crate::util::eventually("not ready", Duration::from_secs(2), || readyz().0 == 503);
    let open_then = watchers.iter_mut().map(|w| w.open()).filter(|o| *o).count();
    let (_, body) = readyz();
    assert!(body.contains("stopping"), "{body}");
    // Not ready, and still serving whoever comes before the Service has moved on: on a
    // connection it then closes.
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    let (code, headers, _) = get(&hub.url(), &hub.ca, &token, &list, &[]);
    assert_eq!(code, 200, "a stopping hub still serves");
    assert!(headers.contains("connection: close"), "{headers}");
    assert!(
        open_then >= 12,
        "not ready before most watchers went: {open_then} open"
    );
    let mut ended = vec![None; watchers.len()];
    while ended.iter().any(Option::is_none) && sent.elapsed() < Duration::from_secs(15) {
        for (i, w) in watchers.iter_mut().enumerate() {
            if ended[i].is_none() && !w.open() {
                ended[i] = Some(sent.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut ended: Vec<Duration> = ended
        .into_iter()
        .map(|e| e.expect("a watch never ended"))
        .collect();
    ended.sort();
    eprintln!("watches ended after SIGTERM: {ended:?}");
    let (first, last) = (ended[0], ended[ended.len() - 1]);
    assert!(
        last < Duration::from_secs(8),
        "all within the window: {ended:?}"
    );
    assert!(
        last - first > Duration::from_secs(2),
        "spread over the window, not at one instant: {ended:?}"
    );
    let code = hub.d.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{}", hub.d.stderr());
    assert!(
        sent.elapsed() >= Duration::from_millis(5500),
        "it served until its window was over: {:?}",
        sent.elapsed()
    );
}

/// How long after the apiserver's own watcher a `cmpoll run` following `hub` (in `ns`)
/// and a watcher of the hub hold each of three writes, each at another moment of the
/// hub's poll: (follower, watcher) delays, each sorted.
fn after_the_apiserver(
    k: &RealApiserver,
    hub: &Hub,
    token: &str,
    ns: &str,
) -> (Vec<Duration>, Vec<Duration>) {
    let c = Cmpoll::new();
    let kubeconfig = hub_kubeconfig(&c, hub, token, "hub.kubeconfig");
    let d = Daemon::start(
        c.env("KUBECONFIG", kubeconfig.to_str().unwrap()),
        &["--namespace", ns, "--interval", "1s"],
    );
    assert_eq!(d.batch(SOON).len(), 2, "m and synced");
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    let version = |base: &str, ca: &std::path::Path| {
        let (code, _, body) = get(base, ca, token, &list, &[]);
        assert_eq!(code, 200);
        let list: Value = serde_json::from_slice(&body).unwrap();
        list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (mut follower, mut watcher) = (Vec::new(), Vec::new());
    for (v, pause) in [("three", 1300), ("four", 1700), ("five", 2100)] {
        // The quiet namespace (if any) stays quiet for more than one of the hub's polls.
        std::thread::sleep(Duration::from_millis(pause));
        let watch = |base: &str, ca: &std::path::Path| {
            let path = format!("{list}?watch=true&resourceVersion={}", version(base, ca));
            super::watch::Watching::start(base, ca, token, &path, &[], 30)
        };
        let (api, at_hub) = (watch(&k.url, &k.ca_file()), watch(&hub.url(), &hub.ca));
        std::thread::sleep(Duration::from_millis(300));
        put_module(k, ns, "m", "k.yaml", v);
        let batch = d.batch(Duration::from_secs(30));
        let held = Instant::now();
        assert_eq!(batch[0]["type"], "updated", "{batch:?}");
        assert_eq!(batch[0]["files"]["k.yaml"], v, "{batch:?}");
        let seen = api.first_event_at(Duration::from_secs(10));
        follower.push(held.saturating_duration_since(seen));
        let event = at_hub.first_event_at(Duration::from_secs(30));
        watcher.push(event.saturating_duration_since(seen));
        assert_eq!(at_hub.events()[0]["type"], "MODIFIED");
    }
    let log = d.stderr();
    assert!(!log.contains("WARN"), "{log}");
    d.stop();
    follower.sort();
    watcher.sort();
    (follower, watcher)
}

/// Issue 56.2: a hub of two namespaces delivers a change in one of them about one poll
/// after its write, however quiet the other: a watcher of the hub and a `cmpoll run`
/// follower of the busy namespace hold it within about a second of the apiserver's own
/// watcher (on 55fa4de they waited for a write to the quiet namespace: nothing in 120 s,
/// while `/readyz` was green). A follower of a one-scope hub polling every second holds
/// a change within 1.5 s of its write (the median of three).
#[test]
fn a_change_in_one_namespace_does_not_wait_for_a_quiet_neighbour() {
    let Some((_one, k)) = cluster_alone() else {
        return;
    };
    let (a, b) = (k.namespace("hub-busy"), k.namespace("hub-quiet"));
    put_module(k, &a, "m", "k.yaml", "one");
    put_module(k, &b, "n", "k.yaml", "one");
    let token = follower(k, &a, "reader", watch_rules(), false);
    let hub = start_hub(
        k,
        &hub_account(k, &a, "hub"),
        &["--namespace", &a, "--namespace", &b, "--interval", "1s"],
    );
    // Idle, the hub of two namespaces asks the apiserver its short watches alone: no list.
    std::thread::sleep(Duration::from_secs(2));
    let mark = k.audit_mark();
    std::thread::sleep(Duration::from_secs(4));
    let hub_user = format!("system:serviceaccount:{a}:hub");
    let asked: Vec<Value> = (k.audit_since(mark).into_iter())
        .filter(|e| e["user"]["username"] == hub_user.as_str() && e["stage"] == "ResponseComplete")
        .collect();
    let verbs: Vec<&str> = asked.iter().filter_map(|e| e["verb"].as_str()).collect();
    assert!(verbs.len() >= 4, "short watches in 4 s: {verbs:?}");
    assert!(verbs.iter().all(|v| *v == "watch"), "{:?}", show(&asked));
    let (follower, watcher) = after_the_apiserver(k, &hub, &token, &a);
    eprintln!(
        "two scopes, one quiet: the apiserver's watcher to the follower {follower:?}, to a watcher of the hub {watcher:?}"
    );
    // About one poll: well within 5 s even on a busy machine (55fa4de: never).
    assert!(follower[2] < Duration::from_secs(5), "{follower:?}");
    assert!(watcher[2] < Duration::from_secs(5), "{watcher:?}");
    drop(hub);
    let one = start_hub(
        k,
        &hub_account(k, &a, "hub-one"),
        &["--namespace", &a, "--interval", "1s"],
    );
    let (follower, _) = after_the_apiserver(k, &one, &token, &a);
    eprintln!("one scope: the apiserver's watcher to the follower {follower:?}");
    assert!(follower[1] < Duration::from_millis(1500), "{follower:?}");
}

/// Issue 56.3: a follower never takes a deletion older than what it holds. On 55fa4de, a
/// hub of two namespaces held `a/x`'s deletion and re-creation back (the other namespace
/// quiet); a follower started afterwards listed `x` at its new version, then got the
/// deletion when a write to the quiet namespace released it, removed `x` and dropped its
/// re-creation as old: `x` gone from the follower while the hub served it. The next change
/// after that write is the proof the moment passed: it arrives alone.
#[test]
fn a_follower_never_takes_a_deletion_older_than_what_it_holds() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let (a, b) = (k.namespace("hub-gone"), k.namespace("hub-still"));
    put_module(k, &a, "x", "k.yaml", "one");
    put_module(k, &a, "y", "k.yaml", "one");
    put_module(k, &b, "n", "k.yaml", "one");
    let token = follower(k, &a, "reader", watch_rules(), false);
    let hub = start_hub(
        k,
        &hub_account(k, &a, "hub"),
        &["--namespace", &a, "--namespace", &b, "--interval", "1s"],
    );
    let list = format!("/api/v1/namespaces/{a}/configmaps");
    let served = |name: &str| {
        let (code, _, body) = get(&hub.url(), &hub.ca, &token, &list, &[]);
        assert_eq!(code, 200);
        let v: Value = serde_json::from_slice(&body).unwrap();
        (v["items"].as_array().unwrap().iter()).any(|i| i["metadata"]["name"] == name)
    };
    k.delete("configmap", &a, "x");
    crate::util::eventually("the hub without x", SOON, || !served("x"));
    put_module(k, &a, "x", "k.yaml", "two");
    crate::util::eventually("the hub with x again", SOON, || served("x"));
    let c = Cmpoll::new();
    let kubeconfig = hub_kubeconfig(&c, &hub, &token, "hub.kubeconfig");
    let d = Daemon::start(
        c.env("KUBECONFIG", kubeconfig.to_str().unwrap()),
        &["--namespace", &a, "--interval", "1s"],
    );
    let first = d.batch(SOON);
    assert_eq!(first.len(), 3, "x, y and synced: {first:?}");
    // A write to the other namespace, and the hub past it.
    let rv: u64 = k
        .put_configmap(&b, "n", &[LABEL], &[("k.yaml", "two")])
        .parse()
        .unwrap();
    let other = format!("/api/v1/namespaces/{b}/configmaps");
    let other_token = follower(k, &b, "reader", watch_rules(), false);
    crate::util::eventually("the hub past the write", SOON, || {
        let (_, _, body) = get(&hub.url(), &hub.ca, &other_token, &other, &[]);
        serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
            v["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
        }) >= Some(rv)
    });
    std::thread::sleep(Duration::from_secs(2));
    put_module(k, &a, "y", "k.yaml", "two");
    let next = d.batch(Duration::from_secs(30));
    let types: Vec<String> = (next.iter())
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap(),
                e["module"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        types,
        [format!("updated {a}/y"), "synced ".to_string()],
        "{next:?}"
    );
    assert!(served("x"));
    d.stop();
}
