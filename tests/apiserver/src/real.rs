//! The real kube-apiserver and etcd, built from the Go module proxy by `tests/kube/build.sh`
//! (into `tests/kube/bin`, or the folder `CMPOLL_KUBE_BIN` names), started on loopback for
//! tests, benchmarks and demos. Each start has a fresh etcd data folder and its own PKI: a
//! CA, a serving certificate for `127.0.0.1`/`localhost`, an admin client certificate
//! (`system:masters`), a service-account signing key (bound tokens through TokenRequest),
//! a static token file, RBAC authorization and an audit log of every request. This is the
//! oracle the stand-in of this crate is held to (HACKING.md, "The real apiserver").
//!
//! Processes are started from one long-lived thread with `PR_SET_PDEATHSIG`, so they end
//! with the test binary however it ends (a shared instance lives in a `static`, which is
//! never dropped).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::pki::{CertPair, Pki, signing_key};

/// The static token of `TOKEN_USER` (`--token-auth-file`).
pub const TOKEN: &str = "cmpoll-static-token-0123456789";
/// Who `TOKEN` authenticates as (no RBAC grant until a test makes one).
pub const TOKEN_USER: &str = "cmpoll-token-user";

/// The folder of the built binaries: `CMPOLL_KUBE_BIN`, else `tests/kube/bin`.
/// The user of the client certificate the apiserver presents to admission webhooks
/// (signed by the cluster's CA).
pub const WEBHOOK_CLIENT: &str = "kube-apiserver-webhook-client";

pub fn bin_dir() -> PathBuf {
    match std::env::var_os("CMPOLL_KUBE_BIN") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../kube/bin"),
    }
}

/// Whether the binaries are built (`tests/kube/build.sh`).
pub fn built() -> bool {
    ["kube-apiserver", "kubectl", "etcd"]
        .iter()
        .all(|b| bin_dir().join(b).is_file())
}

/// Where a test gets its credentials from.
pub enum User {
    /// A bearer token (a static one, or a service account's bound token).
    Token(String),
    /// A client certificate signed by the cluster's CA.
    Cert(CertPair),
    /// Any `users[].user` body, as YAML lines (an exec plugin, impersonation…).
    Raw(String),
}

pub struct RealApiserver {
    dir: tempfile::TempDir,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// etcd's client URL (plain HTTP on loopback).
    pub etcd_url: String,
    pki: Pki,
    apiserver_args: Vec<String>,
    procs: Mutex<Procs>,
    names: AtomicU32,
}

struct Procs {
    etcd: Child,
    apiserver: Child,
}

/// How many shared clusters a test binary may start: `shared(lane)` for lane < LANES.
pub const LANES: usize = 2;

/// Shared cluster `lane` of this test binary, started on its first use (a few seconds).
/// Its folder goes when the test binary exits (a `static` is never dropped; its processes
/// end by `PR_SET_PDEATHSIG`).
pub fn shared(lane: usize) -> &'static RealApiserver {
    static SHARED: [OnceLock<RealApiserver>; LANES] = [const { OnceLock::new() }; LANES];
    SHARED[lane].get_or_init(|| {
        let k = RealApiserver::start();
        let mut dirs = SHARED_DIRS.lock().unwrap_or_else(|p| p.into_inner());
        if dirs.is_empty() {
            extern "C" fn remove_shared_dirs() {
                let dirs = SHARED_DIRS.lock().unwrap_or_else(|p| p.into_inner());
                for d in dirs.iter() {
                    let _ = std::fs::remove_dir_all(d);
                }
            }
            // SAFETY: registering a plain function to run at exit.
            unsafe {
                libc::atexit(remove_shared_dirs);
            }
        }
        dirs.push(k.dir().to_path_buf());
        k
    })
}

static SHARED_DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// A free loopback port below Linux's ephemeral range (32768–60999): a port the kernel
/// handed out with `:0` and this process let go could be given again to any outgoing
/// connection before etcd or the apiserver binds it (a fresh-clone run met "bind:
/// address already in use"). Ports here are never handed out so; each is checked free.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7919);
    for _ in 0..12_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (seed.wrapping_add(n) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in 20000-31999")
}

/// Spawns `cmd` from a thread that lives as long as the process, with `PR_SET_PDEATHSIG`:
/// the child is killed when this process ends (the signal follows the spawning thread).
fn spawn(cmd: Command) -> Child {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            for (mut cmd, back) in rx {
                use std::os::unix::process::CommandExt as _;
                // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                let _ = back.send(cmd.spawn());
            }
        });
        Mutex::new(tx)
    });
    let (back, rx) = mpsc::channel();
    tx.lock()
        .expect("spawner")
        .send((cmd, back))
        .expect("spawner thread");
    rx.recv().expect("spawner answer").expect("spawn")
}

