//! Alloy's `remotecfg` and a rollout (issue 61): five real Alloys with only a `remotecfg`
//! block, each with a token bound to its own pod, follow a hub under `--remotecfg` and
//! `--rollout 1%,100%`. A version Alloy cannot build reaches the first step (the collector
//! of the lowest cohort) alone: its `FAILED` refuses the version for the fleet (`/status`'s
//! rollout, `cmpoll status --fleet`, an Event on the object), and the other four never get
//! it (none of them fails); a later good version reaches all five, step by step.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::fleet::{pod_token, status_fleet};
use super::hub::*;
use super::remotecfg::{Collector, POLL, collector_account, module_cm, platform_root};
use super::rollout::state_role;
use super::*;
use crate::alloy_modules::{alloy_bin, scrape_module, unbuildable};
use crate::util::{Cmpoll, SOON, eventually_explained, tools::free_port};

/// The rollout's wait between steps: longer than a poll, so that a step's collectors have
/// asked before it may advance.
const WAIT: Duration = Duration::from_secs(15);

/// The state Secret.
const STATE: &str = "cmpoll-rollouts";

/// The contract's cohort of a client named `name`.
fn cohort(name: &str) -> f64 {
    let digest = Sha256::digest(name.as_bytes());
    let first = u64::from_be_bytes(digest[..8].try_into().unwrap());
    first as f64 / 2f64.powi(64)
}

