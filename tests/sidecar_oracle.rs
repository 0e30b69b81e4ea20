//! k8s-sidecar as the oracle of `cmpoll sidecar` (issue 26): the same scenarios — the
//! same environment, objects and steps — run against kiwigrid/k8s-sidecar 2.10.1 itself
//! and against cmpoll, and what each leaves is compared: the folder tree (paths, contents,
//! modes), the reload calls (method, path, body, basic auth; whether a step made one, not
//! how many), whether `SCRIPT` ran, and `/healthz`.
//!
//! k8s-sidecar is not in CI: its answers are recorded as golden files
//! (`tests/fixtures/k8s-sidecar/2.10.1/<scenario>.json`, each saying the version and the
//! command that recorded it) by `record_k8s_sidecar`, which runs where a copy of its
//! source and a virtualenv are (K8S_SIDECAR=DIR, see HACKING.md) and fails where its
//! answer differs from the golden (RECORD=1 writes it instead). `cmpoll_answers_as_k8s_
//! sidecar` compares cmpoll with the goldens in every CI run. Where SPEC lists a
//! deliberate difference, the scenario says what cmpoll leaves instead (its `differs`),
//! and that is asserted, not k8s-sidecar's answer.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use test_apiserver::{ConfigMap, Grant, Kubeconfig, TestApiserver, USER};

use crate::util::http::{Call, try_get, web_server};

const VERSION: &str = "2.10.1";
const COMMIT: &str = "a61c7ac3";

/// One change to the cluster.
#[derive(Clone)]
enum Change {
    Put(ConfigMap),
    Delete(&'static str, &'static str),
    DeleteSecret(&'static str, &'static str),
}

struct Step {
    what: &'static str,
    changes: Vec<Change>,
}

/// What cmpoll leaves where it differs from k8s-sidecar on purpose (SPEC), for one step:
/// files whose k8s-sidecar answer is replaced (`None`: absent for cmpoll).
type Differs = Vec<(usize, &'static str, Option<&'static str>)>;

struct Scenario {
    name: &'static str,
    /// k8s-sidecar's variables; `{ROOT}` is the scenario's folder, `{WEB}` a web server
    /// of the test's own (pages and reload endpoint), `{SCRIPT}` a script that notes runs.
    env: Vec<(&'static str, &'static str)>,
    /// The service account's namespace file.
    pod_namespace: &'static str,
    steps: Vec<Step>,
    differs: Differs,
}

fn cm(ns: &str, name: &str) -> ConfigMap {
    ConfigMap::new(ns, name).label("grafana_dashboard", "1")
}

fn secret(ns: &str, name: &str) -> ConfigMap {
    ConfigMap::secret(ns, name).label("grafana_dashboard", "1")
}

fn step(what: &'static str, changes: Vec<Change>) -> Step {
    Step { what, changes }
}

use Change::{Delete, DeleteSecret, Put};

const BASE: &[(&str, &str)] = &[
    ("LABEL", "grafana_dashboard"),
    ("LABEL_VALUE", "1"),
    ("FOLDER", "{ROOT}/out"),
    ("METHOD", "SLEEP"),
    ("SLEEP_TIME", "1"),
    ("NAMESPACE", "mon"),
    ("REQ_URL", "{WEB}/reload"),
];

fn env(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut e: Vec<(&str, &str)> = BASE.to_vec();
    for (k, v) in extra {
        e.retain(|(k2, _)| k2 != k);
        e.push((k, v));
    }
    e
}

