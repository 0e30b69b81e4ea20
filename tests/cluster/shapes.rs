//! The other `kubectl apply -k` shapes of k8s/ on the real node, each as a user applies it
//! (they share the namespace `cmpoll` and the Deployment `cmpoll`: one replaces the other,
//! as a user switching shapes would): every pod Ready under the kubelet's probes, its init
//! containers done, nothing restarted; k8s/serve, the chart's hubs as plain manifests, in
//! their place at the end, a follower listing through it by its DNS name.

use std::time::Duration;

use serde_json::Value;

use super::{Node, eventually, root};

/// The pods of the shapes that run cmpoll beside an agent.
const LABEL: &str = "app.kubernetes.io/name=cmpoll";

/// Their service account, as the apiserver names its user.
const ACCOUNT: &str = "system:serviceaccount:cmpoll:cmpoll";

/// Grafana Alloy (alone and clustered) and Prometheus (one namespace; Secrets): each
/// shape's Deployment `cmpoll` Ready, in place of the one before; then a tenant's Alloy.
pub fn each_comes_up_ready(node: &Node) {
    for (shape, replicas) in [
        ("k8s/alloy", 1),
        ("k8s/alloy-clustered", 2),
        ("k8s/prometheus-namespaced", 1),
        ("k8s/prometheus-secrets", 1),
    ] {
        replace_the_shape(node);
        node.kubectl(&["apply", "-k", root().join(shape).to_str().unwrap()]);
        let pods = ready(
            node,
            ("cmpoll", "deployment/cmpoll"),
            LABEL,
            replicas,
            shape,
        );
        eprintln!("{shape}: {} pods Ready", pods.len());
        if shape.starts_with("k8s/prometheus-") {
            // Ready on its Role alone: nothing grants it more than its namespace.
            let can = [
                "auth",
                "can-i",
                "list",
                "configmaps",
                "-A",
                &format!("--as={ACCOUNT}"),
            ];
            let anywhere = node.try_kubectl(&can, None);
            assert!(anywhere.is_err(), "{shape}: {anywhere:?}");
            let here = [
                "auth",
                "can-i",
                "list",
                "configmaps",
                "-n",
                "cmpoll",
                &format!("--as={ACCOUNT}"),
            ];
            if shape.ends_with("-namespaced") {
                node.try_kubectl(&here, None)
                    .unwrap_or_else(|e| panic!("{shape}: {e}"));
            }
        }
    }
    // A tenant's Alloy (k8s/alloy-tenants/team-a: k8s/alloy in a namespace of its own,
    // every name suffixed): beside the others, not in their place.
    let tenant = root().join("k8s/alloy-tenants/team-a");
    node.kubectl(&["apply", "-k", tenant.to_str().unwrap()]);
    let at = ("cmpoll-team-a", "deployment/cmpoll-team-a");
    ready(node, at, LABEL, 1, "k8s/alloy-tenants/team-a");
    eprintln!("k8s/alloy-tenants/team-a: Ready");
}

/// The shape before gone — its Deployment or DaemonSet `cmpoll` with its pods, and the
/// roles it granted — so that the next shape runs on what it makes itself.
pub fn replace_the_shape(node: &Node) {
    node.kubectl(&[
        "-n",
        "cmpoll",
        "delete",
        "deployment,daemonset,role,rolebinding",
        "cmpoll",
        "--ignore-not-found",
        "--cascade=foreground",
        "--wait",
        "--timeout=120s",
    ]);
    // The cluster-wide grant of the shapes before: a namespaced one must do without it.
    node.kubectl(&[
        "delete",
        "clusterrole,clusterrolebinding",
        "cmpoll",
        "--ignore-not-found",
        "--timeout=60s",
    ]);
}

/// `path` of the repository as kustomize takes it from the overlay folder `overlay`:
/// relative (up to / and down).
pub fn relative(overlay: &std::path::Path, path: &str) -> String {
    let up = "../".repeat(overlay.components().count() - 1);
    let path = root().join(path).display().to_string();
    format!("{up}{}", path.trim_start_matches('/'))
}

/// The rollout of `workload` (in `cmpoll`) done, or a failure with the namespace's pods.
pub fn ready_rollout(node: &Node, workload: &str, shape: &str) {
    ready_rollout_in(node, "cmpoll", workload, shape);
}

fn ready_rollout_in(node: &Node, ns: &str, workload: &str, shape: &str) {
    let rollout = ["-n", ns, "rollout", "status", workload, "--timeout=180s"];
    if let Err(e) = node.try_kubectl(&rollout, None) {
        let pods = node.try_kubectl(&["-n", ns, "get", "pods,events", "-o", "wide"], None);
        panic!("{shape}: {e}\n{pods:?}");
    }
}

/// The rollout of `workload` in `ns` done and its `replicas` pods (`selector`) Ready,
/// their containers never restarted, their init containers done: the pods.
fn ready(
    node: &Node,
    at: (&str, &str),
    selector: &str,
    replicas: usize,
    shape: &str,
) -> Vec<Value> {
    let (ns, workload) = at;
    ready_rollout_in(node, ns, workload, shape);
    let pods = eventually("the old pods gone", Duration::from_secs(60), || match node
        .pods(ns, selector)
    {
        p if p.len() == replicas => Ok(p),
        p => Err(format!("{} pods", p.len())),
    });
    for pod in &pods {
        let ready = (pod["status"]["conditions"].as_array().unwrap().iter())
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "{shape}: {pod}");
        for c in pod["status"]["containerStatuses"].as_array().unwrap() {
            assert_eq!(c["ready"], true, "{shape}: {c}");
            assert_eq!(c["restartCount"], 0, "{shape}: {c}");
        }
        let init = pod["status"]["initContainerStatuses"].as_array();
        for c in init.into_iter().flatten() {
            assert_eq!(c["state"]["terminated"]["exitCode"], 0, "{shape}: {c}");
        }
    }
    pods
}

/// k8s/serve in the chart's place (`helm uninstall` first: the two make the same objects):
/// its two hubs Ready by their probes, a follower listing through them.
pub fn serve_serves_a_follower(node: &Node) {
    node.helm_ok(
        &["uninstall", "cmpoll", "-n", "cmpoll", "--wait"],
        "helm uninstall",
    );
    node.kubectl(&["apply", "-k", root().join("k8s/serve").to_str().unwrap()]);
    let hub = "app.kubernetes.io/name=cmpoll-hub";
    ready(
        node,
        ("cmpoll", "deployment/cmpoll-hub"),
        hub,
        2,
        "k8s/serve",
    );
    let follower = [
        "-n",
        "cmpoll",
        "delete",
        "pod",
        "follower",
        "--wait",
        "--timeout=120s",
    ];
    node.kubectl(&follower);
    super::follower::lists_through_the_service(node);
}
