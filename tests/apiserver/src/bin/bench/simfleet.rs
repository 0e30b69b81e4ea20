//! One hub and a simulated fleet (issue 48.5), on the real apiserver holding M labelled
//! ConfigMaps of 2 KiB in 10 namespaces: N followers held by one process
//! (`simclient.rs`), each with its own token (TokenRequest) and TLS connection, speaking
//! either protocol (the long poll of followers before 48, the watch of followers now),
//! side by side in one run. Real follower processes cannot show a fleet on two cores
//! (the followers' own CPU dominated the 500-follower runs).
//!
//! First the check that the simulator sends what a real follower sends: N_CHECK real
//! `cmpoll run` followers, then as many simulated ones, each against a fresh hub through
//! the same phases; the hub's requests and bytes out per follower per phase side by side.
//!
//! Then per protocol and N: **sync** (every follower's first list; the hub's peak resident
//! memory, its `VmHWM`), **idle** (the hub's CPU while nothing changes, its resident memory
//! over its base per follower), **churn** (one ConfigMap a second: the hub's bytes out a
//! change, total and per follower, beside the floor — N × the changed object's JSON —; the
//! time from the write to the first follower holding it, about when the hub's poll found
//! it, and to the last; the hub's CPU), the reviews the hub made, and every error (an answer
//! that is not 200 or 304, a broken connection, a change a follower never got).

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use test_apiserver::real::{RealApiserver, metric_sum};

use super::apifleet::{self, NAMESPACES};
use super::hubs::Hubs;
use super::sidecar::apply;
use super::simclient::{Protocol, Retry, Setup, Sim};

pub struct Plan {
    pub sizes: Vec<usize>,
    pub objects: usize,
    pub phase: Duration,
    pub protocols: Vec<Protocol>,
    /// Real followers for the simulator's check (0: none).
    pub check: usize,
}

/// A follower's interval: its wait at the hub.
const WAIT: Duration = Duration::from_secs(30);

pub fn run(cmpoll: &Path, plan: &Plan) {
    let api = RealApiserver::start();
    apifleet::account_token(&api);
    apifleet::load(&api, 0, plan.objects);
    let most = plan
        .sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(plan.check);
    let started = Instant::now();
    let tokens = tokens(&api, most);
    println!(
        "simulated fleet: {} objects of {} B in {NAMESPACES} namespaces, {most} tokens in {:.0}s; churn 1 change/s over {}s phases",
        plan.objects,
        apifleet::BYTES,
        started.elapsed().as_secs_f64(),
        plan.phase.as_secs()
    );
    let scraper = scraper_token(&api);
    if plan.check > 0 {
        check(&api, cmpoll, &tokens[..plan.check], &scraper, plan);
    }
    let mut round = 1_000_000;
    let mut rows = Vec::new();
    for &protocol in &plan.protocols {
        for &n in &plan.sizes {
            let row = one(
                &api,
                cmpoll,
                protocol,
                &tokens[..n],
                &scraper,
                plan,
                &mut round,
            );
            print_row(&row);
            rows.push(row);
        }
    }
    println!();
    print_table(&rows);
}

/// `n` tokens of the fleet's service account, each its own (TokenRequest), as each pod
/// of a DaemonSet has its own; four connections at once.
fn tokens(api: &RealApiserver, n: usize) -> Vec<String> {
    tokens_for(api, n, None)
}

/// `n` tokens of the fleet's service account, for `audience` (else the apiserver's).
pub(super) fn tokens_for(api: &RealApiserver, n: usize, audience: Option<&str>) -> Vec<String> {
    let admin = api.client_cert("bench-admin", Some("system:masters"));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let got = std::sync::Mutex::new(vec![String::new(); n]);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let mut c = Https::connect(api, Some(&admin));
                let body = match audience {
                    Some(a) => format!(r#"{{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{{"expirationSeconds":86400,"audiences":["{a}"]}}}}"#),
                    None => r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":86400}}"#.to_string(),
                };
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let (code, answer) = c.post(
                        "/api/v1/namespaces/fleet-agents/serviceaccounts/agent/token",
                        &body,
                    );
                    assert_eq!(code, 201, "TokenRequest: {}", String::from_utf8_lossy(&answer));
                    let v: serde_json::Value = serde_json::from_slice(&answer).expect("json");
                    got.lock().expect("lock")[i] = v["status"]["token"].as_str().expect("token").to_string();
                }
            });
        }
    });
    got.into_inner().expect("tokens")
}

