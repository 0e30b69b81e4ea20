//! charts/cmpoll installed by the real helm on the real node: its hubs Ready under the
//! kubelet's HTTPS probes, their process as runc started it, their token as the kubelet
//! projected it.

use std::path::Path;
use std::time::Duration;

use super::{Node, claims, eventually, serving_cert};

/// A hub pod: its name, uid, and the pid of its `cmpoll serve` on this machine.
pub struct Hub {
    pub name: String,
    pub uid: String,
    pub pid: u32,
}

/// The namespaces and modules of k8s/examples, the hub's TLS Secret, a Service named to
/// look like cmpoll's variables, then `helm install --wait` with tokens of the least
/// lifetime a pod may ask (10 minutes: rotation.rs sees them rotate): both hubs Ready, both
/// in the Service's EndpointSlice.
pub fn installed(node: &Node) -> Vec<Hub> {
    for ns in ["cmpoll", "monitoring", "web", "team-payments"] {
        node.kubectl(&["create", "namespace", ns]);
    }
    let (ca, crt, key) = serving_cert(
        &node.dir.join("hub-tls"),
        &[
            "cmpoll-hub.cmpoll.svc",
            "cmpoll-hub.cmpoll.svc.cluster.local",
        ],
    );
    node.tls_secret("cmpoll", "cmpoll-hub-tls", &crt, &key);
    let ca = format!("--from-file=ca.crt={}", ca.display());
    node.kubectl(&["-n", "cmpoll", "create", "configmap", "cmpoll-hub-ca", &ca]);
    let examples = super::root().join("k8s/examples");
    node.kubectl(&["apply", "-f", examples.to_str().unwrap()]);
    // Were links on, the kubelet would give each hub CMPOLL_INTERVAL_SERVICE_HOST, …
    node.apply(COLLIDING_SERVICE);
    let chart = super::root().join("charts/cmpoll");
    // The hubs answer Alloy's remotecfg too (remotecfg.rs): the root and arguments as a
    // user gives them, files through --set-file.
    let root_file = node.dir.join("remotecfg-root.alloy");
    std::fs::write(&root_file, super::remotecfg::ROOT).unwrap();
    let arguments_file = node.dir.join("remotecfg-arguments");
    std::fs::write(&arguments_file, super::remotecfg::ARGUMENTS).unwrap();
    let root_set = format!("hub.remotecfg.root={}", root_file.display());
    let arguments_set = format!("hub.remotecfg.arguments={}", arguments_file.display());
    let args = [
        "install",
        "cmpoll",
        chart.to_str().unwrap(),
        "-n",
        "cmpoll",
        "--set",
        &format!("hub.tokenExpirationSeconds={TOKEN_LIFETIME}"),
        "--set-file",
        &root_set,
        "--set-file",
        &arguments_set,
        "--set",
        "hub.remotecfg.collectors[0].namespace=cmpoll,hub.remotecfg.collectors[0].name=alloy-collector",
        "--wait",
        "--timeout",
        "3m",
    ];
    node.helm_ok(&args, "helm install --wait");
    let pods = node.pods("cmpoll", "app.kubernetes.io/name=cmpoll-hub");
    assert_eq!(pods.len(), 2, "the chart's two hubs");
    let ips: Vec<String> = (pods.iter())
        .map(|p| p["status"]["podIP"].as_str().unwrap().to_string())
        .collect();
    for p in &pods {
        let ready = (p["status"]["conditions"].as_array().unwrap().iter())
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "{p}");
        assert_eq!(
            p["status"]["containerStatuses"][0]["restartCount"], 0,
            "{p}"
        );
    }
    // Ready by the kubelet's own HTTPS probe: the Service's endpoints are exactly the hubs.
    eventually(
        "both hubs in the EndpointSlice, ready",
        Duration::from_secs(30),
        || {
            let ready = node.ready_addresses("cmpoll", "cmpoll-hub");
            let mut want = ips.clone();
            want.sort();
            if ready == want {
                Ok(())
            } else {
                Err(format!("{ready:?} ≠ {want:?}"))
            }
        },
    );
    (pods.iter())
        .map(|p| {
            let name = p["metadata"]["name"].as_str().unwrap().to_string();
            let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
            let pid =
                serve_pid(&name).unwrap_or_else(|| panic!("no `cmpoll serve` of {name} here"));
            Hub { name, uid, pid }
        })
        .collect()
}

/// The lifetime the hubs' and followers' tokens ask: the least the apiserver allows.
pub const TOKEN_LIFETIME: i64 = 600;

