//! Every `Status` answer the test apiserver gives, compared byte for byte with the fixtures
//! built from the apiserver's source (`tests/fixtures/kube-api`).

mod common;

use common::Client;
use test_apiserver::{ConfigMap, Fault, Grant, Match, Options, TestApiserver};

fn fixture(name: &str) -> String {
    let path = format!("{}/../fixtures/kube-api/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim_end()
        .to_string()
}

const POLLER: &str = "system:serviceaccount:cm-poller:cm-poller";

/// A server whose current resourceVersion is the fixtures' 184467302.
fn server() -> TestApiserver {
    let s = TestApiserver::start_with(Options {
        start_revision: 184467300,
        ..Options::default()
    });
    s.put(ConfigMap::new("team-a", "payments-config").data("LOG_LEVEL", "info"));
    s.put(ConfigMap::new("team-b", "edge-certs").data("README", "x"));
    assert_eq!(s.revision(), 184467302);
    s.add_token("poller", POLLER);
    s.grant(POLLER, Grant::namespaces(&[]));
    s
}

#[test]
fn status_bodies_match_the_fixtures() {
    let s = server();
    let c = Client::new(&s);
    let poller = Client::new(&s).bearer("poller");
    let token = c.get("/api/v1/configmaps?limit=1").json()["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    type Call<'a> = Box<dyn Fn() -> common::Raw + 'a>;
    let cases: Vec<(&str, Call, u16)> = vec![
        (
            "status-401.json",
            Box::new(|| Client::new(&s).bearer("nope").get("/api/v1/configmaps")),
            401,
        ),
        (
            "status-403-cluster-scope.json",
            Box::new(|| poller.get("/api/v1/configmaps")),
            403,
        ),
        (
            "status-403-namespace.json",
            Box::new(|| poller.get("/api/v1/namespaces/team-a/configmaps")),
            403,
        ),
        (
            "status-403-get-named.json",
            Box::new(|| poller.get("/api/v1/namespaces/team-a/configmaps/payments-config")),
            403,
        ),
        (
            "status-404-configmap.json",
            Box::new(|| c.get("/api/v1/namespaces/team-c/configmaps/payments-config")),
            404,
        ),
        (
            "status-404-unknown-resource-under-api-v1.json",
            Box::new(|| c.get("/api/v1/widgets")),
            404,
        ),
        (
            "status-400-bad-label-selector-syntax.json",
            Box::new(|| c.get("/api/v1/configmaps?labelSelector=a%3Db+b")),
            400,
        ),
        (
            "status-400-bad-label-selector-key.json",
            Box::new(|| c.get("/api/v1/configmaps?labelSelector=app:web%3Dx")),
            400,
        ),
        (
            "status-400-bad-field-selector.json",
            Box::new(|| c.get("/api/v1/configmaps?fieldSelector=data.foo%3Dbar")),
            400,
        ),
        (
            "status-400-continue-with-resourceversion.json",
            Box::new(|| {
                c.get(&format!(
                    "/api/v1/configmaps?limit=1&resourceVersion=5&continue={token}"
                ))
            }),
            400,
        ),
        (
            "status-422-listoptions-rvm-without-rv.json",
            Box::new(|| c.get("/api/v1/configmaps?resourceVersionMatch=NotOlderThan")),
            422,
        ),
        (
            "status-504-too-large-resource-version.json",
            Box::new(|| {
                c.get("/api/v1/configmaps?resourceVersion=184999999&resourceVersionMatch=NotOlderThan")
            }),
            504,
        ),
        (
            "status-406-not-acceptable-partial-on-get.json",
            Box::new(|| {
                Client::new(&s)
                    .header(
                        "Accept",
                        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
                    )
                    .get("/api/v1/namespaces/team-a/configmaps/payments-config")
            }),
            406,
        ),
    ];
    for (name, call, code) in cases {
        let r = call();
        assert_eq!(r.status, code, "{name}");
        assert_eq!(String::from_utf8(r.body).unwrap(), fixture(name), "{name}");
    }

    // The expired continue token: the page ended at team-a/payments-config.
    s.expire_continue_tokens();
    let r = c.get(&format!("/api/v1/configmaps?limit=1&continue={token}"));
    assert_eq!(r.status, 410);
    assert_eq!(
        String::from_utf8(r.body).unwrap(),
        fixture("status-410-continue-expired.json")
    );
    let r = c.get("/api/v1/configmaps?limit=1&resourceVersion=184467301");
    assert_eq!(
        String::from_utf8(r.body).unwrap(),
        fixture("status-410-list-rv-too-old.json")
    );
}

#[test]
fn fault_bodies_match_the_fixtures() {
    let s = server();
    let c = Client::new(&s);
    let cases = [
        (Fault::InternalError, "status-500-internal-error.json", 500),
        (
            Fault::EtcdUnreachable(2),
            "status-500-etcd-unreachable.json",
            500,
        ),
        (Fault::Unavailable(5), "status-503-not-ready.json", 503),
        (
            Fault::CacheInitializing(1),
            "status-429-watch-cache-initializing.json",
            429,
        ),
        (Fault::GatewayTimeout, "timeout-filter-504-body.json", 504),
        (Fault::TooManyRequests(1), "apf-429-body.txt", 429),
        (Fault::Panic, "panic-500-body.txt", 500),
    ];
    for (fault, name, code) in cases {
        s.fault(Match::lists(), fault, 1);
        let r = c.get("/api/v1/configmaps");
        assert_eq!(r.status, code, "{name}");
        assert_eq!(
            String::from_utf8(r.body).unwrap().trim_end(),
            fixture(name),
            "{name}"
        );
    }
}
