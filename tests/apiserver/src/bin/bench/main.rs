//! `bench`: cmpoll's cost, side by side with the alternatives, against the test apiserver.
//!
//! ```text
//! cargo run --release -p test-apiserver --bin bench                       # 1k, 10k, 50k
//! cargo run --release -p test-apiserver --bin bench -- --sizes 10k --runs 5
//! ```
//! For each population it runs every contender as its own process several times and
//! prints the median CPU (user + sys), wall time and peak RSS (from `wait4`), the bytes the
//! apiserver sent, the requests and how many reached "etcd" — cmpoll's full poll (`list
//! --json`, with and without gzip), `kubectl get -o json`, and two floors, in-process on
//! one thread's clock: serde_json over the same response bytes into nothing plus SHA-256
//! over the same data bytes; and the honest floor, which also pays for what cmpoll cannot
//! avoid: the TLS handshake and decryption and the gzip inflate of the same gzipped
//! answer over HTTPS. "cmpoll / honest floor" is what cmpoll adds. Then the daemon in steady state (no changes): CPU and bytes per poll for
//! full lists and `--metadata-first`, and RSS after 10 and after 100 polls. Timing lives
//! here, never in the test suite.

mod apifleet;
mod apirequests;
mod coldstart;
#[path = "../common/mod.rs"]
mod common;
mod crossover;
mod fleet;
mod hostile;
mod hubreports;
mod hubs;
mod outdir;
mod pollcost;
mod rollout;
mod rollouts;
mod sidecar;
mod simclient;
mod simfleet;
mod simreport;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use test_apiserver::{Kubeconfig, Options, Route, TOKEN, TestApiserver};

struct Args {
    sizes: Vec<usize>,
    bytes: usize,
    runs: usize,
    steady_polls: usize,
    /// Parts to run: sizes, crossover, fleet, outdir, sidecar, latency (default: all).
    only: Vec<String>,
    fleet: usize,
    /// Module counts for the output-folder part.
    outdir_sizes: Vec<usize>,
    /// Bytes of each of an output-folder module's two keys.
    outdir_bytes: usize,
    /// The output folder's `--layout`.
    outdir_layout: String,
    outdir_keys: usize,
    /// Another cmpoll binary (an older build), measured beside this one: before vs after.
    baseline: Option<std::path::PathBuf>,
    /// Dashboards for the k8s-sidecar part.
    dashboards: usize,
    /// The k8s-sidecar part's quiet spell, in seconds.
    quiet: u64,
    /// The apiserver-fleet part: instances per contender, ConfigMaps, phase length (s),
    /// contenders (names containing one of these; all when empty).
    fleet_sizes: Vec<usize>,
    fleet_objects: Vec<usize>,
    phase: u64,
    contenders: Vec<String>,
    /// The apiserver-fleet part: more cmpoll builds (`--also LABEL=PATH`); the hub-reports
    /// part: hubs of other builds, their followers not reporting (a build before issue 59).
    also: Vec<(String, std::path::PathBuf)>,
    /// The apiserver-requests part: requests per shape.
    requests: usize,
    /// The hub-fleet part: simulated followers per run, real ones for its check, and
    /// the protocols.
    sim_sizes: Vec<usize>,
    sim_check: usize,
    /// The hub-reports part: the share of followers refusing in its events phase.
    refusing: f64,
    /// The hub-rollouts part: how long a refusing follower's agent takes (`--confirm`).
    confirm: Duration,
    sim_protocols: Vec<simclient::Protocol>,
    /// The hub-cold part: followers arriving a second, and how long a run may take.
    arrival: f64,
    cold_limit: u64,
    /// The hub-poll-cost part: unselected ConfigMaps stored beside the selection.
    unselected: Vec<usize>,
}

fn parse_count(s: &str) -> usize {
    let s = s.trim();
    let (num, mult) = match s.strip_suffix('k') {
        Some(n) => (n, 1000),
        None => (s, 1),
    };
    num.parse::<usize>().expect("a count like 10k") * mult
}

