//! Issue 49.1 on the real apiserver: after a scope's first list, a hub asks only for what
//! changed, with a short watch (`src/source/api/short_watch.rs`): the audit log shows one
//! list and then watches from the hub's version with `timeoutSeconds=1`; what it serves
//! after an update, an addition, a relabel and a deletion is what the apiserver lists; a
//! role without `watch` gets lists, with one warning.

use std::time::Duration;

use serde_json::{Value, json};
use test_apiserver::real::RealApiserver;

use super::hub::*;
use super::*;
use crate::util::{SOON, eventually_explained, root};

/// The items of `ns`'s selected ConfigMaps as JSON (by name), from the hub as `token`.
fn served(hub: &Hub, token: &str, ns: &str) -> Vec<Value> {
    let path =
        format!("/api/v1/namespaces/{ns}/configmaps?labelSelector=cmpoll.io%2Fmodule%3Dtrue");
    let (code, _, body) = get(&hub.url(), &hub.ca, token, &path, &[]);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    items(&body)
}

/// The same from the apiserver itself: the oracle.
fn listed(k: &RealApiserver, ns: &str) -> Vec<Value> {
    let path =
        format!("/api/v1/namespaces/{ns}/configmaps?labelSelector=cmpoll.io%2Fmodule%3Dtrue");
    items(k.ok(&["get", "--raw", &path]).as_bytes())
}

fn items(body: &[u8]) -> Vec<Value> {
    let list: Value = serde_json::from_slice(body).unwrap();
    let mut items = list["items"].as_array().cloned().unwrap_or_default();
    items.sort_by_key(|i| i["metadata"]["name"].as_str().unwrap_or("").to_string());
    items
}

