//! A fleet on the chart's hubs: two followers that follow `cmpoll-hub` through its Service
//! from the start (rotation.rs sees their tokens rotate); later the hubs' TLS Secret
//! rotates and both hubs are evicted in turn (the PodDisruptionBudget keeps one), and the
//! two changes made meanwhile reach every follower, no module lost, added again or going
//! back on the way.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::chart::TOKEN_LIFETIME;
use super::{Node, eventually, serving_cert};

/// What one follower printed (`--stdout-events`): each module's events, in order, as
/// `(type, hash)`.
pub type Heard = BTreeMap<String, Vec<(String, String)>>;

/// Two followers of the hubs, started beside them (their tokens of 10 minutes rotate in
/// rotation.rs): each hears every selected module, at the apiserver's version. Their pods.
pub fn start(node: &Node) -> Vec<String> {
    node.apply(super::follower::ACCOUNT);
    node.apply(&followers());
    let selected = selected(node);
    let pods = eventually(
        "both followers to hear every module",
        Duration::from_secs(120),
        || {
            let pods = follower_pods(node);
            let heard: Vec<Heard> = pods.iter().map(|p| heard(node, p)).collect();
            let all = heard
                .iter()
                .all(|h| selected.keys().all(|m| h.contains_key(m)));
            if pods.len() == 2 && all {
                Ok(pods)
            } else {
                Err(format!("{pods:?}: {heard:?}"))
            }
        },
    );
    for pod in &pods {
        for (module, events) in &heard(node, pod) {
            assert_eq!(
                events[0],
                ("added".to_string(), selected[module].clone()),
                "{pod}: {module} began as the apiserver's"
            );
        }
    }
    pods
}

/// The hubs' TLS Secret rotates, then both hubs are evicted in turn while `pods` follow
/// them; two changes made meanwhile reach both followers, and nothing else does: no module
/// lost, added again or going back.
pub fn followers_ride_out_a_rotation_and_an_eviction(node: &Node, pods: &[String]) {
    // What each follower heard so far (the other steps' changes): the baseline.
    let before: Vec<Heard> = pods.iter().map(|p| heard(node, p)).collect();
    let hubs = both_hubs_serve_a_rotated_certificate(node);

    // Both hubs go, one after the other, so that every follower loses the hub it watched:
    // the second may not while the first is not back (minAvailable 1).
    let evict = |pod: &str| {
        let path = format!("/api/v1/namespaces/cmpoll/pods/{pod}/eviction");
        node.try_kubectl(&["create", "--raw", &path, "-f", "-"], Some(&eviction(pod)))
    };
    evict(&hubs[0]).unwrap_or_else(|e| panic!("the first eviction: {e}"));
    let refused = evict(&hubs[1]).expect_err("the PodDisruptionBudget lets the last hub go");
    assert!(refused.contains("disruption budget"), "{refused}");
    let status_page = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: status-page\n  namespace: web\n  labels: {cmpoll.io/module: 'true'}\ndata:\n  status.conf: 'server { listen 8081; }'\n";
    node.apply(status_page);
    eventually(
        "the other hub to be evicted once its replacement is Ready",
        Duration::from_secs(120),
        || evict(&hubs[1]),
    );
    // A key more, the rules kept: k8s/ serves them later.
    let key = r#"{"data":{"notes.txt":"changed"}}"#;
    let patch = [
        "-n",
        "team-payments",
        "patch",
        "configmap",
        "payments-rules",
        "--type",
        "merge",
        "-p",
        key,
    ];
    node.kubectl(&patch);

    // Both changes reach both followers, through whichever hubs the Service now has.
    // (Sorted, as the map keys them.)
    let changed = ["team-payments/payments-rules", "web/status-page"];
    eventually(
        "both changes to reach both followers",
        Duration::from_secs(120),
        || {
            let news: Vec<Heard> = (pods.iter().zip(&before))
                .map(|(p, b)| since(&heard(node, p), b))
                .collect();
            let both = news
                .iter()
                .all(|n| changed.iter().all(|m| n.contains_key(*m)));
            if both {
                Ok(())
            } else {
                Err(format!("{news:?}"))
            }
        },
    );
    // Nothing lost, nothing back, across both hubs going: the two changed modules updated
    // once, nothing else heard, by followers that never restarted; each module at the
    // apiserver's version.
    let selected = selected(node);
    for (pod, before) in pods.iter().zip(&before) {
        let status = node.json(&["-n", "cmpoll", "get", "pod", pod]);
        assert_eq!(
            status["status"]["containerStatuses"][0]["restartCount"], 0,
            "{pod}"
        );
        let all = heard(node, pod);
        let news = since(&all, before);
        let modules: Vec<&String> = news.keys().collect();
        assert_eq!(modules, changed, "{pod}: only the changes: {news:?}");
        for (module, events) in &news {
            let kinds: Vec<&str> = events.iter().map(|(t, _)| t.as_str()).collect();
            assert_eq!(kinds, ["updated"], "{pod}: {module}: {events:?}");
        }
        for (module, hash) in &selected {
            let last = all.get(module).and_then(|e| e.last()).map(|(_, h)| h);
            assert_eq!(
                last,
                Some(hash),
                "{pod}: {module} at the apiserver's version"
            );
        }
    }
    assert!(
        hub_pods(node).iter().all(|h| !hubs.contains(h)),
        "both first hubs gone"
    );
}