fn args() -> Args {
    let mut a = Args {
        sizes: vec![1000, 10_000, 50_000, 100_000],
        bytes: 2048,
        runs: 3,
        steady_polls: 100,
        only: Vec::new(),
        fleet: 100,
        baseline: None,
        outdir_sizes: vec![10_000, 100_000],
        outdir_bytes: 512,
        outdir_layout: "files".into(),
        outdir_keys: 2,
        dashboards: 300,
        quiet: 60,
        fleet_sizes: vec![10, 100, 300],
        fleet_objects: vec![100, 1000],
        phase: 30,
        contenders: Vec::new(),
        requests: 300,
        also: Vec::new(),
        sim_sizes: vec![1000, 5000, 10_000],
        sim_check: 50,
        refusing: 0.1,
        confirm: Duration::from_secs(1),
        sim_protocols: vec![simclient::Protocol::LongPoll, simclient::Protocol::Watch],
        arrival: 500.0,
        cold_limit: 300,
        unselected: vec![0, 10_000, 100_000],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().unwrap_or_default();
        match flag.as_str() {
            "--sizes" => a.sizes = v.split(',').map(parse_count).collect(),
            "--bytes" => a.bytes = v.parse().expect("--bytes N"),
            "--runs" => a.runs = v.parse().expect("--runs N"),
            "--steady-polls" => a.steady_polls = v.parse().expect("--steady-polls N"),
            "--only" => a.only = v.split(',').map(str::to_string).collect(),
            "--fleet" => a.fleet = v.parse().expect("--fleet N"),
            "--baseline" => a.baseline = Some(v.into()),
            "--outdir-sizes" => a.outdir_sizes = v.split(',').map(parse_count).collect(),
            "--outdir-bytes" => a.outdir_bytes = v.parse().expect("--outdir-bytes N"),
            "--outdir-layout" => a.outdir_layout = v.to_string(),
            "--outdir-keys" => a.outdir_keys = v.parse().expect("--outdir-keys N"),
            "--dashboards" => a.dashboards = v.parse().expect("--dashboards N"),
            "--quiet" => a.quiet = v.parse().expect("--quiet SECONDS"),
            "--fleet-sizes" => a.fleet_sizes = v.split(',').map(parse_count).collect(),
            "--fleet-objects" => a.fleet_objects = v.split(',').map(parse_count).collect(),
            "--phase" => a.phase = v.parse().expect("--phase SECONDS"),
            "--contenders" => a.contenders = v.split(',').map(str::to_string).collect(),
            "--requests" => a.requests = v.parse().expect("--requests N"),
            "--sim-sizes" => a.sim_sizes = v.split(',').map(parse_count).collect(),
            "--unselected" => a.unselected = v.split(',').map(parse_count).collect(),
            "--sim-check" => a.sim_check = v.parse().expect("--sim-check N"),
            "--refusing" => a.refusing = v.parse().expect("--refusing SHARE"),
            "--confirm" => {
                a.confirm = Duration::from_secs_f64(v.parse().expect("--confirm SECONDS"))
            }
            "--arrival" => a.arrival = v.parse().expect("--arrival FOLLOWERS_A_SECOND"),
            "--cold-limit" => a.cold_limit = v.parse().expect("--cold-limit SECONDS"),
            "--sim-protocols" => {
                a.sim_protocols = (v.split(','))
                    .map(|p| match p {
                        "watch" => simclient::Protocol::Watch,
                        "longpoll" | "long-poll" => simclient::Protocol::LongPoll,
                        other => panic!("--sim-protocols: watch or longpoll, not {other}"),
                    })
                    .collect()
            }
            "--also" => {
                let (label, path) = v.split_once('=').expect("--also LABEL=PATH");
                a.also.push((label.to_string(), path.into()));
            }
            _ => {
                eprintln!(
                    "usage: bench [--sizes 1k,10k,50k,100k] [--bytes 2048] [--runs 3] [--steady-polls 100] [--fleet 100] [--only sizes,crossover,fleet,outdir,sidecar,apiserver-fleet,latency,hub-hostile] [--outdir-sizes 10k,100k] [--outdir-bytes 512] [--outdir-keys 2] [--outdir-layout files] [--baseline PATH] [--dashboards 300] [--quiet 60] [--fleet-sizes 10,100,300] [--fleet-objects 100,1000] [--phase 30] [--contenders 'cmpoll auto,informer'] [--requests 300] [--also LABEL=PATH] [--sim-sizes 1k,5k,10k] [--sim-check 50] [--sim-protocols longpoll,watch] [--arrival 500] [--cold-limit 300] [--refusing 0.1] [--confirm 1]"
                );
                std::process::exit(2);
            }
        }
    }
    a
}

