//! A protocol-faithful kube-apiserver stand-in for cmpoll's tests, benchmarks and demos.
//!
//! It serves ConfigMaps over HTTPS (and optionally plain HTTP) the way kube-apiserver
//! 1.28–1.34 does on every path cmpoll uses: LIST and GET, label and field selectors with
//! the apiserver's grammar and messages, the watch cache's resourceVersion routing (and
//! counters of which path each request took), continue tokens that expire, metadata-only
//! and Table responses, gzip, bearer tokens, client certificates and RBAC-shaped 403s, plus
//! injected faults and a request log. Its faithfulness is proved by pointing kubectl and the
//! Python `kubernetes` client at it (`tests/apiserver_*.rs` in cmpoll).
//!
//! Never part of the cmpoll release binary: it is a dev-dependency only.

#![allow(clippy::new_without_default)]

#[path = "../../../src/names.rs"]
pub mod names;

#[path = "../../../src/selector.rs"]
pub mod selector;

pub mod api;
pub mod http;
pub mod manifests;
pub mod pki;
pub mod real;
pub mod store;

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use base64::Engine as _;

pub use api::{Behaviour, Fault, Grant, Match, Recorded, Route};
pub use pki::{CertPair, Pki};
pub use store::{ConfigMap, Object, WriteError};

/// The token every default-started server accepts.
pub const TOKEN: &str = "cmpoll-test-token";
/// The user that token belongs to, with access to everything.
pub const USER: &str = "system:serviceaccount:cmpoll:cmpoll";

/// How to start a server.
pub struct Options {
    pub bind: IpAddr,
    /// Also listen for plain HTTP on another port.
    pub plain_http: bool,
    pub behaviour: Behaviour,
    /// The PKI to serve with (for example one whose serving certificate has other names).
    pub pki: Option<Pki>,
    /// The resourceVersion before the first write.
    pub start_revision: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            plain_http: false,
            behaviour: Behaviour {
                // Tests should not wait the apiserver's 3 s for a lagging cache.
                too_large_wait: std::time::Duration::from_millis(50),
                ..Behaviour::default()
            },
            pki: None,
            start_revision: 1000,
        }
    }
}

/// Request counts, by storage path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: usize,
    pub cache: usize,
    pub etcd: usize,
}

/// A running test apiserver. Dropping it stops the listeners.
pub struct TestApiserver {
    state: Arc<Mutex<api::State>>,
    pki: Pki,
    addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl TestApiserver {
    /// HTTPS on 127.0.0.1 with an ephemeral port and the default token.
    pub fn start() -> TestApiserver {
        Self::start_with(Options::default())
    }

    pub fn start_with(opts: Options) -> TestApiserver {
        let pki = opts.pki.unwrap_or_else(|| Pki::new("test-apiserver-ca"));
        let mut state = api::State::new(opts.behaviour, opts.start_revision);
        state.tokens.insert(TOKEN.into(), USER.into());
        state.grants.insert(USER.into(), Grant::all());
        let listener = TcpListener::bind((opts.bind, 0)).expect("bind the test apiserver");
        let addr = listener.local_addr().expect("bound address");
        state.address = addr.to_string();
        let state = Arc::new(Mutex::new(state));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<dyn http::Handler> = Arc::new(api::Api {
            state: state.clone(),
        });
        let tls = http::tls_config(&pki);
        let mut threads = Vec::new();
        let (h, s) = (handler.clone(), stop.clone());
        threads.push(
            std::thread::Builder::new()
                .name("apiserver-https".into())
                .spawn(move || http::serve(listener, Some(tls), h, s))
                .expect("spawn"),
        );
        let mut http_addr = None;
        if opts.plain_http {
            let plain = TcpListener::bind((opts.bind, 0)).expect("bind plain HTTP");
            http_addr = Some(plain.local_addr().expect("bound address"));
            let (h, s) = (handler, stop.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("apiserver-http".into())
                    .spawn(move || http::serve(plain, None, h, s))
                    .expect("spawn"),
            );
        }
        TestApiserver {
            state,
            pki,
            addr,
            http_addr,
            stop,
            threads,
        }
    }

    fn state(&self) -> MutexGuard<'_, api::State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:PORT` (or `https://[::1]:PORT`).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// `http://…` when started with `plain_http`.
    pub fn http_url(&self) -> Option<String> {
        self.http_addr.map(|a| format!("http://{a}"))
    }

    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    pub fn ca_pem(&self) -> String {
        self.pki.ca_pem()
    }

    // --- credentials and access -------------------------------------------------------

    /// Accepts `token` as `user` (who still needs a grant).
    pub fn add_token(&self, token: &str, user: &str) {
        self.state().tokens.insert(token.into(), user.into());
    }

    /// Stops accepting `token` (a revoked or rotated-away token).
    pub fn revoke_token(&self, token: &str) {
        self.state().tokens.remove(token);
    }

    /// Accepts basic auth `username:password` as `user`.
    pub fn add_basic(&self, username: &str, password: &str, user: &str) {
        self.state()
            .basic
            .insert((username.into(), password.into()), user.into());
    }

    pub fn grant(&self, user: &str, grant: Grant) {
        self.state().grants.insert(user.into(), grant);
    }

    pub fn revoke(&self, user: &str) {
        self.state().grants.remove(user);
    }

    /// A client certificate for `user`, signed by this server's CA.
    pub fn client_cert(&self, user: &str) -> CertPair {
        self.pki.client_cert(user)
    }

    // --- the store ----------------------------------------------------------------------

    /// Creates or updates a ConfigMap; panics if the apiserver would refuse it.
    pub fn put(&self, cm: ConfigMap) -> Arc<Object> {
        self.try_put(cm).expect("put")
    }

    pub fn try_put(&self, cm: ConfigMap) -> Result<Arc<Object>, WriteError> {
        self.state().store.put(cm)
    }

    /// Deletes a ConfigMap; panics if it does not exist.
    pub fn delete(&self, namespace: &str, name: &str) {
        let key = store::key("configmaps", namespace, name);
        self.state().store.delete(&key).expect("delete");
    }

    /// Deletes a Secret; panics if it does not exist.
    pub fn delete_secret(&self, namespace: &str, name: &str) {
        let key = store::key("secrets", namespace, name);
        self.state().store.delete(&key).expect("delete");
    }

    /// The current ConfigMap, if any.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Object>> {
        let st = self.state();
        st.store
            .get_at(
                &store::key("configmaps", namespace, name),
                st.store.revision(),
            )
            .ok()
            .flatten()
    }

