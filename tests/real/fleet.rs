//! Issue 59, the hub's side, on the real apiserver: followers report what they hold to
//! `POST /cmpoll/v1/report` (raw HTTPS, as the contract says: JSON, a bearer token,
//! `x-cmpoll-wait`), as two identities — a pod's bound service-account token (named by its
//! pod) and a plain one (named by its user) — and the hub's `cmpoll status --fleet` (table
//! and `--json`) and `/metrics` show the fleet. The refusals: 401, 403 (one namespace the
//! reporter may not list; the hub's words the apiserver's own for that list), 400, 413,
//! 429.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use super::hub::*;
use super::*;
use crate::util::spec_hash;

/// `POST /cmpoll/v1/report` with curl, as `token` (none when empty): (status, headers
/// lowercased, body).
fn post(hub: &Hub, token: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let (data, head, out) = (
        dir.path().join("d"),
        dir.path().join("h"),
        dir.path().join("b"),
    );
    std::fs::write(&data, body).unwrap();
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "20", "--cacert"])
        .arg(&hub.ca)
        .arg("-D")
        .arg(&head)
        .arg("-o")
        .arg(&out)
        .args(["-w", "%{http_code}", "-X", "POST"])
        .args([
            "-H",
            "Content-Type: application/json",
            "-H",
            "x-cmpoll-wait: 30",
        ])
        .arg("--data-binary")
        .arg(format!("@{}", data.display()));
    if !token.is_empty() {
        cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let o = cmd
        .arg(format!("{}/cmpoll/v1/report", hub.url()))
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&o.stdout).parse().unwrap_or(0),
        std::fs::read_to_string(&head)
            .unwrap_or_default()
            .to_ascii_lowercase(),
        std::fs::read(&out).unwrap_or_default(),
    )
}

fn report(modules: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({ "modules": modules })).unwrap()
}

fn message(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    v["message"].as_str().unwrap_or_default().to_string()
}

/// A pod `name` of `ns` run by service account `account` (never scheduled: there is no
/// node), and a token bound to it, as the kubelet projects one into the pod.
pub(crate) fn pod_token(k: &RealApiserver, ns: &str, account: &str, name: &str) -> String {
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"serviceAccountName": account,
                     "containers": [{"name": "agent", "image": "agent:none"}]}})
        .to_string(),
    );
    (k.ok(&[
        "create",
        "token",
        account,
        "-n",
        ns,
        "--duration",
        "10m",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        name,
    ]))
    .trim()
    .to_string()
}

pub(crate) fn status_fleet(
    c: &crate::util::Cmpoll,
    hub: &Hub,
    scraper: &Path,
    json: bool,
) -> crate::util::Run {
    let url = hub.url();
    let mut args = vec![
        "status",
        "--server-url",
        &url,
        "--fleet",
        "--token-file",
        scraper.to_str().unwrap(),
        "--ca-file",
        hub.ca.to_str().unwrap(),
    ];
    if json {
        args.push("--json");
    }
    c.with_args(&args).run()
}

