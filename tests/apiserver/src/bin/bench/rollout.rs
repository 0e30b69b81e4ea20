//! A rolling update of two hubs under a simulated fleet (issue 49.3), and what the hubs'
//! reviews cost the apiserver over it, without and with the review opt-ins of issue 49.2
//! (`--token-audience`, `--authorize-per-service-account`).
//!
//! Per variant, on the real apiserver holding M labelled ConfigMaps: two `cmpoll serve`
//! (1 s) behind a balancer that sends new connections to the hubs whose `/readyz` says
//! ready (asked every half second, as a Service's endpoints follow readiness); N simulated
//! followers (`simclient.rs`: each its own token — for the hub's audience in the opt-in
//! variant — and connection, holding a watch, connecting again as a real follower does
//! when a hub lets it go or is gone). Phases: sync; idle 60 s (the floor: the apiserver's
//! CPU with the hubs and the fleet idle); the rollout — each hub in turn told to stop
//! (SIGTERM: it drains over its 15 s window), started again and ready, as a Deployment's
//! rolling update with `maxUnavailable: 0` replaces pods — while one ConfigMap changes
//! every 2 s, then 30 s more. Reported: the apiserver's CPU over the rollout's first 60 s
//! beside the floor, the TokenReviews and SubjectAccessReviews it was sent (its audit
//! log), every change's time to the last follower (at most twice a follower's 30 s
//! interval), and changes seen going back (an event older than one a follower held).

use std::path::Path;
use std::time::{Duration, Instant};

use test_apiserver::real::RealApiserver;

use super::apifleet;
use super::hubs::Hubs;
use super::sidecar::apply;
use super::simclient::{Protocol, Retry, Setup, Sim};

pub struct Plan {
    pub n: usize,
    pub objects: usize,
}

/// A follower's interval: its wait at the hub.
const WAIT: Duration = Duration::from_secs(30);
const AUDIENCE: &str = "cmpoll-hub";

struct Row {
    name: &'static str,
    floor_m: f64,
    rollout_m: f64,
    token_reviews: usize,
    access_reviews: usize,
    rollout_secs: f64,
    changes: usize,
    worst_lag: f64,
    missed: usize,
    backwards: u64,
    reconnects: u64,
    relists: u64,
}

pub fn run(cmpoll: &Path, plan: &Plan) {
    let api = RealApiserver::start();
    apifleet::account_token(&api);
    apifleet::load(&api, 0, plan.objects);
    println!(
        "hub rollout: {} followers (simulated, held watches, {}s interval), {} objects; two hubs behind a readiness-aware balancer; each restarted in turn (SIGTERM, 15 s drain) while one ConfigMap changes every 2 s",
        plan.n,
        WAIT.as_secs(),
        plan.objects
    );
    let mut rows = Vec::new();
    let mut round = 2_000_000;
    for (name, opt_in) in [("reviews (default)", false), ("opt-ins", true)] {
        rows.push(one(&api, cmpoll, plan, name, opt_in, &mut round));
    }
    println!();
    println!(
        "| hubs' reviews | apiserver CPU idle (floor) | over the rollout's first 60 s | + over the floor | TokenReviews | SubjectAccessReviews | rollout | changes | slowest change to the last follower | missed | going back | reconnects | relists |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.0} m | {:.0} m | {:+.0} m | {} | {} | {:.0} s | {} | {:.1} s | {} | {} | {} | {} |",
            r.name,
            r.floor_m,
            r.rollout_m,
            r.rollout_m - r.floor_m,
            r.token_reviews,
            r.access_reviews,
            r.rollout_secs,
            r.changes,
            r.worst_lag,
            r.missed,
            r.backwards,
            r.reconnects,
            r.relists
        );
    }
}

fn apiserver_cpu(api: &RealApiserver) -> f64 {
    super::proc_usage(api.apiserver_pid()).0
}

/// TokenReviews and SubjectAccessReviews the apiserver was sent since `mark`.
fn reviews(api: &RealApiserver, mark: u64) -> (usize, usize) {
    let events = api.audit_since(mark);
    let count = |resource: &str| {
        (events.iter())
            .filter(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["resource"] == resource
                    && e["stage"] == "ResponseComplete"
            })
            .count()
    };
    (count("tokenreviews"), count("subjectaccessreviews"))
}

