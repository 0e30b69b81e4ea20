//! Credentials against the real apiserver: bound tokens rotated in cluster, 401s that
//! refresh an exec plugin or a token file, kubeconfigs, impersonation.

use std::time::Duration;

use serde_json::Value;
use test_apiserver::real::{self, RealApiserver, User};

use super::*;
use crate::util::{Cmpoll, Daemon, SOON, eventually};

/// In-cluster: the real bound token and CA file of a service account; the token file
/// replaced by a new TokenRequest while cmpoll runs, and the apiserver sees the new one.
#[test]
fn in_cluster_with_a_bound_token_that_rotates() {
    let Some((_one, k)) = cluster() else { return };
    let mark = k.audit_mark();
    let (ns, first) = namespace_with_a_module(k, "incluster", "pod");
    let (c, sa) = in_cluster(k, &first, &ns);
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
    let (ns, good) = namespace_with_a_module(k, "retry", "exec");
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

/// A token file whose token the apiserver stops accepting (its service account deleted
/// and made again): the 401 makes cmpoll read the file again — which the kubelet has
/// rewritten in place, size and mtime kept, so nothing but the 401 could tell — and make
/// the request once more with the new token.
#[test]
fn a_401_re_reads_the_token_file_and_retries_once() {
    let Some((_one, k)) = cluster() else { return };
    let mark = k.audit_mark();
    let (ns, first) = namespace_with_a_module(k, "revoked", "pod");
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
    let reader = format!("system:serviceaccount:{ns}:reader");
    let kubeconfig = impersonating(k, &format!("{ns}-imp"), cert, &reader);
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
    let stranger = impersonating(
        k,
        &format!("{ns}-stranger"),
        k.client_cert("stranger", None),
        &reader,
    );
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

/// A kubeconfig for the certificate `cert` that impersonates `user` (`as:`).
fn impersonating(
    k: &RealApiserver,
    name: &str,
    cert: test_apiserver::CertPair,
    user: &str,
) -> std::path::PathBuf {
    let kubeconfig = k.write_kubeconfig(&format!("{name}.kubeconfig"), &User::Cert(cert));
    let text = std::fs::read_to_string(&kubeconfig).unwrap().replace(
        "    client-certificate-data",
        &format!("    as: {user}\n    client-certificate-data"),
    );
    std::fs::write(&kubeconfig, text).unwrap();
    kubeconfig
}
