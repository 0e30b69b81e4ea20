//! The test apiserver's protocol, checked on the wire with a raw HTTPS client: routing and
//! its counters, paging and continue tokens, metadata lists, gzip, authentication and
//! authorization, discovery, faults and the request log.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::Client;
use test_apiserver::{ConfigMap, Fault, Grant, Match, Options, Route, TOKEN, TestApiserver, USER};

fn server_with(n: usize) -> TestApiserver {
    let s = TestApiserver::start();
    for i in 0..n {
        s.put(
            ConfigMap::new(&format!("ns-{}", i % 2), &format!("cm-{i}"))
                .label("cmpoll.io/module", "true")
                .data("k", &format!("v{i}")),
        );
    }
    s
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn last_route(s: &TestApiserver) -> Route {
    s.requests().last().unwrap().route
}

#[test]
fn resource_version_zero_is_the_whole_list_from_the_cache_and_ignores_limit() {
    let s = server_with(5);
    let c = Client::new(&s);
    let r = c.get("/api/v1/configmaps?resourceVersion=0&limit=2");
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(names(&v).len(), 5);
    assert!(v["metadata"].get("continue").is_none());
    assert!(v["metadata"].get("remainingItemCount").is_none());
    assert_eq!(v["metadata"]["resourceVersion"], s.revision().to_string());
    assert_eq!(last_route(&s), Route::Cache);
}

#[test]
fn not_older_than_is_served_from_the_cache_and_504s_past_it() {
    let s = server_with(2);
    let c = Client::new(&s);
    let rv = s.revision();
    let r = c.get(&format!(
        "/api/v1/configmaps?resourceVersion={rv}&resourceVersionMatch=NotOlderThan"
    ));
    assert_eq!(r.status, 200);
    assert_eq!(last_route(&s), Route::Cache);

    let future = rv + 1000;
    let r = c.get(&format!(
        "/api/v1/configmaps?resourceVersion={future}&resourceVersionMatch=NotOlderThan"
    ));
    assert_eq!(r.status, 504);
    assert_eq!(r.header("retry-after"), Some("1"));
    let v = r.json();
    assert_eq!(v["reason"], "Timeout");
    assert_eq!(
        v["message"],
        format!("Timeout: Too large resource version: {future}, current: {rv}")
    );
    assert_eq!(
        v["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    assert_eq!(v["details"]["retryAfterSeconds"], 1);
}

#[test]
fn a_frozen_cache_serves_stale_data_and_refuses_newer_versions() {
    let s = server_with(1);
    let c = Client::new(&s);
    s.freeze_cache();
    let frozen = s.revision();
    s.put(ConfigMap::new("ns-0", "late").data("k", "v"));
    let v = c.get("/api/v1/configmaps?resourceVersion=0").json();
    assert_eq!(names(&v), ["cm-0"], "the cache has not seen the write");
    assert_eq!(v["metadata"]["resourceVersion"], frozen.to_string());
    let newest = s.revision();
    let r = c.get(&format!(
        "/api/v1/configmaps?resourceVersion={newest}&resourceVersionMatch=NotOlderThan"
    ));
    assert_eq!(r.status, 504);
    let v = c.get("/api/v1/configmaps").json();
    assert_eq!(names(&v).len(), 2, "a consistent read sees the write");
    assert_eq!(last_route(&s), Route::Etcd);
    s.thaw_cache();
    let r = c.get(&format!(
        "/api/v1/configmaps?resourceVersion={newest}&resourceVersionMatch=NotOlderThan"
    ));
    assert_eq!(r.status, 200);
}

#[test]
fn unset_resource_version_is_a_consistent_read_from_etcd() {
    let s = server_with(1);
    Client::new(&s).get("/api/v1/configmaps");
    assert_eq!(last_route(&s), Route::Etcd);
    Client::new(&s).get("/api/v1/namespaces/ns-0/configmaps/cm-0");
    assert_eq!(last_route(&s), Route::Etcd, "a GET without RV reads etcd");
    let rv = s.revision();
    Client::new(&s).get(&format!(
        "/api/v1/namespaces/ns-0/configmaps/cm-0?resourceVersion={rv}"
    ));
    assert_eq!(
        last_route(&s),
        Route::Cache,
        "a GET with RV reads the cache"
    );
}

#[test]
fn pages_come_from_one_snapshot_with_tokens_and_counts() {
    let s = server_with(5);
    let c = Client::new(&s);
    let p1 = c.get("/api/v1/configmaps?limit=2").json();
    assert_eq!(last_route(&s), Route::Etcd);
    assert_eq!(names(&p1), ["cm-0", "cm-2"], "etcd key order: ns-0 first");
    assert_eq!(p1["metadata"]["remainingItemCount"], 3);
    let rv = p1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // A write between pages must not show up: the pages read the first page's revision.
    s.put(ConfigMap::new("ns-1", "cm-9").data("k", "new"));
    s.put(ConfigMap::new("ns-1", "cm-1").data("k", "changed"));
    let mut all = names(&p1);
    let mut token = p1["metadata"]["continue"].as_str().unwrap().to_string();
    loop {
        let p = c
            .get(&format!("/api/v1/configmaps?limit=2&continue={token}"))
            .json();
        assert_eq!(p["metadata"]["resourceVersion"], rv.as_str());
        all.extend(names(&p));
        for item in p["items"].as_array().unwrap() {
            if item["metadata"]["name"] == "cm-1" {
                assert_eq!(item["data"]["k"], "v1", "page 2 reads the old revision");
            }
        }
        match p["metadata"].get("continue").and_then(|c| c.as_str()) {
            Some(t) => token = t.to_string(),
            None => break,
        }
    }
    assert_eq!(all, ["cm-0", "cm-2", "cm-4", "cm-1", "cm-3"]);

    // With a selector the apiserver cannot count what is left.
    let p = c
        .get("/api/v1/configmaps?limit=2&labelSelector=cmpoll.io%2Fmodule%3Dtrue")
        .json();
    assert!(p["metadata"]["continue"].is_string());
    assert!(p["metadata"].get("remainingItemCount").is_none());

    // An exact, paged read at an older revision.
    let p = c
        .get(&format!("/api/v1/configmaps?limit=10&resourceVersion={rv}"))
        .json();
    assert_eq!(names(&p).len(), 5);
    assert_eq!(last_route(&s), Route::Etcd);
}

#[test]
fn a_last_page_that_fills_exactly_has_no_token() {
    let s = server_with(4);
    let p = Client::new(&s).get("/api/v1/configmaps?limit=4").json();
    assert_eq!(names(&p).len(), 4);
    assert!(p["metadata"].get("continue").is_none());
}

#[test]
fn expired_continue_tokens_are_410_with_a_fresh_token() {
    let s = server_with(3);
    let c = Client::new(&s);
    let p1 = c.get("/api/v1/configmaps?limit=1").json();
    let token = p1["metadata"]["continue"].as_str().unwrap().to_string();
    s.expire_continue_tokens();
    let r = c.get(&format!("/api/v1/configmaps?limit=1&continue={token}"));
    assert_eq!(r.status, 410);
    let v = r.json();
    assert_eq!(v["reason"], "Expired");
    assert!(v["message"].as_str().unwrap().starts_with(
        "The provided continue parameter is too old to display a consistent list result."
    ));
    let fresh = v["metadata"]["continue"].as_str().unwrap();
    let decoded = String::from_utf8(
        base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, fresh).unwrap(),
    )
    .unwrap();
    assert!(decoded.contains("\"rv\":-1"), "{decoded}");
    let rest = c
        .get(&format!("/api/v1/configmaps?limit=5&continue={fresh}"))
        .json();
    assert_eq!(
        names(&rest),
        ["cm-2", "cm-1"],
        "the fresh token goes on after ns-0/cm-0"
    );

    // A list at a compacted revision is too old.
    let r = c.get("/api/v1/configmaps?limit=1&resourceVersion=1001");
    assert_eq!(r.status, 410);
    assert_eq!(
        r.json()["message"],
        "The resourceVersion for the provided list is too old."
    );
}

#[test]
fn continue_tokens_expire_on_the_compaction_period() {
    let s = TestApiserver::start_with(Options {
        behaviour: test_apiserver::Behaviour {
            compaction_interval: Duration::from_millis(100),
            ..Options::default().behaviour
        },
        ..Options::default()
    });
    for i in 0..3 {
        s.put(ConfigMap::new("a", &format!("c{i}")));
    }
    let c = Client::new(&s);
    let token = c.get("/api/v1/configmaps?limit=1").json()["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    s.put(ConfigMap::new("a", "c9"));
    std::thread::sleep(Duration::from_millis(250));
    c.get("/api/v1/configmaps?limit=1"); // a tick compacts to the previous period's revision
    std::thread::sleep(Duration::from_millis(150));
    let r = c.get(&format!("/api/v1/configmaps?limit=1&continue={token}"));
    assert_eq!(r.status, 410);
}

#[test]
fn invalid_option_combinations_are_refused_like_the_apiserver() {
    let s = server_with(2);
    let c = Client::new(&s);
    let token = c.get("/api/v1/configmaps?limit=1").json()["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    let r = c.get(&format!(
        "/api/v1/configmaps?limit=1&continue={token}&resourceVersion=5"
    ));
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "specifying resource version is not allowed when using continue"
    );
    let r = c.get(&format!(
        "/api/v1/configmaps?limit=1&continue={token}&resourceVersion=0"
    ));
    assert_eq!(r.status, 200, "RV 0 with continue is tolerated");

    let r = c.get("/api/v1/configmaps?resourceVersionMatch=NotOlderThan");
    assert_eq!(r.status, 422);
    let v = r.json();
    assert_eq!(v["reason"], "Invalid");
    assert_eq!(v["details"]["causes"][0]["field"], "resourceVersionMatch");

    let r = c.get("/api/v1/configmaps?limit=1&continue=garbage");
    assert_eq!(r.status, 400);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid continue token:")
    );
}

