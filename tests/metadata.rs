//! `--list-mode` (`auto` by default; `--metadata-first` is `metadata`): list metadata only
//! after a first full list, GET only what changed, everything from the watch cache, the
//! same events as full lists, and full lists where the role has no `get`.

use std::time::Duration;

use test_apiserver::api::{Details, status_json};
use test_apiserver::{ConfigMap, Fault, Grant, Match, Route, TestApiserver, USER};

use crate::util::{Cmpoll, Daemon, SOON, module};

fn wait_requests(s: &TestApiserver, n: usize) {
    let start = std::time::Instant::now();
    while s.requests().len() < n {
        assert!(
            start.elapsed() < SOON,
            "only {} requests",
            s.requests().len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn steady_state_costs_one_metadata_list_and_a_get_per_change() {
    let s = TestApiserver::start();
    for i in 0..5 {
        s.put(module("a", &format!("m{i}"), "1"));
    }
    s.put(ConfigMap::new("a", "keyless").label("cmpoll.io/module", "true"));
    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "30ms", "--metadata-first", "--keys", "k"],
    );
    let first = d.batch(SOON);
    assert_eq!(first.len(), 6, "5 modules and synced");
    assert_eq!(first[0]["files"]["k"], "1");
    // The first list is a full one: every item would need a GET.
    let reqs = s.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert!(reqs[0].is_list());
    assert_eq!(reqs[0].accept.as_deref(), Some("application/json"));

    // Unchanged polls: one metadata list each, no GET, the keyless ConfigMap not again.
    s.clear_requests();
    wait_requests(&s, 4);
    let reqs = s.requests();
    assert!(
        reqs.iter().all(|r| r.is_list()
            && r.route == Route::Cache
            && r.accept
                .as_deref()
                .unwrap()
                .starts_with("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")),
        "{reqs:?}"
    );

    // One change: one GET; a label-only edit: one GET, no event.
    s.put(module("a", "m3", "2"));
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["module"].as_str()),
        (Some("updated"), Some("a/m3"))
    );
    s.put(module("a", "m1", "1").label("x", "y"));
    d.quiet_through(&s, 2, 1);
    let gets: Vec<String> = s
        .requests()
        .iter()
        .filter(|r| !r.is_list())
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(
        gets,
        [
            "/api/v1/namespaces/a/configmaps/m3",
            "/api/v1/namespaces/a/configmaps/m1"
        ]
    );
    for g in s.requests().iter().filter(|r| !r.is_list()) {
        assert!(
            g.param("resourceVersion").is_some(),
            "GETs name the item's RV: {g:?}"
        );
        assert_eq!(g.route, Route::Cache);
    }
    s.delete("a", "m0");
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["module"].as_str()),
        (Some("removed"), Some("a/m0"))
    );
    d.stop();
}

#[test]
fn many_changes_at_once_are_one_full_list_not_a_get_each() {
    let s = TestApiserver::start();
    for i in 0..40 {
        s.put(module("a", &format!("m{i:02}"), "1"));
    }
    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "30ms", "--metadata-first"],
    );
    d.batch(SOON);
    s.freeze_cache();
    for i in 0..33 {
        s.put(module("a", &format!("m{i:02}"), "2"));
    }
    s.clear_requests();
    s.thaw_cache();
    let b = d.batch(SOON);
    assert_eq!(b.len(), 34, "33 updates and synced");
    assert!(
        b[..33]
            .iter()
            .all(|e| e["type"] == "updated" && e["files"]["k"] == "2")
    );
    let reqs = s.requests();
    assert!(reqs.iter().all(|r| r.is_list()), "no GET: {reqs:?}");
    let full = reqs
        .iter()
        .position(|r| r.accept.as_deref() == Some("application/json"))
        .expect("a full list");
    assert!(full > 0, "after the metadata list that showed the changes");
    assert_eq!(
        reqs[full].param("resourceVersion"),
        reqs[full - 1].param("resourceVersion"),
        "the same request, for full objects"
    );
    d.stop();
}