    /// Every current object, in key order.
    pub fn objects(&self) -> Vec<Arc<Object>> {
        self.state().store.all()
    }

    /// Loads `n` module ConfigMaps of about `size` bytes each, spread over `namespaces`
    /// namespaces (`ns-00`…), labelled `cmpoll.io/module=true`.
    pub fn bulk_load(&self, n: usize, size: usize, namespaces: usize) {
        let mut st = self.state();
        for i in 0..n {
            st.store
                .put(generated(i, size, namespaces))
                .expect("generated put");
        }
    }

    /// Loads ConfigMap manifests (YAML or JSON, multi-document, `List` kinds) from a
    /// directory, recursively. Returns how many ConfigMaps were loaded.
    pub fn load_manifests(&self, dir: &Path) -> Result<usize, String> {
        let cms = manifests::load_dir(dir)?;
        let n = cms.len();
        let mut st = self.state();
        for cm in cms {
            st.store.put(cm).map_err(|e| format!("{e:?}"))?;
        }
        Ok(n)
    }

    /// The current resourceVersion (etcd revision).
    pub fn revision(&self) -> u64 {
        self.state().store.revision()
    }

    /// A write elsewhere in the cluster: the revision moves on.
    pub fn bump_revision(&self) {
        self.state().store.bump();
    }

    // --- behaviour ------------------------------------------------------------------------

    /// Freezes the watch cache at the current revision: later writes are not visible to
    /// cache reads, and `resourceVersion` above it gets 504 "Too large resource version".
    pub fn freeze_cache(&self) {
        let mut st = self.state();
        let rev = st.store.revision();
        let objs = st.store.all();
        st.frozen_cache = Some((rev, objs));
    }

    /// Freezes the watch cache at an older revision, as a lagging apiserver behind a load
    /// balancer serves it: `resourceVersion` above `rev` gets 504 from the cache.
    pub fn freeze_cache_at(&self, rev: u64) {
        let mut st = self.state();
        let objs = st
            .store
            .range_at("", "", rev)
            .expect("revision still in history");
        st.frozen_cache = Some((rev, objs));
    }

    /// Lets the watch cache catch up again.
    pub fn thaw_cache(&self) {
        self.state().frozen_cache = None;
    }

    /// Makes every continue token issued so far expire (410 on its next use).
    pub fn expire_continue_tokens(&self) {
        self.state().expire_continue_tokens();
    }

    /// Injects `fault` into the next `times` requests that match.
    pub fn fault(&self, when: Match, fault: Fault, times: u32) {
        self.state().add_fault(when, fault, 0, Some(times));
    }

    /// Injects `fault` into matching requests after letting `skip` of them through.
    pub fn fault_after(&self, when: Match, skip: u32, fault: Fault, times: u32) {
        self.state().add_fault(when, fault, skip, Some(times));
    }

    /// Injects `fault` into every matching request until `clear_faults`.
    pub fn fault_always(&self, when: Match, fault: Fault) {
        self.state().add_fault(when, fault, 0, None);
    }

    pub fn clear_faults(&self) {
        self.state().clear_faults();
    }

    // --- what happened ----------------------------------------------------------------------

    pub fn requests(&self) -> Vec<Recorded> {
        self.state().log.clone()
    }

    pub fn clear_requests(&self) {
        self.state().log.clear();
    }

    pub fn counts(&self) -> Counts {
        let st = self.state();
        let mut c = Counts {
            requests: st.log.len(),
            ..Counts::default()
        };
        for r in &st.log {
            match r.route {
                Route::Cache => c.cache += 1,
                Route::Etcd => c.etcd += 1,
                Route::None => {}
            }
        }
        c
    }

    // --- client configuration ---------------------------------------------------------------

