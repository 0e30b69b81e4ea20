//! The k8s-sidecar migration's figures (issue 26, docs/k8s-sidecar.md): `cmpoll sidecar`
//! beside k8s-sidecar 2.10.1 itself, each with the environment kube-prometheus-stack
//! gives its dashboards sidecar (`METHOD=WATCH`, `RESOURCE=both`, `NAMESPACE=ALL`, a POST
//! reload with basic auth; read from the chart render in `tests/fixtures/charts`), against
//! the real kube-apiserver holding N dashboards (the chart's own three, repeated) in ten
//! namespaces. One contender at a time, each into an empty folder: the first sync (until
//! every file is in the folder with its content), a quiet spell, then changes (one
//! dashboard every 2 s, the delay until its file changed). Memory is the PSS summed over
//! the process tree (k8s-sidecar forks a process per kind), sampled every 100 ms; CPU is
//! user + system of the tree, reaped children included. The apiserver's CPU in each
//! window is shown too: polling costs the apiserver what a watch does not.
//!
//! k8s-sidecar runs where `K8S_SIDECAR=DIR` names its source and virtualenv (HACKING.md,
//! "k8s-sidecar as the oracle"), as root (a private mount namespace gives it the service
//! account's namespace file it opens even off-cluster); without it, cmpoll alone.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use test_apiserver::real::{RealApiserver, built};

use super::mib;

pub struct Plan {
    pub dashboards: usize,
    pub quiet: Duration,
    pub changes: usize,
}

const CHART: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/charts/kube-prometheus-stack-88.5.3-grafana.yaml"
);
const NAMESPACES: usize = 10;
/// The chart's admin Secret in the render (`grafana.adminPassword=prom-operator`).
const ADMIN: (&str, &str) = ("admin", "prom-operator");

#[derive(Clone, Copy)]
enum Who<'a> {
    K8sSidecar(&'a Path),
    /// `cmpoll sidecar`, with `CMPOLL_INTERVAL` if given (else the 5 s `METHOD=WATCH`
    /// means).
    Cmpoll(&'a Path, Option<&'static str>),
}

impl Who<'_> {
    fn name(&self) -> String {
        match self {
            Who::K8sSidecar(_) => "k8s-sidecar 2.10.1".into(),
            Who::Cmpoll(_, None) => "cmpoll sidecar".into(),
            Who::Cmpoll(_, Some(i)) => format!("cmpoll, {i} polls"),
        }
    }
}

#[derive(Default)]
struct Figures {
    sync_wall: f64,
    sync_cpu: f64,
    quiet_millicores: f64,
    quiet_pss_kib: u64,
    peak_pss_kib: u64,
    change_millicores: f64,
    delays: Vec<f64>,
    reloads_sync: usize,
    reloads_changes: usize,
    processes: usize,
    apiserver_quiet_millicores: f64,
    apiserver_changes_millicores: f64,
}

/// Names and values: an environment, or dashboards' keys and contents.
type Pairs = Vec<(String, String)>;

/// The dashboards sidecar's environment in the chart render, and the chart's dashboards.
fn chart_sidecar() -> (Pairs, Pairs) {
    let text = std::fs::read_to_string(CHART).expect("the kube-prometheus-stack render");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("Grafana's Deployment");
    let container = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "grafana-sc-dashboard")
        .expect("the dashboards sidecar");
    let env = (container["env"].as_array().into_iter().flatten())
        .map(|e| {
            let name = e["name"].as_str().unwrap_or_default().to_string();
            let value = match name.as_str() {
                "REQ_USERNAME" => ADMIN.0.to_string(),
                "REQ_PASSWORD" => ADMIN.1.to_string(),
                _ => e["value"].as_str().unwrap_or_default().to_string(),
            };
            (name, value)
        })
        .collect();
    let dashboards = (docs.iter())
        .filter(|d| d["metadata"]["labels"]["grafana_dashboard"] == "1")
        .flat_map(|d| d["data"].as_object().cloned().unwrap_or_default())
        .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
        .collect();
    (env, dashboards)
}

/// The i-th dashboard: its namespace, name, key and content (`round` > 0 changes it).
fn dashboard(
    templates: &[(String, String)],
    i: usize,
    round: usize,
) -> (String, String, String, String) {
    let (key, text) = &templates[i % templates.len()];
    (
        format!("team-{}", i % NAMESPACES),
        format!("dashboard-{i}"),
        format!("d{i}-{key}"),
        format!("{text}{}", "\n".repeat(round)),
    )
}

