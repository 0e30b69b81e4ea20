//! `Hub`'s order of answers, with a made-up apiserver's reviews (`testing::Fake`: token
//! "good" is alice, who may list configmaps in "team-a" only) and no server: each request
//! is asked on a lane as the server would ask it, and where the answer says another lane,
//! asked again there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::https::http::Taken;
use crate::ops::health::InFlight;
use crate::ops::metrics::{Decisions, ServerCounts};
use crate::serve::testing::{Fake, item, kinds, poll};

struct Test {
    hub: Hub,
    fake: Arc<Fake>,
}

/// A hub over a made-up apiserver, ready or not; when ready, it serves a poll of all
/// namespaces at version 10 that found `team-a/x`, `team-a/z` and `team-b/y`.
fn hub(ready: bool) -> Test {
    let fake = Arc::new(Fake::default());
    let auth = Auth::new(
        Box::new(fake.clone()),
        Decisions::default(),
        ServerCounts::default(),
    );
    let secs = Duration::from_secs;
    let mut health = Health::new(secs(1), secs(10), secs(10), InFlight::default());
    if ready {
        health.succeeded(Instant::now(), 0);
    }
    let metrics = Metrics::new();
    let served = metrics.served();
    let hub = Hub::new(
        kinds(),
        Arc::new(Mutex::new(health)),
        Arc::new(Mutex::new(metrics)),
        auth,
        served,
    );
    if ready {
        let empty = Held::empty(kinds());
        let items = vec![
            item("team-a", "x", 5, &[]),
            item("team-a", "z", 6, &[]),
            item("team-b", "y", 7, &[]),
        ];
        hub.publish(poll(&empty, 1, &[(None, 10)], items));
    }
    Test { hub, fake }
}