fn scenarios() -> Vec<Scenario> {
    let png: &[u8] = &[0x89, b'P', b'N', b'G', 13, 10, 26, 10, 0, 255];
    vec![
        Scenario {
            name: "plain",
            env: env(&[]),
            pod_namespace: "mon",
            steps: vec![
                step(
                    "two dashboards, one unlabelled ConfigMap",
                    vec![
                        Put(cm("mon", "a")
                            .data("a.json", "{\"a\":1}")
                            .data("b.yaml", "b: 1\n")),
                        Put(cm("mon", "c").data("c.json", "{}")),
                        Put(ConfigMap::new("mon", "other").data("o.json", "{}")),
                    ],
                ),
                step(
                    "a key changed, one added, one removed",
                    vec![Put(cm("mon", "a")
                        .data("a.json", "{\"a\":2}")
                        .data("n.json", "[]"))],
                ),
                step(
                    "the label changed: its files go",
                    vec![Put(ConfigMap::new("mon", "a")
                        .label("grafana_dashboard", "0")
                        .data("a.json", "{\"a\":2}"))],
                ),
                step("deleted", vec![Delete("mon", "c")]),
            ],
            differs: vec![],
        },
        Scenario {
            name: "binary-secrets-modes",
            env: env(&[("RESOURCE", "both"), ("DEFAULT_FILE_MODE", "640")]),
            pod_namespace: "mon",
            steps: vec![
                step(
                    "binaryData, a Secret, a file mode",
                    vec![
                        Put(cm("mon", "logo")
                            .binary("logo.png", png)
                            .data("t.txt", "text")),
                        Put(secret("mon", "creds").data("ds.yaml", "password: x\n")),
                    ],
                ),
                step(
                    "the Secret's key renamed",
                    vec![Put(
                        secret("mon", "creds").data("datasource.yaml", "password: y\n")
                    )],
                ),
            ],
            differs: vec![],
        },
        Scenario {
            name: "both-same-name",
            env: env(&[("RESOURCE", "both")]),
            pod_namespace: "mon",
            steps: vec![
                step(
                    "a ConfigMap and a Secret of the same name",
                    vec![
                        Put(cm("mon", "x").data("cm.txt", "cm")),
                        Put(secret("mon", "x").data("secret.txt", "secret")),
                    ],
                ),
                step(
                    "both renamed their keys",
                    vec![
                        Put(cm("mon", "x").data("cm2.txt", "cm")),
                        Put(secret("mon", "x").data("secret2.txt", "secret")),
                    ],
                ),
                step("the Secret deleted", vec![DeleteSecret("mon", "x")]),
            ],
            differs: vec![],
        },
        Scenario {
            name: "unique-filenames",
            env: env(&[("RESOURCE", "both"), ("UNIQUE_FILENAMES", "true")]),
            pod_namespace: "mon",
            steps: vec![
                step(
                    "the same key in a ConfigMap and a Secret, and in two namespaces",
                    vec![
                        Put(cm("mon", "x").data("a.json", "cm")),
                        Put(secret("mon", "x").data("a.json", "secret")),
                    ],
                ),
                step("one deleted", vec![Delete("mon", "x")]),
            ],
            differs: vec![],
        },
        Scenario {
            name: "folder-annotation",
            env: env(&[]),
            pod_namespace: "mon",
            steps: vec![
                step(
                    "relative, nested, absolute inside the folder, none",
                    vec![
                        Put(cm("mon", "rel")
                            .annotation("k8s-sidecar-target-directory", "team-a")
                            .data("rel.json", "1")),
                        Put(cm("mon", "nested")
                            .annotation("k8s-sidecar-target-directory", "team-b/sub")
                            .data("nested.json", "2")),
                        Put(cm("mon", "abs")
                            .annotation("k8s-sidecar-target-directory", "{ROOT}/out/abs")
                            .data("abs.json", "3")),
                        Put(cm("mon", "none").data("none.json", "4")),
                    ],
                ),
                step(
                    "an annotation changed",
                    vec![Put(cm("mon", "rel")
                        .annotation("k8s-sidecar-target-directory", "team-c")
                        .data("rel.json", "1"))],
                ),
                step(
                    "an annotation removed",
                    vec![Put(cm("mon", "nested").data("nested.json", "2"))],
                ),
            ],
            differs: vec![],
        },
        Scenario {
            name: "folder-annotation-escapes",
            env: env(&[]),
            pod_namespace: "mon",
            steps: vec![step(
                "a relative value with .., an absolute one elsewhere",
                vec![
                    Put(cm("mon", "up")
                        .annotation("k8s-sidecar-target-directory", "../escaped")
                        .data("up.json", "1")),
                    Put(cm("mon", "abs")
                        .annotation("k8s-sidecar-target-directory", "{ROOT}/elsewhere")
                        .data("abs.json", "2")),
                    Put(cm("mon", "fine").data("fine.json", "3")),
                ],
            )],
            // SPEC: nothing is written outside FOLDER; such a module is rejected.
            differs: vec![
                (0, "escaped/up.json", None),
                (0, "elsewhere/abs.json", None),
            ],
        },
        Scenario {
            name: "namespaces",
            env: env(&[("NAMESPACE", "a,b")]),
            pod_namespace: "mon",
            steps: vec![step(
                "objects in a listed namespace, another listed one, and one not listed",
                vec![
                    Put(cm("a", "x").data("a.txt", "a")),
                    Put(cm("b", "y").data("b.txt", "b")),
                    Put(cm("c", "z").data("c.txt", "c")),
                ],
            )],
            differs: vec![],
        },
        Scenario {
            name: "namespace-all",
            env: env(&[("NAMESPACE", "ALL")]),
            pod_namespace: "mon",
            steps: vec![
                step(
                    "objects in three namespaces",
                    vec![
                        Put(cm("a", "x").data("a.txt", "a")),
                        Put(cm("b", "y").data("b.txt", "b")),
                        Put(cm("mon", "z").data("m.txt", "m")),
                    ],
                ),
                step("one deleted", vec![Delete("b", "y")]),
            ],
            differs: vec![],
        },
        Scenario {
            name: "namespace-unset",
            env: env(&[])
                .into_iter()
                .filter(|(k, _)| *k != "NAMESPACE")
                .collect(),
            pod_namespace: "team-a",
            steps: vec![step(
                "objects in the pod's namespace and another",
                vec![
                    Put(cm("team-a", "x").data("mine.txt", "mine")),
                    Put(cm("mon", "y").data("not-mine.txt", "no")),
                ],
            )],
            differs: vec![],
        },
        Scenario {
            name: "payload-auth-skip-init",
            env: env(&[
                ("REQ_METHOD", "POST"),
                ("REQ_PAYLOAD", "{\"reason\":\"sidecar\"}"),
                ("REQ_SKIP_INIT", "true"),
                ("REQ_USERNAME", "admin"),
                ("REQ_PASSWORD", "s3cret"),
            ]),
            pod_namespace: "mon",
            steps: vec![
                step(
                    "the initial sync: no call",
                    vec![Put(cm("mon", "a").data("a.json", "1"))],
                ),
                step(
                    "a change: a POST with the payload and basic auth",
                    vec![Put(cm("mon", "a").data("a.json", "2"))],
                ),
            ],
            differs: vec![],
        },
        Scenario {
            name: "url-keys",
            env: env(&[("REQ_USERNAME", "user1"), ("REQ_PASSWORD", "pw")]),
            pod_namespace: "mon",
            steps: vec![step(
                "a text .url, a binary .url, one behind basic auth, one that fails",
                vec![
                    Put(cm("mon", "u")
                        .data("page.json.url", "{WEB}/page.json")
                        .binary("logo.png.url", b"{WEB}/logo.png")),
                    Put(cm("mon", "s").data("secured.txt.url", "{WEB}/secured")),
                    Put(cm("mon", "bad").data("missing.txt.url", "{WEB}/missing")),
                ],
            )],
            // SPEC: a failed download rejects the module (k8s-sidecar writes an empty file).
            differs: vec![(0, "out/missing.txt", None)],
        },
        Scenario {
            name: "script",
            env: env(&[("SCRIPT", "{SCRIPT}")]),
            pod_namespace: "mon",
            steps: vec![
                step(
                    "the initial sync runs it",
                    vec![Put(cm("mon", "a").data("a.json", "1"))],
                ),
                step(
                    "a change runs it",
                    vec![Put(cm("mon", "a").data("a.json", "2"))],
                ),
            ],
            differs: vec![],
        },
        Scenario {
            name: "key-clash",
            env: env(&[]),
            pod_namespace: "mon",
            steps: vec![
                step(
                    "two ConfigMaps with the same key",
                    vec![
                        Put(cm("mon", "first").data("same.json", "first")),
                        Put(cm("mon", "second").data("same.json", "second")),
                    ],
                ),
                step("the holder deleted", vec![Delete("mon", "first")]),
            ],
            // SPEC: the first holder keeps the key (k8s-sidecar: the last writer wins);
            // when it goes, the waiting one is published.
            differs: vec![(0, "out/same.json", Some("first"))],
        },
    ]
}

