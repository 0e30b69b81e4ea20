//! The stand-in held to the real kube-apiserver (issue 24, item 3): every request cmpoll
//! makes — each path, query parameter, Accept header and error case — is sent to the
//! test apiserver and to the real one (v1.37.2, `test_apiserver::real`) holding the same
//! objects and the same users, and the answers are compared: status code, the headers
//! cmpoll reads, and the JSON body after uids, resourceVersions, timestamps, continue
//! tokens and managedFields are normalised. A difference fails the test unless it is in
//! `KNOWN` with the reason it does not matter to cmpoll (also in HACKING.md).

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_apiserver::real::{self, RealApiserver};
use test_apiserver::{ConfigMap, Grant, TestApiserver};

use common::{Client, Raw};

const SELECTOR: &str = "labelSelector=cmpoll.io%2Fmodule%3Dtrue";
const METADATA: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json";
/// What cmpoll asks for metadata lists (client-go's metadata client's Accept).
const METADATA_PROTOBUF: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// Differences that do not matter to cmpoll: (request, where, why).
const KNOWN: &[(&str, &str, &str)] = &[
    (
        "a resource that does not exist",
        "status",
        "the real apiserver authorizes before it routes: a user without rights on an unknown \
         resource gets 403 (an admin gets 404); the stand-in has no admin and answers 404 to \
         everyone; cmpoll never asks for another resource than configmaps and secrets",
    ),
    ("a resource that does not exist", "body", "the same"),
    (
        "list metadata only, protobuf first",
        "content-type",
        "the real apiserver answers protobuf; the stand-in speaks only JSON and takes the JSON \
         alternative, as an apiserver without protobuf would; cmpoll reads both (the protobuf \
         reader is held to bodies recorded from the real apiserver, src/source/proto/tests.rs, \
         and tests/real checks that metadata lists arrive in protobuf)",
    ),
    ("list metadata only, protobuf first", "body", "the same"),
];

/// Makes the continue tokens handed out so far expire (`next`: one of them, to see).
type Expire<'a> = Box<dyn Fn(&Client, &str) + 'a>;

/// One server, seen as cmpoll sees it.
struct Side<'a> {
    addr: SocketAddr,
    ca: String,
    certs: Vec<(&'static str, test_apiserver::CertPair)>,
    expire: Expire<'a>,
}

impl Side<'_> {
    fn client(&self, user: &str) -> Client {
        let cert = self.certs.iter().find(|(u, _)| *u == user).map(|(_, c)| c);
        Client::to(self.addr, &self.ca, cert)
            .header("User-Agent", "cmpoll/differential")
            .header("Accept", "application/json")
    }
}

/// What one request gave, normalised.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    content_encoding: Option<String>,
    retry_after: bool,
    body: Value,
}

fn answer(raw: &Raw) -> Answer {
    let body = if raw.header("content-encoding") == Some("gzip") {
        use std::io::Read as _;
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw.body[..])
            .read_to_end(&mut out)
            .unwrap();
        out
    } else {
        raw.body.clone()
    };
    let body = match serde_json::from_slice::<Value>(&body) {
        Ok(v) => normalise(v),
        Err(_) => Value::String(String::from_utf8_lossy(&body).trim().to_string()),
    };
    Answer {
        status: raw.status,
        content_type: raw
            .header("content-type")
            .unwrap_or("")
            .to_ascii_lowercase(),
        content_encoding: raw.header("content-encoding").map(str::to_string),
        retry_after: raw.header("retry-after").is_some(),
        body,
    }
}

/// Values that differ between any two clusters: replaced by what they are.
fn normalise(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| k != "managedFields")
                .map(|(k, v)| {
                    let v = match (k.as_str(), &v) {
                        ("uid", Value::String(_)) => json!("<uid>"),
                        ("resourceVersion", Value::String(s)) if !s.is_empty() => json!("<rv>"),
                        ("creationTimestamp", Value::String(_)) => json!("<time>"),
                        ("continue", Value::String(s)) if !s.is_empty() => json!("<continue>"),
                        ("message", Value::String(s)) => Value::String(digits(s)),
                        _ => normalise(v),
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(normalise).collect()),
        v => v,
    }
}

/// Numbers in a message (resourceVersions) as `N`.
fn digits(s: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
    out
}

