//! Tokens of 10 minutes (the least a pod may ask) rotating under the chart's running hubs
//! and two followers: the kubelet writes each a new token at 80 % of its lifetime; each
//! process takes it when the file changes (and says so), every request a hub makes of the
//! apiserver from then on carries the new token (the apiserver's audit log: its
//! credential-id), a new module reaches the followers through the hubs, and no request
//! failed — no 401, 403 or 5xx the hubs answered meanwhile, no review that refused a
//! follower, no 401 from the apiserver to a hub, no retry after one, no warning.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::chart::{Hub, TOKEN_LIFETIME};
use super::fleet::{heard, selected};
use super::{Node, claims, eventually};

/// How long after a new token was seen in a pod's volume a request may still carry the
/// old one: one sent as the file changed (each request looks at the file first).
const SWAP: Duration = Duration::from_secs(2);

/// One pod's projected token as the kubelet first wrote it.
pub struct Held {
    pod: String,
    file: PathBuf,
    claims: Value,
}

impl Held {
    /// The token's claims now (none while the kubelet swaps the folder).
    fn now(&self) -> Option<Value> {
        let token = std::fs::read_to_string(&self.file).ok()?;
        Some(claims(token.trim()))
    }

    /// The token the kubelet holds for the pod now.
    fn current(&self) -> String {
        std::fs::read_to_string(&self.file)
            .unwrap()
            .trim()
            .to_string()
    }

    fn at(&self, claim: &str) -> i64 {
        self.claims[claim].as_i64().unwrap()
    }
}

/// Before the tokens age: the first token of each hub and follower, and what each hub had
/// answered and asked by then.
pub struct Start {
    held: Vec<Held>,
    metrics: Vec<String>,
}

/// The first tokens of the hubs and of the followers `pods`, and the hubs' `/metrics`.
pub fn first_tokens(node: &Node, hubs: &[Hub], pods: &[String]) -> Start {
    let hubs_held = hubs
        .iter()
        .map(|h| (h.name.clone(), h.uid.clone(), "hub-token"));
    let followers = pods.iter().map(|p| {
        let pod = node.json(&["-n", "cmpoll", "get", "pod", p]);
        let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
        (p.clone(), uid, "token")
    });
    let held = (hubs_held.chain(followers))
        .map(|(pod, uid, volume)| {
            let file = node
                .pod_dir(&uid)
                .join("volumes/kubernetes.io~projected")
                .join(volume)
                .join("token");
            let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
            let claims = claims(&token);
            Held { pod, file, claims }
        })
        .collect();
    node.apply(METRICS_READER);
    let token = reader_token(node);
    let metrics = (hubs.iter())
        .map(|h| metrics(node, &h.name, &token))
        .collect();
    Start { held, metrics }
}