/// What `now` heard that `before` had not: each module's later events.
fn since(now: &Heard, before: &Heard) -> Heard {
    (now.iter())
        .filter_map(|(m, e)| {
            let seen = before.get(m).map_or(0, Vec::len);
            (e.len() > seen).then(|| (m.clone(), e[seen..].to_vec()))
        })
        .collect()
}

/// The Secret rotates (the same CA, a new serial): the kubelet swaps the volume, each hub
/// re-reads it and serves the new certificate. The two hubs, by name.
fn both_hubs_serve_a_rotated_certificate(node: &Node) -> Vec<String> {
    let dir = node.dir.join("hub-tls");
    let before = serial(&dir.join("tls.crt"));
    let names = [
        "cmpoll-hub.cmpoll.svc",
        "cmpoll-hub.cmpoll.svc.cluster.local",
    ];
    let (_, crt, key) = serving_cert(&dir, &names);
    let rotated = serial(&crt);
    assert!(
        rotated.starts_with("serial=") && before.starts_with("serial="),
        "{before} {rotated}"
    );
    assert_ne!(before, rotated);
    node.tls_secret("cmpoll", "cmpoll-hub-tls", &crt, &key);
    let hubs = hub_pods(node);
    assert_eq!(hubs.len(), 2);
    eventually(
        "both hubs to serve the rotated certificate",
        Duration::from_secs(150),
        || {
            let served: Vec<String> = node
                .ready_addresses("cmpoll", "cmpoll-hub")
                .iter()
                .map(|ip| served_serial(ip))
                .collect();
            if served.len() == 2 && served.iter().all(|s| *s == rotated) {
                Ok(())
            } else {
                Err(format!("{served:?}, want {rotated}"))
            }
        },
    );
    hubs
}

/// Each selected module's hash, as `cmpoll list` against the real apiserver prints it.
pub fn selected(node: &Node) -> BTreeMap<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_cmpoll"))
        .args(["list", "--json", "--kubeconfig"])
        .arg(&node.kubeconfig)
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let list: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (list.as_array().unwrap().iter())
        .map(|m| {
            (
                m["module"].as_str().unwrap().to_string(),
                m["hash"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub fn heard(node: &Node, pod: &str) -> Heard {
    let log = node
        .try_kubectl(&["-n", "cmpoll", "logs", pod], None)
        .unwrap_or_default();
    let mut heard = Heard::new();
    for line in log.lines().filter(|l| l.starts_with("{\"type\":")) {
        let e: Value = serde_json::from_str(line).unwrap();
        // `synced` closes a batch: about no module.
        let Some(module) = e["module"].as_str().map(str::to_string) else {
            continue;
        };
        let hash = e["hash"].as_str().unwrap_or("").to_string();
        heard
            .entry(module)
            .or_default()
            .push((e["type"].as_str().unwrap().to_string(), hash));
    }
    heard
}

fn names(pods: Vec<Value>) -> Vec<String> {
    (pods.iter())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn follower_pods(node: &Node) -> Vec<String> {
    names(node.pods("cmpoll", "app=followers"))
}

fn hub_pods(node: &Node) -> Vec<String> {
    names(node.pods("cmpoll", "app.kubernetes.io/name=cmpoll-hub"))
}

fn serial(cert: &std::path::Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(cert)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The serial of the certificate the hub at `ip` serves (from the node: pod IPs route).
fn served_serial(ip: &str) -> String {
    let pem = Command::new("sh")
        .arg("-c")
        .arg(format!("timeout 10 openssl s_client -connect {ip}:8443 -servername cmpoll-hub.cmpoll.svc </dev/null 2>/dev/null | openssl x509 -noout -serial"))
        .output()
        .unwrap();
    String::from_utf8(pem.stdout).unwrap().trim().to_string()
}

fn eviction(pod: &str) -> String {
    format!(
        "{{\"apiVersion\":\"policy/v1\",\"kind\":\"Eviction\",\"metadata\":{{\"name\":\"{pod}\",\"namespace\":\"cmpoll\"}}}}"
    )
}

/// Two followers of the hubs (follower.rs's account) by the Service's DNS
/// name, each printing what it hears; each with a token of 10 minutes, projected as the
/// kubelet projects a service account's (rotation.rs sees it rotate).
fn followers() -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: followers, namespace: cmpoll}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: followers}}}}
  template:
    metadata: {{labels: {{app: followers}}}}
    spec:
      serviceAccountName: follower
      automountServiceAccountToken: false
      enableServiceLinks: false
      securityContext: {{runAsNonRoot: true, runAsUser: 65532, seccompProfile: {{type: RuntimeDefault}}}}
      containers:
        - name: follower
          image: ghcr.io/cmpoll/cmpoll:0.1.0
          imagePullPolicy: Never
          args: [run, --server, 'https://cmpoll-hub.cmpoll.svc', --ca-file, /ca/ca.crt, --token-file, /token/token, --interval, 1s, --stdout-events]
          securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}
          volumeMounts:
            - {{name: ca, mountPath: /ca}}
            - {{name: token, mountPath: /token}}
            - {{name: tmp, mountPath: /tmp}}
      volumes:
        - {{name: ca, configMap: {{name: cmpoll-hub-ca}}}}
        - name: token
          projected: {{sources: [{{serviceAccountToken: {{path: token, expirationSeconds: {TOKEN_LIFETIME}}}}}]}}
        - {{name: tmp, emptyDir: {{}}}}
"
    )
}