/// What one contender left after one step: the files under its folder (but for cmpoll's
/// own `.cmpoll` and the test's own `test/`), the distinct reload calls since `calls`
/// began, whether there was one, whether `SCRIPT` ran, and `/healthz`'s status.
fn observe(root: &Path, calls: &[Call], ran: bool, health: &str) -> Value {
    let mut files = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if rel == "test" || rel == "out/.cmpoll" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                todo.push(path);
            } else if meta.is_file() {
                let bytes = std::fs::read(&path).unwrap_or_default();
                let content = match String::from_utf8(bytes) {
                    Ok(t) => json!(t),
                    Err(e) => {
                        json!({"base64": base64::engine::general_purpose::STANDARD.encode(e.into_bytes())})
                    }
                };
                let mode = format!("{:04o}", meta.permissions().mode() & 0o7777);
                files.insert(rel, json!({"content": content, "mode": mode}));
            }
        }
    }
    let reloads: Vec<&Call> = calls
        .iter()
        .filter(|(line, _)| line.contains("/reload"))
        .collect();
    let mut distinct: Vec<Value> = reloads
        .iter()
        .map(|(line, h)| {
            // A body as the JSON it is (Python writes `{"a": 1}`, serde `{"a":1}`).
            let body = h
                .get(" body")
                .map(|b| serde_json::from_str::<Value>(b).unwrap_or(json!(b)));
            json!({
                "request": line.split_whitespace().take(2).collect::<Vec<_>>().join(" "),
                "authorization": h.get("authorization"),
                "content-type": h.get("content-type"),
                "body": body,
            })
        })
        .collect();
    distinct.sort_by_key(|v| v.to_string());
    distinct.dedup();
    let healthz = try_get(health, "/healthz").map(|(code, _)| code);
    json!({
        "files": files,
        "reloads": distinct,
        "reloaded": !reloads.is_empty(),
        "script_ran": ran,
        "healthz": healthz,
    })
}