pub fn tokens_rotate_under_running_hubs_and_followers(node: &Node, start: &Start, hubs: &[Hub]) {
    let since = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let held = &start.held;
    let seen = every_token_rotates(held);
    for h in held {
        let now = &review(node, &h.current())["status"];
        assert_eq!(now["authenticated"], true, "{}'s token now: {now}", h.pod);
    }
    // The hubs and followers still work: a new module reaches both followers through a hub.
    let followers: Vec<&Held> = (held.iter())
        .filter(|h| !hubs.iter().any(|b| b.name == h.pod))
        .collect();
    a_new_module_reaches(node, &followers);
    eprintln!("every token rotated, a new module followed");
    // A token the hubs never saw: each reviews it with the apiserver, as itself, with its
    // review clients' own (new) tokens.
    let token = reader_token(node);
    let after: Vec<String> = hubs
        .iter()
        .map(|h| metrics(node, &h.name, &token))
        .collect();
    for (h, seen) in held.iter().zip(&seen) {
        if hubs.iter().any(|b| b.name == h.pod) {
            the_hub_asks_with_its_new_token(node, h, *seen);
        }
    }
    // Each took its new token when the file changed (never after a refusal), and warned
    // of nothing since the step began.
    for h in held {
        let log = node.kubectl(&["-n", "cmpoll", "logs", &h.pod]);
        assert!(
            log.contains("token file re-read (changed): using the new token"),
            "{}: {log}",
            h.pod
        );
        for refusal in [
            "(401 Unauthorized)",
            "retrying once with the renewed credential",
        ] {
            assert!(!log.contains(refusal), "{}: {log}", h.pod);
        }
        let since = format!("--since-time={since}");
        let recent = node.kubectl(&["-n", "cmpoll", "logs", &h.pod, &since]);
        // The hubs log JSON, the followers plain lines.
        let warned: Vec<&str> = (recent.lines())
            .filter(|l| {
                [
                    "\"level\":\"warn\"",
                    "\"level\":\"error\"",
                    " WARN ",
                    " ERROR ",
                ]
                .iter()
                .any(|w| l.contains(w))
            })
            .collect();
        assert!(warned.is_empty(), "{}: {warned:?}", h.pod);
    }
    let watches: f64 = (start.metrics.iter().zip(&after))
        .map(|(b, a)| {
            grew(b, a, "cmpoll_serve_watches_total", &|l| {
                l.contains("by=\"follower\"")
            })
        })
        .sum();
    assert!(watches > 0.0, "the followers watched the hubs: {after:?}");
    for ((hub, before), after) in hubs.iter().zip(&start.metrics).zip(&after) {
        no_request_failed(&hub.name, before, after);
    }
}

/// Waits until the kubelet gave every pod of `held` a new token: past 80 % of its
/// lifetime (less up to 10 s of jitter), at the pod's next sync (node.sh: every 10 s),
/// two minutes given for it on a busy machine. When each was first seen new.
fn every_token_rotates(held: &[Held]) -> Vec<SystemTime> {
    let last_iat = held.iter().map(|h| h.at("iat")).max().unwrap();
    let due = last_iat + TOKEN_LIFETIME * 8 / 10 + 120;
    let mut seen: HashMap<&str, SystemTime> = HashMap::new();
    eventually(
        "every hub's and follower's token rotated",
        Duration::from_secs((due - unix_now()).max(60) as u64),
        || {
            for h in held {
                if h.now().is_some_and(|c| c["iat"] != h.claims["iat"]) {
                    seen.entry(&h.pod).or_insert_with(SystemTime::now);
                }
            }
            let stale: Vec<&str> = (held.iter())
                .map(|h| h.pod.as_str())
                .filter(|p| !seen.contains_key(p))
                .collect();
            if stale.is_empty() {
                Ok(())
            } else {
                Err(format!("not yet: {stale:?}"))
            }
        },
    );
    for h in held {
        let (first, now) = (&h.claims, h.now().unwrap());
        let lifetime = now["exp"].as_i64().unwrap() - now["iat"].as_i64().unwrap();
        assert_eq!(lifetime, TOKEN_LIFETIME, "{}: {now}", h.pod);
        assert_eq!(now["sub"], first["sub"], "{}", h.pod);
        assert_eq!(now["kubernetes.io"]["pod"], first["kubernetes.io"]["pod"]);
        assert_ne!(now["jti"], first["jti"], "{}: a new token", h.pod);
    }
    held.iter().map(|h| seen[h.pod.as_str()]).collect()
}

