//! What an agent fleet costs the apiserver (issue 31): N instances of one contender
//! against the real kube-apiserver (tests/kube) holding M labelled ConfigMaps of 2 KiB,
//! measured on the apiserver's side, phase by phase:
//!
//! - **sync**: the fleet starts and every instance has the ConfigMaps;
//! - **churn**: one ConfigMap changes every second;
//! - **idle**: nothing changes;
//! - **restart**: the apiserver is killed and started again on the same etcd; every
//!   instance finds it again (relists, rewatches, polls).
//!
//! For each phase: the apiserver's CPU (its `/proc`, which `process_cpu_seconds_total`
//! agrees with), its resident memory at the end, the bytes it sent
//! (`apiserver_response_sizes_sum`: lists and gets; a watch's events are not in it), its
//! LISTs and GETs (`apiserver_request_total`) and the fleet's watches open at the end
//! (`apiserver_longrunning_requests{verb="WATCH"}` less the apiserver's own), and, after
//! the phase, the time until every instance has seen one more change (a `marker`
//! ConfigMap). Each contender gets a freshly restarted apiserver, so that memory and
//! counters are its own. Every instance authenticates as the same service account (a
//! DaemonSet's pods share one), with `list`, `watch` and `get` on ConfigMaps: API Priority
//! and Fairness treats the fleet as the workload it is.
//!
//! Contenders: cmpoll (`--list-mode auto` and `full`; the default 30 s interval and 5 s),
//! a client-go SharedInformer (tests/kube/informer), a candidate for cmpoll's polls
//! (tests/kube/shortwatch: a 1 s watch from the last resourceVersion every 30 s, measured
//! before anything of it is built into cmpoll), and k8s-sidecar 2.10.1 in its
//! default watch mode and with `METHOD=SLEEP` where `K8S_SIDECAR=DIR` names its source and
//! virtualenv (kept outside the repository; without it, a line says it is skipped).
//! The per-instance figures are measured; the 5,000-instance column multiplies them, and
//! says so.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use test_apiserver::real::{RealApiserver, User, built, metric_sum};

use super::hubs::Hubs;
use super::mib;
use super::sidecar::apply;

pub struct Plan {
    pub instances: Vec<usize>,
    pub objects: Vec<usize>,
    pub phase: Duration,
    /// Only contenders whose name contains one of these (all when empty).
    pub contenders: Vec<String>,
    /// Earlier cmpoll builds, each run as `cmpoll auto 30s (LABEL)` beside this one:
    /// `--baseline PATH` (`before`) and `--also LABEL=PATH`.
    pub builds: Vec<(String, PathBuf)>,
}

pub(super) const NAMESPACES: usize = 10;
pub(super) const BYTES: usize = 2048;
/// k8s-sidecar instances at most (Python, ~80 MiB each).
const MAX_SIDECARS: usize = 30;

#[derive(Clone)]
enum Who {
    /// No agents: what the churn, the harness and the apiserver itself cost (subtracted
    /// from every contender's per-agent figures).
    Nobody,
    Cmpoll {
        bin: PathBuf,
        mode: &'static str,
        interval: &'static str,
        /// An earlier build's label (a change's before/after in one run); `""`: this one.
        label: String,
    },
    Informer(PathBuf),
    /// A candidate for cmpoll's polls (tests/kube/shortwatch): a watch from the last
    /// resourceVersion with a short timeoutSeconds per interval.
    ShortWatch(PathBuf),
    Sidecar {
        dir: PathBuf,
        method: &'static str,
    },
    /// `hubs` × `cmpoll serve` polling every `interval`, and the fleet of cmpolls
    /// following them (`hubs.rs`).
    Hub {
        bin: PathBuf,
        hubs: usize,
        interval: &'static str,
    },
}

