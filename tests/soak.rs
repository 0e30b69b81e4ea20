//! The soak: ~1,000 ConfigMaps under random churn (adds, updates, label flips, deletes,
//! metadata-only edits) and random apiserver faults, against a daemon writing a folder and
//! feeding an agent. Ignored by default; run it with
//!
//! ```text
//! SOAK_SECS=600 cargo test --release --test tests soak -- --ignored --nocapture
//! ```
//!
//! (`SOAK_SEED` replays a run, `SOAK_ARGS` adds daemon flags, e.g. `--metadata-first`.)
//! At the end the folder equals the cluster, the agent's replayed stdin equals the cluster,
//! RSS did not grow after the warm-up and no file descriptor leaked; the figures are printed.
//! Loopback only, bounded in time and requests (one poll per 100 ms).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use test_apiserver::{ConfigMap, Fault, Match, TestApiserver};

use crate::util::{Cmpoll, agent_env, eventually, lines, recording_agent, tree};

/// xorshift64*: reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What the cluster should show as modules: `ns/name` → (key → content).
type Modules = BTreeMap<String, BTreeMap<String, String>>;

fn rss_and_fds(pid: u32) -> (u64, usize) {
    (
        test_apiserver::proc_rss_kib(pid),
        test_apiserver::proc_fds(pid),
    )
}

/// The folder as modules: `DIR/ns/name/key`.
fn folder(dir: &Path) -> Modules {
    let mut out = Modules::new();
    for (path, text) in tree(dir) {
        let mut parts = path.splitn(3, '/');
        if let (Some(ns), Some(name), Some(key)) = (parts.next(), parts.next(), parts.next()) {
            out.entry(format!("{ns}/{name}"))
                .or_default()
                .insert(key.to_string(), text);
        }
    }
    out
}