/// The apiserver's audit log (node.sh: the cmpoll namespace's service accounts; each
/// event written before its answer): `hub` asked with its first token before the
/// kubelet's rotation, and every request it made from `SWAP` after the new token was
/// `seen` in its volume carried the new one — its poll's, and its review clients': the
/// hub is given tokens it never saw (through its `/metrics`) until the TokenReview of one,
/// received after that, is in the log. (A request refused for its token is audited
/// without a user: the hubs' `/metrics` deltas say none was.)
fn the_hub_asks_with_its_new_token(node: &Node, hub: &Held, seen: SystemTime) {
    let credential = |jti: &Value| format!("JTI={}", jti.as_str().unwrap());
    let (first, new) = (
        credential(&hub.claims["jti"]),
        credential(&hub.now().unwrap()["jti"]),
    );
    let tally = eventually(
        "a review with the new token in the audit log",
        Duration::from_secs(60),
        || {
            metrics(node, &hub.pod, &reader_token(node));
            let t = Tally::of(node, hub, seen, &new);
            match t.late_reviews {
                0 => Err(format!("{:?}, seen {}, newest {}", t.by, t.seen, t.newest)),
                _ => Ok(t),
            }
        },
    );
    let why = format!(
        "{}: requests by credential (before, after): {:?}; the first {first}, the new {new} seen at {}, the newest request at {}",
        hub.pod, tally.by, tally.seen, tally.newest
    );
    assert!(tally.by.get(&first).is_some_and(|c| c.0 > 0), "{why}");
    assert!(tally.by.get(&new).is_some_and(|c| c.1 > 0), "{why}");
    eprintln!("{why}");
}

/// What `hub` asked of the apiserver, by credential: (before, from `SWAP` after `seen`).
/// Panics on a request made after that with another credential than `new`.
struct Tally {
    by: HashMap<String, (usize, usize)>,
    late_reviews: usize,
    seen: String,
    newest: String,
}

impl Tally {
    fn of(node: &Node, hub: &Held, seen: SystemTime, new: &str) -> Tally {
        let log = std::fs::read_to_string(node.dir.join("audit.log")).unwrap();
        let mut by = HashMap::<String, (usize, usize)>::new();
        let (mut late_reviews, mut newest) = (0, String::new());
        // A line the apiserver is still writing is no event yet.
        let events =
            (log.lines()).filter_map(|l| Some((l, serde_json::from_str::<Value>(l).ok()?)));
        for (line, e) in events {
            let extra = &e["user"]["extra"];
            if extra["authentication.kubernetes.io/pod-name"][0] != hub.pod.as_str() {
                continue;
            }
            let id = extra["authentication.kubernetes.io/credential-id"][0]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let received = e["requestReceivedTimestamp"].as_str().unwrap();
            newest = newest.max(received.to_string());
            let late = humantime::parse_rfc3339(received).unwrap() > seen + SWAP;
            assert!(!(late && id != new), "{}: {line}", hub.pod);
            let counts = by.entry(id).or_default();
            if late {
                counts.1 += 1;
                late_reviews += usize::from(e["objectRef"]["resource"] == "tokenreviews");
            } else {
                counts.0 += 1;
            }
        }
        let seen = humantime::format_rfc3339_micros(seen).to_string();
        Tally {
            by,
            late_reviews,
            seen,
            newest,
        }
    }
}

/// A new module, at the apiserver's version, reaches each of `followers` through a hub.
fn a_new_module_reaches(node: &Node, followers: &[&Held]) {
    node.apply(AFTER_ROTATION);
    let hash = eventually(
        "the apiserver's list to have the new module",
        Duration::from_secs(30),
        || (selected(node).remove("web/after-rotation")).ok_or("not yet".to_string()),
    );
    eventually(
        "both followers to hear the new module",
        Duration::from_secs(60),
        || {
            let heard: Vec<_> = (followers.iter())
                .map(|h| heard(node, &h.pod).remove("web/after-rotation"))
                .collect();
            let want = Some(vec![("added".to_string(), hash.clone())]);
            if heard.iter().all(|e| *e == want) {
                Ok(())
            } else {
                Err(format!("{heard:?}"))
            }
        },
    );
}

/// The sum of family `name`'s series whose labels `labels` takes, in `/metrics` text `m`.
fn count(m: &str, name: &str, labels: &dyn Fn(&str) -> bool) -> f64 {
    (m.lines())
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            series.split('{').next() == Some(name)
                && labels(series.split_once('{').map_or("", |(_, l)| l))
        })
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum()
}

/// How much `name`'s series that `labels` takes grew from `before` to `after`.
fn grew(before: &str, after: &str, name: &str, labels: &dyn Fn(&str) -> bool) -> f64 {
    count(after, name, labels) - count(before, name, labels)
}