/// One run of a child process, as `wait4` saw it.
#[derive(Clone, Copy, Default)]
struct Usage {
    cpu: f64,
    wall: f64,
    max_rss_kib: u64,
}

/// Runs `cmd` through `bench --measure`, a small re-exec of this binary that spawns it and
/// reports its `wait4` rusage. Measuring from here would be wrong: a child spawned with
/// `posix_spawn` (vfork) inherits this process's peak RSS — the in-process apiserver's —
/// as its own starting `ru_maxrss`.
fn run_measured(cmd: &mut Command) -> Usage {
    let mut launcher = Command::new(std::env::current_exe().expect("current exe"));
    launcher
        .arg("--measure")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => launcher.env(k, v),
            None => launcher.env_remove(k),
        };
    }
    let out = launcher
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("bench --measure");
    assert!(out.status.success(), "{cmd:?} failed");
    let line = String::from_utf8_lossy(&out.stdout);
    let f: Vec<f64> = line
        .split_whitespace()
        .map(|x| x.parse().expect("usage line"))
        .collect();
    Usage {
        cpu: f[0],
        wall: f[1],
        max_rss_kib: f[2] as u64,
    }
}

/// `bench --measure PROGRAM ARGS…`: run it (stdout discarded, stderr shown only on
/// failure) and print "cpu wall max_rss_kib" on stdout.
fn measure(argv: &[String]) -> ! {
    let started = Instant::now();
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", argv[0]));
    let pid = child.id() as libc::pid_t;
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr {
        let _ = e.read_to_string(&mut stderr);
    }
    let mut status = 0;
    // SAFETY: plain FFI call with valid pointers to locals; the pid is our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid, "wait4");
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        eprintln!("{argv:?} failed: {stderr}");
        std::process::exit(1);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    println!(
        "{} {} {}",
        secs(ru.ru_utime) + secs(ru.ru_stime),
        started.elapsed().as_secs_f64(),
        ru.ru_maxrss
    );
    std::process::exit(0);
}

