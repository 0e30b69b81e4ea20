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
