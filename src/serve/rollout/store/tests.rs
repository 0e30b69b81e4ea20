#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    (pairs.iter())
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect()
}

#[test]
fn memory_store_is_the_apiserver_s_concurrency() {
    let mut a = MemoryStore::new("ns", "rollouts");
    let mut b = a.clone();
    assert_eq!(a.describe(), "secret ns/rollouts");
    assert_eq!(a.read().unwrap(), None);
    // Replacing what does not exist: as a PUT of a deleted Secret.
    assert_eq!(a.write(Some("1"), &data(&[])).unwrap(), Wrote::Conflict);
    let Wrote::Done(first) = a.write(None, &data(&[("k", "one")])).unwrap() else {
        panic!("created")
    };
    assert_eq!(first.resource_version, "1");
    // The other hub creates too late, reads, and replaces at the version it read.
    assert_eq!(
        b.write(None, &data(&[("k", "two")])).unwrap(),
        Wrote::Conflict
    );
    let seen = b.read().unwrap().unwrap();
    assert_eq!(seen, first);
    let Wrote::Done(second) = b.write(Some("1"), &data(&[("k", "two")])).unwrap() else {
        panic!("replaced")
    };
    assert_eq!(second.resource_version, "2");
    assert_eq!(second.data, data(&[("k", "two")]));
    // The first hub's version is stale now.
    assert_eq!(
        a.write(Some("1"), &data(&[("k", "three")])).unwrap(),
        Wrote::Conflict
    );
    assert_eq!(a.read().unwrap().unwrap(), second);
    assert_eq!(a.stored(), Some(second));
}

#[test]
fn memory_store_fails_as_told_per_handle() {
    let mut a = MemoryStore::default();
    let b = a.clone();
    assert_eq!(a.describe(), "secret cmpoll/cmpoll-rollouts");
    a.fail(Some("apiserver away".into()));
    assert_eq!(a.read().unwrap_err(), "apiserver away");
    assert_eq!(a.write(None, &data(&[])).unwrap_err(), "apiserver away");
    assert_eq!(a.stored(), None, "nothing written");
    let mut b = b;
    assert!(matches!(b.write(None, &data(&[])), Ok(Wrote::Done(_))));
    a.fail(None);
    assert_eq!(a.read().unwrap().unwrap().resource_version, "1");
}

/// One request as the scripted apiserver got it.
#[derive(Debug)]
struct Got {
    method: String,
    path: String,
    body: Vec<u8>,
}

/// A plain-HTTP apiserver that answers each connection's one request with the next of
/// `answers` (status, body) and records what it got.
fn apiserver(answers: Vec<(u16, String)>) -> (KubeStore, Arc<Mutex<Vec<Got>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let got: Arc<Mutex<Vec<Got>>> = Arc::default();
    let log = got.clone();
    let mut answers = VecDeque::from(answers);
    std::thread::spawn(move || {
        while let Some((code, body)) = answers.pop_front() {
            let (mut conn, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let mut parts = line.split(' ');
            let method = parts.next().unwrap().to_string();
            let path = parts.next().unwrap().to_string();
            let mut length = 0;
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).unwrap();
                if h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    length = v.trim().parse().unwrap();
                }
            }
            let mut sent = vec![0; length];
            reader.read_exact(&mut sent).unwrap();
            log.lock().unwrap().push(Got {
                method,
                path,
                body: sent,
            });
            let head = format!(
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(body.as_bytes());
        }
    });
    let flags = kube::config::Flags {
        server: Some(format!("http://{addr}")),
        ..Default::default()
    };
    let mut config = kube::Config::resolve(&flags, &|_| None).unwrap();
    config.trust = crate::http::tls::Trust::Insecure;
    let options = kube::client::Options {
        timeout: Duration::from_secs(10),
        max_response_bytes: 64 << 20,
        allow_insecure_http: false,
    };
    let client = kube::Client::new(&config, options, Default::default(), &|_| None).unwrap();
    (KubeStore::new(client, "ns", "rollouts"), got)
}

