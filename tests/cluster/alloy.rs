//! k8s/serve-alloy on the real node: Grafana Alloy as a DaemonSet (its image built around
//! tests/alloy's binary), each pod's cmpoll following the chart's hubs, init containers
//! copying out of Alloy's image, the two sharing an emptyDir; Alloy runs the module it got
//! through a hub, then its update, and drops it when the ConfigMap is deleted.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::{Node, eventually, in_ci, root};

/// The DaemonSet's pods.
const LABEL: &str = "app.kubernetes.io/name=cmpoll";

/// The scrape of k8s/examples' `monitoring/payments-scrape`, as Alloy names it.
const SCRAPE: &str = "monitoring_S_payments_scrape.module%2Fprometheus.scrape.payments";

pub fn serve_alloy_runs_what_the_hub_serves(node: &Node) {
    if !root().join("tests/alloy/bin/alloy").exists() {
        assert!(!in_ci(), "tests/alloy/bin/alloy is needed and CI=true");
        eprintln!("SKIPPED: k8s/serve-alloy (no tests/alloy/bin/alloy: tests/alloy/build.sh)");
        return;
    }
    // As a user applies it: the hub by its name, through cluster DNS.
    node.kubectl(&[
        "apply",
        "-k",
        root().join("k8s/serve-alloy").to_str().unwrap(),
    ]);
    let ip = eventually(
        "the DaemonSet's pod Ready",
        Duration::from_secs(180),
        || {
            let ds = node.json(&["-n", "cmpoll", "get", "daemonset", "cmpoll"]);
            let ready = ds["status"]["numberReady"].as_i64().unwrap_or(0);
            let pods = node.pods("cmpoll", LABEL);
            let status = pods
                .first()
                .map(|p| p["status"].clone())
                .unwrap_or_default();
            let ip = status["podIP"].as_str().map(str::to_string);
            match (ready, ip) {
                (1, Some(ip)) => Ok(ip),
                _ => Err(format!("{status}")),
            }
        },
    );
    let scrape = || component(&ip, SCRAPE);
    let running = eventually(
        "Alloy to run the module",
        Duration::from_secs(120),
        || match scrape() {
            Ok(Some(c)) if c["health"]["state"] == "healthy" => Ok(c),
            other => Err(format!("{other:?}")),
        },
    );
    assert!(
        running.to_string().contains("\"payments-api\""),
        "the job: {running}"
    );

    let updated = CHANGED_SCRAPE.replace("payments-api\"", "payments-api-v2\"");
    assert_ne!(updated, CHANGED_SCRAPE);
    node.apply(&updated);
    eventually(
        "the update to reach Alloy",
        Duration::from_secs(120),
        || match scrape() {
            Ok(Some(c))
                if c.to_string().contains("payments-api-v2")
                    && c["health"]["state"] == "healthy" =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        },
    );
    node.kubectl(&["-n", "monitoring", "delete", "configmap", "payments-scrape"]);
    eventually(
        "the delete to reach Alloy",
        Duration::from_secs(120),
        || match scrape() {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    // Gone for good, from an Alloy that still runs: a poll later (the follower's interval
    // is 60 s, but it watches its hub) it is still gone and Alloy is ready.
    std::thread::sleep(Duration::from_secs(3));
    assert!(matches!(scrape(), Ok(None)), "{:?}", scrape());
    let ready = Command::new("curl")
        .args(["-sf", "-m", "5"])
        .arg(format!("http://{ip}:12345/-/ready"))
        .output()
        .unwrap();
    assert!(
        ready.status.success(),
        "Alloy ready after the delete: {ready:?}"
    );
    let pods = node.pods("cmpoll", LABEL);
    assert_eq!(pods.len(), 1, "one node, one pod");
    for c in pods[0]["status"]["containerStatuses"].as_array().unwrap() {
        assert_eq!(c["restartCount"], 0, "{c}");
    }
}

/// k8s/examples' module with another job name put in by the caller.
const CHANGED_SCRAPE: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: payments-scrape
  namespace: monitoring
  labels: {cmpoll.io/module: 'true'}
data:
  scrape.alloy: |
    argument \"receiver\" { }

    prometheus.scrape \"payments\" {
      targets         = [{\"__address__\" = \"payments-api.payments.svc:8080\", \"job\" = \"payments-api\"}]
      scrape_interval = \"30s\"
      forward_to      = [argument.receiver.value]
    }
";

/// Alloy's view of one component (its API on the pod's IP): `None` when Alloy answers that
/// it has none (404), an error when Alloy does not answer.
fn component(ip: &str, id: &str) -> Result<Option<Value>, String> {
    let out = Command::new("curl")
        .args(["-s", "-m", "5", "-w", "\n%{http_code}"])
        .arg(format!("http://{ip}:12345/api/v0/web/components/{id}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    match text.rsplit_once('\n') {
        Some((body, "200")) => Ok(Some(serde_json::from_str(body).map_err(|e| e.to_string())?)),
        Some((_, "404")) => Ok(None),
        _ => Err(format!("Alloy at {ip}: {out:?}")),
    }
}
