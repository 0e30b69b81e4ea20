//! What the hub keeps for its clients, bounded in bytes (issue 56.4), on the real
//! apiserver: the watch history of a large object changed again and again, and the lists
//! it renders for clients that each choose their own selector or limit. Both read off the
//! hub's `/status`, which counts what they keep.

use std::time::Duration;

use serde_json::{Value, json};

use super::hub::*;
use super::*;
use crate::util::SOON;

/// The hub's `/status`, as a scraper reads it.
fn status(hub: &Hub, scraper: &str) -> Value {
    let (code, _, body) = get(&hub.url(), &hub.ca, scraper, "/status", &[]);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// A large ConfigMap changed 40 times (1 MB each: 40 MB of versions, each counted with the
/// one it replaced and their events) leaves the hub's history within its 64 MiB, the
/// newest changes kept and
/// a watch from the first version too old; a hundred clients each with a selector of
/// its own, and a limit larger than the list, leave its renders within theirs, a limit
/// the whole list fits in sharing the one render of the list.
#[test]
fn a_large_object_changed_again_and_again_keeps_a_bounded_history() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-bytes");
    let big = |i: usize| format!("{i:04}{}", "x".repeat(1_000_000));
    let first: u64 = (k.put_configmap(&ns, "big", &[LABEL], &[("k", &big(0))]))
        .parse()
        .unwrap();
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--namespace", &ns]);
    let scraper = scraper(k, &ns);
    let token = follower(
        k,
        &ns,
        "reader",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get", "watch"]}]),
        false,
    );
    let mut last = first;
    for i in 1..=40 {
        last = (k.put_configmap(&ns, "big", &[LABEL], &[("k", &big(i))]))
            .parse()
            .unwrap();
        // Each change in a poll of its own (the hub polls every second).
        std::thread::sleep(Duration::from_millis(1100));
    }
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    crate::util::eventually("the hub past the last change", SOON, || {
        let (_, _, body) = get(&hub.url(), &hub.ca, &token, &list, &[]);
        serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
            v["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
        }) >= Some(last)
    });
    let s = status(&hub, &scraper);
    let history = &s["history"][0];
    let (changes, bytes) = (
        history["changes"].as_u64().unwrap(),
        history["bytes"].as_u64().unwrap(),
    );
    eprintln!("history: {changes} changes, {bytes} bytes");
    assert!(bytes <= 64 << 20, "{s}");
    assert!(
        (10..40).contains(&changes),
        "some dropped, the newest kept: {s}"
    );
    // A watch from the first version is too old; from a recent one, it has the rest.
    let (_, _, body) = get(
        &hub.url(),
        &hub.ca,
        &token,
        &format!("{list}?watch=1&resourceVersion={first}&timeoutSeconds=1"),
        &[],
    );
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("\"code\":410"),
        "{}",
        &text[..text.len().min(300)]
    );

    // A hundred selectors of their own, then limits larger than the list.
    for i in 0..100 {
        let path = format!("{list}?labelSelector=x%21%3D{i}");
        assert_eq!(get(&hub.url(), &hub.ca, &token, &path, &[]).0, 200);
    }
    let renders = &status(&hub, &scraper)["renders"];
    eprintln!("renders after 100 selectors: {renders}");
    assert!(renders["bytes"].as_u64().unwrap() <= 64 << 20, "{renders}");
    assert!(renders["kept"].as_u64().unwrap() <= 64, "{renders}");
    // A limit the whole list fits in is the list: rendered once, for every such client.
    let made = || status(&hub, &scraper)["renders"]["made"].as_u64().unwrap();
    let before = made();
    for limit in [100_000, 2, 100, 100_000] {
        let path = format!("{list}?labelSelector=x%21%3D999&limit={limit}");
        let (code, _, body) = get(&hub.url(), &hub.ca, &token, &path, &[]);
        assert_eq!(code, 200);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert!(
            v["metadata"].get("continue").is_none(),
            "one item: no continue"
        );
    }
    assert_eq!(
        made(),
        before + 1,
        "one render for four limits the list fits in"
    );
}
