//! The fleet as one unit with the real Alloy (issue 59, "Done when"): a hub under
//! `--validate` and `--report-events` on the real apiserver, two `cmpoll run` followers in
//! pods (bound tokens: the hub names them by their pods) — one the real Alloy under
//! `--confirm`, as k8s/alloy ships it, one plain. A version the hub's validator passes but
//! Alloy cannot build goes back to its last good version on that follower alone; the
//! follower reports it; `cmpoll status --fleet` names the follower and Alloy's words within
//! the follower's interval, and the author reads one Event for the version from the hub,
//! with its counts, not one per follower.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::fleet::{pod_token, status_fleet};
use super::hub::*;
use super::*;
use crate::alloy_modules::{
    alloy_bin, alloy_on, receiver, root_config, scrape_module, shipped_args, unbuildable,
};
use crate::util::{Cmpoll, Daemon, SOON, eventually_explained, root, tools::free_port};

/// The hub's validator: refuses a module that says BAD (Alloy's own checks are the
/// followers').
const VALIDATOR: &str = "if grep -q BAD module.alloy; then echo 'says BAD'; exit 3; fi";

/// The follower's interval: the fleet must show a refusal within it.
const INTERVAL: Duration = Duration::from_secs(30);

fn watch_rules() -> Value {
    json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get", "watch"]}])
}

/// The Events cmpoll wrote about `name` in `ns`.
fn events_on(k: &test_apiserver::real::RealApiserver, ns: &str, name: &str) -> Vec<Value> {
    let out = k.ok(&["get", "events", "-n", ns, "-o", "json"]);
    let all: Value = serde_json::from_str(&out).unwrap();
    (all["items"].as_array().unwrap().iter())
        .filter(|e| e["involvedObject"]["name"] == name)
        .filter(|e| {
            e["source"]["component"] == "cmpoll.io/cmpoll"
                || e["reportingController"] == "cmpoll.io/cmpoll"
        })
        .cloned()
        .collect()
}