impl Who {
    fn name(&self) -> String {
        match self {
            Who::Nobody => "no agents (floor)".into(),
            Who::Cmpoll {
                mode,
                interval,
                label,
                ..
            } => match label.as_str() {
                "" => format!("cmpoll {mode} {interval}"),
                l => format!("cmpoll {mode} {interval} ({l})"),
            },
            Who::Informer(_) => "client-go informer".into(),
            Who::ShortWatch(_) => "short watch 30s (candidate)".into(),
            Who::Sidecar { method, .. } => format!("k8s-sidecar {method}"),
            Who::Hub { hubs, interval, .. } => format!("followers, {hubs} hub {interval}"),
        }
    }
}

/// The next churn round: 1, then after every round a run used.
static CHURN_ROUNDS: AtomicUsize = AtomicUsize::new(1);

/// One instance: its process, and when it saw the marker change.
struct Instance {
    child: Child,
    seen: Arc<Mutex<Vec<Instant>>>,
    synced: Arc<Mutex<bool>>,
    folder: Option<PathBuf>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the apiserver reports at one moment.
#[derive(Clone, Copy, Default)]
struct Sample {
    cpu: f64,
    rss_kib: u64,
    bytes: f64,
    lists: f64,
    gets: f64,
    watches_open: f64,
    /// API Priority and Fairness: seats its work estimates asked for, requests it rejected.
    seats: f64,
    rejected: f64,
    /// The hubs' own CPU seconds and resident KiB (hub contenders).
    hub_cpu: f64,
    hub_rss_kib: u64,
    /// The instances' own CPU seconds, all together.
    fleet_cpu: f64,
}

fn sample(api: &RealApiserver) -> Sample {
    let text = api.metrics();
    let (cpu, rss_kib) = super::proc_usage(api.apiserver_pid());
    let verb = |v: &str| metric_sum(&text, "apiserver_request_total", &[("verb", v)]);
    Sample {
        cpu,
        rss_kib,
        bytes: metric_sum(&text, "apiserver_response_sizes_sum", &[]),
        lists: verb("LIST"),
        gets: verb("GET"),
        watches_open: metric_sum(
            &text,
            "apiserver_longrunning_requests",
            &[("verb", "WATCH")],
        ),
        seats: metric_sum(&text, "apiserver_flowcontrol_work_estimated_seats_sum", &[]),
        rejected: metric_sum(&text, "apiserver_flowcontrol_rejected_requests_total", &[]),
        hub_cpu: 0.0,
        hub_rss_kib: 0,
        fleet_cpu: 0.0,
    }
}

/// `sample`, with the hubs' usage when there are hubs and the fleet's own CPU.
fn sample_with(api: &RealApiserver, hubs: Option<&Hubs>, fleet: &[Instance]) -> Sample {
    let mut s = sample(api);
    if let Some(h) = hubs {
        (s.hub_cpu, s.hub_rss_kib) = h.usage();
    }
    s.fleet_cpu = (fleet.iter())
        .filter_map(|i| std::fs::read_to_string(format!("/proc/{}/stat", i.child.id())).ok())
        .map(|stat| {
            let fields: Vec<f64> = (stat.rsplit(')').next().unwrap_or("").split_whitespace())
                .map(|f| f.parse().unwrap_or(0.0))
                .collect();
            // SAFETY: sysconf has no preconditions.
            let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            (fields.get(11).unwrap_or(&0.0) + fields.get(12).unwrap_or(&0.0)) / ticks
        })
        .sum();
    s
}

/// A phase's cost: `b` minus `a` over `secs`.
struct Cost {
    millicores: f64,
    rss_kib: u64,
    bytes_per_s: f64,
    lists_per_s: f64,
    gets_per_s: f64,
    watches_open: f64,
    seats_per_s: f64,
    rejected_per_s: f64,
    hub_millicores: f64,
    hub_rss_kib: u64,
    /// The instances' own CPU, all together.
    fleet_millicores: f64,
    /// How long each instance took to see the change after the phase (None: not all did).
    seen_after: Option<Vec<f64>>,
}

fn cost(a: Sample, b: Sample, secs: f64) -> Cost {
    Cost {
        millicores: (b.cpu - a.cpu) / secs * 1000.0,
        rss_kib: b.rss_kib,
        bytes_per_s: (b.bytes - a.bytes) / secs,
        lists_per_s: (b.lists - a.lists) / secs,
        gets_per_s: (b.gets - a.gets) / secs,
        watches_open: b.watches_open,
        seats_per_s: (b.seats - a.seats) / secs,
        rejected_per_s: (b.rejected - a.rejected) / secs,
        hub_millicores: (b.hub_cpu - a.hub_cpu) / secs * 1000.0,
        hub_rss_kib: b.hub_rss_kib,
        fleet_millicores: (b.fleet_cpu - a.fleet_cpu) / secs * 1000.0,
        seen_after: None,
    }
}

pub(super) fn object(i: usize, round: usize) -> serde_json::Value {
    let ns = format!("fleet-{}", i % NAMESPACES);
    let name = if i == usize::MAX {
        "marker".to_string()
    } else {
        format!("module-{i}")
    };
    let ns = if i == usize::MAX {
        "fleet-0".into()
    } else {
        ns
    };
    // Bytes that do not compress away (the apiserver gzips what cmpoll accepts gzipped):
    // a deterministic pseudo-random text per object and round.
    let mut x = (i as u64 ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(round as u64 + 1) | 1;
    let noise: String = (0..BYTES - 8)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(x % 36) as usize])
        })
        .collect();
    let body = format!("{round:08}{noise}");
    // Keys differ between objects: k8s-sidecar writes every key into one folder.
    let key = if i == usize::MAX {
        "marker.txt".to_string()
    } else {
        format!("module-{i}.txt")
    };
    serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {"cmpoll.io/module": "true"}},
        "data": {key: body},
    })
}

