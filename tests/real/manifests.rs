//! The shipped manifests and the module label policy, applied to the real apiserver.

use serde_json::{Value, json};
use test_apiserver::real::{self, RealApiserver, User};

use super::*;
use crate::util::{Daemon, SOON, eventually, kinds};

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
        let applied = k.server_dry_run(&rendered);
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
        let out = k.server_apply(&rendered);
        assert!(out.contains("serverside-applied"), "{variant}: {out}");
        // The cmpoll container's own settings (plain values; paths are the pod's).
        let cmpoll = deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "cmpoll")
            .unwrap();
        let keep = [
            "CMPOLL_RESOURCE",
            "CMPOLL_SELECTOR",
            "CMPOLL_NAMESPACE",
            "CMPOLL_NAMESPACE_FROM_CONTEXT",
            "CMPOLL_KEYS",
            "CMPOLL_LIST_MODE",
        ];
        let settings: Vec<(String, String)> = (cmpoll["env"].as_array().into_iter().flatten())
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?.to_string(),
                    e["value"].as_str()?.to_string(),
                ))
            })
            .filter(|(n, _)| keep.contains(&n.as_str()))
            .collect();
        // A key the container's --keys selects (its first glob, `*` filled in).
        let keys =
            (settings.iter().find(|(n, _)| n == "CMPOLL_KEYS")).map_or("*", |(_, v)| v.as_str());
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
        let (with_sa, _) = in_cluster(&k, token.trim(), "cmpoll");
        let c = settings
            .into_iter()
            .fold(with_sa, |c, (n, v)| c.env(&n, &v));
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
    // The clustered Alloys (k8s/alloy-clustered), then a tenant's Alloy
    // (k8s/alloy-tenants/team-a: its own namespace and names) beside them.
    let k = RealApiserver::start();
    let rendered = k.ok(&[
        "kustomize",
        root.join("k8s/alloy-clustered").to_str().unwrap(),
    ]);
    k.ok(&["create", "namespace", "cmpoll"]);
    let out = k.server_apply(&rendered);
    assert!(
        out.contains("service/cmpoll-alloy-cluster serverside-applied"),
        "alloy-clustered: {out}"
    );
    let rendered = k.ok(&[
        "kustomize",
        root.join("k8s/alloy-tenants/team-a").to_str().unwrap(),
    ]);
    k.ok(&["create", "namespace", "cmpoll-team-a"]);
    let applied = k.server_dry_run(&rendered);
    let names: Vec<&str> = (applied["items"].as_array().unwrap().iter())
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"cmpoll-team-a") && !names.contains(&"cmpoll"),
        "{names:?}"
    );
    let out = k.server_apply(&rendered);
    assert!(
        out.contains("serverside-applied"),
        "alloy-tenants/team-a: {out}"
    );
    // charts/cmpoll's hub, as `helm template` renders it, in a namespace of its own.
    let helm = root.join("tools/helm/bin/helm");
    if crate::util::skip_unless(helm.exists(), "tools/helm's helm (.ci/run builds it)") {
        return;
    }
    // With its webhook too, trusted through a CA bundle (no cert-manager here).
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(k.ca_pem());
    let out = std::process::Command::new(&helm)
        .args(["template", "fleet"])
        .arg(root.join("charts/cmpoll"))
        .args(["-n", "fleet"])
        .args(["--set", "webhook.enabled=true"])
        .args(["--set", "webhook.certManager.enabled=false"])
        .arg("--set")
        .arg(format!("webhook.caBundle={ca}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let rendered = String::from_utf8(out.stdout).unwrap();
    k.ok(&["create", "namespace", "fleet"]);
    k.server_dry_run(&rendered);
    let out = k.server_apply(&rendered);
    for applied in [
        "deployment.apps/fleet-hub serverside-applied",
        "deployment.apps/fleet-webhook serverside-applied",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/fleet-webhook serverside-applied",
    ] {
        assert!(out.contains(applied), "charts/cmpoll: {out}");
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
    k.server_apply(&policy);
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
