//! The deployment artefacts: the systemd unit and its environment file, the Kubernetes
//! manifests (validated against the API schemas and scanned by checkov), the Dockerfile.

use std::path::PathBuf;
use std::process::Command;

use test_apiserver::{TOKEN, TestApiserver};

use crate::util::{BIN, Cmpoll, root};

/// A tool from one of the virtualenvs `.ci/run` makes, or from PATH.
fn tool(venv: &str, name: &str) -> PathBuf {
    let p = root().join("target").join(venv).join("bin").join(name);
    if p.exists() { p } else { name.into() }
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (bash .ci/run installs the tools)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The unit with ExecStart pointing at the binary under test.
fn unit_for_test(dir: &std::path::Path) -> PathBuf {
    let unit = std::fs::read_to_string(root().join("systemd/cmpoll.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/cmpoll run"));
    let p = dir.join("cmpoll.service");
    std::fs::write(&p, unit.replace("/usr/local/bin/cmpoll", BIN)).unwrap();
    p
}

#[test]
fn the_systemd_unit_verifies_and_exposes_at_most_2_0() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_test(dir.path());
    let (ok, out) = run(Command::new("systemd-analyze").arg("verify").arg(&unit));
    assert!(ok, "systemd-analyze verify: {out}");
    let (ok, out) = run(Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--threshold=20"])
        .arg(&unit));
    let score = out
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_default()
        .to_string();
    eprintln!("{score}");
    assert!(ok, "exposure above 2.0: {score}\n{out}");
    for needed in [
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "User=cmpoll",
        "Group=cmpoll",
        "StateDirectory=cmpoll",
        "StateDirectoryMode=0750",
        "CMPOLL_FILE_MODE=0640",
        "EnvironmentFile=",
    ] {
        assert!(
            std::fs::read_to_string(&unit).unwrap().contains(needed),
            "{needed}"
        );
    }
}

#[test]
fn the_example_environment_file_is_accepted_by_cmpoll() {
    let s = TestApiserver::start();
    s.put(
        test_apiserver::ConfigMap::new("monitoring", "m")
            .label("cmpoll.io/module", "true")
            .data("a.alloy", "x"),
    );
    let c = Cmpoll::new();
    let env_file = std::fs::read_to_string(root().join("systemd/cmpoll.env")).unwrap();
    let ca = c.write("ca.crt", &s.ca_pem());
    let token = c.write("token", TOKEN);
    let out = c.path("modules");
    let mut c = c;
    for line in env_file
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (k, v) = line.split_once('=').unwrap();
        assert!(k.starts_with("CMPOLL_"), "{k}");
        c = c.env(k, v);
    }
    // What the unit adds, and what only this test changes: the server, a free port, and
    // the agent's reload endpoint (--once waits for it).
    assert!(env_file.contains("CMPOLL_RELOAD_URL=http://127.0.0.1:12345/-/reload"));
    let (reload, reloads) = crate::util::http::reload_server(vec![]);
    let c = c
        .env("CMPOLL_RELOAD_URL", &reload)
        .env("CMPOLL_SERVER", &s.url())
        .env("CMPOLL_CA_FILE", ca.to_str().unwrap())
        .env("CMPOLL_TOKEN_FILE", token.to_str().unwrap())
        .env("CMPOLL_OUT_DIR", out.to_str().unwrap())
        .env("CMPOLL_LISTEN", "127.0.0.1:0");
    let c = c.args(&["run", "--once"]);
    let run = c.run().success();
    let written = std::fs::read_to_string(out.join("monitoring/m/a.alloy"));
    assert_eq!(written.ok().as_deref(), Some("x"), "{}", run.described);
    let list = s.requests().pop().unwrap();
    assert_eq!(
        list.path, "/api/v1/namespaces/team-payments/configmaps",
        "CMPOLL_NAMESPACE applied"
    );
    assert_eq!(reloads.lock().unwrap().len(), 1, "{}", run.described);
}