/// `n` pods of the fleet's service account (never scheduled: there is no node) and a
/// token bound to each, as each pod of a DaemonSet has its own: the apiserver, and a hub,
/// review each on its own (its user's `extra` names the pod).
pub(super) fn pod_tokens(api: &RealApiserver, n: usize) -> Vec<String> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        apply(
            api,
            chunk
                .iter()
                .map(|i| {
                    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": format!("agent-{i}"), "namespace": "fleet-agents"},
                        "spec": {"serviceAccountName": "agent", "automountServiceAccountToken": false,
                            "containers": [{"name": "agent", "image": "agent"}]}})
                })
                .collect(),
        );
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let tokens = Mutex::new(vec![String::new(); n]);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let t = api.ok(&[
                        "create",
                        "token",
                        "agent",
                        "-n",
                        "fleet-agents",
                        "--duration",
                        "24h",
                        "--bound-object-kind",
                        "Pod",
                        "--bound-object-name",
                        &format!("agent-{i}"),
                    ]);
                    tokens.lock().expect("lock")[i] = t.trim().to_string();
                }
            });
        }
    });
    tokens.into_inner().expect("tokens")
}

/// ConfigMaps `from..to` (round 0) and the marker.
pub(super) fn load(api: &RealApiserver, from: usize, to: usize) {
    if to > from {
        for chunk in (from..to).collect::<Vec<_>>().chunks(200) {
            apply(api, chunk.iter().map(|&i| object(i, 0)).collect());
        }
    }
    apply(api, vec![object(usize::MAX, 0)]);
}

/// The fleet's namespaces, service account and role; a token of that account.
pub(super) fn account_token(api: &RealApiserver) -> String {
    let mut items = vec![serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "fleet-agents"}})];
    items.push(
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "agent", "namespace": "fleet-agents"}}),
    );
    items.push(serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole", "metadata": {"name": "fleet-agent"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch", "get"]}]}));
    items.push(serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding", "metadata": {"name": "fleet-agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fleet-agent"},
        "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": "fleet-agents"}]}));
    for n in 0..NAMESPACES {
        items.insert(
            0,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": format!("fleet-{n}")}}),
        );
    }
    apply(api, items);
    api.token("fleet-agents", "agent", "24h")
}

