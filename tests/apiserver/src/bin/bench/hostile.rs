//! What hostile clients make a hub hold, and how a good follower fares meanwhile (issue
//! 56.4, 56.6), on the real apiserver. A hub (`--interval 1s`, an RSA-2048 serving
//! certificate: what cert-manager issues by default, and the costliest handshake) serves
//! 100 selected ConfigMaps of 20 KB in one namespace (a ~4 MB list) and one in another.
//! Throughout, a good follower lists the small namespace on its kept connection every
//! 50 ms, and a probe asks `/healthz` on a fresh connection every 200 ms (as the kubelet
//! does, from another address than the flood's); each gives up after 5 s (a failure).
//! Phases of `--phase` seconds:
//!
//! - quiet;
//! - 2,000 ClientHellos a second from 127.0.0.2, each connection kept open and never
//!   read (each hello makes the hub do a handshake's first flight: its signature);
//! - one follower token asks a 4 MB page (`limit=99` of the 100 objects: made for each
//!   request) on 150 connections with a 4 KiB window that never read;
//! - 5,000 token-less connections: each asks without a token (401) and stays; the last
//!   1,500 stall halfway through a second, 15 KiB head.
//!
//! For each: the follower's and the probe's latency (p50, p99, slowest, failures), and the
//! hub's RSS at the phase's end beside the quiet phase's. `--baseline PATH` measures an
//! older build beside this one.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use test_apiserver::real::RealApiserver;

use super::sidecar::apply;

pub struct Plan {
    pub phase: Duration,
    /// Builds to measure: a label and a binary.
    pub builds: Vec<(String, PathBuf)>,
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// What the bench needs to reach the hub.
#[derive(Clone)]
struct Reach {
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
}

impl Reach {
    /// A TLS connection from `from` (the default address when `None`) whose receive
    /// buffer is `window` bytes when given; the handshake done.
    fn connect(&self, from: Option<IpAddr>, window: Option<usize>) -> Option<Tls> {
        use rustix::net::{AddressFamily, SocketType, bind, connect, socket, sockopt};
        let fd = socket(AddressFamily::INET, SocketType::STREAM, None).ok()?;
        if let Some(w) = window {
            sockopt::set_socket_recv_buffer_size(&fd, w).ok()?;
        }
        if let Some(ip) = from {
            bind(&fd, &SocketAddr::new(ip, 0)).ok()?;
        }
        connect(&fd, &self.addr).ok()?;
        let sock = TcpStream::from(fd);
        sock.set_nodelay(true).ok()?;
        sock.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        sock.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
        let name = ServerName::try_from("127.0.0.1").ok()?;
        let conn = rustls::ClientConnection::new(self.config.clone(), name).ok()?;
        let mut tls = rustls::StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).ok()?;
        }
        Some(tls)
    }

    /// The first flight a client sends: a ClientHello.
    fn hello(&self) -> Vec<u8> {
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let mut conn = rustls::ClientConnection::new(self.config.clone(), name).expect("client");
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).expect("hello");
        }
        out
    }
}

