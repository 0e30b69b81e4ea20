//! cmpoll against the real kube-apiserver (issue 24): the apiserver-facing scenarios of the
//! suite, each checked against what the real apiserver says it served (its metrics and its
//! audit log), not only against what cmpoll printed. One cluster per test binary
//! (`test_apiserver::real::shared`); each test works in namespaces of its own.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use test_apiserver::real::{self, RealApiserver, User};

use crate::util::{Cmpoll, Daemon, KillOnDrop, SOON, eventually, kinds, skip_unless};

const LABEL: (&str, &str) = ("cmpoll.io/module", "true");

/// The shared real cluster, or `None` (a loud skip; a failure under CI) when it is not
/// built. The guard keeps the tests that use it one at a time: they read the apiserver's
/// own counters, which every client moves.
fn cluster() -> Option<(MutexGuard<'static, ()>, &'static RealApiserver)> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    if skip_unless(
        real::built(),
        "the real kube-apiserver (tests/kube/build.sh)",
    ) {
        return None;
    }
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    Some((guard, real::shared()))
}

/// A cmpoll whose kubeconfig is `user`'s.
fn cmpoll_as(k: &RealApiserver, name: &str, user: &User) -> Cmpoll {
    let c = Cmpoll::new();
    let kubeconfig = k.write_kubeconfig(&format!("{name}.kubeconfig"), user);
    c.env("KUBECONFIG", kubeconfig.to_str().unwrap())
}

/// The rules the shipped ClusterRole grants (`k8s/cluster-wide/clusterrole.yaml`): the
/// scenarios run cmpoll with exactly those, unless they test a narrower role.
fn shipped_rules() -> Value {
    let path = crate::util::root().join("k8s/cluster-wide/clusterrole.yaml");
    let role: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(role["rules"].is_array(), "{role}");
    role["rules"].clone()
}

/// A service account in `ns` with a Role there of `rules` (`None`: the shipped ones); its
/// bound token.
fn account(k: &RealApiserver, ns: &str, name: &str, rules: Option<Value>) -> String {
    let rules = rules.unwrap_or_else(shipped_rules);
    k.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": name, "namespace": ns}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": name, "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}]})
        .to_string(),
    );
    k.token(ns, name, "1h")
}

/// The audit events since `mark` of requests by `user` to `ns`'s ConfigMaps, in order.
fn requests(k: &RealApiserver, mark: u64, user: &str, ns: &str) -> Vec<Value> {
    k.audit_since(mark)
        .into_iter()
        .filter(|e| e["user"]["username"] == user && e["stage"] == "ResponseComplete")
        .filter(|e| e["objectRef"]["namespace"] == ns && e["objectRef"]["resource"] == "configmaps")
        .collect()
}

/// `verb uri code` of audit events, for messages.
fn show(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e["verb"].as_str().unwrap_or(""),
                e["requestURI"].as_str().unwrap_or(""),
                e["responseStatus"]["code"]
            )
        })
        .collect()
}

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
        let before = storage_lists(k);
        let seen = requests(k, mark, &user, &ns).len();
        let d = Daemon::start(
            cmpoll(),
            &[
                "--namespace",
                &ns,
                "--list-mode",
                mode,
                "--interval",
                "200ms",
            ],
        );
        let first = d.batch(SOON);
        assert_eq!(kinds(&first).len(), 3, "{mode}: {:?}", kinds(&first));
        // A change.
        k.put_configmap(&ns, "a", &[LABEL], &[("k", &format!("changed-{mode}"))]);
        let b = d.batch(SOON);
        assert_eq!(
            kinds(&b)[0],
            ("updated", format!("{ns}/a").as_str()),
            "{mode}"
        );
        assert_eq!(b[0]["files"]["k"], format!("changed-{mode}"));
        // A label edit changes the resourceVersion, not the module: nothing, as two more
        // lists prove.
        k.put_configmap(&ns, "b", &[LABEL, ("team", mode)], &[("k", "2")]);
        let lists = |k: &RealApiserver| {
            requests(k, mark, &user, &ns)
                .iter()
                .filter(|e| e["verb"] == "list")
                .count()
        };
        let at = lists(k);
        eventually("two more lists", SOON, || lists(k) >= at + 2);
        // A deletion.
        k.delete("configmap", &ns, "b");
        let b = d.batch(SOON);
        assert_eq!(
            kinds(&b)[0],
            ("removed", format!("{ns}/b").as_str()),
            "{mode}: the label edit was no event"
        );
        // The last one: the list selects nothing (a metadata list then says `"items":null`).
        k.delete("configmap", &ns, "a");
        let b = d.batch(SOON);
        assert_eq!(
            kinds(&b),
            [("removed", format!("{ns}/a").as_str()), ("synced", "")],
            "{mode}\n{}",
            d.stderr()
        );
        d.stop();
        k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
        k.put_configmap(&ns, "b", &[LABEL], &[("k", "2")]);
        // What the real apiserver served: every list from the cache, with the routing
        // SPEC promises (the first at resourceVersion=0, the rest NotOlderThan).
        let served: Vec<Value> = requests(k, mark, &user, &ns).split_off(seen);
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
        let after = storage_lists(k);
        assert_eq!(
            after.1, before.1,
            "{mode}: a list of ConfigMaps was not served from the watch cache"
        );
        assert!(
            after.0 - before.0 >= lists.len() as f64,
            "{mode}: {} cache lists for {} of cmpoll's",
            after.0 - before.0,
            lists.len()
        );
    }
}