#[test]
fn the_same_events_as_full_lists() {
    let s = TestApiserver::start();
    s.put(module("a", "one", "1").binary("b.bin", &[0, 1]));
    s.put(module("b", "two", "2"));
    let full = Cmpoll::against(&s).args(&["run", "--once"]).run().success();
    let meta = Cmpoll::against(&s)
        .args(&["run", "--once", "--metadata-first"])
        .run()
        .success();
    assert_eq!(full.stdout, meta.stdout);
}

#[test]
fn a_failing_get_fails_the_poll_and_a_404_waits_for_a_list() {
    let s = TestApiserver::start();
    s.put(module("a", "one", "1"));
    s.put(module("a", "two", "1"));
    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "30ms", "--metadata-first"],
    );
    d.batch(SOON);
    // A change whose GET fails: nothing, until the GET works.
    s.fault_always(Match::gets(), Fault::InternalError);
    s.put(module("a", "one", "2"));
    d.quiet_through(&s, 2, 1);
    s.clear_faults();
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "updated");
    assert!(
        d.stderr()
            .contains("apiserver failed to get configmap a/one: 500"),
        "{}",
        d.stderr()
    );
    // Deleted between the list and the GET (a 404 naming the object): only a list
    // removes a module, so nothing happens until the next list; the object is still
    // there, so that list brings its update.
    let gone = Fault::Raw {
        code: 404,
        headers: Vec::new(),
        body: status_json(
            404,
            "NotFound",
            "configmaps \"two\" not found",
            Some(Details {
                name: Some("two".into()),
                kind: Some("configmaps".into()),
                ..Details::default()
            }),
        ),
    };
    s.fault(Match::gets(), gone, 1);
    s.put(module("a", "two", "2"));
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["module"].as_str()),
        (Some("updated"), Some("a/two")),
        "{b:?}"
    );
    // Really deleted: the next list says so.
    s.delete("a", "two");
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["module"].as_str()),
        (Some("removed"), Some("a/two"))
    );
    d.stop();
}

/// Issue 23.2: a 404 that is not the apiserver's NotFound about the very object asked for
/// (a proxy's text page, a Status about another object or about an unknown path) fails
/// the poll: the module is neither removed nor touched until a GET answers.
#[test]
fn a_404_about_something_else_fails_the_poll_and_removes_nothing() {
    let s = TestApiserver::start();
    s.put(module("apps", "web", "1"));
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "30ms"]);
    d.batch(SOON);
    let wrong = |body: Vec<u8>| Fault::Raw {
        code: 404,
        headers: Vec::new(),
        body,
    };
    let named = |name: &str, kind: &str| Details {
        name: Some(name.into()),
        kind: Some(kind.into()),
        ..Details::default()
    };
    let answers = [
        ("text", b"404 page not found\n".to_vec()),
        (
            "another object",
            status_json(
                404,
                "NotFound",
                "configmaps \"other\" not found",
                Some(named("other", "configmaps")),
            ),
        ),
        (
            "another resource",
            status_json(
                404,
                "NotFound",
                "secrets \"web\" not found",
                Some(named("web", "secrets")),
            ),
        ),
        (
            "no details",
            status_json(
                404,
                "NotFound",
                "the server could not find the requested resource",
                Some(Details::default()),
            ),
        ),
    ];
    for (n, (what, body)) in answers.into_iter().enumerate() {
        s.fault_always(Match::gets(), wrong(body));
        s.put(module("apps", "web", &format!("v{n}")));
        d.quiet_through(&s, 2, 1);
        let failed = s
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && !r.is_list() && r.status == 404)
            .count();
        assert!(failed >= 2 * (n + 1), "{what}: {failed} GETs answered 404");
        s.clear_faults();
        let b = d.batch(SOON);
        assert_eq!(
            (b[0]["type"].as_str(), b[0]["files"]["k"].as_str()),
            (Some("updated"), Some(format!("v{n}").as_str())),
            "{what}: {b:?}"
        );
    }
    assert!(
        d.stderr()
            .contains("apiserver refused to get configmap apps/web: 404"),
        "{}",
        d.stderr()
    );
    d.stop();
}

