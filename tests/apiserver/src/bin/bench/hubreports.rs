//! What the fleet's reports, the hub's validation and its Events cost (issue 59): one
//! `cmpoll serve` on the real apiserver holding M labelled ConfigMaps of 2 KiB, N simulated
//! followers (`simclient.rs`, watch) that report what they hold as `cmpoll run` does
//! (`simreport.rs`), each with its own token bound to a pod of its own (the hub names a
//! follower by its pod).
//!
//! First the check that the simulated reports are a real follower's: `--sim-check` real
//! `cmpoll run` followers, then as many simulated ones, each against a fresh hub through
//! the same phases (sync, ten changes a second apart); the hub's `cmpoll_fleet_*` series
//! side by side (followers per state, reports by result).
//!
//! Then per N, each on a fresh hub: the hubs of `--also` builds (a build before issue 59:
//! its followers never POST), reports off (this build, the followers never POST: what
//! the hub does without reports, reading its followers' watches included) and on:
//! **idle** and **churn** (one change a second): the hub's CPU and RSS, the ratios of on
//! to off and to each other build, reports taken a second and
//! `cmpoll_fleet_reports_total` by result. Then, at the first N: **validate** (`--validate`, a validator that counts its
//! runs in a file and refuses a marker; one bad write: its runs against N) and **events**
//! (`--report-events`, a share of the followers refusing, as `--confirm`'s agent would,
//! one version: the Event writes the apiserver took, against at most one per hub per
//! object version per 10 s).

use std::path::Path;
use std::time::{Duration, Instant};

use test_apiserver::real::{RealApiserver, metric_sum};

use super::apifleet::{self, NAMESPACES};
use super::hubs::Hubs;
use super::sidecar::apply;
use super::simclient::{Protocol, Retry, Setup, Sim};
use super::simfleet::{Sample, follower, own_cpu, sample, scrape, scraper_token};
use super::simreport::Refusing;

pub struct Plan {
    pub sizes: Vec<usize>,
    pub objects: usize,
    pub phase: Duration,
    /// Real followers for the check (0: none).
    pub check: usize,
    /// The share of followers refusing in the events phase.
    pub refusing: f64,
    /// Other builds whose hubs are measured too, their followers not reporting.
    pub also: Vec<(String, std::path::PathBuf)>,
}

/// A follower's interval: its wait at the hub.
pub(super) const WAIT: Duration = Duration::from_secs(30);
/// What the validator refuses, and what the refusing followers refuse.
const BAD: &str = "BENCH-BAD-MARK";
const REFUSE: &str = "BENCH-REFUSE-MARK";

pub fn run(cmpoll: &Path, plan: &Plan) {
    let api = RealApiserver::start();
    apifleet::account_token(&api);
    apifleet::load(&api, 0, plan.objects);
    hub_may_write_events(&api);
    let most = plan
        .sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(plan.check);
    let started = Instant::now();
    let tokens = apifleet::pod_tokens(&api, most);
    let scraper = scraper_token(&api);
    println!(
        "fleet reports: {} objects of {} B in {NAMESPACES} namespaces, {most} pod-bound tokens in {:.0}s; {}s phases",
        plan.objects,
        apifleet::BYTES,
        started.elapsed().as_secs_f64(),
        plan.phase.as_secs()
    );
    let mut round = 3_000_000;
    if plan.check > 0 {
        check(
            &api,
            cmpoll,
            &tokens[..plan.check],
            &scraper,
            plan,
            &mut round,
        );
    }
    let mut rows = Vec::new();
    for &n in &plan.sizes {
        let builds = (plan.also.iter())
            .map(|(label, path)| (label.as_str(), path.as_path(), false))
            .chain([("off", cmpoll, false), ("on", cmpoll, true)]);
        for (label, build, on) in builds {
            let mut row = one(&api, build, &tokens[..n], &scraper, plan, on, &mut round);
            row.label = label.to_string();
            println!(
                "  N={n} reports {}: idle {:.0} m {} MiB, churn {:.0} m {} MiB, {:.1} reports/s idle, {:.1}/s churn; {}",
                row.label,
                row.idle_cpu * 1000.0,
                row.idle_rss >> 20,
                row.churn_cpu * 1000.0,
                row.churn_rss >> 20,
                row.idle_reports,
                row.churn_reports,
                row.results
            );
            rows.push(row);
        }
    }
    println!();
    print_table(&rows);
    if let Some(&n) = plan.sizes.first() {
        validate(&api, cmpoll, &tokens[..n], &scraper, plan, &mut round);
        events(&api, cmpoll, &tokens[..n], &scraper, plan, &mut round);
    }
}

