//! `--report-events` against the real apiserver (issue 27): what an app team reads with
//! `kubectl events` and `kubectl describe` after a rejection, an acceptance, a Secret's
//! rejection; the series of a repeated event as the apiserver stores it. The role is the
//! shipped one plus what `k8s/events` grants.

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use test_apiserver::real::{RealApiserver, User};

use super::*;
use crate::util::tools::tool;
use crate::util::{Daemon, SOON, eventually, kinds, root, skip_unless};

/// The rules of the shipped list role and of the `k8s/events` component.
fn rules_with_events() -> Value {
    let mut rules = shipped_rules();
    let text = std::fs::read_to_string(root().join("k8s/events/kustomization.yaml")).unwrap();
    let component: Value = serde_saphyr::from_str(&text).unwrap();
    let patch: Value =
        serde_saphyr::from_str(component["patches"][0]["patch"].as_str().unwrap()).unwrap();
    assert_eq!(patch[0]["path"], "/rules/-");
    rules
        .as_array_mut()
        .unwrap()
        .push(patch[0]["value"].clone());
    rules
}

/// `kubectl events -n NS --for KIND/NAME -o json`: the events, oldest first.
fn events_for(k: &RealApiserver, ns: &str, object: &str) -> Vec<Value> {
    let out = k.ok(&["events", "-n", ns, "--for", object, "-o", "json"]);
    // With no events, kubectl prints nothing at all.
    if out.trim().is_empty() {
        return Vec::new();
    }
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The events.k8s.io/v1 view of the events about `name`.
fn v1_events(k: &RealApiserver, ns: &str, name: &str) -> Vec<Value> {
    let out = k.ok(&["get", "events.v1.events.k8s.io", "-n", ns, "-o", "json"]);
    let list: Value = serde_json::from_str(&out).unwrap();
    (list["items"].as_array().cloned().unwrap_or_default())
        .into_iter()
        .filter(|e| e["regarding"]["name"] == name)
        .collect()
}

const BAD_RULE: &str = "groups:\n  - name: payments\n    rules:\n      - record: job:errors:rate5m\n        expr: sum(rate(errors_total[5m]\n";
const GOOD_RULE: &str = "groups:\n  - name: payments\n    rules:\n      - record: job:errors:rate5m\n        expr: sum(rate(errors_total[5m]))\n";

/// A broken rules ConfigMap: `Rejected` with promtool's message, on the ConfigMap, read
/// with `kubectl events` and `kubectl describe`; fixed: `Accepted`.
#[test]
fn a_rejection_and_its_fix_are_told_on_the_configmap() {
    if skip_unless(
        tool("promtool").is_some(),
        "promtool (Debian package prometheus)",
    ) {
        return;
    }
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("events");
    let token = account(k, &ns, "cmpoll", Some(rules_with_events()));
    k.put_configmap(&ns, "rules", &[LABEL], &[("payments.rules.yaml", BAD_RULE)]);
    let c =
        cmpoll_as(k, &format!("{ns}-cmpoll"), &User::Token(token)).env("POD_NAME", "cmpoll-7d9f");
    let out = c.out();
    let d = Daemon::start(
        c,
        &[
            "--namespace",
            &ns,
            "--interval",
            "200ms",
            "--out-dir",
            out.to_str().unwrap(),
            "--stdout-events",
            "--validate",
            "promtool check rules \"$CMPOLL_MODULE_DIR\"/*",
            "--report-events",
        ],
    );
    let first = d.batch(SOON);
    let module = format!("{ns}/rules");
    assert!(
        kinds(&first).contains(&("rejected", module.as_str())),
        "{first:?}"
    );
    let mut seen = Vec::new();
    eventually("the Rejected event", SOON, || {
        seen = events_for(k, &ns, "configmap/rules");
        !seen.is_empty()
    });
    let e = &seen[0];
    assert_eq!(e["reason"], "Rejected", "{e}");
    assert_eq!(e["type"], "Warning");
    let note = e["message"].as_str().unwrap();
    assert!(
        note.contains("unclosed left parenthesis") || note.contains("parse error"),
        "promtool's own message: {note}"
    );
    assert!(note.contains("(validator exited with status 1)"), "{note}");
    assert_eq!(e["reportingComponent"], "cmpoll.io/cmpoll");
    assert_eq!(e["reportingInstance"], "cmpoll-7d9f");
    assert_eq!(e["action"], "Deliver");
    assert_eq!(e["involvedObject"]["kind"], "ConfigMap");
    let describe = k.ok(&["describe", "configmap", "-n", &ns, "rules"]);
    assert!(
        describe.contains("Warning  Rejected") && describe.contains("cmpoll.io/cmpoll"),
        "kubectl describe shows it:\n{describe}"
    );
    // The fix: Accepted, at the next slot (at most one call per object a minute).
    let fixed = Instant::now();
    k.put_configmap(
        &ns,
        "rules",
        &[LABEL],
        &[("payments.rules.yaml", GOOD_RULE)],
    );
    let b = d.batch(SOON);
    // Never delivered before: the fix is its first version out.
    assert_eq!(kinds(&b)[0], ("added", module.as_str()));
    eventually("the Accepted event", Duration::from_secs(90), || {
        seen = events_for(k, &ns, "configmap/rules");
        seen.iter().any(|e| e["reason"] == "Accepted")
    });
    let accepted = seen.iter().find(|e| e["reason"] == "Accepted").unwrap();
    assert_eq!(accepted["type"], "Normal");
    assert!(
        fixed.elapsed() >= Duration::from_secs(40),
        "the second call waited for the object's minute: {:?}",
        fixed.elapsed()
    );
    d.stop();
}

/// A Secret's rejection says the validator's exit status and nothing of its output.
#[test]
fn a_secrets_rejection_carries_no_validator_output() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("events-secret");
    let mut rules = rules_with_events();
    rules.as_array_mut().unwrap().push(serde_json::json!(
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "get"]}));
    let token = account(k, &ns, "cmpoll", Some(rules));
    k.put_secret(&ns, "db", &[LABEL], &[("password", "hunter2-secret")]);
    let c = cmpoll_as(k, &format!("{ns}-cmpoll"), &User::Token(token));
    let run = c
        .with_args(&[
            "run",
            "--once",
            "--namespace",
            &ns,
            "--resource",
            "secrets",
            "--validate",
            "cat password; echo; exit 3",
            "--report-events",
        ])
        .run();
    assert!(run.stdout.contains("\"rejected\""), "{}", run.described);
    let mut seen = Vec::new();
    eventually("the Rejected event", SOON, || {
        seen = events_for(k, &ns, "secret/db");
        !seen.is_empty()
    });
    assert_eq!(seen[0]["reason"], "Rejected");
    assert_eq!(seen[0]["involvedObject"]["kind"], "Secret");
    assert_eq!(seen[0]["message"], "validator exited with status 3");
    let all = k.ok(&["get", "events", "-n", &ns, "-o", "json"]);
    assert!(!all.contains("hunter2"), "{all}");
}