fn launch(who: &Who, kubeconfig: &Path, dir: &Path, i: usize) -> Instance {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let synced = Arc::new(Mutex::new(false));
    let mut folder = None;
    let mut cmd = match who {
        Who::Cmpoll {
            bin,
            mode,
            interval,
            ..
        } => {
            let mut c = Command::new(bin);
            c.args([
                "run",
                "--stdout-events",
                "--list-mode",
                mode,
                "--interval",
                interval,
            ]);
            c
        }
        Who::Informer(bin) => Command::new(bin),
        Who::ShortWatch(bin) => {
            let mut c = Command::new(bin);
            c.args(["--interval", "30s", "--watch-timeout", "1"]);
            c
        }
        Who::Hub { bin, .. } => {
            let mut c = Command::new(bin);
            c.args(["run", "--stdout-events", "--interval", "30s"]);
            c
        }
        Who::Nobody => unreachable!("no instances"),
        Who::Sidecar { dir: sc, method } => {
            let f = dir.join(format!("sidecar-{i}"));
            std::fs::create_dir_all(&f).expect("mkdir");
            // k8s-sidecar opens the service account's namespace file even off-cluster:
            // a private mount namespace gives it one (as the sidecar part does; root).
            let mut c = Command::new("unshare");
            c.args(["-m", "--propagation", "private", "sh", "-c"])
                .arg(
                    "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && echo -n fleet-agents > /run/secrets/kubernetes.io/serviceaccount/namespace && exec \"$0\" -u sidecar.py",
                )
                .arg(sc.join("venv/bin/python"))
                .current_dir(sc.join("src"))
                .env("LABEL", "cmpoll.io/module")
                .env("LABEL_VALUE", "true")
                .env("FOLDER", &f)
                .env("RESOURCE", "configmap")
                .env("NAMESPACE", "ALL")
                .env("METHOD", method)
                .env("SLEEP_TIME", "30")
                .env("HEALTH_PORT", "0")
                .env("LOG_LEVEL", "WARNING");
            folder = Some(f);
            c
        }
    };
    cmd.env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn a contender");
    let stdout = child.stdout.take().expect("stdout");
    let (s, y) = (seen.clone(), synced.clone());
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line == "synced" || line.starts_with("{\"type\":\"synced\"") {
                *y.lock().expect("lock") = true;
            }
            if line.contains("fleet-0/marker")
                && (line.contains("updated") || line.contains("added"))
            {
                s.lock().expect("lock").push(Instant::now());
            }
        }
    });
    Instance {
        child,
        seen,
        synced,
        folder,
    }
}

/// k8s-sidecar writes files, it prints nothing: its marker is the file's content.
fn sidecar_saw(inst: &Instance, round: usize) -> bool {
    inst.folder.as_ref().is_some_and(|f| {
        std::fs::read(f.join("marker.txt"))
            .is_ok_and(|b| b.starts_with(format!("{round:08}").as_bytes()))
    })
}