/// The hub's service account may write core Events in the objects' namespaces.
fn hub_may_write_events(api: &RealApiserver) {
    let mut items = Vec::new();
    for k in 0..NAMESPACES {
        let ns = format!("fleet-{k}");
        items.push(serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "cmpoll-hub-events", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "get", "list"]}]}));
        items.push(serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "cmpoll-hub-events", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cmpoll-hub-events"},
            "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": "fleet-agents"}]}));
    }
    apply(api, items);
}

/// A hub, N simulated followers (reporting or not) synced on it.
pub(super) fn fleet(
    api: &RealApiserver,
    cmpoll: &Path,
    tokens: &[String],
    extra: &[&str],
    reports: Option<Option<Refusing>>,
) -> (Hubs, Sim, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    let hubs = Hubs::start_with(api, cmpoll, 1, "1s", dir.path(), extra);
    let (port, _) = hubs.hub(0);
    let mut sim = Sim::start(Setup {
        addr: format!("127.0.0.1:{port}").parse().expect("addr"),
        ca_pem: hubs.ca_pem(),
        tokens: tokens.to_vec(),
        protocol: Protocol::Watch,
        wait: WAIT,
        spread: Duration::from_secs(1),
        // A connection the hub closes (its admission under a thousand handshakes and
        // reviews at once) is made again, as a real follower does.
        reconnect: true,
        // Past 2,000, followers arrive at 500 a second (as a DaemonSet's pods come up, and
        // as `hub-cold` measures): 10,000 at once, each connecting again as soon as it is
        // closed, never let a hub started cold finish its handshakes and reviews.
        arrival: (tokens.len() > 2000).then_some(500.0),
        retry: Retry::Fixed,
    });
    if let Some(refusing) = reports {
        sim.with_reports(refusing);
    }
    let n = tokens.len();
    let t = Instant::now();
    let mut said = Instant::now();
    while sim.synced() < n && t.elapsed() < Duration::from_secs(600) {
        sim.run_for(Duration::from_millis(500));
        if said.elapsed() > Duration::from_secs(20) {
            println!("  ({} of {n} synced: {})", sim.synced(), sim.describe());
            said = Instant::now();
        }
    }
    // The first reports, taken at the hub's pace.
    sim.run_for(Duration::from_secs(10));
    (hubs, sim, dir)
}

/// One ConfigMap a second for `phase`, then 10 s more.
fn churn(api: &RealApiserver, sim: &mut Sim, plan: &Plan, round: &mut usize, phase: Duration) {
    let start = Instant::now();
    let mut k = 0usize;
    while start.elapsed() < phase {
        *round += 1;
        apply(api, vec![apifleet::object(k % plan.objects, *round)]);
        sim.changed(&format!("module-{}", k % plan.objects), *round as u64);
        k += 1;
        let next = start + Duration::from_secs(k as u64);
        sim.run_for(next.saturating_duration_since(Instant::now()));
    }
    sim.run_for(Duration::from_secs(10));
}

struct Row {
    n: usize,
    /// `on`, `off`, or another build's label.
    label: String,
    idle_cpu: f64,
    idle_rss: u64,
    churn_cpu: f64,
    churn_rss: u64,
    idle_reports: f64,
    churn_reports: f64,
    sim_cpu: f64,
    results: String,
    errors: u64,
}