fn thread_cpu() -> f64 {
    // SAFETY: clock_gettime writes into the timespec we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// What the apiserver saw of a contender's runs, per run.
#[derive(Default, Clone, Copy)]
struct Cost {
    bytes: u64,
    requests: usize,
    cache: usize,
    etcd: usize,
}

fn cost_since(server: &TestApiserver, from: usize, runs: usize) -> Cost {
    let reqs = server.requests();
    let mine = &reqs[from..];
    let lists = mine.iter().filter(|r| r.path.contains("/configmaps"));
    let mut c = Cost::default();
    for r in lists {
        c.bytes += r.bytes;
        c.requests += 1;
        match r.route {
            Route::Cache => c.cache += 1,
            Route::Etcd => c.etcd += 1,
            Route::None => {}
        }
    }
    let n = runs.max(1);
    Cost {
        bytes: c.bytes / n as u64,
        requests: c.requests / n,
        cache: c.cache / n,
        etcd: c.etcd / n,
    }
}

struct Row {
    name: String,
    usage: Usage,
    cost: Option<Cost>,
}

fn contender(
    server: &TestApiserver,
    name: &str,
    runs: usize,
    mut cmd: impl FnMut() -> Command,
) -> Row {
    run_measured(&mut cmd()); // warm-up: page cache, kubectl's discovery cache
    let from = server.requests().len();
    let usages: Vec<Usage> = (0..runs).map(|_| run_measured(&mut cmd())).collect();
    let cost = cost_since(server, from, runs);
    Row {
        name: name.to_string(),
        usage: Usage {
            cpu: median(usages.iter().map(|u| u.cpu).collect()),
            wall: median(usages.iter().map(|u| u.wall).collect()),
            max_rss_kib: median(usages.iter().map(|u| u.max_rss_kib as f64).collect()) as u64,
        },
        cost: Some(cost),
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

/// The list body, uncompressed, as the apiserver sends it (over plain HTTP).
fn list_body(server: &TestApiserver) -> Vec<u8> {
    let http = server.http_url().expect("plain HTTP");
    let mut s = std::net::TcpStream::connect(http.trim_start_matches("http://")).unwrap();
    write!(
        s,
        "GET /api/v1/configmaps?labelSelector=cmpoll.io%2Fmodule%3Dtrue&resourceVersion=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    dechunk(&raw)
}

/// The data values of every ConfigMap the server holds: what a client must hash.
fn list_data(server: &TestApiserver) -> Vec<Vec<u8>> {
    server
        .objects()
        .iter()
        .flat_map(|o| o.spec.data.values().map(|v| v.as_bytes().to_vec()))
        .collect()
}

/// What every floor pays: serde_json over the body into nothing, SHA-256 over the data.
fn parse_and_hash(body: &[u8], data: &[Vec<u8>]) {
    let _: serde::de::IgnoredAny = serde_json::from_slice(body).expect("valid JSON");
    let mut h = Sha256::new();
    for d in data {
        h.update(d);
    }
    std::hint::black_box(h.finalize());
}

/// The floor: serde_json over the same bytes into nothing, plus SHA-256 over the data.
fn floor(server: &TestApiserver, runs: usize) -> Row {
    let body = list_body(server);
    let data = list_data(server);
    let times: Vec<f64> = (0..runs + 1)
        .map(|_| {
            let t = thread_cpu();
            parse_and_hash(&body, &data);
            thread_cpu() - t
        })
        .skip(1)
        .collect();
    Row {
        name: "floor (serde_json + SHA-256)".into(),
        usage: Usage {
            cpu: median(times),
            ..Usage::default()
        },
        cost: None,
    }
}

/// The honest floor: one HTTPS request for the same list with gzip (a rustls connection
/// trusting the server's CA), the body de-chunked and inflated, parsed by serde_json into
/// nothing, and the data hashed, all on this thread.
fn honest_floor(server: &TestApiserver, runs: usize) -> Row {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(server.ca_pem().as_bytes()).unwrap())
        .unwrap();
    let tls = std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let data = list_data(server);
    let once = || {
        let t = thread_cpu();
        let sock = std::net::TcpStream::connect(server.addr()).unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let conn = rustls::ClientConnection::new(tls.clone(), name).unwrap();
        let mut s = rustls::StreamOwned::new(conn, sock);
        write!(
            s,
            "GET /api/v1/configmaps?labelSelector=cmpoll.io%2Fmodule%3Dtrue&resourceVersion=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nAccept: application/json\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let gz = dechunk(&raw);
        let mut body = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut body)
            .expect("a gzipped answer");
        parse_and_hash(&body, &data);
        thread_cpu() - t
    };
    let times: Vec<f64> = (0..runs + 1).map(|_| once()).skip(1).collect();
    Row {
        name: "honest floor (TLS + gzip + parse + SHA-256)".into(),
        usage: Usage {
            cpu: median(times),
            ..Usage::default()
        },
        cost: None,
    }
}

/// The body of a raw HTTP/1.1 answer, de-chunked if it was chunked.
fn dechunk(raw: &[u8]) -> Vec<u8> {
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let (head, mut rest) = (String::from_utf8_lossy(&raw[..at]).to_string(), &raw[at..]);
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return rest.to_vec();
    }
    let mut body = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let n =
            usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return body;
        }
        body.extend_from_slice(&rest[eol + 2..eol + 2 + n]);
        rest = &rest[eol + 2 + n + 2..];
    }
}