/// A token allowed `get` on the hub's `/metrics`.
pub(super) fn scraper_token(api: &RealApiserver) -> String {
    apply(
        api,
        vec![
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "scraper", "namespace": "fleet-agents"}}),
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "fleet-scraper"},
                "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "fleet-scraper"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fleet-scraper"},
                "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": "fleet-agents"}]}),
        ],
    );
    api.token("fleet-agents", "scraper", "24h")
}

/// One HTTPS connection (rustls, blocking), for TokenRequests and scrapes.
struct Https {
    tls: rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>,
    host: String,
}

impl Https {
    fn connect(api: &RealApiserver, cert: Option<&test_apiserver::CertPair>) -> Https {
        let url = api.url.trim_start_matches("https://").to_string();
        Https::to(&url, &api.ca_pem(), cert)
    }

    fn to(host: &str, ca: &str, cert: Option<&test_apiserver::CertPair>) -> Https {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca.as_bytes()).flatten() {
            roots.add(c).expect("ca");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let b = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots);
        let config = match cert {
            Some(c) => {
                let chain: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(c.cert_pem.as_bytes())
                        .flatten()
                        .collect();
                let key = PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).expect("key");
                b.with_client_auth_cert(chain, key).expect("client cert")
            }
            None => b.with_no_client_auth(),
        };
        let sock = std::net::TcpStream::connect(host).expect("connect");
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("tls");
        Https {
            tls: rustls::StreamOwned::new(conn, sock),
            host: host.to_string(),
        }
    }

    fn exchange(&mut self, head: String, body: &str) -> (u16, Vec<u8>) {
        self.tls.write_all(head.as_bytes()).expect("write");
        self.tls.write_all(body.as_bytes()).expect("write");
        let mut got = Vec::new();
        let mut buf = [0u8; 16384];
        loop {
            let n = self.tls.read(&mut buf).expect("read");
            assert!(n > 0, "closed");
            got.extend_from_slice(&buf[..n]);
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
            let code = head
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let len: usize = (head.lines())
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return (code, got[end + 4..end + 4 + len].to_vec());
            }
        }
    }

    fn post(&mut self, path: &str, body: &str) -> (u16, Vec<u8>) {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.exchange(head, body)
    }

    fn get(&mut self, path: &str, token: &str) -> (u16, Vec<u8>) {
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\r\n",
            self.host
        );
        self.exchange(head, "")
    }
}

/// A hub's counters and resources at one moment.
#[derive(Clone, Copy, Default)]
pub(super) struct Sample {
    pub(super) cpu: f64,
    pub(super) rss: u64,
    pub(super) hwm: u64,
    pub(super) wrote: u64,
    pub(super) requests: f64,
    pub(super) reviews: f64,
}

