//! The chart's admission webhook on the real node (`webhook.enabled`, the CA given as
//! `caBundle`, promtool copied out of Prometheus's image by its init container): the
//! apiserver's admission chain calls it through its Service; a broken rule module is denied
//! at `kubectl apply` with promtool's words, a good one admitted, an unlabelled ConfigMap
//! never reviewed; then the webhook is turned off again.

use std::time::Duration;

use base64::Engine as _;

use super::{Node, eventually, root, serving_cert};

const BROKEN: &str =
    "groups:\n  - name: broken\n    rules:\n      - record: x:sum\n        expr: sum(rate(x[5m])\n";
const GOOD: &str =
    "groups:\n  - name: good\n    rules:\n      - record: x:sum\n        expr: sum(rate(x[5m]))\n";

pub fn the_webhook_reviews_in_the_admission_chain(node: &Node) {
    let (ca, crt, key) = serving_cert(
        &node.dir.join("webhook-tls"),
        &["cmpoll-webhook.cmpoll.svc"],
    );
    let (crt, key) = (crt.to_str().unwrap(), key.to_str().unwrap());
    node.kubectl(&[
        "-n",
        "cmpoll",
        "create",
        "secret",
        "tls",
        "cmpoll-webhook-tls",
        "--cert",
        crt,
        "--key",
        key,
    ]);
    let bundle = base64::engine::general_purpose::STANDARD.encode(std::fs::read(ca).unwrap());
    let set = format!(
        "webhook.enabled=true,webhook.certManager.enabled=false,webhook.failurePolicy=Fail,webhook.caBundle={bundle}"
    );
    upgrade(node, &set, "helm upgrade with the webhook");
    node.kubectl(&["create", "namespace", "rules"]);
    denies_a_broken_rule(node);
    node.try_kubectl(&["apply", "-f", "-"], Some(&module("good", true, GOOD)))
        .unwrap_or_else(|e| panic!("a good rule refused: {e}"));
    // With no webhook running (Fail), a module cannot be created: the apiserver calls; an
    // unlabelled ConfigMap can: it never calls.
    node.kubectl(&[
        "-n",
        "cmpoll",
        "scale",
        "deployment",
        "cmpoll-webhook",
        "--replicas=0",
    ]);
    let refused = eventually(
        "no webhook to answer",
        Duration::from_secs(60),
        || match node.try_kubectl(
            &["apply", "-f", "-"],
            Some(&module("unreviewed", true, GOOD)),
        ) {
            Err(e) if e.contains("failed calling webhook") => Ok(e),
            other => {
                let _ =
                    node.try_kubectl(&["-n", "rules", "delete", "configmap", "unreviewed"], None);
                Err(format!("{other:?}"))
            }
        },
    );
    assert!(refused.contains("validate.cmpoll.io"), "{refused}");
    node.try_kubectl(
        &["apply", "-f", "-"],
        Some(&module("unlabelled", false, BROKEN)),
    )
    .unwrap_or_else(|e| panic!("an unlabelled ConfigMap sent to the webhook: {e}"));
    // The webhook off again, by the chart (the steps after change modules freely); the
    // hubs' pods are not touched by it.
    upgrade(
        node,
        "webhook.enabled=false",
        "helm upgrade without the webhook",
    );
}

/// `helm upgrade` of the release with the values it has and `set`.
fn upgrade(node: &Node, set: &str, what: &str) {
    let chart = root().join("charts/cmpoll");
    let args = [
        "upgrade",
        "cmpoll",
        chart.to_str().unwrap(),
        "-n",
        "cmpoll",
        "--reuse-values",
        "--set",
        set,
        "--wait",
        "--timeout",
        "3m",
    ];
    node.helm_ok(&args, what);
}

/// A rule module in namespace `rules`, labelled as a module or not.
fn module(name: &str, labelled: bool, rules: &str) -> String {
    let labels = if labelled {
        "\n  labels: {cmpoll.io/module: 'true'}"
    } else {
        ""
    };
    let indented = rules.replace('\n', "\n    ");
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: rules{labels}\ndata:\n  team.rules.yaml: |\n    {indented}\n"
    )
}

/// `kubectl apply` of a broken rule module is denied with promtool's words, once the
/// webhook answers, and nothing is stored.
fn denies_a_broken_rule(node: &Node) {
    // Until the webhook's Service has endpoints the apiserver fails the call (Fail) or
    // admits with a warning (Ignore): neither is an answer, so wait for one.
    let denied = eventually(
        "the webhook to answer",
        Duration::from_secs(90),
        || match node.try_kubectl(&["apply", "-f", "-"], Some(&module("broken", true, BROKEN))) {
            Ok(out) => {
                node.kubectl(&["-n", "rules", "delete", "configmap", "broken"]);
                Err(format!("a broken rule admitted: {out}"))
            }
            Err(e) if e.contains("failed calling webhook") => Err(e),
            Err(e) => Ok(e),
        },
    );
    assert!(
        denied.contains("admission webhook \"validate.cmpoll.io\" denied the request"),
        "{denied}"
    );
    assert!(
        denied.contains("unclosed left parenthesis") || denied.contains("parse error"),
        "promtool's words: {denied}"
    );
    assert!(
        node.try_kubectl(&["-n", "rules", "get", "configmap", "broken"], None)
            .is_err(),
        "not stored"
    );
}

/// k8s/webhook as its kustomization tells a user without cert-manager to apply it: the
/// component beside k8s/prometheus, certificate.yaml's objects left out (an overlay's
/// `$patch: delete`: a component's resources cannot be picked), the Secret (made for the
/// chart's webhook above: the same name) and the caBundle made with openssl. Both
/// Deployments Ready under their probes, and the apiserver's admission chain denies a
/// broken rule through it; its configuration is deleted afterwards.
pub fn the_shapes_webhook_reviews_without_cert_manager(node: &Node) {
    let overlay = node.dir.join("prometheus-webhook");
    let ca = std::fs::read(node.dir.join("webhook-tls/ca.crt")).unwrap();
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let delete = |kind: &str| {
        format!(
            "  - patch: |-\n      $patch: delete\n      apiVersion: cert-manager.io/v1\n      kind: {kind}\n      metadata: {{name: cmpoll-webhook, namespace: cmpoll}}\n"
        )
    };
    let kustomization = format!(
        "resources: ['{prometheus}']\ncomponents: ['{webhook}']\npatches:\n{}{}  - target: {{kind: ValidatingWebhookConfiguration, name: cmpoll-webhook}}\n    patch: |-\n      - op: add\n        path: /webhooks/0/clientConfig/caBundle\n        value: {bundle}\n",
        delete("Certificate"),
        delete("Issuer"),
        prometheus = super::shapes::relative(&overlay, "k8s/prometheus"),
        webhook = super::shapes::relative(&overlay, "k8s/webhook"),
    );
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(overlay.join("kustomization.yaml"), kustomization).unwrap();
    super::shapes::replace_the_shape(node);
    node.kubectl(&["apply", "-k", overlay.to_str().unwrap()]);
    super::shapes::ready_rollout(node, "deployment/cmpoll-webhook", "k8s/webhook");
    super::shapes::ready_rollout(node, "deployment/cmpoll", "k8s/webhook's k8s/prometheus");
    denies_a_broken_rule(node);
    node.kubectl(&["delete", "validatingwebhookconfiguration", "cmpoll-webhook"]);
}
