//! A cold hub admitting its fleet (issue 56.8): on the real apiserver, N simulated
//! followers (`simclient.rs`: each its own token from TokenRequest, as each pod has its
//! own, and its own connection, holding a watch once listed) arrive at a rate (`--arrival`,
//! a second) at a `cmpoll serve` that just started, and retry as `cmpoll run` does when
//! told to wait. Per contender — this build's hub with this build's followers (a hub's 429
//! waited as told); with `--baseline PATH`, this hub with the followers of before (a 429 a
//! failed poll: their interval of 30 s, doubling) and the older hub with those followers —
//! from the hub's start (its process started): when the first follower had listed, half,
//! 99 % and all of them, how many had not within the limit, the 429s they were told, the
//! TokenReviews and SubjectAccessReviews the apiserver was sent, the hub's CPU and peak
//! resident memory.

use std::path::Path;
use std::time::{Duration, Instant};

use test_apiserver::real::{RealApiserver, metric_sum};

use super::apifleet;
use super::hubs::Hubs;
use super::simclient::{Protocol, Retry, Setup, Sim};
use super::simfleet;

pub struct Plan {
    pub n: usize,
    pub arrival: f64,
    pub objects: usize,
    /// How long a run may take before the followers not listed are counted as such.
    pub limit: Duration,
}

/// A follower's interval (its backoff starts there).
const INTERVAL: Duration = Duration::from_secs(30);

struct Row {
    name: String,
    ready: f64,
    /// Seconds from the hub's start: first, 50 %, 99 %, last listed.
    listed: [Option<f64>; 4],
    missing: usize,
    told: u64,
    /// Why the hub told them (`cmpoll_serve_turned_away_total{why}`), the largest first.
    why: String,
    token_reviews: f64,
    access_reviews: f64,
    cpu: f64,
    hwm: u64,
}

pub fn run(cmpoll: &Path, baseline: Option<&Path>, plan: &Plan) {
    let api = RealApiserver::start();
    apifleet::account_token(&api);
    apifleet::load(&api, 0, plan.objects);
    let started = Instant::now();
    let tokens = simfleet::tokens_for(&api, plan.n, None);
    let scraper = simfleet::scraper_token(&api);
    println!(
        "a cold hub's fleet: {} followers (each its own token: {:.0}s to make) arriving at {}/s at a hub that just started; {} objects; each run at most {}s",
        plan.n,
        started.elapsed().as_secs_f64(),
        plan.arrival,
        plan.objects,
        plan.limit.as_secs()
    );
    let backoff = Retry::Backoff { interval: INTERVAL };
    let mut runs: Vec<(String, &Path, Retry)> = vec![(
        "this hub, followers waiting as told".into(),
        cmpoll,
        Retry::Told { interval: INTERVAL },
    )];
    if let Some(b) = baseline {
        runs.push((
            "this hub, followers backing off (before)".into(),
            cmpoll,
            backoff,
        ));
        runs.push(("hub and followers before (--baseline)".into(), b, backoff));
    }
    let mut rows = Vec::new();
    for (name, bin, retry) in runs {
        let row = one(&api, bin, (&tokens, &scraper), plan, name, retry);
        print_row(&row);
        rows.push(row);
    }
    println!();
    println!(
        "| N at /s | hub, followers | hub ready | first / 50 % / 99 % / all listed | not listed | told to wait (429): why | TokenReviews | SubjectAccessReviews | hub CPU | hub peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let s = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
        println!(
            "| {} at {} | {} | {:.1} s | {} / {} / {} / {} s | {} | {}: {} | {:.0} | {:.0} | {:.1} s | {} MiB |",
            plan.n,
            plan.arrival,
            r.name,
            r.ready,
            s(r.listed[0]),
            s(r.listed[1]),
            s(r.listed[2]),
            s(r.listed[3]),
            r.missing,
            r.told,
            r.why,
            r.token_reviews,
            r.access_reviews,
            r.cpu,
            r.hwm >> 20,
        );
    }
}