/// A contender running one scenario: its folder, its web server (pages and reload
/// endpoint) with the calls it got, its process.
struct Run {
    root: tempfile::TempDir,
    web: String,
    calls: Arc<Mutex<Vec<Call>>>,
    health: String,
    /// What `launch` starts.
    command: Option<Command>,
    child: Child,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Run {
    fn root(&self) -> &Path {
        self.root.path()
    }

    fn script_log(&self) -> PathBuf {
        self.root().join("test/script.log")
    }

    /// The observation now, of what happened since call `since` and the script's log
    /// was last emptied.
    fn observe(&self, since: usize) -> Value {
        let calls = self.calls.lock().unwrap()[since..].to_vec();
        let ran = std::fs::read_to_string(self.script_log()).is_ok_and(|s| !s.is_empty());
        observe(self.root(), &calls, ran, &self.health)
    }

    /// Starts the contender.
    fn launch(&mut self) {
        let _ = self.child.wait();
        let mut cmd = self.command.take().expect("launched once");
        self.child = cmd.spawn().unwrap();
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.root().join("test/stderr.log")).unwrap_or_default()
    }
}

/// The web server both contenders read `.url` keys from and call `REQ_URL` on.
fn web() -> (String, Arc<Mutex<Vec<Call>>>) {
    web_server(|path, headers| match path {
        "/page.json" => (200, vec![], b"{\"page\":true}".to_vec()),
        "/logo.png" => (200, vec![], vec![0x89, b'P', b'N', b'G', 0, 1, 255]),
        // printf user1:pw | base64
        "/secured"
            if headers.get("authorization").map(String::as_str) == Some("Basic dXNlcjE6cHc=") =>
        {
            (200, vec![], b"allowed".to_vec())
        }
        "/secured" => (401, vec![], b"unauthorized".to_vec()),
        p if p.starts_with("/reload") => (200, vec![], b"{}".to_vec()),
        _ => (404, vec![], b"not found".to_vec()),
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `{ROOT}`, `{WEB}` and `{SCRIPT}` filled in.
fn fill(v: &str, run: &Run) -> String {
    v.replace("{ROOT}", &run.root().display().to_string())
        .replace("{WEB}", &run.web)
        .replace(
            "{SCRIPT}",
            &run.root().join("test/note.sh").display().to_string(),
        )
}

/// An object with its placeholders filled in.
fn filled(c: &ConfigMap, run: &Run) -> ConfigMap {
    let mut c = c.clone();
    for v in c.data.values_mut() {
        *v = fill(v, run);
    }
    for v in c.binary_data.values_mut() {
        *v = fill(&String::from_utf8_lossy(v), run).into_bytes();
    }
    for v in c.annotations.values_mut() {
        *v = fill(v, run);
    }
    c
}

/// Which program runs a scenario.
#[derive(Clone, Copy)]
enum Contender<'a> {
    Cmpoll,
    /// k8s-sidecar's source (`src/`) and virtualenv (`venv/`) in this folder.
    K8sSidecar(&'a Path),
}

fn start(who: Contender, s: &Scenario, server: &TestApiserver) -> Run {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("test")).unwrap();
    let log = root.path().join("test/script.log");
    let script = root.path().join("test/note.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho ran >> '{}'\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (web, calls) = web();
    let kubeconfig =
        server.write_kubeconfig(&root.path().join("test/kubeconfig"), &Kubeconfig::token());
    let port = free_port();
    let stderr = std::fs::File::create(root.path().join("test/stderr.log")).unwrap();
    let mut run = Run {
        root,
        web,
        calls,
        health: format!("127.0.0.1:{port}"),
        command: None,
        // Replaced by `launch`: a process that is already gone.
        child: Command::new("true").spawn().unwrap(),
    };
    let mut env: Vec<(String, String)> = s
        .env
        .iter()
        .map(|(k, v)| (k.to_string(), fill(v, &run)))
        .collect();
    env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
    env.push(("HEALTH_HOST".into(), "127.0.0.1".into()));
    env.push(("HEALTH_PORT".into(), port.to_string()));
    env.push(("PATH".into(), std::env::var("PATH").unwrap_or_default()));
    env.push(("HOME".into(), run.root().display().to_string()));
    let mut cmd = match who {
        Contender::Cmpoll => {
            let sa = run.root().join("test/serviceaccount");
            std::fs::create_dir_all(&sa).unwrap();
            std::fs::write(sa.join("namespace"), s.pod_namespace).unwrap();
            env.push((
                "CMPOLL_SERVICE_ACCOUNT_DIR".into(),
                sa.display().to_string(),
            ));
            // Quicker than SLEEP_TIME=1, so the steps settle sooner; what is compared does
            // not depend on it.
            env.push(("CMPOLL_INTERVAL".into(), "200ms".into()));
            let mut c = Command::new(crate::util::bin());
            c.arg("sidecar");
            c
        }
        Contender::K8sSidecar(dir) => {
            // It opens the service account's namespace file even off-cluster: a private
            // mount namespace gives it one (/var/run is /run on Debian).
            let mut c = Command::new("unshare");
            c.args(["-m", "--propagation", "private", "sh", "-c"])
                .arg(format!(
                    "umask 022 && mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && printf %s '{}' > /run/secrets/kubernetes.io/serviceaccount/namespace && exec \"$0\" -u sidecar.py",
                    s.pod_namespace
                ))
                .arg(dir.join("venv/bin/python"))
                .current_dir(dir.join("src"));
            c
        }
    };
    // Only what the scenario sets (and what a process needs to run), as a pod has.
    cmd.env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    let _ = run.child.wait();
    run.command = Some(cmd);
    run
}

/// Plays a scenario: each step's changes, then its observation once settled. k8s-sidecar
/// has settled when what it leaves has not changed for 4 s (4 of its passes); cmpoll when
/// it leaves what `expected` says (or 20 s passed, and the comparison shows the difference).
fn play(who: Contender, s: &Scenario, expected: Option<&[Value]>) -> (Vec<Value>, String) {
    let server = TestApiserver::start();
    server.grant(USER, Grant::all().resources(&["configmaps", "secrets"]));
    let mut run = start(who, s, &server);
    let mut out = Vec::new();
    let mut since = 0;
    for (i, st) in s.steps.iter().enumerate() {
        for c in &st.changes {
            match c {
                Put(cm) => drop(server.put(filled(cm, &run))),
                Delete(ns, name) => server.delete(ns, name),
                DeleteSecret(ns, name) => server.delete_secret(ns, name),
            }
        }
        // The first step is what the cluster holds when the sidecar starts: its initial
        // sync (what REQ_SKIP_INIT skips).
        if i == 0 {
            run.launch();
        }
        let want = expected.map(|e| &e[i]);
        let seen = settle(&run, since, want);
        since = run.calls.lock().unwrap().len();
        let _ = std::fs::write(run.script_log(), "");
        out.push(json!({"step": st.what, "seen": seen}));
    }
    let stderr = run.stderr();
    (out, stderr)
}

fn settle(run: &Run, since: usize, want: Option<&Value>) -> Value {
    let start = Instant::now();
    let quiet = Duration::from_secs(4);
    let mut last = Value::Null;
    let mut last_change = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = run.observe(since);
        match want {
            Some(want) if &now == want => return now,
            Some(_) if start.elapsed() > Duration::from_secs(20) => return now,
            Some(_) => continue,
            None => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never settled: {now}"
        );
        if now != last {
            last = now;
            last_change = Instant::now();
        } else if last_change.elapsed() > quiet {
            return now;
        }
    }
}

fn golden_path(s: &Scenario) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/k8s-sidecar")
        .join(VERSION)
        .join(format!("{}.json", s.name))
}

/// A golden file's observations, with what cmpoll leaves instead where it differs on
/// purpose (`Scenario::differs`).
fn expected(s: &Scenario) -> Vec<Value> {
    let path = golden_path(s);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (recorded by record_k8s_sidecar)", path.display()));
    let golden: Value = serde_json::from_str(&text).unwrap();
    let mut steps: Vec<Value> = (golden["steps"].as_array().unwrap().iter())
        .map(|s| s["seen"].clone())
        .collect();
    assert_eq!(
        steps.len(),
        s.steps.len(),
        "{}: the golden has other steps",
        s.name
    );
    for (i, file, instead) in &s.differs {
        let files = steps[*i]["files"].as_object_mut().unwrap();
        match instead {
            None => {
                files.remove(*file);
            }
            Some(content) => {
                let mode = files
                    .get(*file)
                    .map_or(json!("0644"), |f| f["mode"].clone());
                files.insert(file.to_string(), json!({"content": content, "mode": mode}));
            }
        }
    }
    steps
}

/// cmpoll against what k8s-sidecar 2.10.1 left in the same scenarios (goldens), but for
/// SPEC's deliberate differences, which leave cmpoll's safe answer.
#[test]
fn cmpoll_answers_as_k8s_sidecar() {
    let mut failed = Vec::new();
    for s in scenarios() {
        let want = expected(&s);
        let (seen, stderr) = play(Contender::Cmpoll, &s, Some(&want));
        for (i, (got, want)) in seen.iter().zip(&want).enumerate() {
            if &got["seen"] != want {
                failed.push(format!(
                    "{} step {i} ({}):\n  cmpoll:      {}\n  k8s-sidecar: {want}\n  stderr:\n{stderr}",
                    s.name, got["step"], got["seen"]
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Runs k8s-sidecar itself in every scenario and holds its answers to the goldens
/// (RECORD=1 writes them). Where it is: K8S_SIDECAR=DIR, a copy of its source at 2.10.1
/// (`src/`) and a Python 3.12 virtualenv with its requirements (`venv/`); HACKING.md says
/// how. It needs root (a mount namespace) and is not run in CI, which has no copy.
#[test]
#[ignore = "needs a copy of k8s-sidecar 2.10.1: K8S_SIDECAR=DIR cargo test --test tests sidecar_oracle::record -- --ignored"]
fn record_k8s_sidecar() {
    let dir =
        PathBuf::from(std::env::var("K8S_SIDECAR").expect("K8S_SIDECAR=DIR (see HACKING.md)"));
    assert!(
        dir.join("src/sidecar.py").exists() && dir.join("venv/bin/python").exists(),
        "{}",
        dir.display()
    );
    let record = std::env::var("RECORD").is_ok_and(|v| v == "1");
    let only = std::env::var("SCENARIO").ok();
    let mut differ = Vec::new();
    for s in scenarios()
        .into_iter()
        .filter(|s| only.as_deref().is_none_or(|o| o == s.name))
    {
        let (seen, stderr) = play(Contender::K8sSidecar(&dir), &s, None);
        let golden = json!({
            "k8s-sidecar": format!("{VERSION} ({COMMIT})"),
            "recorded": "K8S_SIDECAR=DIR RECORD=1 cargo test --test tests sidecar_oracle::record_k8s_sidecar -- --ignored",
            "scenario": s.name,
            "steps": seen,
        });
        let path = golden_path(&s);
        if record {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, serde_json::to_string_pretty(&golden).unwrap() + "\n").unwrap();
            continue;
        }
        let old: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_default())
            .unwrap_or(Value::Null);
        if old["steps"] != golden["steps"] {
            differ.push(format!(
                "{}:\n  now:    {}\n  golden: {}\n  stderr:\n{stderr}",
                s.name, golden["steps"], old["steps"]
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "k8s-sidecar answers otherwise:\n{}",
        differ.join("\n")
    );
}
