//! `cmpoll serve --validate` on the real apiserver (issue 59.1): a version the hub refuses
//! reaches no follower and no watcher, a follower started after it gets the last good
//! version, a restarted hub (`--state-dir`) serves it too without validating again, and a
//! version that passes later reaches everyone as one change.

use std::time::Duration;

use serde_json::{Value, json};

use super::hub::*;
use super::*;
use crate::util::{Cmpoll, Daemon, SOON, eventually_explained};

/// Refuses a module whose `k.yaml` says `bad`, as a validator would, naming it.
const VALIDATOR: &str =
    "if grep -q bad k.yaml; then echo \"refused: $CMPOLL_MODULE says bad\"; exit 3; fi";

fn watch_rules() -> Value {
    json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get", "watch"]}])
}

/// The hub's object `ns/name`: (status, its JSON).
fn object(hub: &Hub, token: &str, ns: &str, name: &str) -> (u16, Value) {
    let (code, _, body) = get(
        &hub.url(),
        &hub.ca,
        token,
        &format!("/api/v1/namespaces/{ns}/configmaps/{name}"),
        &[],
    );
    (code, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn validations(hub: &Hub, scraper: &str, result: &str) -> f64 {
    let (_, _, metrics) = get(&hub.url(), &hub.ca, scraper, "/metrics", &[]);
    metric_sum(
        &String::from_utf8_lossy(&metrics),
        "cmpoll_validations_total",
        &[("result", result)],
    )
}

/// A follower of `hub` as `token`, watching it.
fn follow(hub: &Hub, token: &str, ns: &str, name: &str) -> Daemon {
    let c = Cmpoll::new();
    let kubeconfig = hub_kubeconfig(&c, hub, token, &format!("{name}.kubeconfig"));
    Daemon::start(
        c.env("KUBECONFIG", kubeconfig.to_str().unwrap()),
        &["--namespace", ns, "--interval", "5m"],
    )
}

#[test]
fn a_version_the_hub_refuses_reaches_no_follower_and_new_ones_start_on_the_last_good() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-validate");
    let put = |name: &str, v: &str| put_module(k, &ns, name, "k.yaml", v);
    put("m", "one");
    let hub_token = hub_account(k, &ns, "hub");
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    let args = [
        "--namespace",
        &ns,
        "--interval",
        "1s",
        "--validate",
        VALIDATOR,
        "--state-dir",
        state_dir.to_str().unwrap(),
        "--drain-window",
        "0s",
        "--report-events",
    ];
    // --report-events: the shipped role writes nothing; this is what the docs add.
    hub_may_record_events(k, &ns, "hub");
    let hub = start_hub(k, &hub_token, &args);
    let token = follower(k, &ns, "reader", watch_rules(), false);
    let scraper = scraper(k, &ns);
    let a = follow(&hub, &token, &ns, "a");
    let first = a.batch(SOON);
    assert_eq!(first[0]["files"]["k.yaml"], "one", "{first:?}");
    let (_, good) = object(&hub, &token, &ns, "m");
    let good_rv = good["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // A plain watcher of the hub from its list's version, as kubectl get -w lists then
    // watches (the object's own version may be older than the hub's first poll, which
    // never saw what came before it: a 410, as the apiserver's watch cache answers it).
    let (_, _, listed) = get(
        &hub.url(),
        &hub.ca,
        &token,
        &format!("/api/v1/namespaces/{ns}/configmaps"),
        &[],
    );
    let listed: Value = serde_json::from_slice(&listed).unwrap();
    let list_rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let watcher = HeldOpen::open(
        &hub.url(),
        &hub.ca,
        &token,
        &format!("/api/v1/namespaces/{ns}/configmaps?watch=true&resourceVersion={list_rv}"),
        120.0,
    );

    // The refused update: the hub judges it once and keeps serving version one.
    put("m", "bad two");
    eventually_explained(
        "the hub refused the update",
        SOON,
        || validations(&hub, &scraper, "fail") == 1.0,
        || hub.d.stderr(),
    );
    let (code, held) = object(&hub, &token, &ns, "m");
    assert_eq!(code, 200);
    assert_eq!(held["data"]["k.yaml"], "one", "{held}");
    assert_eq!(held["metadata"]["resourceVersion"], good_rv.as_str());
    let mark = held["metadata"]["annotations"]["cmpoll.io/held-back"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(mark.starts_with("sha256:") && mark.len() == 71, "{held}");
    // Everything else of it is what the apiserver served for version one.
    let mut unmarked = held.clone();
    let annotations = unmarked["metadata"].as_object_mut().unwrap();
    annotations.remove("annotations");
    let mut plain = good.clone();
    plain["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    assert_eq!(unmarked, plain);
    // A new object that was never good is not served.
    put("never", "bad from the start");
    eventually_explained(
        "the hub refused the new object",
        SOON,
        || validations(&hub, &scraper, "fail") == 2.0,
        || hub.d.stderr(),
    );
    assert_eq!(object(&hub, &token, &ns, "never").0, 404);
    // The operator reads the hub's verdicts on /status.
    let (_, _, status) = get(&hub.url(), &hub.ca, &scraper, "/status", &[]);
    let status: Value = serde_json::from_slice(&status).unwrap();
    let held_back = status["validation"]["heldBack"].as_array().unwrap();
    let named = |n: &str| held_back.iter().find(|o| o["name"] == n).unwrap().clone();
    let m = named("m");
    assert_eq!(
        (&m["state"], &m["newest"]),
        (&json!("refused"), &json!(mark)),
        "{m}"
    );
    assert_eq!(m["servedResourceVersion"], good_rv.as_str());
    assert!(m["reason"].as_str().unwrap().contains("says bad"), "{m}");
    assert!(named("never")["served"].is_null());
    // The author reads one Event per refused version, from the hub.
    let events = || -> Vec<Value> {
        let out = k.ok(&["get", "events", "-n", &ns, "-o", "json"]);
        let all: Value = serde_json::from_str(&out).unwrap();
        (all["items"].as_array().unwrap().iter())
            .filter(|e| e["source"]["component"] == "cmpoll.io/cmpoll")
            .cloned()
            .collect()
    };
    eventually_explained(
        "an Event for each refused version",
        SOON,
        || events().len() == 2,
        || format!("{:?}\n{}", events(), hub.d.stderr()),
    );
    let told = events();
    // What the author sees (docs/app-teams.md shows it).
    eprintln!("{}", k.ok(&["get", "events", "-n", &ns]));
    let on_m: Vec<&Value> = (told.iter())
        .filter(|e| e["involvedObject"]["name"] == "m")
        .collect();
    assert_eq!(on_m.len(), 1, "{told:?}");
    let e = on_m[0];
    assert_eq!(
        (&e["type"], &e["reason"]),
        (&json!("Warning"), &json!("Refused"))
    );
    assert_eq!(e["involvedObject"]["kind"], "ConfigMap");
    assert_eq!(e["involvedObject"]["uid"], good["metadata"]["uid"]);
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "version {} refused by the hub's --validate",
            &mark[..19]
        )) && message.contains(&format!("refused: {ns}/m says bad")),
        "{message}"
    );

    // A follower started now runs the last good version.
    let b = follow(&hub, &token, &ns, "b");
    let started = b.batch(SOON);
    assert_eq!(started.len(), 2, "m and synced: {started:?}");
    assert_eq!(started[0]["module"], format!("{ns}/m"));
    assert_eq!(started[0]["files"]["k.yaml"], "one");
    // The moment passed for the first follower: a later change reaches it alone, after
    // the refused one would have.
    put("n", "fine");
    let next = a.batch(SOON);
    assert_eq!(next.len(), 2, "only n: {next:?}");
    assert_eq!(next[0]["module"], format!("{ns}/n"));
    assert_eq!(b.batch(SOON)[0]["module"], format!("{ns}/n"));
    eventually_explained(
        "the watcher heard of n",
        SOON,
        || watcher.lines() >= 1,
        || hub.d.stderr(),
    );
    let (_, seen) = watcher.end(Duration::ZERO);
    let seen = String::from_utf8_lossy(&seen);
    let heard: Vec<Value> = (seen.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        heard.iter().any(|e| e["object"]["metadata"]["name"] == "n"),
        "the watcher heard the later change: {seen}"
    );
    assert!(
        heard.iter().all(|e| e["object"]["metadata"]["name"] != "m"
            && e["object"]["metadata"]["name"] != "never"),
        "no event of a refused version: {seen}"
    );

    // A restarted hub remembers: version one served at once, nothing validated again.
    a.stop();
    b.stop();
    let log = hub.d.stderr();
    assert!(
        log.contains(&format!(
            "configmap {ns}/m: version {} refused by --validate: refused: {ns}/m says bad; its clients are served its last good version",
            &mark[..19]
        )),
        "{log}"
    );
    hub.d.stop();
    let hub = start_hub(k, &hub_token, &args);
    let (code, again) = object(&hub, &token, &ns, "m");
    assert_eq!(
        (code, &again["data"]["k.yaml"]),
        (200, &json!("one")),
        "{again}"
    );
    assert_eq!(
        again["metadata"]["annotations"]["cmpoll.io/held-back"],
        mark.as_str()
    );
    assert_eq!(object(&hub, &token, &ns, "never").0, 404);
    assert_eq!(validations(&hub, &scraper, "fail"), 0.0);
    assert_eq!(
        validations(&hub, &scraper, "pass"),
        0.0,
        "m and n were judged before"
    );
    let c = follow(&hub, &token, &ns, "c");
    let restarted = c.batch(SOON);
    assert_eq!(restarted[0]["files"]["k.yaml"], "one", "{restarted:?}");
    // The restarted hub tells of the same versions in the same Events: once it wrote
    // both, there still are two.
    let (hub_ref, scraper_ref) = (&hub, &scraper);
    let written = || {
        let (_, _, metrics) = get(&hub_ref.url(), &hub_ref.ca, scraper_ref, "/metrics", &[]);
        metric_sum(
            &String::from_utf8_lossy(&metrics),
            "cmpoll_event_reports_total",
            &[("result", "ok")],
        )
    };
    eventually_explained(
        "the restarted hub wrote its Events",
        SOON,
        || written() == 2.0,
        || hub.d.stderr(),
    );
    assert_eq!(events().len(), 2, "{:?}", events());

    // A version that passes reaches the followers as one update.
    put("m", "three");
    let got = c.batch(SOON);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["type"], "updated", "{got:?}");
    assert_eq!(got[0]["files"]["k.yaml"], "three");
    let (_, now) = object(&hub, &token, &ns, "m");
    assert!(
        now["metadata"]["annotations"]["cmpoll.io/held-back"].is_null(),
        "{now}"
    );
    let log = hub.d.stderr();
    assert!(
        !log.contains("refused by --validate"),
        "judged once, by the first: {log}"
    );
    c.stop();
    hub.d.stop();
}
