//! What a hub's poll costs the apiserver beside ConfigMaps it does not select (issue 49.1):
//! a label-selected list from the watch cache visits every stored object of its scope,
//! selected or not. On the real apiserver holding 1,000 selected ConfigMaps of 2 KiB and U
//! unselected small ones (U = 0, 10,000, 100,000 by default; `--unselected`), the
//! apiserver's CPU over 60 s phases, idle and under one change a second, for:
//!
//! - nobody (the floor at that size);
//! - `cmpoll serve --interval 1s` with no followers (what the hub asks today: a metadata
//!   list from the watch cache each second, a GET of what changed);
//! - the short watch (`tests/kube/shortwatch --interval 1s --watch-timeout 1`): a watch
//!   from the last resourceVersion each second, with the same selector, answered from the
//!   watch cache's events since then and ended by the apiserver after 1 s (the candidate
//!   of issue 31, measured there at 100 objects only).
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

pub fn run(cmpoll: &Path, plan: &Plan) {
    let api = RealApiserver::start();
    let token = apifleet::account_token(&api);
    apifleet::load(&api, 0, plan.objects);
    let kubeconfig = api.write_kubeconfig("shortwatch.kubeconfig", &User::Token(token));
    let shortwatch = test_apiserver::real::bin_dir().join("shortwatch");
    println!(
        "a hub's poll beside unselected ConfigMaps: {} selected of 2 KiB; the apiserver's CPU over {} s phases, idle and under one change a second, minus the floor (nobody) at the same size",
        plan.objects,
        plan.phase.as_secs()
    );
    println!(
        "| unselected stored | floor idle / churn | metadata list 1 s (cmpoll serve today): idle / churn | short watch 1 s: idle / churn |"
    );
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
        std::thread::sleep(Duration::from_secs(10));
        let floor = (
            measure(&api, plan.phase, false, plan.objects, &mut round),
            measure(&api, plan.phase, true, plan.objects, &mut round),
        );
        let dir = tempfile::tempdir().expect("dir");
        let hub = Hubs::start(&api, cmpoll, 1, "1s", dir.path());
        std::thread::sleep(Duration::from_secs(5));
        let listing = (
            measure(&api, plan.phase, false, plan.objects, &mut round),
            measure(&api, plan.phase, true, plan.objects, &mut round),
        );
        drop(hub);
        let watch = Running(
            Command::new(&shortwatch)
                .args(["--interval", "1s", "--watch-timeout", "1", "--jitter", "0"])
                .env("KUBECONFIG", &kubeconfig)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("shortwatch (tests/kube/build.sh builds it)"),
        );
        std::thread::sleep(Duration::from_secs(5));
        let watching = (
            measure(&api, plan.phase, false, plan.objects, &mut round),
            measure(&api, plan.phase, true, plan.objects, &mut round),
        );
        drop(watch);
        println!(
            "| {u} | {:.0} / {:.0} m | {:+.1} / {:+.1} m | {:+.1} / {:+.1} m |",
            floor.0,
            floor.1,
            listing.0 - floor.0,
            listing.1 - floor.1,
            watching.0 - floor.0,
            watching.1 - floor.1
        );
    }
}
