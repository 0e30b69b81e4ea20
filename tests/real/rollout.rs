//! Rollouts on the hub (issue 60, "Done when"), on the real apiserver with real followers:
//! `cmpoll serve --rollout 50%,100%` and `cmpoll run` followers with tokens bound to pods
//! (the hub names them `NAMESPACE/POD`), whose pod names are chosen here so that their
//! cohorts (SHA-256 of the name, first 8 bytes big-endian over 2^64: the contract's formula,
//! computed here independently) fall in the step each test needs. A good version reaches
//! each step in turn, no sooner than `--rollout-wait` apart; a refusal in the first step
//! (the follower's `--validate`, or the real Alloy under `--confirm`) refuses the version
//! for the whole fleet; a newer write replaces a rollout; a hub killed mid-rollout and
//! started again, beside a second hub on the same state Secret, continues the same step.
//!
//! What each follower held is read off its output folder, sampled every 20 ms from the
//! test's start (`Held`), and off its event stream (`--stdout-events`: every version it
//! applied), so "it never held v2" is a record, not a glance; and each such claim is made
//! only after the moment it would have happened has passed (the step's wait and a few of
//! the hub's polls, then a later version seen to arrive).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use test_apiserver::Pki;
use test_apiserver::real::RealApiserver;

use super::fleet::{pod_token, status_fleet};
use super::hub::*;
use super::*;
use crate::alloy_modules::{
    alloy_bin, alloy_on, receiver, root_config, scrape_module, shipped_args, unbuildable,
};
use crate::util::{Cmpoll, Daemon, SOON, eventually_explained, root, tools::free_port};

/// The hubs' `--interval`.
const HUB_INTERVAL: Duration = Duration::from_secs(1);

/// The steps every hub here rolls out with.
const STEPS: &str = "50%,100%";

/// Cohorts for a follower of the first step and of the second only, kept clear of 50 %.
const FIRST: std::ops::Range<f64> = 0.0..0.45;
const SECOND: std::ops::Range<f64> = 0.55..1.0;

/// The state Secret's name (`--rollout-state NS/STATE`, NS the test's namespace).
const STATE: &str = "cmpoll-rollouts";

/// A follower's own interval where none is said: long, so that what reaches it comes from
/// the hub's watch events, as the issue asks ("the same guarantees as today").
const FOLLOWER_INTERVAL: &str = "30s";

/// How late a first-step follower may hold a version after its step began (the hub's poll
/// that began it, then the watch event): a step-2 follower's version is held to "no sooner
/// than the wait after the first-step follower got it", less this.
const SLACK: Duration = Duration::from_secs(1);

/// The contract's cohort of a client named `name`: the first 8 bytes of SHA-256 of its
/// UTF-8 bytes, big-endian, over 2^64.
fn cohort(name: &str) -> f64 {
    let digest = Sha256::digest(name.as_bytes());
    let first = u64::from_be_bytes(digest[..8].try_into().unwrap());
    first as f64 / 2f64.powi(64)
}

/// The first pod name `PREFIX-I` (I = 0, 1, …) whose follower, `NS/PREFIX-I`, has its
/// cohort in `range`: the namespace's name (a counter in it) changes which I, never the
/// split.
fn pod_in(ns: &str, prefix: &str, range: std::ops::Range<f64>) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|pod| range.contains(&cohort(&format!("{ns}/{pod}"))))
        .unwrap_or_else(|| panic!("no pod name {prefix}-I of {ns} with a cohort in {range:?}"))
}

/// `cohort` on FIPS 180-2's test vector: SHA-256("abc") begins `ba7816bf8f01cfea`.
#[test]
fn the_cohort_is_the_contracts_formula() {
    let want = 0xba78_16bf_8f01_cfea_u64 as f64 / 2f64.powi(64);
    assert_eq!(cohort("abc"), want);
    assert!((0.728..0.729).contains(&cohort("abc")));
}

/// The contract's key of an object's last completed version in the state Secret.
fn stable_key(kind: &str, ns: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{kind}/{ns}/{name}").as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("stable.{hex}")
}

/// Each content a file was seen with (`None`: absent), and when it was first seen.
type Samples = Vec<(Instant, Option<String>)>;

/// What a file of a follower's output folder held over time: sampled every 20 ms by a
/// thread, each change recorded with when it was seen.
struct Held {
    file: PathBuf,
    log: Arc<Mutex<Samples>>,
    stop: Arc<AtomicBool>,
}