#[test]
fn selectors_use_the_apiservers_grammar_and_messages() {
    let s = TestApiserver::start();
    s.put(ConfigMap::new("a", "x").label("a", "x"));
    s.put(ConfigMap::new("a", "y").label("a", "y").label("b", "1"));
    s.put(ConfigMap::new("b", "z").label("a", "z"));
    let c = Client::new(&s);
    let v = c
        .get("/api/v1/configmaps?labelSelector=a%20in%20(x%2C%20y)%2C!b")
        .json();
    assert_eq!(names(&v), ["x"]);
    let v = c
        .get("/api/v1/configmaps?fieldSelector=metadata.namespace%3Db")
        .json();
    assert_eq!(names(&v), ["z"]);
    let v = c
        .get("/api/v1/namespaces/a/configmaps?fieldSelector=metadata.name!%3Dx")
        .json();
    assert_eq!(names(&v), ["y"]);

    let r = c.get("/api/v1/configmaps?labelSelector=a%3Db%20b");
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["reason"], "BadRequest");
    assert_eq!(v["message"], "found 'b', expected: ',' or 'end of string'");

    let r = c.get("/api/v1/configmaps?fieldSelector=data.foo%3Dx");
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "\"data.foo\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
    );
}

#[test]
fn metadata_lists_carry_only_metadata_and_gets_refuse_the_list_form() {
    let s = server_with(2);
    let c = Client::new(&s).header(
        "Accept",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json",
    );
    let v = c.get("/api/v1/configmaps?resourceVersion=0").json();
    assert_eq!(v["kind"], "PartialObjectMetadataList");
    assert_eq!(v["apiVersion"], "meta.k8s.io/v1");
    let item = &v["items"][0];
    assert_eq!(item["kind"], "PartialObjectMetadata");
    assert!(item["metadata"]["managedFields"].is_array());
    assert!(item.get("data").is_none());
    assert_eq!(last_route(&s), Route::Cache, "same routing as a full list");

    let r = c.get("/api/v1/namespaces/ns-0/configmaps/cm-0");
    assert_eq!(r.status, 406);
    assert_eq!(
        r.json()["message"],
        "you requested PartialObjectMetadataList, but the requested object is not a list (*core.ConfigMap)"
    );

    // Protobuf first, JSON as the fallback: the JSON clause is used.
    let c = Client::new(&s).header(
        "Accept",
        "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
    );
    assert_eq!(c.get("/api/v1/configmaps").json()["kind"], "ConfigMapList");
}

