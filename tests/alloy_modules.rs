//! Alloy modules as the proposal for `module.kubernetes.configmaps` meant them (issue 28),
//! proved with a real Grafana Alloy (`tests/alloy`: Alloy v1.19.2's own command line and
//! runtime, built from the Go module proxy with the components it can build). cmpoll
//! writes each labelled ConfigMap through `k8s/alloy/module.tmpl` (a `declare` block per
//! module, instantiated once) with `k8s/alloy/offered-arguments`, validates it with
//! `k8s/alloy/check-module.sh` (`alloy validate` beside the root configuration), and calls
//! Alloy's `/-/reload`. Alloy's HTTP API says what runs; a Prometheus with its remote-write
//! receiver says what the modules' scrapes delivered through the offered `receiver`.
//!
//! The seed's semantics, each shown here: one module per ConfigMap, named after its
//! namespace and name (`two_teams_modules_with_the_same_labels_run_side_by_side`);
//! arguments offered to all, unused ones no error, exports ignored (the same test); a
//! broken module rejected alone (`a_broken_module_is_rejected_alone_and_the_others_keep_running`);
//! healthy while listing works: cmpoll's `/readyz` (tests/ops.rs,
//! `endpoints_across_start_up_failures_reloads_and_recovery`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use test_apiserver::TestApiserver;

use crate::util::tools::{free_port, tool};
use crate::util::{
    Cmpoll, Daemon, KillOnDrop, SOON, eventually_explained, labelled, root, skip_unless,
};

/// The Alloy that `tests/alloy/build.sh` built, or `None` (a loud skip; a failure in CI).
pub(crate) fn alloy_bin() -> Option<PathBuf> {
    let bin = root().join("tests/alloy/bin/alloy");
    let ready = bin.exists() && tool("prometheus").is_some() && tool("curl").is_some();
    if skip_unless(ready, "tests/alloy/build.sh's alloy, prometheus and curl") {
        return None;
    }
    Some(bin)
}

/// A module an app team writes: `prometheus.scrape "default"` (the same label in every
/// module) of Alloy's own `/metrics` on `port`, as job `job`, forwarded to the offered
/// `receiver`; `extra` goes inside.
pub(crate) fn scrape_module(job: &str, port: u16, extra: &str) -> String {
    format!(
        r#"argument "receiver" {{
  comment = "where the platform wants samples"
}}

prometheus.scrape "default" {{
  targets         = [{{"__address__" = "127.0.0.1:{port}"}}]
  job_name        = "{job}"
  scrape_interval = "1s"
  scrape_timeout  = "1s"
  forward_to      = [argument.receiver.value]
}}
{extra}"#
    )
}

/// `scrape_module` with a scrape timeout above its interval: valid to `alloy validate`,
/// refused by Alloy when it builds the component.
pub(crate) fn unbuildable(job: &str, port: u16) -> String {
    let good = scrape_module(job, port, "");
    let bad = good.replace(
        "scrape_interval = \"1s\"\n  scrape_timeout  = \"1s\"",
        "scrape_interval = \"1s\"\n  scrape_timeout  = \"5s\"",
    );
    assert_ne!(bad, good);
    bad
}

/// The platform's root configuration: the shipped one, writing to `prometheus_port`.
pub(crate) fn root_config(dir: &Path, prometheus_port: u16) -> PathBuf {
    let shipped = std::fs::read_to_string(root().join("k8s/alloy/root.alloy")).unwrap();
    let text = shipped.replace(
        "https://prometheus.example.com/api/v1/write",
        &format!("http://127.0.0.1:{prometheus_port}/api/v1/write"),
    );
    assert_ne!(text, shipped, "the shipped root has the example URL");
    let path = dir.join("root.alloy");
    std::fs::write(&path, text).unwrap();
    path
}