fn request(method: &str, target: &str, headers: &[(&str, &str)]) -> Request {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Request {
        method: method.into(),
        path: path.into(),
        query: query.into(),
        headers: (headers.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        body: Vec::new(),
        close: false,
        taken: Taken::default(),
    }
}

/// What a reply is, in short: `Lane(name)`, `Wait`, `Stream`, or the answer's status.
#[derive(Debug, PartialEq)]
enum Got {
    Lane(&'static str),
    Wait(Duration),
    Stream(u16),
    Status(u16),
}

impl Test {
    /// `req` asked on `lane` for `wake`, once.
    fn once(&self, req: &Request, lane: HubLane, wake: Wake) -> (Got, Option<Answer>) {
        let peer = Peer {
            addr: "127.0.0.1:1".parse().unwrap(),
            cert: None,
        };
        let call = Call {
            wake,
            lane: lane.index(),
        };
        match self.hub.handle(req, &peer, call) {
            Reply::Lane(n) => (Got::Lane(HubLane::ALL[n].name()), None),
            Reply::Wait { until, .. } => {
                let left = until.saturating_duration_since(Instant::now());
                (
                    Got::Wait(Duration::from_secs(left.as_secs_f64().round() as u64)),
                    None,
                )
            }
            Reply::Stream { head, .. } => (Got::Stream(head.status), None),
            Reply::Answer(a) | Reply::Held { answer: a, .. } => (Got::Status(a.status), Some(a)),
        }
    }

    /// `req` as the server asks it: on the answer lane, then on each lane it is sent to;
    /// the lanes it went through and where it ended.
    fn ask(&self, req: &Request) -> (Vec<&'static str>, Got, Option<Answer>) {
        let mut lanes = Vec::new();
        let mut lane = HubLane::Answer;
        loop {
            match self.once(req, lane, Wake::First) {
                (Got::Lane(name), _) => {
                    assert!(!lanes.contains(&name), "sent to {name} twice: {lanes:?}");
                    lanes.push(name);
                    lane = *HubLane::ALL.iter().find(|l| l.name() == name).unwrap();
                }
                (got, answer) => return (lanes, got, answer),
            }
        }
    }

    fn status(&self, req: &Request) -> u16 {
        match self.ask(req).1 {
            Got::Status(s) | Got::Stream(s) => s,
            other => panic!("not an answer: {other:?}"),
        }
    }

    fn reviews(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::SeqCst;
        (self.fake.tokens.load(SeqCst), self.fake.access.load(SeqCst))
    }
}

const GOOD: (&str, &str) = ("Authorization", "Bearer good");
const TEAM_A: &str = "/api/v1/namespaces/team-a/configmaps";
const TEAM_B: &str = "/api/v1/namespaces/team-b/configmaps";

/// 401 first: an anonymous request is refused whatever else is wrong with it (a write, a
/// hub not ready, a namespace nobody may read), and nothing is reviewed.
#[test]
fn anonymous_is_401_before_anything_else() {
    let t = hub(false);
    for (method, target) in [("GET", TEAM_B), ("POST", TEAM_A), ("GET", "/no/such")] {
        assert_eq!(
            t.status(&request(method, target, &[])),
            401,
            "{method} {target}"
        );
    }
    assert_eq!(t.reviews(), (0, 0));
    let bad = request("GET", TEAM_A, &[("Authorization", "Bearer bad")]);
    let (lanes, got, _) = t.ask(&bad);
    assert_eq!((lanes, got), (vec!["authn"], Got::Status(401)));
    let (lanes, got, _) = t.ask(&bad);
    assert_eq!((lanes, got), (vec![], Got::Status(401)), "its refusal kept");
    assert_eq!(t.reviews(), (1, 0));
}

/// An unknown token is reviewed on a review lane only (where the rest of its request is
/// answered too), and what was reviewed and rendered is kept: the next request is
/// answered where it arrives.
#[test]
fn a_token_is_reviewed_on_its_lane_once() {
    let t = hub(true);
    let req = request("GET", TEAM_A, &[GOOD]);
    let (lanes, got, _) = t.ask(&req);
    assert_eq!((lanes, got), (vec!["authn"], Got::Status(200)));
    let (lanes, got, _) = t.ask(&req);
    assert_eq!((lanes, got), (vec![], Got::Status(200)), "all kept");
    assert_eq!(t.reviews(), (1, 1));
}

/// Asking to be someone else is refused (403) once the token is known, before readiness
/// and before any access review.
#[test]
fn impersonation_is_refused_before_readiness() {
    let t = hub(false);
    let req = request("GET", TEAM_A, &[GOOD, ("Impersonate-User", "bob")]);
    let (_, got, answer) = t.ask(&req);
    assert_eq!(got, Got::Status(403));
    let body = String::from_utf8_lossy(&answer.unwrap().body).to_string();
    assert!(body.contains(impersonate::REASON), "{body}");
    assert_eq!(t.reviews(), (1, 0));
}

/// A hub that cannot serve says so (503) to whoever it knows, before it asks the apiserver
/// about their access (its reviews would fail with its polls).
#[test]
fn not_ready_is_503_before_authorization() {
    let t = hub(false);
    for target in [TEAM_A, TEAM_B] {
        let (_, got, answer) = t.ask(&request("GET", target, &[GOOD]));
        assert_eq!(got, Got::Status(503), "{target}");
        let body = String::from_utf8_lossy(&answer.unwrap().body).to_string();
        assert!(body.contains("no complete poll yet"), "{body}");
    }
    assert_eq!(t.reviews(), (1, 0), "no access asked");
}

/// What the request does is authorized (403) before its options are read (400), as the
/// apiserver's handlers read them only once its filters let it in.
#[test]
fn forbidden_is_403_before_a_bad_option() {
    let t = hub(true);
    let bad = |target: &str| request("GET", &format!("{target}?limit=x"), &[GOOD]);
    assert_eq!(t.status(&bad(TEAM_B)), 403);
    assert_eq!(t.status(&bad(TEAM_A)), 400);
    // Any other method is authorized for its verb first, as the apiserver authorizes it:
    // a write alice may not make is a 403 (its access asked), a HEAD of what she may list
    // a 405 (tests/real/methods.rs: the apiserver's codes).
    let (_, access) = t.reviews();
    assert_eq!(t.status(&request("DELETE", TEAM_A, &[GOOD])), 403);
    assert_eq!(t.reviews().1, access + 1, "deletecollection asked");
    assert_eq!(t.status(&request("HEAD", TEAM_A, &[GOOD])), 405);
    assert_eq!(t.status(&request("HEAD", TEAM_B, &[GOOD])), 403);
}

/// A list newer than the hub's last waits for the next poll (the watch cache's 3 s), then
/// is the watch cache's 504.
#[test]
fn newer_than_the_hub_waits_then_504() {
    let t = hub(true);
    let req = request(
        "GET",
        &format!("{TEAM_A}?resourceVersion=99&resourceVersionMatch=NotOlderThan"),
        &[GOOD],
    );
    assert_eq!(t.ask(&req).1, Got::Wait(BEHIND_WAIT));
    let (got, answer) = t.once(&req, HubLane::Answer, Wake::Expired);
    assert_eq!(got, Got::Status(504));
    let body = String::from_utf8_lossy(&answer.unwrap().body).to_string();
    assert!(body.contains("Too large resource version"), "{body}");
}

/// A follower's waiting list (`x-cmpoll-wait`) with nothing newer than it holds waits the
/// wait, then is `304 Not Modified`; with something newer, the list at once.
#[test]
fn a_followers_waiting_list_waits_then_304() {
    let t = hub(true);
    let waiting = |rv: u64| {
        request(
            "GET",
            &format!("{TEAM_A}?resourceVersion={rv}&resourceVersionMatch=NotOlderThan"),
            &[GOOD, (crate::hub_protocol::WAIT_HEADER, "30")],
        )
    };
    assert_eq!(t.ask(&waiting(10)).1, Got::Wait(Duration::from_secs(30)));
    let (got, answer) = t.once(&waiting(10), HubLane::Answer, Wake::Expired);
    assert_eq!(got, Got::Status(304));
    assert!(answer.unwrap().body.is_empty());
    assert_eq!(
        t.ask(&waiting(1)).1,
        Got::Status(200),
        "older than a change"
    );
}

/// A continue token whose list changed since is the apiserver's 410.
#[test]
fn a_continue_token_past_a_change_is_410() {
    let t = hub(true);
    let all = format!("{TEAM_A}?limit=1");
    let (lanes, got, answer) = t.ask(&request("GET", &all, &[GOOD]));
    assert_eq!((lanes, got), (vec!["authn"], Got::Status(200)));
    let page: serde_json::Value = serde_json::from_slice(&answer.unwrap().body).unwrap();
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    let next = request("GET", &format!("{all}&continue={token}"), &[GOOD]);
    let (lanes, got, _) = t.ask(&next);
    assert_eq!(
        (lanes, got),
        (vec!["render"], Got::Status(200)),
        "a page is made there"
    );
    let prev = t.hub.current().unwrap();
    t.hub.publish(poll(
        &prev,
        2,
        &[(None, 20)],
        vec![
            item("team-a", "x", 15, &[]),
            item("team-a", "z", 6, &[]),
            item("team-b", "y", 7, &[]),
        ],
    ));
    assert_eq!(t.status(&next), 410);
}

/// A follower's report (`hub_protocol::REPORT_PATH`) naming `modules` (namespace, name),
/// each held at `hash`.
fn report(token: Option<&str>, modules: &[(&str, &str)], hash: &str) -> Request {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![(crate::hub_protocol::WAIT_HEADER, "30")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a));
    }
    let mut req = request("POST", crate::hub_protocol::REPORT_PATH, &headers);
    let modules: Vec<serde_json::Value> = (modules.iter())
        .map(|(ns, n)| serde_json::json!({"module": format!("{ns}/{n}"), "kind": "ConfigMap", "hash": hash}))
        .collect();
    req.body = serde_json::to_vec(&serde_json::json!({ "modules": modules })).unwrap();
    req
}

