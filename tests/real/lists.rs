//! Lists against the real apiserver: every list mode, paging with a continue token that
//! expires, a forbidden namespace, a role with `list` but no `get`.

use std::time::Duration;

use serde_json::{Value, json};
use test_apiserver::real::{RealApiserver, User};

use super::*;
use crate::util::{Cmpoll, Daemon, SOON, eventually, kinds};

/// `list` in every `--list-mode`, then `run` in each: a change, a label edit that changes
/// nothing, a deletion, with the real apiserver's word that every list came from the
/// watch cache (etcd saw no list of ConfigMaps while cmpoll polled).
#[test]
fn list_and_run_in_every_list_mode_from_the_watch_cache() {
    let Some((_one, k)) = cluster() else { return };
    let mark = k.audit_mark();
    let ns = k.namespace("modes");
    let token = account(k, &ns, "poller", None);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    k.put_configmap(&ns, "b", &[LABEL], &[("k", "2")]);
    k.put_configmap(&ns, "unlabelled", &[], &[("k", "x")]);
    let cmpoll = || cmpoll_as(k, &format!("{ns}-poller"), &User::Token(token.clone()));
    let c = cmpoll();
    let user = format!("system:serviceaccount:{ns}:poller");
    for mode in ["auto", "full", "metadata"] {
        let run = c
            .with_args(&["list", "--json", "--namespace", &ns, "--list-mode", mode])
            .run()
            .success();
        assert_eq!(
            run.modules(),
            [format!("{ns}/a"), format!("{ns}/b")],
            "{mode}"
        );
        assert_eq!(run.json()[0]["files"]["k"], "1");
    }
    for mode in ["auto", "full", "metadata"] {
        // etcd's lists are counted for the whole apiserver, its own included: an attempt
        // in which its cache refilled itself from etcd says nothing, and one in which etcd
        // served a list the apiserver's own do not explain counts against cmpoll; the
        // mode passes at the first clean attempt, and fails after three that were not
        // (cmpoll listing from etcd is never clean).
        let mut unclean = Vec::new();
        while unclean.len() < 3 {
            let before = storage_lists(k);
            let cmpolls = poll_in_mode(k, (mark, &ns, &user), mode, &cmpoll);
            let after = storage_lists(k);
            assert!(
                after.cache - before.cache >= cmpolls as f64,
                "{mode}: {} cache lists for {cmpolls} of cmpoll's",
                after.cache - before.cache,
            );
            let n = before.unexplained_since(&after);
            if n == Some(0.0) {
                break;
            }
            unclean.push((n, before, after));
        }
        assert!(
            unclean.len() < 3,
            "{mode}: a list of ConfigMaps was not served from the watch cache (None: the \
             cache refilled meanwhile): {unclean:?}"
        );
    }
}

