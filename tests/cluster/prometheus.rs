//! The primary shape, `kubectl apply -k k8s/`, on the real node: cmpoll beside Prometheus
//! (its image Debian's Prometheus), the init container's `cmpoll run --once` before
//! Prometheus starts, both Ready under the kubelet's probes; Prometheus serves the rule
//! module cmpoll wrote.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::{Node, eventually, root};

pub fn the_primary_shape_serves_the_rules(node: &Node) {
    // k8s/serve-alloy's DaemonSet goes first: its pods carry the label this Deployment
    // selects by.
    super::shapes::replace_the_shape(node);
    node.kubectl(&["apply", "-k", root().join("k8s").to_str().unwrap()]);
    node.kubectl(&[
        "-n",
        "cmpoll",
        "rollout",
        "status",
        "deployment/cmpoll",
        "--timeout=180s",
    ]);
    let pods = node.pods("cmpoll", "app.kubernetes.io/name=cmpoll");
    assert_eq!(pods.len(), 1, "{pods:?}");
    let pod = &pods[0];
    for c in pod["status"]["containerStatuses"].as_array().unwrap() {
        assert_eq!(c["ready"], true, "{c}");
        assert_eq!(c["restartCount"], 0, "{c}");
    }
    let init = &pod["status"]["initContainerStatuses"];
    assert!(
        (init.as_array().unwrap().iter()).all(|c| c["state"]["terminated"]["exitCode"] == 0),
        "{init}"
    );
    let ip = pod["status"]["podIP"].as_str().unwrap().to_string();
    eventually(
        "Prometheus to serve the payments rules",
        Duration::from_secs(60),
        || {
            let out = Command::new("curl")
                .args(["-s", "-m", "5"])
                .arg(format!("http://{ip}:9090/api/v1/rules"))
                .output()
                .unwrap();
            let body = String::from_utf8_lossy(&out.stdout).to_string();
            let groups: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
            let names: Vec<&str> = (groups["data"]["groups"].as_array().into_iter().flatten())
                .filter_map(|g| g["name"].as_str())
                .collect();
            if names.contains(&"payments") {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        },
    );
}
