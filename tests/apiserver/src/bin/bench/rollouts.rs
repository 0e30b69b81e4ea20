//! Rollouts at a fleet's scale (issue 60, "Done when", the bench): one `cmpoll serve
//! --rollout 1%,10%,50%,100% --rollout-wait 10s` on the real apiserver holding M labelled
//! ConfigMaps of 2 KiB, N simulated followers (`simclient.rs`, watch) reporting as `cmpoll
//! run` does (`simreport.rs`), each with a token bound to a pod of its own: the hub names
//! follower I `fleet-agents/agent-I`, and its cohort is SHA-256 of that name (`cohort`).
//!
//! First the check that a simulated follower is served as a real one: `--sim-check` real
//! `cmpoll run` followers, then as many simulated ones of the same names, each on a fresh
//! hub through one good version; per follower the step its cohort puts it in, and the step
//! and time it got the version in each run (when each step began: the hub's `/status`).
//!
//! Then per N, each on a fresh hub (and a fresh state Secret), the followers synced first:
//! **bad** (a version each follower that receives it refuses `--confirm` seconds later, as
//! `--confirm`'s agent would: how many received it, against the first step by cohort and
//! 1 %; whether each is back on the last good version, held back, and how long that took),
//! **good** (a version no one refuses: the time until every follower holds it, against 4 ×
//! (wait + the followers' interval + confirm) + 5 s; whether a follower was ever served an
//! older content but on a rollback: every version of the object each was served is kept),
//! and its **cost**: the hub's CPU and peak RSS from the write until every follower held
//! it, against the same change on a fresh hub without `--rollout`, over a window as long:
//! `--runs` such pairs (with, then without), alternating so that both see the machine
//! alike, their medians and the ratio of the medians, each pair's ratio beside it (one
//! pair's hub CPU varies by a third between runs on a shared 2-core machine).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use test_apiserver::real::RealApiserver;

use super::apifleet::{self, NAMESPACES};
use super::hubreports::{WAIT, fleet, marked};
use super::hubs::Hubs;
use super::sidecar::apply;
use super::simclient::{Protocol, Retry, Served, Setup, Sim};
use super::simfleet::{follower, scraper_token};
use super::simreport::Refusing;

pub struct Plan {
    pub sizes: Vec<usize>,
    pub objects: usize,
    /// Real followers for the check (0: none).
    pub check: usize,
    /// How long a refusing follower's agent takes to refuse (`--confirm`'s).
    pub confirm: Duration,
    /// Good-version pairs (with a rollout, then without) per size, alternating: the
    /// hub's CPU of each, their medians and the ratio of the medians (`--runs`).
    pub runs: usize,
}

const STEPS: &str = "1%,10%,50%,100%";
const FRACTIONS: [f64; 4] = [0.01, 0.1, 0.5, 1.0];
const STEP_COUNT: usize = FRACTIONS.len();
/// `--rollout-wait`.
const STEP_WAIT: Duration = Duration::from_secs(10);
/// What the refusing followers refuse.
const REFUSE: &str = "BENCH-ROLLOUT-REFUSE";
/// The objects written: the check's, the bad version's, the good one's.
const CHECKED: usize = 9;
const BAD: usize = 7;
const GOOD: usize = 8;
/// A step's start, as `/status` shows it, may come this long after its first follower
/// got the version (the status is read every 250 ms).
const STEP_SLACK: f64 = 2.0;

/// The bound on a good version reaching every follower: 4 × (wait + the
/// followers' interval + their confirm time) + 5 s.
fn bound(plan: &Plan) -> Duration {
    (STEP_WAIT + WAIT + plan.confirm) * 4 + Duration::from_secs(5)
}