#[test]
fn a_version_alloy_refuses_by_remotecfg_reaches_only_the_first_step() {
    let Some(alloy) = alloy_bin() else { return };
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-remotecfg-rollout");
    state_role(k, &ns, STATE, "hub");
    // The Events of --report-events, where the objects are.
    let _ = account(
        k,
        &ns,
        "hub",
        Some(json!([{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}])),
    );
    let hub_token = hub_account(k, &ns, "hub");
    // The root in a ConfigMap (`--remotecfg configmap:NS/NAME`): the file's text and
    // offered arguments as its keys.
    let platform = Cmpoll::new();
    let (root, offered) = platform_root(&platform);
    let root_text = std::fs::read_to_string(&root).unwrap();
    let put_root = |text: &str| {
        k.apply(
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "alloy-root", "namespace": ns},
                "data": {"root.alloy": text, "arguments": std::fs::read_to_string(&offered).unwrap()}})
            .to_string(),
        );
    };
    put_root(&root_text);
    let root_at = format!("configmap:{ns}/alloy-root");
    let port = free_port();
    // Module `web`, its scrape component named `job`.
    let module =
        |job: &str| scrape_module("web", port, "").replace("\"default\"", &format!("\"{job}\""));
    let put = |text: &str| {
        k.apply(&module_cm(&ns, "web", text).to_string());
        Instant::now()
    };
    put(&module("v1"));
    let state = format!("{ns}/{STATE}");
    let wait = format!("{}s", WAIT.as_secs());
    let hub = start_hub(
        k,
        &hub_token,
        &[
            "--namespace",
            &ns,
            "--interval",
            "1s",
            "--drain-window",
            "0s",
            "--remotecfg",
            &root_at,
            "--rollout",
            "1%,100%",
            "--rollout-wait",
            &wait,
            "--rollout-state",
            &state,
            "--report-events",
        ],
    );
    collector_account(k, &ns, "collector");
    let mut pods: Vec<String> = (0..5).map(|i| format!("alloy-{i}")).collect();
    pods.sort_by(|a, b| cohort(&format!("{ns}/{a}")).total_cmp(&cohort(&format!("{ns}/{b}"))));
    let first = format!("{ns}/{}", pods[0]);
    eprintln!(
        "cohorts: {:?}",
        (pods.iter())
            .map(|p| (p, cohort(&format!("{ns}/{p}"))))
            .collect::<Vec<_>>()
    );
    let alloys: Vec<Collector> = (pods.iter())
        .map(|pod| Collector::start(&alloy, &hub, pod, &pod_token(k, &ns, "collector", pod)))
        .collect();
    let instance = format!("{}_S_web.module", ns.replace('-', "_"));
    let runs = |a: &Collector, job: &str| {
        (a.inside(&instance).iter()).any(|c| c.ends_with(&format!("prometheus.scrape.{job}")))
    };
    let token = scraper(k, &ns);
    let status = || {
        let (_, _, body) = get(&hub.url(), &hub.ca, token.trim(), "/status", &[]);
        serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null)
    };
    let explain = || {
        let each: Vec<String> = (alloys.iter())
            .map(|a| format!("{}: {:?}", a.id, a.components()))
            .collect();
        format!("{}\n{}\n{}", each.join("\n"), status(), hub.d.stderr())
    };
    eventually_explained(
        "every Alloy runs v1, and the hub knows them applied",
        4 * SOON,
        || alloys.iter().all(|a| runs(a, "v1")) && status()["remotecfg"]["applied"] == alloys.len(),
        explain,
    );

    // A version Alloy cannot build: the first step alone gets it and fails it.
    let written = put(&unbuildable("web", port).replace("\"default\"", "\"bad\""));
    let refused = |r: &Value| r["name"] == "web" && r["state"] == "refused";
    eventually_explained(
        "the rollout of the version refused, by the first step's collector",
        POLL + WAIT,
        || {
            (status()["rollouts"].as_array().into_iter().flatten())
                .any(|r| refused(r) && r["refused"].to_string().contains(&first))
        },
        explain,
    );
    eprintln!("refused {:?} after the write", written.elapsed());
    // The moment passed: the step's wait and two polls beyond the write. Had any other
    // collector been sent the version, it would have failed it too (Alloy's log says each
    // text it fails).
    std::thread::sleep((written + WAIT + 2 * POLL).saturating_duration_since(Instant::now()));
    let failed = |a: &Collector| {
        a.log()
            .matches("failed to parse and load new remote configuration")
            .count()
    };
    assert_eq!(failed(&alloys[0]), 1, "{}", alloys[0].log());
    for a in &alloys[1..] {
        assert_eq!(
            failed(a),
            0,
            "{} was sent the refused version\n{}",
            a.id,
            a.log()
        );
    }
    for a in &alloys {
        assert!(
            runs(a, "v1"),
            "{} runs the last good version\n{}",
            a.id,
            explain()
        );
    }
    // The fleet's state says who refused it, and how; and an Event tells the author.
    let c = Cmpoll::new();
    let scraper_file = c.write("scraper-token", &token);
    let fleet = status_fleet(&c, &hub, &scraper_file, true);
    assert!(
        fleet.stdout.contains(&first) && fleet.stdout.contains("confirm"),
        "{}\n{}",
        fleet.stdout,
        fleet.stderr
    );
    eventually_explained(
        "an Event on the ConfigMap names the refusal",
        SOON,
        || {
            let out = k.ok(&["get", "events", "-n", &ns, "-o", "json"]);
            let list: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
            (list["items"].as_array().into_iter().flatten()).any(|e| {
                e["involvedObject"]["name"] == "web"
                    && (e["message"].as_str())
                        .is_some_and(|m| m.contains("refused") && m.contains(&first))
            })
        },
        || k.ok(&["get", "events", "-n", &ns, "-o", "yaml"]),
    );

    // A later good version reaches every Alloy, the first step first: the others only
    // after the step's wait.
    let written = put(&module("v3"));
    let mut got: Vec<Option<Duration>> = vec![None; alloys.len()];
    eventually_explained(
        "the good version runs in every Alloy",
        2 * POLL + WAIT + SOON,
        || {
            for (a, t) in alloys.iter().zip(got.iter_mut()) {
                if t.is_none() && runs(a, "v3") {
                    *t = Some(written.elapsed());
                }
            }
            got.iter().all(Option::is_some)
        },
        explain,
    );
    eprintln!("v3 reached the Alloys after {got:?} (the first step's first)");
    // The first step starts at the hub's poll after the write and is held WAIT: no other
    // Alloy can have it sooner.
    let first_got = got[0].unwrap();
    for (a, t) in alloys.iter().zip(&got).skip(1) {
        assert!(
            t.unwrap() >= WAIT.max(first_got),
            "{} got v3 at {t:?}, the first step at {first_got:?}, held {WAIT:?}",
            a.id
        );
    }

    // The root's ConfigMap edited: read again after a poll, it runs in every Alloy.
    put_root(&format!(
        "{root_text}\nprometheus.remote_write \"second\" {{\n  endpoint {{\n    url = \"http://127.0.0.1:1/api/v1/write\"\n  }}\n}}\n"
    ));
    let written = Instant::now();
    eventually_explained(
        "the root's edit runs in every Alloy",
        2 * POLL,
        || {
            (alloys.iter()).all(|a| {
                (a.components().iter()).any(|(id, _)| id == "prometheus.remote_write.second")
            })
        },
        explain,
    );
    eprintln!(
        "the root's edit everywhere {:?} after the write",
        written.elapsed()
    );
}