const COLLIDING_SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: cmpoll-interval, namespace: cmpoll}
spec:
  selector: {app: nothing}
  ports: [{name: http, port: 80}]
";

/// The pid of pod `name`'s `cmpoll serve` (its HOSTNAME is the pod's name).
fn serve_pid(name: &str) -> Option<u32> {
    let host = format!("HOSTNAME={name}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        let serve = cmdline.split(|b| *b == 0).nth(1) == Some(b"serve");
        let ours = environ.split(|b| *b == 0).any(|v| v == host.as_bytes());
        (serve && ours).then_some(pid)
    })
}

/// `/proc/PID/status`'s line `key`, its value.
fn status(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    (text.lines())
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{key} not in /proc/{pid}/status"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The chart's securityContext as runc applied it: uid and gid 65532, fsGroup in the
/// groups, no capability at all, no_new_privs, the RuntimeDefault seccomp filter, a
/// read-only root; in the kubelet's cgroups; no Service link in the environment, and no
/// warning about one in the log.
pub fn the_process_is_as_runc_started_it(node: &Node, hubs: &[Hub]) {
    for hub in hubs {
        let pid = hub.pid;
        assert_eq!(
            status(pid, "Uid"),
            "65532 65532 65532 65532",
            "{}",
            hub.name
        );
        assert_eq!(
            status(pid, "Gid"),
            "65532 65532 65532 65532",
            "{}",
            hub.name
        );
        assert!(
            status(pid, "Groups").split(' ').any(|g| g == "65532"),
            "fsGroup"
        );
        for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                status(pid, cap),
                "0000000000000000",
                "{cap} of {}",
                hub.name
            );
        }
        assert_eq!(status(pid, "NoNewPrivs"), "1");
        assert_eq!(status(pid, "Seccomp"), "2", "RuntimeDefault: a filter");
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
        let root = mounts
            .lines()
            .find(|l| l.split(' ').nth(4) == Some("/"))
            .unwrap();
        assert!(
            root.split(' ')
                .nth(5)
                .unwrap()
                .split(',')
                .any(|o| o == "ro"),
            "{root}"
        );
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert!(
            cgroup.contains(&format!("/kubepods/burstable/pod{}/", hub.uid)),
            "{cgroup}"
        );
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let links: Vec<String> = (environ.split(|b| *b == 0))
            .map(|v| String::from_utf8_lossy(v).to_string())
            .filter(|v| {
                v.starts_with("CMPOLL_HUB_")
                    || v.starts_with("CMPOLL_INTERVAL_")
                    || v.starts_with("CMPOLL_METRICS_")
            })
            .collect();
        assert!(links.is_empty(), "enableServiceLinks: false, yet {links:?}");
        let log = node.kubectl(&["-n", "cmpoll", "logs", &hub.name]);
        assert!(log.contains("serving"), "{log}");
        assert!(!log.contains("names no flag"), "{log}");
    }
}

/// The kubelet's projected volume: `..data` a link to a timestamped folder, `token` a link
/// through it, group-readable by fsGroup; the token the apiserver issued for this pod of
/// this service account, for the lifetime the chart was given (not stretched: one that
/// rotates).
pub fn the_projected_token_is_the_kubelets(node: &Node, hubs: &[Hub]) {
    use std::os::unix::fs::MetadataExt as _;
    for hub in hubs {
        let volume = node
            .pod_dir(&hub.uid)
            .join("volumes/kubernetes.io~projected/hub-token");
        let data = std::fs::read_link(volume.join("..data")).unwrap();
        assert!(data.to_str().unwrap().starts_with("..20"), "{data:?}");
        assert_eq!(
            std::fs::read_link(volume.join("token")).unwrap(),
            Path::new("..data/token")
        );
        let meta = std::fs::metadata(volume.join("token")).unwrap();
        assert_eq!(meta.gid(), 65532, "fsGroup owns it");
        assert_eq!(
            meta.mode() & 0o077,
            0o040,
            "readable by its group, no one else: {:o}",
            meta.mode()
        );
        let token = std::fs::read_to_string(volume.join("token")).unwrap();
        let c = claims(token.trim());
        assert_eq!(c["sub"], "system:serviceaccount:cmpoll:cmpoll-hub", "{c}");
        assert_eq!(c["kubernetes.io"]["pod"]["name"], hub.name.as_str(), "{c}");
        assert_eq!(c["kubernetes.io"]["pod"]["uid"], hub.uid.as_str(), "{c}");
        let lifetime = c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap();
        assert_eq!(
            lifetime, TOKEN_LIFETIME,
            "the chart's tokenExpirationSeconds, not stretched: {c}"
        );
    }
}
