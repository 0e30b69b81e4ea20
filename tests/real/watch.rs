//! The hub's watch against the real apiserver's (issue 48.1): the same writes, watched
//! through both with the same request and token, give the same events — after the hub's
//! documented deviations (docs/serve.md, "Watch"): writes within one poll arrive as one
//! event, a `DELETED` carries the version of the poll that saw the object gone, versions
//! older than the hub's history are too old. The refusals (422, 403) are compared too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_apiserver::real::RealApiserver;

use super::hub::*;
use super::*;

/// A watch made with curl (`-N`: unbuffered), writing its events to a file.
pub(crate) struct Watching {
    child: Child,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Watching {
    pub(crate) fn start(
        base: &str,
        ca: &Path,
        token: &str,
        path: &str,
        headers: &[&str],
        secs: u64,
    ) -> Watching {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("events");
        let mut cmd = Command::new("curl");
        cmd.args(["-sN", "--max-time", &secs.to_string(), "--cacert"])
            .arg(ca)
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg("-o")
            .arg(&out);
        for h in headers {
            cmd.args(["-H", h]);
        }
        let child = cmd
            .arg(format!("{base}{path}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Watching {
            child,
            out,
            _dir: dir,
        }
    }

    /// Whether curl is still reading.
    pub(crate) fn open(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The events so far.
    pub(crate) fn events(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        (text.lines())
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// When its first event arrived (waited for up to `within`): the last change of the
    /// file curl writes the events to, for a watch that gets one event.
    pub(crate) fn first_event_at(&self, within: Duration) -> Instant {
        assert_eq!(self.until(1, within).len(), 1, "one event");
        let modified = std::fs::metadata(&self.out).unwrap().modified().unwrap();
        let ago = std::time::SystemTime::now()
            .duration_since(modified)
            .unwrap_or_default();
        Instant::now() - ago
    }

    /// Waits until it has `n` events (or `within` passes): the events.
    fn until(&self, n: usize, within: Duration) -> Vec<Value> {
        let started = Instant::now();
        loop {
            let e = self.events();
            if e.len() >= n || started.elapsed() > within {
                return e;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An event as compared: its type and object, without what differs by design.
fn comparable(e: &Value) -> Value {
    let mut e = e.clone();
    if e["type"] == "DELETED" || e["type"] == "BOOKMARK" {
        // The hub's DELETED carries its poll's version; a bookmark is each server's.
        e["object"]["metadata"]["resourceVersion"] = json!("<rv>");
    }
    e
}

fn types(events: &[Value]) -> Vec<String> {
    (events.iter())
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap_or(""),
                e["object"]["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// The hub's list version of `ns`, once it is at least `rv` (the hub has polled past a
/// write).
fn hub_reaches(hub: &Hub, token: &str, ns: &str, rv: u64) {
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    crate::util::eventually("the hub past the write", Duration::from_secs(15), || {
        let (code, _, body) = get(&hub.url(), &hub.ca, token, &path, &[]);
        code == 200
            && serde_json::from_slice::<Value>(&body).unwrap()["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|v| v >= rv)
    });
}

/// One write, then time for the hub to poll it alone (its interval is 1 s).
fn write(k: &RealApiserver, ns: &str, name: &str, labels: &[(&str, &str)], v: &str) -> u64 {
    let rv = k
        .put_configmap(ns, name, labels, &[("k", v)])
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1600));
    rv
}

/// Issue 48.1: one sequence of writes — an object created, changed, moved out of and
/// back into a watcher's selector, out of the hub's selection, deleted — watched through
/// the real apiserver and through the hub from the same version with the same selector:
/// the same events in the same order, objects byte for byte as served (the `DELETED`s'
/// versions are the hub's polls'). Then the streaming list from both.
#[test]
fn a_watch_of_the_hub_sees_what_a_watch_of_the_apiserver_sees() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-watch");
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--namespace", &ns]);
    let rules = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get", "watch"]}]);
    let token = follower(k, &ns, "watcher", rules, false);
    let module = ("cmpoll.io/module", "true");
    let start = write(k, &ns, "before", &[module, ("team", "a")], "0");
    hub_reaches(&hub, &token, &ns, start);
    let selector = "labelSelector=cmpoll.io%2Fmodule%3Dtrue%2Cteam%3Da";
    let path =
        format!("/api/v1/namespaces/{ns}/configmaps?watch=true&resourceVersion={start}&{selector}");
    let api = Watching::start(&k.url, &k.ca_file(), &token, &path, &[], 60);
    let at_hub = Watching::start(&hub.url(), &hub.ca, &token, &path, &[], 60);
    std::thread::sleep(Duration::from_millis(500));
    write(k, &ns, "m", &[module, ("team", "a")], "1"); // ADDED
    write(k, &ns, "m", &[module, ("team", "a")], "2"); // MODIFIED
    write(k, &ns, "m", &[module, ("team", "b")], "2"); // DELETED: left the watcher's selector
    write(k, &ns, "m", &[module, ("team", "a")], "3"); // ADDED: back
    write(k, &ns, "m", &[("team", "a")], "3"); // DELETED: out of the hub's selection
    write(k, &ns, "m", &[module, ("team", "a")], "4"); // ADDED
    k.delete("configmap", &ns, "m"); // DELETED
    std::thread::sleep(Duration::from_millis(1600));
    let want = 7;
    let (a, h) = (
        api.until(want, Duration::from_secs(10)),
        at_hub.until(want, Duration::from_secs(10)),
    );
    eprintln!("the apiserver's events: {}", types(&a).join(", "));
    assert_eq!(a.len(), want, "{}", types(&a).join(", "));
    assert_eq!(types(&h), types(&a), "the hub's events are the apiserver's");
    for (x, y) in a.iter().zip(&h) {
        assert_eq!(comparable(y), comparable(x));
    }
    // The hub's DELETEDs carry versions that never go back.
    let versions: Vec<u64> = (h.iter())
        .map(|e| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(versions.windows(2).all(|w| w[0] <= w[1]), "{versions:?}");
    drop((api, at_hub));

    // The streaming list: the state, then the bookmark that ends it.
    write(k, &ns, "n", &[module, ("team", "a")], "5");
    let now = k.put_configmap(&ns, "o", &[module, ("team", "a")], &[("k", "6")]);
    hub_reaches(&hub, &token, &ns, now.parse().unwrap());
    let path = format!(
        "/api/v1/namespaces/{ns}/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&{selector}"
    );
    let api = Watching::start(&k.url, &k.ca_file(), &token, &path, &[], 10);
    let at_hub = Watching::start(&hub.url(), &hub.ca, &token, &path, &[], 10);
    let (a, h) = (
        api.until(4, Duration::from_secs(8)),
        at_hub.until(4, Duration::from_secs(8)),
    );
    assert_eq!(types(&h), types(&a));
    assert_eq!(
        a.len(),
        4,
        "before, n, o and the bookmark: {}",
        types(&a).join(", ")
    );
    for (x, y) in a.iter().zip(&h) {
        assert_eq!(comparable(y), comparable(x));
    }
}

/// Issue 48.1: a watch's refusals are the apiserver's: the 422s of options that do not go
/// together, and the 403 of a token allowed to list but not to watch; a watch of a version
/// older than the hub's history is the watch cache's `ERROR` event (410 Expired).
#[test]
fn a_watchs_refusals_are_the_apiservers() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-watch-no");
    put_module(k, &ns, "m", "k.yaml", "v");
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--namespace", &ns]);
    let watcher = follower(
        k,
        &ns,
        "watcher",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get", "watch"]}]),
        false,
    );
    let lister = follower(k, &ns, "lister", cm_rules(), false);
    let base = format!("/api/v1/namespaces/{ns}/configmaps");
    for (token, query) in [
        (&watcher, "watch=true&resourceVersionMatch=NotOlderThan"),
        (&watcher, "watch=true&sendInitialEvents=true"),
        (
            &watcher,
            "watch=true&sendInitialEvents=true&resourceVersionMatch=Exact",
        ),
        (&watcher, "resourceVersionMatch=NotOlderThan"),
        (&watcher, "resourceVersionMatch=Exact&resourceVersion=0"),
        (&lister, "watch=true"),
        (&lister, "watch=true&fieldSelector=metadata.name%3Dm"),
    ] {
        let path = format!("{base}?{query}");
        let (api_code, _, api_body) = get(&k.url, &k.ca_file(), token, &path, &[]);
        let (hub_code, _, hub_body) = get(&hub.url(), &hub.ca, token, &path, &[]);
        assert_eq!(
            hub_code,
            api_code,
            "{query}: {}",
            String::from_utf8_lossy(&hub_body)
        );
        let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap();
        assert_eq!(parse(&hub_body), parse(&api_body), "{query}");
    }
    // Too old: the watch cache's words, as one ERROR event, then the end.
    let (code, _, body) = get(
        &hub.url(),
        &hub.ca,
        &watcher,
        &format!("{base}?watch=true&resourceVersion=1"),
        &[],
    );
    assert_eq!(code, 200);
    let text = String::from_utf8_lossy(&body).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let e: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["reason"], "Expired");
    assert_eq!(e["object"]["code"], 410);
    assert!(
        e["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version: 1 ("),
        "{e}"
    );
}

/// The events of a watch's whole answer (one JSON object a line), as `types` shows them.
fn answer_events(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let events: Vec<Value> = (text.lines())
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    types(&events)
}

/// Issue 56.1: a request that names one object is about that object alone, and is
/// authorized for its own verb, as the apiserver does: a watch of `…/watch/…/a` by a
/// token whose role names only `a` streams `a`'s changes and never `b`'s; a field
/// selector naming another object is the apiserver's 400; `…/a?watch=true` is a GET of
/// `a`; and a kept `list` decision admits neither a `watch` nor a `get`. Each answer is
/// compared with the real apiserver's to the same request and token.
#[test]
fn a_request_about_one_object_is_about_that_object_alone() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-named");
    put_module(k, &ns, "a", "k.yaml", "0");
    put_module(k, &ns, "b", "k.yaml", "0");
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--namespace", &ns]);
    let named = follower(
        k,
        &ns,
        "named",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "watch"],
                "resourceNames": ["a"]}]),
        false,
    );
    let lister = follower(
        k,
        &ns,
        "lister",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]),
        false,
    );
    let module = ("cmpoll.io/module", "true");
    let start = write(k, &ns, "a", &[module], "1");
    hub_reaches(&hub, &lister, &ns, start);