#[test]
fn gzip_only_above_128_kib_and_only_for_a_bare_token() {
    let s = TestApiserver::start();
    s.bulk_load(100, 2048, 2);
    let gz = Client::new(&s).header("Accept-Encoding", "gzip");
    let r = gz.get("/api/v1/configmaps?resourceVersion=0");
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&r.body[..])
        .read_to_end(&mut plain)
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 100);
    assert!(s.requests().last().unwrap().gzip);

    let small = gz.get("/api/v1/namespaces/ns-00/configmaps/module-000000");
    assert_eq!(
        small.header("content-encoding"),
        None,
        "small bodies stay plain"
    );
    let q = Client::new(&s).header("Accept-Encoding", "gzip;q=1.0");
    let r = q.get("/api/v1/configmaps?resourceVersion=0");
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(
        r.header("transfer-encoding"),
        Some("chunked"),
        "large bodies are chunked, as Go's net/http sends them"
    );
}

#[test]
fn authentication_by_token_certificate_or_nothing() {
    let s = server_with(1);
    assert_eq!(Client::new(&s).get("/api/v1/configmaps").status, 200);

    let r = Client::new(&s).bearer("wrong").get("/api/v1/configmaps");
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["reason"], "Unauthorized");
    let r = Client::with_cert(&s, None).get("/api/v1/configmaps");
    assert_eq!(r.status, 401, "anonymous is refused");

    // Rotation: the valid set changes while the server runs.
    s.add_token("rotated", USER);
    s.revoke_token(TOKEN);
    assert_eq!(Client::new(&s).get("/api/v1/configmaps").status, 401);
    assert_eq!(
        Client::new(&s)
            .bearer("rotated")
            .get("/api/v1/configmaps")
            .status,
        200
    );

    let alice = s.client_cert("alice");
    s.grant("alice", Grant::all());
    let r = Client::with_cert(&s, Some(&alice)).get("/api/v1/configmaps");
    assert_eq!(r.status, 200);
    assert_eq!(s.requests().last().unwrap().user.as_deref(), Some("alice"));

    s.add_basic("bob", "secret", "bob");
    s.grant("bob", Grant::all());
    let r = Client::with_cert(&s, None)
        .header("Authorization", "Basic Ym9iOnNlY3JldA==")
        .get("/api/v1/configmaps");
    assert_eq!(r.status, 200);

    // A certificate from another CA is refused during the handshake.
    let other = test_apiserver::Pki::new("other-ca").client_cert("mallory");
    assert!(
        Client::with_cert(&s, Some(&other))
            .try_get("/api/v1/configmaps")
            .is_err()
    );
}