pub(super) fn sample(pid: u32, port: u16, ca: &str, scraper: &str) -> Sample {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |k: &str| {
        (status.lines())
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let wrote = (io.lines())
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let m = scrape(port, ca, scraper);
    let reviews = metric_sum(&m, "cmpoll_serve_decisions_total", &[("cache", "miss")]);
    Sample {
        cpu,
        rss: kib("VmRSS:") * 1024,
        hwm: kib("VmHWM:") * 1024,
        wrote,
        requests: metric_sum(&m, "cmpoll_serve_requests_total", &[]),
        reviews,
    }
}

/// This process's CPU seconds so far (the simulator's own share of the machine).
pub(super) fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The hub's `/metrics`, asked again while it answers anything but 200 (a 429: its
/// review budget, the scraper's kept review having expired), so that a figure is never
/// read from an empty page.
pub(super) fn scrape(port: u16, ca: &str, scraper: &str) -> String {
    for _ in 0..30 {
        let mut h = Https::to(&format!("127.0.0.1:{port}"), ca, None);
        let (code, m) = h.get("/metrics", scraper);
        if code == 200 {
            return String::from_utf8_lossy(&m).into_owned();
        }
        println!("  (the hub's /metrics answered {code}: again in a second)");
        std::thread::sleep(Duration::from_secs(1));
    }
    panic!("the hub's /metrics never answered 200");
}

/// One run's figures.
struct Row {
    protocol: Protocol,
    n: usize,
    sync_secs: f64,
    peak: u64,
    base: u64,
    idle_rss: u64,
    idle_cpu: f64,
    churn_cpu: f64,
    per_change: f64,
    floor: f64,
    first: [f64; 3],
    last: [f64; 3],
    /// Per change, from the first follower holding it to the last: the first holds it
    /// within a turn of the hub's loop after its poll found it, so this is the fan-out.
    fanout: [f64; 3],
    reviews: f64,
    /// Told to wait (429: over the review rate, or a lane's queue full), then answered.
    waited: u64,
    errors: u64,
    missed: usize,
    requests_idle: f64,
}

fn one(
    api: &RealApiserver,
    cmpoll: &Path,
    protocol: Protocol,
    tokens: &[String],
    scraper: &str,
    plan: &Plan,
    round: &mut usize,
) -> Row {
    let n = tokens.len();
    let dir = tempfile::tempdir().expect("dir");
    let hubs = Hubs::start(api, cmpoll, 1, "1s", dir.path());
    let (port, pid) = hubs.hub(0);
    let ca = hubs.ca_pem();
    let s0 = sample(pid, port, &ca, scraper);
    let mut sim = Sim::start(Setup {
        addr: format!("127.0.0.1:{port}").parse().expect("addr"),
        ca_pem: ca.clone(),
        tokens: tokens.to_vec(),
        protocol,
        wait: WAIT,
        spread: Duration::from_secs(1),
        reconnect: false,
        arrival: None,
        retry: Retry::Fixed,
    });
    let t = Instant::now();
    let mut said = Instant::now();
    while sim.synced() < n && t.elapsed() < Duration::from_secs(600) {
        sim.run_for(Duration::from_millis(500));
        if said.elapsed() > Duration::from_secs(20) {
            println!("  ({} of {n} synced: {})", sim.synced(), sim.describe());
            said = Instant::now();
        }
    }
    let sync_secs = t.elapsed().as_secs_f64();
    sim.run_for(Duration::from_secs(5));
    let s1 = sample(pid, port, &ca, scraper);
    sim.run_for(plan.phase);
    let s2 = sample(pid, port, &ca, scraper);
    let own = own_cpu();
    // Churn: one ConfigMap a second, new content each time.
    let mut writes: Vec<(String, u64, Instant)> = Vec::new();
    let start = Instant::now();
    let mut k = 0usize;
    while start.elapsed() < plan.phase {
        let i = k % plan.objects;
        *round += 1;
        let at = Instant::now();
        apply(api, vec![apifleet::object(i, *round)]);
        let name = format!("module-{i}");
        sim.changed(&name, *round as u64);
        writes.push((name, *round as u64, at));
        k += 1;
        let next = start + Duration::from_secs(k as u64);
        sim.run_for(next.saturating_duration_since(Instant::now()));
    }
    sim.run_for(Duration::from_secs(10));
    let s3 = sample(pid, port, &ca, scraper);
    let churn_secs = start.elapsed().as_secs_f64();
    let sim_cpu = (own_cpu() - own) / churn_secs;
    // Who held what, when.
    let mut first = Vec::new();
    let mut last = Vec::new();
    let mut fanout = Vec::new();
    let mut missed = 0;
    for (name, r, at) in &writes {
        let times: Vec<f64> = (sim.seen())
            .filter_map(|s| s.get(&(name.clone(), *r)))
            .map(|t| t.saturating_duration_since(*at).as_secs_f64())
            .collect();
        missed += n - times.len();
        if let (Some(lo), Some(hi)) = (
            times.iter().copied().reduce(f64::min),
            times.iter().copied().reduce(f64::max),
        ) {
            first.push(lo);
            last.push(hi);
            fanout.push(hi - lo);
        }
    }
    // Each change's fan-out in write order, to place a slow one (a review burst, the
    // simulator's own turn) beside the cores the simulator itself took.
    let each: Vec<String> = fanout.iter().map(|f| format!("{f:.2}")).collect();
    println!(
        "  ({} N={n}: first to last follower per change, s: {}; the simulator's own CPU under churn {:.0} m)",
        protocol.name(),
        each.join(" "),
        sim_cpu * 1000.0
    );
    let object = object_bytes(port, &ca, &tokens[0]);
    let changes = writes.len().max(1) as f64;
    let waited = sim.report.codes.get(&429).copied().unwrap_or(0);
    let errors = (sim.report.codes.iter())
        .filter(|(c, _)| !matches!(**c, 200 | 304 | 429))
        .map(|(_, n)| *n)
        .sum::<u64>()
        + sim.report.broken;
    if errors > 0 {
        println!(
            "  ({} {n}: answers {:?}, broken {})",
            protocol.name(),
            sim.report.codes,
            sim.report.broken
        );
    }
    drop(sim);
    drop(hubs);
    Row {
        protocol,
        n,
        sync_secs,
        peak: s1.hwm,
        base: s0.rss,
        idle_rss: s2.rss,
        idle_cpu: (s2.cpu - s1.cpu) / plan.phase.as_secs_f64(),
        churn_cpu: (s3.cpu - s2.cpu) / churn_secs,
        per_change: (s3.wrote - s2.wrote) as f64 / changes,
        floor: n as f64 * object as f64,
        first: stats(first),
        last: stats(last),
        fanout: stats(fanout),
        reviews: s3.reviews - s0.reviews,
        waited,
        errors,
        missed,
        requests_idle: (s2.requests - s1.requests) / n as f64,
    }
}

/// The changed object's JSON as a watch event carries it (a GET of it, with its kind).
fn object_bytes(port: u16, ca: &str, token: &str) -> usize {
    let mut h = Https::to(&format!("127.0.0.1:{port}"), ca, None);
    let (_, body) = h.get("/api/v1/namespaces/fleet-0/configmaps/module-0", token);
    body.len()
}

fn stats(mut v: Vec<f64>) -> [f64; 3] {
    if v.is_empty() {
        return [f64::NAN; 3];
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.99), v[v.len() - 1]]
}