fn status(code: u16, reason: &str, message: &str) -> (u16, String) {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason,
        "details": {"name": "rollouts", "kind": "secrets"}, "code": code,
    });
    (code, status.to_string())
}

fn secret(rv: &str, data: &[(&str, &str)]) -> (u16, String) {
    let data: serde_json::Map<String, serde_json::Value> = (data.iter())
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    let s = serde_json::json!({
        "kind": "Secret", "apiVersion": "v1",
        "metadata": {"name": "rollouts", "namespace": "ns", "resourceVersion": rv},
        "data": data, "type": "Opaque",
    });
    (200, s.to_string())
}

#[test]
fn kube_store_reads_the_secret_or_nothing() {
    let (mut store, got) = apiserver(vec![
        status(404, "NotFound", "secrets \"rollouts\" not found"),
        // base64 of "{}" and of "x".
        secret("41", &[("rollouts.json", "e30="), ("stable.00", "eA==")]),
        (
            200,
            r#"{"kind":"Secret","metadata":{"resourceVersion":"42"},"data":null}"#.into(),
        ),
    ]);
    assert_eq!(store.describe(), "secret ns/rollouts");
    assert_eq!(store.read().unwrap(), None);
    let s = store.read().unwrap().unwrap();
    assert_eq!(s.resource_version, "41");
    assert_eq!(s.data, data(&[("rollouts.json", "{}"), ("stable.00", "x")]));
    let s = store.read().unwrap().unwrap();
    assert_eq!((s.resource_version.as_str(), s.data.len()), ("42", 0));
    let got = got.lock().unwrap();
    for g in got.iter() {
        assert_eq!(
            (g.method.as_str(), g.path.as_str()),
            ("GET", "/api/v1/namespaces/ns/secrets/rollouts")
        );
    }
}

