//! The Python `kubernetes` client against the test apiserver: a second, independent real
//! client. It needs a Python with the `kubernetes` package: `CMPOLL_TEST_PYTHON`, or the
//! virtualenv `.ci/run` makes in `target/ci-venv`, or `python3`.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use test_apiserver::{ConfigMap, Kubeconfig, TestApiserver};

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CMPOLL_TEST_PYTHON") {
        return p.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/ci-venv/bin/python");
    if venv.exists() {
        return venv;
    }
    "python3".into()
}

#[test]
fn the_python_client_lists_pages_and_sees_expired_tokens() {
    let s = TestApiserver::start();
    s.put(ConfigMap::new("apps", "web").label("tier", "web"));
    s.put(ConfigMap::new("apps", "db").label("tier", "db"));
    s.put(
        ConfigMap::new("apps", "old")
            .label("tier", "web")
            .label("legacy", "1"),
    );
    s.put(ConfigMap::new("ops", "cache").label("tier", "cache"));
    s.put(ConfigMap::new("ops", "db2").label("tier", "db"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = s.write_kubeconfig(&dir.path().join("kubeconfig"), &Kubeconfig::token());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python_client.py");
    let py = python();
    let mut child = Command::new(&py)
        .arg(&script)
        .arg(&kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (bash .ci/run sets up Python)", py.display()));
    let mut stdin = child.stdin.take().unwrap();
    let mut steps = std::collections::HashMap::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        let step = v["step"].as_str().unwrap().to_string();
        if step == "expire" {
            s.expire_continue_tokens();
            stdin.write_all(b"go\n").unwrap();
        }
        steps.insert(step, v);
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} failed (needs `pip install kubernetes`; bash .ci/run does it): {}",
        py.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        steps["all"]["names"],
        serde_json::json!(["apps/db", "apps/web", "ops/db2"])
    );
    assert_eq!(
        steps["namespaced"]["names"],
        serde_json::json!(["apps/old", "apps/web"])
    );
    assert_eq!(steps["paged"]["names"].as_array().unwrap().len(), 5);
    assert_eq!(steps["paged"]["pages"], 3);
    assert_eq!(steps["bad-selector"]["status"], 400);
    assert_eq!(
        steps["bad-selector"]["message"],
        "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
    );
    assert_eq!(steps["expired"]["status"], 410);
    assert_eq!(steps["expired"]["reason"], "Expired");
    assert_eq!(steps["expired"]["fresh"], true);
    let continued = s
        .requests()
        .into_iter()
        .filter(|r| r.param("continue").is_some())
        .count();
    assert!(continued >= 3, "the client sent its continue tokens");
}