fn print_row(r: &Row) {
    println!(
        "  {} N={}: synced in {:.1}s; egress {:.2} MB a change ({:.2}x the floor); first to last follower p99 {:.2}s; idle {:.0} m; {} errors, {} missed",
        r.protocol.name(),
        r.n,
        r.sync_secs,
        r.per_change / 1e6,
        r.per_change / r.floor,
        r.fanout[1],
        r.idle_cpu * 1000.0,
        r.errors,
        r.missed
    );
}

fn print_table(rows: &[Row]) {
    println!(
        "| protocol | N | sync | hub peak RSS | RSS over base per follower | hub CPU idle | hub CPU churn | egress a change | per follower | × floor | write → first (p50/p99/max) | write → last (p50/p99/max) | first → last (p50/p99/max) | requests per follower idle | reviews | told to wait (429) | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.1} s | {} MiB | {:.1} KiB | {:.0} m | {:.0} m | {:.1} MB | {:.1} KB | {:.2} | {:.2} / {:.2} / {:.2} s | {:.2} / {:.2} / {:.2} s | {:.2} / {:.2} / {:.2} s | {:.2} | {:.0} | {} | {} |",
            r.protocol.name(),
            r.n,
            r.sync_secs,
            r.peak / (1 << 20),
            r.idle_rss.saturating_sub(r.base) as f64 / 1024.0 / r.n as f64,
            r.idle_cpu * 1000.0,
            r.churn_cpu * 1000.0,
            r.per_change / 1e6,
            r.per_change / 1e3 / r.n as f64,
            r.per_change / r.floor,
            r.first[0],
            r.first[1],
            r.first[2],
            r.last[0],
            r.last[1],
            r.last[2],
            r.fanout[0],
            r.fanout[1],
            r.fanout[2],
            r.requests_idle,
            r.reviews,
            r.waited,
            r.errors + r.missed as u64,
        );
    }
}