    /// Writes a kubeconfig for this server; returns its path.
    pub fn write_kubeconfig(&self, path: &Path, spec: &Kubeconfig) -> PathBuf {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).expect("kubeconfig folder");
        }
        fs::write(path, self.kubeconfig_yaml(spec)).expect("write kubeconfig");
        path.to_path_buf()
    }

    pub fn kubeconfig_yaml(&self, spec: &Kubeconfig) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let server = spec.server.clone().unwrap_or_else(|| self.url());
        let mut cluster = format!("    server: {server}\n");
        match &spec.trust {
            Trust::CaData => {
                cluster += &format!("    certificate-authority-data: {}\n", b64(&self.ca_pem()))
            }
            Trust::CaFile(p) => cluster += &format!("    certificate-authority: {}\n", p.display()),
            Trust::Insecure => cluster += "    insecure-skip-tls-verify: true\n",
            Trust::System => {}
        }
        if let Some(name) = &spec.tls_server_name {
            cluster += &format!("    tls-server-name: {name}\n");
        }
        if spec.disable_compression {
            cluster += "    disable-compression: true\n";
        }
        if let Some(url) = &spec.proxy_url {
            cluster += &format!("    proxy-url: {url}\n");
        }
        let user = match &spec.credential {
            Credential::Token(t) => format!("    token: {t}\n"),
            Credential::TokenFile(p) => format!("    tokenFile: {}\n", p.display()),
            Credential::ClientCertFiles { cert, key } => format!(
                "    client-certificate: {}\n    client-key: {}\n",
                cert.display(),
                key.display()
            ),
            Credential::ClientCertData(pair) => format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                b64(&pair.cert_pem),
                b64(&pair.key_pem)
            ),
            Credential::Raw(yaml) => yaml.clone(),
            Credential::None => "    {}\n".to_string(),
        };
        let namespace = spec
            .namespace
            .as_ref()
            .map(|n| format!("    namespace: {n}\n"))
            .unwrap_or_default();
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: {ctx}\nclusters:\n- name: test\n  cluster:\n{cluster}users:\n- name: test\n  user:\n{user}contexts:\n- name: {ctx}\n  context:\n    cluster: test\n    user: test\n{namespace}",
            ctx = spec.context
        )
    }
}

/// The ConfigMap `bulk_load` makes for index `i`.
pub fn generated(i: usize, size: usize, namespaces: usize) -> ConfigMap {
    let mut content = String::with_capacity(size + 80);
    let mut line = 0;
    while content.len() < size {
        content.push_str(&format!(
            "prometheus.scrape \"job_{i}_{line}\" {{ targets = [\"10.0.{}.{}:9090\"] }}\n",
            line % 250,
            i % 250
        ));
        line += 1;
    }
    content.truncate(size);
    ConfigMap::new(
        &format!("ns-{:02}", i % namespaces.max(1)),
        &format!("module-{i:06}"),
    )
    .label("cmpoll.io/module", "true")
    .label("app.kubernetes.io/part-of", "bench")
    .data("config.alloy", &content)
}

/// What a written kubeconfig contains.
#[derive(Clone, Debug)]
pub struct Kubeconfig {
    pub context: String,
    pub credential: Credential,
    pub trust: Trust,
    /// Another server URL than this one's (for example an unreachable one).
    pub server: Option<String>,
    pub namespace: Option<String>,
    pub tls_server_name: Option<String>,
    pub disable_compression: bool,
    pub proxy_url: Option<String>,
}

impl Kubeconfig {
    /// The default token, CA as data.
    pub fn token() -> Kubeconfig {
        Kubeconfig::with(Credential::Token(TOKEN.into()))
    }

    pub fn with(credential: Credential) -> Kubeconfig {
        Kubeconfig {
            context: "test".into(),
            credential,
            trust: Trust::CaData,
            server: None,
            namespace: None,
            tls_server_name: None,
            disable_compression: false,
            proxy_url: None,
        }
    }

    pub fn trust(mut self, trust: Trust) -> Self {
        self.trust = trust;
        self
    }
}

#[derive(Clone, Debug)]
pub enum Credential {
    Token(String),
    TokenFile(PathBuf),
    ClientCertFiles {
        cert: PathBuf,
        key: PathBuf,
    },
    ClientCertData(CertPair),
    /// A `user:` block written as given (indented four spaces).
    Raw(String),
    None,
}

#[derive(Clone, Debug)]
pub enum Trust {
    CaData,
    CaFile(PathBuf),
    Insecure,
    /// No CA: the platform roots.
    System,
}

impl Drop for TestApiserver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loops so they see the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(a) = self.http_addr {
            let _ = TcpStream::connect(a);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A running process's resident set (KiB, from `/proc/PID/status`; 0 if it is gone), for
/// the benchmark and the soak.
pub fn proc_rss_kib(pid: u32) -> u64 {
    proc_status_kib(pid, "VmRSS")
}

/// A KiB field of `/proc/PID/status` (`VmRSS`, `VmHWM`…), 0 if the process is gone.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// How many file descriptors a running process holds (0 if it is gone).
pub fn proc_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}