fn one(
    api: &RealApiserver,
    cmpoll: &Path,
    tokens: &[String],
    scraper: &str,
    plan: &Plan,
    on: bool,
    round: &mut usize,
) -> Row {
    let (hubs, mut sim, _dir) = fleet(api, cmpoll, tokens, &[], on.then_some(None));
    let (port, pid) = hubs.hub(0);
    let ca = hubs.ca_pem();
    let taken = || {
        let m = scrape(port, &ca, scraper);
        metric_sum(&m, "cmpoll_fleet_reports_total", &[("result", "accepted")])
    };
    let (s1, t1) = (sample(pid, port, &ca, scraper), taken());
    sim.run_for(plan.phase);
    let (s2, t2) = (sample(pid, port, &ca, scraper), taken());
    let own = own_cpu();
    let start = Instant::now();
    churn(api, &mut sim, plan, round, plan.phase);
    let secs = start.elapsed().as_secs_f64();
    let (s3, t3) = (sample(pid, port, &ca, scraper), taken());
    let sim_cpu = (own_cpu() - own) / secs;
    let results = results(&scrape(port, &ca, scraper));
    println!(
        "  (answers {:?}, broken {}, reconnects {})",
        sim.report.codes, sim.report.broken, sim.report.reconnects
    );
    let errors = (sim.report.codes.iter())
        .filter(|(c, _)| !matches!(**c, 200 | 304 | 429))
        .map(|(_, n)| *n)
        .sum::<u64>()
        + sim.report.broken
        + sim.reports.as_ref().map_or(0, |r| r.counts.broken);
    if let Some(r) = &sim.reports {
        println!("  (reports sent: {:?})", r.counts);
    }
    let cpu = |a: &Sample, b: &Sample, d: f64| (b.cpu - a.cpu) / d;
    Row {
        n: tokens.len(),
        label: String::new(),
        idle_cpu: cpu(&s1, &s2, plan.phase.as_secs_f64()),
        idle_rss: s2.rss,
        churn_cpu: cpu(&s2, &s3, secs),
        churn_rss: s3.rss,
        idle_reports: (t2 - t1) / plan.phase.as_secs_f64(),
        churn_reports: (t3 - t2) / secs,
        sim_cpu,
        results,
        errors,
    }
}

/// `cmpoll_fleet_reports_total` by result, as `result=count`.
fn results(metrics: &str) -> String {
    let got: Vec<String> = (metrics.lines())
        .filter(|l| l.starts_with("cmpoll_fleet_reports_total{"))
        .filter_map(|l| {
            let (labels, v) = l.rsplit_once(' ')?;
            let r = labels.split("result=\"").nth(1)?.split('"').next()?;
            Some(format!("{r}={v}"))
        })
        .collect();
    if got.is_empty() {
        "none".into()
    } else {
        got.join(" ")
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "| N | reports | hub CPU idle | hub RSS idle | hub CPU churn | hub RSS churn | reports taken/s idle | reports taken/s churn | cmpoll_fleet_reports_total | simulator CPU churn | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} m | {:.1} MiB | {:.0} m | {:.1} MiB | {:.1} | {:.1} | {} | {:.0} m | {} |",
            r.n,
            r.label,
            r.idle_cpu * 1000.0,
            r.idle_rss as f64 / f64::from(1 << 20),
            r.churn_cpu * 1000.0,
            r.churn_rss as f64 / f64::from(1 << 20),
            r.idle_reports,
            r.churn_reports,
            r.results,
            r.sim_cpu * 1000.0,
            r.errors
        );
    }
    println!();
    println!("| N | on against | CPU idle | RSS idle | CPU churn | RSS churn |");
    println!("|---|---|---|---|---|---|");
    let ratio = |a: f64, b: f64| if a > 0.0 { b / a } else { f64::NAN };
    for on in rows.iter().filter(|r| r.label == "on") {
        for other in rows.iter().filter(|r| r.n == on.n && r.label != "on") {
            println!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                on.n,
                other.label,
                ratio(other.idle_cpu, on.idle_cpu),
                ratio(other.idle_rss as f64, on.idle_rss as f64),
                ratio(other.churn_cpu, on.churn_cpu),
                ratio(other.churn_rss as f64, on.churn_rss as f64)
            );
        }
    }
}