/// Changes the marker to `round`; the seconds each instance took to see it (None: not
/// every one did within `limit`).
fn marker_delay(
    api: &RealApiserver,
    fleet: &[Instance],
    round: usize,
    limit: Duration,
) -> Option<Vec<f64>> {
    let at = Instant::now();
    apply(api, vec![object(usize::MAX, round)]);
    let mut last: Vec<Option<Instant>> = vec![None; fleet.len()];
    while at.elapsed() < limit {
        for (i, inst) in fleet.iter().enumerate() {
            if last[i].is_some() {
                continue;
            }
            let seen = if inst.folder.is_some() {
                sidecar_saw(inst, round).then(Instant::now)
            } else {
                inst.seen
                    .lock()
                    .expect("lock")
                    .iter()
                    .copied()
                    .find(|t| *t >= at)
            };
            last[i] = seen;
        }
        if last.iter().all(Option::is_some) {
            let mut all: Vec<f64> = (last.iter().flatten())
                .map(|t| t.duration_since(at).as_secs_f64())
                .collect();
            all.sort_by(f64::total_cmp);
            return Some(all);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

struct Row {
    who: String,
    /// The apiserver's own open watches before the fleet started (and after a restart).
    own_watches: f64,
    instances: usize,
    objects: usize,
    phases: Vec<(&'static str, Cost)>,
    sync_secs: f64,
}

fn run_one(
    api: &RealApiserver,
    kcs: &[PathBuf],
    tokens: &[String],
    who: &Who,
    n: usize,
    m: usize,
    plan: &Plan,
) -> Row {
    // A fresh apiserver process: its memory and counters are this contender's.
    api.stop_apiserver();
    api.start_apiserver();
    let dir = tempfile::tempdir().expect("tempdir");
    let limit = match who {
        Who::Nobody => Duration::ZERO,
        Who::Cmpoll {
            interval: "30s", ..
        } => Duration::from_secs(45),
        _ => Duration::from_secs(40),
    };
    let s0 = sample(api);
    let own_watches = s0.watches_open;
    let t0 = Instant::now();
    let mut hubs = match who {
        Who::Hub {
            bin,
            hubs,
            interval,
        } => Some(Hubs::start(api, bin, *hubs, interval, dir.path())),
        _ => None,
    };
    // Each instance its own pod's token, as a DaemonSet's pods have.
    let kcs: Vec<PathBuf> = match &hubs {
        Some(h) => (0..n).map(|i| h.kubeconfig(&tokens[i], i)).collect(),
        None => kcs[..n].to_vec(),
    };
    let s0 = sample_with(api, hubs.as_ref(), &[]);
    let fleet: Vec<Instance> = (0..n)
        .map(|i| launch(who, &kcs[i], dir.path(), i))
        .collect();
    // Synced: every instance has the ConfigMaps (k8s-sidecar: the marker's file).
    while t0.elapsed() < Duration::from_secs(300) {
        let all = fleet.iter().all(|f| {
            if f.folder.is_some() {
                f.folder
                    .as_ref()
                    .is_some_and(|d| d.join("marker.txt").exists())
            } else {
                *f.synced.lock().expect("lock")
            }
        });
        if all {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let sync_secs = t0.elapsed().as_secs_f64();
    let mut phases = Vec::new();
    let mut s1 = sample_with(api, hubs.as_ref(), &fleet);
    phases.push(("sync", cost(s0, s1, sync_secs.max(0.001))));
    // Churn: one ConfigMap a second, each write new content. The objects outlive a run,
    // so each run's rounds follow the last run's: the same content again would be a
    // no-op apply that changes nothing (as every run after the floor's once did).
    let start = Instant::now();
    let base = CHURN_ROUNDS.fetch_add(1 + plan.phase.as_secs() as usize, Ordering::SeqCst);
    let mut k = 0;
    while start.elapsed() < plan.phase {
        apply(api, vec![object(k % m, base + k / m)]);
        k += 1;
        let next = Duration::from_secs(k as u64);
        if let Some(wait) = next.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    let s2 = sample_with(api, hubs.as_ref(), &fleet);
    let mut c = cost(s1, s2, start.elapsed().as_secs_f64());
    c.seen_after = marker_delay(api, &fleet, 1, limit);
    phases.push(("churn", c));
    // Idle.
    s1 = sample_with(api, hubs.as_ref(), &fleet);
    let start = Instant::now();
    std::thread::sleep(plan.phase);
    let s2 = sample_with(api, hubs.as_ref(), &fleet);
    let mut c = cost(s1, s2, start.elapsed().as_secs_f64());
    c.seen_after = marker_delay(api, &fleet, 2, limit);
    phases.push(("idle", c));
    // Restart: killed, started on the same etcd; the new process's counters from zero.
    let hub_before = sample_with(api, hubs.as_ref(), &fleet);
    api.stop_apiserver();
    api.start_apiserver();
    let start = Instant::now();
    let s1 = Sample {
        hub_cpu: hub_before.hub_cpu,
        hub_rss_kib: hub_before.hub_rss_kib,
        fleet_cpu: hub_before.fleet_cpu,
        ..Sample::default()
    };
    std::thread::sleep(plan.phase);
    let s2 = sample_with(api, hubs.as_ref(), &fleet);
    let mut c = cost(s1, s2, start.elapsed().as_secs_f64());
    c.seen_after = marker_delay(api, &fleet, 3, limit);
    phases.push(("restart", c));
    // Hub restart: every hub stopped and started again, one after the other (a rollout).
    if let Some(h) = hubs.as_mut() {
        let s1 = sample_with(api, None, &fleet);
        let (cpu_before, _) = h.usage();
        let start = Instant::now();
        h.restart();
        std::thread::sleep(plan.phase.saturating_sub(start.elapsed()));
        // The restarted processes' CPU from zero, plus what the old ones used until then.
        let mut s2 = sample_with(api, Some(h), &fleet);
        s2.hub_cpu += cpu_before;
        let mut c = cost(
            Sample {
                hub_cpu: cpu_before,
                ..s1
            },
            s2,
            start.elapsed().as_secs_f64(),
        );
        c.seen_after = marker_delay(api, &fleet, 4, limit);
        phases.push(("hub rst", c));
    }
    if let Some(h) = &hubs {
        eprintln!(
            "  {}: the largest hub process peaked at {} resident",
            who.name(),
            mib(h.peak_kib())
        );
    }
    drop(fleet);
    drop(hubs);
    Row {
        who: who.name(),
        own_watches,
        instances: n,
        objects: m,
        phases,
        sync_secs,
    }
}

fn print(rows: &[Row]) {
    println!(
        "{:<24} {:>4} {:>5} {:<8} {:>8} {:>9} {:>9} {:>7} {:>6} {:>7} {:>7} {:>6} {:>20} {:>17} {:>9} {:>22}",
        "contender",
        "N",
        "M",
        "phase",
        "apiCPU",
        "apiRSS",
        "sent/s",
        "LIST/s",
        "GET/s",
        "ms/req",
        "seats/s",
        "watch",
        "saw: med/p99/max",
        "hub CPU, RSS",
        "fleetCPU",
        "per agent over floor"
    );
    // A hub restart's floor is an idle phase's.
    let floor_phase = |p: &str| if p == "hub rst" { "idle" } else { p }.to_string();
    let floor = |r: &Row, phase: &str| {
        let phase = floor_phase(phase);
        rows.iter()
            .find(|f| f.who == Who::Nobody.name() && f.objects == r.objects)
            .and_then(|f| f.phases.iter().find(|(p, _)| *p == phase))
            .map(|(_, c)| (c.millicores, c.bytes_per_s, c.rss_kib))
            .unwrap_or((0.0, 0.0, 0))
    };
    let floor_requests = |r: &Row, phase: &str| {
        let phase = floor_phase(phase);
        rows.iter()
            .find(|f| f.who == Who::Nobody.name() && f.objects == r.objects)
            .and_then(|f| f.phases.iter().find(|(p, _)| *p == phase))
            .map(|(_, c)| c.lists_per_s + c.gets_per_s)
            .unwrap_or(0.0)
    };
    for r in rows {
        for (phase, c) in &r.phases {
            let seen = match (*phase, &c.seen_after) {
                ("sync", _) => format!("{:.2}s", r.sync_secs),
                (_, Some(s)) if !s.is_empty() => {
                    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
                    format!("{:.2}/{:.2}/{:.2}s", at(0.5), at(0.99), at(1.0))
                }
                _ => "-".into(),
            };
            let hub = if c.hub_rss_kib == 0 {
                String::new()
            } else {
                format!("{:.0}m {} ", c.hub_millicores, mib(c.hub_rss_kib))
            };
            let (fc, fb, fr) = floor(r, phase);
            let n = r.instances.max(1) as f64;
            let per = if r.instances == 0 {
                String::new()
            } else if *phase == "sync" {
                // CPU-seconds per agent to get every instance its first copy.
                format!("{:.3} CPU-s", c.millicores * r.sync_secs / 1000.0 / n)
            } else {
                format!(
                    "{:.2}m {}/s {}",
                    (c.millicores - fc) / n,
                    super::mb(((c.bytes_per_s - fb).max(0.0) / n) as u64),
                    if c.rss_kib > fr {
                        format!("+{}", mib((c.rss_kib - fr) / r.instances as u64))
                    } else {
                        "+0".into()
                    }
                )
            };
            // The apiserver's CPU over the floor per LIST or GET the fleet made: what a poll
            // costs, whatever number of polls fell into the phase (a 30 s phase sees about
            // half of a 30 s fleet's polls).
            let requests = c.lists_per_s + c.gets_per_s - floor_requests(r, phase);
            let per_request = if r.instances == 0 || *phase == "sync" || requests < 0.1 {
                "-".to_string()
            } else {
                format!("{:.2}", (c.millicores - fc) / requests)
            };
            println!(
                "{:<24} {:>4} {:>5} {:<8} {:>7.0}m {:>9} {:>9} {:>7.2} {:>6.2} {:>7} {:>7} {:>6.0} {:>20} {:>17} {:>8.0}m {:>22}",
                r.who,
                r.instances,
                r.objects,
                phase,
                c.millicores,
                mib(c.rss_kib),
                super::mb(c.bytes_per_s as u64),
                c.lists_per_s,
                c.gets_per_s,
                per_request,
                match c.rejected_per_s > 0.0 {
                    true => format!("{:.1} rej {:.1}", c.seats_per_s, c.rejected_per_s),
                    false => format!("{:.1}", c.seats_per_s),
                },
                (c.watches_open - r.own_watches).max(0.0),
                seen,
                hub,
                c.fleet_millicores,
                per,
            );
        }
    }
    println!();
    println!(
        "extrapolated to a 5,000-node DaemonSet: the floor plus 5,000 × the measured per-agent figures of the largest N (memory not extrapolated)"
    );
    println!(
        "{:<24} {:>5} {:<8} {:>12} {:>12} {:>10} {:>10} {:>22}",
        "contender", "M", "phase", "apiCPU", "sent/s", "LIST/s", "watches", "hubs (CPU, RSS)"
    );
    let mut largest: Vec<&Row> = Vec::new();
    for r in rows.iter().filter(|r| r.instances > 0) {
        match largest
            .iter_mut()
            .find(|l| l.who == r.who && l.objects == r.objects)
        {
            Some(l) if l.instances < r.instances => *l = r,
            Some(_) => {}
            None => largest.push(r),
        }
    }
    for r in largest {
        let f = 5000.0 / r.instances as f64;
        for (phase, c) in &r.phases {
            if *phase == "sync" {
                continue;
            }
            let (fc, fb, _) = floor(r, phase);
            let hubs = match c.hub_rss_kib {
                0 => String::new(),
                rss => format!(
                    "{:.2} cores, {} at N",
                    c.hub_millicores * f / 1000.0,
                    mib(rss)
                ),
            };
            println!(
                "{:<24} {:>5} {:<8} {:>9.2} cores {:>12} {:>10.1} {:>10.0} {:>22}",
                r.who,
                r.objects,
                phase,
                (fc + (c.millicores - fc) * f) / 1000.0,
                super::mb((fb + (c.bytes_per_s - fb) * f).max(0.0) as u64),
                c.lists_per_s * f,
                (c.watches_open - r.own_watches).max(0.0) * f,
                hubs,
            );
        }
    }
}

pub fn run(cmpoll: &Path, plan: &Plan) {
    println!(
        "== what an agent fleet costs the real kube-apiserver: {:?} instances × {:?} ConfigMaps of {BYTES} B, phases of {}s ==",
        plan.instances,
        plan.objects,
        plan.phase.as_secs()
    );
    if !built() {
        println!("skipped: the real apiserver is not built (tests/kube/build.sh)");
        return;
    }
    let informer = test_apiserver::real::bin_dir().join("informer");
    let mut who = vec![
        Who::Nobody,
        Who::Cmpoll {
            bin: cmpoll.into(),
            mode: "auto",
            interval: "30s",
            label: String::new(),
        },
        Who::Cmpoll {
            bin: cmpoll.into(),
            mode: "full",
            interval: "30s",
            label: String::new(),
        },
        Who::Cmpoll {
            bin: cmpoll.into(),
            mode: "auto",
            interval: "5s",
            label: String::new(),
        },
        Who::Cmpoll {
            bin: cmpoll.into(),
            mode: "full",
            interval: "5s",
            label: String::new(),
        },
    ];
    for (i, (label, bin)) in plan.builds.iter().enumerate() {
        who.insert(
            1 + i,
            Who::Cmpoll {
                bin: bin.clone(),
                mode: "auto",
                interval: "30s",
                label: label.clone(),
            },
        );
    }
    let shortwatch = test_apiserver::real::bin_dir().join("shortwatch");
    if shortwatch.exists() {
        who.push(Who::ShortWatch(shortwatch));
    } else {
        println!(
            "skipped: the short-watch candidate (tests/kube/build.sh builds tests/kube/bin/shortwatch)"
        );
    }
    if informer.exists() {
        who.push(Who::Informer(informer));
    } else {
        println!(
            "skipped: the client-go informer (tests/kube/build.sh builds tests/kube/bin/informer)"
        );
    }
    match std::env::var_os("K8S_SIDECAR").map(PathBuf::from) {
        Some(dir) if dir.join("venv/bin/python").exists() => {
            who.push(Who::Sidecar {
                dir: dir.clone(),
                method: "WATCH",
            });
            who.push(Who::Sidecar {
                dir,
                method: "SLEEP",
            });
        }
        _ => println!(
            "skipped: k8s-sidecar (set K8S_SIDECAR to a folder with its source in src/ and a virtualenv in venv/, kept outside the repository)"
        ),
    }
    // The floor of the fleet's "done when" (issue 39): two cmpolls polling every second.
    who.push(Who::Cmpoll {
        bin: cmpoll.into(),
        mode: "auto",
        interval: "1s",
        label: String::new(),
    });
    for (hubs, interval) in [(1, "1s"), (2, "1s"), (1, "10s")] {
        who.push(Who::Hub {
            bin: cmpoll.into(),
            hubs,
            interval,
        });
    }
    who.retain(|w| {
        matches!(w, Who::Nobody)
            || plan.contenders.is_empty()
            || plan
                .contenders
                .iter()
                .any(|c| w.name().contains(c.as_str()))
    });
    let api = RealApiserver::start();
    account_token(&api);
    let most = plan.instances.iter().copied().max().unwrap_or(0).max(2);
    let tokens = pod_tokens(&api, most);
    let kcs: Vec<PathBuf> = (tokens.iter().enumerate())
        .map(|(i, t)| {
            api.write_kubeconfig(&format!("agent-{i}.kubeconfig"), &User::Token(t.clone()))
        })
        .collect();
    let mut rows = Vec::new();
    let mut loaded = 0;
    for &m in &plan.objects {
        // And the marker, in every phase's last change (round 0 now).
        load(&api, loaded, m);
        loaded = loaded.max(m);
        for w in &who {
            let sizes: Vec<usize> = match w {
                Who::Nobody => vec![0],
                Who::Cmpoll { interval: "1s", .. } => vec![2],
                _ => plan.instances.clone(),
            };
            for n in sizes {
                let n = if matches!(w, Who::Sidecar { .. }) {
                    n.min(MAX_SIDECARS)
                } else {
                    n
                };
                eprintln!("  {} × {n}, {m} ConfigMaps…", w.name());
                rows.push(run_one(&api, &kcs, &tokens, w, n, m, plan));
            }
        }
    }
    print(&rows);
}