/// Lists by storage: (from the watch cache, from anywhere else), as the real apiserver
/// counts them (`apiserver_storage_list_total{resource="configmaps"}`).
fn storage_lists(k: &RealApiserver) -> (f64, f64) {
    let text = k.metrics();
    let all = real::metric_sum(
        &text,
        "apiserver_storage_list_total",
        &[("resource", "configmaps")],
    );
    let cache = real::metric_sum(
        &text,
        "apiserver_storage_list_total",
        &[("resource", "configmaps"), ("storage", "watchcache")],
    );
    (cache, all - cache)
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
    let port: u16 = k.url.rsplit(':').next().unwrap().parse().unwrap();
    let relay = slow_relay(port, Duration::from_millis(200));
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

/// In-cluster: the real bound token and CA file of a service account; the token file
/// replaced by a new TokenRequest while cmpoll runs, and the apiserver sees the new one.
#[test]
fn in_cluster_with_a_bound_token_that_rotates() {
    let Some((_one, k)) = cluster() else { return };
    let mark = k.audit_mark();
    let ns = k.namespace("incluster");
    let first = account(k, &ns, "pod", None);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    let c = Cmpoll::new();
    c.write("sa/token", &first);
    c.write("sa/ca.crt", &k.ca_pem());
    c.write("sa/namespace", &ns);
    let sa = c.path("sa");
    let port = k.url.rsplit(':').next().unwrap().to_string();
    let c = c
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", &port)
        .env("CMPOLL_SERVICE_ACCOUNT_DIR", sa.to_str().unwrap());
    let user = format!("system:serviceaccount:{ns}:pod");
    let jti =
        |e: &Value| e["user"]["extra"]["authentication.kubernetes.io/credential-id"][0].clone();
    let d = Daemon::start(c, &["--namespace-from-context", "--interval", "100ms"]);
    d.batch(SOON);
    let before = requests(k, mark, &user, &ns);
    let old = jti(before.last().unwrap());
    assert!(old.as_str().unwrap().starts_with("JTI="), "{old}");
    // The kubelet's rotation: a new token, written by rename.
    let second = k.token(&ns, "pod", "1h");
    std::fs::write(sa.join("token.new"), &second).unwrap();
    std::fs::rename(sa.join("token.new"), sa.join("token")).unwrap();
    eventually("a request with the new token", SOON, || {
        requests(k, mark, &user, &ns)
            .iter()
            .any(|e| jti(e) != old && e["responseStatus"]["code"] == 200)
    });
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "2")]);
    assert_eq!(d.batch(SOON)[0]["files"]["k"], "2");
    d.stop();
}

