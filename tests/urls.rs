//! `--fetch-url-keys` (k8s-sidecar's `.url` keys), with the real binary against a web
//! server of the test's own: fetched on add and update only, written without the suffix,
//! a failed fetch a rejection that keeps the last good version, redirects followed without
//! credentials to another origin.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use test_apiserver::TestApiserver;

use crate::util::http::{Page, web_server};
use crate::util::{Cmpoll, Daemon, SOON, labelled, map, tree};

/// The pages: `/a.json` (its body changes with `version`), `/logo.png` bytes, `/missing`
/// 404, `/moved` a redirect to `/a.json`, `/secured` needing `user1:pw`, `/big` 100 KiB.
fn site(
    version: Arc<Mutex<u32>>,
    other: String,
) -> impl Fn(&str, &BTreeMap<String, String>) -> Page {
    move |path, headers| {
        let ok = |b: &[u8]| (200, vec![], b.to_vec());
        match path {
            "/a.json" => ok(format!("{{\"v\":{}}}", version.lock().unwrap()).as_bytes()),
            "/logo.png" => ok(&[0x89, b'P', b'N', b'G', 0, 255]),
            "/moved" => (302, vec![("Location".into(), "/a.json".into())], vec![]),
            "/away" => (
                302,
                vec![("Location".into(), format!("{other}/echo"))],
                vec![],
            ),
            // printf user1:pw | base64
            "/secured"
                if headers.get("authorization").map(String::as_str)
                    == Some("Basic dXNlcjE6cHc=") =>
            {
                ok(b"allowed")
            }
            "/secured" => (401, vec![], b"no".to_vec()),
            "/big" => ok(&vec![b'x'; 100 * 1024]),
            _ => (404, vec![], b"not found".to_vec()),
        }
    }
}

#[test]
fn url_keys_are_fetched_on_add_and_update_and_a_failure_keeps_the_last_good_version() {
    let (other, other_calls) = web_server(|_, _| (200, vec![], b"elsewhere".to_vec()));
    let version = Arc::new(Mutex::new(1));
    let (base, calls) = web_server(site(version.clone(), other));
    let s = TestApiserver::start();
    s.put(
        labelled("mon", "dash")
            .data("a.json.url", &format!(" {base}/a.json\n"))
            .data("moved.json.url", &format!("{base}/moved"))
            .data("plain.txt", "as is")
            .binary("logo.png.url", format!("{base}/logo.png").as_bytes()),
    );
    s.put(labelled("mon", "secured").data(
        "s.txt.url",
        &format!("http://user1:pw@{}/secured", &base[7..]),
    ));
    s.put(
        labelled("mon", "away").data("e.txt.url", &format!("http://user1:pw@{}/away", &base[7..])),
    );
    let c = Cmpoll::against(&s);
    let out = c.out();
    let dir = out.to_str().unwrap().to_string();
    let d = Daemon::start(
        c,
        &[
            "--out-dir",
            &dir,
            "--layout",
            "flat",
            "--fetch-url-keys",
            "--interval",
            "50ms",
            "--max-response-bytes",
            "64KiB",
            "--stdout-events",
        ],
    );
    let first = d.batch(SOON);
    assert_eq!(first.len(), 4, "{first:?}");
    let mut want = map(&[
        ("a.json", "{\"v\":1}"),
        ("moved.json", "{\"v\":1}"),
        ("plain.txt", "as is"),
        ("s.txt", "allowed"),
        ("e.txt", "elsewhere"),
    ]);
    let mut got = tree(&out);
    assert_eq!(
        std::fs::read(out.join("logo.png")).unwrap(),
        [0x89, b'P', b'N', b'G', 0, 255]
    );
    got.remove("logo.png");
    assert_eq!(got, want);
    // The event shows what was delivered; the hash covers the URLs.
    let dash = first.iter().find(|e| e["module"] == "mon/dash").unwrap();
    assert_eq!(dash["files"]["a.json"], "{\"v\":1}");
    assert!(dash["files"].get("a.json.url").is_none());
    // Credentials never followed the redirect to another origin.
    let away = other_calls.lock().unwrap();
    assert_eq!(away.len(), 1);
    assert!(!away[0].1.contains_key("authorization"), "{away:?}");
    drop(away);
    // Polls without changes fetch nothing, though the body behind the URL changed.
    *version.lock().unwrap() = 2;
    let fetched = calls.lock().unwrap().len();
    d.quiet_through(&s, 3, 1);
    assert_eq!(
        calls.lock().unwrap().len(),
        fetched,
        "no fetch without a change"
    );
    // An update fetches again.
    s.put(
        labelled("mon", "dash")
            .data("a.json.url", &format!("{base}/a.json"))
            .data("plain.txt", "changed"),
    );
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "updated");
    want.insert("a.json".into(), "{\"v\":2}".into());
    want.insert("plain.txt".into(), "changed".into());
    want.remove("moved.json");
    assert_eq!(
        tree(&out),
        want,
        "logo.png and moved.json went with the update"
    );
    // A failed fetch (404, too large) rejects the module; it keeps its last good version.
    s.put(labelled("mon", "dash").data("a.json.url", &format!("{base}/missing?token=s3cret")));
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "rejected");
    let reason = b[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("404") && reason.contains(&format!("{base}/missing")),
        "{reason}"
    );
    assert!(
        !reason.contains("s3cret"),
        "no query in the reason: {reason}"
    );
    assert_eq!(tree(&out), want);
    s.put(labelled("mon", "dash").data("a.json.url", &format!("{base}/big")));
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "rejected");
    assert!(
        b[0]["reason"]
            .as_str()
            .unwrap()
            .contains("--max-response-bytes"),
        "{}",
        b[0]
    );
    assert_eq!(tree(&out), want);
    d.stop();
}
