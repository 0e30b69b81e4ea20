//! `cmpoll webhook` called by the real apiserver (issue 27): `kubectl apply` of a broken
//! rules ConfigMap denied with promtool's message on the user's terminal, a good one
//! admitted, a Secret denied without the validator's output, a validator that times out
//! failing open with a warning kubectl prints, a rotated certificate picked up; with the
//! webhook down the apply is admitted (`failurePolicy: Ignore`) and cmpoll run rejects the
//! module and tells its author in an Event. The webhook configuration is the shipped one
//! (`k8s/webhook`), pointed at a URL and limited to the test's namespace.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use test_apiserver::Pki;
use test_apiserver::real::{RealApiserver, User};

use super::*;
use crate::util::tools::{free_port, tool};
use crate::util::{Cmpoll, Daemon, SOON, eventually, root, skip_unless};

const BAD_RULE: &str = "groups:\n  - name: payments\n    rules:\n      - record: job:errors:rate5m\n        expr: sum(rate(errors_total[5m]\n";
const GOOD_RULE: &str = "groups:\n  - name: payments\n    rules:\n      - record: job:errors:rate5m\n        expr: sum(rate(errors_total[5m]))\n";

/// The shipped ValidatingWebhookConfiguration, called at `url` with `ca` and only for
/// objects in `ns`; removed when dropped (the cluster is shared).
struct Registered<'a> {
    k: &'a RealApiserver,
    name: String,
}

impl<'a> Registered<'a> {
    fn new(
        k: &'a RealApiserver,
        ns: &str,
        url: &str,
        ca: &str,
        resources: &[&str],
    ) -> Registered<'a> {
        let text =
            std::fs::read_to_string(root().join("k8s/webhook/validatingwebhookconfiguration.yaml"))
                .unwrap();
        let mut config: Value = serde_saphyr::from_str(&text).unwrap();
        let name = format!("cmpoll-webhook-{ns}");
        config["metadata"] = json!({"name": name});
        let hook = &mut config["webhooks"][0];
        assert_eq!(hook["failurePolicy"], "Ignore");
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
        hook["clientConfig"] = json!({
            "url": url,
            "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
        });
        hook["rules"][0]["resources"] = json!(resources);
        hook["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
        k.apply(&config.to_string());
        Registered { k, name }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let _ = self.k.kubectl(&[
            "delete",
            "validatingwebhookconfiguration",
            &self.name,
            "--ignore-not-found",
        ]);
    }
}

/// A serving certificate for 127.0.0.1 from a fresh CA, written into `c`'s folder.
fn serving(c: &Cmpoll, pki: &Pki) -> (PathBuf, PathBuf) {
    (
        c.write("tls/tls.crt", &pki.server.cert_pem),
        c.write("tls/tls.key", &pki.server.key_pem),
    )
}

/// `cmpoll webhook` on a free port; its URL.
fn start(c: Cmpoll, args: &[&str]) -> (Daemon, String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec!["--listen", &listen];
    all.extend_from_slice(args);
    let d = Daemon::webhook(c, &all);
    eventually("the webhook serving", SOON, || {
        d.stderr().contains("over HTTPS on")
    });
    (d, format!("https://127.0.0.1:{port}/validate"))
}

/// `kubectl apply` of a rules ConfigMap `name` in `ns` holding `rule`: (ok, stdout and
/// stderr together).
fn apply(k: &RealApiserver, ns: &str, name: &str, rule: &str) -> (bool, String) {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL.0: LABEL.1}},
        "data": {"payments.rules.yaml": rule, "owners.txt": "team-payments"}});
    let out = k.kubectl_in(&["apply", "-f", "-"], Some(&cm.to_string()));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn promtool_and_cluster() -> Option<(std::sync::MutexGuard<'static, ()>, &'static RealApiserver)> {
    if skip_unless(
        tool("promtool").is_some(),
        "promtool (Debian package prometheus)",
    ) {
        return None;
    }
    cluster()
}