/// Object `i` at `round`, its content carrying `mark`.
pub(super) fn marked(i: usize, round: usize, mark: &str) -> serde_json::Value {
    let mut o = apifleet::object(i, round);
    let key = format!("module-{i}.txt");
    let text = o["data"][&key].as_str().unwrap_or_default().to_string();
    o["data"][&key] = format!("{text}\n{mark}\n").into();
    o
}

/// One bad write under `--validate`: the validator's runs for it, against N.
fn validate(
    api: &RealApiserver,
    cmpoll: &Path,
    tokens: &[String],
    scraper: &str,
    plan: &Plan,
    round: &mut usize,
) {
    let dir = tempfile::tempdir().expect("dir");
    let runs = dir.path().join("runs");
    let script = dir.path().join("validator.sh");
    std::fs::write(
        &script,
        format!(
            "echo \"$CMPOLL_MODULE $CMPOLL_HASH\" >> {}\nif grep -rq {BAD} .; then echo 'the bench refuses {BAD}'; exit 1; fi\n",
            runs.display()
        ),
    )
    .expect("validator");
    let cmd = format!("sh {}", script.display());
    let (hubs, mut sim, _d) = fleet(
        api,
        cmpoll,
        tokens,
        &["--validate", &cmd, "--validate-jobs", "2"],
        Some(None),
    );
    let (port, _) = hubs.hub(0);
    let count = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let before = count();
    *round += 1;
    apply(api, vec![marked(7, *round, BAD)]);
    sim.run_for(plan.phase.max(Duration::from_secs(20)));
    let after = count();
    let m = scrape(port, &hubs.ca_pem(), scraper);
    println!(
        "\nvalidate: {} simulated followers reporting; the validator ran {before} times for the first {} objects, then {} time(s) for one bad write ({BAD}); reports {}",
        tokens.len(),
        plan.objects + 1,
        after - before,
        results(&m)
    );
}