/// The manifests of every kustomize variant plus the examples, in a folder.
pub fn manifests() -> tempfile::TempDir {
    // Not a hidden name: checkov skips hidden folders (and tempfile's are `.tmpXXXX`).
    let dir = tempfile::Builder::new()
        .prefix("cmpoll-manifests-")
        .tempdir()
        .unwrap();
    for (name, path) in [
        ("cluster-wide.yaml", "k8s"),
        ("alloy.yaml", "k8s/alloy"),
        ("namespaced.yaml", "k8s/prometheus-namespaced"),
        ("serve.yaml", "k8s/serve"),
        ("serve-alloy.yaml", "k8s/serve-alloy"),
        ("alloy-tenant.yaml", "k8s/alloy-tenants/team-a"),
        ("alloy-clustered.yaml", "k8s/alloy-clustered"),
        ("alloy-remotecfg.yaml", "k8s/alloy-remotecfg"),
    ] {
        let (ok, out) = run(Command::new("kubectl")
            .args(["kustomize"])
            .arg(root().join(path)));
        assert!(ok, "kubectl kustomize {path}: {out}");
        std::fs::write(dir.path().join(name), out).unwrap();
    }
    // The components, as a user's overlay adds them.
    std::fs::write(
        dir.path().join("components.yaml"),
        overlay(
            "k8s/prometheus",
            &["k8s/events", "k8s/webhook", "k8s/webhook-client-cert"],
        ),
    )
    .unwrap();
    for e in std::fs::read_dir(root().join("k8s/examples")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    // charts/cmpoll as `helm template` renders it: its defaults, and the hub limited to
    // two namespaces with cert-manager issuing its certificate.
    for (name, values) in [
        ("chart-hub.yaml", vec![]),
        (
            "chart-hub-namespaced.yaml",
            vec![
                "hub.namespaces={team-a,team-b}",
                "hub.certManager.enabled=true",
            ],
        ),
        // Rollouts: the hub's Role on its state Secret, and its flags.
        (
            "chart-hub-rollouts.yaml",
            vec![r"hub.rollout.steps=1%\,10%\,50%\,100%"],
        ),
        // Alloy's remotecfg: the root's ConfigMap, the hubs' Role on it, the collectors'
        // rules, the flag.
        (
            "chart-hub-remotecfg.yaml",
            vec![
                "hub.remotecfg.root=// the root",
                "hub.remotecfg.arguments=the offered arguments",
                "hub.remotecfg.collectors[0].namespace=cmpoll",
                "hub.remotecfg.collectors[0].name=alloy-collector",
            ],
        ),
        (
            "chart-webhook.yaml",
            vec!["hub.enabled=false", "webhook.enabled=true"],
        ),
    ] {
        std::fs::write(dir.path().join(name), helm_template(&values)).unwrap();
    }
    // Grafana's alloy chart with k8s/alloy-helm's values.
    for (name, values) in [
        (
            "alloy-chart-deployment.yaml",
            &["values-deployment.yaml"][..],
        ),
        (
            "alloy-chart-daemonset.yaml",
            &["values-deployment.yaml", "values-daemonset.yaml"][..],
        ),
    ] {
        std::fs::write(dir.path().join(name), alloy_chart(values)).unwrap();
    }
    dir
}

/// tools/helm's helm (v4.3.2, built by .ci/run), or a loud skip (a failure in CI).
fn helm() -> Option<PathBuf> {
    let helm = root().join("tools/helm/bin/helm");
    (!crate::util::skip_unless(helm.exists(), "tools/helm's helm (.ci/run builds it)"))
        .then_some(helm)
}

/// `helm template cmpoll charts/cmpoll -n cmpoll --set …`.
pub fn helm_template(set: &[&str]) -> String {
    let Some(helm) = helm() else {
        return String::new();
    };
    let mut cmd = Command::new(helm);
    cmd.args(["template", "cmpoll"])
        .arg(root().join("charts/cmpoll"))
        .args(["-n", "cmpoll"]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "helm template {set:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Grafana's own alloy chart (chart 1.11.1), as Alloy v1.19.2's Go module holds it in
/// `operations/helm/charts/alloy` (the module cache tests/alloy/build.sh fills), rendered
/// by tools/helm's helm as release `alloy` in namespace `monitoring` with the files of
/// `k8s/alloy-helm` named in `values`, in order: what `helm install alloy grafana/alloy -f
/// V1 -f V2…` would apply; `helm lint --strict` with those values must pass first.
pub fn alloy_chart(values: &[&str]) -> String {
    let Some(helm) = helm() else {
        return String::new();
    };
    let out = Command::new("go")
        .args(["list", "-m", "-f", "{{.Dir}}", "github.com/grafana/alloy"])
        .current_dir(root().join("tests/alloy"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("go (tests/alloy/build.sh needs it too)");
    assert!(
        out.status.success(),
        "go list -m github.com/grafana/alloy: {out:?}"
    );
    let chart = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        .join("operations/helm/charts/alloy");
    let files: Vec<String> = (values.iter())
        .flat_map(|v| {
            [
                "-f".to_string(),
                root().join("k8s/alloy-helm").join(v).display().to_string(),
            ]
        })
        .collect();
    let (ok, lint) = run(Command::new(&helm)
        .args(["lint", "--strict", "-n", "monitoring"])
        .args(&files)
        .arg(&chart));
    assert!(ok, "helm lint --strict {chart:?} {values:?}: {lint}");
    let out = Command::new(helm)
        .args(["template", "alloy"])
        .arg(&chart)
        .args(["-n", "monitoring"])
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm template {chart:?} {values:?}: {out:?}"
    );
    String::from_utf8(out.stdout).unwrap()
}

/// charts/cmpoll passes `helm lint --strict`, and its values schema refuses what the hub
/// would refuse: another resource than ConfigMaps or Secrets, an interval that is no
/// duration, a key the chart does not know, a setting that is no CMPOLL_ variable.
#[test]
fn the_chart_lints_strictly_and_its_schema_refuses_bad_values() {
    let Some(helm) = helm() else { return };
    let lint = |set: &[&str]| {
        let mut cmd = Command::new(&helm);
        cmd.args(["lint", "--strict"])
            .arg(root().join("charts/cmpoll"));
        for s in set {
            cmd.args(["--set", s]);
        }
        run(&mut cmd)
    };
    let (ok, out) = lint(&[]);
    assert!(ok, "{out}");
    let (ok, out) = lint(&["hub.namespaces={a,b}", "hub.certManager.enabled=true"]);
    assert!(ok, "{out}");
    let (ok, out) = lint(&["webhook.enabled=true"]);
    assert!(ok, "{out}");
    let (ok, out) = lint(&[
        "webhook.enabled=true",
        "webhook.certManager.enabled=false",
        "webhook.caBundle=Zm9v",
    ]);
    assert!(ok, "{out}");
    for (bad, says) in [
        ("webhook.failurePolicy=Never", "/webhook/failurePolicy"),
        ("webhook.timeoutSeconds=60", "/webhook/timeoutSeconds"),
        ("hub.resource=pods", "/hub/resource"),
        ("hub.interval=soon", "/hub/interval"),
        ("hub.replica=3", "replica"),
        ("hub.extraEnv.LOG=debug", "LOG"),
        (r"hub.rollout.steps=1%\,half", "/hub/rollout/steps"),
        ("hub.rollout.wait=soon", "/hub/rollout/wait"),
    ] {
        let mut set = vec![bad];
        if bad.starts_with("webhook.") {
            set.push("webhook.enabled=true");
        }
        let (ok, out) = lint(&set);
        assert!(!ok && out.contains(says), "{bad}: {out}");
    }
    // No cert-manager and no CA: the apiserver could not trust the webhook, so the chart
    // does not render (helm lint only notes a template's `fail`).
    let out = Command::new(&helm)
        .args(["template", "cmpoll"])
        .arg(root().join("charts/cmpoll"))
        .args([
            "--set",
            "webhook.enabled=true",
            "--set",
            "webhook.certManager.enabled=false",
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("webhook.caBundle"),
        "{out:?}"
    );
    // Rendered: the hub and what it needs, in the release's namespace.
    let objects = crate::util::tools::yaml_docs(helm_template(&[]).as_bytes());
    let mut kinds: Vec<String> = (objects.iter())
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole/cmpoll-hub",
            "ClusterRole/cmpoll-hub-reviews",
            "ClusterRoleBinding/cmpoll-hub",
            "ClusterRoleBinding/cmpoll-hub-reviews",
            "Deployment/cmpoll-hub",
            "NetworkPolicy/cmpoll-hub",
            "PodDisruptionBudget/cmpoll-hub",
            "Service/cmpoll-hub",
            "ServiceAccount/cmpoll-hub",
        ]
    );
}

#[test]
fn the_manifests_validate_against_the_kubernetes_schemas() {
    let dir = manifests();
    let files: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(files.len() >= 5);
    for version in ["1.28.0", "1.34.0"] {
        let (ok, out) = run(Command::new(tool("ci-venv", "kubernetes-validate"))
            .args(["--strict", "--kubernetes-version", version])
            .args(&files));
        assert!(ok, "kubernetes-validate {version}:\n{out}");
        assert!(!out.contains("ERROR"), "{out}");
    }
    // The admission policy is ValidatingAdmissionPolicy v1: Kubernetes 1.30 and later.
    let (ok, out) = run(Command::new(tool("ci-venv", "kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", "1.34.0"])
        .arg(root().join("k8s/admission/module-label-policy.yaml")));
    assert!(ok && !out.contains("ERROR"), "admission policy:\n{out}");
    // The Secrets variant (kept out of the shared folder for checkov's sake).
    let (ok, rendered) = run(Command::new("kubectl")
        .args(["kustomize"])
        .arg(root().join("k8s/prometheus-secrets")));
    assert!(ok, "{rendered}");
    let secrets = dir.path().join("secrets-variant.yml");
    std::fs::write(&secrets, rendered).unwrap();
    let (ok, out) = run(Command::new(tool("ci-venv", "kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", "1.34.0"])
        .arg(&secrets));
    assert!(
        ok && !out.contains("ERROR"),
        "k8s/prometheus-secrets:\n{out}"
    );
    // The components a user adds to an overlay of theirs, each on both shapes.
    for (base, components) in [
        ("k8s/prometheus", &["k8s/events"][..]),
        ("k8s/prometheus", &["k8s/namespaced", "k8s/events"][..]),
    ] {
        let rendered = overlay(base, components);
        let file = dir.path().join("overlay.yml");
        std::fs::write(&file, &rendered).unwrap();
        let (ok, out) = run(Command::new(tool("ci-venv", "kubernetes-validate"))
            .args(["--strict", "--kubernetes-version", "1.34.0"])
            .arg(&file));
        assert!(
            ok && !out.contains("ERROR"),
            "{base} + {components:?}:\n{out}"
        );
        std::fs::remove_file(&file).unwrap();
        assert!(
            rendered.contains(
                "- events.k8s.io\n  resources:\n  - events\n  verbs:\n  - create\n  - patch\n"
            ),
            "{rendered}"
        );
        assert_eq!(rendered.matches("name: CMPOLL_REPORT_EVENTS").count(), 2);
    }
    let all = std::fs::read_to_string(dir.path().join("cluster-wide.yaml")).unwrap();
    for kind in [
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "NetworkPolicy",
    ] {
        assert!(all.contains(&format!("kind: {kind}\n")), "{kind}");
    }
    assert!(
        all.contains("- list\n    - get\n") || all.contains("verbs:\n  - list\n  - get"),
        "{all}"
    );
    let hook: Vec<serde_json::Value> = serde_saphyr::from_multiple(
        &std::fs::read_to_string(dir.path().join("components.yaml")).unwrap(),
    )
    .unwrap();
    let find = |kind: &str, name: &str| {
        hook.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name}"))
            .clone()
    };
    let config = find("ValidatingWebhookConfiguration", "cmpoll-webhook");
    let w = &config["webhooks"][0];
    assert_eq!(
        (&w["failurePolicy"], &w["sideEffects"], &w["objectSelector"]),
        (
            &serde_json::json!("Ignore"),
            &serde_json::json!("None"),
            &serde_json::json!({"matchLabels": {"cmpoll.io/module": "true"}})
        )
    );
    assert_eq!(
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "cmpoll/cmpoll-webhook"
    );
    assert_eq!(w["clientConfig"]["service"]["name"], "cmpoll-webhook");
    find("Service", "cmpoll-webhook");
    find("Certificate", "cmpoll-webhook");
    let pod = &find("Deployment", "cmpoll-webhook")["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    for c in pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(pod["initContainers"].as_array().unwrap())
    {
        let sc = &c["securityContext"];
        assert_eq!(
            (
                &sc["readOnlyRootFilesystem"],
                &sc["allowPrivilegeEscalation"]
            ),
            (&serde_json::json!(true), &serde_json::json!(false)),
            "{}",
            c["name"]
        );
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    }
    let ns = std::fs::read_to_string(dir.path().join("namespaced.yaml")).unwrap();
    assert!(ns.contains("kind: Role\n") && !ns.contains("kind: ClusterRole\n"));
    assert!(ns.contains("CMPOLL_NAMESPACE_FROM_CONTEXT"));
}

/// `kubectl kustomize` of a user's overlay: `base` (a folder of the repository) with
/// `components`, written where a user would, outside the repository.
pub fn overlay(base: &str, components: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    // kustomize takes relative paths only.
    let up = "../".repeat(dir.path().components().count() - 1);
    let rel = |p: &str| {
        format!(
            "{up}{}",
            root().join(p).display().to_string().trim_start_matches('/')
        )
    };
    let mut k = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n",
        rel(base)
    );
    for c in components {
        k.push_str(&format!("  - {}\n", rel(c)));
    }
    std::fs::write(dir.path().join("kustomization.yaml"), k).unwrap();
    let (ok, out) = run(Command::new("kubectl").arg("kustomize").arg(dir.path()));
    assert!(ok, "kubectl kustomize {base} + {components:?}: {out}");
    out
}

/// checkov's JSON report on a folder.
fn checkov(dir: &std::path::Path) -> serde_json::Value {
    let out = Command::new(tool("ci-venv-checkov", "checkov"))
        .args([
            "--framework",
            "kubernetes",
            "--skip-download",
            "--output",
            "json",
            "-d",
        ])
        .arg(dir)
        .output()
        .expect("checkov (bash .ci/run installs it)");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "checkov JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let summary = &report["summary"];
    eprintln!("checkov: {summary}");
    assert_eq!(
        summary["failed"],
        0,
        "{}",
        serde_json::to_string_pretty(&report["results"]["failed_checks"]).unwrap()
    );
    report
}

fn skipped(report: &serde_json::Value) -> Vec<&str> {
    report["results"]["skipped_checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["check_id"].as_str().unwrap())
        .collect()
}

#[test]
fn checkov_finds_nothing_unjustified() {
    let dir = manifests();
    let report = checkov(dir.path());
    assert!(report["summary"]["passed"].as_u64().unwrap() > 100);
    // Every skip is justified in place, in each deployment (only CKV_K8S_43: digests).
    for file in [
        "prometheus/deployment.yaml",
        "alloy/deployment.yaml",
        "webhook/deployment.yaml",
        "serve/deployment.yaml",
        "serve-alloy/daemonset.yaml",
        "alloy-remotecfg/daemonset.yaml",
    ] {
        let variant = file;
        let deployment = std::fs::read_to_string(root().join("k8s").join(file)).unwrap();
        assert!(
            deployment.contains("CKV_K8S_43="),
            "{variant}: the skip is justified"
        );
        assert!(
            !deployment.contains("CKV_K8S_38"),
            "{variant}: the token is not auto-mounted"
        );
    }
    // Only those two, in each of the seventeen rendered workloads (cmpoll's Deployment in
    // three variants, in the components' overlay, in a tenant's and clustered, the
    // webhook's, the hubs', the Alloy DaemonSets' of serve-alloy and alloy-remotecfg, the
    // chart's hub in its four renders and its webhook, Grafana's alloy chart with
    // k8s/alloy-helm's two values files); and in the alloy chart's two, CKV_K8S_38: that
    // chart cannot say automountServiceAccountToken on the pod, only on its service account
    // (false there, checked by the pod tests).
    let skipped_ids = skipped(&report);
    assert_eq!(skipped_ids.len(), 36, "{skipped_ids:?}");
    for c in report["results"]["skipped_checks"].as_array().unwrap() {
        let id = c["check_id"].as_str().unwrap();
        let file = c["file_path"].as_str().unwrap();
        assert!(
            ["CKV_K8S_43", "CKV_K8S_15"].contains(&id)
                || (id == "CKV_K8S_38" && file.starts_with("/alloy-chart-")),
            "{id} skipped in {file}"
        );
    }
    // The Secrets variant on its own (checkov's graph checks join a binding to any role of
    // that name in the folder): one more skip, the one its purpose needs, justified.
    let alone = tempfile::Builder::new()
        .prefix("cmpoll-secrets-")
        .tempdir()
        .unwrap();
    let (ok, out) = run(Command::new("kubectl")
        .args(["kustomize"])
        .arg(root().join("k8s/prometheus-secrets")));
    assert!(ok, "kubectl kustomize k8s/prometheus-secrets: {out}");
    std::fs::write(alone.path().join("secrets.yaml"), &out).unwrap();
    let report = checkov(alone.path());
    let mut ids = skipped(&report);
    ids.sort();
    assert_eq!(ids, ["CKV2_K8S_5", "CKV_K8S_15", "CKV_K8S_43"]);
    assert!(
        out.contains("kind: Role\n") && !out.contains("kind: ClusterRole"),
        "Secrets for one namespace only: {out}"
    );
    let yaml = std::fs::read_to_string(root().join("k8s/secrets/kustomization.yaml")).unwrap();
    assert!(
        yaml.contains("CKV2_K8S_5=delivering Secrets"),
        "justified in place"
    );
}

/// cmpoll's alerts, as a module and as a PrometheusRule, pass `promtool check rules`.
#[test]
fn the_shipped_alerts_pass_promtool() {
    let promtool = crate::util::tools::tool("promtool");
    if crate::util::skip_unless(promtool.is_some(), "promtool (Debian package prometheus)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    use crate::util::tools::yaml_docs;
    let yaml = |p: &str| yaml_docs(&std::fs::read(root().join(p)).unwrap()).remove(0);
    let module = yaml("k8s/prometheus/cmpoll-alerts.yaml");
    let rule = yaml("k8s/monitoring/prometheusrule.yaml");
    let a = dir.path().join("module.rules.yaml");
    std::fs::write(&a, module["data"]["cmpoll.rules.yaml"].as_str().unwrap()).unwrap();
    let b = dir.path().join("prometheusrule.rules.yaml");
    std::fs::write(&b, serde_json::to_string(&rule["spec"]).unwrap()).unwrap();
    for f in [&a, &b] {
        let (ok, out) = run(Command::new(promtool.as_ref().unwrap())
            .args(["check", "rules"])
            .arg(f));
        assert!(
            ok && out.contains("SUCCESS: 2 rules found"),
            "{}: {out}",
            f.display()
        );
    }
    // The same two rules in both.
    assert_eq!(
        serde_json::to_string(&rule["spec"]).unwrap(),
        serde_json::to_string(
            &yaml_docs(
                module["data"]["cmpoll.rules.yaml"]
                    .as_str()
                    .unwrap()
                    .as_bytes()
            )[0]
        )
        .unwrap()
    );
}

#[test]
fn the_dockerfile_copies_the_binary_the_build_produces() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(cargo.contains("name = \"cmpoll\""));
    // The build stage builds the cmpoll package in release mode, locked...
    assert!(
        dockerfile.contains("cargo build --release --locked -p cmpoll"),
        "{dockerfile}"
    );
    // ...and what it copies out is that build's binary, under the name the entrypoint runs.
    let built = format!("target/release/{}", "cmpoll");
    assert!(
        dockerfile.contains(&format!("cp {built} /cmpoll")),
        "{dockerfile}"
    );
    assert!(dockerfile.contains("COPY --from=build /cmpoll /usr/local/bin/cmpoll"));
    assert!(dockerfile.contains("ENTRYPOINT [\"/usr/local/bin/cmpoll\"]"));
    // The release binary is named as the binary under test (the [[bin]] of this package).
    assert!(BIN.ends_with("/cmpoll"), "{BIN}");
    // Non-root, and the image cmpoll's manifests run.
    assert!(dockerfile.contains("USER 65532:65532"));
    // The k8s-sidecar drop-in: its own target, whose default command is `sidecar`; the
    // default target (the last) runs `run`.
    let sidecar = dockerfile
        .find("FROM runtime AS sidecar")
        .expect("a sidecar target");
    assert!(dockerfile[sidecar..].contains("CMD [\"sidecar\"]"));
    assert!(
        dockerfile
            .trim_end()
            .ends_with("FROM runtime\nCMD [\"run\"]"),
        "{dockerfile}"
    );
    for variant in ["prometheus", "alloy"] {
        let path = root().join(format!("k8s/{variant}/deployment.yaml"));
        let deployment = std::fs::read_to_string(path).unwrap();
        assert!(deployment.contains("runAsUser: 65532"));
        assert!(deployment.contains("image: ghcr.io/cmpoll/cmpoll:0.1.0"));
    }
    // Dependencies are built in a layer before the source is copied; OCI labels.
    let deps = dockerfile
        .find("COPY Cargo.toml Cargo.lock ./")
        .expect("a dependency layer");
    assert!(deps < dockerfile.find("COPY . .").unwrap());
    assert!(dockerfile.contains("org.opencontainers.image.source"));
    let dockerignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    assert!(
        dockerignore.lines().any(|l| l.trim() == "target/"),
        "the context excludes build output"
    );
}

/// The unit's user design, with real users: `systemd-sysusers` makes the user and group
/// from `cmpoll.sysusers`; cmpoll, run as that user with the unit's `UMask` and
/// `CMPOLL_FILE_MODE` in a state folder of `StateDirectoryMode`, writes modules that an
/// agent in the group reads and another user cannot.
#[test]
fn the_units_user_and_group_let_the_agent_read_and_no_one_else() {
    let root_user = rustix::process::geteuid().is_root();
    if crate::util::skip_unless(
        root_user && crate::util::tools::tool("setpriv").is_some(),
        "root and setpriv (util-linux)",
    ) {
        return;
    }
    let unit = std::fs::read_to_string(root().join("systemd/cmpoll.service")).unwrap();
    let setting = |key: &str| -> String {
        unit.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("{key} in the unit"))
            .to_string()
    };
    let (umask, state_mode) = (setting("UMask="), setting("StateDirectoryMode="));
    let file_mode = setting("Environment=CMPOLL_FILE_MODE=");
    assert_eq!(setting("User="), "cmpoll");
    // The user and group, as systemd-sysusers makes them from the shipped file.
    let sys = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(sys.path().join("etc")).unwrap();
    let (ok, out) = run(Command::new("systemd-sysusers")
        .arg(format!("--root={}", sys.path().display()))
        .arg(root().join("systemd/cmpoll.sysusers")));
    assert!(ok, "systemd-sysusers: {out}");
    let passwd = std::fs::read_to_string(sys.path().join("etc/passwd")).unwrap();
    let entry: Vec<&str> = passwd
        .lines()
        .find(|l| l.starts_with("cmpoll:"))
        .expect("a cmpoll user")
        .split(':')
        .collect();
    let group = std::fs::read_to_string(sys.path().join("etc/group")).unwrap();
    assert!(
        group
            .lines()
            .any(|l| l.starts_with(&format!("cmpoll:x:{}:", entry[3])))
    );
    assert_eq!(entry[5], "/var/lib/cmpoll");
    // Ids for this run that no one on this machine uses.
    let (uid, gid, agent, other) = (61_390, 61_390, 61_391, 61_392);
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("cmpoll");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    let mode = u32::from_str_radix(&state_mode, 8).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out_dir = dir.join("modules");
    let bin = crate::pod::reachable_copy(&state.path().join("bin"));
    let (ok, out) = run(Command::new("sh")
        .args([
            "-c",
            &format!("umask {umask}; exec \"$@\""),
            "sh",
            "setpriv",
        ])
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
            bin.to_str().unwrap(),
            "run",
            "--once",
            "--manifests",
        ])
        .arg(root().join("k8s/examples"))
        .arg("--out-dir")
        .arg(&out_dir)
        .env("CMPOLL_FILE_MODE", &file_mode));
    assert!(ok, "cmpoll as the unit's user: {out}");
    let file = out_dir.join("team-payments/payments-rules/payments.rules.yaml");
    let read_as = |uid: u32, groups: &str| {
        Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                groups,
                "cat",
            ])
            .arg(&file)
            .output()
            .unwrap()
    };
    let agent_read = read_as(agent, &format!("--groups={gid}"));
    assert!(
        agent_read.status.success(),
        "the agent in the group: {agent_read:?}"
    );
    assert!(String::from_utf8_lossy(&agent_read.stdout).contains("PaymentsHighErrorRate"));
    let other_read = read_as(other, "--clear-groups");
    assert!(
        !other_read.status.success(),
        "another user read the modules"
    );
    assert!(String::from_utf8_lossy(&other_read.stderr).contains("Permission denied"));
}

