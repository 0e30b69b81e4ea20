//! Fleet scale: many cmpoll processes (a DaemonSet's worth, scaled down to this machine)
//! polling one test apiserver with jitter, and what the apiserver had to serve: requests
//! and bytes per second, the share served from the watch cache, the busiest second, and
//! each instance's CPU and RSS, for full and metadata lists. From the per-poll figures it
//! then states the cost of a 5,000-node DaemonSet polling every 30 s, beside 5,000 watches.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_apiserver::{Kubeconfig, Route, TestApiserver};

use super::{mb, mib, proc_usage};

pub struct Fleet {
    pub instances: usize,
    pub objects: usize,
    pub size: usize,
    pub seconds: u64,
    /// Objects changed per second while the fleet polls.
    pub changes_per_second: usize,
}

struct Measured {
    requests_per_s: f64,
    bytes_per_s: f64,
    cache_share: f64,
    busiest_second: usize,
    cpu_millicores: f64,
    rss_kib: u64,
    list_bytes: f64,
    get_bytes: f64,
}

fn spawn(cmpoll: &Path, kubeconfig: &Path, mode: &str) -> Child {
    Command::new(cmpoll)
        .args([
            "run",
            "--interval",
            "1s",
            "--jitter",
            "0.5",
            "--list-mode",
            mode,
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cmpoll")
}

fn measure(server: &TestApiserver, cmpoll: &Path, kc: &Path, f: &Fleet, mode: &str) -> Measured {
    let mut fleet: Vec<Child> = (0..f.instances).map(|_| spawn(cmpoll, kc, mode)).collect();
    // Every instance's first (full) list done, then a few polls in their stride.
    std::thread::sleep(Duration::from_secs(5));
    server.clear_requests();
    let cpu0: Vec<f64> = fleet.iter().map(|c| proc_usage(c.id()).0).collect();
    let start = Instant::now();
    let mut changed = 0usize;
    let mut round = 0usize;
    while start.elapsed() < Duration::from_secs(f.seconds) {
        round += 1;
        for _ in 0..f.changes_per_second {
            let mut cm = test_apiserver::generated(changed % f.objects, f.size, 20);
            cm.data.insert("round".into(), round.to_string());
            server.put(cm);
            changed += 1;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let took = start.elapsed().as_secs_f64();
    let usage: Vec<(f64, u64)> = fleet.iter().map(|c| proc_usage(c.id())).collect();
    for c in &mut fleet {
        let _ = c.kill();
    }
    for c in &mut fleet {
        let _ = c.wait();
    }
    let reqs = server.requests();
    let t0 = reqs.first().map(|r| r.at).unwrap_or_else(Instant::now);
    let mut per_second = vec![0usize; f.seconds as usize + 2];
    for r in &reqs {
        let s = r.at.saturating_duration_since(t0).as_secs() as usize;
        if let Some(slot) = per_second.get_mut(s) {
            *slot += 1;
        }
    }
    let lists: Vec<_> = reqs.iter().filter(|r| r.is_list()).collect();
    let gets: Vec<_> = reqs.iter().filter(|r| !r.is_list()).collect();
    let avg = |v: &[&test_apiserver::Recorded]| {
        v.iter().map(|r| r.bytes as f64).sum::<f64>() / v.len().max(1) as f64
    };
    let cpu: f64 = usage
        .iter()
        .zip(&cpu0)
        .map(|((c, _), c0)| c - c0)
        .sum::<f64>();
    Measured {
        requests_per_s: reqs.len() as f64 / took,
        bytes_per_s: reqs.iter().map(|r| r.bytes as f64).sum::<f64>() / took,
        cache_share: reqs.iter().filter(|r| r.route == Route::Cache).count() as f64
            / reqs.len().max(1) as f64,
        busiest_second: per_second.iter().copied().max().unwrap_or(0),
        cpu_millicores: cpu / took / f.instances as f64 * 1000.0,
        rss_kib: usage.iter().map(|(_, r)| r).sum::<u64>() / f.instances.max(1) as u64,
        list_bytes: avg(&lists),
        get_bytes: avg(&gets),
    }
}

pub fn run(cmpoll: &Path, f: &Fleet) {
    let server = TestApiserver::start();
    server.bulk_load(f.objects, f.size, 20);
    let dir = tempfile::tempdir().unwrap();
    let kc = server.write_kubeconfig(&dir.path().join("kubeconfig"), &Kubeconfig::token());
    println!(
        "fleet: {} cmpolls at --interval 1s --jitter 0.5, {} ConfigMaps x {} B, {} change(s)/s, {} s:",
        f.instances, f.objects, f.size, f.changes_per_second, f.seconds
    );
    println!(
        "  {:<10} {:>10} {:>12} {:>11} {:>15} {:>14} {:>12}",
        "list mode",
        "req/s",
        "bytes/s",
        "from cache",
        "busiest second",
        "CPU/instance",
        "RSS/instance"
    );
    let mut by_mode = Vec::new();
    for mode in ["full", "metadata"] {
        let m = measure(&server, cmpoll, &kc, f, mode);
        println!(
            "  {:<10} {:>10.1} {:>10}/s {:>10.0}% {:>11} req {:>11.1} mc {:>12}",
            mode,
            m.requests_per_s,
            mb(m.bytes_per_s as u64),
            m.cache_share * 100.0,
            m.busiest_second,
            m.cpu_millicores,
            mib(m.rss_kib),
        );
        by_mode.push((mode, m));
    }
    // Scaled to a 5,000-node DaemonSet polling every 30 s with the same list and change rate.
    let (nodes, interval) = (5000.0, 30.0);
    let changes = f.changes_per_second as f64;
    println!(
        "  scaled: {nodes:.0} nodes, every {interval:.0} s, {changes} change(s)/s in the selection:"
    );
    for (mode, m) in &by_mode {
        let polls = nodes / interval;
        let (req, bytes) = if *mode == "full" {
            (polls, polls * m.list_bytes)
        } else {
            // Each node GETs each changed object once.
            (
                polls + changes * nodes,
                polls * m.list_bytes + changes * nodes * m.get_bytes,
            )
        };
        println!(
            "    {mode:<9} polls: {req:>8.0} req/s, {:>10}/s, all from the watch cache",
            mb(bytes as u64)
        );
    }
    let object = by_mode
        .iter()
        .find(|(m, _)| *m == "metadata")
        .map_or(f.size as f64, |(_, m)| m.get_bytes);
    println!(
        "    watches:        {nodes:.0} open connections, {:>8.0} events/s, {:>10}/s (one event per change per watcher), plus a full list per watcher at every start and relist",
        changes * nodes,
        mb((changes * nodes * object) as u64)
    );
}