fn print_rows(rows: &[Row]) {
    let base = rows[0].usage.cpu;
    println!(
        "  {:<34} {:>9} {:>9} {:>11} {:>10} {:>5} {:>10} {:>9}",
        "contender", "cpu", "wall", "peak RSS", "bytes in", "reqs", "cache/etcd", "cpu/cmpoll"
    );
    for r in rows {
        let (wall, rss) = if r.usage.wall > 0.0 {
            (format!("{:.3}s", r.usage.wall), mib(r.usage.max_rss_kib))
        } else {
            ("-".into(), "-".into())
        };
        let (bytes, reqs, split) = match r.cost {
            Some(c) => (
                mb(c.bytes),
                c.requests.to_string(),
                format!("{}/{}", c.cache, c.etcd),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "  {:<34} {:>8.3}s {:>9} {:>11} {:>10} {:>5} {:>10} {:>8.2}x",
            r.name,
            r.usage.cpu,
            wall,
            rss,
            bytes,
            reqs,
            split,
            r.usage.cpu / base
        );
    }
}

/// CPU seconds used so far by a running process, and its RSS (KiB).
fn proc_usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / ticks;
    let rss = test_apiserver::proc_rss_kib(pid);
    (cpu, rss)
}

fn lists_so_far(server: &TestApiserver) -> usize {
    server.requests().iter().filter(|r| r.is_list()).count()
}