/// Sends `GET path` (as `token`, when not empty) on `tls` and reads the answer whole
/// (`Content-Length` framing): its status.
fn ask(tls: &mut Tls, path: &str, token: &str) -> Option<u16> {
    let auth = match token {
        "" => String::new(),
        t => format!("Authorization: Bearer {t}\r\n"),
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n");
    tls.write_all(request.as_bytes()).ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    let end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tls.read(&mut buf).ok().filter(|n| *n > 0)?;
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let length: usize = (head.lines())
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while got.len() < end + length {
        let n = tls.read(&mut buf).ok().filter(|n| *n > 0)?;
        got.extend_from_slice(&buf[..n]);
    }
    head.get(9..12)?.parse().ok()
}

/// Latencies of one kind of request, and how many failed.
#[derive(Default)]
struct Samples {
    took: Vec<Duration>,
    failed: usize,
}

impl Samples {
    fn show(&mut self) -> String {
        self.took.sort();
        let at = |q: f64| {
            self.took
                .get(((self.took.len() as f64 * q) as usize).min(self.took.len().saturating_sub(1)))
                .map_or("-".to_string(), |d| {
                    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
                })
        };
        format!(
            "{} / {} / {} ({} failed of {})",
            at(0.5),
            at(0.99),
            at(1.0),
            self.failed,
            self.took.len() + self.failed
        )
    }
}

/// The follower and the probe, asking until told to stop.
struct Watchers {
    stop: Arc<AtomicBool>,
    follower: Arc<Mutex<Samples>>,
    probe: Arc<Mutex<Samples>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Watchers {
    fn start(reach: &Reach, token: &str) -> Watchers {
        let stop = Arc::new(AtomicBool::new(false));
        let follower = Arc::new(Mutex::new(Samples::default()));
        let probe = Arc::new(Mutex::new(Samples::default()));
        let mut threads = Vec::new();
        {
            let (stop, samples, reach, token) = (
                stop.clone(),
                follower.clone(),
                reach.clone(),
                token.to_string(),
            );
            threads.push(std::thread::spawn(move || {
                let mut kept: Option<Tls> = None;
                while !stop.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    if kept.is_none() {
                        kept = reach.connect(None, None);
                    }
                    let ok = (kept.as_mut()).and_then(|t| {
                        ask(t, "/api/v1/namespaces/hostile-small/configmaps", &token)
                    }) == Some(200);
                    let mut s = samples.lock().unwrap();
                    if ok {
                        s.took.push(at.elapsed());
                    } else {
                        s.failed += 1;
                        kept = None;
                    }
                    drop(s);
                    std::thread::sleep(Duration::from_millis(50));
                }
            }));
        }
        {
            let (stop, samples, reach) = (stop.clone(), probe.clone(), reach.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    let ok = (reach.connect(None, None))
                        .and_then(|mut t| ask(&mut t, "/healthz", ""))
                        == Some(200);
                    let mut s = samples.lock().unwrap();
                    if ok {
                        s.took.push(at.elapsed());
                    } else {
                        s.failed += 1;
                    }
                    drop(s);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }));
        }
        Watchers {
            stop,
            follower,
            probe,
            threads,
        }
    }

    /// What they measured since the last call.
    fn take(&self) -> (Samples, Samples) {
        (
            std::mem::take(&mut *self.follower.lock().unwrap()),
            std::mem::take(&mut *self.probe.lock().unwrap()),
        )
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// ClientHellos from 127.0.0.2 at `rate` a second for `long`, on four threads, each
/// connection kept open and never read (the oldest let go past 1,000 a thread): how many.
fn hellos(reach: &Reach, rate: u64, long: Duration) -> u64 {
    let hello = reach.hello();
    let from: IpAddr = [127, 0, 0, 2].into();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (hello, addr) = (hello.clone(), reach.addr);
            std::thread::spawn(move || {
                let mut open = VecDeque::new();
                let (t0, mut sent) = (Instant::now(), 0u64);
                while t0.elapsed() < long {
                    let due = t0 + Duration::from_secs_f64(sent as f64 * 4.0 / rate as f64);
                    std::thread::sleep(due.saturating_duration_since(Instant::now()));
                    let Ok(s) =
                        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    else {
                        continue;
                    };
                    if s.bind(&SocketAddr::new(from, 0).into()).is_err()
                        || s.connect(&addr.into()).is_err()
                    {
                        continue;
                    }
                    let mut s = TcpStream::from(s);
                    if s.write_all(&hello).is_ok() {
                        sent += 1;
                        open.push_back(s);
                    }
                    if open.len() > 1000 {
                        open.drain(..500);
                    }
                }
                sent
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap_or(0)).sum()
}

/// Opens `n` connections on eight threads, each made by `open`.
fn open_many(n: usize, open: impl Fn() -> Option<Tls> + Send + Sync + 'static) -> Vec<Tls> {
    let open = Arc::new(open);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let open = open.clone();
            std::thread::spawn(move || {
                (0..n / 8 + usize::from(t < n % 8))
                    .filter_map(|_| open())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_default())
        .collect()
}

/// An RSA-2048 certificate for 127.0.0.1 from a CA of its own (openssl): the CA's PEM
/// file, the certificate's and its key's.
fn rsa_certificate(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let p = |name: &str| dir.join(name);
    std::fs::write(
        p("ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("ext");
    let steps: [Vec<&str>; 3] = [
        vec![
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=bench-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
        vec![
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "hub.key",
            "-out",
            "hub.csr",
        ],
        vec![
            "x509",
            "-req",
            "-in",
            "hub.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext",
            "-out",
            "hub.crt",
        ],
    ];
    for args in steps {
        let status = Command::new("openssl")
            .args(&args)
            .current_dir(dir)
            .stderr(Stdio::null())
            .status()
            .expect("openssl");
        assert!(status.success(), "openssl {args:?}");
    }
    (p("ca.crt"), p("hub.crt"), p("hub.key"))
}

/// The objects, the hub's and the followers' accounts; (the hub's token, the good
/// follower's, the hog's).
fn setup(api: &RealApiserver) -> (String, String, String) {
    let mut items = vec![
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hostile-big"}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hostile-small"}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hostile-agents"}}),
        // The hub's own account lives there (`hubs::hub_token`).
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet-agents"}}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "hostile-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch", "get"]}]}),
    ];
    for who in ["good", "hog"] {
        items.push(
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": who, "namespace": "hostile-agents"}}),
        );
        items.push(serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding", "metadata": {"name": format!("hostile-{who}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "hostile-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": who, "namespace": "hostile-agents"}]}));
    }
    items.push(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "m", "namespace": "hostile-small", "labels": {"cmpoll.io/module": "true"}},
        "data": {"k.yaml": "v"}}));
    for i in 0..100 {
        items.push(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("big-{i}"), "namespace": "hostile-big", "labels": {"cmpoll.io/module": "true"}},
            "data": {"k": "x".repeat(20_000)}}));
    }
    apply(api, items);
    (
        super::hubs::hub_token(api),
        api.token("hostile-agents", "good", "24h"),
        api.token("hostile-agents", "hog", "24h"),
    )
}

