//! What a hub's poll costs the apiserver beside ConfigMaps it does not select (issue 49.1):
//! a label-selected list from the watch cache visits every stored object of its scope,
//! selected or not. On the real apiserver holding 1,000 selected ConfigMaps of 2 KiB and U
//! unselected small ones (U = 0, 10,000, 100,000 by default; `--unselected`), the
//! apiserver's CPU over 60 s phases, idle and under one change a second, for:
//!
//! - nobody (the floor at that size);
//! - `cmpoll serve --interval 1s` with no followers and the shipped role: after its first
//!   list, a short watch from its last version each second (`src/source/api/short_watch.rs`);
//! - the same hub with a role without `watch` (what every hub asked before: a metadata
//!   list from the watch cache each second, `resourceVersionMatch=NotOlderThan`, and a GET
//!   of what changed);
//! - the same hub with `--page-size 500` (pages of 500 with no resourceVersion: consistent
//!   reads from the cache, KEP-2340, paginated from the cache, KEP-4988 — what else the
//!   apiserver offers for a list);
//! - client-go's short watch (`tests/kube/shortwatch --interval 1s --watch-timeout 1`: the
//!   candidate of issue 31, measured there at 100 objects only), for reference.
//!
//! Each contender minus the floor of the same size and phase is its cost.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_apiserver::real::{RealApiserver, User};

use super::apifleet;
use super::hubs::Hubs;
use super::sidecar::apply;

pub struct Plan {
    pub unselected: Vec<usize>,
    pub objects: usize,
    pub phase: Duration,
}

/// An unselected ConfigMap (no `cmpoll.io/module` label), small, in one of the fleet's
/// namespaces.
fn unselected(i: usize) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("other-{i}"), "namespace": format!("fleet-{}", i % apifleet::NAMESPACES),
            "labels": {"app": "something-else"}},
        "data": {"k": format!("v{i}")}})
}

fn load_unselected(api: &RealApiserver, from: usize, to: usize) {
    let all: Vec<usize> = (from..to).collect();
    for chunk in all.chunks(500) {
        apply(api, chunk.iter().map(|&i| unselected(i)).collect());
    }
}

fn cpu(api: &RealApiserver) -> f64 {
    super::proc_usage(api.apiserver_pid()).0
}

/// The apiserver's CPU (m) over `phase`, with one change a second when `churn`.
fn measure(
    api: &RealApiserver,
    phase: Duration,
    churn: bool,
    objects: usize,
    round: &mut usize,
) -> f64 {
    let (c0, t0) = (cpu(api), Instant::now());
    let mut k = 0;
    while t0.elapsed() < phase {
        if churn {
            *round += 1;
            apply(api, vec![apifleet::object(k % objects, *round)]);
            k += 1;
        }
        let next = t0 + Duration::from_secs(k as u64 + 1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()).min(phase));
    }
    (cpu(api) - c0) / t0.elapsed().as_secs_f64() * 1000.0
}

/// A process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A service account of the fleet's namespace with the shipped hub role less `watch`: a
/// hub as every hub polled before the short watch; its token.
fn token_without_watch(api: &RealApiserver) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("k8s/serve/clusterrole.yaml")).expect("role");
    let json = api.ok_in(
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        Some(&text),
    );
    let mut role: serde_json::Value = serde_json::from_str(&json).expect("role as JSON");
    role["metadata"]["name"] = "cmpoll-hub-without-watch".into();
    if let Some(verbs) = role["rules"][0]["verbs"].as_array_mut() {
        verbs.retain(|v| v != "watch");
    }
    apply(
        api,
        vec![
            role,
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "hub-without-watch", "namespace": "fleet-agents"}}),
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding", "metadata": {"name": "cmpoll-hub-without-watch"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cmpoll-hub-without-watch"},
                "subjects": [{"kind": "ServiceAccount", "name": "hub-without-watch", "namespace": "fleet-agents"}]}),
        ],
    );
    api.token("fleet-agents", "hub-without-watch", "24h")
}

/// A contender: how it is started (a process killed when dropped).
enum Contender {
    Hub(&'static [&'static str], bool),
    ShortWatch,
}

