//! `cmpoll sidecar` (the k8s-sidecar drop-in), with the real binary configured by
//! k8s-sidecar's variables alone, against the test apiserver: what the Grafana chart's
//! dashboard sidecar sets, the health endpoint the charts' probes read, a busy health
//! port, `METHOD=LIST` as an init container, objects read by name, usage errors.

use std::time::Duration;

use test_apiserver::{ConfigMap, Fault, Grant, Match, TestApiserver, USER};

use crate::util::http::{get, try_get, web_server};
use crate::util::{Cmpoll, Daemon, SOON, eventually, eventually_explained, map, tree};

fn dashboard(ns: &str, name: &str) -> ConfigMap {
    ConfigMap::new(ns, name).label("grafana_dashboard", "1")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The Grafana chart's dashboard sidecar with a folder annotation and both kinds: the
/// files, the reload call as Grafana gets it (POST, basic auth from files, the payload as
/// JSON), and `/healthz`: 503 until the first batch is written, then 200.
#[test]
fn the_grafana_dashboard_sidecar() {
    let s = TestApiserver::start();
    s.grant(USER, Grant::all().resources(&["configmaps", "secrets"]));
    s.put(
        dashboard("mon", "node")
            .annotation("k8s-sidecar-target-directory", "Nodes")
            .data("node.json", "{\"title\":\"node\"}"),
    );
    s.put(
        ConfigMap::secret("mon", "node")
            .label("grafana_dashboard", "1")
            .data("secret.json", "{}"),
    );
    s.put(ConfigMap::new("mon", "unlabelled").data("x.json", "{}"));
    let (reload, calls) = web_server(|_, _| (200, vec![], b"{}".to_vec()));
    let c = Cmpoll::against(&s);
    let out = c.out();
    let user = c.write("creds/user", "admin\n");
    let password = c.write("creds/password", "s3cret\n");
    let port = free_port();
    // The first list is slow: the health endpoint answers before the first batch.
    s.fault(Match::lists(), Fault::Delay(Duration::from_millis(1500)), 1);
    let d = Daemon::sidecar(
        c.env("LABEL", "grafana_dashboard")
            .env("LABEL_VALUE", "1")
            .env("FOLDER", out.to_str().unwrap())
            .env("RESOURCE", "both")
            .env("NAMESPACE", "mon")
            .env("METHOD", "SLEEP")
            .env("SLEEP_TIME", "0.2")
            .env(
                "REQ_URL",
                &format!("{reload}/api/admin/provisioning/dashboards/reload"),
            )
            .env("REQ_METHOD", "POST")
            .env("REQ_PAYLOAD", "{\"reason\":\"sidecar\"}")
            .env("REQ_USERNAME_FILE", user.to_str().unwrap())
            .env("REQ_PASSWORD_FILE", password.to_str().unwrap())
            .env("HEALTH_HOST", "127.0.0.1")
            .env("HEALTH_PORT", &port.to_string()),
    );
    let addr = format!("127.0.0.1:{port}");
    eventually("the health endpoint", SOON, || {
        try_get(&addr, "/healthz").is_some()
    });
    let (code, body) = get(&addr, "/healthz");
    assert_eq!(
        code,
        503,
        "not before the first batch: {body}\n{}",
        d.stderr()
    );
    eventually("healthy after the first batch", SOON, || {
        get(&addr, "/healthz").0 == 200
    });
    assert_eq!(
        tree(&out),
        map(&[
            ("Nodes/node.json", "{\"title\":\"node\"}"),
            ("secret.json", "{}")
        ])
    );
    eventually("the reload call", SOON, || {
        !calls.lock().unwrap().is_empty()
    });
    let (line, headers) = calls.lock().unwrap()[0].clone();
    assert_eq!(
        line,
        "POST /api/admin/provisioning/dashboards/reload HTTP/1.1"
    );
    // printf admin:s3cret | base64
    assert_eq!(headers["authorization"], "Basic YWRtaW46czNjcmV0");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers[" body"], "{\"reason\":\"sidecar\"}");
    // Logs are JSON lines by default, as k8s-sidecar's.
    let first = d.stderr().lines().next().unwrap_or_default().to_string();
    assert!(
        serde_json::from_str::<serde_json::Value>(&first).is_ok(),
        "{first}"
    );
    d.stop();
}