    // The named watch streams a, never b.
    let path = format!("/api/v1/watch/namespaces/{ns}/configmaps/a?resourceVersion={start}");
    let api = Watching::start(&k.url, &k.ca_file(), &named, &path, &[], 30);
    let at_hub = Watching::start(&hub.url(), &hub.ca, &named, &path, &[], 30);
    std::thread::sleep(Duration::from_millis(500));
    write(k, &ns, "b", &[module], "2");
    write(k, &ns, "a", &[module], "2");
    write(k, &ns, "b", &[module], "3");
    // Past the last write's poll: whatever the hub would send of it is sent.
    let last: u64 = k
        .put_configmap(&ns, "a", &[module], &[("k", "3")])
        .parse()
        .unwrap();
    hub_reaches(&hub, &lister, &ns, last);
    let (a, h) = (
        api.until(2, Duration::from_secs(10)),
        at_hub.until(2, Duration::from_secs(10)),
    );
    assert_eq!(types(&a), ["MODIFIED a", "MODIFIED a"], "the apiserver's");
    assert_eq!(
        types(&h),
        types(&a),
        "the hub's named watch is the apiserver's"
    );
    for (x, y) in a.iter().zip(&h) {
        assert_eq!(comparable(y), comparable(x));
    }
    drop((api, at_hub));