/// A credential the apiserver rejects: the 401 re-runs the exec plugin and the request is
/// made once more, with the new credential; a plugin that keeps giving a bad one fails
/// after that one retry.
#[test]
fn a_401_refreshes_the_credential_and_retries_once() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("retry");
    let good = account(k, &ns, "exec", None);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    let c = Cmpoll::new();
    // The first run hands out a token the apiserver does not know, later runs the good one.
    let runs = c.path("runs");
    let plugin = c.write(
        "plugin.sh",
        &format!(
            "#!/bin/sh\necho x >> '{}'\nif [ \"$(wc -l < '{}')\" -eq 1 ]; then t=not-a-token; else t={good}; fi\nprintf '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"%s\"}}}}' \"$t\"\n",
            runs.display(),
            runs.display()
        ),
    );
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let exec = format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {}\n      interactiveMode: Never\n",
        plugin.display()
    );
    let kubeconfig = k.write_kubeconfig(&format!("{ns}-exec.kubeconfig"), &User::Raw(exec));
    let c = c.env("KUBECONFIG", kubeconfig.to_str().unwrap());
    let before = k.audit_mark();
    let run = c
        .with_args(&["list", "--json", "--namespace", &ns])
        .run()
        .success();
    assert_eq!(run.modules(), [format!("{ns}/a")]);
    assert_eq!(std::fs::read_to_string(&runs).unwrap().lines().count(), 2);
    let lists: Vec<Value> = k
        .audit_since(before)
        .iter()
        .filter(|e| e["objectRef"]["namespace"] == ns.as_str() && e["verb"] == "list")
        .cloned()
        .collect();
    let codes: Vec<i64> = lists
        .iter()
        .map(|e| e["responseStatus"]["code"].as_i64().unwrap())
        .collect();
    assert_eq!(codes, [401, 200], "{:?}", show(&lists));
    // Always a bad token: one retry, then the poll fails with the 401.
    std::fs::write(&runs, "").unwrap();
    let bad = format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: sh\n      args: [\"-c\", \"echo x >> '{}'; echo '{{\\\"apiVersion\\\":\\\"client.authentication.k8s.io/v1\\\",\\\"kind\\\":\\\"ExecCredential\\\",\\\"status\\\":{{\\\"token\\\":\\\"bad\\\"}}}}'\"]\n      interactiveMode: Never\n",
        runs.display()
    );
    let kubeconfig = k.write_kubeconfig(&format!("{ns}-bad.kubeconfig"), &User::Raw(bad));
    let run = Cmpoll::new()
        .env("KUBECONFIG", kubeconfig.to_str().unwrap())
        .args(&["list", "--namespace", &ns])
        .run()
        .failure(1);
    assert!(
        run.error_line().contains("401 Unauthorized"),
        "{}",
        run.described
    );
    assert_eq!(std::fs::read_to_string(&runs).unwrap().lines().count(), 2);
}