pub fn run(cmpoll: &Path, plan: &Plan) {
    let api = RealApiserver::start();
    apifleet::account_token(&api);
    apifleet::load(&api, 0, plan.objects);
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
    scraper_may_read_status(&api);
    println!(
        "rollouts: {} objects of {} B in {NAMESPACES} namespaces, {most} pod-bound tokens in {:.0}s; --rollout {STEPS} --rollout-wait {}s, followers' interval {}s, confirm {:.1}s: bound {}s; load {}",
        plan.objects,
        apifleet::BYTES,
        started.elapsed().as_secs_f64(),
        STEP_WAIT.as_secs(),
        WAIT.as_secs(),
        plan.confirm.as_secs_f64(),
        bound(plan).as_secs(),
        load()
    );
    let mut bench = Bench {
        api: &api,
        cmpoll,
        scraper,
        plan,
        round: 6_000_000,
        secrets: 0,
    };
    if plan.check > 0 {
        bench.check(&tokens[..plan.check]);
    }
    let mut rows = Vec::new();
    for &n in &plan.sizes {
        let bad = bench.bad(&tokens[..n]);
        let (mut goods, mut withouts) = (Vec::new(), Vec::new());
        for _ in 0..plan.runs.max(1) {
            let good = bench.good(&tokens[..n]);
            withouts.push(bench.without(&tokens[..n], good.window));
            goods.push(good);
        }
        rows.push((n, bad, goods, withouts));
    }
    println!();
    print_table(plan, &rows);
}

/// The run's apiserver, builds and counters.
struct Bench<'a> {
    api: &'a RealApiserver,
    cmpoll: &'a Path,
    scraper: String,
    plan: &'a Plan,
    /// The last round written.
    round: usize,
    /// State Secrets made so far (each hub gets its own: a fresh hub, a fresh state).
    secrets: usize,
}

/// The contract's cohort of a client named `name`: the first 8 bytes of SHA-256 of it,
/// big-endian, over 2^64, kept to 53 bits rounding down as `src/serve/views.rs` does
/// (below 1), computed here independently.
fn cohort(name: &str) -> f64 {
    let digest = Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) >> 11) as f64 / 2f64.powi(53)
}

/// The step (1-based) the contract puts a follower of cohort `c` in, among followers
/// whose lowest cohort is `lowest`: the first whose fraction it is below, the lowest
/// follower in the first step whatever its cohort ("each step at least one follower").
fn step_of(c: f64, lowest: f64) -> usize {
    if c <= lowest {
        return 1;
    }
    FRACTIONS
        .iter()
        .position(|f| c < *f)
        .map_or(STEP_COUNT, |k| k + 1)
}

/// Follower `i`'s name at the hub: its token's pod.
fn name(i: usize) -> String {
    format!("fleet-agents/agent-{i}")
}

/// The load average, as `uptime` prints it.
fn load() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// The scraper's token may read the hub's `/status` too.
fn scraper_may_read_status(api: &RealApiserver) {
    apply(
        api,
        vec![
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "fleet-status-reader"},
                "rules": [{"nonResourceURLs": ["/status"], "verbs": ["get"]}]}),
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "fleet-status-reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fleet-status-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": "fleet-agents"}]}),
        ],
    );
}

impl Bench<'_> {
    /// A fresh state Secret's name, which the hub's service account may keep (docs/serve.md,
    /// "Two hubs, restarts, and the state Secret"): get and update on it, create on secrets.
    fn state_secret(&mut self) -> String {
        self.secrets += 1;
        let name = format!("bench-rollouts-{}", self.secrets);
        apply(
            self.api,
            vec![
                serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": {"name": &name, "namespace": "fleet-agents"},
                    "rules": [
                        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [&name], "verbs": ["get", "update"]},
                        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]}),
                serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": &name, "namespace": "fleet-agents"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": &name},
                    "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": "fleet-agents"}]}),
            ],
        );
        name
    }

    /// The hub's rollout flags, with a fresh state Secret.
    fn rollout_flags(&mut self) -> Vec<String> {
        let state = self.state_secret();
        [
            "--rollout",
            STEPS,
            "--rollout-wait",
            &format!("{}s", STEP_WAIT.as_secs()),
            "--rollout-state",
            &format!("fleet-agents/{state}"),
        ]
        .map(str::to_string)
        .to_vec()
    }

    /// Object `i` written at a new round (its content carrying `mark`, where given): the
    /// round.
    fn write(&mut self, i: usize, mark: Option<&str>) -> u64 {
        self.round += 1;
        let o = match mark {
            Some(m) => marked(i, self.round, m),
            None => apifleet::object(i, self.round),
        };
        apply(self.api, vec![o]);
        self.round as u64
    }
}

