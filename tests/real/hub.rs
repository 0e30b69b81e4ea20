//! Helpers for the tests of `cmpoll serve` on the real apiserver (`serve.rs`,
//! `hostile.rs`): a hub with the shipped role, the accounts that follow it, and requests
//! made to it with curl or raw over TLS.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use test_apiserver::Pki;
use test_apiserver::real::RealApiserver;

use super::*;
use crate::util::tools::free_port;
use crate::util::{Cmpoll, Daemon, SOON, eventually_explained, root};

/// A hub as the shipped ClusterRole allows it, and what reaches it.
pub(crate) struct Hub {
    pub d: Daemon,
    pub port: u16,
    pub ca: PathBuf,
    pub ca_pem: String,
}

impl Hub {
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

/// The shipped hub role, bound to a service account `name` of `ns`; its token.
pub(crate) fn hub_account(k: &RealApiserver, ns: &str, name: &str) -> String {
    let text = std::fs::read_to_string(root().join("k8s/serve/clusterrole.yaml")).unwrap();
    let mut role: Value = serde_saphyr::from_str(&text).unwrap();
    let role_name = format!("cmpoll-hub-{ns}-{name}");
    role["metadata"] = json!({"name": role_name});
    k.apply(&role.to_string());
    k.apply(
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]})
        .to_string(),
    );
    k.token(ns, name, "2h")
}

/// `cmpoll serve` as `token`, on a free port, with a certificate for 127.0.0.1 from a
/// fresh CA; ready (its first poll complete).
pub(crate) fn start_hub(k: &RealApiserver, token: &str, args: &[&str]) -> Hub {
    start_hub_in(k, token, args, &[])
}

/// `start_hub`, run by `wrapper` (`prlimit …`).
pub(crate) fn start_hub_in(k: &RealApiserver, token: &str, args: &[&str], wrapper: &[&str]) -> Hub {
    let c = Cmpoll::new().env("RUST_LOG", "info");
    let pki = Pki::with_server_names("cmpoll-hub-test", &["127.0.0.1"]);
    let ca = c.write("hub-ca.crt", &pki.ca_pem());
    let cert = c.write("tls/tls.crt", &pki.server.cert_pem);
    let key = c.write("tls/tls.key", &pki.server.key_pem);
    let token_file = c.write("hub-token", token);
    let apiserver_ca = c.write("apiserver-ca.crt", &k.ca_pem());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec![
        "--server",
        &k.url,
        "--token-file",
        token_file.to_str().unwrap(),
        "--ca-file",
        apiserver_ca.to_str().unwrap(),
        "--listen",
        &listen,
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let d = match wrapper {
        [] => Daemon::serve(c, &all),
        w => Daemon::wrapped(c, w, &[&["serve"][..], &all].concat()),
    };
    let hub = Hub {
        d,
        port,
        ca,
        ca_pem: pki.ca_pem(),
    };
    eventually_explained(
        "the hub ready",
        SOON,
        || get(&hub.url(), &hub.ca, "", "/readyz", &[]).0 == 200,
        || hub.d.stderr(),
    );
    hub
}

/// A kubeconfig that names the hub, with `token`: all a client needs.
pub(crate) fn hub_kubeconfig(c: &Cmpoll, hub: &Hub, token: &str, name: &str) -> PathBuf {
    use base64::Engine as _;
    c.write(
        name,
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hub\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: hub\n  context: {{cluster: hub, user: u}}\ncurrent-context: hub\n",
            hub.url(),
            base64::engine::general_purpose::STANDARD.encode(&hub.ca_pem)
        ),
    )
}

/// `GET base+path` with curl (trusting `ca`, as `token` when not empty): (status, headers
/// lowercased, body).
pub(crate) fn get(
    base: &str,
    ca: &Path,
    token: &str,
    path: &str,
    headers: &[&str],
) -> (u16, String, Vec<u8>) {
    get_within(base, ca, token, path, headers, 20)
}

/// `get`, giving up after `secs` (status 0).
pub(crate) fn get_within(
    base: &str,
    ca: &Path,
    token: &str,
    path: &str,
    headers: &[&str],
    secs: u32,
) -> (u16, String, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let (head, body) = (dir.path().join("h"), dir.path().join("b"));
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "--compressed",
        "-A",
        "cmpoll-test",
        "--max-time",
        &secs.to_string(),
        "--cacert",
    ])
    .arg(ca)
    .arg("-D")
    .arg(&head)
    .arg("-o")
    .arg(&body)
    .args(["-w", "%{http_code}"]);
    if !token.is_empty() {
        cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(format!("{base}{path}")).output().unwrap();
    let code = String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0);
    (
        code,
        std::fs::read_to_string(&head)
            .unwrap_or_default()
            .to_ascii_lowercase(),
        std::fs::read(&body).unwrap_or_default(),
    )
}

/// A service account of `ns` with a ClusterRole of `rules` (cluster-wide) or a Role
/// (`namespaced`); its token.
pub(crate) fn follower(
    k: &RealApiserver,
    ns: &str,
    name: &str,
    rules: Value,
    cluster_wide: bool,
) -> String {
    if !cluster_wide {
        return account(k, ns, name, Some(rules));
    }
    let role = format!("{ns}-{name}");
    k.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": role}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": role},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}]})
        .to_string(),
    );
    k.token(ns, name, "2h")
}

/// What `--report-events` needs of a hub (the shipped role writes nothing): `create` and
/// `patch` on core events in `ns`, for service account `account`.
pub(crate) fn hub_may_record_events(k: &RealApiserver, ns: &str, account: &str) {
    k.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "hub-events", "namespace": ns},
             "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "hub-events", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub-events"},
             "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]}]})
        .to_string(),
    );
}