/// Kubeconfigs the way users have them, each accepted by the real apiserver as the user
/// it names: a client certificate, a token, an exec plugin that calls the real
/// `kubectl create token`.
#[test]
fn kubeconfigs_with_a_certificate_a_token_and_an_exec_plugin() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("creds");
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    let token = account(k, &ns, "tok", None);
    // A user by certificate, granted by a RoleBinding to that user name.
    k.apply(&format!(
        r#"{{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{{"name":"cert-user","namespace":"{ns}"}},
 "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"tok"}},
 "subjects":[{{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"cert-user"}}]}}"#
    ));
    let cert = k.client_cert("cert-user", None);
    let kubectl = real::bin_dir().join("kubectl");
    let exec = format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: sh\n      args: [\"-c\", \"t=$('{}' --kubeconfig '{}' create token tok -n {ns}); printf '{{\\\"apiVersion\\\":\\\"client.authentication.k8s.io/v1\\\",\\\"kind\\\":\\\"ExecCredential\\\",\\\"status\\\":{{\\\"token\\\":\\\"%s\\\"}}}}' \\\"$t\\\"\"]\n      interactiveMode: Never\n",
        kubectl.display(),
        k.admin_kubeconfig().display()
    );
    for (name, user, who) in [
        ("cert", User::Cert(cert), "cert-user".to_string()),
        (
            "token",
            User::Token(token),
            format!("system:serviceaccount:{ns}:tok"),
        ),
        (
            "exec",
            User::Raw(exec),
            format!("system:serviceaccount:{ns}:tok"),
        ),
    ] {
        let before = k.audit_mark();
        let c = cmpoll_as(k, &format!("{ns}-{name}"), &user);
        let run = c
            .with_args(&["list", "--json", "--namespace", &ns])
            .run()
            .success();
        assert_eq!(run.modules(), [format!("{ns}/a")], "{name}");
        let by: Vec<String> = k
            .audit_since(before)
            .iter()
            .filter(|e| e["objectRef"]["namespace"] == ns.as_str() && e["verb"] == "list")
            .map(|e| e["user"]["username"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(by, [who], "{name}");
    }
}

/// Impersonation (`as`, `as-groups`) in a kubeconfig: the real authorizer decides as the
/// impersonated user, and the audit log names both.
#[test]
fn impersonation_is_decided_as_the_impersonated_user() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("imp");
    let other = k.namespace("imp-other");
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    account(k, &ns, "reader", None);
    // The impersonator may impersonate that service account and nothing else.
    k.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
{{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{{"name":"{ns}-impersonate"}},
 "rules":[{{"apiGroups":[""],"resources":["serviceaccounts"],"verbs":["impersonate"],"resourceNames":["reader"]}}]}},
{{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{{"name":"impersonator","namespace":"{ns}"}},
 "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"{ns}-impersonate"}},
 "subjects":[{{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"impersonator"}}]}}]}}"#
    ));
    let cert = k.client_cert("impersonator", None);
    let c = Cmpoll::new();
    let kubeconfig = k.write_kubeconfig(&format!("{ns}-imp.kubeconfig"), &User::Cert(cert.clone()));
    let text = std::fs::read_to_string(&kubeconfig).unwrap().replace(
        "    client-certificate-data",
        &format!("    as: system:serviceaccount:{ns}:reader\n    client-certificate-data"),
    );
    std::fs::write(&kubeconfig, text).unwrap();
    let c = c.env("KUBECONFIG", kubeconfig.to_str().unwrap());
    let before = k.audit_mark();
    let run = c
        .with_args(&["list", "--json", "--namespace", &ns])
        .run()
        .success();
    assert_eq!(run.modules(), [format!("{ns}/a")]);
    let run = c
        .with_args(&["list", "--namespace", &other])
        .run()
        .failure(1);
    assert!(
        run.error_line().contains(&format!(
            "User \"system:serviceaccount:{ns}:reader\" cannot list"
        )),
        "{}",
        run.described
    );
    let lists: Vec<Value> = k
        .audit_since(before)
        .iter()
        .filter(|e| e["verb"] == "list" && e["objectRef"]["resource"] == "configmaps")
        .filter(|e| e["user"]["username"] == "impersonator")
        .cloned()
        .collect();
    assert_eq!(lists.len(), 2, "{:?}", show(&lists));
    for e in &lists {
        assert_eq!(e["user"]["username"], "impersonator");
        assert_eq!(
            e["impersonatedUser"]["username"],
            format!("system:serviceaccount:{ns}:reader")
        );
    }
    // Without the right to impersonate: refused as the impersonator.
    let stranger = k.write_kubeconfig(
        &format!("{ns}-stranger.kubeconfig"),
        &User::Cert(k.client_cert("stranger", None)),
    );
    let text = std::fs::read_to_string(&stranger).unwrap().replace(
        "    client-certificate-data",
        &format!("    as: system:serviceaccount:{ns}:reader\n    client-certificate-data"),
    );
    std::fs::write(&stranger, text).unwrap();
    let run = Cmpoll::new()
        .env("KUBECONFIG", stranger.to_str().unwrap())
        .args(&["list", "--namespace", &ns])
        .run()
        .failure(1);
    assert!(
        run.error_line()
            .contains("User \"stranger\" cannot impersonate"),
        "{}",
        run.described
    );
}

/// A loop run on a thread until dropped (then stopped and joined), also when the test
/// fails: it must not load the cluster the next test uses.
struct Hammer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hammer {
    fn start(mut round: impl FnMut() + Send + 'static) -> Hammer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                round();
            }
        });
        Hammer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Hammer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// When an audit event's request arrived.
fn received(e: &Value) -> std::time::SystemTime {
    humantime::parse_rfc3339(e["requestReceivedTimestamp"].as_str().unwrap()).unwrap()
}