    // The lister's list is allowed, and kept at the hub, before it asks anything else.
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    assert_eq!(get(&hub.url(), &hub.ca, &lister, &list, &[]).0, 200);
    let t = "timeoutSeconds=1";
    for (who, token, path) in [
        (
            "named",
            &named,
            format!(
                "/api/v1/watch/namespaces/{ns}/configmaps/a?fieldSelector=metadata.name%3Db&{t}"
            ),
        ),
        (
            "named",
            &named,
            format!(
                "/api/v1/watch/namespaces/{ns}/configmaps/a?fieldSelector=metadata.namespace%3D{ns}&{t}"
            ),
        ),
        (
            "named",
            &named,
            format!(
                "/api/v1/watch/namespaces/{ns}/configmaps/a?fieldSelector=metadata.name%3Da&{t}"
            ),
        ),
        (
            "named",
            &named,
            format!("/api/v1/namespaces/{ns}/configmaps/a?watch=true&{t}"),
        ),
        (
            "named",
            &named,
            format!("/api/v1/namespaces/{ns}/configmaps/a?watch=1&labelSelector=no%3Dmatch"),
        ),
        (
            "named",
            &named,
            format!("/api/v1/watch/namespaces/{ns}/configmaps/b?{t}"),
        ),
        (
            "named",
            &named,
            format!(
                "/api/v1/namespaces/{ns}/configmaps?watch=true&fieldSelector=metadata.name%3Da&{t}"
            ),
        ),
        (
            "named",
            &named,
            format!("/api/v1/watch/namespaces/{ns}/configmaps?fieldSelector=metadata.name%3Da&{t}"),
        ),
        (
            "named",
            &named,
            format!("/api/v1/namespaces/{ns}/configmaps?fieldSelector=metadata.name%3Da"),
        ),
        (
            "lister",
            &lister,
            format!("/api/v1/watch/namespaces/{ns}/configmaps/a?{t}"),
        ),
        (
            "lister",
            &lister,
            format!("/api/v1/namespaces/{ns}/configmaps?watch=true&{t}"),
        ),
        (
            "lister",
            &lister,
            format!("/api/v1/namespaces/{ns}/configmaps/a"),
        ),
        (
            "lister",
            &lister,
            format!("/api/v1/namespaces/{ns}/configmaps?fieldSelector=metadata.name%3Da"),
        ),
    ] {
        let (api_code, _, api_body) = get(&k.url, &k.ca_file(), token, &path, &[]);
        let (hub_code, _, hub_body) = get(&hub.url(), &hub.ca, token, &path, &[]);
        let show = |b: &[u8]| {
            String::from_utf8_lossy(b)
                .chars()
                .take(400)
                .collect::<String>()
        };
        assert_eq!(
            hub_code,
            api_code,
            "{who} {path}: the apiserver said {}; the hub said {}",
            show(&api_body),
            show(&hub_body)
        );
        if path.contains("watch") && api_code == 200 && !path.contains("/a?watch") {
            assert_eq!(
                answer_events(&hub_body),
                answer_events(&api_body),
                "{who} {path}"
            );
            continue;
        }
        let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null);
        let (x, y) = (parse(&api_body), parse(&hub_body));
        if api_code == 200 && x["kind"] == "ConfigMapList" {
            let names = |v: &Value| -> Vec<String> {
                (v["items"].as_array().unwrap().iter())
                    .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
                    .collect()
            };
            assert_eq!(names(&y), names(&x), "{who} {path}");
        } else {
            assert_eq!(y, x, "{who} {path}");
        }
    }
}