#[test]
fn authorization_messages_have_the_real_shape() {
    let s = server_with(2);
    s.add_token("t-a", "system:serviceaccount:cm-poller:cm-poller");
    s.grant(
        "system:serviceaccount:cm-poller:cm-poller",
        Grant::namespaces(&["ns-0"]).list_only(),
    );
    let c = Client::new(&s).bearer("t-a");
    assert_eq!(c.get("/api/v1/namespaces/ns-0/configmaps").status, 200);
    let r = c.get("/api/v1/configmaps");
    assert_eq!(r.status, 403);
    let want = std::fs::read_to_string(
        "../../../shared/kube-api/fixtures/constructed/status-403-cluster-scope.json",
    )
    .ok();
    let v = r.json();
    assert_eq!(
        v["message"],
        "configmaps is forbidden: User \"system:serviceaccount:cm-poller:cm-poller\" cannot list resource \"configmaps\" in API group \"\" at the cluster scope"
    );
    if let Some(want) = want {
        assert_eq!(String::from_utf8(r.body.clone()).unwrap(), want.trim());
    }
    let r = c.get("/api/v1/namespaces/team-a/configmaps");
    assert_eq!(
        r.json()["message"],
        "configmaps is forbidden: User \"system:serviceaccount:cm-poller:cm-poller\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team-a\""
    );
    let r = c.get("/api/v1/namespaces/ns-0/configmaps/cm-0");
    assert_eq!(r.status, 403, "list only: get is forbidden");
    let v = r.json();
    assert_eq!(v["details"]["name"], "cm-0");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("configmaps \"cm-0\" is forbidden: User")
    );
}