fn metadata_list(r: &test_apiserver::Recorded) -> bool {
    r.is_list()
        && r.accept
            .as_deref()
            .is_some_and(|a| a.contains("as=PartialObjectMetadataList"))
}

/// Without a flag: the second poll on is a metadata list; under a role with `list` but
/// not `get` the first GET's 403 brings that scope back to full lists for good, with one
/// warning naming the verb, and no change is lost on the way.
#[test]
fn auto_is_the_default_and_falls_back_to_full_lists_where_get_is_forbidden() {
    let s = TestApiserver::start();
    s.grant(USER, Grant::all().list_only());
    s.put(module("a", "one", "1"));
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "30ms"]);
    d.batch(SOON);
    d.quiet_through(&s, 1, 1);
    assert!(
        s.requests().iter().skip(1).all(metadata_list),
        "auto: metadata lists after the first: {:?}",
        s.requests()
    );
    s.put(module("a", "one", "2"));
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["files"]["k"].as_str()),
        (Some("updated"), Some("2"))
    );
    s.clear_requests();
    s.put(module("a", "one", "3"));
    let b = d.batch(SOON);
    assert_eq!(b[0]["files"]["k"], "3");
    d.quiet_through(&s, 2, 1);
    let reqs = s.requests();
    assert!(
        reqs.iter()
            .all(|r| r.is_list() && !metadata_list(r) && r.status == 200),
        "full lists only from then on: {reqs:?}"
    );
    let stderr = d.stderr();
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("but not get"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("cannot get resource \"configmaps\"")
            && warnings[0].contains("--list-mode full"),
        "{}",
        warnings[0]
    );
    d.stop();
}

#[test]
fn metadata_mode_under_a_list_only_role_fails_the_poll_and_full_mode_never_gets() {
    let s = TestApiserver::start();
    s.grant(USER, Grant::all().list_only());
    s.put(module("a", "one", "1"));
    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "30ms", "--list-mode", "metadata"],
    );
    d.batch(SOON);
    s.put(module("a", "one", "2"));
    d.quiet_through(&s, 2, 1);
    assert!(
        d.stderr().contains("403") && d.stderr().contains("cannot get resource"),
        "{}",
        d.stderr()
    );
    d.stop();

    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "30ms", "--list-mode", "full"],
    );
    d.batch(SOON);
    s.clear_requests();
    s.put(module("a", "one", "3"));
    assert_eq!(d.batch(SOON)[0]["files"]["k"], "3");
    assert!(
        s.requests()
            .iter()
            .all(|r| r.is_list() && !metadata_list(r))
    );
    d.stop();
    let r = Cmpoll::against(&s)
        .args(&["list", "--metadata-first", "--list-mode", "full"])
        .run()
        .failure(2);
    assert!(r.error_line().contains("--list-mode"), "{}", r.error_line());
}

/// A paged metadata list whose second page changed too much is made again in full: that
/// page only; the first page's modules stay.
#[test]
fn a_page_listed_again_in_full_keeps_the_pages_before_it() {
    let s = TestApiserver::start();
    for i in 0..80 {
        s.put(module("a", &format!("m{i:02}"), "1"));
    }
    let d = Daemon::start(
        Cmpoll::against(&s),
        &[
            "--interval",
            "30ms",
            "--page-size",
            "40",
            "--metadata-first",
        ],
    );
    assert_eq!(d.batch(SOON).len(), 81);
    d.quiet_through(&s, 1, 1);
    // Paged lists read etcd, not the cache: failing them keeps the changes for one poll.
    s.fault_always(Match::lists(), Fault::InternalError);
    for i in 40..80 {
        s.put(module("a", &format!("m{i:02}"), "2"));
    }
    s.clear_faults();
    let b = d.batch(SOON);
    let types: std::collections::BTreeSet<&str> =
        b.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["synced", "updated"].into(), "no removal: {b:?}");
    assert_eq!(b.len(), 41);
    assert_eq!(b[40]["modules"], 80);
    d.stop();
}
