//! The fleet bench's hubs (issue 39): one or two `cmpoll serve` processes polling the real
//! apiserver as the shipped role allows (their own service account), each serving on a
//! port of its own, behind one address as a Service puts them: a TCP balancer that hands
//! each new connection to the next hub that accepts it (kube-proxy balances connections,
//! not requests). Followers reach the balancer with a kubeconfig naming it, the hubs' CA
//! and the fleet's token. A restart is a SIGTERM and a new process on the same port.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use test_apiserver::Pki;
use test_apiserver::real::RealApiserver;

/// Hubs running, and the address in front of them.
pub struct Hubs {
    bin: PathBuf,
    dir: PathBuf,
    interval: String,
    api_url: String,
    ports: Vec<u16>,
    procs: Vec<Child>,
    /// Flags every hub gets besides the bench's own.
    extra: Vec<String>,
    /// Each hub in the balancer's rotation (`probing`: as its `/readyz` says).
    ready: Arc<Vec<AtomicBool>>,
    /// Where followers connect.
    pub port: u16,
}

/// The hubs' service account, with the shipped role (k8s/serve/clusterrole.yaml); its
/// token.
pub fn hub_token(api: &RealApiserver) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let role = std::fs::read_to_string(root.join("k8s/serve/clusterrole.yaml")).expect("role");
    api.ok_in(&["apply", "-f", "-"], Some(&role));
    super::sidecar::apply(
        api,
        vec![
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "hub", "namespace": "fleet-agents"}}),
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding", "metadata": {"name": "cmpoll-hub"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cmpoll-hub"},
                "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": "fleet-agents"}]}),
        ],
    );
    api.token("fleet-agents", "hub", "24h")
}

impl Hubs {
    /// `count` hubs polling every `interval`, ready, and the balancer before them.
    pub fn start(
        api: &RealApiserver,
        bin: &Path,
        count: usize,
        interval: &str,
        dir: &Path,
    ) -> Hubs {
        Hubs::start_with(api, bin, count, interval, dir, &[])
    }

    /// `start`, each hub with the flags `extra`.
    pub fn start_with(
        api: &RealApiserver,
        bin: &Path,
        count: usize,
        interval: &str,
        dir: &Path,
        extra: &[&str],
    ) -> Hubs {
        let token = hub_token(api);
        Hubs::start_as(api, bin, count, interval, dir, extra, &token)
    }