#[test]
fn kube_store_creates_then_replaces_at_a_version() {
    let (mut store, got) = apiserver(vec![
        secret("7", &[("k", "b25l")]),
        secret("8", &[("k", "dHdv")]),
    ]);
    let Wrote::Done(s) = store.write(None, &data(&[("k", "one")])).unwrap() else {
        panic!("created")
    };
    assert_eq!(
        (s.resource_version.as_str(), &s.data),
        ("7", &data(&[("k", "one")]))
    );
    let Wrote::Done(s) = store.write(Some("7"), &data(&[("k", "two")])).unwrap() else {
        panic!("replaced")
    };
    assert_eq!(s.resource_version, "8", "as the apiserver answered");
    let got = got.lock().unwrap();
    let sent = |i: usize| -> serde_json::Value { serde_json::from_slice(&got[i].body).unwrap() };
    assert_eq!(
        (got[0].method.as_str(), got[0].path.as_str()),
        ("POST", "/api/v1/namespaces/ns/secrets")
    );
    let created = sent(0);
    assert_eq!(created["kind"], "Secret");
    assert_eq!(created["type"], "Opaque");
    assert_eq!(created["metadata"]["name"], "rollouts");
    assert_eq!(created["metadata"]["namespace"], "ns");
    assert_eq!(
        created["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "cmpoll"
    );
    assert_eq!(created["metadata"].get("resourceVersion"), None);
    assert_eq!(created["data"]["k"], "b25l");
    assert_eq!(
        (got[1].method.as_str(), got[1].path.as_str()),
        ("PUT", "/api/v1/namespaces/ns/secrets/rollouts")
    );
    let replaced = sent(1);
    assert_eq!(replaced["metadata"]["resourceVersion"], "7");
    assert_eq!(replaced["data"]["k"], "dHdv");
    assert_eq!(replaced["type"], "Opaque");
}

#[test]
fn kube_store_conflicts() {
    let (mut store, _) = apiserver(vec![
        status(409, "AlreadyExists", "secrets \"rollouts\" already exists"),
        status(409, "Conflict", "the object has been modified"),
        status(404, "NotFound", "secrets \"rollouts\" not found"),
    ]);
    let d = data(&[("k", "v")]);
    assert_eq!(store.write(None, &d).unwrap(), Wrote::Conflict);
    assert_eq!(store.write(Some("3"), &d).unwrap(), Wrote::Conflict);
    assert_eq!(
        store.write(Some("3"), &d).unwrap(),
        Wrote::Conflict,
        "deleted"
    );
}

#[test]
fn a_403_says_what_rbac_the_hubs_need() {
    let (mut store, _) = apiserver(vec![
        status(403, "Forbidden", "secrets \"rollouts\" is forbidden: nope"),
        status(403, "Forbidden", "secrets is forbidden: nope"),
    ]);
    let e = store.read().unwrap_err();
    assert!(e.contains("read secret ns/rollouts: 403 Forbidden"), "{e}");
    assert!(
        e.contains(
            "get and update on secrets named rollouts in namespace ns, and create on secrets in ns"
        ),
        "{e}"
    );
    let e = store.write(None, &data(&[])).unwrap_err();
    assert!(e.contains("create secret ns/rollouts: 403"), "{e}");
    assert!(e.contains("create on secrets in ns"), "{e}");
}

/// What goes wrong says where, never what the Secret holds.
#[test]
fn errors_never_hold_the_data() {
    let long = "m".repeat(5000);
    let (mut store, _) = apiserver(vec![
        secret("1", &[("rollouts.json", "!!s3cr3t!!")]),
        (
            200,
            r#"{"metadata":{"resourceVersion":"1"},"data":{"k":31415926}}"#.into(),
        ),
        (
            200,
            r#"{"metadata":{"resourceVersion":"1"},"data":{"k":"czNjcjN0"}"#.into(),
        ),
        (200, r#"{"metadata":{},"data":{"k":"czNjcjN0"}}"#.into()),
        status(500, "InternalError", &long),
    ]);
    let e = store.read().unwrap_err();
    assert_eq!(
        e,
        "cannot read secret ns/rollouts: data[rollouts.json] is not base64"
    );
    let e = store.read().unwrap_err();
    assert!(
        e.contains("not a Secret (line 1") && !e.contains("31415926"),
        "{e}"
    );
    let e = store.read().unwrap_err();
    assert!(e.contains("not a Secret") && !e.contains("czNjcjN0"), "{e}");
    let e = store.read().unwrap_err();
    assert!(e.contains("without metadata.resourceVersion"), "{e}");
    let e = store
        .write(Some("1"), &data(&[("k", "s3cr3t")]))
        .unwrap_err();
    assert!(e.contains("update secret ns/rollouts: 500"), "{e}");
    assert!(
        e.len() <= MAX_MESSAGE + 3 && e.ends_with('…'),
        "cut: {}",
        e.len()
    );
    // Debug shows sizes, not bytes; a request's body is not shown either.
    let s = Stored {
        resource_version: "1".into(),
        data: data(&[("k", "s3cr3t")]),
    };
    let shown = format!("{s:?}");
    assert!(
        shown.contains("\"k\": 6") && !shown.contains("s3cr3t"),
        "{shown}"
    );
    let put = Method::Put {
        content_type: "application/json",
        body: b"s3cr3t".to_vec(),
    };
    assert_eq!(
        format!("{put:?}"),
        "Put { content_type: \"application/json\", body: 6 bytes }"
    );
}

#[test]
fn answers_are_read_bounded() {
    let big = format!(
        r#"{{"metadata":{{"resourceVersion":"1"}},"data":{{"k":"{}"}}}}"#,
        "A".repeat(MAX_ANSWER as usize)
    );
    let (mut store, _) = apiserver(vec![(200, big)]);
    let e = store.read().unwrap_err();
    assert_eq!(
        e,
        "cannot read secret ns/rollouts: the answer is larger than 3 MiB"
    );
}