/// When each step began (seconds after the write) and its threshold, as the hub's
/// `/status` said; the rollout gone from it (completed) counts as the last step begun.
#[derive(Default, Debug)]
struct Steps {
    began: Vec<(f64, f64)>,
    gone: bool,
    /// Per step, the most followers and holders the hub's vote counted in it.
    votes: Vec<(u64, u64)>,
}

impl Steps {
    /// Reads the hub's `/status` for object `module-I`'s rollout, at `t` after the write.
    fn read(&mut self, port: u16, dir: &Path, token: &str, object: usize, t: f64) {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "2", "--cacert"])
            .arg(dir.join("hub-ca.crt"))
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("https://127.0.0.1:{port}/status"))
            .output();
        let Ok(out) = out else { return };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            return;
        };
        let want = format!("module-{object}");
        let mine = (v["rollouts"].as_array().into_iter().flatten()).find(|r| r["name"] == want);
        match mine {
            Some(r) => {
                let step = r["step"].as_u64().unwrap_or(0) as usize;
                let below = r["below"].as_f64().unwrap_or(f64::NAN);
                while self.began.len() < step {
                    self.began.push((t, below));
                }
                for v in r["votes"].as_object().into_iter().flat_map(|m| m.values()) {
                    let k = v["step"].as_u64().unwrap_or(0) as usize;
                    if k == 0 {
                        continue;
                    }
                    if self.votes.len() < k {
                        self.votes.resize(k, (0, 0));
                    }
                    let (f, h) = (v["followers"].as_u64(), v["holding"].as_u64());
                    let e = &mut self.votes[k - 1];
                    *e = (e.0.max(f.unwrap_or(0)), e.1.max(h.unwrap_or(0)));
                }
            }
            None if !self.began.is_empty() && !self.gone => {
                self.gone = true;
                while self.began.len() < STEP_COUNT {
                    self.began.push((t, 1.0));
                }
            }
            None => {}
        }
    }

    /// The step a follower that got the version `t` after the write got it in.
    fn of(&self, t: f64) -> usize {
        self.began
            .iter()
            .filter(|(at, _)| *at <= t + STEP_SLACK)
            .count()
    }

    fn describe(&self) -> String {
        let each: Vec<String> = (self.began.iter().enumerate())
            .map(|(k, (t, below))| {
                let vote = match self.votes.get(k) {
                    Some((f, h)) => format!(", vote {h} of {f} holding"),
                    None => String::new(),
                };
                format!("step {} at {t:.1} s (below {below:?}{vote})", k + 1)
            })
            .collect();
        format!(
            "{}{}",
            each.join(", "),
            if self.gone { "; completed" } else { "" }
        )
    }
}

/// One run of the check: per follower, when it got the version (seconds after the write)
/// and whether it was ever served an older content after a newer one.
struct Checked {
    got: Vec<Option<f64>>,
    backwards: usize,
    steps: Steps,
}

