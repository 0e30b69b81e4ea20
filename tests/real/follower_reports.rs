//! Issue 59, the follower's side against the real hub on the real apiserver: a `cmpoll run`
//! following a hub reports what it holds on its own (no flag), and the hub's fleet shows
//! it — the version it holds, then its `--validate` refusal of the next one with the
//! validator's words. (The scripted hub of `tests/follow.rs` pins when reports go.)

use std::time::Duration;

use serde_json::{Value, json};

use super::hub::*;
use super::*;
use crate::util::{Cmpoll, Daemon, spec_hash};

/// The hub's fleet (`cmpoll status --fleet --json`), whatever its exit code.
fn fleet(hub: &Hub, scraper: &std::path::Path) -> Value {
    let url = hub.url();
    let run = Cmpoll::new()
        .with_args(&[
            "status",
            "--server-url",
            &url,
            "--fleet",
            "--json",
            "--token-file",
            scraper.to_str().unwrap(),
            "--ca-file",
            hub.ca.to_str().unwrap(),
        ])
        .run();
    serde_json::from_str(&run.stdout).unwrap_or(Value::Null)
}

#[test]
fn a_follower_tells_the_real_hub_what_it_holds_and_what_it_refused() {
    let Some((_guard, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-reporting");
    put_module(k, &ns, "m", "k.yaml", "one");
    let hub = start_hub(
        k,
        &hub_account(k, &ns, "hub"),
        &["--namespace", &ns, "--interval", "1s"],
    );
    let rules = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get", "watch"]}]);
    let token = follower(k, &ns, "agent", rules, false);
    let c = Cmpoll::new();
    let scraper = c.write("scraper-token", &scraper(k, &ns));
    let kubeconfig = hub_kubeconfig(&c, &hub, &token, "hub.kubeconfig");
    let listen = format!("127.0.0.1:{}", crate::util::tools::free_port());
    let d = Daemon::start(
        c.env("KUBECONFIG", kubeconfig.to_str().unwrap()),
        &[
            "--namespace",
            &ns,
            "--interval",
            "1s",
            "--listen",
            &listen,
            "--validate",
            "! grep -rq reject-me .",
        ],
    );
    assert!(d.batch(Duration::from_secs(30)).len() >= 2);
    let object = |f: &Value| -> Value {
        (f["objects"].as_array().into_iter().flatten())
            .find(|o| o["name"] == "m")
            .cloned()
            .unwrap_or(Value::Null)
    };
    let one = spec_hash(&[("k.yaml", b"one")]);
    let mut seen = Value::Null;
    crate::util::eventually_explained(
        "the hub shows the follower holding what it serves",
        Duration::from_secs(30),
        || {
            seen = fleet(&hub, &scraper);
            let o = object(&seen);
            o["served"] == one.as_str() && o["counts"]["current"] == 1
        },
        || format!("{}\n{}", d.stderr(), hub.d.stderr()),
    );
    put_module(k, &ns, "m", "k.yaml", "reject-me");
    let refused = spec_hash(&[("k.yaml", b"reject-me")]);
    crate::util::eventually_explained(
        "the hub shows the follower's refusal of what it serves now",
        Duration::from_secs(30),
        || {
            seen = fleet(&hub, &scraper);
            let o = object(&seen);
            o["served"] == refused.as_str() && o["counts"]["refused"] == 1
        },
        || {
            format!(
                "{}\n{}\n{}",
                fleet(&hub, &scraper),
                d.stderr(),
                hub.d.stderr()
            )
        },
    );
    let o = object(&seen);
    let r = &o["refused"][0];
    assert_eq!(r["by"], "validate", "{o}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap_or("")
            .contains("exited with status 1"),
        "{o}"
    );
    let (_, metrics) = crate::util::http::get(&listen, "/metrics");
    assert!(
        metric_sum(&metrics, "cmpoll_hub_reports_total", &[("result", "ok")]) >= 2.0,
        "{metrics}"
    );
    assert_eq!(
        metric_sum(&metrics, "cmpoll_hub_reports_total", &[("result", "error")]),
        0.0,
        "{metrics}\n{}",
        d.stderr()
    );
    d.stop();
}