impl Held {
    fn watch(file: PathBuf) -> Held {
        let log: Arc<Mutex<Samples>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s, f) = (log.clone(), stop.clone(), file.clone());
        std::thread::spawn(move || {
            let mut last: Option<Option<String>> = None;
            while !s.load(Ordering::SeqCst) {
                let now = std::fs::read_to_string(&f).ok();
                if last.as_ref() != Some(&now) {
                    l.lock().unwrap().push((Instant::now(), now.clone()));
                    last = Some(now);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Held { file, log, stop }
    }

    /// What the file holds now (read now, not sampled).
    fn now(&self) -> Option<String> {
        std::fs::read_to_string(&self.file).ok()
    }

    /// Every content it was seen holding, in order, repeats and absences left out.
    fn history(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (_, v) in self.log.lock().unwrap().iter() {
            if let Some(v) = v
                && out.last() != Some(v)
            {
                out.push(v.clone());
            }
        }
        out
    }

    /// When it was first seen holding what `is` accepts (after `after`, where given).
    fn first_after(&self, after: Option<Instant>, is: &dyn Fn(&str) -> bool) -> Option<Instant> {
        (self.log.lock().unwrap().iter())
            .find(|(at, v)| after.is_none_or(|a| *at >= a) && v.as_deref().is_some_and(is))
            .map(|(at, _)| *at)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A `cmpoll run` following a hub as a pod: its name as the hub names it, its cohort, its
/// token, what it held and the events it printed.
struct Follower {
    name: String,
    cohort: f64,
    token: String,
    d: Daemon,
    held: Held,
    /// The module (`NS/NAME`) and the key whose versions the events tell.
    module: String,
    key: String,
    events: Vec<Value>,
}

impl Follower {
    fn holds(&self) -> Option<String> {
        self.held.now()
    }

    fn history(&self) -> Vec<String> {
        self.held.history()
    }

    /// Waits until it holds `what` (within `within`): when it was first seen holding it.
    fn first_holding(&self, what: &str, within: Duration) -> Instant {
        self.first_holding_by(what, within, &|v| v == what)
    }

    fn first_holding_by(&self, what: &str, within: Duration, is: &dyn Fn(&str) -> bool) -> Instant {
        self.first_holding_after(None, what, within, is)
    }

    /// `first_holding_by`, counting only from `after` (where given).
    fn first_holding_after(
        &self,
        after: Option<Instant>,
        what: &str,
        within: Duration,
        is: &dyn Fn(&str) -> bool,
    ) -> Instant {
        let mut at = None;
        eventually_explained(
            &format!("{} holds {what}", self.name),
            within,
            || {
                at = self.held.first_after(after, is);
                at.is_some()
            },
            || self.explain(),
        );
        at.unwrap()
    }

    /// Its events so far (kept: the stream is read once).
    fn pump(&mut self) -> &[Value] {
        self.events.extend(self.d.events_so_far());
        &self.events
    }

    /// The contents of its key in every version it applied, in order.
    ///
    /// The daemon switches the file before it prints the event, so this reads the stream
    /// until its last content is what the file holds now (at most 5 s), then answers.
    fn applied(&mut self) -> Vec<String> {
        let (module, key) = (self.module.clone(), self.key.clone());
        let start = Instant::now();
        loop {
            let now = self.holds();
            let applied: Vec<String> = (self.pump().iter())
                .filter(|e| {
                    (e["type"] == "added" || e["type"] == "updated") && e["module"] == module
                })
                .map(|e| e["files"][&key].as_str().unwrap_or("?").to_string())
                .collect();
            if applied.last() == now.as_ref() || start.elapsed() > Duration::from_secs(5) {
                return applied;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for its `rejected` event about its module: its reason, and when it was read.
    fn rejection(&mut self, within: Duration) -> (String, Instant) {
        let start = Instant::now();
        loop {
            let module = self.module.clone();
            if let Some(e) = (self.pump().iter())
                .find(|e| e["type"] == "rejected" && e["module"] == module.as_str())
            {
                return (
                    e["reason"].as_str().unwrap_or("").to_string(),
                    Instant::now(),
                );
            }
            assert!(
                start.elapsed() < within,
                "no rejection of {module} by {} within {within:?}\n{}",
                self.name,
                self.explain()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn explain(&self) -> String {
        format!(
            "{} (cohort {:.3}) held {:?}\nits stderr:\n{}",
            self.name,
            self.cohort,
            self.held.history(),
            self.d.stderr()
        )
    }
}

/// One test's namespace: its accounts (the hubs', with what rollouts need; the followers';
/// a scraper of `/status`), and the followers' pods.
struct Scene<'k> {
    k: &'k RealApiserver,
    ns: String,
    hub_token: String,
    scraper: String,
    /// Holds the scraper's token file, for `cmpoll status`.
    c: Cmpoll,
    scraper_file: PathBuf,
}

impl<'k> Scene<'k> {
    fn new(k: &'k RealApiserver, prefix: &str) -> Scene<'k> {
        let ns = k.namespace(prefix);
        state_role(k, &ns, STATE, "hub");
        let hub_token = hub_account(k, &ns, "hub");
        let rules = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get", "watch"]}]);
        let _ = account(k, &ns, "agent", Some(rules));
        let scraper = scraper(k, &ns);
        let c = Cmpoll::new();
        let scraper_file = c.write("scraper-token", &scraper);
        Scene {
            k,
            ns,
            hub_token,
            scraper,
            c,
            scraper_file,
        }
    }

    /// A follower of `hub` in pod `pod`: `cmpoll run` in `c` with `args`, whose module
    /// `name`'s key `key` is read at `file`.
    #[allow(clippy::too_many_arguments)]
    fn follower_with(
        &self,
        hub: &Hub,
        pod: &str,
        c: Cmpoll,
        args: &[&str],
        name: &str,
        key: &str,
        file: PathBuf,
    ) -> Follower {
        let token = pod_token(self.k, &self.ns, "agent", pod);
        let kubeconfig = hub_kubeconfig(&c, hub, &token, "hub.kubeconfig");
        let held = Held::watch(file);
        let d = Daemon::start(c.env("KUBECONFIG", kubeconfig.to_str().unwrap()), args);
        let name_of_follower = format!("{}/{pod}", self.ns);
        Follower {
            cohort: cohort(&name_of_follower),
            name: name_of_follower,
            token,
            d,
            held,
            module: format!("{}/{name}", self.ns),
            key: key.to_string(),
            events: Vec::new(),
        }
    }

    /// A plain follower of module `m` (key `k.yaml`) with its output folder, `extra` args
    /// and `interval`.
    fn follower(&self, hub: &Hub, pod: &str, interval: &str, extra: &[&str]) -> Follower {
        let c = Cmpoll::new();
        let out = c.out();
        let mut args = vec![
            "--namespace",
            &self.ns,
            "--interval",
            interval,
            "--out-dir",
            out.to_str().unwrap(),
            "--stdout-events",
        ];
        args.extend_from_slice(extra);
        let file = out.join(&self.ns).join("m").join("k.yaml");
        self.follower_with(hub, pod, c, &args, "m", "k.yaml", file)
    }

    /// The hub's fleet (`cmpoll status --fleet --json`), whatever its exit code.
    fn fleet(&self, hub: &Hub) -> Value {
        let run = status_fleet(&self.c, hub, &self.scraper_file, true);
        serde_json::from_str(&run.stdout).unwrap_or(Value::Null)
    }

    /// Waits until every follower holds `what` and `hub` knows `n` followers holding it
    /// (`cmpoll status --fleet`), so that each step's followers are known before a write.
    fn all_hold(&self, hub: &Hub, followers: &[&Follower], name: &str, what: &str) {
        self.all_hold_by(hub, followers, name, what, &|v| v == what);
    }

    /// `all_hold`, with what each holds told by `is`.
    fn all_hold_by(
        &self,
        hub: &Hub,
        followers: &[&Follower],
        name: &str,
        what: &str,
        is: &dyn Fn(&str) -> bool,
    ) {
        for f in followers {
            f.first_holding_by(what, Duration::from_secs(60), is);
        }
        let n = followers.len();
        eventually_explained(
            &format!("the hub knows {n} followers holding {name}"),
            2 * SOON,
            || {
                let fleet = self.fleet(hub);
                (fleet["objects"].as_array().into_iter().flatten())
                    .any(|o| o["name"] == name && o["counts"]["current"] == n)
            },
            || {
                let each: Vec<String> = followers.iter().map(|f| f.explain()).collect();
                format!(
                    "{}\n{}\nthe hub's stderr:\n{}",
                    self.fleet(hub),
                    each.join("\n"),
                    hub.d.stderr()
                )
            },
        );
    }

    /// The hub's `/status` entry of the rollout of `name` (contract: `rollouts: [{kind,
    /// namespace, name, hash, from, step, steps, state, refused}]`), found loosely: in
    /// `rollouts`, else anywhere an object names it beside a `state` and `steps`.
    fn rollout(&self, hub: &Hub, name: &str) -> (Option<Value>, Value) {
        let (_, _, body) = get(&hub.url(), &hub.ca, &self.scraper, "/status", &[]);
        let status: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        fn find(v: &Value, name: &str) -> Option<Value> {
            match v {
                Value::Object(o) => {
                    if o.get("name") == Some(&json!(name))
                        && o.contains_key("state")
                        && o.contains_key("steps")
                    {
                        return Some(v.clone());
                    }
                    o.values().find_map(|v| find(v, name))
                }
                Value::Array(a) => a.iter().find_map(|v| find(v, name)),
                _ => None,
            }
        }
        let listed = (status["rollouts"].as_array().into_iter().flatten())
            .find(|r| r["name"] == name)
            .cloned();
        (listed.or_else(|| find(&status, name)), status)
    }

    /// Waits until `/status` says the rollout of `name` is refused, by `follower`: that
    /// entry (asserted loosely: its `state`, and the follower named in its `refused`).
    fn refused(&self, hub: &Hub, name: &str, follower: &str) -> Value {
        let start = Instant::now();
        loop {
            let (r, status) = self.rollout(hub, name);
            if let Some(r) = &r
                && r["state"] == "refused"
                && r["refused"].to_string().contains(follower)
            {
                return r.clone();
            }
            assert!(
                start.elapsed() < SOON,
                "/status does not say {follower} refused {name}'s version: {}\n{}",
                r.unwrap_or(status),
                hub.d.stderr()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What `hub` serves as `token` for the ConfigMap `name`: its key `key`.
    fn served(&self, hub: &Hub, token: &str, name: &str, key: &str) -> String {
        let (code, _, body) = get(
            &hub.url(),
            &hub.ca,
            token,
            &format!("/api/v1/namespaces/{}/configmaps/{name}", self.ns),
            &[],
        );
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_eq!(code, 200, "{v}\n{}", hub.d.stderr());
        v["data"][key].as_str().unwrap_or("?").to_string()
    }
}

/// What the contract says the hubs need for their state (beside the shipped role), for
/// account `hub` of `ns`: get and update on the Secret `state` by name, create on Secrets
/// in its namespace.
pub(crate) fn state_role(k: &RealApiserver, ns: &str, state: &str, hub: &str) {
    k.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "hub-rollouts", "namespace": ns},
             "rules": [
                {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [state],
                 "verbs": ["get", "update"]},
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "hub-rollouts", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub-rollouts"},
             "subjects": [{"kind": "ServiceAccount", "name": hub, "namespace": ns}]}]})
        .to_string(),
    );
}

/// A hub's address and certificate, kept so that it can be started again as the same
/// endpoint.
struct Endpoint {
    port: u16,
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Endpoint {
    fn new() -> Endpoint {
        let pki = Pki::with_server_names("cmpoll-hub-test", &["127.0.0.1"]);
        Endpoint {
            port: free_port(),
            ca_pem: pki.ca_pem(),
            cert_pem: pki.server.cert_pem.clone(),
            key_pem: pki.server.key_pem.clone(),
        }
    }
}

/// `cmpoll serve --rollout STEPS --rollout-wait WAIT` on `at`, over the scene's namespace,
/// its state in the scene's Secret; ready (or a failure with its stderr at once, when it
/// exits).
fn rollout_hub(s: &Scene, at: &Endpoint, wait: Duration) -> Hub {
    let c = Cmpoll::new().env("RUST_LOG", "info");
    let ca = c.write("hub-ca.crt", &at.ca_pem);
    let cert = c.write("tls/tls.crt", &at.cert_pem);
    let key = c.write("tls/tls.key", &at.key_pem);
    let token_file = c.write("hub-token", &s.hub_token);
    let apiserver_ca = c.write("apiserver-ca.crt", &s.k.ca_pem());
    let listen = format!("127.0.0.1:{}", at.port);
    let interval = format!("{}s", HUB_INTERVAL.as_secs());
    let wait = format!("{}s", wait.as_secs());
    let state = format!("{}/{STATE}", s.ns);
    let args = [
        "--server",
        &s.k.url,
        "--token-file",
        token_file.to_str().unwrap(),
        "--ca-file",
        apiserver_ca.to_str().unwrap(),
        "--listen",
        &listen,
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--namespace",
        &s.ns,
        "--interval",
        &interval,
        "--drain-window",
        "0s",
        "--rollout",
        STEPS,
        "--rollout-wait",
        &wait,
        "--rollout-state",
        &state,
    ];
    let mut hub = Hub {
        d: Daemon::serve(c, &args),
        port: at.port,
        ca,
        ca_pem: at.ca_pem.clone(),
    };
    let start = Instant::now();
    while get(&hub.url(), &hub.ca, "", "/readyz", &[]).0 != 200 {
        if let Some(status) = hub.d.child.try_wait().unwrap() {
            panic!(
                "the hub exited ({status}) before it was ready:\n{}",
                hub.d.stderr()
            );
        }
        assert!(
            start.elapsed() < SOON,
            "the hub not ready within {SOON:?}:\n{}",
            hub.d.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    hub
}

/// Sleeps until `at` (at once if it is past).
fn until(at: Instant) {
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}

#[test]
fn a_good_version_reaches_each_step_in_turn() {
    const WAIT: Duration = Duration::from_secs(5);
    let Some((_guard, k)) = cluster() else {
        return;
    };
    let s = Scene::new(k, "hub-rollout-good");
    put_module(k, &s.ns, "m", "k.yaml", "one");
    let hub = rollout_hub(&s, &Endpoint::new(), WAIT);
    let mut a = s.follower(&hub, &pod_in(&s.ns, "a", FIRST), FOLLOWER_INTERVAL, &[]);
    let mut b = s.follower(&hub, &pod_in(&s.ns, "b", SECOND), FOLLOWER_INTERVAL, &[]);
    eprintln!(
        "A {} at {:.3}, B {} at {:.3}",
        a.name, a.cohort, b.name, b.cohort
    );
    assert!(
        a.cohort < 0.5 && b.cohort >= 0.5,
        "A in step 1 of 50%, B in step 2 only"
    );
    s.all_hold(&hub, &[&a, &b], "m", "one");

    put_module(k, &s.ns, "m", "k.yaml", "two");
    let a_got = a.first_holding("two", SOON);
    // Without a rollout B would hold it as soon as A does (one poll, one watch event):
    // that moment has passed, and B's step has not begun (the wait).
    until(a_got + Duration::from_millis(1500));
    assert_eq!(
        b.history(),
        ["one"],
        "B (step 2) holds the last completed version while step 1 runs\n{}",
        b.explain()
    );
    let (r, status) = s.rollout(&hub, "m");
    let r = r.unwrap_or_else(|| panic!("no rollout of m on /status: {status}"));
    assert_eq!(
        (&r["state"], &r["step"], &r["steps"]),
        (&json!("rolling"), &json!(1), &json!(2)),
        "{r}"
    );

    let b_got = b.first_holding("two", WAIT + Duration::from_secs(10));
    assert!(
        b_got >= a_got + WAIT - SLACK,
        "B got it {:?} after A: no sooner than the wait ({WAIT:?})",
        b_got - a_got
    );
    eprintln!("A to B: {:?}", b_got - a_got);
    assert_eq!(a.history(), ["one", "two"], "{}", a.explain());
    assert_eq!(b.history(), ["one", "two"], "{}", b.explain());
    assert_eq!(b.applied(), ["one", "two"], "{}", b.explain());
    assert_eq!(a.applied(), ["one", "two"], "{}", a.explain());
}

#[test]
fn a_refusal_in_the_first_step_refuses_the_version_for_the_fleet() {
    const WAIT: Duration = Duration::from_secs(5);
    let Some((_guard, k)) = cluster() else {
        return;
    };
    let s = Scene::new(k, "hub-rollout-refused");
    put_module(k, &s.ns, "m", "k.yaml", "one");
    let hub = rollout_hub(&s, &Endpoint::new(), WAIT);
    let validate = ["--validate", "! grep -rq BAD ."];
    let mut a = s.follower(
        &hub,
        &pod_in(&s.ns, "a", FIRST),
        FOLLOWER_INTERVAL,
        &validate,
    );
    let mut b = s.follower(&hub, &pod_in(&s.ns, "b", SECOND), FOLLOWER_INTERVAL, &[]);
    eprintln!(
        "A {} at {:.3}, B {} at {:.3}",
        a.name, a.cohort, b.name, b.cohort
    );
    assert!(
        a.cohort < 0.5 && b.cohort >= 0.5,
        "A in step 1 of 50%, B in step 2 only"
    );
    s.all_hold(&hub, &[&a, &b], "m", "one");

    // A version A's validator refuses: it reaches A (step 1), which refuses it.
    put_module(k, &s.ns, "m", "k.yaml", "two BAD");
    let written = Instant::now();
    let (reason, _) = a.rejection(SOON);
    assert!(reason.contains("exited with status 1"), "{reason}");
    assert_eq!(a.holds().as_deref(), Some("one"), "{}", a.explain());

    // The moment passed: the step's wait and three of the hub's polls beyond it.
    until(written + WAIT + 3 * HUB_INTERVAL);
    assert_eq!(
        b.history(),
        ["one"],
        "B (step 2) never gets the refused version\n{}",
        b.explain()
    );
    // The hub says who refused it, and that the version is refused.
    let r = s.refused(&hub, "m", &a.name);
    eprintln!("/status: {r}");
    // A later good version goes to A, then B: B goes from v1 to v3 directly.
    put_module(k, &s.ns, "m", "k.yaml", "three");
    let a_got = a.first_holding("three", SOON);
    let b_got = b.first_holding("three", WAIT + Duration::from_secs(10));
    assert!(b_got >= a_got + WAIT - SLACK, "{:?}", b_got - a_got);
    assert_eq!(b.history(), ["one", "three"], "{}", b.explain());
    assert_eq!(b.applied(), ["one", "three"], "{}", b.explain());
    assert_eq!(a.history(), ["one", "three"], "{}", a.explain());
}

#[test]
fn a_newer_write_replaces_the_rollout() {
    // Long enough that the newer write lands in the first version's step 1.
    const WAIT: Duration = Duration::from_secs(20);
    let Some((_guard, k)) = cluster() else {
        return;
    };
    let s = Scene::new(k, "hub-rollout-newer");
    put_module(k, &s.ns, "m", "k.yaml", "one");
    let hub = rollout_hub(&s, &Endpoint::new(), WAIT);
    let mut a = s.follower(&hub, &pod_in(&s.ns, "a", FIRST), FOLLOWER_INTERVAL, &[]);
    let mut b = s.follower(&hub, &pod_in(&s.ns, "b", SECOND), FOLLOWER_INTERVAL, &[]);
    eprintln!(
        "A {} at {:.3}, B {} at {:.3}",
        a.name, a.cohort, b.name, b.cohort
    );
    assert!(
        a.cohort < 0.5 && b.cohort >= 0.5,
        "A in step 1 of 50%, B in step 2 only"
    );
    s.all_hold(&hub, &[&a, &b], "m", "one");

    put_module(k, &s.ns, "m", "k.yaml", "two");
    let a_got_two = a.first_holding("two", SOON);
    until(a_got_two + Duration::from_millis(1500));
    assert_eq!(b.history(), ["one"], "{}", b.explain());
    // v3 during v2's step 1: it starts at step 1 again; B stays on v1 until v3's own step
    // passes, and never holds v2 (whose step 2 would have begun WAIT after A got it).
    until(a_got_two + Duration::from_secs(3));
    put_module(k, &s.ns, "m", "k.yaml", "three");
    let a_got_three = a.first_holding("three", SOON);
    assert!(
        a_got_three < a_got_two + WAIT - SLACK,
        "v3 was written in v2's step 1"
    );
    let b_got = b.first_holding("three", WAIT + Duration::from_secs(10));
    assert!(
        b_got >= a_got_three + WAIT - SLACK,
        "B got v3 {:?} after A: no sooner than the wait of v3's own step",
        b_got - a_got_three
    );
    assert!(
        b_got > a_got_two + WAIT,
        "v2's step 2 would have begun by then"
    );
    assert_eq!(b.history(), ["one", "three"], "{}", b.explain());
    assert_eq!(b.applied(), ["one", "three"], "{}", b.explain());
    assert_eq!(a.history(), ["one", "two", "three"], "{}", a.explain());
    assert_eq!(a.applied(), ["one", "two", "three"], "{}", a.explain());
}

#[test]
fn a_restarted_hub_and_a_second_hub_continue_the_same_step() {
    const WAIT: Duration = Duration::from_secs(20);
    // The followers retry a lost hub from their interval: short, so the restarted hub's
    // followers are back long before the step ends.
    const INTERVAL: &str = "2s";
    let Some((_guard, k)) = cluster() else {
        return;
    };
    let s = Scene::new(k, "hub-rollout-two");
    put_module(k, &s.ns, "m", "k.yaml", "one");
    let one = Endpoint::new();
    let mut hub1 = rollout_hub(&s, &one, WAIT);
    let hub2 = rollout_hub(&s, &Endpoint::new(), WAIT);
    // Each hub has a follower of each step.
    let a1 = s.follower(&hub1, &pod_in(&s.ns, "a1", FIRST), INTERVAL, &[]);
    let b1 = s.follower(&hub1, &pod_in(&s.ns, "b1", SECOND), INTERVAL, &[]);
    let a2 = s.follower(&hub2, &pod_in(&s.ns, "a2", FIRST), INTERVAL, &[]);
    let b2 = s.follower(&hub2, &pod_in(&s.ns, "b2", SECOND), INTERVAL, &[]);
    for f in [&a1, &b1, &a2, &b2] {
        eprintln!("{} at {:.3}", f.name, f.cohort);
    }
    assert!(
        a1.cohort < 0.5 && a2.cohort < 0.5,
        "A1, A2 in step 1 of 50%"
    );
    assert!(
        b1.cohort >= 0.5 && b2.cohort >= 0.5,
        "B1, B2 in step 2 only"
    );
    s.all_hold(&hub1, &[&a1, &b1], "m", "one");
    s.all_hold(&hub2, &[&a2, &b2], "m", "one");

    put_module(k, &s.ns, "m", "k.yaml", "two");
    // Each hub polls on its own: the step began by the first of them to hold it.
    let a_got = a1
        .first_holding("two", SOON)
        .min(a2.first_holding("two", SOON));
    until(a_got + Duration::from_millis(1500));
    for b in [&b1, &b2] {
        assert_eq!(b.history(), ["one"], "{}", b.explain());
    }
    // The state is in the cluster, with the version the others are served.
    let secret = || -> Value {
        serde_json::from_str(&k.ok(&["get", "secret", STATE, "-n", &s.ns, "-o", "json"])).unwrap()
    };
    let state = secret();
    assert_eq!(
        state["metadata"]["labels"]["app.kubernetes.io/managed-by"], "cmpoll",
        "{state}"
    );
    let stable = stable_key("configmap", &s.ns, "m");
    assert!(
        state["data"]["rollouts.json"].is_string() && state["data"][&stable].is_string(),
        "rollouts.json and {stable} while m rolls out: {state}"
    );

    // Mid-step 1: hub 1 killed, and started again as the same endpoint.
    until(a_got + Duration::from_secs(8));
    hub1.d.signal("KILL");
    hub1.d.wait(Duration::from_secs(10));
    let killed = Instant::now();
    drop(hub1);
    let hub1 = rollout_hub(&s, &one, WAIT);
    eprintln!("hub 1 back after {:?}", killed.elapsed());
    // Both hubs serve each follower its step: v2 to step 1, v1 to step 2, whichever hub
    // it asks.
    for hub in [&hub1, &hub2] {
        for (f, want) in [(&a1, "two"), (&a2, "two"), (&b1, "one"), (&b2, "one")] {
            assert_eq!(
                s.served(hub, &f.token, "m", "k.yaml"),
                want,
                "{} asking hub {}",
                f.name,
                hub.port
            );
        }
    }
    assert!(
        Instant::now() < a_got + WAIT - SLACK,
        "checked within step 1 (hub 1 took {:?} to come back)",
        killed.elapsed()
    );
    for b in [&b1, &b2] {
        assert_eq!(b.holds().as_deref(), Some("one"), "{}", b.explain());
    }

    // Step 2 completes on both, when the first step's wait ends: not skipped, and not
    // begun again at the restart (then it could not end before `killed + WAIT`).
    for b in [&b1, &b2] {
        let b_got = b.first_holding("two", WAIT + Duration::from_secs(10));
        eprintln!("{}: {:?} after the first step", b.name, b_got - a_got);
        assert!(b_got >= a_got + WAIT - SLACK, "{:?}", b_got - a_got);
        assert!(
            b_got < killed + WAIT,
            "{} got v2 {:?} after the restart: the rollout began again",
            b.name,
            b_got - killed
        );
    }
    for f in [&a1, &b1, &a2, &b2] {
        assert_eq!(f.history(), ["one", "two"], "{}", f.explain());
    }
    let state = secret();
    assert!(state["data"]["rollouts.json"].is_string(), "{state}");
    drop(hub2);
}

#[test]
fn a_version_alloy_refuses_reaches_only_the_first_step() {
    const WAIT: Duration = Duration::from_secs(5);
    // Every follower's interval, and how long confirm-modules.sh waits for Alloy: the
    // first step holds the last good version again within their sum after the refusal.
    const INTERVAL: Duration = Duration::from_secs(5);
    const CONFIRM: Duration = Duration::from_secs(5);
    let Some(alloy) = alloy_bin() else { return };
    let Some((_guard, k)) = cluster() else {
        return;
    };
    let s = Scene::new(k, "hub-rollout-alloy");
    let alloy_port = free_port();
    let put = |text: &str| {
        k.apply(
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "team", "namespace": s.ns, "labels": {LABEL.0: LABEL.1}},
                "data": {"module.alloy": text, "notes.txt": "owned by team"}})
            .to_string(),
        );
    };
    let version = |text: &str| -> &'static str {
        ["team-v1", "team-bad", "team-v3"]
            .into_iter()
            .find(|v| text.contains(&format!("\"{v}\"")))
            .unwrap_or("?")
    };
    put(&scrape_module("team-v1", alloy_port, ""));
    let hub = rollout_hub(&s, &Endpoint::new(), WAIT);
    let interval = format!("{}s", INTERVAL.as_secs());

    // A: the real Alloy under --confirm, as k8s/alloy ships it, in step 1.
    let c = Cmpoll::new();
    let out = c.out();
    let logs = c.path("logs");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&logs).unwrap();
    let prometheus_port = free_port();
    let _prometheus = receiver(&logs.join("prometheus"), prometheus_port);
    let root_file = root_config(&out, prometheus_port);
    let _alloy = alloy_on(&alloy, &out, alloy_port, &logs, "alloy");
    let k8s = root().join("k8s/alloy");
    let mut args = shipped_args(&out);
    args.extend(
        [
            "--validate",
            k8s.join("check-module.sh").to_str().unwrap(),
            "--confirm",
            k8s.join("confirm-modules.sh").to_str().unwrap(),
            "--stdout-events",
            "--namespace",
            &s.ns,
            "--interval",
            &interval,
        ]
        .map(str::to_string),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    eventually_explained(
        "Alloy is ready",
        SOON,
        || {
            crate::util::tools::curl(&format!("http://127.0.0.1:{alloy_port}/-/ready"))
                .is_some_and(|(code, _)| code == 200)
        },
        || std::fs::read_to_string(logs.join("alloy.log")).unwrap_or_default(),
    );
    let c = c
        .env("ALLOY", alloy.to_str().unwrap())
        .env("ALLOY_ROOT", root_file.to_str().unwrap())
        .env("ALLOY_URL", &format!("http://127.0.0.1:{alloy_port}"))
        .env("ALLOY_WAIT", &CONFIRM.as_secs().to_string());
    let file = out.join(format!("{}.team.alloy", s.ns));
    let mut with_alloy = s.follower_with(
        &hub,
        &pod_in(&s.ns, "alloy", FIRST),
        c,
        &args,
        "team",
        "module.alloy",
        file,
    );
    // A plain follower in step 1, and one in step 2.
    let plain = |pod: &str| {
        let c = Cmpoll::new();
        let out = c.out();
        let args = [
            "--namespace",
            &s.ns,
            "--interval",
            &interval,
            "--out-dir",
            out.to_str().unwrap(),
            "--stdout-events",
        ];
        let file = out.join(&s.ns).join("team").join("module.alloy");
        s.follower_with(&hub, pod, c, &args, "team", "module.alloy", file)
    };
    let first = plain(&pod_in(&s.ns, "first", FIRST));
    let mut second = plain(&pod_in(&s.ns, "second", SECOND));
    for f in [&with_alloy, &first, &second] {
        eprintln!("{} at {:.3}", f.name, f.cohort);
    }
    assert!(
        with_alloy.cohort < 0.5 && first.cohort < 0.5 && second.cohort >= 0.5,
        "Alloy's follower and `first` in step 1 of 50%, `second` in step 2 only"
    );
    s.all_hold_by(&hub, &[&with_alloy, &first, &second], "team", "v1", &|t| {
        version(t) == "team-v1"
    });
    let good = with_alloy.holds().unwrap();

    // A version Alloy cannot build: it reaches step 1, Alloy refuses it, and the whole
    // first step holds the last good version again.
    put(&unbuildable("team-bad", alloy_port));
    let written = Instant::now();
    let bad_at = first.first_holding_by("the bad version", SOON, &|t| version(t) == "team-bad");
    let (reason, refused) = with_alloy.rejection(Duration::from_secs(60));
    assert!(reason.contains("scrape_timeout"), "Alloy's words: {reason}");
    eprintln!("written to refused: {:?}", refused - written);
    let back = INTERVAL + CONFIRM;
    eventually_explained(
        "Alloy's follower holds the last good version",
        back,
        || with_alloy.holds().as_deref() == Some(good.as_str()),
        || with_alloy.explain(),
    );
    let first_back = first.first_holding_after(Some(bad_at), "v1 again", back + SLACK, &|t| {
        version(t) == "team-v1"
    });
    assert!(
        first_back.saturating_duration_since(refused) <= back,
        "the other step-1 follower back on v1 {:?} after the refusal",
        first_back.saturating_duration_since(refused)
    );
    let r = s.refused(&hub, "team", &with_alloy.name);
    eprintln!("/status: {r}");

    // The moment passed for step 2; then a good version reaches it, directly from v1.
    until(written + WAIT + 3 * HUB_INTERVAL);
    let held: Vec<&str> = second.history().iter().map(|t| version(t)).collect();
    assert_eq!(
        held,
        ["team-v1"],
        "the step-2 follower never holds the refused version\n{}",
        second.explain()
    );
    put(&scrape_module("team-v3", alloy_port, ""));
    let a_got = first.first_holding_by("v3", SOON, &|t| version(t) == "team-v3");
    with_alloy.first_holding_by("v3", Duration::from_secs(30), &|t| version(t) == "team-v3");
    let b_got = second.first_holding_by("v3", WAIT + Duration::from_secs(20), &|t| {
        version(t) == "team-v3"
    });
    assert!(b_got >= a_got + WAIT - SLACK, "{:?}", b_got - a_got);
    let history: Vec<&str> = second.history().iter().map(|t| version(t)).collect();
    assert_eq!(history, ["team-v1", "team-v3"], "{}", second.explain());
    let applied: Vec<&str> = second.applied().iter().map(|t| version(t)).collect();
    assert_eq!(applied, ["team-v1", "team-v3"], "{}", second.explain());
}