/// The fleet's ten namespaces, each a scope of its own (issue 56.2: a change in one has
/// the others listed once, to be as new).
const TEN: &[&str] = &[
    "--namespace",
    "fleet-0",
    "--namespace",
    "fleet-1",
    "--namespace",
    "fleet-2",
    "--namespace",
    "fleet-3",
    "--namespace",
    "fleet-4",
    "--namespace",
    "fleet-5",
    "--namespace",
    "fleet-6",
    "--namespace",
    "fleet-7",
    "--namespace",
    "fleet-8",
    "--namespace",
    "fleet-9",
];

const CONTENDERS: [(&str, Contender); 5] = [
    (
        "cmpoll serve: short watch (the shipped role)",
        Contender::Hub(&[], true),
    ),
    (
        "cmpoll serve --namespace × 10: a short watch each",
        Contender::Hub(TEN, true),
    ),
    (
        "cmpoll serve, role without watch: metadata list",
        Contender::Hub(&[], false),
    ),
    (
        "cmpoll serve --page-size 500 (no watch): consistent paged reads from cache",
        Contender::Hub(&["--page-size", "500"], false),
    ),
    (
        "client-go short watch (tests/kube/shortwatch)",
        Contender::ShortWatch,
    ),
];

pub fn run(cmpoll: &Path, plan: &Plan) {
    let api = RealApiserver::start();
    let token = apifleet::account_token(&api);
    apifleet::load(&api, 0, plan.objects);
    let kubeconfig = api.write_kubeconfig("shortwatch.kubeconfig", &User::Token(token));
    let shortwatch = test_apiserver::real::bin_dir().join("shortwatch");
    let shipped = super::hubs::hub_token(&api);
    let without_watch = token_without_watch(&api);
    println!(
        "a hub's poll beside unselected ConfigMaps: {} selected of 2 KiB; the apiserver's CPU over {} s phases, idle and under one change a second, minus the floor (nobody) at the same size",
        plan.objects,
        plan.phase.as_secs()
    );
    println!("| unselected stored | who polls every second | idle | one change a second |");
    println!("|---|---|---|---|");
    let mut round = 3_000_000;
    let mut loaded = 0;
    for &u in &plan.unselected {
        let started = Instant::now();
        load_unselected(&api, loaded, u);
        loaded = loaded.max(u);
        eprintln!(
            "  {u} unselected stored ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
        // The apiserver settles after a load (its first minute after 100,000 writes is
        // busy): the floor is measured before and after the contenders, and the mean taken.
        std::thread::sleep(Duration::from_secs(60));
        let before = (
            measure(&api, plan.phase, false, plan.objects, &mut round),
            measure(&api, plan.phase, true, plan.objects, &mut round),
        );
        let mut costs = Vec::new();
        for (name, contender) in &CONTENDERS {
            let dir = tempfile::tempdir().expect("dir");
            let running: Box<dyn std::any::Any> = match contender {
                Contender::Hub(extra, watch) => {
                    let token = if *watch { &shipped } else { &without_watch };
                    Box::new(Hubs::start_as(
                        &api,
                        cmpoll,
                        1,
                        "1s",
                        dir.path(),
                        extra,
                        token,
                    ))
                }
                Contender::ShortWatch => Box::new(Running(
                    Command::new(&shortwatch)
                        .args(["--interval", "1s", "--watch-timeout", "1", "--jitter", "0"])
                        .env("KUBECONFIG", &kubeconfig)
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("shortwatch (tests/kube/build.sh builds it)"),
                )),
            };
            std::thread::sleep(Duration::from_secs(5));
            let cost = (
                measure(&api, plan.phase, false, plan.objects, &mut round),
                measure(&api, plan.phase, true, plan.objects, &mut round),
            );
            drop(running);
            costs.push((name, cost));
        }
        std::thread::sleep(Duration::from_secs(5));
        let after = (
            measure(&api, plan.phase, false, plan.objects, &mut round),
            measure(&api, plan.phase, true, plan.objects, &mut round),
        );
        let floor = ((before.0 + after.0) / 2.0, (before.1 + after.1) / 2.0);
        println!(
            "| {u} | nobody (the floor: before, after) | {:.0} m ({:.0}, {:.0}) | {:.0} m ({:.0}, {:.0}) |",
            floor.0, before.0, after.0, floor.1, before.1, after.1
        );
        for (name, cost) in costs {
            println!(
                "| {u} | {name} | {:+.1} m | {:+.1} m |",
                cost.0 - floor.0,
                cost.1 - floor.1
            );
        }
    }
}