    /// `start_with`, the hubs polling as `token`.
    pub fn start_as(
        api: &RealApiserver,
        bin: &Path,
        count: usize,
        interval: &str,
        dir: &Path,
        extra: &[&str],
        token: &str,
    ) -> Hubs {
        let pki = Pki::with_server_names("fleet-hub", &["127.0.0.1"]);
        let w = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("write");
            p
        };
        w("hub-ca.crt", &pki.ca_pem());
        w("hub.crt", &pki.server.cert_pem);
        w("hub.key", &pki.server.key_pem);
        w("apiserver-ca.crt", &api.ca_pem());
        w("hub-token", token);
        let ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
        let ready = Arc::new(
            (0..count)
                .map(|_| AtomicBool::new(true))
                .collect::<Vec<_>>(),
        );
        let mut hubs = Hubs {
            bin: bin.into(),
            dir: dir.into(),
            interval: interval.into(),
            api_url: api.url.clone(),
            procs: Vec::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            port: balance(ports.clone(), ready.clone()),
            ready,
            ports,
        };
        for i in 0..count {
            let p = hubs.spawn(i);
            hubs.procs.push(p);
        }
        hubs.wait_ready();
        hubs
    }

    fn spawn(&self, i: usize) -> Child {
        let d = &self.dir;
        Command::new(&self.bin)
            .args([
                "serve",
                "--server",
                &self.api_url,
                "--interval",
                &self.interval,
            ])
            .arg("--token-file")
            .arg(d.join("hub-token"))
            .arg("--ca-file")
            .arg(d.join("apiserver-ca.crt"))
            .args(["--listen", &format!("127.0.0.1:{}", self.ports[i])])
            .arg("--tls-cert-file")
            .arg(d.join("hub.crt"))
            .arg("--tls-key-file")
            .arg(d.join("hub.key"))
            .args(&self.extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn cmpoll serve")
    }

    fn wait_ready(&self) {
        for port in &self.ports {
            let start = Instant::now();
            while !ready(*port, &self.dir.join("hub-ca.crt")) {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "hub :{port} not ready"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// From now on the balancer sends new connections only to hubs whose `/readyz` says
    /// so (asked every half second), as a Service stops sending to a pod that is not
    /// ready: the prober runs as long as the bench.
    pub fn probing(&self) {
        let (ports, ready) = (self.ports.clone(), self.ready.clone());
        let ca = self.dir.join("hub-ca.crt");
        std::thread::spawn(move || {
            loop {
                for (i, port) in ports.iter().enumerate() {
                    ready[i].store(self::ready(*port, &ca), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
    }

    /// Hub `i` told to stop (SIGTERM: it drains).
    pub fn terminate(&self, i: usize) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.procs[i].id().to_string()])
            .status();
    }

    /// Whether hub `i` has exited.
    pub fn exited(&mut self, i: usize) -> bool {
        self.procs[i].try_wait().ok().flatten().is_some()
    }

    /// Hub `i` started again (after it exited).
    pub fn respawn(&mut self, i: usize) {
        self.procs[i] = self.spawn(i);
    }

    /// Whether hub `i` says it is ready.
    pub fn is_ready(&self, i: usize) -> bool {
        ready(self.ports[i], &self.dir.join("hub-ca.crt"))
    }

    /// How many hubs.
    pub fn count(&self) -> usize {
        self.procs.len()
    }

    /// Hub `i`'s own port (no balancer) and process id.
    pub fn hub(&self, i: usize) -> (u16, u32) {
        (self.ports[i], self.procs[i].id())
    }

    /// The hubs' CA, PEM.
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.dir.join("hub-ca.crt")).expect("ca")
    }

    /// A kubeconfig for follower `i`: the balancer, the hubs' CA, `token`.
    pub fn kubeconfig(&self, token: &str, i: usize) -> PathBuf {
        self.kubeconfig_to(self.port, token, i)
    }

    /// A kubeconfig for follower `i` naming `port` (a hub itself, or the balancer).
    pub fn kubeconfig_to(&self, port: u16, token: &str, i: usize) -> PathBuf {
        use base64::Engine as _;
        let ca = std::fs::read_to_string(self.dir.join("hub-ca.crt")).expect("ca");
        let p = self.dir.join(format!("follower-{i}.kubeconfig"));
        std::fs::write(
            &p,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: hub\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: hub\n  context: {{cluster: hub, user: u}}\ncurrent-context: hub\n",
                port,
                base64::engine::general_purpose::STANDARD.encode(ca)
            ),
        )
        .expect("kubeconfig");
        p
    }

    /// Every hub stopped (SIGTERM, as a rollout stops a pod) and started again, one after
    /// the other; ready again.
    pub fn restart(&mut self) {
        for i in 0..self.procs.len() {
            let pid = self.procs[i].id();
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            let _ = self.procs[i].wait();
            self.procs[i] = self.spawn(i);
        }
        self.wait_ready();
    }

    /// The largest resident KiB any hub process has had (its VmHWM).
    pub fn peak_kib(&self) -> u64 {
        (self.procs.iter())
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{}/status", p.id())).ok())
            .filter_map(|s| {
                let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_string();
                line.split_whitespace().nth(1)?.parse().ok()
            })
            .max()
            .unwrap_or(0)
    }

    /// CPU seconds and resident KiB of every hub now, summed.
    pub fn usage(&self) -> (f64, u64) {
        self.procs
            .iter()
            .map(|p| super::proc_usage(p.id()))
            .fold((0.0, 0), |(c, r), (c2, r2)| (c + c2, r + r2))
    }
}

impl Drop for Hubs {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Whether the hub on `port` says it is ready.
fn ready(port: u16, ca: &Path) -> bool {
    Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "2",
            "--cacert",
        ])
        .arg(ca)
        .arg(format!("https://127.0.0.1:{port}/readyz"))
        .output()
        .is_ok_and(|o| o.stdout == b"200")
}

/// A TCP balancer on a free port: each connection to the next backend that accepts it,
/// among those `ready` (any, when none is).
fn balance(backends: Vec<u16>, ready: Arc<Vec<AtomicBool>>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let next = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for client in l.incoming().map_while(Result::ok) {
            let start = next.fetch_add(1, Ordering::Relaxed);
            let order = (0..backends.len()).map(|k| (start + k) % backends.len());
            let (up, down): (Vec<usize>, Vec<usize>) =
                order.partition(|&b| ready[b].load(Ordering::Relaxed));
            let server = (up.into_iter().chain(down))
                .find_map(|b| TcpStream::connect(("127.0.0.1", backends[b])).ok());
            let Some(server) = server else { continue };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                continue;
            };
            for (mut from, mut to) in [(client, s2), (server, c2)] {
                let _ = std::thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn(move || {
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
    port
}