/// The recorder's series against the real apiserver: the second and third occurrence
/// patch `series` (the apiserver accepts and stores it), an expired event is created
/// again. The clock is passed in, so the minute between calls is not waited for.
#[test]
fn a_repeat_is_counted_in_the_series_the_apiserver_stores() {
    use cmpoll::report::{KubeApi, MIN_GAP, Occurrence, Reason, Recorder, Regarding};
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("events-series");
    let token = account(k, &ns, "cmpoll", Some(rules_with_events()));
    k.put_configmap(&ns, "web", &[LABEL], &[("k", "v")]);
    let cm: Value =
        serde_json::from_str(&k.ok(&["get", "configmap", "-n", &ns, "web", "-o", "json"])).unwrap();
    let kubeconfig = k.write_kubeconfig(&format!("{ns}-series.kubeconfig"), &User::Token(token));
    let flags = cmpoll::kube::config::Flags {
        kubeconfig: Some(kubeconfig),
        ..Default::default()
    };
    let config = cmpoll::kube::Config::resolve(&flags, &|_| None).unwrap();
    let client = cmpoll::kube::Client::new(
        &config,
        cmpoll::kube::client::Options {
            timeout: Duration::from_secs(10),
            max_response_bytes: 1 << 20,
            allow_insecure_http: false,
        },
        Default::default(),
        &|_| None,
    )
    .unwrap();
    let results = cmpoll::ops::metrics::Results::default();
    let mut r = Recorder::new(KubeApi(client), "series-test".into(), results.clone());
    let occ = || Occurrence {
        object: Regarding {
            kind: cmpoll::source::Resource::ConfigMaps,
            namespace: ns.clone(),
            name: "web".into(),
            uid: cm["metadata"]["uid"].as_str().unwrap().into(),
            resource_version: cm["metadata"]["resourceVersion"].as_str().unwrap().into(),
        },
        reason: Reason::Rejected,
        note: "bad".into(),
        at: SystemTime::now(),
    };
    let t0 = Instant::now();
    r.occur(occ(), t0);
    r.send_due(t0, false);
    r.occur(occ(), t0 + MIN_GAP);
    r.send_due(t0 + MIN_GAP, false);
    r.occur(occ(), t0 + MIN_GAP * 2);
    r.send_due(t0 + MIN_GAP * 2, false);
    assert_eq!((results.get("ok"), results.get("error")), (3, 0));
    let events = v1_events(k, &ns, "web");
    assert_eq!(events.len(), 1, "one event, counted: {events:?}");
    assert_eq!(events[0]["series"]["count"], 3, "{}", events[0]);
    assert_eq!(events[0]["regarding"]["uid"], cm["metadata"]["uid"]);
    let described = events_for(k, &ns, "configmap/web");
    assert_eq!(
        described[0]["series"]["count"], 3,
        "kubectl events' (core/v1) view: {}",
        described[0]
    );
    // Expired (deleted here): the next repeat creates it again, with its series.
    let name = events[0]["metadata"]["name"].as_str().unwrap().to_string();
    k.ok(&["delete", "events.v1.events.k8s.io", "-n", &ns, &name]);
    r.occur(occ(), t0 + MIN_GAP * 3);
    r.send_due(t0 + MIN_GAP * 3, false);
    let events = v1_events(k, &ns, "web");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["series"]["count"], 4);
    assert_eq!(results.get("error"), 0);
}