/// `run` in `mode` against `ns` (its lists audited since `mark` as `user`'s): a change, a
/// label edit that changes nothing, a deletion, every list routed as SPEC says; the lists
/// cmpoll made. Puts `a` and `b` back as they were.
fn poll_in_mode(
    k: &RealApiserver,
    (mark, ns, user): (u64, &str, &str),
    mode: &str,
    cmpoll: &dyn Fn() -> Cmpoll,
) -> usize {
    let seen = requests(k, mark, user, ns).len();
    let d = Daemon::start(
        cmpoll().env("RUST_LOG", "debug"),
        &[
            "--namespace",
            ns,
            "--list-mode",
            mode,
            "--interval",
            "200ms",
        ],
    );
    let first = d.batch(SOON);
    assert_eq!(kinds(&first).len(), 3, "{mode}: {:?}", kinds(&first));
    // A change.
    k.put_configmap(ns, "a", &[LABEL], &[("k", &format!("changed-{mode}"))]);
    let b = d.batch(SOON);
    assert_eq!(
        kinds(&b)[0],
        ("updated", format!("{ns}/a").as_str()),
        "{mode}"
    );
    assert_eq!(b[0]["files"]["k"], format!("changed-{mode}"));
    // A label edit changes the resourceVersion, not the module: nothing, as two more
    // lists prove.
    k.put_configmap(ns, "b", &[LABEL, ("team", mode)], &[("k", "2")]);
    let lists = |k: &RealApiserver| {
        requests(k, mark, user, ns)
            .iter()
            .filter(|e| e["verb"] == "list")
            .count()
    };
    let at = lists(k);
    eventually("two more lists", SOON, || lists(k) >= at + 2);
    // A deletion.
    k.delete("configmap", ns, "b");
    let b = d.batch(SOON);
    assert_eq!(
        kinds(&b)[0],
        ("removed", format!("{ns}/b").as_str()),
        "{mode}: the label edit was no event"
    );
    // The last one: the list selects nothing (a metadata list then says `"items":null`).
    k.delete("configmap", ns, "a");
    let b = d.batch(SOON);
    assert_eq!(
        kinds(&b),
        [("removed", format!("{ns}/a").as_str()), ("synced", "")],
        "{mode}\n{}",
        d.stderr()
    );
    // Metadata lists came in protobuf, as asked (client-go's metadata client's Accept),
    // never in JSON; full lists in JSON.
    let log = d.stderr();
    let said = |what: &str| log.lines().filter(|l| l.ends_with(what)).count();
    let (proto, json) = (
        said("PartialObjectMetadataList in protobuf"),
        said("PartialObjectMetadataList in JSON"),
    );
    match mode {
        "full" => assert_eq!(proto, 0, "{log}"),
        _ => assert!(proto >= 3 && json == 0, "{mode}: {proto} {json}\n{log}"),
    }
    assert!(said("ConfigMapList in JSON") >= 1, "{mode}\n{log}");
    d.stop();
    k.put_configmap(ns, "a", &[LABEL], &[("k", "1")]);
    k.put_configmap(ns, "b", &[LABEL], &[("k", "2")]);
    // What the real apiserver served: every list from the cache, with the routing
    // SPEC promises (the first at resourceVersion=0, the rest NotOlderThan).
    let served: Vec<Value> = requests(k, mark, user, ns).split_off(seen);
    let lists: Vec<&Value> = served.iter().filter(|e| e["verb"] == "list").collect();
    assert!(lists.len() >= 4, "{mode}: {:?}", show(&served));
    let uri = |e: &Value| e["requestURI"].as_str().unwrap_or("").to_string();
    assert!(
        uri(lists[0]).contains("resourceVersion=0"),
        "{}",
        uri(lists[0])
    );
    for l in &lists[1..] {
        assert!(
            uri(l).contains("resourceVersionMatch=NotOlderThan"),
            "{mode}: {}",
            uri(l)
        );
    }
    let gets = served.iter().filter(|e| e["verb"] == "get").count();
    match mode {
        "full" => assert_eq!(gets, 0, "{:?}", show(&served)),
        _ => assert!(
            gets >= 1,
            "{mode}: the change was fetched: {:?}",
            show(&served)
        ),
    }
    assert!(
        served.iter().all(|e| e["responseStatus"]["code"] == 200),
        "{:?}",
        show(&served)
    );
    lists.len()
}

/// A TCP relay to `port` on loopback that holds each chunk a client sends for `delay`: a
/// slow network, so that a paged list takes long enough for the apiserver to compact
/// under it.
fn slow_relay(port: u16, delay: Duration) -> u16 {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16384];
                while let Ok(n) = client.read(&mut buf) {
                    if n == 0 || {
                        std::thread::sleep(delay);
                        server.write_all(&buf[..n]).is_err()
                    } {
                        break;
                    }
                }
                let _ = server.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    relay
}

/// `--page-size` pages with `limit`/`continue` across a namespace large enough to page;
/// a continue token that expires mid-list (etcd compacted, as the apiserver's own
/// compactor does it, which the watch cache follows within 15 s) makes cmpoll list once
/// more unpaged — never a mix, never a failed poll — and the real apiserver's 410 is what
/// it answered.
#[test]
fn pages_and_a_continue_token_that_expires_mid_list() {
    let Some((_one, k)) = cluster() else { return };
    let mark = k.audit_mark();
    let ns = k.namespace("pages");
    let token = account(k, &ns, "pager", None);
    let mut manifests = Vec::new();
    for i in 0..100 {
        manifests.push(format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"m{i:03}","namespace":"{ns}","labels":{{"cmpoll.io/module":"true"}}}},"data":{{"k":"{i}"}}}}"#
        ));
    }
    k.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
        manifests.join(",")
    ));
    let user = format!("system:serviceaccount:{ns}:pager");
    let c = cmpoll_as(k, &format!("{ns}-pager"), &User::Token(token.clone()));
    let run = c
        .with_args(&["list", "--json", "--namespace", &ns, "--page-size", "7"])
        .run()
        .success();
    assert_eq!(run.modules().len(), 100);
    let pages: Vec<Value> = requests(k, mark, &user, &ns);
    assert_eq!(pages.len(), 15, "{:?}", show(&pages));
    assert!(show(&pages)[1].contains("continue="), "{:?}", show(&pages));
    // One page per 200 ms: a list of 100 pages spans the watch cache's next look at the
    // compaction (every 15 s).
    let relay = slow_relay(k.port, Duration::from_millis(200));
    let slow = Cmpoll::new();
    let kubeconfig = k.write_kubeconfig(&format!("{ns}-slow.kubeconfig"), &User::Token(token));
    let text = std::fs::read_to_string(&kubeconfig)
        .unwrap()
        .replace(&k.url, &format!("https://127.0.0.1:{relay}"));
    std::fs::write(&kubeconfig, text).unwrap();
    let slow = slow.env("KUBECONFIG", kubeconfig.to_str().unwrap());
    let seen = requests(k, mark, &user, &ns).len();
    let scope = ns.clone();
    let list = std::thread::spawn(move || {
        slow.with_args(&[
            "list",
            "--json",
            "--namespace",
            &scope,
            "--page-size",
            "1",
            "--timeout",
            "30s",
        ])
        .run()
    });
    std::thread::sleep(Duration::from_secs(2));
    k.put_configmap(&ns, "bump", &[], &[("k", "1")]);
    k.compact();
    let run = list.join().unwrap().success();
    assert_eq!(run.modules().len(), 100, "{}", run.stderr);
    assert!(
        run.stderr.contains("again in one unpaged request"),
        "{}",
        run.stderr
    );
    let served: Vec<Value> = requests(k, mark, &user, &ns).split_off(seen);
    let at = served
        .iter()
        .position(|e| e["responseStatus"]["code"] == 410)
        .unwrap_or_else(|| panic!("no 410: {:?}", show(&served)));
    assert!(
        show(&served)[at].contains("continue="),
        "{}",
        show(&served)[at]
    );
    let after: Vec<String> = show(&served[at + 1..]);
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(
        !after[0].contains("limit=") && after[0].ends_with(" 200"),
        "{after:?}"
    );
}