/// Issue 56.9: a list at an `Exact` version is the state at that version, which the hub
/// holds when nothing it selects changed since (the same list as the apiserver's, at that
/// version), and a 410 in the apiserver's words for a compacted version when it does not
/// (it answered its current state); a `resourceVersion` that is no version is refused in
/// the apiserver's words for each kind of request.
#[test]
fn exact_and_malformed_versions_are_answered_as_the_apiserver_answers_them() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-exact");
    put_module(k, &ns, "m", "k.yaml", "0");
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--namespace", &ns]);
    let token = follower(
        k,
        &ns,
        "watcher",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get", "watch"]}]),
        false,
    );
    let module = ("cmpoll.io/module", "true");
    let before = write(k, &ns, "m", &[module], "1");
    hub_reaches(&hub, &token, &ns, before);
    let base = format!("/api/v1/namespaces/{ns}/configmaps");
    let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap();
    // A boolean as Go folds it (`fal\u{17f}e` is false): a list, not a watch.
    let path = format!("{base}?watch=fal%C5%BFe&labelSelector=cmpoll.io%2Fmodule%3Dtrue");
    let (api_code, _, api) = get(&k.url, &k.ca_file(), &token, &path, &[]);
    let (hub_code, _, at_hub) = get(&hub.url(), &hub.ca, &token, &path, &[]);
    assert_eq!((hub_code, api_code), (200, 200));
    assert_eq!(parse(&at_hub)["items"], parse(&api)["items"], "{path}");
    // A version with a limit and no match is exact (the legacy meaning), and a continue
    // token with a version is the apiserver's 400.
    let path =
        format!("{base}?labelSelector=cmpoll.io%2Fmodule%3Dtrue&limit=5&resourceVersion={before}");
    let (api_code, _, api) = get(&k.url, &k.ca_file(), &token, &path, &[]);
    let (hub_code, _, at_hub) = get(&hub.url(), &hub.ca, &token, &path, &[]);
    assert_eq!((hub_code, api_code), (200, 200));
    assert_eq!(
        parse(&at_hub)["metadata"]["resourceVersion"],
        before.to_string()
    );
    assert_eq!(parse(&at_hub)["items"], parse(&api)["items"], "{path}");
    k.put_configmap(&ns, "n", &[], &[("k", "1")]);
    let (_, _, page) = get(
        &k.url,
        &k.ca_file(),
        &token,
        &format!("{base}?limit=1"),
        &[],
    );
    // (Two objects: a page of one has a continue token.)
    {
        let token_of_page = (parse(&page)["metadata"]["continue"].as_str())
            .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&page)))
            .to_string();
        let path = format!("{base}?limit=1&continue={token_of_page}&resourceVersion=5");
        let (api_code, _, api) = get(&k.url, &k.ca_file(), &token, &path, &[]);
        let (hub_code, _, at_hub) = get(&hub.url(), &hub.ca, &token, &path, &[]);
        assert_eq!((hub_code, api_code), (400, 400), "{path}");
        assert_eq!(parse(&at_hub), parse(&api), "{path}");
    }
    // At the version of the last change of what it selects: the same list. (A version
    // past it that the hub has not been told of, an unselected write's, waits for the
    // hub to reach it, then is the watch cache's 504: the hub's short watch sees only
    // what it selects.)
    {
        let rv = before;
        let path = format!(
            "{base}?labelSelector=cmpoll.io%2Fmodule%3Dtrue&resourceVersion={rv}&resourceVersionMatch=Exact"
        );
        let (api_code, _, api) = get(&k.url, &k.ca_file(), &token, &path, &[]);
        let (hub_code, _, at_hub) = get(&hub.url(), &hub.ca, &token, &path, &[]);
        assert_eq!((hub_code, api_code), (200, 200), "{path}");
        let (api, at_hub) = (parse(&api), parse(&at_hub));
        assert_eq!(at_hub["metadata"]["resourceVersion"], rv.to_string());
        assert_eq!(
            at_hub["metadata"]["resourceVersion"],
            api["metadata"]["resourceVersion"]
        );
        assert_eq!(at_hub["items"], api["items"], "{path}");
    }
    // Before that change: the hub cannot show it; it answers as for a compacted version.
    let path = format!(
        "{base}?resourceVersion={}&resourceVersionMatch=Exact",
        before - 1
    );
    let (code, _, body) = get(&hub.url(), &hub.ca, &token, &path, &[]);
    assert_eq!(code, 410, "{}", String::from_utf8_lossy(&body));
    let (api_code, _, api) = get(
        &k.url,
        &k.ca_file(),
        &token,
        &format!("{base}?resourceVersion=1&resourceVersionMatch=Exact"),
        &[],
    );
    if api_code == 410 {
        assert_eq!(parse(&body), parse(&api), "the apiserver's words");
    }
    // No version at all: a list's 400, a GET's and a watch's 500, word for word.
    for path in [
        format!("{base}?resourceVersion=abc"),
        format!("{base}?resourceVersion=%2B5"),
        format!("{base}?resourceVersion=-1"),
        format!("{base}/m?resourceVersion=abc"),
        format!("{base}?watch=1&resourceVersion=99999999999999999999999"),
    ] {
        let (api_code, _, api) = get(&k.url, &k.ca_file(), &token, &path, &[]);
        let (hub_code, _, at_hub) = get(&hub.url(), &hub.ca, &token, &path, &[]);
        assert_eq!(
            hub_code,
            api_code,
            "{path}: {}",
            String::from_utf8_lossy(&api)
        );
        assert_eq!(parse(&at_hub), parse(&api), "{path}");
    }
}