/// Without the events rights (the component not applied) recording fails: a warning
/// naming the 403, and the polls go on undelayed (the next change arrives in its batch
/// while the failed call is long over).
#[test]
fn a_forbidden_event_is_a_warning_and_the_polls_go_on() {
    let Some((_one, k)) = cluster_alone() else {
        return;
    };
    let ns = k.namespace("events-forbidden");
    let token = account(k, &ns, "cmpoll", None);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "bad")]);
    let c = cmpoll_as(k, &format!("{ns}-cmpoll"), &User::Token(token));
    let d = Daemon::start(
        c,
        &[
            "--namespace",
            &ns,
            "--interval",
            "200ms",
            "--validate",
            "grep -qv bad k",
            "--report-events",
        ],
    );
    let first = d.batch(SOON);
    assert!(kinds(&first).contains(&("rejected", format!("{ns}/a").as_str())));
    eventually("the warning", SOON, || {
        d.stderr()
            .contains("--report-events: cannot record event Rejected for configmap")
    });
    let warning = d.stderr();
    assert!(
        warning.contains("403") || warning.contains("forbidden"),
        "{warning}"
    );
    let asked = Instant::now();
    k.put_configmap(&ns, "b", &[LABEL], &[("k", "good")]);
    let b = d.batch(SOON);
    assert_eq!(kinds(&b)[0], ("added", format!("{ns}/b").as_str()));
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert!(events_for(k, &ns, "configmap/a").is_empty());
    d.stop();
}