/// `--namespace` with a namespaced Role: the allowed namespace lists; a forbidden one fails
/// the poll with the real apiserver's words, naming the namespace.
#[test]
fn a_forbidden_namespace_fails_with_the_apiservers_words() {
    let Some((_one, k)) = cluster() else { return };
    let mark = k.audit_mark();
    let ns = k.namespace("allowed");
    let other = k.namespace("forbidden");
    let token = account(k, &ns, "scoped", None);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    let c = cmpoll_as(k, &format!("{ns}-scoped"), &User::Token(token));
    c.with_args(&["list", "--namespace", &ns]).run().success();
    let run = c
        .with_args(&["list", "--namespace", &ns, "--namespace", &other])
        .run()
        .failure(1);
    let want = format!(
        "apiserver refused to list configmaps in namespace \"{other}\": 403 Forbidden: configmaps is forbidden: User \"system:serviceaccount:{ns}:scoped\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"{other}\""
    );
    assert_eq!(run.error_line(), want);
    let audit = k.audit_since(mark);
    let refused = audit.iter().rev().find(|e| {
        e["objectRef"]["namespace"] == other.as_str()
            && e["user"]["username"] == format!("system:serviceaccount:{ns}:scoped")
    });
    assert_eq!(refused.unwrap()["responseStatus"]["code"], 403);
    assert_eq!(run.stdout, "", "nothing printed for a failed poll");
}

/// A Role with `list` but not `get`: `auto` falls back to full lists with one warning,
/// `metadata` fails the poll on the 403, `full` never GETs.
#[test]
fn a_list_only_role_auto_falls_back_metadata_fails_full_never_gets() {
    let Some((_one, k)) = cluster() else { return };
    let mark = k.audit_mark();
    let ns = k.namespace("listonly");
    // The shipped rules less `get`.
    let mut rules = shipped_rules();
    rules[0]["verbs"] = json!(["list"]);
    assert_eq!(rules.as_array().unwrap().len(), 1, "{rules}");
    let token = account(k, &ns, "lister", Some(rules));
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    let user = format!("system:serviceaccount:{ns}:lister");
    let c = || cmpoll_as(k, &format!("{ns}-lister"), &User::Token(token.clone()));
    for mode in ["auto", "metadata", "full"] {
        let seen = requests(k, mark, &user, &ns).len();
        let d = Daemon::start(
            c(),
            &[
                "--namespace",
                &ns,
                "--list-mode",
                mode,
                "--interval",
                "100ms",
            ],
        );
        d.batch(SOON);
        k.put_configmap(&ns, "a", &[LABEL], &[("k", mode)]);
        match mode {
            "metadata" => {
                eventually("the poll to fail on the GET", SOON, || {
                    d.stderr().contains(&format!(
                        "apiserver refused to get configmap {ns}/a: 403 Forbidden: configmaps \"a\" is forbidden: User \"{user}\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"{ns}\""
                    ))
                });
            }
            _ => {
                let b = d.batch(SOON);
                assert_eq!(b[0]["files"]["k"], mode, "{mode}");
            }
        }
        d.stop();
        let served = requests(k, mark, &user, &ns).split_off(seen);
        let gets: Vec<&Value> = served.iter().filter(|e| e["verb"] == "get").collect();
        match mode {
            "auto" => {
                assert_eq!(gets.len(), 1, "one GET, refused: {:?}", show(&served));
                assert_eq!(gets[0]["responseStatus"]["code"], 403);
            }
            "metadata" => assert!(gets.iter().all(|g| g["responseStatus"]["code"] == 403)),
            _ => assert!(gets.is_empty(), "{:?}", show(&served)),
        }
    }
}