/// A Prometheus that receives remote writes.
pub(crate) fn receiver(dir: &Path, port: u16) -> KillOnDrop {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("prometheus.yml"), "global: {}\n").unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(tool("prometheus").unwrap())
        .arg(format!("--config.file={}/prometheus.yml", dir.display()))
        .arg(format!("--storage.tsdb.path={}/data", dir.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--web.enable-remote-write-receiver")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    KillOnDrop(child)
}

/// The jobs Prometheus has `up` samples of.
fn jobs(port: u16) -> Vec<String> {
    let Some((200, body)) =
        crate::util::tools::curl(&format!("http://127.0.0.1:{port}/api/v1/query?query=up"))
    else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let mut jobs: Vec<String> = (v["data"]["result"].as_array().into_iter().flatten())
        .filter_map(|r| r["metric"]["job"].as_str().map(str::to_string))
        .collect();
    jobs.sort();
    jobs
}

/// Alloy's API: (component, health) of the root's components, or of `module`'s.
pub(crate) fn components(port: u16, module: Option<&str>) -> Vec<(String, String)> {
    let path = match module {
        None => "/api/v0/web/components".to_string(),
        Some(m) => format!("/api/v0/web/modules/{m}/components"),
    };
    let Some((200, body)) = crate::util::tools::curl(&format!("http://127.0.0.1:{port}{path}"))
    else {
        return Vec::new();
    };
    let list: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let mut out: Vec<(String, String)> = (list.as_array().into_iter().flatten())
        .map(|c| {
            (
                c["localID"].as_str().unwrap_or("").to_string(),
                c["health"]["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn healthy(ids: &[&str]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = ids
        .iter()
        .map(|i| (i.to_string(), "healthy".to_string()))
        .collect();
    v.sort();
    v
}

/// Everything one scenario runs: the cluster, cmpoll, Alloy, the receiver.
struct Stack {
    server: TestApiserver,
    cmpoll: Option<Daemon>,
    alloy: KillOnDrop,
    _prometheus: KillOnDrop,
    alloy_port: u16,
    prometheus_port: u16,
    out: PathBuf,
    logs: PathBuf,
}

impl Stack {
    fn log(&self) -> String {
        let mut s = String::new();
        for f in ["alloy.log", "prometheus/prometheus.log"] {
            s += &format!(
                "--- {f}\n{}\n",
                std::fs::read_to_string(self.logs.join(f)).unwrap_or_default()
            );
        }
        if let Some(d) = &self.cmpoll {
            s += &format!("--- cmpoll\n{}\n", d.stderr());
        }
        s
    }

    fn eventually(&self, what: &str, within: Duration, f: impl FnMut() -> bool) {
        eventually_explained(what, within, f, || self.log());
    }
}

/// What `k8s/alloy` gives cmpoll: the folder, its layout, the template and the offered
/// arguments.
pub(crate) fn shipped_args(out: &Path) -> Vec<String> {
    let k8s = root().join("k8s/alloy");
    [
        "--out-dir",
        out.to_str().unwrap(),
        "--layout",
        "concat",
        "--ext",
        ".alloy",
        "--keys",
        "*.alloy",
        "--module-template",
        k8s.join("module.tmpl").to_str().unwrap(),
        "--offer-arguments",
        k8s.join("offered-arguments").to_str().unwrap(),
    ]
    .map(str::to_string)
    .to_vec()
}

/// `alloy run FOLDER` on 127.0.0.1:`port`, its data in `logs/DATA`, its output in
/// `logs/DATA.log`.
pub(crate) fn alloy_on(
    alloy: &Path,
    folder: &Path,
    port: u16,
    logs: &Path,
    data: &str,
) -> KillOnDrop {
    let log = std::fs::File::create(logs.join(format!("{data}.log"))).unwrap();
    KillOnDrop(
        Command::new(alloy)
            .arg("run")
            .arg(format!("--server.http.listen-addr=127.0.0.1:{port}"))
            .arg(format!("--storage.path={}", logs.join(data).display()))
            .arg(folder)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// The cluster holds `modules`; cmpoll's first run (as the init container) writes the
/// folder, Alloy starts on it, then cmpoll polls and reloads Alloy.
fn stack(alloy: &Path, alloy_port: u16, modules: &[(&str, &str, &str)]) -> Stack {
    stack_with(alloy, alloy_port, modules, false)
}

/// As `k8s/alloy` ships it: Alloy starts on its root configuration alone, and cmpoll
/// delivers every module with `--confirm confirm-modules.sh` (which reloads Alloy and asks
/// it about each module) instead of `--reload-url`: no module reaches the folder that
/// Alloy did not build.
fn confirmed_stack(alloy: &Path, alloy_port: u16, modules: &[(&str, &str, &str)]) -> Stack {
    stack_with(alloy, alloy_port, modules, true)
}

fn stack_with(
    alloy: &Path,
    alloy_port: u16,
    modules: &[(&str, &str, &str)],
    confirm: bool,
) -> Stack {
    let server = TestApiserver::start();
    for (ns, name, text) in modules {
        server.put(labelled(ns, name).data("module.alloy", text));
    }
    let c = Cmpoll::against(&server);
    let out = c.out();
    let logs = c.path("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let prometheus_port = free_port();
    let prometheus = receiver(&logs.join("prometheus"), prometheus_port);
    std::fs::create_dir_all(&out).unwrap();
    // The root configuration sits in Alloy's folder, as k8s/alloy mounts it: not cmpoll's.
    let root_file = root_config(&out, prometheus_port);
    let k8s = root().join("k8s/alloy");
    let c = c
        .env("ALLOY", alloy.to_str().unwrap())
        .env("ALLOY_ROOT", root_file.to_str().unwrap())
        .env("ALLOY_URL", &format!("http://127.0.0.1:{alloy_port}"))
        .env("ALLOY_WAIT", "2");
    let args = |once: bool| {
        let mut a = shipped_args(&out);
        a.extend([
            "--validate".into(),
            k8s.join("check-module.sh").to_str().unwrap().into(),
            "--stdout-events".into(),
        ]);
        if once {
            a.insert(0, "--once".into());
        } else if confirm {
            a.extend([
                "--interval".into(),
                "200ms".into(),
                "--confirm".into(),
                k8s.join("confirm-modules.sh").to_str().unwrap().into(),
            ]);
        } else {
            a.extend([
                "--interval".into(),
                "200ms".into(),
                "--reload-url".into(),
                format!("http://127.0.0.1:{alloy_port}/-/reload"),
            ]);
        }
        a
    };
    if !confirm {
        let mut init = vec!["run".to_string()];
        init.extend(args(true));
        let first = c.with_args(&init).run();
        assert!(first.code == Some(0), "the init run: {}", first.described);
    }
    let alloy_child = alloy_on(alloy, &out, alloy_port, &logs, "alloy");
    let daemon_args: Vec<String> = args(false);
    let daemon_args: Vec<&str> = daemon_args.iter().map(String::as_str).collect();
    let mut s = Stack {
        server,
        cmpoll: None,
        alloy: alloy_child,
        _prometheus: prometheus,
        alloy_port,
        prometheus_port,
        out: out.clone(),
        logs,
    };
    s.eventually("Alloy is ready", SOON, || {
        crate::util::tools::curl(&format!("http://127.0.0.1:{alloy_port}/-/ready"))
            .is_some_and(|(code, _)| code == 200)
    });
    let d = Daemon::start(c, &daemon_args);
    d.batch(SOON);
    s.cmpoll = Some(d);
    s
}

/// Two teams write the same component labels (`prometheus.exporter.self "default"`,
/// `prometheus.scrape "default"`): each module is its own declare block, so both load and
/// both deliver through the offered `receiver`. The platform offers `receiver` and
/// `clustered`: team-a declares both (`clustered` optional), team-b only `receiver`,
/// team-c (exports only) none — an offered argument a module does not use is no error,
/// and its exports are ignored. One instance per ConfigMap, named after it.
#[test]
fn two_teams_modules_with_the_same_labels_run_side_by_side() {
    let Some(alloy) = alloy_bin() else { return };
    let port = free_port();
    let a = scrape_module(
        "team-a",
        port,
        "argument \"clustered\" {\n  optional = true\n  default  = false\n}\n",
    );
    let b = scrape_module("team-b", port, "");
    let c = "export \"answer\" {\n  value = 42\n}\n";
    let s = stack(
        &alloy,
        port,
        &[
            ("team-a", "web", &a),
            ("team-b", "web", &b),
            ("team-c", "only-exports", c),
        ],
    );
    let want = healthy(&[
        "prometheus.remote_write.default",
        "team_a_S_web.module",
        "team_b_S_web.module",
        "team_c_S_only_exports.module",
    ]);
    s.eventually("every module is a component of its own", SOON, || {
        components(s.alloy_port, None) == want
    });
    for m in ["team_a_S_web.module", "team_b_S_web.module"] {
        assert_eq!(
            components(s.alloy_port, Some(m)),
            healthy(&["prometheus.scrape.default"]),
            "{m}: the same labels, in its own scope"
        );
    }
    s.eventually(
        "both teams' samples reach the root's remote write",
        Duration::from_secs(60),
        || jobs(s.prometheus_port) == ["team-a", "team-b"],
    );
    // What was written: one file per ConfigMap, its arguments only the declared ones.
    let written = std::fs::read_to_string(s.out.join("team-b.web.alloy")).unwrap();
    assert!(
        written.contains("declare \"team_b_S_web\" {")
            && written.contains(
                "team_b_S_web \"module\" {\n  receiver = prometheus.remote_write.default.receiver\n}"
            ),
        "{written}"
    );
    let written = std::fs::read_to_string(s.out.join("team-a.web.alloy")).unwrap();
    assert!(written.contains("  clustered = false\n"), "{written}");
    let written = std::fs::read_to_string(s.out.join("team-c.only-exports.alloy")).unwrap();
    assert!(!written.contains("receiver ="), "{written}");
}

/// A module with a syntax error, and one that requires an argument the platform does not
/// offer, are rejected by Alloy's own validate (its message in the `rejected` event) and
/// never reach Alloy's folder; the others keep running and scraping. An update and a
/// removal reach Alloy through `/-/reload`. A restart of Alloy loads the folder as it is.
#[test]
fn a_broken_module_is_rejected_alone_and_the_others_keep_running() {
    let Some(alloy) = alloy_bin() else { return };
    let port = free_port();
    let good = scrape_module("team-a", port, "");
    let s = stack(
        &alloy,
        port,
        &[
            ("team-a", "web", &good),
            ("team-b", "web", &scrape_module("team-b", port, "")),
        ],
    );
    let d = s.cmpoll.as_ref().unwrap();
    s.eventually("team-a and team-b run", SOON, || {
        components(s.alloy_port, None).len() == 3
    });
    // A syntax error.
    s.server.put(
        labelled("team-c", "broken")
            .data("module.alloy", "prometheus.scrape \"x\" {\n  targets = [\n"),
    );
    let b = d.batch(SOON);
    let rejected = b.iter().find(|e| e["type"] == "rejected").unwrap();
    assert_eq!(rejected["module"], "team-c/broken");
    let reason = rejected["reason"].as_str().unwrap();
    assert!(
        reason.contains("module.alloy:") && reason.contains("expected"),
        "Alloy's words: {reason}"
    );
    // A required argument nobody offers.
    s.server.put(labelled("team-d", "needs-tenant").data(
        "module.alloy",
        &format!(
            "argument \"tenant\" {{ }}\n{}",
            scrape_module("team-d", port, "")
        ),
    ));
    let b = d.batch(SOON);
    let rejected = b.iter().find(|e| e["type"] == "rejected").unwrap();
    assert_eq!(rejected["module"], "team-d/needs-tenant");
    let reason = rejected["reason"].as_str().unwrap();
    assert!(
        reason.contains("missing required attribute \"tenant\""),
        "{reason}"
    );
    assert!(!s.out.join("team-c.broken.alloy").exists());
    assert!(!s.out.join("team-d.needs-tenant.alloy").exists());
    // An update: team-b moves to another job; a removal: team-a goes.
    s.server
        .put(labelled("team-b", "web").data("module.alloy", &scrape_module("team-b-v2", port, "")));
    s.server.delete("team-a", "web");
    s.eventually("the update and the removal reach Alloy", SOON, || {
        components(s.alloy_port, None)
            == healthy(&["prometheus.remote_write.default", "team_b_S_web.module"])
    });
    s.eventually(
        "team-b-v2's samples arrive, the broken modules never blocked anything",
        Duration::from_secs(60),
        || jobs(s.prometheus_port).contains(&"team-b-v2".to_string()),
    );
    // A restart of Alloy on the folder as cmpoll left it: it loads.
    let port = free_port();
    let mut again = alloy_on(&alloy, &s.out, port, &s.logs, "alloy-data-2");
    s.eventually("a fresh Alloy loads the folder", SOON, || {
        crate::util::tools::curl(&format!("http://127.0.0.1:{port}/-/ready"))
            .is_some_and(|(code, _)| code == 200)
    });
    let _ = again.0.kill();
}

/// The shipped shape with team-a's and team-b's scrapes of Alloy's own `/metrics`, once
/// Alloy runs them, and the components it runs.
fn two_teams(alloy: &Path, port: u16) -> (Stack, Vec<(String, String)>) {
    let s = confirmed_stack(
        alloy,
        port,
        &[
            ("team-a", "web", &scrape_module("team-a", port, "")),
            ("team-b", "web", &scrape_module("team-b", port, "")),
        ],
    );
    let base = healthy(&[
        "prometheus.remote_write.default",
        "team_a_S_web.module",
        "team_b_S_web.module",
    ]);
    s.eventually("team-a and team-b run", SOON, || {
        components(s.alloy_port, None) == base
    });
    (s, base)
}

/// A fresh Alloy started on the folder as cmpoll left it is ready and runs `want` (what a
/// crash, a rollout or a drained node would start from).
fn a_fresh_alloy_runs(s: &Stack, alloy: &Path, want: &[(String, String)]) {
    let port = free_port();
    let mut fresh = alloy_on(alloy, &s.out, port, &s.logs, &format!("alloy-fresh-{port}"));
    eventually_explained(
        "a fresh Alloy on the folder runs every good module",
        SOON,
        || components(port, None) == want,
        || {
            format!(
                "{:?}\n{}",
                components(port, None),
                std::fs::read_to_string(s.logs.join(format!("alloy-fresh-{port}.log")))
                    .unwrap_or_default()
            )
        },
    );
    let _ = fresh.0.kill();
}

/// The next `rejected` event of `module` (reading batches for at most `within`): its reason.
fn rejection(d: &Daemon, module: &str, within: Duration) -> String {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        for e in d.batch(left.max(Duration::from_millis(1))) {
            if e["type"] == "rejected" && e["module"] == module {
                return e["reason"].as_str().unwrap_or_default().to_string();
            }
        }
    }
}

/// Isolation by construction: an app team's text is one body inside its `declare` block.
/// A module that closes its block to add a root component, one that declares another
/// team's block name, one that instantiates another team's block with its own arguments,
/// and one that refers to a root component are each rejected alone (cmpoll's grammar check
/// for the first three, Alloy's own validate for the last), never written; Alloy keeps
/// running the others, and a fresh Alloy on the folder starts. (Without the grammar check
/// the first passes `alloy validate` — it is valid Alloy once wrapped — and is written.)
#[test]
fn a_module_cannot_leave_its_block_or_use_another_teams() {
    let Some(alloy) = alloy_bin() else { return };
    let port = free_port();
    let (s, base) = two_teams(&alloy, port);
    let d = s.cmpoll.as_ref().unwrap();
    for (name, text, want) in [
        (
            "escape",
            "argument \"receiver\" { }\n}\n\nprometheus.remote_write \"evil\" {\n  endpoint {\n    url = \"http://127.0.0.1:9/\"\n  }\n}\n\ndeclare \"swallow\" {\n",
            "module.alloy:2:1: expected identifier, got }",
        ),
        (
            "redeclare",
            "declare \"team_b_S_web\" {\n}\n",
            "declare \"team_b_S_web\": the name of a module",
        ),
        (
            "borrow",
            "argument \"receiver\" { }\nteam_b_S_web \"mine\" {\n  receiver = argument.receiver.value\n}\n",
            // Alloy's validate, which sees the module alone, cannot find team-b's
            // block; cmpoll's check would refuse it beside team-b too.
            "\"team_b_S_web\"",
        ),
        (
            "root",
            "prometheus.scrape \"x\" {\n  targets    = []\n  forward_to = [prometheus.remote_write.default.receiver]\n}\n",
            "does not exist or is out of scope",
        ),
    ] {
        s.server
            .put(labelled("team-x", name).data("module.alloy", text));
        let reason = rejection(d, &format!("team-x/{name}"), SOON);
        assert!(reason.contains(want), "{name}: {reason}");
        assert!(
            !s.out.join(format!("team-x.{name}.alloy")).exists(),
            "{name}"
        );
        assert_eq!(components(s.alloy_port, None), base, "{name}");
    }
    a_fresh_alloy_runs(&s, &alloy, &base);
}

/// Delivery that Alloy confirms. A module that passes `alloy validate` but that Alloy
/// cannot build (`scrape_timeout` above `scrape_interval`: refused only when the component
/// is built) is delivered, Alloy says it is unhealthy, and cmpoll puts the last good
/// version back (an update) or removes it (a new module; also one that needs the
/// Kubernetes API, which Alloy's container cannot reach), rejected with Alloy's words;
/// the refused content is not delivered again. An update Alloy's validate refuses
/// (unknown attribute) and new modules with an unknown component or an unresolved
/// reference are rejected alone. Through all of it the good versions run and deliver,
/// and a fresh Alloy on the folder starts with every good module.
#[test]
fn a_module_alloy_cannot_build_goes_back_to_its_last_good_version() {
    let Some(alloy) = alloy_bin() else { return };
    let port = free_port();
    let (s, base) = two_teams(&alloy, port);
    let d = s.cmpoll.as_ref().unwrap();
    s.eventually(
        "team-a and team-b run and deliver",
        Duration::from_secs(60),
        || {
            components(s.alloy_port, None) == base
                && jobs(s.prometheus_port) == ["team-a", "team-b"]
        },
    );
    let good_b = std::fs::read_to_string(s.out.join("team-b.web.alloy")).unwrap();
    let builds_not = |job: &str| unbuildable(job, port);
    // An update Alloy cannot build: back to the last good version.
    s.server
        .put(labelled("team-b", "web").data("module.alloy", &builds_not("team-b-v2")));
    let reason = rejection(d, "team-b/web", SOON);
    assert!(
        (reason.contains("team_b_S_web.module unhealthy") || reason.contains("team-b.web.alloy:"))
            && reason.contains("scrape_timeout (5s) greater than scrape_interval (1s)"),
        "Alloy's words: {reason}"
    );
    assert_eq!(
        std::fs::read_to_string(s.out.join("team-b.web.alloy")).unwrap(),
        good_b,
        "the last good version is back in the folder"
    );
    s.eventually("Alloy runs the last good version again", SOON, || {
        components(s.alloy_port, None) == base
    });
    // A new module Alloy cannot build: removed.
    s.server
        .put(labelled("team-c", "web").data("module.alloy", &builds_not("team-c")));
    let reason = rejection(d, "team-c/web", SOON);
    assert!(reason.contains("scrape_timeout (5s)"), "{reason}");
    assert!(!s.out.join("team-c.web.alloy").exists());
    // One that needs the Kubernetes API, which Alloy's container has no access to.
    s.server.put(labelled("team-f", "pods").data(
        "module.alloy",
        "discovery.kubernetes \"pods\" {\n  role = \"pod\"\n}\n",
    ));
    let reason = rejection(d, "team-f/pods", SOON);
    assert!(
        reason.contains("unable to load in-cluster configuration"),
        "{reason}"
    );
    assert!(!s.out.join("team-f.pods.alloy").exists());
    // Refused content is remembered: three polls go by with no batch.
    d.quiet_through(&s.server, 3, 1);
    assert_eq!(components(s.alloy_port, None), base);
    // Rejected by Alloy's validate, each alone: an update with an unknown attribute (the
    // last good version keeps running), an unknown component, an unresolved reference.
    let good_a = std::fs::read_to_string(s.out.join("team-a.web.alloy")).unwrap();
    for (ns, text, want) in [
        (
            "team-a",
            scrape_module("team-a-v2", port, "").replace("job_name", "job_nam"),
            "unrecognized attribute name \"job_nam\"",
        ),
        (
            "team-d",
            "prometheus.scrapes \"x\" {\n}\n".to_string(),
            "cannot find the definition of component name \"prometheus.scrapes\"",
        ),
        (
            "team-e",
            "prometheus.scrape \"x\" {\n  targets    = []\n  forward_to = [argument.nobody.value]\n}\n"
                .to_string(),
            "argument.nobody.value",
        ),
    ] {
        s.server.put(labelled(ns, "web").data("module.alloy", &text));
        let reason = rejection(d, &format!("{ns}/web"), SOON);
        assert!(reason.contains(want), "{ns}: {reason}");
    }
    assert_eq!(
        std::fs::read_to_string(s.out.join("team-a.web.alloy")).unwrap(),
        good_a
    );
    assert!(!s.out.join("team-d.web.alloy").exists() && !s.out.join("team-e.web.alloy").exists());
    // (team-e passes validate: Alloy refuses it when built, and reloads without it.)
    s.eventually("Alloy runs the good versions only", SOON, || {
        components(s.alloy_port, None) == base
    });
    // The good versions still deliver: samples newer than the refusals arrive.
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    s.eventually(
        "team-a's and team-b's last good versions keep delivering",
        Duration::from_secs(60),
        || fresh_jobs(s.prometheus_port, since) == ["team-a", "team-b"],
    );
    a_fresh_alloy_runs(&s, &alloy, &base);
}

/// The jobs with an `up` sample newer than `since` (seconds since the epoch).
fn fresh_jobs(port: u16, since: f64) -> Vec<String> {
    let Some((200, body)) = crate::util::tools::curl(&format!(
        "http://127.0.0.1:{port}/api/v1/query?query=timestamp(up)"
    )) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let mut jobs: Vec<String> = (v["data"]["result"].as_array().into_iter().flatten())
        .filter(|r| {
            (r["value"][1].as_str())
                .and_then(|t| t.parse::<f64>().ok())
                .is_some_and(|t| t > since)
        })
        .filter_map(|r| r["metric"]["job"].as_str().map(str::to_string))
        .collect();
    jobs.sort();
    jobs
}

/// Isolation needs no validator: through an Alloy template (one with `{{arguments}}`),
/// `--out-dir` refuses a module whose text would leave its block, and writes the others.
#[test]
fn the_template_keeps_a_module_in_its_block_without_a_validator() {
    let server = TestApiserver::start();
    server.put(labelled("team-a", "web").data("module.alloy", "argument \"receiver\" { }\n"));
    server.put(labelled("team-x", "escape").data(
        "module.alloy",
        "}\nprometheus.remote_write \"evil\" { }\ndeclare \"swallow\" {\n",
    ));
    let c = Cmpoll::against(&server);
    let out = c.out();
    let mut args = vec!["run".to_string(), "--once".into(), "--stdout-events".into()];
    args.extend(shipped_args(&out));
    let r = c.with_args(&args).run();
    let events: Vec<Value> = (r.stdout.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |m: &str| {
        (events.iter())
            .find(|e| e["module"] == m)
            .unwrap_or_else(|| panic!("{m}: {}", r.described))
    };
    assert_eq!(of("team-a/web")["type"], "added");
    let x = of("team-x/escape");
    assert_eq!(x["type"], "rejected", "{}", r.described);
    assert!(
        x["reason"]
            .as_str()
            .unwrap()
            .starts_with("module.alloy:1:1: expected identifier, got }"),
        "{x}"
    );
    assert!(out.join("team-a.web.alloy").exists());
    assert!(!out.join("team-x.escape.alloy").exists());
}

/// Restart-proof at any moment: Alloy goes down just as an update it cannot build is
/// written (a crash, a rollout mid-batch). cmpoll cannot ask it, so it puts back what
/// Alloy had (an Alloy that could not start because of the batch would never be asked
/// again otherwise); Alloy started on the folder then runs every good module; the update
/// comes again, Alloy refuses it, and it goes back to its last good version.
#[test]
fn an_alloy_restarted_mid_batch_starts_with_every_good_module() {
    let Some(alloy) = alloy_bin() else { return };
    let port = free_port();
    let (mut s, base) = two_teams(&alloy, port);
    let good_b = std::fs::read_to_string(s.out.join("team-b.web.alloy")).unwrap();
    let _ = s.alloy.0.kill();
    let _ = s.alloy.0.wait();
    s.server
        .put(labelled("team-b", "web").data("module.alloy", &unbuildable("team-b-v2", port)));
    let d = s.cmpoll.as_ref().unwrap();
    let delivered = d.batch(SOON);
    assert!(
        delivered
            .iter()
            .any(|e| e["type"] == "updated" && e["module"] == "team-b/web"),
        "{delivered:?}"
    );
    let back = d.batch(SOON);
    assert!(
        back.iter()
            .any(|e| e["type"] == "updated" && e["module"] == "team-b/web"),
        "{back:?}"
    );
    assert_eq!(
        std::fs::read_to_string(s.out.join("team-b.web.alloy")).unwrap(),
        good_b,
        "put back while Alloy cannot be asked"
    );
    // Alloy starts again on the folder, where cmpoll expects it.
    s.alloy = alloy_on(&alloy, &s.out, s.alloy_port, &s.logs, "alloy-again");
    let d = s.cmpoll.as_ref().unwrap();
    let reason = rejection(d, "team-b/web", Duration::from_secs(30));
    assert!(reason.contains("scrape_timeout (5s)"), "{reason}");
    assert_eq!(
        std::fs::read_to_string(s.out.join("team-b.web.alloy")).unwrap(),
        good_b
    );
    s.eventually("Alloy runs every good module", SOON, || {
        components(s.alloy_port, None) == base
    });
    a_fresh_alloy_runs(&s, &alloy, &base);
}

/// The targets a module's `prometheus.scrape "default"` scrapes on the Alloy at `port`
/// (its debug information), by their label `n`, sorted.
fn scraped_targets(port: u16, module: &str) -> Vec<String> {
    let Some((200, body)) = crate::util::tools::curl(&format!(
        "http://127.0.0.1:{port}/api/v0/web/components/{module}%2Fprometheus.scrape.default"
    )) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let mut ns: Vec<String> = (v["debugInfo"].as_array().into_iter().flatten())
        .filter(|b| b["name"] == "target")
        .flat_map(|b| b["body"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["name"] == "labels")
        .flat_map(|a| a["value"]["value"].as_array().cloned().unwrap_or_default())
        .filter(|l| l["key"] == "n")
        .filter_map(|l| l["value"]["value"].as_str().map(str::to_string))
        .collect();
    ns.sort();
    ns
}

/// k8s/alloy-clustered: two replicas, each its own cmpoll and Alloy, the Alloys one
/// cluster (`--cluster.enabled`, as the shape's args say; peers joined by address here,
/// where the shape uses its headless Service). The shape offers `clustered = true`: a module
/// that puts it in its scrape's clustering block has its targets shared out, each scraped by
/// exactly one replica. Alloy places a target by a hash of its labels, which hold a random
/// port: with six targets all landed on one replica in about one run of 32 (CI saw it), so
/// there are 24 (one run in eight million). With k8s/alloy's arguments (`clustered = false`) every
/// replica scrapes every target: the duplicate the clustered shape exists to avoid.
#[test]
fn a_clustered_pair_of_alloys_scrapes_each_target_once() {
    let Some(alloy) = alloy_bin() else { return };
    let rendered = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join("k8s/alloy-clustered"))
        .output()
        .unwrap();
    let rendered = String::from_utf8_lossy(&rendered.stdout).to_string();
    assert!(
        rendered.contains("- --cluster.enabled=true") && rendered.contains("replicas: 2"),
        "{rendered}"
    );
    let ports = [free_port(), free_port()];
    const TARGETS: usize = 24;
    let targets: Vec<String> = (0..TARGETS)
        .map(|i| {
            format!(
                "{{\"__address__\" = \"127.0.0.1:{}\", \"n\" = \"{i}\"}}",
                ports[i % 2]
            )
        })
        .collect();
    let module = format!(
        "argument \"receiver\" {{ }}\nargument \"clustered\" {{\n  optional = true\n  default  = false\n}}\n\nprometheus.scrape \"default\" {{\n  targets         = [{}]\n  forward_to      = [argument.receiver.value]\n  scrape_interval = \"1s\"\n  scrape_timeout  = \"1s\"\n  clustering {{\n    enabled = argument.clustered.value\n  }}\n}}\n",
        targets.join(", ")
    );
    let server = TestApiserver::start();
    server.put(labelled("team-a", "web").data("module.alloy", &module));
    let shared_out = |offered: &Path| -> Vec<Vec<String>> {
        let c = Cmpoll::against(&server);
        let dir = c.path("replicas");
        let mut alloys = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let out = dir.join(format!("modules-{i}"));
            std::fs::create_dir_all(&out).unwrap();
            root_config(&out, free_port());
            let mut args = vec!["run".to_string(), "--once".into()];
            args.extend(shipped_args(&out));
            let at = args.iter().position(|a| a == "--offer-arguments").unwrap();
            args[at + 1] = offered.to_str().unwrap().into();
            let r = c.with_args(&args).run();
            assert_eq!(r.code, Some(0), "{}", r.described);
            let peer = ports[1 - i];
            alloys.push(KillOnDrop(
                Command::new(&alloy)
                    .arg("run")
                    .arg(format!("--server.http.listen-addr=127.0.0.1:{port}"))
                    .arg(format!(
                        "--storage.path={}",
                        dir.join(format!("data-{i}")).display()
                    ))
                    .arg("--cluster.enabled=true")
                    .arg(format!("--cluster.node-name=replica-{i}"))
                    .arg(format!("--cluster.advertise-address=127.0.0.1:{port}"))
                    .arg(format!("--cluster.join-addresses=127.0.0.1:{peer}"))
                    .arg(&out)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            ));
        }
        let peers = |port: u16| {
            crate::util::tools::curl(&format!("http://127.0.0.1:{port}/api/v0/web/peers"))
                .map(|(_, body)| body.matches("\"participant\"").count())
                .unwrap_or(0)
        };
        let scraped = || -> Vec<Vec<String>> {
            (ports.iter())
                .map(|p| scraped_targets(*p, "team_a_S_web.module"))
                .collect()
        };
        eventually_explained(
            "both replicas are in the cluster and scrape what it gives them",
            Duration::from_secs(60),
            || {
                let now = scraped();
                ports.iter().all(|p| peers(*p) == 2)
                    && now.iter().map(Vec::len).sum::<usize>() >= TARGETS
                    && now.iter().all(|t| !t.is_empty())
            },
            || {
                let peers: Vec<usize> = ports.iter().map(|p| peers(*p)).collect();
                format!(
                    "participants seen by each: {peers:?}, scraped: {:?}",
                    scraped()
                )
            },
        );
        // Settled: the ring does not move once both are participants.
        std::thread::sleep(Duration::from_secs(3));
        let settled = scraped();
        drop(alloys);
        settled
    };
    let clustered = shared_out(&root().join("k8s/alloy-clustered/offered-arguments"));
    let (a, b) = (&clustered[0], &clustered[1]);
    assert_eq!(
        a.len() + b.len(),
        TARGETS,
        "each target once: {clustered:?}"
    );
    assert!(a.iter().all(|t| !b.contains(t)), "{clustered:?}");
    let alone = shared_out(&root().join("k8s/alloy/offered-arguments"));
    assert_eq!(alone[0].len(), TARGETS, "{alone:?}");
    assert_eq!(alone[0], alone[1], "unclustered, both scrape all");
}

/// Not a check: how long a batch of 100 modules takes to validate (`alloy fmt` and
/// `alloy validate` per module, one at a time as k8s/alloy runs them) and to be confirmed
/// by Alloy (a reload and one look at its components). Prints the figures for
/// docs/performance.md: `cargo test --release --test tests -- --ignored
/// alloy_modules::a_batch_of_100_modules --nocapture`.
#[test]
#[ignore]
fn a_batch_of_100_modules_validated_and_confirmed() {
    let Some(alloy) = alloy_bin() else { return };
    let port = free_port();
    let s = confirmed_stack(&alloy, port, &[]);
    let d = s.cmpoll.as_ref().unwrap();
    let start = std::time::Instant::now();
    for i in 0..100 {
        s.server
            .put(labelled("team-a", &format!("web-{i:03}")).data(
                "module.alloy",
                &scrape_module(&format!("job-{i}"), port, ""),
            ));
    }
    let put = start.elapsed();
    let b = d.batch(Duration::from_secs(600));
    let delivered = start.elapsed();
    let added = b.iter().filter(|e| e["type"] == "added").count();
    s.eventually(
        "Alloy runs the 100 modules",
        Duration::from_secs(120),
        || components(s.alloy_port, None).len() == 101,
    );
    let line = || {
        (d.stderr().lines())
            .find(|l| l.contains("--confirm: the agent took the batch and answered for 100"))
            .map(str::to_string)
    };
    s.eventually("cmpoll says how long the confirmation took", SOON, || {
        line().is_some()
    });
    let confirmed = line().unwrap_or_default();
    println!(
        "100 modules: put in {put:?}; validated and written ({added} added) {delivered:?} after the first put (a 200 ms poll interval included); confirmation: {confirmed}"
    );
}

/// Restart-proof across cmpoll's own restart with a new template: Alloy refused team-b's
/// update; cmpoll restarts with a changed template, rewrites every module through it,
/// keeps team-b at its last good version (the refusal is remembered in the folder's
/// record, not asked again) and has Alloy confirm them; a fresh Alloy on the folder runs
/// every good module.
#[test]
fn a_refusal_outlives_a_restart_with_a_new_template() {
    let Some(alloy) = alloy_bin() else { return };
    let port = free_port();
    let (mut s, base) = two_teams(&alloy, port);
    s.server
        .put(labelled("team-b", "web").data("module.alloy", &unbuildable("team-b-v2", port)));
    rejection(s.cmpoll.as_ref().unwrap(), "team-b/web", SOON);
    // Stopped, its folder kept (the daemon's own folder holds it).
    let mut old = s.cmpoll.take().unwrap();
    old.signal("TERM");
    eventually_explained(
        "cmpoll stops",
        SOON,
        || !old.is_running(),
        || "still running".into(),
    );
    // The same shape, a template with one line more.
    let c = Cmpoll::against(&s.server);
    let template = c.path("module.tmpl");
    let shipped = std::fs::read_to_string(root().join("k8s/alloy/module.tmpl")).unwrap();
    std::fs::write(&template, format!("// template v2\n{shipped}")).unwrap();
    let c = c
        .env("ALLOY", alloy.to_str().unwrap())
        .env("ALLOY_ROOT", s.out.join("root.alloy").to_str().unwrap())
        .env("ALLOY_URL", &format!("http://127.0.0.1:{}", s.alloy_port))
        .env("ALLOY_WAIT", "2");
    let k8s = root().join("k8s/alloy");
    let mut args = shipped_args(&s.out);
    let at = args.iter().position(|a| a == "--module-template").unwrap();
    args[at + 1] = template.to_str().unwrap().into();
    args.extend(
        [
            "--validate",
            k8s.join("check-module.sh").to_str().unwrap(),
            "--confirm",
            k8s.join("confirm-modules.sh").to_str().unwrap(),
            "--stdout-events",
            "--interval",
            "200ms",
        ]
        .map(str::to_string),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start(c, &args);
    let b = d.batch(SOON);
    let of = |m: &str, t: &str| b.iter().any(|e| e["module"] == m && e["type"] == t);
    assert!(
        of("team-a/web", "added") && of("team-b/web", "added") && of("team-b/web", "rejected"),
        "the last good version, then the refusal remembered: {b:?}"
    );
    let written = std::fs::read_to_string(s.out.join("team-b.web.alloy")).unwrap();
    assert!(
        written.starts_with("// template v2\n") && written.contains("job_name        = \"team-b\""),
        "team-b's last good version, through the new template: {written}"
    );
    eventually_explained(
        "Alloy takes the rewritten folder",
        SOON,
        || {
            d.stderr().contains(
                "--confirm: the agent took the batch and answered for 2 module(s), refusing 0",
            ) && components(s.alloy_port, None) == base
        },
        || format!("{:?}\n{}", components(s.alloy_port, None), d.stderr()),
    );
    a_fresh_alloy_runs(&s, &alloy, &base);
}

/// One team cannot get another's update refused: team-x's module fails to build with a
/// message that names team-b's file (its job name is `/team-b.web.alloy:`, which Alloy
/// quotes), in the same batch as team-b's good update. Alloy's reload names team-x's
/// failure; team-b's module is built and healthy, and that is what decides for it.
#[test]
fn a_module_cannot_get_another_teams_update_refused() {
    let Some(alloy) = alloy_bin() else { return };
    let port = free_port();
    let (s, _) = two_teams(&alloy, port);
    let d = s.cmpoll.as_ref().unwrap();
    let evil = unbuildable("/team-b.web.alloy:", port);
    s.server
        .put(labelled("team-x", "evil").data("module.alloy", &evil));
    s.server
        .put(labelled("team-b", "web").data("module.alloy", &scrape_module("team-b-v2", port, "")));
    // The moment: both in one batch (else the test would prove nothing).
    let b = d.batch(SOON);
    let has = |m: &str, t: &str| b.iter().any(|e| e["module"] == m && e["type"] == t);
    assert!(
        has("team-x/evil", "added") && has("team-b/web", "updated"),
        "one batch: {b:?}"
    );
    let reason = rejection(d, "team-x/evil", SOON);
    assert!(reason.contains("scrape_timeout (5s)"), "{reason}");
    let written = std::fs::read_to_string(s.out.join("team-b.web.alloy")).unwrap();
    assert!(
        written.contains("job_name        = \"team-b-v2\""),
        "{written}\n{}",
        d.stderr()
    );
    assert!(
        !d.stderr().contains("module team-b/web rejected"),
        "{}",
        d.stderr()
    );
}