impl Bench<'_> {
    /// Real followers, then as many simulated ones of the same names, each on a fresh hub
    /// through one good version; per follower, the step and time it got it in each.
    fn check(&mut self, tokens: &[String]) {
        let k = tokens.len();
        let mut runs = Vec::new();
        for who in ["real", "simulated"] {
            let l = load();
            let flags = self.rollout_flags();
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let dir = tempfile::tempdir().expect("dir");
            let hubs = Hubs::start_with(self.api, self.cmpoll, 1, "1s", dir.path(), &flags);
            let (port, _) = hubs.hub(0);
            let mut procs = Vec::new();
            let mut sim = None;
            let file = |i: usize| {
                dir.path().join(format!(
                    "out-{i}/fleet-{}/module-{CHECKED}/module-{CHECKED}.txt",
                    CHECKED % NAMESPACES
                ))
            };
            if who == "real" {
                for (i, t) in tokens.iter().enumerate() {
                    let kc = hubs.kubeconfig_to(port, t, i);
                    procs.push(follower(
                        self.cmpoll,
                        &kc,
                        &dir.path().join(format!("out-{i}")),
                    ));
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
                s.track(&format!("module-{CHECKED}"));
                sim = Some(s);
            }
            pass(&mut sim, Duration::from_secs(15));
            let r = self.write(CHECKED, None);
            let t0 = Instant::now();
            let mut steps = Steps::default();
            let mut seq: Vec<Vec<u64>> = vec![Vec::new(); k];
            let mut got: Vec<Option<f64>> = vec![None; k];
            let mut read_at = t0;
            while t0.elapsed() < bound(self.plan) + Duration::from_secs(30) {
                pass(&mut sim, Duration::from_millis(50));
                let t = t0.elapsed().as_secs_f64();
                if procs.is_empty() {
                    if let Some(s) = sim.as_ref() {
                        for (i, served) in s.served().enumerate() {
                            if got[i].is_none() {
                                got[i] = (served.iter())
                                    .find(|x| x.round == r)
                                    .map(|x| (x.at - t0).as_secs_f64());
                            }
                        }
                    }
                } else {
                    for i in 0..k {
                        let now = std::fs::read(file(i)).ok().and_then(|b| round_of(&b));
                        if let Some(now) = now
                            && seq[i].last() != Some(&now)
                        {
                            seq[i].push(now);
                            if now == r && got[i].is_none() {
                                got[i] = Some(t);
                            }
                        }
                    }
                }
                if read_at.elapsed() >= Duration::from_millis(250) {
                    steps.read(port, dir.path(), &self.scraper, CHECKED, t);
                    read_at = Instant::now();
                }
                if steps.gone && got.iter().all(Option::is_some) {
                    break;
                }
            }
            let backwards = match sim.as_ref() {
                Some(s) => s.served().filter(|v| went_back(v) > 0).count(),
                None => (seq.iter())
                    .filter(|s| s.windows(2).any(|w| w[1] < w[0]))
                    .count(),
            };
            println!(
                "  check, {k} {who} followers (load {l}): {}",
                steps.describe()
            );
            if let Some(s) = sim.as_ref() {
                println!(
                    "  (answers {:?}, broken {}; reports sent {:?})",
                    s.report.codes,
                    s.report.broken,
                    s.reports.as_ref().map(|r| r.counts.clone())
                );
            }
            runs.push(Checked {
                got,
                backwards,
                steps,
            });
            for mut p in procs {
                let _ = p.kill();
                let _ = p.wait();
            }
        }
        print_check(&runs, k);
    }
}

/// Time passes: the simulated followers run, or the real ones alone.
fn pass(sim: &mut Option<Sim>, d: Duration) {
    match sim.as_mut() {
        Some(s) => s.run_for(d),
        None => std::thread::sleep(d),
    }
}

/// A file's round: its first 8 digits (`apifleet::object`).
fn round_of(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b.get(..8)?).ok()?.parse().ok()
}

/// How many times a follower was served an older round after a newer one, not held back
/// (a rollback is served held back).
fn went_back(served: &[Served]) -> usize {
    served
        .windows(2)
        .filter(|w| w[1].round < w[0].round && !w[1].held_back)
        .count()
}

