//! `--resource secrets`: the same pipeline over `/api/v1/secrets`, base64 `data` decoded to
//! binary files hashed by their bytes, mode 0600, and no value anywhere it could be read
//! (stdout events, `list --json`, logs at trace level), with the real binary.

use std::fs;
use std::os::unix::fs::MetadataExt;

use test_apiserver::{ConfigMap, Grant, TestApiserver};

use crate::util::{Cmpoll, Daemon, SOON, labelled, spec_hash};

/// The test apiserver's default user may read ConfigMaps and Secrets.
fn cluster() -> (TestApiserver, Cmpoll) {
    let s = TestApiserver::start();
    s.grant(
        test_apiserver::USER,
        Grant::all().resources(&["configmaps", "secrets"]),
    );
    let c = Cmpoll::against(&s);
    (s, c)
}

fn secret(ns: &str, name: &str) -> ConfigMap {
    ConfigMap::secret(ns, name).label("cmpoll.io/module", "true")
}

const PASSWORD: &str = "hunter2-s3cr3t";

#[test]
fn secrets_are_binary_files_mode_0600_hashed_by_their_bytes() {
    let (s, c) = cluster();
    s.put(
        secret("grafana", "datasources")
            .data("password", PASSWORD)
            .binary("key.der", &[0, 1, 255]),
    );
    // A ConfigMap of the same name is not what `--resource secrets` lists.
    s.put(labelled("grafana", "datasources").data("cm-only", "x"));
    let out = c.out();
    c.with_args(&[
        "run",
        "--once",
        "--resource",
        "secrets",
        "--out-dir",
        out.to_str().unwrap(),
    ])
    .run()
    .success();
    let dir = out.join("grafana/datasources");
    assert_eq!(fs::read(dir.join("password")).unwrap(), PASSWORD.as_bytes());
    assert_eq!(fs::read(dir.join("key.der")).unwrap(), [0, 1, 255]);
    assert!(!dir.join("cm-only").exists());
    for f in ["password", "key.der"] {
        let mode = fs::metadata(dir.join(f)).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o600, "{f}");
    }
    let want = spec_hash(&[("key.der", &[0, 1, 255]), ("password", PASSWORD.as_bytes())]);
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join(".cmpoll/state.json")).unwrap()).unwrap();
    assert_eq!(state["modules"]["grafana/datasources"]["hash"], want);

    // `list --json`: the hash, never the contents.
    let r = c
        .with_args(&["list", "--resource", "secrets", "--json"])
        .run()
        .success();
    let m = &r.json()[0];
    assert_eq!(m["module"], "grafana/datasources");
    assert_eq!(m["hash"], want);
    assert!(
        m.get("files").is_none() && m.get("binaryFiles").is_none(),
        "{m}"
    );
    assert!(!r.stdout.contains(PASSWORD), "{}", r.stdout);
    // The table too names the module and its hash.
    let r = c
        .with_args(&["list", "--resource", "secret"])
        .run()
        .success();
    assert!(r.stdout.contains("grafana/datasources"), "{}", r.stdout);
    let req = s.requests().into_iter().rfind(|r| r.is_list()).unwrap();
    assert_eq!(req.path, "/api/v1/secrets");

    // --file-mode still wins.
    let out2 = c.path("out2");
    c.with_args(&[
        "run",
        "--once",
        "--resource",
        "secrets",
        "--out-dir",
        out2.to_str().unwrap(),
        "--file-mode",
        "0640",
    ])
    .run()
    .success();
    let mode = fs::metadata(out2.join("grafana/datasources/password"))
        .unwrap()
        .mode();
    assert_eq!(mode & 0o7777, 0o640);
}