fn one(
    api: &RealApiserver,
    cmpoll: &Path,
    plan: &Plan,
    name: &'static str,
    opt_in: bool,
    round: &mut usize,
) -> Row {
    let n = plan.n;
    let tokens = super::simfleet::tokens_for(api, n, opt_in.then_some(AUDIENCE));
    let dir = tempfile::tempdir().expect("dir");
    let extra: &[&str] = match opt_in {
        true => &[
            "--token-audience",
            AUDIENCE,
            "--authorize-per-service-account",
        ],
        false => &[],
    };
    let mut hubs = Hubs::start_with(api, cmpoll, 2, "1s", dir.path(), extra);
    hubs.probing();
    let mut sim = Sim::start(Setup {
        addr: format!("127.0.0.1:{}", hubs.port).parse().expect("addr"),
        ca_pem: hubs.ca_pem(),
        tokens,
        protocol: Protocol::Watch,
        wait: WAIT,
        spread: Duration::from_secs(1),
        reconnect: true,
        arrival: None,
        retry: Retry::Fixed,
    });
    let t = Instant::now();
    while sim.synced() < n && t.elapsed() < Duration::from_secs(600) {
        sim.run_for(Duration::from_millis(500));
    }
    println!(
        "  {name}: {} of {n} synced in {:.0} s",
        sim.synced(),
        t.elapsed().as_secs_f64()
    );
    sim.run_for(Duration::from_secs(10));
    // The floor: everything idle.
    let (c0, at0) = (apiserver_cpu(api), Instant::now());
    sim.run_for(Duration::from_secs(60));
    let floor = (apiserver_cpu(api) - c0) / at0.elapsed().as_secs_f64();
    // The rollout, under churn.
    let mark = api.audit_mark();
    let (c1, start) = (apiserver_cpu(api), Instant::now());
    let mut window_cpu = None;
    let mut writes: Vec<(String, u64, Instant)> = Vec::new();
    let mut step = 0usize; // hub being replaced: 0, 1; 2 = done
    let mut stage = 0u8; // 0: tell it to stop, 1: wait for its exit, 2: wait until ready
    let mut done_at = None;
    let mut next_write = start;
    let mut k = 0usize;
    loop {
        let now = Instant::now();
        if window_cpu.is_none() && now.duration_since(start) >= Duration::from_secs(60) {
            window_cpu = Some((apiserver_cpu(api) - c1) / now.duration_since(start).as_secs_f64());
        }
        if done_at.is_some_and(|d: Instant| now.duration_since(d) >= Duration::from_secs(30))
            && window_cpu.is_some()
        {
            break;
        }
        if now >= next_write
            && done_at.is_none_or(|d| now.duration_since(d) < Duration::from_secs(20))
        {
            let i = k % plan.objects;
            *round += 1;
            apply(api, vec![apifleet::object(i, *round)]);
            let name = format!("module-{i}");
            sim.changed(&name, *round as u64);
            writes.push((name, *round as u64, Instant::now()));
            k += 1;
            next_write = start + Duration::from_secs(2 * k as u64);
        }
        if step < hubs.count() {
            match stage {
                0 => {
                    hubs.terminate(step);
                    stage = 1;
                }
                1 if hubs.exited(step) => {
                    hubs.respawn(step);
                    stage = 2;
                }
                2 if hubs.is_ready(step) => {
                    println!(
                        "  {name}: hub {step} replaced after {:.0} s",
                        start.elapsed().as_secs_f64()
                    );
                    step += 1;
                    stage = 0;
                    if step == hubs.count() {
                        done_at = Some(Instant::now());
                    }
                }
                _ => {}
            }
        }
        sim.run_for(Duration::from_millis(200));
    }
    sim.run_for(Duration::from_secs(30));
    let rollout_secs = done_at.map_or(0.0, |d| d.duration_since(start).as_secs_f64());
    let (token_reviews, access_reviews) = reviews(api, mark);
    let mut worst_lag = 0.0f64;
    let mut missed = 0;
    for (name, r, at) in &writes {
        let times: Vec<f64> = (sim.seen())
            .filter_map(|s| s.get(&(name.clone(), *r)))
            .map(|t| t.saturating_duration_since(*at).as_secs_f64())
            .collect();
        missed += n - times.len();
        worst_lag = times.iter().copied().fold(worst_lag, f64::max);
    }
    println!("  {name}: {:?}", sim.report);
    let report = sim.report.clone();
    drop(sim);
    drop(hubs);
    Row {
        name,
        floor_m: floor * 1000.0,
        rollout_m: window_cpu.unwrap_or(0.0) * 1000.0,
        token_reviews,
        access_reviews,
        rollout_secs,
        changes: writes.len(),
        worst_lag,
        missed,
        backwards: report.backwards,
        reconnects: report.reconnects,
        relists: report.relists,
    }
}