fn served_hash(t: &Test, ns: &str, name: &str) -> String {
    let held = t.hub.current().unwrap();
    held.get(crate::source::Resource::ConfigMaps, ns, name)
        .unwrap()
        .hash
        .to_string()
}

/// A report: 401 without a token or with a bad one (nothing reviewed for an anonymous
/// one); a method but POST is 405; taken (204) on a lane where reviews may wait, for who
/// may list each namespace it names; one namespace not allowed is a 403 for the whole
/// report, in the apiserver's words, and nothing of it is kept.
#[test]
fn a_report_is_authenticated_and_authorized_per_namespace() {
    let t = hub(true);
    let x = served_hash(&t, "team-a", "x");
    assert_eq!(t.status(&report(None, &[("team-a", "x")], &x)), 401);
    assert_eq!(t.reviews(), (0, 0));
    assert_eq!(t.status(&report(Some("bad"), &[("team-a", "x")], &x)), 401);
    let mut get = report(Some("good"), &[], &x);
    get.method = "GET".into();
    assert_eq!(t.status(&get), 405);
    let (lanes, got, _) = t.ask(&report(Some("good"), &[("team-a", "x")], &x));
    assert_eq!((lanes, got), (vec!["authz"], Got::Status(204)));
    let both = report(Some("good"), &[("team-a", "z"), ("team-b", "y")], &x);
    let (_, got, answer) = t.ask(&both);
    assert_eq!(got, Got::Status(403));
    let body = String::from_utf8_lossy(&answer.unwrap().body).to_string();
    assert!(
        body.contains(r#"configmaps is forbidden: User \"alice\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team-b\""#),
        "{body}"
    );
    let status: serde_json::Value = serde_json::from_slice(&t.hub.status()).unwrap();
    let objects = &status["fleet"]["objects"];
    assert_eq!(objects.as_array().unwrap().len(), 1, "{objects}");
    assert_eq!(
        objects[0]["name"], "x",
        "the refused report changed nothing"
    );
    assert_eq!(objects[0]["counts"]["current"], 1);
    assert_eq!(status["fleet"]["followers"], 1);
}

/// A body that is not a report is a 400 in the apiserver's words; a follower over its
/// report budget is a 429 with `Retry-After`, before its body is read.
#[test]
fn a_bad_report_is_400_and_a_flood_429() {
    let t = hub(true);
    let mut bad = report(Some("good"), &[], "");
    bad.body = br#"{"modules":[],"unknown":true}"#.to_vec();
    let (_, got, answer) = t.ask(&bad);
    assert_eq!(got, Got::Status(400));
    let status: serde_json::Value = serde_json::from_slice(&answer.unwrap().body).unwrap();
    assert_eq!(
        (&status["kind"], &status["reason"]),
        (
            &serde_json::json!("Status"),
            &serde_json::json!("BadRequest")
        )
    );
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("unknown field"),
        "{status}"
    );
    let x = served_hash(&t, "team-a", "x");
    let ok = report(Some("good"), &[("team-a", "x")], &x);
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(t.status(&ok));
    }
    // The 400 took one of the burst of 4.
    assert_eq!(codes, [204, 204, 204, 429]);
    let (_, _, answer) = t.ask(&ok);
    let answer = answer.unwrap();
    assert_eq!(answer.status, 429);
    let retry = (answer.headers.iter())
        .find(|(k, _)| k.eq_ignore_ascii_case("Retry-After"))
        .map(|(_, v)| v.parse::<u64>().unwrap());
    assert!(retry.is_some_and(|s| (1..=30).contains(&s)), "{retry:?}");
    let served = &t.hub.served;
    assert_eq!(
        (
            served.fleet_reports("accepted"),
            served.fleet_reports("invalid"),
            served.fleet_reports("limited")
        ),
        (3, 1, 2)
    );
}