/// A token allowed to get the hub's `/metrics` and `/status`, as Prometheus's would be.
pub(crate) fn scraper(k: &RealApiserver, ns: &str) -> String {
    follower(
        k,
        ns,
        "scraper",
        json!([{"nonResourceURLs": ["/metrics", "/status"], "verbs": ["get"]}]),
        true,
    )
}

pub(crate) fn cm_rules() -> Value {
    json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get"]}])
}

pub(crate) fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    test_apiserver::real::metric_sum(text, name, labels)
}

/// A TLS connection that asks `/healthz` once, reads the answer and stays open, idle.
pub(crate) fn idle_keepalive(
    port: u16,
    ca: &str,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let mut tls = crate::util::flood::tls_to(&format!("127.0.0.1:{port}"), ca)?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(3).any(|w| w == b"ok\n") {
        let n = tls.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
    }
    Some(tls)
}

/// One request over a fresh TLS connection, as raw bytes (what curl will not send): the
/// status line's code.
pub(crate) fn raw_request(port: u16, ca: &str, request: &[u8]) -> Option<u16> {
    let mut tls = crate::util::flood::tls_to(&format!("127.0.0.1:{port}"), ca)?;
    let _ = tls.write_all(request);
    let mut head = [0u8; 12];
    tls.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// The selected ConfigMap `ns/name` holding `key: value`, applied.
pub(crate) fn put_module(k: &RealApiserver, ns: &str, name: &str, key: &str, value: &str) {
    k.apply(
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": {LABEL.0: LABEL.1}},
            "data": {key: value}})
        .to_string(),
    );
}

/// A TCP forwarder whose backend the test switches; a switch cuts every connection, as a
/// Service does when the endpoint behind a connection goes away.
pub(crate) struct Switch {
    pub port: u16,
    backend: Arc<AtomicUsize>,
    cut: Arc<Mutex<Vec<TcpStream>>>,
}

impl Switch {
    pub fn new(backends: Vec<u16>) -> Switch {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let backend = Arc::new(AtomicUsize::new(0));
        let cut: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (b, c) = (backend.clone(), cut.clone());
        std::thread::spawn(move || {
            for client in l.incoming().map_while(Result::ok) {
                let to = backends[b.load(Ordering::SeqCst)];
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                c.lock().unwrap().push(client.try_clone().unwrap());
                c.lock().unwrap().push(server.try_clone().unwrap());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Switch { port, backend, cut }
    }

    pub fn to(&self, i: usize) {
        self.backend.store(i, Ordering::SeqCst);
        for s in self.cut.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The next event within `within`, if any (no panic).
pub(crate) fn d_event(d: &Daemon, within: Duration) -> Result<Value, ()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| d.event(within))).map_err(|_| ())
}

/// `hub_account`, with Secrets added to the shipped role's first rule, as its comment says
/// to serve them too (`--resource configmaps,secrets`); its token.
pub(crate) fn hub_account_with_secrets(k: &RealApiserver, ns: &str, name: &str) -> String {
    let text = std::fs::read_to_string(root().join("k8s/serve/clusterrole.yaml")).unwrap();
    let mut role: Value = serde_saphyr::from_str(&text).unwrap();
    let resources = role["rules"][0]["resources"].as_array_mut().unwrap();
    assert_eq!(resources, &vec![json!("configmaps")], "{text}");
    resources.push(json!("secrets"));
    let role_name = format!("cmpoll-hub-{ns}-{name}");
    role["metadata"] = json!({"name": role_name});
    k.apply(&role.to_string());
    k.apply(
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]})
        .to_string(),
    );
    k.token(ns, name, "2h")
}

/// A request held open (a watch, or what may be one) with `curl -N` into a file, ended by
/// curl's own `--max-time` (so that it writes out all it read and the head), the status
/// code read from the head.
pub(crate) struct HeldOpen {
    child: std::process::Child,
    head: PathBuf,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl HeldOpen {
    /// `GET base+path` (as `token`, when not empty), read until `secs` pass.
    pub fn open(base: &str, ca: &Path, token: &str, path: &str, secs: f64) -> HeldOpen {
        let dir = tempfile::tempdir().unwrap();
        let (head, out) = (dir.path().join("h"), dir.path().join("b"));
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sN",
            "-A",
            "cmpoll-test",
            "--max-time",
            &format!("{secs:.1}"),
        ])
        .arg("--cacert")
        .arg(ca)
        .arg("-D")
        .arg(&head)
        .arg("-o")
        .arg(&out);
        if !token.is_empty() {
            cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        let child = cmd
            .arg(format!("{base}{path}"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        HeldOpen {
            child,
            head,
            out,
            _dir: dir,
        }
    }

    /// Whole lines read so far.
    pub fn lines(&self) -> usize {
        let body = std::fs::read(&self.out).unwrap_or_default();
        body.iter().filter(|b| **b == b'\n').count()
    }

    /// Waits for curl to end (its `--max-time`; killed after `grace` more): the status
    /// code (0 without a head) and the body.
    pub fn end(mut self, grace: Duration) -> (u16, Vec<u8>) {
        let until = std::time::Instant::now() + grace;
        while self.child.try_wait().unwrap().is_none() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let head = std::fs::read_to_string(&self.head).unwrap_or_default();
        let code = (head.lines())
            .rfind(|l| l.starts_with("HTTP/"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (code, std::fs::read(&self.out).unwrap_or_default())
    }
}
