//! k8s/alloy-remotecfg on the real node: Grafana Alloy as a DaemonSet whose local file
//! holds only a `remotecfg` block, its token projected and bound to its pod, asking the
//! chart's hubs (installed with `hub.remotecfg.root`, `arguments` and `collectors`: the
//! root in the chart's ConfigMap, the collectors' rules) for its configuration; it runs
//! the root and k8s/examples' Alloy module, each module in its own declare.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::{Node, eventually, in_ci, root};

/// The root the chart is given (remote content: no logging or service blocks).
pub const ROOT: &str = "prometheus.remote_write \"default\" {
  endpoint {
    url = \"https://prometheus.example.com/api/v1/write\"
  }
}
";

/// What the root offers every module.
pub const ARGUMENTS: &str = "receiver = prometheus.remote_write.default.receiver\n";

/// The DaemonSet's pods.
const LABEL: &str = "app.kubernetes.io/name=alloy-collector";

/// k8s/examples' `monitoring/payments-scrape`, as Alloy's remotecfg names its instance.
const MODULE: &str = "monitoring_S_payments_scrape.module";

pub fn alloy_with_only_a_remotecfg_block_runs_the_hubs_modules(node: &Node) {
    if !root().join("tests/alloy/bin/alloy").exists() {
        assert!(!in_ci(), "tests/alloy/bin/alloy is needed and CI=true");
        eprintln!("SKIPPED: k8s/alloy-remotecfg (no tests/alloy/bin/alloy: tests/alloy/build.sh)");
        return;
    }
    node.kubectl(&[
        "apply",
        "-k",
        root().join("k8s/alloy-remotecfg").to_str().unwrap(),
    ]);
    let ip = eventually(
        "the collector's pod Ready",
        Duration::from_secs(180),
        || {
            let pods = node.pods("cmpoll", LABEL);
            let status = (pods.first())
                .map(|p| p["status"].clone())
                .unwrap_or_default();
            let ready = (status["conditions"].as_array().into_iter().flatten())
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            match (ready, status["podIP"].as_str()) {
                (true, Some(ip)) => Ok(ip.to_string()),
                _ => Err(format!("{status}")),
            }
        },
    );
    let components = eventually(
        "Alloy to run the hub's root and module",
        Duration::from_secs(120),
        || {
            let c = remote_components(&ip)?;
            let healthy = |id: &str| c.iter().any(|(i, h)| i == id && h == "healthy");
            if healthy("prometheus.remote_write.default") && healthy(MODULE) {
                Ok(c)
            } else {
                Err(format!("{c:?}"))
            }
        },
    );
    eprintln!("k8s/alloy-remotecfg: Alloy runs {components:?}");
    let pods = node.pods("cmpoll", LABEL);
    assert_eq!(pods.len(), 1, "one node, one pod");
    for c in pods[0]["status"]["containerStatuses"].as_array().unwrap() {
        assert_eq!(c["restartCount"], 0, "{c}");
    }
    node.kubectl(&[
        "delete",
        "-k",
        root().join("k8s/alloy-remotecfg").to_str().unwrap(),
    ]);
}

/// Alloy's remote components (its API on the pod's IP): localID and health.
fn remote_components(ip: &str) -> Result<Vec<(String, String)>, String> {
    let out = Command::new("curl")
        .args(["-s", "-m", "5", "-w", "\n%{http_code}"])
        .arg(format!("http://{ip}:12345/api/v0/web/remotecfg/components"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let Some((body, "200")) = text.rsplit_once('\n') else {
        return Err(format!("Alloy at {ip}: {out:?}"));
    };
    let all: Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
    Ok((all.as_array().into_iter().flatten())
        .map(|c| {
            let id = c["localID"].as_str().unwrap_or_default().to_string();
            (id, c["health"]["state"].as_str().unwrap_or_default().into())
        })
        .collect())
}