fn raise_files(want: u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    let max = l.maximum.unwrap_or(u64::MAX);
    l.current = Some(want.max(l.current.unwrap_or(0)).min(max));
    let _ = setrlimit(Resource::Nofile, l);
}

/// A hub of `bin` on `port`, polling as `token`.
fn spawn(bin: &Path, api: &RealApiserver, dir: &Path, port: u16, token: &str) -> Child {
    let (_, cert, key) = rsa_certificate(dir);
    std::fs::write(dir.join("token"), token).expect("token");
    std::fs::write(dir.join("apiserver-ca.crt"), api.ca_pem()).expect("ca");
    Command::new(bin)
        .args(["serve", "--server", &api.url, "--interval", "1s"])
        .arg("--token-file")
        .arg(dir.join("token"))
        .arg("--ca-file")
        .arg(dir.join("apiserver-ca.crt"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cmpoll serve")
}

pub fn run(plan: &Plan) {
    raise_files(20_000);
    let api = RealApiserver::start();
    let (hub_token, good, hog) = setup(&api);
    println!(
        "a hub beside hostile clients: RSA-2048 certificate, a 4 MB list; a good follower lists on its kept connection every 50 ms, a probe asks /healthz on a fresh connection every 200 ms; {} s phases",
        plan.phase.as_secs()
    );
    println!(
        "| build | phase | follower p50 / p99 / slowest | probe p50 / p99 / slowest | hub RSS (beside quiet) |"
    );
    println!("|---|---|---|---|---|");
    for (label, bin) in &plan.builds {
        let dir = tempfile::tempdir().expect("dir");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
            l.local_addr().expect("port").port()
        };
        let mut hub = spawn(bin, &api, dir.path(), port, &hub_token);
        let ca = std::fs::read_to_string(dir.path().join("ca.crt")).expect("CA");
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca.as_bytes()).flatten() {
            let _ = roots.add(c);
        }
        let config = Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("TLS")
            .with_root_certificates(roots)
            .with_no_client_auth(),
        );
        let reach = Reach {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            config,
        };
        let t0 = Instant::now();
        while (reach.connect(None, None)).and_then(|mut t| ask(&mut t, "/readyz", "")) != Some(200)
        {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{label}: the hub not ready"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let rss = || test_apiserver::proc_rss_kib(hub.id()) as f64 / 1024.0;
        let watchers = Watchers::start(&reach, &good);
        let row = |phase: &str, quiet: f64, w: &Watchers| {
            let (mut f, mut p) = w.take();
            println!(
                "| {label} | {phase} | {} | {} | {:+.0} MiB |",
                f.show(),
                p.show(),
                rss() - quiet
            );
        };
        std::thread::sleep(plan.phase);
        let quiet = rss();
        row("quiet", quiet, &watchers);
        let sent = hellos(&reach, 2000, plan.phase);
        row(
            &format!(
                "{:.0} ClientHellos a second",
                sent as f64 / plan.phase.as_secs_f64()
            ),
            quiet,
            &watchers,
        );
        std::thread::sleep(Duration::from_secs(12));
        watchers.take();
        let page = "/api/v1/namespaces/hostile-big/configmaps?limit=99";
        let held: Vec<Tls> = (0..150)
            .filter_map(|_| {
                let mut t = reach.connect(None, Some(4096))?;
                write!(
                    t,
                    "GET {page} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {hog}\r\n\r\n"
                )
                .ok()?;
                Some(t)
            })
            .collect();
        std::thread::sleep(plan.phase);
        row(
            &format!(
                "one token, {} connections that never read a 4 MB page",
                held.len()
            ),
            quiet,
            &watchers,
        );
        drop(held);
        std::thread::sleep(Duration::from_secs(5));
        watchers.take();
        let mut loose = Vec::new();
        for (n, stall) in [(3500, false), (1500, true)] {
            let reach = reach.clone();
            loose.extend(open_many(n, move || {
                let mut t = reach.connect(None, None)?;
                if ask(&mut t, "/api/v1/namespaces/hostile-small/configmaps", "")? != 401 {
                    return None;
                }
                if stall {
                    let half =
                        format!("GET / HTTP/1.1\r\nHost: x\r\nX-Pad: {}", "p".repeat(15_000));
                    t.write_all(half.as_bytes()).ok()?;
                }
                Some(t)
            }));
        }
        std::thread::sleep(Duration::from_secs(2));
        row(
            &format!(
                "{} token-less connections (1,500 stalled in a 15 KiB head)",
                loose.len()
            ),
            quiet,
            &watchers,
        );
        drop(loose);
        watchers.stop();
        let _ = hub.kill();
        let _ = hub.wait();
    }
}