fn wait_lists(server: &TestApiserver, n: usize) {
    let start = Instant::now();
    while lists_so_far(server) < n {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "the daemon stopped polling"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `cmpoll run ARGS` against `kubeconfig`, with room for the largest lists, quiet (warnings
/// only, and nothing kept of stdout or stderr).
fn daemon(cmpoll: &Path, kubeconfig: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(cmpoll);
    cmd.arg("run")
        .args(args)
        .args(["--max-response-bytes", "1Gi"])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// The daemon polling an unchanging cluster: CPU and bytes per poll, RSS after a 20-poll
/// warm-up and after `polls` more, and its peak; with stdout events only, or (`out_dir`)
/// also writing the output folder (on tmpfs where there is one: this measures memory, not
/// fsyncs).
fn steady(
    server: &TestApiserver,
    cmpoll: &Path,
    kubeconfig: &Path,
    mode: &str,
    polls: usize,
    out_dir: bool,
) {
    server.clear_requests();
    let shm = Path::new("/dev/shm");
    let out = out_dir.then(|| {
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        tempfile::tempdir_in(base).unwrap()
    });
    let mut child = daemon(
        cmpoll,
        kubeconfig,
        &["--interval", "100ms", "--jitter", "0", "--list-mode", mode],
    )
    .args(out.iter().flat_map(|d| [Path::new("--out-dir"), d.path()]))
    .spawn()
    .unwrap();
    let pid = child.id();
    wait_lists(server, 20);
    let (cpu10, rss10) = proc_usage(pid);
    let from = server.requests().len();
    let lists_from = lists_so_far(server);
    wait_lists(server, lists_from + polls);
    let (cpu_n, rss_n) = proc_usage(pid);
    let reqs = server.requests();
    let steady = &reqs[from..];
    let bytes: u64 = steady.iter().map(|r| r.bytes).sum();
    let per = |x: f64| x / polls as f64;
    let etcd = steady.iter().filter(|r| r.route == Route::Etcd).count();
    let peak = test_apiserver::proc_status_kib(pid, "VmHWM");
    println!(
        "  {:<32} cpu/poll {:>7.2} ms   bytes/poll {:>10}   requests/poll {:.2} (etcd: {etcd})   RSS after 20 polls {}, after {} {}, peak {}",
        format!(
            "--list-mode {mode}{}",
            if out_dir { " --out-dir" } else { "" }
        ),
        per(cpu_n - cpu10) * 1e3,
        mb((per(bytes as f64)) as u64),
        steady.len() as f64 / polls as f64,
        mib(rss10),
        polls + 20,
        mib(rss_n),
        mib(peak),
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// CPU while idle between polls (a long interval, after the first batch).
fn idle(server: &TestApiserver, cmpoll: &Path, kubeconfig: &Path) {
    server.clear_requests();
    let mut child = daemon(cmpoll, kubeconfig, &["--interval", "1h"])
        .spawn()
        .unwrap();
    wait_lists(server, 1);
    std::thread::sleep(Duration::from_secs(1));
    let (before, _) = proc_usage(child.id());
    std::thread::sleep(Duration::from_secs(10));
    let (after, _) = proc_usage(child.id());
    println!("  idle between polls: {:.3} s CPU in 10 s", after - before);
    let _ = child.kill();
    let _ = child.wait();
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("--measure") {
        measure(&argv[1..]);
    }
    let a = args();
    let cmpoll = common::release_cmpoll();
    let kubectl = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "cmpoll benchmark: {cores} cores, {} runs per contender (median), {} B per ConfigMap\n",
        a.runs, a.bytes
    );
    let part = |p: &str| a.only.is_empty() || a.only.iter().any(|o| o == p);
    if part("sizes") {
        sizes(&a, &cmpoll, kubectl);
    }
    if part("crossover") {
        crossover::run(
            &cmpoll,
            &[(128, 10_000), (2048, 10_000), (65_536, 1000)],
            20,
        );
        println!();
    }
    if part("fleet") {
        fleet::run(
            &cmpoll,
            &fleet::Fleet {
                instances: a.fleet,
                objects: 100,
                size: a.bytes,
                seconds: 30,
                changes_per_second: 1,
            },
        );
        println!();
    }
    if part("outdir") {
        outdir::run(
            &cmpoll,
            a.baseline.as_deref(),
            &a.outdir_sizes,
            outdir::Shape {
                key_bytes: a.outdir_bytes,
                keys: a.outdir_keys,
                layout: &a.outdir_layout,
            },
        );
        println!();
    }
    if part("sidecar") {
        sidecar::run(
            &cmpoll,
            &sidecar::Plan {
                dashboards: a.dashboards,
                quiet: Duration::from_secs(a.quiet),
                changes: 10,
            },
        );
        println!();
    }
    // Minutes: only when asked for by name.
    if a.only.iter().any(|o| o == "apiserver-requests") {
        apirequests::run(&apirequests::Plan {
            objects: a.fleet_objects.clone(),
            requests: a.requests,
            runs: a.runs,
        });
        println!();
    }
    // Long (minutes per contender): only when asked for by name.
    if a.only.iter().any(|o| o == "apiserver-fleet") {
        apifleet::run(
            &cmpoll,
            &apifleet::Plan {
                instances: a.fleet_sizes.clone(),
                objects: a.fleet_objects.clone(),
                phase: Duration::from_secs(a.phase),
                contenders: a.contenders.clone(),
                builds: a
                    .baseline
                    .iter()
                    .map(|b| ("before".to_string(), b.clone()))
                    .chain(a.also.iter().cloned())
                    .collect(),
            },
        );
        println!();
    }
    // A simulated fleet of one hub (issue 48.5): minutes per size; by name only.
    // A hub's poll beside unselected ConfigMaps (issue 49.1); by name only.
    if a.only.iter().any(|o| o == "hub-poll-cost") {
        pollcost::run(
            &cmpoll,
            &pollcost::Plan {
                unselected: a.unselected.clone(),
                objects: a.fleet_objects.first().copied().unwrap_or(1000),
                phase: Duration::from_secs(a.phase),
            },
        );
        println!();
    }
    // Two hubs replaced in turn under a simulated fleet (issue 49.3); by name only.
    if a.only.iter().any(|o| o == "hub-rollout") {
        rollout::run(
            &cmpoll,
            &rollout::Plan {
                n: a.sim_sizes.first().copied().unwrap_or(1000),
                objects: a.fleet_objects.first().copied().unwrap_or(1000),
            },
        );
        println!();
    }
    // A cold hub admitting a fleet that arrives (issue 56.8); by name only.
    if a.only.iter().any(|o| o == "hub-cold") {
        coldstart::run(
            &cmpoll,
            a.baseline.as_deref(),
            &coldstart::Plan {
                n: a.sim_sizes.first().copied().unwrap_or(10_000),
                arrival: a.arrival,
                objects: a.fleet_objects.first().copied().unwrap_or(1000),
                limit: Duration::from_secs(a.cold_limit),
            },
        );
        println!();
    }
    // A hub beside hostile clients (issue 56.4, 56.6): minutes; by name only.
    if a.only.iter().any(|o| o == "hub-hostile") {
        hostile::run(&hostile::Plan {
            phase: Duration::from_secs(a.phase),
            builds: (a.baseline.iter())
                .map(|b| ("before".to_string(), b.clone()))
                .chain([("this build".to_string(), cmpoll.clone())])
                .collect(),
        });
        println!();
    }
    if a.only.iter().any(|o| o == "hub-fleet") {
        simfleet::run(
            &cmpoll,
            &simfleet::Plan {
                sizes: a.sim_sizes.clone(),
                objects: a.fleet_objects.first().copied().unwrap_or(1000),
                phase: Duration::from_secs(a.phase),
                protocols: a.sim_protocols.clone(),
                check: a.sim_check,
            },
        );
        println!();
    }
    // The fleet's reports, the hub's validation and its Events (issue 59); by name only.
    if a.only.iter().any(|o| o == "hub-reports") {
        hubreports::run(
            &cmpoll,
            &hubreports::Plan {
                sizes: a.sim_sizes.clone(),
                objects: a.fleet_objects.first().copied().unwrap_or(1000),
                phase: Duration::from_secs(a.phase),
                check: a.sim_check,
                refusing: a.refusing,
                also: a.also.clone(),
            },
        );
        println!();
    }
    // Rollouts at a fleet's scale (issue 60); by name only.
    if a.only.iter().any(|o| o == "hub-rollouts") {
        rollouts::run(
            &cmpoll,
            &rollouts::Plan {
                sizes: a.sim_sizes.clone(),
                objects: a.fleet_objects.first().copied().unwrap_or(1000),
                check: a.sim_check,
                confirm: a.confirm,
                runs: a.runs,
            },
        );
        println!();
    }
    if part("latency") {
        latency();
    }
}

/// The change-to-agent latency (`--bin latency`), run from here so that one command
/// prints every figure.
fn latency() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "test-apiserver",
            "--bin",
            "latency",
        ])
        .current_dir(&root)
        .status()
        .expect("cargo");
    assert!(status.success(), "cargo build --bin latency");
    let bin = std::env::current_exe()
        .expect("current exe")
        .with_file_name("latency");
    println!(
        "change to agent (cargo run --release -p test-apiserver --bin latency -- --interval 1s):"
    );
    let status = Command::new(bin)
        .args(["--interval", "1s"])
        .status()
        .expect("latency");
    assert!(status.success(), "latency failed");
}

/// `cmpoll list` (with `--json`, or the table) against `kubeconfig`.
fn cmpoll_list(cmpoll: &Path, kubeconfig: &Path, json: bool) -> Command {
    let mut c = Command::new(cmpoll);
    // The default cap (64 MiB) is below a 50k x 2 KiB list.
    c.args(["list", "--max-response-bytes", "1Gi"])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn");
    if json {
        c.arg("--json");
    }
    c
}

/// Every population: the contenders, the floors, and the daemon in steady state.
fn sizes(a: &Args, cmpoll: &Path, kubectl: bool) {
    let mut rss_by_size = Vec::new();
    for &n in &a.sizes {
        let server = TestApiserver::start_with(Options {
            plain_http: true,
            ..Options::default()
        });
        server.bulk_load(n, a.bytes, 20);
        let dir = tempfile::tempdir().unwrap();
        let kc = server.write_kubeconfig(&dir.path().join("kubeconfig"), &Kubeconfig::token());
        let mut plain = Kubeconfig::token();
        plain.disable_compression = true;
        let kc_plain = server.write_kubeconfig(&dir.path().join("kubeconfig-plain"), &plain);
        let body = list_body(&server).len();
        println!(
            "{n} ConfigMaps x {} B: the list is {} ({} namespaces)",
            a.bytes,
            mb(body as u64),
            20
        );
        let cmpoll_cmd = |kc: &Path, json: bool| cmpoll_list(cmpoll, kc, json);
        let mut rows = vec![
            contender(&server, "cmpoll list --json", a.runs, || {
                cmpoll_cmd(&kc, true)
            }),
            contender(&server, "cmpoll list --json (no gzip)", a.runs, || {
                cmpoll_cmd(&kc_plain, true)
            }),
            contender(
                &server,
                "cmpoll list (table, no contents out)",
                a.runs,
                || cmpoll_cmd(&kc, false),
            ),
        ];
        if let Some(before) = &a.baseline {
            rows.push(contender(
                &server,
                "baseline: cmpoll list --json",
                a.runs,
                || cmpoll_list(before, &kc, true),
            ));
            rows.push(contender(
                &server,
                "baseline: cmpoll list (table)",
                a.runs,
                || cmpoll_list(before, &kc, false),
            ));
        }
        if kubectl {
            rows.push(contender(
                &server,
                "kubectl get -A -l … -o json",
                a.runs,
                || {
                    let mut c = Command::new("kubectl");
                    c.args([
                        "get",
                        "configmaps",
                        "-A",
                        "-l",
                        "cmpoll.io/module=true",
                        "-o",
                        "json",
                    ])
                    .env("KUBECONFIG", &kc)
                    .env("HOME", dir.path());
                    c
                },
            ));
        }
        rows.push(floor(&server, a.runs));
        rows.push(honest_floor(&server, a.runs));
        print_rows(&rows);
        let honest = rows.last().map_or(0.0, |r| r.usage.cpu);
        if let Some(table) = rows
            .iter()
            .find(|r| r.name.starts_with("cmpoll list (table"))
        {
            println!(
                "  cmpoll list (no contents out) / honest floor: {:.1}x",
                table.usage.cpu / honest
            );
        }
        if a.baseline.is_some() {
            let cpu = |name: &str| rows.iter().find(|r| r.name == name).map(|r| r.usage.cpu);
            for (now, before) in [
                ("cmpoll list --json", "baseline: cmpoll list --json"),
                (
                    "cmpoll list (table, no contents out)",
                    "baseline: cmpoll list (table)",
                ),
            ] {
                if let (Some(now_cpu), Some(before_cpu)) = (cpu(now), cpu(before)) {
                    println!("  {now} / baseline: {:.2}x CPU", now_cpu / before_cpu);
                }
            }
        }
        rss_by_size.push((n, rows[0].usage.max_rss_kib));
        println!(
            "  daemon, steady state ({} polls at 100 ms, no changes):",
            (a.steady_polls * 10_000 / n.max(1)).clamp(10, a.steady_polls)
        );
        // Fewer polls for the largest lists: each is a second of work.
        let polls = (a.steady_polls * 10_000 / n.max(1)).clamp(10, a.steady_polls);
        steady(&server, cmpoll, &kc, "full", polls, false);
        steady(&server, cmpoll, &kc, "metadata", polls, false);
        steady(&server, cmpoll, &kc, "full", polls, true);
        if let Some(before) = &a.baseline {
            println!("  baseline ({}):", before.display());
            steady(&server, before, &kc, "full", polls, false);
            steady(&server, before, &kc, "metadata", polls, false);
            steady(&server, before, &kc, "full", polls, true);
        }
        if n == a.sizes[0] {
            idle(&server, cmpoll, &kc);
        }
        println!();
    }
    if let (Some(first), Some(last)) = (rss_by_size.first(), rss_by_size.last())
        && last.0 > first.0
    {
        let per = (last.1 as f64 - first.1 as f64) * 1024.0 / (last.0 - first.0) as f64;
        println!(
            "peak RSS of cmpoll list: {} at {}, {} at {}: {per:.0} bytes per additional module",
            mib(first.1),
            first.0,
            mib(last.1),
            last.0
        );
    }
}