/// The simulator's check: `tokens.len()` real followers, then as many simulated ones,
/// each against a fresh hub, through sync, idle and churn; the hub's requests and bytes out
/// per follower per phase, side by side.
fn check(api: &RealApiserver, cmpoll: &Path, tokens: &[String], scraper: &str, plan: &Plan) {
    let n = tokens.len();
    let mut round = 2_000_000;
    let mut figures: Vec<(String, [f64; 6])> = Vec::new();
    for who in ["real", "simulated"] {
        let dir = tempfile::tempdir().expect("dir");
        let hubs = Hubs::start(api, cmpoll, 1, "1s", dir.path());
        let (port, pid) = hubs.hub(0);
        let ca = hubs.ca_pem();
        let s0 = sample(pid, port, &ca, scraper);
        let mut procs: Vec<Child> = Vec::new();
        let mut sim = None;
        if who == "real" {
            for (i, t) in tokens.iter().enumerate() {
                let kc = hubs.kubeconfig_to(port, t, i);
                let out = dir.path().join(format!("out-{i}"));
                procs.push(follower(cmpoll, &kc, &out));
            }
        } else {
            sim = Some(Sim::start(Setup {
                addr: format!("127.0.0.1:{port}").parse().expect("addr"),
                ca_pem: ca.clone(),
                tokens: tokens.to_vec(),
                protocol: Protocol::Watch,
                wait: WAIT,
                spread: Duration::from_secs(1),
                reconnect: false,
                arrival: None,
                retry: Retry::Fixed,
            }));
        }
        let mut pass = |d: Duration| match sim.as_mut() {
            Some(s) => s.run_for(d),
            None => std::thread::sleep(d),
        };
        pass(Duration::from_secs(15));
        let s1 = sample(pid, port, &ca, scraper);
        pass(plan.phase);
        let s2 = sample(pid, port, &ca, scraper);
        let start = Instant::now();
        let mut k = 0;
        while start.elapsed() < plan.phase {
            round += 1;
            apply(api, vec![apifleet::object(k % plan.objects, round)]);
            k += 1;
            pass((start + Duration::from_secs(k as u64)).saturating_duration_since(Instant::now()));
        }
        pass(Duration::from_secs(5));
        let s3 = sample(pid, port, &ca, scraper);
        let per = |a: &Sample, b: &Sample| {
            (
                (b.requests - a.requests) / n as f64,
                (b.wrote - a.wrote) as f64 / n as f64,
            )
        };
        let (sr, sb) = per(&s0, &s1);
        let (ir, ib) = per(&s1, &s2);
        let (cr, cb) = per(&s2, &s3);
        figures.push((who.to_string(), [sr, sb, ir, ib, cr, cb]));
        for mut p in procs {
            let _ = p.kill();
            let _ = p.wait();
        }
        drop(sim);
        drop(hubs);
    }
    println!(
        "\nthe simulator's check: {n} real followers, then {n} simulated, each against a fresh hub (per follower)"
    );
    println!(
        "| followers | sync: requests | sync: bytes out | idle: requests | idle: bytes out | churn: requests | churn: bytes out |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (who, f) in &figures {
        println!(
            "| {who} | {:.1} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} |",
            f[0], f[1], f[2], f[3], f[4], f[5]
        );
    }
    if let [(_, a), (_, b)] = figures.as_slice() {
        let worst = (0..6)
            .map(|i| {
                if a[i] == 0.0 {
                    0.0
                } else {
                    (b[i] - a[i]).abs() / a[i]
                }
            })
            .fold(0.0, f64::max);
        println!("(largest difference {:.0} %)\n", worst * 100.0);
    }
}

/// A real follower: `cmpoll run` with `kubeconfig`, every 30 s, into `out`.
pub(super) fn follower(cmpoll: &Path, kubeconfig: &PathBuf, out: &Path) -> Child {
    Command::new(cmpoll)
        .args(["run", "--interval", "30s", "--out-dir"])
        .arg(out)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cmpoll run")
}
