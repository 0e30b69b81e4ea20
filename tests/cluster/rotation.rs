//! Tokens of 10 minutes (the least a pod may ask) rotating under the chart's running hubs
//! and two followers: the kubelet writes each a new token at 80 % of its lifetime; the hubs
//! go on polling the apiserver and the followers following the hubs past the moment every
//! first token expired, and no request failed — no 401 or 403 the hubs answered, no review
//! that refused a follower, no 401 from the apiserver to a hub, no warning from a follower.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::chart::{Hub, TOKEN_LIFETIME};
use super::fleet::{heard, selected};
use super::{Node, claims, eventually};

/// One pod's projected token as the kubelet first wrote it.
pub struct Held {
    pod: String,
    file: PathBuf,
    claims: Value,
}

impl Held {
    fn now(&self) -> Value {
        let token = std::fs::read_to_string(&self.file)
            .unwrap_or_else(|e| panic!("{}: {e}", self.file.display()));
        claims(token.trim())
    }

    fn at(&self, claim: &str) -> i64 {
        self.claims[claim].as_i64().unwrap()
    }
}

/// The first tokens of the hubs and of the followers `pods`.
pub fn first_tokens(node: &Node, hubs: &[Hub], pods: &[String]) -> Vec<Held> {
    let hubs = hubs
        .iter()
        .map(|h| (h.name.clone(), h.uid.clone(), "hub-token"));
    let followers = pods.iter().map(|p| {
        let pod = node.json(&["-n", "cmpoll", "get", "pod", p]);
        let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
        (p.clone(), uid, "token")
    });
    (hubs.chain(followers))
        .map(|(pod, uid, volume)| {
            let file = node
                .pod_dir(&uid)
                .join("volumes/kubernetes.io~projected")
                .join(volume)
                .join("token");
            let mut held = Held {
                pod,
                file,
                claims: Value::Null,
            };
            held.claims = held.now();
            held
        })
        .collect()
}

pub fn tokens_rotate_under_running_hubs_and_followers(node: &Node, held: &[Held], hubs: &[Hub]) {
    every_token_rotates(held);
    // Past every first token's end (and a little: the apiserver's clock is this one), the
    // hubs and followers still work: a new module reaches both followers through a hub.
    let expired = held.iter().map(|h| h.at("exp")).max().unwrap() + 5;
    let wait = (expired - unix_now()).max(0) as u64;
    eprintln!("every token rotated; {wait} s until the first ones have all expired");
    std::thread::sleep(Duration::from_secs(wait));
    let followers: Vec<&Held> = (held.iter())
        .filter(|h| !hubs.iter().any(|b| b.name == h.pod))
        .collect();
    a_new_module_reaches(node, &followers);
    // Each took its new token (read when the file changed, not after a refusal), and no
    // request failed on the way.
    for h in held {
        let log = node.kubectl(&["-n", "cmpoll", "logs", &h.pod]);
        assert!(
            log.contains("token file re-read (changed): using the new token"),
            "{}: {log}",
            h.pod
        );
        // The hubs log JSON, the followers plain lines.
        let warned: Vec<&str> = (log.lines())
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
    let token = metrics_reader(node);
    for hub in hubs {
        no_request_failed(node, hub, &token);
    }
}

/// Waits until the kubelet gave every pod of `held` a new token: past 80 % of its
/// lifetime (less up to 10 s of jitter), at the pod's next sync (node.sh: every 10 s).
fn every_token_rotates(held: &[Held]) {
    let last_iat = held.iter().map(|h| h.at("iat")).max().unwrap();
    let due = last_iat + TOKEN_LIFETIME * 8 / 10 + 60;
    eventually(
        "every hub's and follower's token rotated",
        Duration::from_secs((due - unix_now()).max(60) as u64),
        || {
            let stale: Vec<String> = (held.iter())
                .filter(|h| h.now()["iat"] == h.claims["iat"])
                .map(|h| h.pod.clone())
                .collect();
            if stale.is_empty() {
                Ok(())
            } else {
                Err(format!("not yet: {stale:?}"))
            }
        },
    );
    for h in held {
        let (first, now) = (&h.claims, h.now());
        let lifetime = now["exp"].as_i64().unwrap() - now["iat"].as_i64().unwrap();
        assert_eq!(lifetime, TOKEN_LIFETIME, "{}: {now}", h.pod);
        assert_eq!(now["sub"], first["sub"], "{}", h.pod);
        assert_eq!(now["kubernetes.io"]["pod"], first["kubernetes.io"]["pod"]);
        assert_ne!(now["jti"], first["jti"], "{}: a new token", h.pod);
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

/// The hub's own counts: it answered, and none of its answers was a 401, 403 or 5xx; its
/// reviews refused no one; the apiserver answered it, never with a 401.
fn no_request_failed(node: &Node, hub: &Hub, token: &str) {
    let pod = node.json(&["-n", "cmpoll", "get", "pod", &hub.name]);
    let m = metrics(node, pod["status"]["podIP"].as_str().unwrap(), token);
    let count = |name: &str, labels: &dyn Fn(&str) -> bool| -> f64 {
        (m.lines())
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(series, _)| {
                series.split('{').next() == Some(name)
                    && labels(series.split_once('{').map_or("", |(_, l)| l))
            })
            .map(|(_, v)| v.parse::<f64>().unwrap())
            .sum()
    };
    let code = |c: &'static str| move |l: &str| l.contains(&format!("code=\"{c}\""));
    let failed = |l: &str| {
        ["401", "403"]
            .iter()
            .any(|c| l.contains(&format!("code=\"{c}\"")))
            || l.contains("code=\"5")
    };
    let refused =
        |l: &str| l.contains("check=\"authentication\"") && !l.contains("result=\"allowed\"");
    let name = &hub.name;
    assert!(
        count("cmpoll_serve_requests_total", &code("200")) > 0.0,
        "{name}: {m}"
    );
    assert_eq!(
        count("cmpoll_serve_requests_total", &failed),
        0.0,
        "{name}: {m}"
    );
    assert_eq!(
        count("cmpoll_serve_decisions_total", &refused),
        0.0,
        "{name}: {m}"
    );
    assert!(
        count("cmpoll_apiserver_requests_total", &code("200")) > 0.0,
        "{name}: {m}"
    );
    assert_eq!(
        count("cmpoll_apiserver_requests_total", &code("401")),
        0.0,
        "{name}: {m}"
    );
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
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

/// A token of an account that may read the hubs' `/metrics` (as Prometheus would).
fn metrics_reader(node: &Node) -> String {
    node.apply(
        "apiVersion: v1
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
",
    );
    node.kubectl(&["-n", "cmpoll", "create", "token", "metrics-reader"])
        .trim()
        .to_string()
}

/// The hub at `ip`'s `/metrics`, asked from the node by the name its certificate has.
fn metrics(node: &Node, ip: &str, token: &str) -> String {
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