/// The same script of requests against one side; each answer named.
fn script(side: &Side) -> Vec<(String, Answer)> {
    let cm = side.client("diff-cm");
    let mut out: Vec<(String, Answer)> = Vec::new();
    let mut ask = |name: &str, client: &Client, target: &str| -> Raw {
        let raw = client.get(target);
        out.push((name.to_string(), answer(&raw)));
        raw
    };
    let all = format!("/api/v1/configmaps?{SELECTOR}&resourceVersion=0");
    let first = ask("list all namespaces, resourceVersion=0", &cm, &all);
    let rv = first.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    ask(
        "list one namespace, resourceVersion=0",
        &cm,
        &format!("/api/v1/namespaces/apps/configmaps?{SELECTOR}&resourceVersion=0"),
    );
    ask(
        "list NotOlderThan the last list",
        &cm,
        &format!(
            "/api/v1/configmaps?{SELECTOR}&resourceVersion={rv}&resourceVersionMatch=NotOlderThan"
        ),
    );
    ask(
        "list metadata only",
        &cm.with_header("Accept", METADATA),
        &format!("/api/v1/namespaces/apps/configmaps?{SELECTOR}&resourceVersion=0"),
    );
    ask(
        "list metadata only, protobuf first",
        &cm.with_header("Accept", METADATA_PROTOBUF),
        &format!("/api/v1/namespaces/apps/configmaps?{SELECTOR}&resourceVersion=0"),
    );
    ask(
        "list metadata only, nothing selected",
        &cm.with_header("Accept", METADATA),
        "/api/v1/namespaces/apps/configmaps?labelSelector=nothing%3Dhere&resourceVersion=0",
    );
    ask(
        "list with a field selector",
        &cm,
        &format!(
            "/api/v1/configmaps?{SELECTOR}&fieldSelector=metadata.namespace%3Dweb&resourceVersion=0"
        ),
    );
    let a = first.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["metadata"]["name"] == "a")
        .unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    ask(
        "get one object not older than listed",
        &cm,
        &format!("/api/v1/namespaces/apps/configmaps/a?resourceVersion={a}"),
    );
    ask(
        "get an object that is not there",
        &cm,
        &format!("/api/v1/namespaces/apps/configmaps/gone?resourceVersion={a}"),
    );
    let page = ask(
        "first page",
        &cm,
        &format!("/api/v1/configmaps?{SELECTOR}&limit=2"),
    );
    let token = page.json()["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    ask(
        "next page",
        &cm,
        &format!("/api/v1/configmaps?{SELECTOR}&limit=2&continue={token}"),
    );
    let page = ask(
        "first page, again",
        &cm,
        &format!("/api/v1/configmaps?{SELECTOR}&limit=1"),
    );
    let token = page.json()["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    let next = format!("/api/v1/configmaps?{SELECTOR}&limit=1&continue={token}");
    (side.expire)(&cm, &next);
    ask("a continue token that expired", &cm, &next);
    ask(
        "a resourceVersion the cache has not reached",
        &cm,
        &format!(
            "/api/v1/configmaps?{SELECTOR}&resourceVersion=999999999&resourceVersionMatch=NotOlderThan"
        ),
    );
    ask(
        "a label selector that does not parse",
        &cm,
        "/api/v1/configmaps?labelSelector=a%20in%20(b&resourceVersion=0",
    );
    ask(
        "a field selector on an unknown field",
        &cm,
        "/api/v1/configmaps?fieldSelector=data.k%3Dv&resourceVersion=0",
    );
    let secrets = side.client("diff-secrets");
    ask(
        "list secrets in a namespace granted",
        &secrets,
        &format!("/api/v1/namespaces/apps/secrets?{SELECTOR}&resourceVersion=0"),
    );
    ask(
        "list secrets in a namespace not granted",
        &secrets,
        &format!("/api/v1/namespaces/web/secrets?{SELECTOR}&resourceVersion=0"),
    );
    ask(
        "get a secret not granted",
        &secrets,
        "/api/v1/namespaces/web/secrets/s",
    );
    ask(
        "list all namespaces without a grant",
        &side.client("nobody"),
        &format!("/api/v1/configmaps?{SELECTOR}&resourceVersion=0"),
    );
    ask(
        "a bearer token nobody issued",
        &Client::to(side.addr, &side.ca, None)
            .header("Accept", "application/json")
            .bearer("not-a-token"),
        &format!("/api/v1/configmaps?{SELECTOR}&resourceVersion=0"),
    );
    ask(
        "a large list, gzip accepted",
        &cm.with_header("Accept-Encoding", "gzip"),
        "/api/v1/namespaces/big/configmaps?resourceVersion=0",
    );
    ask(
        "a resource that does not exist",
        &cm,
        "/api/v1/namespaces/apps/nonsense",
    );
    out
}

/// The objects both servers hold.
fn objects() -> Vec<ConfigMap> {
    let labelled =
        |ns: &str, name: &str| ConfigMap::new(ns, name).label("cmpoll.io/module", "true");
    let mut v = vec![
        labelled("apps", "a").data("k", "v1").data("x.conf", "a\nb"),
        labelled("apps", "b").binary("logo.png", &[0, 1, 255]),
        labelled("web", "c").data("k", "c"),
        ConfigMap::new("apps", "plain").data("k", "p"),
        ConfigMap::secret("apps", "s")
            .label("cmpoll.io/module", "true")
            .binary("password", b"hunter2"),
        ConfigMap::secret("web", "s")
            .label("cmpoll.io/module", "true")
            .binary("password", b"other"),
    ];
    // Over 128 KiB in all: the size above which the apiserver gzips.
    for i in 0..40 {
        v.push(ConfigMap::new("big", &format!("m{i:02}")).data("k", &"x".repeat(4000)));
    }
    v
}