/// The author's view: a broken rule is denied at `kubectl apply` with promtool's words, a
/// good one is admitted, a label edit of a module is not validated again; then the webhook
/// stops, the broken rule is admitted (fail open), and cmpoll run rejects it and records
/// the `Rejected` event with promtool's message.
#[test]
fn kubectl_apply_of_a_broken_rule_is_denied_with_promtools_message() {
    let Some((_one, k)) = promtool_and_cluster() else {
        return;
    };
    let ns = k.namespace("webhook");
    // Reviews allowed without validation are logged at debug.
    let c = Cmpoll::new().env("RUST_LOG", "info,cmpoll::webhook=debug");
    let pki = Pki::new("webhook-ca");
    let (cert, key) = serving(&c, &pki);
    let (d, url) = start(
        c,
        &[
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
            "--keys",
            "*.rules.yaml",
            "--validate",
            "promtool check rules \"$CMPOLL_MODULE_DIR\"/*",
        ],
    );
    let _hook = Registered::new(k, &ns, &url, &pki.ca_pem(), &["configmaps"]);
    let (ok, out) = apply(k, &ns, "rules", BAD_RULE);
    assert!(!ok, "denied: {out}");
    assert!(
        out.contains("admission webhook \"validate.cmpoll.io\" denied the request"),
        "{out}"
    );
    assert!(
        out.contains("unclosed left parenthesis") || out.contains("parse error"),
        "promtool's own message on the terminal: {out}"
    );
    assert!(
        k.kubectl(&["get", "configmap", "-n", &ns, "rules"])
            .status
            .code()
            != Some(0),
        "nothing was stored"
    );
    let (ok, out) = apply(k, &ns, "rules", GOOD_RULE);
    assert!(ok, "admitted: {out}");
    // A label edit leaves the module's content alone: allowed without validation.
    let before = d.stderr().matches(": allowed (").count();
    k.ok(&["label", "configmap", "-n", &ns, "rules", "team=payments"]);
    eventually("the label edit reviewed", SOON, || {
        d.stderr()
            .contains("allowed, not validated (its content is unchanged)")
    });
    assert_eq!(
        d.stderr().matches(": allowed (").count(),
        before,
        "not validated"
    );
    let metrics = {
        let out = std::process::Command::new("curl")
            .args(["-sk", &url.replace("/validate", "/metrics")])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(
        metrics.contains("cmpoll_webhook_reviews_total{result=\"denied\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cmpoll_webhook_reviews_total{result=\"allowed\"} 2"),
        "{metrics}"
    );
    // The webhook stops: the apply is admitted, and cmpoll run holds the line.
    d.stop();
    let (ok, out) = apply(k, &ns, "rules", BAD_RULE);
    assert!(ok, "fail open (failurePolicy: Ignore): {out}");
    let mut rules = shipped_rules();
    rules.as_array_mut().unwrap().push(
        json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}),
    );
    let token = account(k, &ns, "cmpoll", Some(rules));
    let run = cmpoll_as(k, &format!("{ns}-cmpoll"), &User::Token(token))
        .with_args(&[
            "run",
            "--once",
            "--namespace",
            &ns,
            "--keys",
            "*.rules.yaml",
            "--validate",
            "promtool check rules \"$CMPOLL_MODULE_DIR\"/*",
            "--report-events",
        ])
        .run();
    assert!(run.stdout.contains("\"rejected\""), "{}", run.described);
    let out = k.ok(&["events", "-n", &ns, "--for", "configmap/rules"]);
    assert!(
        out.contains("Rejected")
            && (out.contains("unclosed left parenthesis") || out.contains("parse error")),
        "kubectl events:\n{out}"
    );
}

/// A Secret's denial says the exit status only; a validator that times out is a warning
/// kubectl prints, and the object is admitted; a rotated certificate is served without a
/// restart.
#[test]
fn secrets_timeouts_and_a_rotated_certificate() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("webhook-secret");
    let c = Cmpoll::new();
    let pki = Pki::new("webhook-ca");
    let (cert, key) = serving(&c, &pki);
    let validator = c.write(
        "validate.sh",
        "case \"$(cat *)\" in *slow*) sleep 30;; *bad*) cat *; exit 4;; esac\n",
    );
    let (d, url) = start(
        c,
        &[
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
            "--resource",
            "configmaps,secrets",
            "--validate-timeout",
            "2s",
            "--validate",
            &format!("sh {}", validator.display()),
        ],
    );
    let _hook = Registered::new(k, &ns, &url, &pki.ca_pem(), &["configmaps", "secrets"]);
    let secret = |name: &str, value: &str| {
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ns, "labels": {LABEL.0: LABEL.1}},
            "stringData": {"password": value}})
        .to_string()
    };
    let out = k.kubectl_in(&["apply", "-f", "-"], Some(&secret("db", "bad-hunter2")));
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "denied");
    assert!(text.contains("validator exited with status 4"), "{text}");
    assert!(
        !text.contains("hunter2"),
        "no output of a Secret's validator: {text}"
    );
    // Too slow: admitted, with a warning on the terminal.
    let out = k.kubectl_in(&["apply", "-f", "-"], Some(&secret("slow", "slow")));
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "fail open: {text}");
    assert!(
        text.contains("Warning: cmpoll: secret/") || text.contains("Warning: cmpoll:"),
        "{text}"
    );
    assert!(text.contains("--validate-timeout 2s"), "{text}");
    // A new certificate from a new CA: the webhook serves it, so an apiserver that
    // trusts only the new CA reaches it.
    let rotated = Pki::new("webhook-ca-2");
    std::fs::write(&cert, &rotated.server.cert_pem).unwrap();
    std::fs::write(&key, &rotated.server.key_pem).unwrap();
    eventually("the new certificate", SOON, || {
        // The resolver looks at the files at handshakes: give it one.
        let _ = std::process::Command::new("curl")
            .args(["-sk", &url.replace("/validate", "/healthz")])
            .output();
        d.stderr().contains("changed: serving the new one")
    });
    drop(_hook);
    let _hook = Registered::new(k, &ns, &url, &rotated.ca_pem(), &["configmaps", "secrets"]);
    let out = k.kubectl_in(&["apply", "-f", "-"], Some(&secret("again", "bad")));
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && text.contains("validator exited with status 4"),
        "reviewed through the new certificate: {text}"
    );
    d.stop();
}