/// Flow control as the real apiserver does it: a PriorityLevelConfiguration with no
/// seats of its own (`Reject`) and a FlowSchema that puts cmpoll's service account there.
/// While one slow request holds the one request such a level still admits, every other
/// request of that account is rejected with 429 and APF's own Retry-After, which grows
/// while the rejections go on. cmpoll's next attempt waits at least that long — longer
/// than its own backoff (1 s) would — and it recovers when the level has room again.
#[test]
fn flow_control_429s_retry_after_is_a_floor_for_the_next_poll() {
    use std::time::{Instant, SystemTime};
    if skip_unless(
        std::process::Command::new("curl")
            .arg("--version")
            .output()
            .is_ok(),
        "curl",
    ) {
        return;
    }
    let Some((_one, k)) = cluster() else { return };
    let mark = k.audit_mark();
    let ns = k.namespace("apf");
    let token = account(k, &ns, "jailed", None);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    // 20 MB of ConfigMaps that are not modules: an answer a slow reader makes the
    // apiserver sit on (more than the sockets' buffers hold).
    let big = "x".repeat(900_000);
    for i in 0..24 {
        k.put_configmap(&ns, &format!("big{i}"), &[], &[("k", &big)]);
    }
    k.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
{{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"PriorityLevelConfiguration","metadata":{{"name":"{ns}"}},
 "spec":{{"type":"Limited","limited":{{"nominalConcurrencyShares":0,"lendablePercent":0,"borrowingLimitPercent":0,"limitResponse":{{"type":"Reject"}}}}}}}},
{{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"FlowSchema","metadata":{{"name":"{ns}"}},
 "spec":{{"priorityLevelConfiguration":{{"name":"{ns}"}},"matchingPrecedence":500,
  "rules":[{{"subjects":[{{"kind":"ServiceAccount","serviceAccount":{{"name":"jailed","namespace":"{ns}"}}}}],
   "resourceRules":[{{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"namespaces":["*"],"clusterScope":true}}]}}]}}}}]}}"#
    ));
    let level = k.ok(&[
        "get",
        "prioritylevelconfiguration",
        &ns,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let curl = |extra: &[&str], url: &str| {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-s", "--cacert"])
            .arg(k.ca_file())
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(extra)
            .arg(format!("{}{url}", k.url));
        cmd
    };
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    eventually("the FlowSchema in effect", SOON, || {
        let out = curl(&["-o", "/dev/null", "-D", "-"], &list)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .to_lowercase()
            .contains(&format!("x-kubernetes-pf-prioritylevel-uid: {level}"))
    });
    // The slow reader holds the level's one request; everyone else of the account is
    // rejected. A hammer of rejected requests drives APF's Retry-After up.
    let _slow = KillOnDrop(
        curl(
            &["--http1.1", "--limit-rate", "2k", "-o", "/dev/null"],
            &list,
        )
        .spawn()
        .unwrap(),
    );
    let hammered: std::sync::Arc<Mutex<Vec<(SystemTime, u64)>>> = Default::default();
    let hammer = {
        let seen = hammered.clone();
        let mut args: Vec<String> = [
            "-Z",
            "--parallel-max",
            "16",
            "-w",
            "%header{retry-after}\\n",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for _ in 0..32 {
            args.extend([
                "-o".into(),
                "/dev/null".into(),
                format!("{}{list}?limit=1", k.url),
            ]);
        }
        let base = curl(&[], "");
        let program = base.get_program().to_owned();
        let mut fixed: Vec<String> = base
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        fixed.pop(); // the URL of `curl(&[], "")`
        Hammer::start(move || {
            let out = std::process::Command::new(&program)
                .args(&fixed)
                .args(&args)
                .output()
                .unwrap();
            let at = SystemTime::now();
            let mut seen = seen.lock().unwrap();
            for v in String::from_utf8_lossy(&out.stdout).lines() {
                if let Ok(v) = v.trim().parse() {
                    seen.push((at, v));
                }
            }
        })
    };
    let start = Instant::now();
    while hammered.lock().unwrap().last().is_none_or(|(_, v)| *v < 4) {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "APF's Retry-After stayed below 4"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let user = format!("system:serviceaccount:{ns}:jailed");
    let by_cmpoll = |k: &RealApiserver| -> Vec<Value> {
        requests(k, mark, &user, &ns)
            .into_iter()
            .filter(|e| e["userAgent"].as_str().unwrap_or("").starts_with("cmpoll/"))
            .collect()
    };
    let c = cmpoll_as(k, &format!("{ns}-jailed"), &User::Token(token.clone()));
    // Its own backoff would wait 1 s (the interval, no jitter).
    let d = Daemon::start(
        c,
        &["--namespace", &ns, "--interval", "1s", "--jitter", "0"],
    );
    let rejected = |got: &[Value]| got.iter().position(|e| e["responseStatus"]["code"] == 429);
    eventually(
        "a list of cmpoll's rejected, and its next attempt",
        Duration::from_secs(40),
        || {
            let got = by_cmpoll(k);
            rejected(&got).is_some_and(|i| i + 1 < got.len())
        },
    );
    let got = by_cmpoll(k);
    let i = rejected(&got).unwrap();
    let (first, next) = (received(&got[i]), received(&got[i + 1]));
    // What APF said then, as the hammer heard it around that moment.
    let around: Vec<u64> = hammered
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| {
            at.duration_since(first)
                .or_else(|e| Ok::<_, ()>(e.duration()))
                .unwrap()
                < Duration::from_millis(300)
        })
        .map(|(_, v)| *v)
        .collect();
    let retry_after = *around.iter().min().expect("the hammer heard APF then");
    let heard = format!(
        "{} answers, {}..={} s",
        around.len(),
        retry_after,
        around.iter().max().unwrap()
    );
    assert!(retry_after >= 2, "{heard}");
    let waited = next.duration_since(first).unwrap();
    assert!(
        waited >= Duration::from_secs(retry_after) - Duration::from_millis(50),
        "cmpoll came back after {waited:?}, Retry-After was {retry_after} s ({heard})\n{}",
        d.stderr()
    );
    assert!(
        d.stderr()
            .contains("429 Too Many Requests: Too many requests, please try again later."),
        "{}",
        d.stderr()
    );
    // Room again: the level gets seats, and cmpoll's next poll goes through.
    drop(hammer);
    drop(_slow);
    k.ok(&["delete", "flowschema", &ns]);
    let b = d.batch(Duration::from_secs(60));
    assert_eq!(kinds(&b)[0], ("added", format!("{ns}/a").as_str()));
    d.stop();
    k.ok(&["delete", "prioritylevelconfiguration", &ns]);
}

/// Every kustomize variant, rendered by the real kubectl of the same release, through the
/// real apiserver (each in a cluster of its own: they share the namespace `cmpoll`):
/// `apply --server-side --dry-run=server` (schemas, defaulting, admission), then applied.
/// Then cmpoll runs as the variant's own service account, with the role the variant
/// grants and the settings its Deployment gives the cmpoll container, as in the pod: the
/// apiserver answers every one of its requests (no 403), metadata lists and GETs
/// included.
#[test]
fn the_shipped_manifests_apply_and_grant_what_cmpoll_needs() {
    let Some((_one, _shared)) = cluster() else {
        return;
    };
    let root = crate::util::root();
    for (variant, resource) in [
        ("k8s", "configmaps"),
        ("k8s/alloy", "configmaps"),
        ("k8s/prometheus-namespaced", "configmaps"),
        ("k8s/prometheus-secrets", "secrets"),
    ] {
        let k = RealApiserver::start();
        let rendered = k.ok(&["kustomize", root.join(variant).to_str().unwrap()]);
        k.ok(&["create", "namespace", "cmpoll"]);
        let dry = k.ok_in(
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "-o",
                "json",
                "-f",
                "-",
            ],
            Some(&rendered),
        );
        let applied: Value = serde_json::from_str(&dry).unwrap();
        let items = applied["items"].as_array().unwrap();
        assert!(items.len() >= 8, "{variant}: {} objects", items.len());
        // Defaulted by the real apiserver: the Deployment as a kubelet would get it.
        let deployment = items
            .iter()
            .find(|o| o["kind"] == "Deployment")
            .unwrap_or_else(|| panic!("{variant}: no Deployment"));
        assert_eq!(
            deployment["spec"]["strategy"]["type"], "RollingUpdate",
            "{variant}: defaulted"
        );
        let out = k.ok_in(&["apply", "--server-side", "-f", "-"], Some(&rendered));
        assert!(out.contains("serverside-applied"), "{variant}: {out}");
        // The cmpoll container's own settings (plain values; paths are the pod's).
        let cmpoll = deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "cmpoll")
            .unwrap();
        let mut c = Cmpoll::new();
        for e in cmpoll["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap();
            let keep = [
                "CMPOLL_RESOURCE",
                "CMPOLL_SELECTOR",
                "CMPOLL_NAMESPACE",
                "CMPOLL_NAMESPACE_FROM_CONTEXT",
                "CMPOLL_KEYS",
                "CMPOLL_LIST_MODE",
            ];
            if keep.contains(&name) && e["value"].is_string() {
                c = c.env(name, e["value"].as_str().unwrap());
            }
        }
        // A key the container's --keys selects (its first glob, `*` filled in).
        let keys = cmpoll["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "CMPOLL_KEYS")
            .and_then(|e| e["value"].as_str())
            .unwrap_or("*");
        let key = keys.split(',').next().unwrap().replace('*', "team");
        // Modules where the variant looks: every namespace, or its own.
        let namespaced = variant.contains("namespaced") || variant.contains("secrets");
        let ns = if namespaced {
            "cmpoll".to_string()
        } else {
            k.namespace("team")
        };
        if resource == "secrets" {
            k.put_secret(&ns, "rules", &[LABEL], &[(key.as_str(), "groups: []")]);
        } else {
            k.put_configmap(&ns, "rules", &[LABEL], &[(key.as_str(), "groups: []")]);
        }
        let token = k.ok(&["create", "token", "cmpoll", "-n", "cmpoll"]);
        c.write("sa/token", token.trim());
        c.write("sa/ca.crt", &k.ca_pem());
        c.write("sa/namespace", "cmpoll");
        let sa = c.path("sa");
        let port = k.url.rsplit(':').next().unwrap().to_string();
        let c = c
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", &port)
            .env("CMPOLL_SERVICE_ACCOUNT_DIR", sa.to_str().unwrap());
        let mark = k.audit_mark();
        let d = Daemon::start(c, &["--interval", "100ms"]);
        let b = d.batch(SOON);
        let rules = format!("{ns}/rules");
        assert!(
            kinds(&b).contains(&("added", rules.as_str())),
            "{variant}: {:?}",
            kinds(&b)
        );
        // A change: in auto mode a metadata list and a GET, which the role must allow.
        if resource == "secrets" {
            k.put_secret(&ns, "rules", &[LABEL], &[(key.as_str(), "groups: [x]")]);
        } else {
            k.put_configmap(&ns, "rules", &[LABEL], &[(key.as_str(), "groups: [x]")]);
        }
        assert_eq!(
            kinds(&d.batch(SOON))[0],
            ("updated", rules.as_str()),
            "{variant}"
        );
        d.stop();
        let by = "system:serviceaccount:cmpoll:cmpoll";
        let served: Vec<Value> = k
            .audit_since(mark)
            .into_iter()
            .filter(|e| e["user"]["username"] == by && e["stage"] == "ResponseComplete")
            .collect();
        assert!(
            served.iter().any(|e| e["verb"] == "get"),
            "{variant}: the change was fetched: {:?}",
            show(&served)
        );
        assert!(
            served.iter().all(|e| e["responseStatus"]["code"] == 200)
                && served
                    .iter()
                    .all(|e| e["objectRef"]["resource"] == resource),
            "{variant}: {:?}",
            show(&served)
        );
    }
}

/// `k8s/admission/module-label-policy.yaml`, applied to the real apiserver: its CEL and the
/// real authenticator's groups decide. A member of `cmpoll:module-authors` may create,
/// label and change a module; anyone else may create a plain ConfigMap but not label one,
/// change a labelled one, or take the label off.
#[test]
fn the_module_label_policy_denies_and_admits_with_the_real_cel() {
    let Some((_one, _shared)) = cluster() else {
        return;
    };
    let k = RealApiserver::start();
    let policy =
        std::fs::read_to_string(crate::util::root().join("k8s/admission/module-label-policy.yaml"))
            .unwrap();
    k.ok_in(&["apply", "--server-side", "-f", "-"], Some(&policy));
    let ns = k.namespace("apps");
    k.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
{{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{{"name":"edit","namespace":"{ns}"}},
 "rules":[{{"apiGroups":[""],"resources":["configmaps"],"verbs":["create","update","patch","get","list"]}}]}},
{{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{{"name":"edit","namespace":"{ns}"}},
 "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"edit"}},
 "subjects":[{{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"author"}},
             {{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"outsider"}}]}}]}}"#
    ));
    let as_user = |name: &str, group: Option<&str>| {
        k.write_kubeconfig(
            &format!("{name}.kubeconfig"),
            &User::Cert(k.client_cert(name, group)),
        )
    };
    let author = as_user("author", Some("cmpoll:module-authors"));
    let outsider = as_user("outsider", None);
    let kubectl = |who: &std::path::Path, args: &[&str], stdin: &str| {
        let mut child = std::process::Command::new(real::bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(who)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let cm = |name: &str, labelled: bool, value: &str| {
        let labels = if labelled {
            json!({"cmpoll.io/module": "true"})
        } else {
            json!({"team": "a"})
        };
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": ns, "labels": labels},
               "data": {"k": value}})
        .to_string()
    };
    let apply = |who: &std::path::Path, body: String| {
        kubectl(
            who,
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            &body,
        )
    };
    let denied = "only members of the group cmpoll:module-authors may create or change a ConfigMap labelled cmpoll.io/module";
    // The policy takes a moment to be in force: until the outsider is refused.
    let mut n = 0;
    eventually("the policy in force", SOON, || {
        n += 1;
        let (ok, out) = apply(&outsider, cm(&format!("probe{n}"), true, "x"));
        !ok && out.contains(denied)
    });
    for (who, what, body, admitted) in [
        (
            &outsider,
            "a plain ConfigMap",
            cm("plain", false, "1"),
            true,
        ),
        (&outsider, "labelling it", cm("plain", true, "1"), false),
        (&author, "a module", cm("module", true, "1"), true),
        (
            &outsider,
            "changing the module",
            cm("module", true, "2"),
            false,
        ),
        (
            &outsider,
            "taking its label off",
            cm("module", false, "1"),
            false,
        ),
        (
            &author,
            "changing it as an author",
            cm("module", true, "3"),
            true,
        ),
        (
            &author,
            "labelling the plain one",
            cm("plain", true, "1"),
            true,
        ),
    ] {
        let (ok, out) = apply(who, body);
        assert_eq!(ok, admitted, "{what}: {out}");
        if !admitted {
            assert!(out.contains(denied), "{what}: {out}");
            assert!(
                out.contains("ValidatingAdmissionPolicy 'cmpoll-module-label'"),
                "{what}: {out}"
            );
        }
    }
    let data = k.ok(&[
        "get",
        "configmap",
        "module",
        "-n",
        &ns,
        "-o",
        "jsonpath={.data.k}",
    ]);
    assert_eq!(data, "3");
}