#[test]
fn followers_report_to_the_hub_and_status_shows_the_fleet() {
    let Some((_guard, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-fleet");
    let other = k.namespace("hub-fleet-other");
    put_module(k, &ns, "alloy-mod", "k.yaml", "one");
    put_module(k, &other, "m", "k.yaml", "one");
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--interval", "1s"]);
    // Two followers allowed to list ConfigMaps in `ns` only: one in a pod, one not.
    let _ = account(k, &ns, "agent", Some(cm_rules()));
    let in_pod = pod_token(k, &ns, "agent", "node-7");
    let plain = account(k, &ns, "plain", Some(cm_rules()));
    let c = crate::util::Cmpoll::new();
    let scraper = c.write("scraper-token", &scraper(k, &ns));
    let served = spec_hash(&[("k.yaml", b"one")]);
    let module = |ns: &str, name: &str| format!("{ns}/{name}");

    // Anonymous, and a token the apiserver does not know: 401.
    let one =
        report(json!([{"module": module(&ns, "alloy-mod"), "kind": "ConfigMap", "hash": served}]));
    assert_eq!(post(&hub, "", &one).0, 401);
    assert_eq!(post(&hub, "not-a-token", &one).0, 401);
    // The plain follower holds the served version; the pod's refused it.
    let (code, _, body) = post(&hub, &plain, &one);
    assert_eq!(code, 204, "{}", String::from_utf8_lossy(&body));
    let refused = report(
        json!([{"module": module(&ns, "alloy-mod"), "kind": "ConfigMap",
        "refused": {"hash": served, "by": "validate", "reason": "line 3: unknown block"}}]),
    );
    assert_eq!(post(&hub, &in_pod, &refused).0, 204);

    // One namespace it may not list: 403 for the whole report, in the apiserver's words
    // for that list.
    let both = report(json!([
        {"module": module(&ns, "alloy-mod"), "kind": "ConfigMap", "hash": served},
        {"module": module(&other, "m"), "kind": "ConfigMap", "hash": served}]));
    let (code, _, body) = post(&hub, &plain, &both);
    assert_eq!(code, 403, "{}", String::from_utf8_lossy(&body));
    let apiserver_ca = c.write("apiserver-ca.crt", &k.ca_pem());
    let (code, _, direct) = get(
        &k.url,
        &apiserver_ca,
        &plain,
        &format!("/api/v1/namespaces/{other}/configmaps"),
        &[],
    );
    assert_eq!(code, 403);
    assert_eq!(message(&body), message(&direct), "the apiserver's words");
    // Not a report: 400 in the apiserver's Status words; over MAX_REPORT: 413.
    let (code, _, body) = post(
        &hub,
        &plain,
        br#"{"modules":[{"module":"x","kind":"Pod"}]}"#,
    );
    assert_eq!(code, 400);
    let status: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (&status["kind"], &status["reason"]),
        (&json!("Status"), &json!("BadRequest"))
    );
    let huge = vec![b' '; (1 << 20) + 1]; // hub_protocol::MAX_REPORT + 1
    assert_eq!(post(&hub, &plain, &huge).0, 413);

    // The fleet: the table at a glance, exit 1 (a refusal); the JSON as the hub wrote it.
    let table = status_fleet(&c, &hub, &scraper, false).failure(1);
    let line = format!(
        "{ns}/alloy-mod   {}…   1 hold · 0 behind · 1 refused ({ns}/node-7: validate: line 3: unknown block) · 0 gone",
        &served[..15]
    );
    assert!(
        table.stdout.contains(&line),
        "{}\n{}",
        table.stdout,
        table.stderr
    );
    assert!(
        table.stderr.contains("1 followers refused"),
        "{}",
        table.stderr
    );
    let fleet = status_fleet(&c, &hub, &scraper, true).failure(1).json();
    assert_eq!(fleet["followers"], 2, "{fleet}");
    let objects = fleet["objects"].as_array().unwrap();
    assert_eq!(objects.len(), 1, "{fleet}");
    let o = &objects[0];
    assert_eq!(
        (&o["namespace"], &o["name"], &o["served"]),
        (&json!(ns), &json!("alloy-mod"), &json!(served))
    );
    assert_eq!(
        o["counts"],
        json!({"current": 1, "updating": 0, "behind": 0, "refused": 1, "gone": 0})
    );
    assert_eq!(
        o["refused"][0]["follower"],
        format!("{ns}/node-7"),
        "the pod's name, in its namespace"
    );
    assert_eq!(
        o["versions"],
        json!([{"hash": null, "followers": 1}, {"hash": served, "followers": 1}])
    );

    // The pod takes the version: nothing asks for a person any more, exit 0.
    assert_eq!(post(&hub, &in_pod, &one).0, 204);
    let table = status_fleet(&c, &hub, &scraper, false).success();
    assert!(
        table
            .stdout
            .contains("2 hold · 0 behind · 0 refused · 0 gone"),
        "{}",
        table.stdout
    );

    // A flood from one follower: 429 with Retry-After (a burst of 4 reports), the other
    // still taken.
    let mut limited = None;
    for _ in 0..6 {
        let (code, head, _) = post(&hub, &in_pod, &one);
        if code == 429 {
            limited = Some(head);
            break;
        }
        assert_eq!(code, 204);
    }
    let head = limited.expect("a 429 within 6 reports");
    assert!(head.contains("retry-after: "), "{head}");
    assert_eq!(
        post(&hub, &plain, &one).0,
        204,
        "another follower's own budget"
    );

    // /metrics: totals per state, no follower named.
    let (_, _, m) = get(
        &hub.url(),
        &hub.ca,
        &std::fs::read_to_string(&scraper).unwrap(),
        "/metrics",
        &[],
    );
    let m = String::from_utf8_lossy(&m).to_string();
    assert_eq!(
        metric_sum(&m, "cmpoll_fleet_followers", &[("state", "current")]),
        2.0,
        "{m}"
    );
    for (result, at_least) in [
        ("accepted", 5.0),
        ("forbidden", 1.0),
        ("invalid", 1.0),
        ("limited", 1.0),
    ] {
        let n = metric_sum(&m, "cmpoll_fleet_reports_total", &[("result", result)]);
        assert!(n >= at_least, "{result}: {n}");
    }
    assert!(!m.contains("node-7"), "no follower is a label");
}