/// No value reaches stdout or the log at any level, through every path that touches one:
/// full lists, metadata lists with GETs, updates, a module rejected for a bad key.
#[test]
fn no_value_is_shown_anywhere_even_at_trace() {
    let (s, c) = cluster();
    s.put(secret("apps", "db").data("password", PASSWORD));
    s.put(secret("apps", "bad").data("../escape", "n0t-this-0ne-either"));
    let c = c.env("RUST_LOG", "trace");
    let d = Daemon::start(
        c,
        &[
            "--resource",
            "secrets",
            "--list-mode",
            "metadata",
            "--interval",
            "50ms",
            "--log-level",
            "trace",
            "--stdout-events",
        ],
    );
    let first = d.batch(SOON);
    assert_eq!(first[0]["type"], "added");
    assert_eq!(first[0]["module"], "apps/db");
    assert!(first[0].get("files").is_none(), "{}", first[0]);
    let rotated = "rotated-Pa55word";
    s.put(secret("apps", "db").data("password", rotated));
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "updated");
    assert_eq!(b[0]["hash"], spec_hash(&[("password", rotated.as_bytes())]));
    assert!(
        s.requests()
            .iter()
            .any(|r| r.path == "/api/v1/namespaces/apps/secrets/db"),
        "the change came by a GET of the Secret"
    );
    let stderr = d.stderr();
    let mut stdout = String::new();
    for e in first.iter().chain(&b) {
        stdout += &e.to_string();
    }
    d.stop();
    assert!(
        stderr.contains("TRACE") || stderr.contains("trace"),
        "{stderr}"
    );
    assert!(
        stderr.contains("apps/bad"),
        "the bad key is reported: {stderr}"
    );
    for value in [PASSWORD, rotated, "n0t-this-0ne-either"] {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(value);
        for (what, text) in [("stderr", &stderr), ("stdout", &stdout)] {
            assert!(!text.contains(value), "{value} in {what}:\n{text}");
            assert!(!text.contains(&b64), "{b64} in {what}:\n{text}");
        }
    }
}

#[test]
fn a_role_without_secrets_gets_the_apiservers_403() {
    let s = TestApiserver::start();
    s.put(secret("apps", "db").data("password", PASSWORD));
    let r = Cmpoll::against(&s)
        .with_args(&["list", "--resource", "secrets"])
        .run()
        .failure(1);
    let line = r.error_line();
    assert!(
        line.contains("403") && line.contains("cannot list resource \"secrets\""),
        "{line}"
    );
}

#[test]
fn manifests_hold_secrets_too() {
    let c = Cmpoll::new();
    c.write(
        "m/secrets.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: db, namespace: apps, labels: {cmpoll.io/module: \"true\"}}\ndata: {password: aHVudGVyMg==}\nstringData: {user: admin}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm, namespace: apps, labels: {cmpoll.io/module: \"true\"}}\ndata: {k: v}\n",
    );
    let m = c.path("m");
    let r = c
        .with_args(&[
            "list",
            "--json",
            "--resource",
            "secrets",
            "--manifests",
            m.to_str().unwrap(),
        ])
        .run()
        .success();
    let v = r.json();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[0]["module"], "apps/db");
    assert_eq!(
        v[0]["hash"],
        spec_hash(&[("password", b"hunter2"), ("user", b"admin")])
    );
}