fn print_check(runs: &[Checked], k: usize) {
    let [real, sim] = runs else { return };
    println!(
        "\nthe rollouts' check: {k} real followers, then {k} simulated of the same names, each on a fresh hub: the step (1-4) and seconds after the write each got the good version"
    );
    println!(
        "| follower | cohort | step by cohort | real: step | real: s | simulated: step | simulated: s |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|a, b| cohort(&name(*a)).total_cmp(&cohort(&name(*b))));
    let lowest = (0..k).map(|i| cohort(&name(i))).fold(1.0, f64::min);
    let (mut same, mut expected) = (0, 0);
    let secs = |t: Option<f64>| t.map_or("never".into(), |t| format!("{t:.1}"));
    for i in order {
        let c = cohort(&name(i));
        let by = step_of(c, lowest);
        let rs = real.got[i].map(|t| real.steps.of(t));
        let ss = sim.got[i].map(|t| sim.steps.of(t));
        same += usize::from(rs.is_some() && rs == ss);
        expected += usize::from(rs == Some(by) && ss == Some(by));
        let step = |s: Option<usize>| s.map_or("-".into(), |s| s.to_string());
        println!(
            "| agent-{i} | {c:.6} | {by} | {} | {} | {} | {} |",
            step(rs),
            secs(real.got[i]),
            step(ss),
            secs(sim.got[i])
        );
    }
    println!(
        "same step real and simulated: {same} of {k}; both in their cohort's step: {expected} of {k}; served an older content after a newer one: real {}, simulated {}\n",
        real.backwards, sim.backwards
    );
}

/// What a bad version did.
struct Bad {
    load: String,
    /// Followers in the first step by their cohorts (1 %, or the lowest one).
    first_step: usize,
    received: usize,
    /// Of them, back on the last good version, held back, at the end.
    back: usize,
    /// Followers whose last version is the last good one, held back.
    held_back: usize,
    /// The longest from a receiver getting the bad version to its getting the good one
    /// held back; and from the write to the last of them.
    back_secs: Option<f64>,
    last_back: Option<f64>,
    went_back: usize,
    errors: u64,
}

/// What a good version did, and what it cost the hub.
struct Good {
    load: String,
    /// Seconds from the write until the first follower, 1 %, 10 %, 50 % and all held it.
    reached: [Option<f64>; 5],
    went_back: usize,
    /// The window measured: from the write until every follower held it (or the limit).
    window: Duration,
    cpu: f64,
    peak_kib: u64,
    errors: u64,
    /// The simulator's answers, broken watches, reconnects and reports, as counted.
    counts: String,
    status: String,
}

impl Bench<'_> {
    /// N followers on a fresh hub with `--rollout`, each refusing the bad version `confirm`
    /// after it came.
    fn bad(&mut self, tokens: &[String]) -> Bad {
        let n = tokens.len();
        // The last good version: clean content, written before the hub starts.
        let good = self.write(BAD, None);
        let flags = self.rollout_flags();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let refusing = Refusing {
            share: 1.0,
            marker: REFUSE.into(),
            confirm: self.plan.confirm,
        };
        let (_hubs, mut sim, _dir) =
            fleet(self.api, self.cmpoll, tokens, &flags, Some(Some(refusing)));
        sim.track(&format!("module-{BAD}"));
        let load = load();
        let bad = self.write(BAD, Some(REFUSE));
        let t0 = Instant::now();
        let settled = |sim: &Sim| {
            sim.served()
                .all(|v| v.last().is_some_and(|x| x.round == good && x.held_back))
        };
        // Three steps' waits: had the rollout gone on past the first step, the second
        // would have begun.
        let least = STEP_WAIT * 3 + Duration::from_secs(5);
        while t0.elapsed() < Duration::from_secs(180) && !(t0.elapsed() >= least && settled(&sim)) {
            sim.run_for(Duration::from_millis(250));
        }
        let first_step = (0..n).filter(|&i| cohort(&name(i)) < 0.01).count().max(1);
        let mut out = Bad {
            load,
            first_step,
            received: 0,
            back: 0,
            held_back: 0,
            back_secs: None,
            last_back: None,
            went_back: 0,
            errors: errors(&sim),
        };
        for v in sim.served() {
            out.went_back += usize::from(went_back(v) > 0);
            out.held_back += usize::from(v.last().is_some_and(|x| x.round == good && x.held_back));
            let Some(got) = v.iter().position(|x| x.round == bad) else {
                continue;
            };
            out.received += 1;
            let back = (v[got..].iter()).find(|x| x.round == good && x.held_back);
            if let (Some(b), true) = (back, v.last().is_some_and(|x| x.round == good)) {
                out.back += 1;
                let secs = (b.at - v[got].at).as_secs_f64();
                out.back_secs = Some(out.back_secs.map_or(secs, |s: f64| s.max(secs)));
                let from = (b.at - t0).as_secs_f64();
                out.last_back = Some(out.last_back.map_or(from, |s: f64| s.max(from)));
            }
        }
        println!(
            "  N={n} bad version (load {}): received by {} (first step by cohort {}, 1 % = {}), {} back on the last good version held back within {} s of getting it (the last {} s after the write); {} of {n} end held back; {} went back otherwise; answers {:?}, broken {}, reconnects {}; reports {:?}; errors {}",
            out.load,
            out.received,
            out.first_step,
            n / 100,
            out.back,
            opt(out.back_secs),
            opt(out.last_back),
            out.held_back,
            out.went_back,
            sim.report.codes,
            sim.report.broken,
            sim.report.reconnects,
            sim.reports.as_ref().map(|r| r.counts.clone()),
            out.errors
        );
        out
    }

    /// N followers on a fresh hub with `--rollout`; one good version: until every
    /// follower holds it, and the hub's CPU and peak RSS meanwhile.
    fn good(&mut self, tokens: &[String]) -> Good {
        let flags = self.rollout_flags();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (hubs, mut sim, dir) = fleet(self.api, self.cmpoll, tokens, &flags, Some(None));
        let limit = bound(self.plan) + Duration::from_secs(60);
        let g = self.change(&hubs, &mut sim, Window::Until(limit));
        let (port, _) = hubs.hub(0);
        let mut steps = Steps::default();
        steps.read(port, dir.path(), &self.scraper, GOOD, 0.0);
        let status = if steps.began.is_empty() {
            "no rollout on /status".to_string()
        } else {
            format!("still on /status: {}", steps.describe())
        };
        print_good("rollout", tokens.len(), &g);
        Good { status, ..g }
    }

    /// The same change on a fresh hub without `--rollout`, measured over `window`.
    fn without(&mut self, tokens: &[String], window: Duration) -> Good {
        let (hubs, mut sim, _dir) = fleet(self.api, self.cmpoll, tokens, &[], Some(None));
        let g = self.change(&hubs, &mut sim, Window::For(window));
        print_good("no rollout", tokens.len(), &g);
        g
    }

    /// Object GOOD written anew: when the followers held it, the hub's CPU and peak RSS
    /// (sampled every 250 ms) over the window.
    fn change(&mut self, hubs: &Hubs, sim: &mut Sim, window: Window) -> Good {
        let n = sim.served().count();
        sim.track(&format!("module-{GOOD}"));
        let (_, pid) = hubs.hub(0);
        // Every report taken first (each follower's first one, retried while a fleet
        // arrives at once: at 10,000 for a minute or so after the sync): both runs
        // measure the change alone, not the tail of the arrival.
        let settling = Instant::now();
        while sim.reports.as_ref().is_some_and(|r| !r.settled())
            && settling.elapsed() < Duration::from_secs(180)
        {
            sim.run_for(Duration::from_millis(250));
        }
        println!(
            "  (reports settled {:.1} s after the sync: {})",
            settling.elapsed().as_secs_f64(),
            sim.reports.as_ref().is_none_or(|r| r.settled())
        );
        let load = load();
        let (cpu0, rss0) = super::proc_usage(pid);
        let mut peak = rss0;
        let r = self.write(GOOD, None);
        let t0 = Instant::now();
        let holding = |sim: &Sim| {
            sim.served()
                .filter(|v| v.iter().any(|x| x.round == r))
                .count()
        };
        loop {
            sim.run_for(Duration::from_millis(250));
            peak = peak.max(test_apiserver::proc_rss_kib(pid));
            let done = match window {
                Window::Until(limit) => holding(sim) == n || t0.elapsed() >= limit,
                Window::For(d) => t0.elapsed() >= d,
            };
            if done {
                break;
            }
        }
        let window = t0.elapsed();
        let (cpu1, _) = super::proc_usage(pid);
        // Until everyone holds it (without --rollout: long before the window ends).
        while holding(sim) < n && t0.elapsed() < window + Duration::from_secs(60) {
            sim.run_for(Duration::from_millis(250));
        }
        let mut times: Vec<f64> = (sim.served())
            .filter_map(|v| v.iter().find(|x| x.round == r))
            .map(|x| (x.at - t0).as_secs_f64())
            .collect();
        times.sort_by(f64::total_cmp);
        let at = |share: f64| {
            let k = ((share * n as f64).ceil() as usize).max(1);
            times.get(k - 1).copied()
        };
        Good {
            load,
            reached: [at(0.0), at(0.01), at(0.1), at(0.5), at(1.0)],
            went_back: sim.served().filter(|v| went_back(v) > 0).count(),
            window,
            cpu: cpu1 - cpu0,
            peak_kib: peak,
            errors: errors(sim),
            counts: format!(
                "answers {:?}, broken {}, reconnects {}, relists {}; reports {:?}",
                sim.report.codes,
                sim.report.broken,
                sim.report.reconnects,
                sim.report.relists,
                sim.reports.as_ref().map(|r| r.counts.clone())
            ),
            status: String::new(),
        }
    }
}