/// The hub's own requests about ConfigMaps since `mark`: (verb, requestURI, code, when
/// received).
fn hub_requests(
    k: &RealApiserver,
    mark: u64,
    ns: &str,
    name: &str,
) -> Vec<(String, String, i64, String)> {
    let user = format!("system:serviceaccount:{ns}:{name}");
    (k.audit_since(mark).into_iter())
        .filter(|e| {
            e["user"]["username"] == user.as_str() && e["objectRef"]["resource"] == "configmaps"
        })
        .filter(|e| e["stage"] == "ResponseComplete")
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or("").to_string(),
                e["requestURI"].as_str().unwrap_or("").to_string(),
                e["responseStatus"]["code"].as_i64().unwrap_or(0),
                e["requestReceivedTimestamp"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect()
}

/// The hub follows an update, an addition, a relabel (out of its selector) and a deletion
/// with short watches after one list per scope, and serves what the apiserver lists after
/// each; the watches of its two namespaces are open together (a poll takes a second, not
/// one per scope); a change in one namespace has the other listed once, to be as new.
#[test]
fn after_its_first_list_a_hub_asks_the_apiserver_with_short_watches() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("hub-short");
    let ns2 = k.namespace("hub-short-two");
    k.put_configmap(&ns2, "z", &[LABEL], &[("k", "1")]);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    k.put_configmap(&ns, "b", &[LABEL], &[("k", "1")]);
    k.put_configmap(&ns, "other", &[], &[("k", "1")]);
    let token = hub_account(k, &ns, "hub");
    let reader = follower(k, &ns, "reader", cm_rules(), true);
    let mark = k.audit_mark();
    let hub = start_hub(
        k,
        &token,
        &["--namespace", &ns, "--namespace", &ns2, "--interval", "1s"],
    );
    let same = |what: &str| {
        eventually_explained(
            what,
            SOON,
            || served(&hub, &reader, &ns) == listed(k, &ns),
            || {
                format!(
                    "served {:?}\nlisted {:?}\n{}",
                    served(&hub, &reader, &ns),
                    listed(k, &ns),
                    hub.d.stderr()
                )
            },
        )
    };
    same("the first list served");
    assert_eq!(served(&hub, &reader, &ns).len(), 2);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "2")]);
    k.put_configmap(&ns, "c", &[LABEL], &[("k", "1")]);
    same("an update and an addition");
    k.put_configmap(&ns, "b", &[], &[("k", "1")]);
    k.put_configmap(&ns, "other", &[LABEL], &[("k", "2")]);
    same("one relabelled out of the selector, one into it");
    k.delete("configmap", &ns, "a");
    same("a deletion");
    k.put_configmap(&ns2, "z", &[LABEL], &[("k", "2")]);
    eventually_explained(
        "the other namespace's change",
        SOON,
        || served(&hub, &reader, &ns2) == listed(k, &ns2),
        || hub.d.stderr(),
    );
    let names: Vec<Value> = (served(&hub, &reader, &ns).iter())
        .map(|i| i["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, [json!("c"), json!("other")]);
    let asked = hub_requests(k, mark, &ns, "hub");
    let lists: Vec<_> = asked.iter().filter(|r| r.0 == "list").collect();
    let watches: Vec<_> = asked.iter().filter(|r| r.0 == "watch").collect();
    assert!(lists.len() >= 2, "{asked:#?}");
    for (_, uri, _, _) in &lists[..2] {
        assert!(
            uri.contains("resourceVersion=0"),
            "the first list a scope: {uri}"
        );
    }
    // Every later list levels a quiet scope with the change another found (issue 56.2):
    // from the watch cache at least as new as that change, so newer than the version the
    // scope's own short watch had reached; never more than one a change (there were
    // six, in four polls at least).
    let version = |uri: &str| -> u64 {
        let at = uri.find("resourceVersion=").unwrap() + "resourceVersion=".len();
        uri[at..].split('&').next().unwrap().parse().unwrap()
    };
    assert!(lists.len() - 2 <= 6, "{asked:#?}");
    for (_, uri, _, when) in &lists[2..] {
        assert!(uri.contains("resourceVersionMatch=NotOlderThan"), "{uri}");
        let scope = if uri.contains(&format!("/namespaces/{ns}/")) {
            &ns
        } else {
            &ns2
        };
        let held = (watches.iter())
            .filter(|w| w.1.contains(&format!("/namespaces/{scope}/")) && w.3 <= *when)
            .map(|w| version(&w.1))
            .max()
            .unwrap();
        assert!(
            version(uri) > held,
            "{uri}: not newer than {held}, the scope's own"
        );
    }
    for (_, uri, code, _) in &watches {
        assert!(
            uri.contains("timeoutSeconds=1") && uri.contains("resourceVersion=") && *code == 200,
            "{uri} {code}"
        );
    }
    // Opened together: each watch of one namespace has one of the other within 0.3 s.
    let at = |ns: &str| -> Vec<f64> {
        (watches.iter())
            .filter(|r| r.1.contains(&format!("/namespaces/{ns}/")))
            .map(|r| seconds(&r.3))
            .collect()
    };
    let (one, two) = (at(&ns), at(&ns2));
    assert!(one.len() >= 3 && two.len() >= 3, "{asked:#?}");
    for t in &one {
        assert!(
            two.iter().any(|u| (t - u).abs() < 0.3),
            "a watch of {ns} at {t} with none of {ns2} beside it: {two:?}"
        );
    }
    assert!(!hub.d.stderr().contains("WARN"), "{}", hub.d.stderr());
}

/// An audit timestamp (`2026-12-05T08:41:54.123456Z`) as seconds of its day.
fn seconds(stamp: &str) -> f64 {
    let time = stamp.split('T').nth(1).unwrap_or("").trim_end_matches('Z');
    let mut parts = time.split(':').map(|p| p.parse::<f64>().unwrap_or(0.0));
    let (h, m, s) = (parts.next(), parts.next(), parts.next());
    h.unwrap_or(0.0) * 3600.0 + m.unwrap_or(0.0) * 60.0 + s.unwrap_or(0.0)
}

/// A hub whose role lacks `watch` says so once and lists, serving every change as before.
#[test]
fn a_hub_whose_role_cannot_watch_lists() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("hub-nowatch");
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    // The shipped role, less `watch`.
    let text = std::fs::read_to_string(root().join("k8s/serve/clusterrole.yaml")).unwrap();
    let mut role: Value = serde_saphyr::from_str(&text).unwrap();
    let verbs = role["rules"][0]["verbs"].as_array_mut().unwrap();
    let had = verbs.len();
    verbs.retain(|v| v != "watch");
    assert_eq!(verbs.len(), had - 1, "the shipped role watches");
    let name = format!("cmpoll-hub-{ns}-nowatch");
    role["metadata"] = json!({"name": name});
    k.apply(&role.to_string());
    k.apply(
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "nowatch", "namespace": ns}]})
        .to_string(),
    );
    let token = k.token(&ns, "nowatch", "2h");
    let reader = follower(k, &ns, "reader", cm_rules(), false);
    let mark = k.audit_mark();
    let hub = start_hub(k, &token, &["--namespace", &ns, "--interval", "1s"]);
    for v in ["2", "3"] {
        k.put_configmap(&ns, "a", &[LABEL], &[("k", v)]);
        eventually_explained(
            "the change served",
            SOON,
            || served(&hub, &reader, &ns) == listed(k, &ns),
            || hub.d.stderr(),
        );
    }
    let asked = hub_requests(k, mark, &ns, "nowatch");
    let watches: Vec<_> = asked.iter().filter(|r| r.0 == "watch").collect();
    assert_eq!(watches.len(), 1, "asked once: {asked:#?}");
    assert_eq!(watches[0].2, 403);
    let lists = asked.iter().filter(|r| r.0 == "list").count();
    assert!(lists >= 3, "{asked:#?}");
    let log = hub.d.stderr();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("grant the hub's role watch"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains("cannot watch resource \\\"configmaps\\\"")
            || warned[0].contains("cannot watch resource \"configmaps\""),
        "{}",
        warned[0]
    );
}