/// A token file whose token the apiserver stops accepting (its service account deleted
/// and made again): the 401 makes cmpoll read the file again — which the kubelet has
/// rewritten in place, size and mtime kept, so nothing but the 401 could tell — and make
/// the request once more with the new token.
#[test]
fn a_401_re_reads_the_token_file_and_retries_once() {
    let Some((_one, k)) = cluster() else { return };
    let mark = k.audit_mark();
    let ns = k.namespace("revoked");
    let first = account(k, &ns, "pod", None);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    let c = Cmpoll::new();
    let token = c.write("token", &first);
    let ca = c.write("ca.crt", &k.ca_pem());
    let c = c
        .env("CMPOLL_SERVER", &k.url)
        .env("CMPOLL_TOKEN_FILE", token.to_str().unwrap())
        .env("CMPOLL_CA_FILE", ca.to_str().unwrap());
    let user = format!("system:serviceaccount:{ns}:pod");
    // Polls only when told (SIGHUP): the apiserver caches a token's authentication for
    // 10 s after its last check, so the refusal is seen only after a quiet spell.
    let d = Daemon::start(c, &["--namespace", &ns, "--interval", "1h"]);
    d.batch(SOON);
    // The account goes and comes back: its old tokens are refused from now on.
    k.ok(&["delete", "serviceaccount", "pod", "-n", &ns]);
    k.ok(&["create", "serviceaccount", "pod", "-n", &ns]);
    let second = loop {
        let t = k.ok(&["create", "token", "pod", "-n", &ns, "--duration", "1h"]);
        if t.trim().len() == first.len() {
            break t.trim().to_string();
        }
    };
    let stamp = std::fs::metadata(&token).unwrap().modified().unwrap();
    {
        use std::io::{Seek as _, Write as _};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&token)
            .unwrap();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(second.as_bytes()).unwrap();
        f.set_modified(stamp).unwrap();
    }
    std::thread::sleep(Duration::from_secs(11));
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "2")]);
    d.signal("HUP");
    assert_eq!(d.batch(SOON)[0]["files"]["k"], "2", "{}", d.stderr());
    let by_cmpoll = |k: &RealApiserver| -> Vec<Value> {
        k.audit_since(mark)
            .into_iter()
            .filter(|e| e["objectRef"]["namespace"] == ns.as_str() && e["verb"] == "list")
            // A request refused by the authenticator is logged at ResponseStarted only.
            .filter(|e| e["stage"] == "ResponseComplete" || e["responseStatus"]["code"] == 401)
            .filter(|e| e["userAgent"].as_str().unwrap_or("").starts_with("cmpoll/"))
            .collect()
    };
    let code = |e: &Value| e["responseStatus"]["code"].as_i64().unwrap();
    let got = by_cmpoll(k);
    let at = got
        .iter()
        .position(|e| code(e) == 401)
        .unwrap_or_else(|| panic!("no 401: {:?}\n{}", show(&got), d.stderr()));
    let jti =
        |e: &Value| e["user"]["extra"]["authentication.kubernetes.io/credential-id"][0].clone();
    assert_eq!(code(&got[at + 1]), 200, "the retry: {:?}", show(&got));
    assert_ne!(jti(&got[at + 1]), jti(&got[at - 1]), "with the new token");
    assert_eq!(
        got.iter().filter(|e| code(e) == 401).count(),
        1,
        "{:?}",
        show(&got)
    );
    assert!(
        d.stderr()
            .contains("401 Unauthorized; retrying once with the renewed credential"),
        "{}",
        d.stderr()
    );
    d.stop();
    assert_eq!(user, got[at + 1]["user"]["username"].as_str().unwrap());
}