/// How long a change is measured: until every follower holds it (at most the limit), or
/// for a set time.
#[derive(Clone, Copy)]
enum Window {
    Until(Duration),
    For(Duration),
}

/// Answers that are not 200, 304 or 429, broken connections and reports.
fn errors(sim: &Sim) -> u64 {
    (sim.report.codes.iter())
        .filter(|(c, _)| !matches!(**c, 200 | 304 | 429))
        .map(|(_, n)| *n)
        .sum::<u64>()
        + sim.report.broken
        + sim.reports.as_ref().map_or(0, |r| r.counts.broken)
}

fn opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.1}"))
}

fn print_good(label: &str, n: usize, g: &Good) {
    println!(
        "  N={n} good version, {label} (load {}): held by the first after {} s, 1 % {} s, 10 % {} s, 50 % {} s, all {} s; {} went back; hub {:.2} s CPU over {:.1} s, peak RSS {:.1} MiB; errors {}{}",
        g.load,
        opt(g.reached[0]),
        opt(g.reached[1]),
        opt(g.reached[2]),
        opt(g.reached[3]),
        opt(g.reached[4]),
        g.went_back,
        g.cpu,
        g.window.as_secs_f64(),
        g.peak_kib as f64 / 1024.0,
        g.errors,
        if g.status.is_empty() {
            String::new()
        } else {
            format!("; {}", g.status)
        }
    );
    println!("  ({})", g.counts);
}