fn reviews(api: &RealApiserver, resource: &str) -> f64 {
    api.metric("apiserver_request_total", &[("resource", resource)])
}

fn one(
    api: &RealApiserver,
    bin: &Path,
    (tokens, scraper): (&[String], &str),
    plan: &Plan,
    name: String,
    retry: Retry,
) -> Row {
    let n = tokens.len();
    let dir = tempfile::tempdir().expect("dir");
    let (tr, sar) = (
        reviews(api, "tokenreviews"),
        reviews(api, "subjectaccessreviews"),
    );
    let started = Instant::now();
    let hubs = Hubs::start(api, bin, 1, "1s", dir.path());
    let ready = started.elapsed().as_secs_f64();
    let (port, pid) = hubs.hub(0);
    let mut sim = Sim::start(Setup {
        addr: format!("127.0.0.1:{port}").parse().expect("addr"),
        ca_pem: hubs.ca_pem(),
        tokens: tokens.to_vec(),
        protocol: Protocol::Watch,
        wait: INTERVAL,
        spread: Duration::ZERO,
        reconnect: true,
        arrival: Some(plan.arrival),
        retry,
    });
    let mut said = Instant::now();
    let all = |sim: &Sim| sim.listed().iter().all(Option::is_some);
    while !all(&sim) && started.elapsed() < plan.limit {
        sim.run_for(Duration::from_millis(250));
        if said.elapsed() > Duration::from_secs(10) {
            let listed = sim.listed().iter().filter(|l| l.is_some()).count();
            println!(
                "  ({name}: {listed} of {n} listed after {:.0}s)",
                started.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
    }
    // The watches they open once listed, and their reviews, before the counts.
    sim.run_for(Duration::from_secs(3));
    let (cpu, hwm) = usage(pid);
    let metrics = simfleet::scrape(port, &hubs.ca_pem(), scraper);
    let mut why: Vec<(f64, &str)> = ([
        "queue",
        "signed",
        "reviews",
        "renewals",
        "access",
        "access_all",
    ]
    .iter())
    .map(|w| {
        (
            metric_sum(&metrics, "cmpoll_serve_turned_away_total", &[("why", w)]),
            *w,
        )
    })
    .filter(|(n, _)| *n > 0.0)
    .collect();
    why.sort_by(|a, b| b.0.total_cmp(&a.0));
    let why = (why.iter().map(|(n, w)| format!("{w} {n:.0}")))
        .collect::<Vec<_>>()
        .join(", ");
    let mut at: Vec<f64> = (sim.listed().iter())
        .flatten()
        .map(|t| t.saturating_duration_since(started).as_secs_f64())
        .collect();
    at.sort_by(f64::total_cmp);
    let q = |p: f64| -> Option<f64> {
        let need = ((n as f64 * p).ceil() as usize).max(1);
        at.get(need - 1).copied()
    };
    let row = Row {
        name,
        ready,
        listed: [q(0.0), q(0.5), q(0.99), q(1.0)],
        missing: n - at.len(),
        told: sim.report.codes.get(&429).copied().unwrap_or(0),
        why,
        token_reviews: reviews(api, "tokenreviews") - tr,
        access_reviews: reviews(api, "subjectaccessreviews") - sar,
        cpu,
        hwm,
    };
    drop(sim);
    drop(hubs);
    row
}

/// A process's CPU seconds and peak resident memory.
fn usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = (status.lines())
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    ((ticks(11) + ticks(12)) / 100.0, hwm * 1024)
}

fn print_row(r: &Row) {
    let s = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}s"));
    println!(
        "  {}: hub ready {:.1}s; listed first {}, 50% {}, 99% {}, all {} ({} not); {} told to wait ({}); {:.0} TokenReviews, {:.0} SubjectAccessReviews; hub CPU {:.1}s, peak {} MiB",
        r.name,
        r.ready,
        s(r.listed[0]),
        s(r.listed[1]),
        s(r.listed[2]),
        s(r.listed[3]),
        r.missing,
        r.told,
        r.why,
        r.token_reviews,
        r.access_reviews,
        r.cpu,
        r.hwm >> 20
    );
}