#[test]
fn a_version_alloy_refuses_is_told_once_for_the_whole_fleet() {
    let Some(alloy) = alloy_bin() else { return };
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-fleet-alloy");
    let alloy_port = free_port();
    let put = |text: &str| {
        k.apply(
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "team", "namespace": ns, "labels": {"cmpoll.io/module": "true"}},
                // A key the Alloy follower does not select (--keys '*.alloy'): its hash
                // is not the hub's, the version it holds is told by its resourceVersion.
                "data": {"module.alloy": text, "notes.txt": "owned by team"}})
            .to_string(),
        );
    };
    put(&scrape_module("team", alloy_port, ""));
    hub_may_record_events(k, &ns, "hub");
    let hub = start_hub(
        k,
        &hub_account(k, &ns, "hub"),
        &[
            "--namespace",
            &ns,
            "--interval",
            "1s",
            "--validate",
            VALIDATOR,
            "--report-events",
            "--drain-window",
            "0s",
        ],
    );
    let _ = account(k, &ns, "agent", Some(watch_rules()));
    let c = Cmpoll::new();
    let scraper = c.write("scraper-token", &scraper(k, &ns));

    // node-7: the real Alloy under --confirm, as k8s/alloy ships it.
    let a = Cmpoll::new();
    let out = a.out();
    let logs = a.path("logs");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&logs).unwrap();
    let prometheus_port = free_port();
    let _prometheus = receiver(&logs.join("prometheus"), prometheus_port);
    let root_file = root_config(&out, prometheus_port);
    let _alloy = alloy_on(&alloy, &out, alloy_port, &logs, "alloy");
    let k8s = root().join("k8s/alloy");
    let kubeconfig = hub_kubeconfig(&a, &hub, &pod_token(k, &ns, "agent", "node-7"), "a.kc");
    let mut args = shipped_args(&out);
    let interval = format!("{}s", INTERVAL.as_secs());
    args.extend(
        [
            "--validate",
            k8s.join("check-module.sh").to_str().unwrap(),
            "--confirm",
            k8s.join("confirm-modules.sh").to_str().unwrap(),
            "--stdout-events",
            "--namespace",
            &ns,
            "--interval",
            &interval,
        ]
        .map(str::to_string),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    eventually_explained(
        "Alloy is ready",
        SOON,
        || {
            crate::util::tools::curl(&format!("http://127.0.0.1:{alloy_port}/-/ready"))
                .is_some_and(|(code, _)| code == 200)
        },
        || std::fs::read_to_string(logs.join("alloy.log")).unwrap_or_default(),
    );
    let with_alloy = Daemon::start(
        a.env("KUBECONFIG", kubeconfig.to_str().unwrap())
            .env("ALLOY", alloy.to_str().unwrap())
            .env("ALLOY_ROOT", root_file.to_str().unwrap())
            .env("ALLOY_URL", &format!("http://127.0.0.1:{alloy_port}"))
            .env("ALLOY_WAIT", "5"),
        &args,
    );
    // node-8: a plain follower.
    let b = Cmpoll::new();
    let kubeconfig = hub_kubeconfig(&b, &hub, &pod_token(k, &ns, "agent", "node-8"), "b.kc");
    let plain = Daemon::start(
        b.env("KUBECONFIG", kubeconfig.to_str().unwrap()),
        &["--namespace", &ns, "--interval", &interval],
    );
    for d in [&with_alloy, &plain] {
        let first = d.batch(Duration::from_secs(60));
        assert_eq!(first[0]["type"], "added", "{first:?}");
    }
    let fleet = || {
        let run = status_fleet(&c, &hub, &scraper, true);
        serde_json::from_str::<Value>(&run.stdout).unwrap_or(Value::Null)
    };
    eventually_explained(
        "both followers hold the module",
        SOON,
        || fleet()["objects"][0]["counts"]["current"] == 2,
        || format!("{}\n{}", fleet(), with_alloy.stderr()),
    );

    // A version the hub passes and Alloy cannot build.
    put(&unbuildable("team", alloy_port));
    let written = Instant::now();
    let updated = plain.batch(SOON);
    assert_eq!(updated[0]["type"], "updated", "the plain follower takes it");
    eventually_explained(
        "the fleet shows node-7's refusal with Alloy's words",
        INTERVAL,
        || {
            let f = fleet();
            let o = &f["objects"][0];
            o["counts"]["refused"] == 1
                && o["counts"]["current"] == 1
                && o["refused"][0]["follower"] == format!("{ns}/node-7").as_str()
                && o["refused"][0]["by"] == "confirm"
                && (o["refused"][0]["reason"].as_str())
                    .is_some_and(|r| r.contains("scrape_timeout"))
        },
        || format!("{}\n{}", fleet(), with_alloy.stderr()),
    );
    eprintln!(
        "written to shown on status --fleet: {:?}",
        written.elapsed()
    );
    let table = status_fleet(&c, &hub, &scraper, false);
    assert_eq!(
        table.code,
        Some(1),
        "a refusal: exit 1\n{}",
        table.described
    );
    assert!(
        table.stdout.contains("node-7") && table.stdout.contains("1 refused"),
        "{}",
        table.stdout
    );
    eprintln!("{}", table.stdout);

    // One Event for the version, from the hub, with the fleet's counts.
    eventually_explained(
        "the hub's Event for the refused version",
        SOON,
        || events_on(k, &ns, "team").len() == 1,
        || format!("{:?}\n{}", events_on(k, &ns, "team"), hub.d.stderr()),
    );
    let e = &events_on(k, &ns, "team")[0];
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "refused by 1 of 2 followers: {ns}/node-7 (confirm): "
        )) && message.contains("scrape_timeout")
            && message.ends_with("; 1 hold it"),
        "{message}"
    );
    assert_eq!((&e["count"], &e["type"]), (&json!(1), &json!("Warning")));
    eprintln!("{}", k.ok(&["get", "events", "-n", &ns]));
    with_alloy.stop();
    plain.stop();
    hub.d.stop();
}