/// Between the hub's `before` and `after` counts: it answered, none of its answers a 401,
/// 403 or 5xx; its reviews allowed and refused no one; the apiserver answered it, never
/// with a 401.
fn no_request_failed(hub: &str, before: &str, after: &str) {
    let grew = |name: &str, labels: &dyn Fn(&str) -> bool| grew(before, after, name, labels);
    let code = |c: &'static str| move |l: &str| l.contains(&format!("code=\"{c}\""));
    let failed = |l: &str| {
        ["401", "403"]
            .iter()
            .any(|c| l.contains(&format!("code=\"{c}\"")))
            || l.contains("code=\"5")
    };
    let authn = |l: &str| l.contains("check=\"authentication\"");
    let allowed = |l: &str| authn(l) && l.contains("result=\"allowed\"");
    let refused = |l: &str| authn(l) && !l.contains("result=\"allowed\"");
    let why = format!("{hub}: before\n{before}\nafter\n{after}");
    assert!(
        grew("cmpoll_serve_requests_total", &code("200")) > 0.0,
        "{why}"
    );
    assert_eq!(grew("cmpoll_serve_requests_total", &failed), 0.0, "{why}");
    assert!(
        grew("cmpoll_serve_decisions_total", &allowed) > 0.0,
        "{why}"
    );
    assert_eq!(grew("cmpoll_serve_decisions_total", &refused), 0.0, "{why}");
    assert!(
        grew("cmpoll_apiserver_requests_total", &code("200")) > 0.0,
        "{why}"
    );
    assert_eq!(
        grew("cmpoll_apiserver_requests_total", &code("401")),
        0.0,
        "{why}"
    );
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The apiserver's TokenReview of `token`.
fn review(node: &Node, token: &str) -> Value {
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    });
    let path = "/apis/authentication.k8s.io/v1/tokenreviews";
    let out = node
        .try_kubectl(
            &["create", "--raw", path, "-f", "-"],
            Some(&body.to_string()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_str(&out).unwrap()
}

const AFTER_ROTATION: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: after-rotation
  namespace: web
  labels: {cmpoll.io/module: 'true'}
data:
  after.conf: 'server { listen 8082; }'
";

/// An account that may read the hubs' `/metrics` (as Prometheus would).
const METRICS_READER: &str = "apiVersion: v1
kind: ServiceAccount
metadata: {name: metrics-reader, namespace: cmpoll}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cmpoll-metrics-reader}
rules: [{nonResourceURLs: [/metrics], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cmpoll-metrics-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cmpoll-metrics-reader}
subjects: [{kind: ServiceAccount, name: metrics-reader, namespace: cmpoll}]
";

/// A new token of the metrics reader, once the apiserver authorizes it (RBAC's cache).
fn reader_token(node: &Node) -> String {
    let can = [
        "auth",
        "can-i",
        "get",
        "/metrics",
        "--as=system:serviceaccount:cmpoll:metrics-reader",
    ];
    eventually("the metrics reader's role", Duration::from_secs(30), || {
        node.try_kubectl(&can, None)
    });
    node.kubectl(&["-n", "cmpoll", "create", "token", "metrics-reader"])
        .trim()
        .to_string()
}

/// Hub pod `hub`'s `/metrics`, asked from the node by the name its certificate has.
fn metrics(node: &Node, hub: &str, token: &str) -> String {
    let pod = node.json(&["-n", "cmpoll", "get", "pod", hub]);
    let ip = pod["status"]["podIP"].as_str().unwrap().to_string();
    let ca = node.dir.join("hub-tls/ca.crt");
    let host = "cmpoll-hub.cmpoll.svc";
    eventually("the hub's /metrics", Duration::from_secs(30), || {
        let out = Command::new("curl")
            .args(["-sf", "-m", "10", "--cacert"])
            .arg(&ca)
            .arg("--resolve")
            .arg(format!("{host}:8443:{ip}"))
            .arg("-H")
            .arg(format!("Authorization: Bearer {token}"))
            .arg(format!("https://{host}:8443/metrics"))
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            Err(format!("{out:?}"))
        }
    })
}