/// Issue 26: `--resource configmaps,secrets`: one snapshot of both kinds, each listed from
/// its own endpoint; module names carry the kind (a ConfigMap and a Secret of the same
/// name are two modules), every event says its kind, the files layout nests the kind's
/// folder, each kind has its mode, and a Secret's values stay off stdout.
#[test]
fn both_kinds_in_one_cmpoll() {
    let (s, c) = cluster();
    s.put(labelled("grafana", "dash").data("a.json", "{}"));
    s.put(secret("grafana", "dash").data("password", PASSWORD));
    let out = c.out();
    let dir = out.to_str().unwrap();
    let r = c
        .with_args(&[
            "run",
            "--once",
            "--resource",
            "configmaps,secrets",
            "--out-dir",
            dir,
            "--stdout-events",
        ])
        .run()
        .success();
    assert_eq!(
        fs::read_to_string(out.join("configmap/grafana/dash/a.json")).unwrap(),
        "{}"
    );
    assert_eq!(
        fs::read(out.join("secret/grafana/dash/password")).unwrap(),
        PASSWORD.as_bytes()
    );
    for (f, mode) in [
        ("configmap/grafana/dash/a.json", 0o644),
        ("secret/grafana/dash/password", 0o600),
    ] {
        assert_eq!(
            fs::metadata(out.join(f)).unwrap().mode() & 0o7777,
            mode,
            "{f}"
        );
    }
    let events: Vec<serde_json::Value> = (r.stdout.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let shape: Vec<(&str, &str, &str, &str, bool)> = events[..2]
        .iter()
        .map(|e| {
            (
                e["module"].as_str().unwrap(),
                e["kind"].as_str().unwrap(),
                e["namespace"].as_str().unwrap(),
                e["name"].as_str().unwrap(),
                e.get("files").is_some(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (
                "configmap/grafana/dash",
                "ConfigMap",
                "grafana",
                "dash",
                true
            ),
            ("secret/grafana/dash", "Secret", "grafana", "dash", false),
        ]
    );
    assert!(!r.stdout.contains(PASSWORD), "{}", r.stdout);
    assert_eq!(events[2]["type"], "synced");
    assert_eq!(events[2]["modules"], 2);
    let paths: Vec<String> = (s.requests().iter())
        .filter(|q| q.path.starts_with("/api/v1/"))
        .map(|q| q.path.clone())
        .collect();
    assert!(
        paths.contains(&"/api/v1/configmaps".to_string())
            && paths.contains(&"/api/v1/secrets".to_string()),
        "each kind from its own endpoint: {paths:?}"
    );
    // Removed, each by its kind; the kind's folder goes with its last module.
    s.delete_secret("grafana", "dash");
    let r = c
        .with_args(&[
            "run",
            "--once",
            "--resource",
            "secrets,configmaps",
            "--out-dir",
            dir,
        ])
        .run()
        .success();
    assert!(!out.join("secret").exists(), "{}", r.described);
    assert!(out.join("configmap/grafana/dash/a.json").exists());
}

/// Issue 26: with both kinds, a failure of either list fails the whole poll: nothing is
/// removed, nothing half-applied; a role without Secrets gets the apiserver's 403 naming
/// secrets, and the ConfigMaps it could list are not delivered alone.
#[test]
fn a_failed_list_of_either_kind_changes_nothing() {
    let (s, c) = cluster();
    s.put(labelled("ns", "cm").data("k", "v"));
    s.put(secret("ns", "sec").data("k", "v"));
    let d = Daemon::start(
        c,
        &[
            "--resource",
            "configmaps,secrets",
            "--interval",
            "50ms",
            "--stdout-events",
        ],
    );
    let first = d.batch(SOON);
    assert_eq!(first.len(), 3, "{first:?}");
    // The Secrets list fails (503) while a ConfigMap is deleted: the poll fails whole.
    s.fault(
        test_apiserver::Match {
            path_prefix: Some("/api/v1/secrets".into()),
            ..test_apiserver::Match::lists()
        },
        test_apiserver::Fault::Unavailable(0),
        3,
    );
    s.delete("ns", "cm");
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["module"].as_str()),
        (Some("removed"), Some("configmap/ns/cm"))
    );
    let failed = s
        .requests()
        .iter()
        .filter(|q| q.path == "/api/v1/secrets" && q.status == 503)
        .count();
    assert_eq!(failed, 3, "the removal waited for a complete poll");
    d.stop();
    // No right to list Secrets: the 403 names them, and nothing is delivered.
    let s = TestApiserver::start();
    s.put(labelled("ns", "cm").data("k", "v"));
    let r = Cmpoll::against(&s)
        .with_args(&["list", "--resource", "configmaps,secrets"])
        .run()
        .failure(1);
    let line = r.error_line();
    assert!(
        line.contains("403") && line.contains("cannot list resource \"secrets\""),
        "{line}"
    );
    assert!(r.stdout.is_empty(), "{}", r.described);
}

/// A validator that prints a Secret's value (as `promtool` quotes a bad line) rejects it;
/// the `rejected` event on stdout and the warning in the log say the exit status only.
#[test]
fn a_rejected_secrets_validator_output_is_not_shown() {
    let (s, c) = cluster();
    s.put(secret("apps", "db").data("password", PASSWORD));
    let d = Daemon::start(
        c,
        &[
            "--resource",
            "secrets",
            "--interval",
            "50ms",
            "--validate",
            "cat password; echo; exit 1",
            "--stdout-events",
        ],
    );
    let batch = d.batch(SOON);
    let rejected = batch
        .iter()
        .find(|e| e["type"] == "rejected")
        .unwrap_or_else(|| panic!("{batch:?}"));
    assert_eq!(
        rejected["reason"], "validator exited with status 1",
        "{rejected}"
    );
    let stderr = d.stderr();
    d.stop();
    assert!(
        stderr.contains("module apps/db rejected: validator exited with status 1"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASSWORD), "{stderr}");
}