/// The release workflow (`.github/workflows/release.yml`) passes actionlint with
/// shellcheck on every `run:` block (actionlint v1.7.12, built by .ci/run from
/// tools/actionlint; Debian's shellcheck), its build steps are the scripts the suite runs
/// (tests/image.rs, tests/deb.rs), and the linter is not a formality: the same workflow
/// with one unquoted variable fails it.
#[test]
fn the_release_workflow_passes_actionlint_and_builds_with_the_suites_scripts() {
    let actionlint = root().join("tools/actionlint/bin/actionlint");
    let shellcheck = crate::util::tools::tool("shellcheck");
    if crate::util::skip_unless(
        actionlint.exists() && shellcheck.is_some(),
        "tools/actionlint's actionlint and shellcheck (Debian package)",
    ) {
        return;
    }
    let workflow = root().join(".github/workflows/release.yml");
    let lint = |file: &std::path::Path| {
        run(Command::new(&actionlint)
            .arg("-shellcheck")
            .arg(shellcheck.as_ref().unwrap())
            .arg("-no-color")
            .arg(file))
    };
    let (ok, out) = lint(&workflow);
    assert!(ok, "{out}");
    let text = std::fs::read_to_string(&workflow).unwrap();
    for script in ["packaging/image/build.sh", "packaging/deb/build.sh"] {
        assert!(text.contains(script), "the workflow builds with {script}");
    }
    for arch in ["amd64", "arm64"] {
        assert!(text.contains(&format!("arch: {arch}")), "{arch}");
    }
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("release.yml");
    let unquoted = text.replace("cp \"$f\" \"dist/", "cp $f \"dist/");
    assert_ne!(unquoted, text);
    std::fs::write(&broken, unquoted).unwrap();
    let (ok, out) = lint(&broken);
    assert!(!ok && out.contains("SC2086"), "{out}");
}