fn configmap(ns: &str, name: &str, key: &str, text: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {"grafana_dashboard": "1"}},
        "data": {key: text},
    })
}

/// Server-side apply, as one List: no last-applied annotation to double each object.
pub(super) fn apply(api: &RealApiserver, items: Vec<serde_json::Value>) {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    api.ok_in(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=bench",
            "-f",
            "-",
        ],
        Some(&list.to_string()),
    );
}

/// Answers 200 to every request; counts them.
fn reload_recorder() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "http://{}/api/admin/provisioning/dashboards/reload",
        listener.local_addr().expect("addr")
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let counted = counted.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn);
                let mut length = 0;
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':')
                        && k.eq_ignore_ascii_case("content-length")
                    {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0; length];
                let _ = r.read_exact(&mut body);
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = r.get_mut().write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                );
            });
        }
    });
    (url, calls)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A process and every descendant.
fn tree(root: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parents.push((pid, ppid));
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out
}

/// User + system seconds of a process tree, children it reaped included.
fn tree_cpu(root: u32) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut total = 0.0;
    for pid in tree(root) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let f: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        total += (11..15)
            .filter_map(|i| f.get(i).and_then(|v| v.parse::<f64>().ok()))
            .sum::<f64>();
    }
    total / ticks
}

/// Proportional set size of a process tree: shared pages (a fork's) counted once.
fn tree_pss_kib(root: u32) -> u64 {
    tree(root)
        .into_iter()
        .map(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

fn process_cpu(pid: u32) -> f64 {
    super::proc_usage(pid).0
}

/// The folder holds exactly `want` (name → content), besides hidden entries (cmpoll's
/// `.cmpoll`, which Grafana's file provider skips as it skips every hidden folder).
fn folder_holds(dir: &Path, want: &[(String, String)]) -> bool {
    let count = (std::fs::read_dir(dir).into_iter().flatten().flatten())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .count();
    count == want.len()
        && want
            .iter()
            .all(|(k, v)| std::fs::read(dir.join(k)).is_ok_and(|b| b == v.as_bytes()))
}

fn launch(who: Who, env: &[(String, String)], root: &Path) -> Child {
    // Only the chart's environment (and what a process needs), as in the pod.
    let mut cmd = match who {
        Who::Cmpoll(bin, interval) => {
            let sa = root.join("serviceaccount");
            std::fs::create_dir_all(&sa).expect("mkdir");
            std::fs::write(sa.join("namespace"), "monitoring").expect("write");
            let mut c = Command::new(bin);
            c.env_clear()
                .arg("sidecar")
                .env("CMPOLL_SERVICE_ACCOUNT_DIR", sa);
            if let Some(i) = interval {
                c.env("CMPOLL_INTERVAL", i);
            }
            c
        }
        Who::K8sSidecar(dir) => {
            let mut c = Command::new("unshare");
            c.env_clear().args(["-m", "--propagation", "private", "sh", "-c"])
                .arg(
                    "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && echo -n monitoring > /run/secrets/kubernetes.io/serviceaccount/namespace && exec \"$0\" -u sidecar.py",
                )
                .arg(dir.join("venv/bin/python"))
                .current_dir(dir.join("src"));
            c
        }
    };
    cmd.envs(env.iter().map(|(k, v)| (k, v)))
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(root.join("stderr.log")).expect("log"));
    cmd.spawn().expect("spawn")
}

fn measure(
    who: Who,
    api: &RealApiserver,
    plan: &Plan,
    templates: &[(String, String)],
    chart_env: &[(String, String)],
) -> Figures {
    let root = tempfile::tempdir().expect("tempdir");
    let folder = root.path().join("dashboards");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let (url, reloads) = reload_recorder();
    let mut env: Vec<(String, String)> = chart_env
        .iter()
        .map(|(k, v)| match k.as_str() {
            "FOLDER" => (k.clone(), folder.display().to_string()),
            "REQ_URL" => (k.clone(), url.clone()),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    env.push((
        "KUBECONFIG".into(),
        api.admin_kubeconfig().display().to_string(),
    ));
    env.push(("HEALTH_PORT".into(), free_port().to_string()));
    let mut want: Vec<(String, String)> = (0..plan.dashboards)
        .map(|i| {
            let (_, _, k, v) = dashboard(templates, i, 0);
            (k, v)
        })
        .collect();

    let apiserver = api.apiserver_pid();
    let start = Instant::now();
    let mut child = launch(who, &env, root.path());
    let pid = child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                peak.fetch_max(tree_pss_kib(pid), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let mut f = Figures::default();
    let log = || std::fs::read_to_string(root.path().join("stderr.log")).unwrap_or_default();
    while !folder_holds(&folder, &want) {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{} exited ({st}):\n{}", who.name(), log());
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "{}: no complete folder in 300 s:\n{}",
            who.name(),
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    f.sync_wall = start.elapsed().as_secs_f64();
    f.sync_cpu = tree_cpu(pid);
    // Reload calls that follow the last file still belong to the first sync.
    std::thread::sleep(Duration::from_secs(3));
    f.reloads_sync = reloads.load(Ordering::SeqCst);

    let (cpu0, api0) = (tree_cpu(pid), process_cpu(apiserver));
    std::thread::sleep(plan.quiet);
    let secs = plan.quiet.as_secs_f64();
    f.quiet_millicores = (tree_cpu(pid) - cpu0) / secs * 1e3;
    f.apiserver_quiet_millicores = (process_cpu(apiserver) - api0) / secs * 1e3;
    f.quiet_pss_kib = tree_pss_kib(pid);
    f.processes = tree(pid).len();

    // Changes on a fixed schedule, 6.5 s apart: longer than cmpoll's default interval,
    // and not a multiple of it, so the changes fall at every phase of its polls.
    let (cpu0, api0, calls0) = (
        tree_cpu(pid),
        process_cpu(apiserver),
        reloads.load(Ordering::SeqCst),
    );
    let phase = Instant::now();
    let every = Duration::from_millis(6500);
    for j in 0..plan.changes {
        std::thread::sleep((every * j as u32).saturating_sub(phase.elapsed()));
        let i = j * plan.dashboards / plan.changes.max(1);
        let (ns, name, key, text) = dashboard(templates, i, 1 + j);
        apply(api, vec![configmap(&ns, &name, &key, &text)]);
        let t0 = Instant::now();
        let path = folder.join(&key);
        while !std::fs::read(&path).is_ok_and(|b| b == text.as_bytes()) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{}: change to {key} not seen in 60 s:\n{}",
                who.name(),
                log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        f.delays.push(t0.elapsed().as_secs_f64());
        want[i].1 = text;
    }
    std::thread::sleep((every * plan.changes as u32).saturating_sub(phase.elapsed()));
    let secs = phase.elapsed().as_secs_f64();
    f.change_millicores = (tree_cpu(pid) - cpu0) / secs * 1e3;
    f.apiserver_changes_millicores = (process_cpu(apiserver) - api0) / secs * 1e3;
    f.reloads_changes = reloads.load(Ordering::SeqCst) - calls0;

    stop.store(true, Ordering::SeqCst);
    let _ = sampler.join();
    f.peak_pss_kib = peak.load(Ordering::SeqCst);
    // SAFETY: kill has no memory preconditions; the pid is our child, not yet reaped.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = child.wait();
    // Put the changed dashboards back for the next contender.
    let back = (0..plan.changes)
        .map(|j| {
            let (ns, name, key, text) =
                dashboard(templates, j * plan.dashboards / plan.changes.max(1), 0);
            configmap(&ns, &name, &key, &text)
        })
        .collect();
    apply(api, back);
    f
}

pub fn run(cmpoll: &Path, plan: &Plan) {
    println!(
        "k8s-sidecar migration: kube-prometheus-stack's dashboards sidecar, {} dashboards in {NAMESPACES} namespaces, real kube-apiserver",
        plan.dashboards
    );
    if !built() {
        println!("  (not run: the real apiserver is not built; run tests/kube/build.sh)\n");
        return;
    }
    let peer: Option<PathBuf> = std::env::var_os("K8S_SIDECAR").map(PathBuf::from);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let peer = match peer {
        Some(p) if root => Some(p),
        Some(_) => {
            println!("  (k8s-sidecar not run: it needs root here for its mount namespace)");
            None
        }
        None => {
            println!(
                "  (k8s-sidecar not run: K8S_SIDECAR=DIR names its source and venv, HACKING.md)"
            );
            None
        }
    };
    let (chart_env, templates) = chart_sidecar();
    let api = RealApiserver::start();
    for n in 0..NAMESPACES {
        api.ok(&["create", "namespace", &format!("team-{n}")]);
    }
    api.ok(&["create", "namespace", "monitoring"]);
    let items: Vec<serde_json::Value> = (0..plan.dashboards)
        .map(|i| {
            let (ns, name, key, text) = dashboard(&templates, i, 0);
            configmap(&ns, &name, &key, &text)
        })
        .collect();
    let bytes: usize = (0..plan.dashboards)
        .map(|i| dashboard(&templates, i, 0).3.len())
        .sum();
    for chunk in items.chunks(100) {
        apply(&api, chunk.to_vec());
    }
    println!(
        "  the chart's environment: {}",
        chart_env
            .iter()
            .filter(|(k, _)| !k.starts_with("REQ_PASSWORD"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  {} dashboards, {:.1} MB of JSON; a quiet {} s, then {} changes 6.5 s apart",
        plan.dashboards,
        bytes as f64 / 1e6,
        plan.quiet.as_secs(),
        plan.changes
    );
    let mut contenders = Vec::new();
    if let Some(dir) = &peer {
        contenders.push(Who::K8sSidecar(dir));
    }
    contenders.push(Who::Cmpoll(cmpoll, None));
    contenders.push(Who::Cmpoll(cmpoll, Some("1s")));
    let results: Vec<(Who, Figures)> = contenders
        .into_iter()
        .map(|w| (w, measure(w, &api, plan, &templates, &chart_env)))
        .collect();
    print_table(&results);
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn print_table(results: &[(Who, Figures)]) {
    type Row = (&'static str, fn(&Figures) -> f64, fn(f64) -> String);
    let count = |v: f64| format!("{v:.0}");
    let seconds = |v: f64| {
        if v < 1.0 {
            format!("{:.0} ms", v * 1e3)
        } else {
            format!("{v:.2} s")
        }
    };
    let millicores = |v: f64| format!("{v:.1} mcores");
    let memory = |v: f64| mib(v as u64);
    let rows: [Row; 13] = [
        ("first sync: wall", |f| f.sync_wall, seconds),
        ("first sync: CPU", |f| f.sync_cpu, seconds),
        ("first sync: reload calls", |f| f.reloads_sync as f64, count),
        ("quiet: CPU", |f| f.quiet_millicores, millicores),
        ("quiet: memory (PSS)", |f| f.quiet_pss_kib as f64, memory),
        ("changes: CPU", |f| f.change_millicores, millicores),
        ("changes: delay, median", |f| median(&f.delays), seconds),
        (
            "changes: delay, max",
            |f| f.delays.iter().copied().fold(0.0, f64::max),
            seconds,
        ),
        ("changes: reload calls", |f| f.reloads_changes as f64, count),
        ("peak memory (PSS)", |f| f.peak_pss_kib as f64, memory),
        ("processes", |f| f.processes as f64, count),
        (
            "apiserver CPU, quiet",
            |f| f.apiserver_quiet_millicores,
            millicores,
        ),
        (
            "apiserver CPU, changes",
            |f| f.apiserver_changes_millicores,
            millicores,
        ),
    ];
    // Each cmpoll column is followed by its ratio to k8s-sidecar, where that ran.
    let peer = results
        .iter()
        .position(|(w, _)| matches!(w, Who::K8sSidecar(_)));
    print!("  {:<26}", "");
    for (w, _) in results {
        print!("{:>20}", w.name());
        if peer.is_some() && matches!(w, Who::Cmpoll(..)) {
            print!("{:>9}", "×");
        }
    }
    println!();
    for (label, get, show) in rows {
        print!("  {label:<26}");
        for (w, f) in results {
            print!("{:>20}", show(get(f)));
            if let Some(p) = peer
                && matches!(w, Who::Cmpoll(..))
            {
                let base = get(&results[p].1);
                // A delay of a watch (milliseconds) against a poll's: no useful ratio.
                let ratio = if base > 0.0 && !label.contains("delay") {
                    format!("{:.2}", get(f) / base)
                } else {
                    "-".into()
                };
                print!("{ratio:>9}");
            }
        }
        println!();
    }
}