#[test]
fn single_gets_and_not_found() {
    let s = server_with(1);
    let c = Client::new(&s);
    let v = c.get("/api/v1/namespaces/ns-0/configmaps/cm-0").json();
    assert_eq!(v["kind"], "ConfigMap");
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["data"]["k"], "v0");
    let r = c.get("/api/v1/namespaces/ns-0/configmaps/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["message"], "configmaps \"nope\" not found");
    let r = c.get("/api/v1/widgets");
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json()["message"],
        "the server could not find the requested resource"
    );
}

#[test]
fn discovery_is_enough_for_kubectl() {
    let s = TestApiserver::start();
    let c = Client::new(&s);
    assert_eq!(c.get("/version").json()["major"], "1");
    assert_eq!(
        Client::with_cert(&s, None).get("/version").status,
        200,
        "version is public"
    );
    assert_eq!(c.get("/api").json()["versions"][0], "v1");
    assert_eq!(c.get("/apis").json()["groups"].as_array().unwrap().len(), 0);
    let v = c.get("/api/v1").json();
    assert_eq!(v["resources"][0]["name"], "configmaps");
    assert_eq!(v["resources"][0]["namespaced"], true);
}

#[test]
fn store_semantics_uid_and_resource_version() {
    let s = TestApiserver::start();
    let a = s.put(ConfigMap::new("n", "a").data("k", "1"));
    let b = s.put(ConfigMap::new("n", "a").data("k", "2"));
    assert_eq!(a.uid, b.uid);
    assert!(b.resource_version > a.resource_version);
    s.delete("n", "a");
    let c = s.put(ConfigMap::new("n", "a").data("k", "2"));
    assert_ne!(c.uid, a.uid);
    assert!(s.get("n", "a").is_some());
    s.bulk_load(10, 100, 3);
    assert_eq!(s.objects().len(), 11);
}

#[test]
fn status_faults_have_real_bodies_and_counts() {
    let s = server_with(1);
    let c = Client::new(&s);
    s.fault(Match::lists(), Fault::InternalError, 1);
    s.fault(Match::lists(), Fault::Unavailable(7), 1);
    s.fault(Match::lists(), Fault::GatewayTimeout, 1);
    s.fault(Match::lists(), Fault::TooManyRequests(3), 1);
    s.fault(Match::lists(), Fault::CacheInitializing(2), 1);
    let r = c.get("/api/v1/configmaps");
    assert_eq!(
        (r.status, r.json()["reason"].clone()),
        (500, "InternalError".into())
    );
    let r = c.get("/api/v1/configmaps");
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.json()["details"]["retryAfterSeconds"], 7);
    let r = c.get("/api/v1/configmaps");
    assert_eq!(
        (r.status, r.json()["reason"].clone()),
        (504, "Timeout".into())
    );
    let r = c.get("/api/v1/configmaps");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("3"));
    assert_eq!(r.body, b"Too many requests, please try again later.\n");
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let r = c.get("/api/v1/configmaps");
    assert_eq!(
        (r.status, r.json()["message"].clone()),
        (429, "storage is (re)initializing".into())
    );
    assert_eq!(c.get("/api/v1/configmaps").status, 200, "counts run out");

    // Matching: a fault for continue pages leaves first pages alone; skip lets some pass.
    s.fault(Match::continue_pages(), Fault::InternalError, 1);
    assert_eq!(c.get("/api/v1/configmaps?limit=1").status, 200);
    s.fault_after(
        Match::gets(),
        1,
        Fault::Status(418, "Teapot".into(), "short and stout".into()),
        1,
    );
    assert_eq!(c.get("/api/v1/namespaces/ns-0/configmaps/cm-0").status, 200);
    let r = c.get("/api/v1/namespaces/ns-0/configmaps/cm-0");
    assert_eq!(
        (r.status, r.json()["message"].clone()),
        (418, "short and stout".into())
    );
    s.fault_always(Match::path("/api/v1/namespaces/"), Fault::InternalError);
    for _ in 0..3 {
        assert_eq!(c.get("/api/v1/namespaces/ns-0/configmaps").status, 500);
    }
    assert_eq!(c.get("/api/v1/configmaps").status, 200);
    s.clear_faults();
    assert_eq!(c.get("/api/v1/namespaces/ns-0/configmaps").status, 200);
    let logged = s.requests();
    assert!(
        logged
            .iter()
            .any(|r| r.fault.as_deref() == Some("InternalError"))
    );
}