/// Records `tests/fixtures/admission/*.json` from the real apiserver (run by hand:
/// `cargo test --test tests -- --ignored record_admission_goldens`): what it sends for a
/// ConfigMap's CREATE, a label-only UPDATE, a content UPDATE, and a Secret's CREATE.
#[test]
#[ignore]
fn record_admission_goldens() {
    let Some((_one, k)) = cluster() else { return };
    let ns = k.namespace("golden");
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("recorder-ca");
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, &pki.server.cert_pem).unwrap();
    std::fs::write(&key, &pki.server.key_pem).unwrap();
    let port = free_port();
    let bodies = dir.path().join("bodies");
    std::fs::create_dir(&bodies).unwrap();
    let mut recorder = std::process::Command::new("python3")
        .arg(root().join("tests/fixtures/admission/record.py"))
        .args([
            &port.to_string(),
            cert.to_str().unwrap(),
            key.to_str().unwrap(),
        ])
        .arg(&bodies)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let url = format!("https://127.0.0.1:{port}/validate");
    let hook = Registered::new(k, &ns, &url, &pki.ca_pem(), &["configmaps", "secrets"]);
    assert!(apply(k, &ns, "rules", GOOD_RULE).0);
    k.ok(&["label", "configmap", "-n", &ns, "rules", "team=payments"]);
    assert!(apply(k, &ns, "rules", BAD_RULE).0);
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": ns, "labels": {LABEL.0: LABEL.1}},
        "stringData": {"password": "hunter2"}});
    k.ok_in(&["apply", "-f", "-"], Some(&secret.to_string()));
    drop(hook);
    let _ = recorder.kill();
    let _ = recorder.wait();
    let out = root().join("tests/fixtures/admission");
    for (n, name) in [
        (1, "create-configmap.json"),
        (2, "update-configmap-labels.json"),
        (3, "update-configmap-content.json"),
        (4, "create-secret.json"),
    ] {
        let body = std::fs::read(bodies.join(format!("{n}.json"))).unwrap();
        let pretty: Value = serde_json::from_slice(&body).unwrap();
        std::fs::write(
            out.join(name),
            serde_json::to_string_pretty(&pretty).unwrap() + "\n",
        )
        .unwrap();
    }
}

/// Issue 42.6: with `--client-ca-file`, the webhook takes only the apiserver's client
/// certificate (its AdmissionConfiguration gives every webhook one, signed by the
/// cluster's CA): `kubectl apply` of a broken rule is denied with promtool's words as
/// before, while a client without that certificate is refused in the handshake. Trusting
/// another CA, the apiserver's call fails and the apply is admitted (fail open), so the
/// certificate is what let it in.
#[test]
fn the_apiserver_gets_in_with_its_client_certificate_and_no_one_else() {
    let Some((_one, k)) = promtool_and_cluster() else {
        return;
    };
    let ns = k.namespace("webhook-mtls");
    let c = Cmpoll::new();
    let pki = Pki::new("webhook-ca");
    let (cert, key) = serving(&c, &pki);
    let cluster_ca = c.write("cluster-ca.crt", &k.ca_pem());
    let other_ca = c.write("other-ca.crt", &Pki::new("someone-else").ca_pem());
    for (client_ca, denied) in [(&cluster_ca, true), (&other_ca, false)] {
        let (d, url) = start(
            Cmpoll::new(),
            &[
                "--tls-cert-file",
                cert.to_str().unwrap(),
                "--tls-key-file",
                key.to_str().unwrap(),
                "--client-ca-file",
                client_ca.to_str().unwrap(),
                "--keys",
                "*.rules.yaml",
                "--validate",
                "promtool check rules \"$CMPOLL_MODULE_DIR\"/*",
            ],
        );
        let hook = Registered::new(k, &ns, &url, &pki.ca_pem(), &["configmaps"]);
        let name = format!("rules-{denied}");
        let (ok, out) = apply(k, &ns, &name, BAD_RULE);
        if denied {
            assert!(!ok, "denied: {out}\n{}", d.stderr());
            assert!(
                out.contains("unclosed left parenthesis") || out.contains("parse error"),
                "{out}"
            );
            // Anyone else (curl trusts the serving CA, presents no certificate) is refused a
            // review, and probes (which present none) still answer.
            let ca = c.write("serving-ca.crt", &pki.ca_pem());
            let anyone = |path: &str, data: &[&str]| {
                let out = std::process::Command::new("curl")
                    .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
                    .arg(&ca)
                    .args(data)
                    .arg(url.replace("/validate", path))
                    .output()
                    .unwrap();
                String::from_utf8(out.stdout).unwrap()
            };
            assert_eq!(anyone("/validate", &["--data-binary", "{}"]), "403");
            assert_eq!(anyone("/healthz", &[]), "200");
        } else {
            assert!(ok, "the apiserver's call failed, fail open: {out}");
            assert!(!d.stderr().contains("allowed ("), "{}", d.stderr());
        }
        drop(hook);
        d.stop();
    }
}
