//! The crossover of `--list-mode`: with how many changed objects per poll do a metadata list
//! and one GET per change cost more than one full list?
//!
//! Measured on cmpoll itself, not modelled: the daemon polls every 100 ms while the bench
//! changes `k` objects (a fresh block each time, so no change is seen twice) right after
//! each poll's list; per poll, cmpoll's CPU (from /proc) and the bytes and requests the
//! apiserver served (from its log). Metadata polls are measured at k = 0, 8 and 32 (below
//! cmpoll's own switch to a full list) and full polls at k = 0 and 32; each is a straight
//! line in k (one more GET per change; one more parsed item per change), and where the lines
//! cross is the crossover. Bytes cross where the metadata list plus k GETs outweigh the full
//! list.

use std::path::Path;
use std::time::{Duration, Instant};

use test_apiserver::{Kubeconfig, TestApiserver};

use super::{daemon, lists_so_far, mb, proc_usage, wait_lists};

/// Per poll: cmpoll CPU (ms), bytes served, requests.
#[derive(Clone, Copy, Debug)]
struct PerPoll {
    cpu_ms: f64,
    bytes: f64,
    requests: f64,
}

/// Object `i`, changed (same size) for round `round`.
fn changed(i: usize, size: usize, round: usize) -> test_apiserver::ConfigMap {
    let mut cm = test_apiserver::generated(i, size, 20);
    if let Some(v) = cm.data.get_mut("config.alloy") {
        let mark = format!("#{round:07}\n");
        let n = mark.len().min(v.len());
        v.replace_range(..n, &mark[..n]);
    }
    cm
}

fn changing(
    server: &TestApiserver,
    cmpoll: &Path,
    kubeconfig: &Path,
    mode: &str,
    k: usize,
    polls: usize,
    (n, size): (usize, usize),
) -> PerPoll {
    server.clear_requests();
    let args = ["--interval", "100ms", "--jitter", "0", "--list-mode", mode];
    let mut child = daemon(cmpoll, kubeconfig, &args).spawn().unwrap();
    wait_lists(server, 5);
    let (cpu0, _) = proc_usage(child.id());
    let from = server.requests().len();
    let start = lists_so_far(server);
    let (mut seen, mut next, mut round) = (start, 0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(600);
    while lists_so_far(server) < start + polls {
        assert!(Instant::now() < deadline, "the daemon stopped polling");
        let l = lists_so_far(server);
        if l > seen {
            seen = l;
            round += 1;
            for _ in 0..k {
                server.put(changed(next % n, size, round));
                next += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (cpu1, _) = proc_usage(child.id());
    let _ = child.kill();
    let _ = child.wait();
    let reqs = server.requests();
    let mine = &reqs[from..];
    let per = |x: f64| x / polls as f64;
    PerPoll {
        cpu_ms: per(cpu1 - cpu0) * 1e3,
        bytes: per(mine.iter().map(|r| r.bytes as f64).sum()),
        requests: per(mine.len() as f64),
    }
}

/// The straight line through (x0, y0) and (x1, y1): (value at 0, slope).
fn line(x0: f64, y0: f64, x1: f64, y1: f64) -> (f64, f64) {
    let slope = (y1 - y0) / (x1 - x0);
    (y0 - slope * x0, slope)
}

/// Where a + b k = c + d k, if ahead.
fn cross((a, b): (f64, f64), (c, d): (f64, f64)) -> Option<f64> {
    (b > d).then(|| (c - a) / (b - d)).filter(|k| *k >= 0.0)
}

/// The table: for each object size, the cost of each mode and where they cross.
pub fn run(cmpoll: &Path, cases: &[(usize, usize)], polls: usize) {
    println!("crossover of --list-mode (per poll; k = objects changed since the last poll):");
    println!(
        "  {:>7} {:>6}  {:>22}  {:>22}  {:>19}  {:>21}  {:>21}",
        "size",
        "N",
        "full: cpu / bytes",
        "metadata: cpu / bytes",
        "per GET: cpu / bytes",
        "crossover by bytes",
        "crossover by cpu"
    );
    for &(size, n) in cases {
        let server = TestApiserver::start();
        server.bulk_load(n, size, 20);
        let dir = tempfile::tempdir().unwrap();
        let kc = server.write_kubeconfig(&dir.path().join("kubeconfig"), &Kubeconfig::token());
        let m = |mode, k| changing(&server, cmpoll, &kc, mode, k, polls, (n, size));
        let (f0, f32_) = (m("full", 0), m("full", 32));
        let (m0, m8, m32) = (m("metadata", 0), m("metadata", 8), m("metadata", 32));
        // Changes per poll as the metadata polls saw them: their GETs (a change that lands
        // while a poll runs may be seen with the next one).
        let gets = |p: PerPoll| p.requests - 1.0;
        assert!(
            gets(m32) > 24.0 && gets(m0) < 1.0,
            "metadata polls made about one GET per change: {m0:?} {m32:?}"
        );
        let full_cpu = line(0.0, f0.cpu_ms, 32.0, f32_.cpu_ms);
        // Least squares through the three metadata points, against the GETs made.
        let xs = [gets(m0), gets(m8), gets(m32)];
        let ys = [m0.cpu_ms, m8.cpu_ms, m32.cpu_ms];
        let (mx, my) = (xs.iter().sum::<f64>() / 3.0, ys.iter().sum::<f64>() / 3.0);
        let slope = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| (x - mx) * (y - my))
            .sum::<f64>()
            / xs.iter().map(|x| (x - mx).powi(2)).sum::<f64>();
        let meta_cpu = (my - slope * mx, slope);
        let get_bytes = (m32.bytes - m0.bytes) / (gets(m32) - gets(m0));
        let by_bytes = cross((m0.bytes, get_bytes), (f0.bytes, 0.0));
        let by_cpu = cross(meta_cpu, full_cpu);
        let share = |k: Option<f64>| match k {
            Some(k) => format!("k = {:.0} ({:.1}%)", k, 100.0 * k / n as f64),
            None => "never".into(),
        };
        println!(
            "  {:>7} {:>6}  {:>8.2} ms / {:>9}  {:>8.2} ms / {:>9}  {:>6.3} ms / {:>8}  {:>21}  {:>21}",
            format!("{size} B"),
            n,
            f0.cpu_ms,
            mb(f0.bytes as u64),
            m0.cpu_ms,
            mb(m0.bytes as u64),
            meta_cpu.1,
            format!("{:.0} B", get_bytes),
            share(by_bytes),
            share(by_cpu),
        );
    }
}