/// When the watch cache no longer holds the events since the hub's version (nothing it
/// selects changed for over 75 s while others were written: its version stays where its
/// list left it), the apiserver answers the short watch with `410 Expired`: the hub lists
/// again, serves what it lists, and goes on with short watches.
#[test]
fn a_hub_whose_version_left_the_watch_cache_lists_again() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("hub-expired");
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    let token = hub_account(k, &ns, "hub");
    let reader = follower(k, &ns, "reader", cm_rules(), false);
    let mark = k.audit_mark();
    let hub = start_hub(k, &token, &["--namespace", &ns, "--interval", "1s"]);
    let relisted = || {
        let log = hub.d.stderr();
        log.contains("no longer holds the events since") || log.contains("; listing instead")
    };
    // Past the cache's freshness (75 s), then writes it does not select until the cache
    // has dropped the events after the hub's version (its size grows with the suite's
    // writes: as many rounds as it takes, at most 40 of 250).
    std::thread::sleep(Duration::from_secs(80));
    let mut round = 0;
    while !relisted() && round < 40 {
        let items: Vec<Value> = (0..250)
            .map(|i| {
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("other-{i}"), "namespace": ns},
                    "data": {"k": format!("{round}")}})
            })
            .collect();
        k.apply(&json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string());
        round += 1;
        std::thread::sleep(Duration::from_secs(2));
    }
    assert!(
        relisted(),
        "no 410 after {round} rounds: {}",
        hub.d.stderr()
    );
    // A change after it is served, by short watch again.
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "2")]);
    eventually_explained(
        "the change after the relist served",
        SOON,
        || served(&hub, &reader, &ns) == listed(k, &ns),
        || hub.d.stderr(),
    );
    let asked = hub_requests(k, mark, &ns, "hub");
    let lists: Vec<_> = asked.iter().filter(|r| r.0 == "list").collect();
    assert_eq!(
        lists.len(),
        2,
        "the first list, the one after the 410: {asked:#?}"
    );
    let last_list = asked.iter().rposition(|r| r.0 == "list").unwrap();
    assert!(
        asked[last_list..].iter().any(|r| r.0 == "watch"),
        "watches again after: {asked:#?}"
    );
    assert!(!hub.d.stderr().contains("WARN"), "{}", hub.d.stderr());
}

/// `served`, or `None` while the hub does not answer 200.
fn served_now(hub: &Hub, token: &str, ns: &str) -> Option<Vec<Value>> {
    let path =
        format!("/api/v1/namespaces/{ns}/configmaps?labelSelector=cmpoll.io%2Fmodule%3Dtrue");
    let (code, _, body) = get(&hub.url(), &hub.ca, token, &path, &[]);
    (code == 200).then(|| items(&body))
}

/// A short watch longer than `--max-response-bytes` (more changed since the last poll than
/// a list holds) is listed instead, not failed again poll after poll from the same version.
#[test]
fn a_short_watch_over_the_cap_is_listed_instead() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("hub-capped");
    // Server-side apply: no last-applied annotation, which would put each object's data in
    // its metadata too.
    let put_all = |data: &str| {
        let items: Vec<Value> = (0..10)
            .map(|i| {
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("m{i}"), "namespace": ns, "labels": {LABEL.0: LABEL.1}},
                    "data": {"k": data}})
            })
            .collect();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
        let args = [
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=cmpoll-tests",
            "-f",
            "-",
        ];
        k.ok_in(&args, Some(&list));
    };
    put_all("small");
    let token = hub_account(k, &ns, "hub");
    let reader = follower(k, &ns, "reader", cm_rules(), false);
    // Ten events of 8 KB do not fit, however the ten writes fall into polls (one poll has
    // at least five); a metadata list and ten GETs do.
    let hub = start_hub(
        k,
        &token,
        &[
            "--namespace",
            &ns,
            "--interval",
            "1s",
            "--max-response-bytes",
            "30000",
        ],
    );
    put_all(&"x".repeat(8000));
    eventually_explained(
        "the ten changes served",
        SOON,
        || served_now(&hub, &reader, &ns) == Some(listed(k, &ns)),
        || hub.d.stderr(),
    );
    let log = hub.d.stderr();
    assert!(
        log.contains("larger than 30000 bytes") && log.contains("listing instead"),
        "{log}"
    );
    assert!(!log.contains("WARN"), "{log}");
}