/// The agent's stdin replayed: each start begins from nothing.
fn replayed(log: &Path) -> Modules {
    let mut out = Modules::new();
    for line in lines(log) {
        let e: serde_json::Value = serde_json::from_str(&line).unwrap();
        match e["type"].as_str().unwrap() {
            "start" => out.clear(),
            "added" | "updated" => {
                let files = e["files"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect();
                out.insert(e["module"].as_str().unwrap().to_string(), files);
            }
            "removed" => {
                out.remove(e["module"].as_str().unwrap());
            }
            _ => {}
        }
    }
    out
}

#[test]
#[ignore = "a 10-minute soak: SOAK_SECS=600 cargo test --release --test tests soak -- --ignored --nocapture"]
fn soak_under_churn_and_faults() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let extra = std::env::var("SOAK_ARGS").unwrap_or_default();
    println!("soak: {secs} s, seed {seed}, extra flags {extra:?}");
    let mut rng = Rng(seed);
    let s = TestApiserver::start();
    // The cluster as the test wants it: name → (selected?, value).
    let mut want: BTreeMap<(String, String), (bool, String)> = BTreeMap::new();
    let put = |s: &TestApiserver, ns: &str, name: &str, on: bool, v: &str, note: u64| {
        let cm = ConfigMap::new(ns, name)
            .label("cmpoll.io/module", if on { "true" } else { "false" })
            .annotation("soak/edit", &note.to_string())
            .data("config.alloy", v);
        s.put(cm);
    };
    for i in 0..1000 {
        let (ns, name) = (format!("team-{}", i % 10), format!("m{i:04}"));
        put(&s, &ns, &name, true, &format!("v0-{i}"), 0);
        want.insert((ns, name), (true, format!("v0-{i}")));
    }
    let c = Cmpoll::against(&s);
    let c = agent_env(c);
    let logs = c.path("logs");
    let agent = recording_agent(&c);
    let out = c.out();
    let mut args = vec![
        "--interval",
        "100ms",
        "--timeout",
        "2s",
        "--out-dir",
        out.to_str().unwrap(),
        "--child-stdin",
        "events",
    ];
    args.extend(extra.split_whitespace());
    args.extend(["--", agent.to_str().unwrap()]);
    let c = c.env("RUST_LOG", "warn");
    let mut d = c.daemon(&args);
    eventually(
        "the first batch in the folder",
        Duration::from_secs(30),
        || out.join(".cmpoll/state.json").exists() && folder(&out).len() == 1000,
    );
    let pid = d.child.id();

    let faults = [
        Fault::InternalError,
        Fault::Unavailable(1),
        Fault::TooManyRequests(1),
        Fault::Reset,
        Fault::CutShort,
        Fault::NotJson,
        Fault::Delay(Duration::from_millis(2500)),
        Fault::GatewayTimeout,
    ];
    let started = Instant::now();
    let end = started + Duration::from_secs(secs);
    let warm_at = started + Duration::from_secs(secs / 10).max(Duration::from_secs(5));
    let mut warm = None;
    let (mut changes, mut faults_injected, mut fault_until) = (0u64, 0u64, None);
    let mut next_id = 1000;
    while Instant::now() < end {
        if warm.is_none() && Instant::now() >= warm_at {
            warm = Some(rss_and_fds(pid));
        }
        // Faults: now and then, for a moment.
        match fault_until {
            Some(t) if Instant::now() >= t => {
                s.clear_faults();
                fault_until = None;
            }
            None if rng.below(40) == 0 => {
                let f = faults[rng.below(faults.len() as u64) as usize].clone();
                let when = if rng.below(4) == 0 {
                    Match::gets()
                } else {
                    Match::lists()
                };
                s.fault_always(when, f);
                faults_injected += 1;
                fault_until = Some(Instant::now() + Duration::from_millis(200 + rng.below(1300)));
            }
            _ => {}
        }
        // Churn: a few changes every 50 ms.
        for _ in 0..rng.below(4) {
            changes += 1;
            let keys: Vec<(String, String)> = want.keys().cloned().collect();
            let pick = keys[rng.below(keys.len() as u64) as usize].clone();
            let note = rng.next();
            match rng.below(10) {
                0 => {
                    let (ns, name) = (format!("team-{}", rng.below(10)), format!("n{next_id:05}"));
                    next_id += 1;
                    put(&s, &ns, &name, true, &format!("new-{note}"), note);
                    want.insert((ns, name), (true, format!("new-{note}")));
                }
                1 => {
                    s.delete(&pick.0, &pick.1);
                    want.remove(&pick);
                }
                2 => {
                    let (on, v) = want[&pick].clone();
                    put(&s, &pick.0, &pick.1, !on, &v, note);
                    want.insert(pick, (!on, v));
                }
                3..=5 => {
                    // Metadata only: the content stays.
                    let (on, v) = want[&pick].clone();
                    put(&s, &pick.0, &pick.1, on, &v, note);
                }
                _ => {
                    let (on, _) = want[&pick].clone();
                    let v = format!("v{note}");
                    put(&s, &pick.0, &pick.1, on, &v, note);
                    want.insert(pick, (on, v));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    s.clear_faults();
    let cluster: Modules = want
        .iter()
        .filter(|(_, (on, _))| *on)
        .map(|((ns, name), (_, v))| {
            let files = BTreeMap::from([("config.alloy".to_string(), v.clone())]);
            (format!("{ns}/{name}"), files)
        })
        .collect();
    eventually(
        "the folder to equal the cluster",
        Duration::from_secs(60),
        || folder(&out) == cluster,
    );
    let stdin = logs.join("stdin.log");
    eventually(
        "the agent to equal the cluster",
        Duration::from_secs(30),
        || replayed(&stdin) == cluster,
    );
    let (warm_rss, warm_fds) = warm.unwrap_or_default();
    let (end_rss, end_fds) = rss_and_fds(pid);
    let reqs = s.requests();
    let failed = reqs
        .iter()
        .filter(|r| r.status >= 400 || r.fault.is_some())
        .count();
    let restarts = lines(&stdin)
        .iter()
        .filter(|l| l.contains(r#""start""#))
        .count()
        - 1;
    println!(
        "soak: {:.0} s, {changes} changes, {faults_injected} faults, {} requests ({failed} faulted or failed), {} modules at the end",
        started.elapsed().as_secs_f64(),
        reqs.len(),
        cluster.len()
    );
    println!(
        "soak: RSS {warm_rss} KiB after warm-up, {end_rss} KiB at the end; fds {warm_fds} → {end_fds}; agent restarts {restarts}"
    );
    assert!(d.is_running());
    assert!(
        end_rss <= warm_rss + 2048,
        "RSS grew after warm-up: {warm_rss} → {end_rss} KiB"
    );
    // Slack for a connection being opened at the moment of either count.
    assert!(
        end_fds <= warm_fds + 2,
        "fds leaked: {warm_fds} → {end_fds}"
    );
    assert_eq!(d.stop(), Some(0));
}