/// An object as the stand-in serves it, as a manifest for the real apiserver: the same
/// object, less what each server assigns.
fn manifest(served: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(served).unwrap();
    let meta = v["metadata"].as_object_mut().unwrap();
    for k in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
    ] {
        meta.remove(k);
    }
    v
}

#[test]
fn the_stand_in_answers_as_the_real_apiserver_does() {
    if !real::built() {
        assert!(
            std::env::var("CI").is_err(),
            "the real apiserver is needed and CI=true: run tests/kube/build.sh"
        );
        eprintln!("SKIPPED: the real apiserver is not built (tests/kube/build.sh)");
        return;
    }
    let s = TestApiserver::start();
    let served: Vec<Vec<u8>> = objects()
        .into_iter()
        .map(|cm| s.put(cm).get_json())
        .collect();
    let k = RealApiserver::start();
    for ns in ["apps", "web", "big"] {
        k.ok(&["create", "namespace", ns]);
    }
    let items: Vec<Value> = served.iter().map(|o| manifest(o)).collect();
    for chunk in items.chunks(10) {
        k.ok_in(
            &["apply", "--server-side", "-f", "-"],
            Some(&json!({"apiVersion": "v1", "kind": "List", "items": chunk}).to_string()),
        );
    }
    k.apply(
        r#"{"apiVersion":"v1","kind":"List","items":[
{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"diff-cm"},
 "rules":[{"apiGroups":[""],"resources":["configmaps"],"verbs":["list","get"]}]},
{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"diff-cm"},
 "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"diff-cm"},
 "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"diff-cm"}]},
{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"diff-secrets","namespace":"apps"},
 "rules":[{"apiGroups":[""],"resources":["secrets"],"verbs":["list","get"]}]},
{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"diff-secrets","namespace":"apps"},
 "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"diff-secrets"},
 "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"diff-secrets"}]}]}"#,
    );
    s.grant(
        "diff-cm",
        Grant {
            list: true,
            get: true,
            namespaces: None,
            resources: BTreeSet::from(["configmaps".to_string()]),
        },
    );
    s.grant(
        "diff-secrets",
        Grant {
            list: true,
            get: true,
            namespaces: Some(BTreeSet::from(["apps".to_string()])),
            resources: BTreeSet::from(["secrets".to_string()]),
        },
    );
    let users = ["diff-cm", "diff-secrets", "nobody"];
    let real = script(&Side {
        addr: SocketAddr::from(([127, 0, 0, 1], k.port)),
        ca: k.ca_pem(),
        certs: users.iter().map(|u| (*u, k.client_cert(u, None))).collect(),
        expire: Box::new(|client, next| {
            // As the apiserver's compactor does it; the watch cache follows within 15 s.
            k.put_configmap("apps", "bump", &[], &[("k", "1")]);
            k.compact();
            let start = Instant::now();
            while client.get(next).status != 410 {
                assert!(
                    start.elapsed() < Duration::from_secs(40),
                    "the token never expired"
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }),
    });
    let stand_in = script(&Side {
        addr: s.addr(),
        ca: s.ca_pem(),
        certs: users.iter().map(|u| (*u, s.client_cert(u))).collect(),
        expire: Box::new(|_, _| s.expire_continue_tokens()),
    });
    let mut differences = Vec::new();
    let mut known = BTreeSet::new();
    for ((name, want), (_, got)) in real.iter().zip(&stand_in) {
        let mut diff = |what: &str, w: String, g: String| {
            if w == g {
                return;
            }
            match KNOWN.iter().position(|(n, at, _)| n == name && *at == what) {
                Some(i) => {
                    known.insert(i);
                }
                None => {
                    differences.push(format!("{name}: {what}:\n  real:     {w}\n  stand-in: {g}"))
                }
            }
        };
        diff("status", want.status.to_string(), got.status.to_string());
        diff(
            "content-type",
            want.content_type.clone(),
            got.content_type.clone(),
        );
        diff(
            "content-encoding",
            format!("{:?}", want.content_encoding),
            format!("{:?}", got.content_encoding),
        );
        diff(
            "retry-after",
            want.retry_after.to_string(),
            got.retry_after.to_string(),
        );
        diff("body", want.body.to_string(), got.body.to_string());
    }
    for (i, (name, at, _)) in KNOWN.iter().enumerate() {
        assert!(
            known.contains(&i),
            "KNOWN lists \"{name}\" ({at}), which no longer differs: take it out (and out of HACKING.md)"
        );
    }
    assert!(
        differences.is_empty(),
        "{} differences between the real apiserver and the stand-in:\n{}",
        differences.len(),
        differences.join("\n")
    );
}