/// The median of `xs` (the upper of the middle two when even).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

fn print_table(plan: &Plan, rows: &[(usize, Bad, Vec<Good>, Vec<Good>)]) {
    let bound = bound(plan).as_secs();
    println!(
        "| N | bad: received (first step, 1 %) | bad: back, held back | bad: back within (s) | good: all hold it (s, slowest; bound {bound}) | went back | hub CPU, rollout (median) | hub CPU, none (median) | CPU ratio (of the medians) | each pair's ratio | peak RSS, rollout | peak RSS, none | RSS ratio | load (bad; each good / none) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (n, bad, goods, nones) in rows {
        let cpu = |gs: &[Good]| median(gs.iter().map(|g| g.cpu).collect());
        let peak = |gs: &[Good]| median(gs.iter().map(|g| g.peak_kib as f64 / 1024.0).collect());
        let (good_cpu, none_cpu) = (cpu(goods), cpu(nones));
        let (good_peak, none_peak) = (peak(goods), peak(nones));
        let pairs: Vec<String> = (goods.iter().zip(nones))
            .map(|(g, x)| format!("{:.2}/{:.2} = {:.2}", g.cpu, x.cpu, g.cpu / x.cpu))
            .collect();
        let slowest = (goods.iter())
            .map(|g| g.reached[4].unwrap_or(f64::INFINITY))
            .fold(0.0, f64::max);
        let went_back: usize = goods.iter().map(|g| g.went_back).sum();
        let loads: Vec<String> = (goods.iter().zip(nones))
            .map(|(g, x)| format!("{} / {}", g.load, x.load))
            .collect();
        println!(
            "| {n} | {} ({}, {}) | {} of {} | {} | {:.1} | {} | {:.2} s | {:.2} s | {:.2} | {} | {:.1} MiB | {:.1} MiB | {:.2} | {}; {} |",
            bad.received,
            bad.first_step,
            n / 100,
            bad.back,
            bad.received,
            opt(bad.back_secs),
            slowest,
            bad.went_back + went_back,
            good_cpu,
            none_cpu,
            good_cpu / none_cpu,
            pairs.join(", "),
            good_peak,
            none_peak,
            good_peak / none_peak,
            bad.load,
            loads.join("; ")
        );
    }
}