/// A share of the followers refuse one version (as `--confirm`'s agent would) under
/// `--report-events`: the Event writes the apiserver took for it.
fn events(
    api: &RealApiserver,
    cmpoll: &Path,
    tokens: &[String],
    scraper: &str,
    plan: &Plan,
    round: &mut usize,
) {
    let refusing = Refusing {
        share: plan.refusing,
        marker: REFUSE.into(),
        confirm: Duration::ZERO,
    };
    let (hubs, mut sim, _d) = fleet(
        api,
        cmpoll,
        tokens,
        &["--report-events"],
        Some(Some(refusing)),
    );
    let (port, _) = hubs.hub(0);
    let writes = || {
        let m = api.metrics();
        ["POST", "PATCH", "PUT"]
            .map(|v| {
                metric_sum(
                    &m,
                    "apiserver_request_total",
                    &[("resource", "events"), ("verb", v)],
                )
            })
            .map(|x| x as u64)
    };
    let w0 = writes();
    *round += 1;
    let i = 8;
    apply(api, vec![marked(i, *round, REFUSE)]);
    let t = Instant::now();
    let spell = plan.phase.max(Duration::from_secs(60));
    sim.run_for(spell);
    let w1 = writes();
    let ns = format!("fleet-{}", i % NAMESPACES);
    let listed = api.ok(&["get", "events", "-n", &ns, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&listed).unwrap_or_default();
    let about: Vec<String> = (v["items"].as_array().into_iter().flatten())
        .filter(|e| e["involvedObject"]["name"] == format!("module-{i}"))
        .map(|e| {
            format!(
                "count {} reason {} message {:?}",
                e["count"], e["reason"], e["message"]
            )
        })
        .collect();
    let m = scrape(port, &hubs.ca_pem(), scraper);
    let secs = t.elapsed().as_secs_f64();
    println!(
        "\nevents: {} simulated followers, {:.0} % refusing one version of fleet-{}/module-{i} (by: confirm); over {secs:.0} s the apiserver took {} Event creates, {} patches, {} updates (at most {:.0} writes: one per 10 s); reports {}",
        tokens.len(),
        plan.refusing * 100.0,
        i % NAMESPACES,
        w1[0] - w0[0],
        w1[1] - w0[1],
        w1[2] - w0[2],
        (secs / 10.0).ceil(),
        results(&m)
    );
    for e in about {
        println!("  event on module-{i}: {e}");
    }
}

/// The check: real followers, then as many simulated ones, each on a fresh hub through
/// sync and ten changes; the hub's `cmpoll_fleet_*` series side by side.
fn check(
    api: &RealApiserver,
    cmpoll: &Path,
    tokens: &[String],
    scraper: &str,
    plan: &Plan,
    round: &mut usize,
) {
    let mut seen = Vec::new();
    for who in ["real", "simulated"] {
        let dir = tempfile::tempdir().expect("dir");
        let hubs = Hubs::start(api, cmpoll, 1, "1s", dir.path());
        let (port, _) = hubs.hub(0);
        let mut procs = Vec::new();
        let mut sim = None;
        if who == "real" {
            for (i, t) in tokens.iter().enumerate() {
                let kc = hubs.kubeconfig_to(port, t, i);
                procs.push(follower(cmpoll, &kc, &dir.path().join(format!("out-{i}"))));
            }
        } else {
            let mut s = Sim::start(Setup {
                addr: format!("127.0.0.1:{port}").parse().expect("addr"),
                ca_pem: hubs.ca_pem(),
                tokens: tokens.to_vec(),
                protocol: Protocol::Watch,
                wait: WAIT,
                spread: Duration::from_secs(1),
                reconnect: false,
                arrival: None,
                retry: Retry::Fixed,
            });
            s.with_reports(None);
            sim = Some(s);
        }
        let mut pass = |d: Duration| match sim.as_mut() {
            Some(s) => s.run_for(d),
            None => std::thread::sleep(d),
        };
        pass(Duration::from_secs(15));
        let synced = fleet_series(&scrape(port, &hubs.ca_pem(), scraper));
        for k in 0..10 {
            *round += 1;
            apply(api, vec![apifleet::object(k % plan.objects, *round)]);
            pass(Duration::from_secs(1));
        }
        pass(Duration::from_secs(15));
        let churned = fleet_series(&scrape(port, &hubs.ca_pem(), scraper));
        seen.push((who, synced, churned));
        for mut p in procs {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
    println!(
        "\nthe reports' check: {} real followers, then {} simulated, each on a fresh hub: its cmpoll_fleet_* series after sync and after ten changes",
        tokens.len(),
        tokens.len()
    );
    println!(
        "| series | real, synced | simulated, synced | real, after changes | simulated, after changes |"
    );
    println!("|---|---|---|---|---|");
    let mut names: Vec<&String> = (seen.iter())
        .flat_map(|(_, a, b)| a.keys().chain(b.keys()))
        .collect();
    names.sort();
    names.dedup();
    let get = |m: &std::collections::BTreeMap<String, String>, k: &str| {
        m.get(k).cloned().unwrap_or_else(|| "-".into())
    };
    if let [(_, rs, rc), (_, ss, sc)] = seen.as_slice() {
        for k in names {
            println!(
                "| `{k}` | {} | {} | {} | {} |",
                get(rs, k),
                get(ss, k),
                get(rc, k),
                get(sc, k)
            );
        }
    }
    println!();
}

/// The hub's `cmpoll_fleet_*` samples, by series.
fn fleet_series(metrics: &str) -> std::collections::BTreeMap<String, String> {
    (metrics.lines())
        .filter(|l| l.starts_with("cmpoll_fleet_"))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