/// The fleet's state is on `/metrics` as totals per state, no follower named.
#[test]
fn the_fleet_is_on_metrics_without_names() {
    let t = hub(true);
    let x = served_hash(&t, "team-a", "x");
    assert_eq!(t.status(&report(Some("good"), &[("team-a", "x")], &x)), 204);
    t.hub.fleet_gauges();
    let text = (t.hub.metrics.lock().unwrap()).render();
    assert!(
        text.contains(r#"cmpoll_fleet_followers{state="current"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"cmpoll_fleet_reports_total{result="accepted"} 1"#));
    assert!(!text.contains("alice"));
}

/// `--remotecfg`: a collector's call, answered in Connect's words: 401 `unauthenticated`
/// before anything else, the call's shape checked, then the content (the root; team-a's
/// objects have no `*.alloy` key), `not_modified` for its hash echoed.
#[test]
fn a_collectors_calls_are_answered_in_connects_words() {
    use crate::serve::remotecfg::root::{Paths, RootFiles};
    use crate::serve::remotecfg::service::Remotecfg;
    let dir = std::env::temp_dir().join(format!("cmpoll-hub-rc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let root = dir.join("root.alloy");
    std::fs::write(&root, "// the platform's root\n").unwrap();
    let files = RootFiles::open(
        Paths {
            root: crate::serve::remotecfg::root::Location::File(root),
            arguments: None,
        },
        None,
    )
    .unwrap();
    let Test { hub, fake } = hub(true);
    let t = Test {
        hub: hub.with_remotecfg(Some(Remotecfg::new(files))),
        fake,
    };
    let path = "/collector.v1.CollectorService/GetConfig";
    let proto = ("Content-Type", "application/proto");
    // id "a", hash as given.
    let call = |headers: &[(&str, &str)], hash: &str| {
        let mut r = request("POST", path, headers);
        r.body = [
            &[0x0a, 1, b'a', 0x1a, hash.len() as u8][..],
            hash.as_bytes(),
        ]
        .concat();
        r
    };
    let code = |a: &Answer| -> String {
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        v["code"].as_str().unwrap().to_string()
    };
    let (_, got, a) = t.ask(&call(&[proto], ""));
    assert_eq!(got, Got::Status(401));
    assert_eq!(code(&a.unwrap()), "unauthenticated");
    // Authentication first, whatever else is wrong with the call.
    let (_, got, a) = t.ask(&call(&[], ""));
    assert_eq!(
        (got, code(&a.unwrap()).as_str()),
        (Got::Status(401), "unauthenticated")
    );
    let (_, got, a) = t.ask(&call(&[("Authorization", "Bearer bad"), proto], ""));
    assert_eq!(
        (got, code(&a.unwrap()).as_str()),
        (Got::Status(401), "unauthenticated")
    );
    assert_eq!(t.status(&call(&[GOOD], "")), 415);
    let mut get = call(&[GOOD, proto], "");
    get.method = "GET".into();
    assert_eq!(t.status(&get), 405);
    let (_, got, a) = t.ask(&call(&[GOOD, proto], ""));
    let a = a.unwrap();
    assert_eq!(
        (got, a.content_type),
        (Got::Status(200), "application/proto")
    );
    let text = String::from_utf8_lossy(&a.body).to_string();
    assert!(text.contains("// the platform's root"), "{text}");
    // Sent the same text again: the same bytes, made once for every call.
    let (_, _, b) = t.ask(&call(&[GOOD, proto], ""));
    assert_eq!(b.unwrap().body.addr(), a.body.addr());
    // The hash is the 64 hex digits after field 2's key and length (0x12, 64).
    let at = a.body.windows(2).rposition(|w| w == [0x12, 64]).unwrap();
    let hash = String::from_utf8(a.body[at + 2..at + 66].to_vec()).unwrap();
    let (_, _, again) = t.ask(&call(&[GOOD, proto], &hash));
    let again = again.unwrap();
    assert!(
        again.body.ends_with(&[0x18, 1]),
        "not_modified: {:?}",
        &again.body[..]
    );
    assert!(!String::from_utf8_lossy(&again.body).contains("root"));
    // Another path under the service: no such procedure.
    let other = request(
        "POST",
        "/collector.v1.CollectorService/Other",
        &[GOOD, proto],
    );
    assert_eq!(t.status(&other), 404);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Without `--remotecfg`, the service's paths are unknown ones.
#[test]
fn without_remotecfg_the_service_is_not_there() {
    let t = hub(true);
    let mut r = request(
        "POST",
        "/collector.v1.CollectorService/RegisterCollector",
        &[GOOD, ("Content-Type", "application/proto")],
    );
    r.body = vec![0x0a, 1, b'a'];
    let (_, got, a) = t.ask(&r);
    assert_eq!(got, Got::Status(404));
    let v: serde_json::Value = serde_json::from_slice(&a.unwrap().body).unwrap();
    assert_eq!(v["code"], "not_found");
}

/// `--remotecfg`: a collector gets the modules of the namespaces where it may list
/// ConfigMaps (alice: team-a only), the others left out.
#[test]
fn a_collector_gets_the_modules_of_namespaces_it_may_list() {
    use crate::serve::remotecfg::root::{Paths, RootFiles};
    use crate::serve::remotecfg::service::Remotecfg;
    let dir = std::env::temp_dir().join(format!("cmpoll-hub-rc-ns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let root = dir.join("root.alloy");
    std::fs::write(&root, "// root\n").unwrap();
    let files = RootFiles::open(
        Paths {
            root: crate::serve::remotecfg::root::Location::File(root),
            arguments: None,
        },
        None,
    )
    .unwrap();
    let Test { hub, fake } = hub(true);
    let t = Test {
        hub: hub.with_remotecfg(Some(Remotecfg::new(files))),
        fake,
    };
    let module = |ns: &str, name: &str, rv: u64| {
        let mut i = item(ns, name, rv, &[]);
        let raw = i.raw.as_mut().unwrap();
        let json = String::from_utf8(raw.json.to_vec()).unwrap();
        let with = json.replace(
            &format!("\"data\":{{\"k\":\"{rv}\"}}"),
            &format!("\"data\":{{\"m.alloy\":\"// {ns} {name}\\n\"}}"),
        );
        assert_ne!(with, json);
        raw.json = with.as_bytes().into();
        i
    };
    let items = vec![module("team-a", "web", 11), module("team-b", "db", 12)];
    t.hub
        .publish(poll(&Held::empty(kinds()), 2, &[(None, 20)], items));
    let mut r = request(
        "POST",
        "/collector.v1.CollectorService/GetConfig",
        &[GOOD, ("Content-Type", "application/proto")],
    );
    r.body = vec![0x0a, 1, b'a'];
    let (_, got, a) = t.ask(&r);
    let text = String::from_utf8_lossy(&a.unwrap().body).to_string();
    assert_eq!(got, Got::Status(200));
    assert!(text.contains("declare \"team_a_S_web\""), "{text}");
    assert!(!text.contains("team_b"), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Every body the hub reads (reports; collectors' calls) is read before its token is
/// checked, so each path takes from a budget of its own, only once whole: clients that
/// announce bodies and stall fill none another client needs (the rule:
/// `https::conn::tests::stalled_bodies_hold_nothing_of_their_paths_budget`).
#[test]
fn every_body_the_hub_reads_takes_from_a_budget_of_its_own() {
    for remotecfg in [false, true] {
        let posts = crate::serve::bodies(remotecfg);
        assert!(!posts.is_empty());
        for p in &posts {
            assert!(p.budget.is_some(), "{}", p.path);
        }
        let report = (posts.iter())
            .find(|p| p.path == crate::hub_protocol::REPORT_PATH)
            .and_then(|p| p.budget.as_ref())
            .expect("reports are read");
        assert!(report.take(crate::serve::MAX_BODIES + 1).is_none());
        assert!(report.take(crate::serve::MAX_BODIES).is_some());
    }
}