/// Two sidecars in one pod on the default port: the second warns and runs on.
#[test]
fn a_busy_health_port_is_a_warning() {
    let s = TestApiserver::start();
    s.put(dashboard("mon", "a").data("a.json", "{}"));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let c = Cmpoll::against(&s);
    let out = c.out();
    let d = Daemon::sidecar(
        c.env("LABEL", "grafana_dashboard")
            .env("FOLDER", out.to_str().unwrap())
            .env("NAMESPACE", "mon")
            .env("HEALTH_HOST", "127.0.0.1")
            .env("HEALTH_PORT", &port.to_string())
            .env("LOG_FORMAT", "LOGFMT"),
    );
    eventually("the file", SOON, || out.join("a.json").exists());
    // The warning is written by the thread that tried the port, and read from the pipe by
    // another: under load it may come after the file (seen once in five runs).
    eventually_explained(
        "the warning",
        SOON,
        || d.stderr().contains("going on without /healthz"),
        || d.stderr(),
    );
    d.stop();
}

/// `METHOD=LIST` as an init container: exit 0 when only the reload failed (the agent is
/// not up yet), 1 when the list failed; no call when nothing was written is not asked.
#[test]
fn list_is_an_init_container() {
    let s = TestApiserver::start();
    s.put(dashboard("mon", "a").data("a.json", "{}"));
    let (down, _) = web_server(|_, _| (503, vec![], vec![]));
    let c = Cmpoll::against(&s);
    let out = c.out();
    let c = c
        .env("LABEL", "grafana_dashboard")
        .env("FOLDER", out.to_str().unwrap())
        .env("NAMESPACE", "mon")
        .env("METHOD", "LIST")
        .env("REQ_URL", &format!("{down}/reload"))
        .env("REQ_TIMEOUT", "0.5")
        .env("HEALTH_PORT", &free_port().to_string());
    let r = c.with_args(&["sidecar"]).run().success();
    assert!(
        r.stderr.contains("not an error here: METHOD=LIST"),
        "{}",
        r.described
    );
    assert_eq!(tree(&out), map(&[("a.json", "{}")]));
    // Secrets it may not list: the poll fails, and so does the init container.
    let r = c
        .env("RESOURCE", "both")
        .with_args(&["sidecar"])
        .run()
        .failure(1);
    assert!(r.stderr.contains("secrets"), "{}", r.described);
}

/// `RESOURCE_NAME`: the objects named are read by GET, whatever their labels; one that is
/// not there is absent; a namespace it names no object in is listed by label.
#[test]
fn resource_name_reads_objects_by_name() {
    let s = TestApiserver::start();
    s.put(ConfigMap::new("mon", "named").data("n.json", "{}"));
    s.put(dashboard("mon", "labelled").data("l.json", "{}"));
    s.put(dashboard("other", "o").data("o.json", "{}"));
    let c = Cmpoll::against(&s);
    let out = c.out();
    // (The folder lives as long as `c`.)
    let c = c
        .env("LABEL", "grafana_dashboard")
        .env("FOLDER", out.to_str().unwrap())
        .env("NAMESPACE", "mon,other")
        .env("METHOD", "LIST")
        .env("RESOURCE_NAME", "mon/configmap/named,mon/configmap/missing")
        .env("HEALTH_PORT", &free_port().to_string());
    c.with_args(&["sidecar"]).run().success();
    assert_eq!(tree(&out), map(&[("n.json", "{}"), ("o.json", "{}")]));
    let paths: Vec<String> = s.requests().iter().map(|r| r.path.clone()).collect();
    assert!(
        paths.contains(&"/api/v1/namespaces/mon/configmaps/named".into()),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"/api/v1/namespaces/other/configmaps".into()),
        "{paths:?}"
    );
    assert!(
        !paths.contains(&"/api/v1/namespaces/mon/configmaps".into()),
        "{paths:?}"
    );
}

/// What a chart user gets wrong: one line naming the variable, exit 2.
#[test]
fn usage_errors_name_the_variable() {
    for (vars, want) in [
        (&[("FOLDER", "/tmp/x")][..], "LABEL: not set"),
        (&[("LABEL", "l")][..], "FOLDER: not set"),
        (
            &[("LABEL", "l"), ("FOLDER", "/tmp/x"), ("RESOURCE", "all")][..],
            "RESOURCE: 'all'",
        ),
        (
            &[
                ("LABEL", "l"),
                ("FOLDER", "/tmp/x"),
                ("NAMESPACE", "a"),
                ("DEFAULT_FILE_MODE", "u+rw"),
            ][..],
            "DEFAULT_FILE_MODE:",
        ),
        // Off-cluster without NAMESPACE: k8s-sidecar crashes on the missing file; this
        // says what to set.
        (
            &[
                ("LABEL", "l"),
                ("FOLDER", "/tmp/x"),
                ("CMPOLL_SERVICE_ACCOUNT_DIR", "/nonexistent"),
            ][..],
            "NAMESPACE: not set",
        ),
    ] {
        let mut cmd = Cmpoll::new();
        for (k, v) in vars {
            cmd = cmd.env(k, v);
        }
        let r = cmd.with_args(&["sidecar"]).run().failure(2);
        assert!(
            r.error_line().starts_with(want),
            "{vars:?}: {}",
            r.described
        );
    }
}