#[test]
fn transport_faults_break_the_connection_as_described() {
    let s = TestApiserver::start();
    s.bulk_load(20, 1000, 2);
    let c = Client::new(&s);

    s.fault(Match::lists(), Fault::Reset, 1);
    assert!(c.try_get("/api/v1/configmaps").is_err(), "reset");

    s.fault(Match::lists(), Fault::CutShort, 1);
    let err = c.try_get("/api/v1/configmaps?resourceVersion=0");
    assert!(err.is_err(), "the body ends before its Content-Length");

    s.fault(Match::lists(), Fault::NotJson, 1);
    let r = c.get("/api/v1/configmaps");
    assert_eq!(r.status, 200);
    assert!(serde_json::from_slice::<serde_json::Value>(&r.body).is_err());

    s.fault(Match::lists(), Fault::Delay(Duration::from_millis(300)), 1);
    let t = Instant::now();
    assert_eq!(c.get("/api/v1/configmaps").status, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));

    s.fault(
        Match::gets(),
        Fault::Trickle {
            bytes: 100,
            pause: Duration::from_millis(20),
        },
        1,
    );
    let t = Instant::now();
    let r = c.get("/api/v1/namespaces/ns-00/configmaps/module-000000");
    assert_eq!(r.status, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );

    s.fault(Match::lists(), Fault::Huge(3 << 20), 1);
    let r = c.get("/api/v1/configmaps");
    assert!(r.body.len() > 3 << 20);
    assert_eq!(r.json()["items"][0]["metadata"]["name"], "huge");

    assert_eq!(
        c.get("/api/v1/configmaps").status,
        200,
        "all faults used up"
    );
}

#[test]
fn the_request_log_records_what_clients_sent_and_what_it_cost() {
    let s = server_with(3);
    s.clear_requests();
    Client::new(&s)
        .header("User-Agent", "cmpoll/9.9")
        .header("Accept", "application/json")
        .get("/api/v1/namespaces/ns-1/configmaps?labelSelector=x&resourceVersion=0");
    let r = &s.requests()[0];
    assert_eq!(r.method, "GET");
    assert_eq!(r.path, "/api/v1/namespaces/ns-1/configmaps");
    assert_eq!(r.param("labelSelector"), Some("x"));
    assert_eq!(r.user.as_deref(), Some(USER));
    assert_eq!(r.bearer.as_deref(), Some(TOKEN));
    assert_eq!(r.user_agent.as_deref(), Some("cmpoll/9.9"));
    assert_eq!(r.accept.as_deref(), Some("application/json"));
    assert_eq!(r.status, 200);
    assert!(r.bytes > 0);
    assert_eq!(r.route, Route::Cache);
    assert!(r.is_list());
    let counts = s.counts();
    assert_eq!((counts.requests, counts.cache, counts.etcd), (1, 1, 0));
}

#[test]
fn serves_ipv6_and_plain_http() {
    let s = TestApiserver::start_with(Options {
        bind: "::1".parse().unwrap(),
        plain_http: true,
        ..Options::default()
    });
    assert!(s.url().starts_with("https://[::1]:"));
    let http = s.http_url().unwrap();
    let addr = http.trim_start_matches("http://");
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(
        &mut tcp,
        format!("GET /api/v1/configmaps HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection_without_stalls() {
    // Nagle + delayed ACK would make each request on a kept-alive connection wait ~40 ms.
    let s = TestApiserver::start_with(Options {
        plain_http: true,
        ..Options::default()
    });
    let http = s.http_url().unwrap();
    let mut tcp = std::net::TcpStream::connect(http.trim_start_matches("http://")).unwrap();
    let mut reader = std::io::BufReader::new(tcp.try_clone().unwrap());
    let t = Instant::now();
    for _ in 0..50 {
        std::io::Write::write_all(
            &mut tcp,
            format!("GET /api/v1/configmaps HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut len = 0;
        loop {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
    }
    assert_eq!(s.counts().requests, 50);
    // Not a timing assertion on speed, only on the absence of 40 ms stalls per request.
    assert!(
        t.elapsed() < Duration::from_millis(50 * 40),
        "{:?}",
        t.elapsed()
    );
}