impl RealApiserver {
    /// Starts etcd and the apiserver and waits until the apiserver is ready and namespace
    /// `default` exists; panics with the logs' tails if they do not come up in 90 s.
    pub fn start() -> RealApiserver {
        RealApiserver::start_with(&[])
    }

    /// `start`, with extra kube-apiserver flags (each replacing one of the same name).
    pub fn start_with(extra: &[&str]) -> RealApiserver {
        assert!(
            built(),
            "the real apiserver is not built in '{}': run tests/kube/build.sh",
            bin_dir().display()
        );
        let dir = tempfile::Builder::new()
            .prefix("real-apiserver-")
            .tempdir()
            .expect("temp dir");
        let d = dir.path();
        let pki = Pki::with_server_names("cmpoll-real-ca", &["127.0.0.1", "localhost"]);
        let admin = pki.client_cert_in("cmpoll-admin", "system:masters");
        let (sa_key, sa_pub) = signing_key();
        let write = |name: &str, text: &str| {
            std::fs::write(d.join(name), text).expect("write a cluster file");
        };
        write("ca.crt", &pki.ca_pem());
        write("apiserver.crt", &pki.server.cert_pem);
        write("apiserver.key", &pki.server.key_pem);
        write("sa.key", &sa_key);
        write("sa.pub", &sa_pub);
        write(
            "tokens.csv",
            &format!("{TOKEN},{TOKEN_USER},uid-token-user\n"),
        );
        // The client certificate the apiserver presents to every admission webhook
        // (`cmpoll webhook --client-ca-file` with this cluster's CA accepts it).
        let webhook_client = pki.client_cert(WEBHOOK_CLIENT);
        let b64 = |s: &str| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(s)
        };
        write(
            "webhook-clients.kubeconfig",
            &format!(
                "apiVersion: v1\nkind: Config\nusers:\n- name: '*'\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
                b64(&webhook_client.cert_pem),
                b64(&webhook_client.key_pem)
            ),
        );
        write(
            "admission.yaml",
            &format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: ValidatingAdmissionWebhook\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
                d.join("webhook-clients.kubeconfig").display()
            ),
        );
        write(
            "audit-policy.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: None\n  users: [\"system:apiserver\", \"system:kube-controller-manager\"]\n- level: Metadata\n",
        );
        let etcd_port = free_port();
        let peer_port = free_port();
        let port = free_port();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut etcd = Command::new(bin_dir().join("etcd"));
        etcd.args([
            "--data-dir",
            d.join("etcd").to_str().expect("UTF-8 path"),
            "--listen-client-urls",
            &etcd_url,
            "--advertise-client-urls",
            &etcd_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("default={peer_url}"),
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
            "--quota-backend-bytes",
            "8589934592",
        ])
        .stdin(Stdio::null())
        .stdout(log(d, "etcd.log"))
        .stderr(log(d, "etcd.log"));
        let etcd = spawn(etcd);
        let path = |name: &str| d.join(name).to_str().expect("UTF-8 path").to_string();
        let mut args = vec![
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--tls-cert-file={}", path("apiserver.crt")),
            format!("--tls-private-key-file={}", path("apiserver.key")),
            format!("--client-ca-file={}", path("ca.crt")),
            "--authorization-mode=RBAC".into(),
            format!("--token-auth-file={}", path("tokens.csv")),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", path("sa.pub")),
            format!("--service-account-signing-key-file={}", path("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            format!("--admission-control-config-file={}", path("admission.yaml")),
            format!("--etcd-servers={etcd_url}"),
            format!("--cert-dir={}", path("certs")),
            format!("--audit-policy-file={}", path("audit-policy.yaml")),
            format!("--audit-log-path={}", path("audit.log")),
            "--audit-log-mode=blocking".into(),
            "--v=1".into(),
        ];
        // An extra flag replaces one of the same name (list flags would append).
        for flag in extra {
            let name = flag.split('=').next().unwrap_or(flag);
            args.retain(|a| a.split('=').next() != Some(name));
            args.push(flag.to_string());
        }
        let url = format!("https://127.0.0.1:{port}");
        let kube = RealApiserver {
            apiserver_args: args,
            procs: Mutex::new(Procs {
                etcd,
                apiserver: spawn(Command::new("true")),
            }),
            url,
            port,
            etcd_url,
            pki,
            dir,
            names: AtomicU32::new(0),
        };
        kube.write_kubeconfig("admin.kubeconfig", &User::Cert(admin));
        kube.start_apiserver();
        kube
    }

    /// (Re)starts the apiserver process on the same etcd and waits until it is ready.
    pub fn start_apiserver(&self) {
        let d = self.dir.path();
        let mut cmd = Command::new(bin_dir().join("kube-apiserver"));
        cmd.args(&self.apiserver_args)
            .stdin(Stdio::null())
            .stdout(log(d, "kube-apiserver.log"))
            .stderr(log(d, "kube-apiserver.log"));
        self.procs.lock().expect("procs").apiserver = spawn(cmd);
        self.wait_ready();
    }

    /// Stops the apiserver process (etcd keeps running): SIGTERM, then SIGKILL after 20 s.
    pub fn stop_apiserver(&self) {
        let mut p = self.procs.lock().expect("procs");
        stop(&mut p.apiserver);
    }

    /// The apiserver's process id (for `/proc`).
    pub fn apiserver_pid(&self) -> u32 {
        self.procs.lock().expect("procs").apiserver.id()
    }

    fn wait_ready(&self) {
        let start = Instant::now();
        loop {
            if let Some(exit) = (self.procs.lock().expect("procs"))
                .apiserver
                .try_wait()
                .expect("wait")
            {
                panic!("kube-apiserver exited ({exit})\n{}", self.logs());
            }
            let ready = self.kubectl(&["get", "--raw", "/readyz"]);
            if ready.status.success()
                && self
                    .kubectl(&["get", "namespace", "default"])
                    .status
                    .success()
            {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "kube-apiserver not ready within 90 s\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of etcd's and the apiserver's logs.
    pub fn logs(&self) -> String {
        let tail = |name: &str| {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        format!(
            "--- etcd.log\n{}\n--- kube-apiserver.log\n{}",
            tail("etcd.log"),
            tail("kube-apiserver.log")
        )
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA file (serving and client certificates).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    pub fn ca_pem(&self) -> String {
        self.pki.ca_pem()
    }

    /// The admin kubeconfig (`system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// A client certificate for `user` (in `group`, if any) that the apiserver accepts.
    pub fn client_cert(&self, user: &str, group: Option<&str>) -> CertPair {
        match group {
            Some(g) => self.pki.client_cert_in(user, g),
            None => self.pki.client_cert(user),
        }
    }

    /// Writes a kubeconfig for `user` (CA as data) at `name` in the cluster folder, or at
    /// `name` itself when it is an absolute path; returns the path.
    pub fn write_kubeconfig(&self, name: &str, user: &User) -> PathBuf {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let body = match user {
            User::Token(t) => format!("    token: {t}\n"),
            User::Cert(c) => format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                b64(&c.cert_pem),
                b64(&c.key_pem)
            ),
            User::Raw(lines) => lines.clone(),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: user\n  user:\n{body}contexts:\n- name: real\n  context:\n    cluster: real\n    user: user\ncurrent-context: real\n",
            self.url,
            b64(&self.pki.ca_pem()),
        );
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write a kubeconfig");
        path
    }

    /// The real kubectl of the same release, as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_in(args, None)
    }

    /// kubectl as the admin with `stdin`.
    pub fn kubectl_in(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(bin_dir().join("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("write kubectl's stdin");
        }
        child.wait_with_output().expect("kubectl's output")
    }

    /// kubectl as the admin that must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_in(args, None)
    }

    pub fn ok_in(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_in(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            stdin
                .map(|s| format!("\nstdin:\n{}", s.chars().take(600).collect::<String>()))
                .unwrap_or_default()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply` of one or more manifests (YAML or JSON) as the admin.
    pub fn apply(&self, manifests: &str) -> String {
        self.ok_in(&["apply", "-f", "-"], Some(manifests))
    }

    /// `kubectl apply --server-side --dry-run=server -o json` of `manifests`: what the
    /// apiserver would store (a List when there are several), defaulted and validated.
    pub fn server_dry_run(&self, manifests: &str) -> serde_json::Value {
        let out = self.ok_in(
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "-o",
                "json",
                "-f",
                "-",
            ],
            Some(manifests),
        );
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("dry run answer ({e}): {out}"))
    }

    /// `kubectl apply --server-side` of `manifests`: kubectl's lines.
    pub fn server_apply(&self, manifests: &str) -> String {
        self.ok_in(&["apply", "--server-side", "-f", "-"], Some(manifests))
    }

    /// A fresh namespace `PREFIX-N`, created.
    pub fn namespace(&self, prefix: &str) -> String {
        let n = self.names.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{n}");
        self.ok(&["create", "namespace", &name]);
        name
    }

    /// Creates or replaces a ConfigMap; returns its resourceVersion.
    pub fn put_configmap(
        &self,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        data: &[(&str, &str)],
    ) -> String {
        self.put(ns, "ConfigMap", name, labels, "data", data)
    }

    /// Creates or replaces a Secret (`stringData`); returns its resourceVersion.
    pub fn put_secret(
        &self,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        data: &[(&str, &str)],
    ) -> String {
        self.put(ns, "Secret", name, labels, "stringData", data)
    }

    fn put(
        &self,
        ns: &str,
        kind: &str,
        name: &str,
        labels: &[(&str, &str)],
        field: &str,
        data: &[(&str, &str)],
    ) -> String {
        let map = |kv: &[(&str, &str)]| -> serde_json::Value {
            kv.iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        let obj = serde_json::json!({
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {"name": name, "namespace": ns, "labels": map(labels)},
            field: map(data),
        });
        // Server-side apply keeps the object's identity (no delete and create) and writes
        // no last-applied annotation (which would cap the object at 256 KiB).
        let out = self.ok_in(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=cmpoll-tests",
                "-o",
                "jsonpath={.metadata.resourceVersion}",
                "-f",
                "-",
            ],
            Some(&obj.to_string()),
        );
        out.trim().to_string()
    }

    /// Deletes an object (`kind` as kubectl names it: `configmap`, `secret`…).
    pub fn delete(&self, kind: &str, ns: &str, name: &str) {
        self.ok(&["delete", kind, name, "-n", ns, "--wait=false"]);
    }

    /// A bound token of service account `ns/name` (created if missing) from TokenRequest.
    pub fn token(&self, ns: &str, name: &str, duration: &str) -> String {
        let exists = self.kubectl(&["get", "serviceaccount", name, "-n", ns]);
        if !exists.status.success() {
            self.ok(&["create", "serviceaccount", name, "-n", ns]);
        }
        self.ok(&["create", "token", name, "-n", ns, "--duration", duration])
            .trim()
            .to_string()
    }

    /// The apiserver's `/metrics` text.
    pub fn metrics(&self) -> String {
        self.ok(&["get", "--raw", "/metrics"])
    }

    /// The sum of every sample of `name` whose labels include all of `labels`.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_sum(&self.metrics(), name, labels)
    }

    /// Where the audit log ends now: `audit_since` reads what comes after.
    pub fn audit_mark(&self) -> u64 {
        std::fs::metadata(self.dir.path().join("audit.log"))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// The audit events logged since `mark` (JSON lines of `audit.k8s.io/v1` Events).
    pub fn audit_since(&self, mark: u64) -> Vec<serde_json::Value> {
        use std::io::{BufRead as _, Seek as _};
        let Ok(mut f) = std::fs::File::open(self.dir.path().join("audit.log")) else {
            return Vec::new();
        };
        if f.seek(std::io::SeekFrom::Start(mark)).is_err() {
            return Vec::new();
        }
        std::io::BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str(&l).ok())
            .collect()
    }

    /// Compacts etcd to its current revision as the apiserver's own compactor does: the
    /// revision is written to `compact_rev_key` (which the apiserver watches, and its
    /// watch cache follows within 15 s), then etcd compacts. Continue tokens from before
    /// then expire (410).
    pub fn compact(&self) -> u64 {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let range = self.etcd_post("/v3/kv/range", r#"{"key":"AA=="}"#);
        let rev: u64 = range["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("etcd's revision");
        self.etcd_post(
            "/v3/kv/put",
            &format!(
                r#"{{"key":"{}","value":"{}"}}"#,
                b64("compact_rev_key"),
                b64(&rev.to_string())
            ),
        );
        self.etcd_post(
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{rev}","physical":true}}"#),
        );
        rev
    }

    /// One JSON request to etcd's gRPC gateway.
    fn etcd_post(&self, path: &str, body: &str) -> serde_json::Value {
        let addr = self.etcd_url.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr).expect("connect to etcd");
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("write to etcd");
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("read etcd's answer");
        let (head, rest) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "etcd {path}: {head}\n{rest}"
        );
        let json = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("etcd {path}: {e}: {json}"))
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The sum of the samples of `name` in Prometheus text whose labels include `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            (n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

fn log(dir: &Path, name: &str) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .expect("a log file")
        .into()
}

fn stop(child: &mut Child) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    // SAFETY: sending a signal to our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for RealApiserver {
    fn drop(&mut self) {
        if let Ok(p) = self.procs.get_mut() {
            stop(&mut p.apiserver);
            stop(&mut p.etcd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_match_labels() {
        let text =
            "# HELP x\nx{a=\"1\",b=\"2\"} 3\nx{a=\"1\",b=\"3\"} 4\nx_total 5\ny{a=\"1\"} 9\n";
        assert_eq!(metric_sum(text, "x", &[("a", "1")]), 7.0);
        assert_eq!(metric_sum(text, "x", &[("b", "3")]), 4.0);
        assert_eq!(metric_sum(text, "x_total", &[]), 5.0);
    }

    #[test]
    fn chunks_are_joined() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
