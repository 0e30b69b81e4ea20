//! The fault matrix: every fault the test apiserver can inject, in every phase of a
//! daemon's life, against every sink at once (output folder, supervised agent with stdin
//! events and a reload signal, reload URL, stdout). While the fault lasts: no event, no
//! file change, no line on the agent's stdin, no signal, no reload call; the daemon stays
//! up and `/readyz` says it is not ready. Once it clears: exactly the events the cluster's
//! changes call for, in every sink, and ready again.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use test_apiserver::{Fault, Match, TestApiserver};

use crate::util::http::{listening, reload_server, until};
use crate::util::{
    Cmpoll, SOON, agent_env, eventually, heard, lines, module, recording_agent, tree_with_links,
};

struct Phase {
    name: &'static str,
    args: &'static [&'static str],
    when: fn() -> Match,
    /// The fault is there from the start: the first poll meets it.
    from_start: bool,
}

const PHASES: &[Phase] = &[
    Phase {
        name: "first poll",
        args: &[],
        when: Match::lists,
        from_start: true,
    },
    Phase {
        name: "steady state",
        args: &[],
        when: Match::lists,
        from_start: false,
    },
    Phase {
        name: "later pages",
        args: &["--page-size", "1"],
        when: Match::continue_pages,
        from_start: false,
    },
    Phase {
        name: "metadata-first GETs",
        args: &["--metadata-first"],
        when: Match::gets,
        from_start: false,
    },
];

fn faults() -> Vec<(&'static str, Fault)> {
    vec![
        ("500 etcd timeout", Fault::InternalError),
        ("500 etcd unreachable", Fault::EtcdUnreachable(1)),
        ("500 handler panic", Fault::Panic),
        ("503 with Retry-After", Fault::Unavailable(1)),
        ("504 timeout filter", Fault::GatewayTimeout),
        ("429 priority and fairness", Fault::TooManyRequests(1)),
        ("429 cache initializing", Fault::CacheInitializing(1)),
        (
            "401",
            Fault::Status(401, "Unauthorized".into(), "Unauthorized".into()),
        ),
        (
            "403",
            Fault::Status(403, "Forbidden".into(), "configmaps is forbidden".into()),
        ),
        (
            "slower than --timeout",
            Fault::Delay(Duration::from_millis(900)),
        ),
        ("connection reset", Fault::Reset),
        ("body cut short", Fault::CutShort),
        ("not JSON", Fault::NotJson),
        (
            "endless slow body",
            Fault::Trickle {
                bytes: 16,
                pause: Duration::from_millis(100),
            },
        ),
        ("over --max-response-bytes", Fault::Huge(2 << 20)),
        // r13: malformed answers are not empty ones, and no wait is past the backoff cap.
        (
            "a list without items",
            Fault::body(
                r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"}}"#,
            ),
        ),
        (
            "items null",
            Fault::body(
                r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":null}"#,
            ),
        ),
        (
            "429 Retry-After past any clock",
            Fault::Raw {
                code: 429,
                headers: vec![("Retry-After".into(), u64::MAX.to_string())],
                body: b"Too many requests, please try again later.\n".to_vec(),
            },
        ),
    ]
}

/// What every sink has shown so far.
#[derive(Debug, PartialEq)]
struct Seen {
    modules: BTreeMap<String, String>,
    stdin: usize,
    hups: usize,
    reloads: usize,
}

fn run_case(phase: &Phase, fault: Fault) {
    let s = TestApiserver::start();
    s.put(module("a", "one", "1"));
    s.put(module("a", "two", "2"));
    // Stays, so that with --page-size 1 a later page always exists.
    s.put(module("a", "zzz", "3"));
    let c = Cmpoll::against(&s);
    let c = agent_env(c);
    let logs = c.path("logs");
    let agent = recording_agent(&c);
    let out = c.out();
    let (url, calls) = reload_server(vec![]);
    let seen = || Seen {
        modules: tree_with_links(&out)
            .into_iter()
            .filter(|(k, _)| k.starts_with("a/"))
            .collect(),
        stdin: heard(&logs.join("stdin.log")).len(),
        hups: lines(&logs.join("hup.log")).len(),
        reloads: calls.lock().unwrap().len(),
    };
    let mut args = vec![
        "--interval",
        "50ms",
        "--jitter",
        "0",
        "--timeout",
        "300ms",
        "--max-response-bytes",
        "1MiB",
        "--listen",
        "127.0.0.1:0",
        "--out-dir",
        out.to_str().unwrap(),
        "--reload-url",
        &url,
        "--stdout-events",
        "--child-stdin",
        "events",
        "--reload-signal",
        "HUP",
    ];
    args.extend_from_slice(phase.args);
    args.extend_from_slice(&["--", agent.to_str().unwrap()]);
    let when = (phase.when)();
    if phase.from_start {
        s.fault_always(when.clone(), fault.clone());
    }
    let mut d = c.daemon(&args);
    let addr = listening(&d);
    let before = if phase.from_start {
        Seen {
            modules: BTreeMap::new(),
            stdin: 0,
            hups: 0,
            reloads: 0,
        }
    } else {
        assert_eq!(d.batch(SOON).len(), 4, "first batch");
        until(&addr, "/readyz", 200);
        // The agent starts with the first batch on its stdin: no signal for that one.
        eventually("the first batch in every sink", SOON, || {
            let now = seen();
            now.reloads == 1 && now.stdin == 4
        });
        std::thread::sleep(Duration::from_millis(200));
        let seen = seen();
        assert_eq!((seen.reloads, seen.stdin, seen.hups), (1, 4, 0), "{seen:?}");
        assert_eq!(
            seen.modules.len(),
            6,
            "three symlinks and three files: {seen:?}"
        );
        s.fault_always(when, fault);
        // A list that arrived before the fault was set may still be answered after it; so
        // where lists are faulted, the changes wait until a faulted one was served (then
        // nothing earlier is in flight: cmpoll makes one request at a time). GETs follow
        // from the change, so there the change comes first.
        if phase.name != "metadata-first GETs" {
            eventually("the fault to be hit", SOON, || {
                s.requests().iter().any(|r| r.fault.is_some())
            });
        }
        s.put(module("a", "one", "changed"));
        s.delete("a", "two");
        seen
    };
    eventually("the fault to be hit", SOON, || {
        s.requests().iter().any(|r| r.fault.is_some())
    });
    // Polls go on, each one failing, and nothing comes of them.
    d.quiet_through(&s, 3, 1);
    assert!(d.is_running(), "the daemon stays up");
    assert_eq!(seen(), before, "nothing changed in any sink");
    // Past the readiness limit (3 × 50 ms interval + the 500 ms backoff cap) it says so.
    until(&addr, "/readyz", 503);
    d.quiet_through(&s, 1, 1);
    assert_eq!(seen(), before, "nothing changed in any sink");

    s.clear_faults();
    let b = d.batch(SOON);
    let got: Vec<(String, String)> = b
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("type"), s("module"))
        })
        .collect();
    let want: Vec<(&str, &str)> = if phase.from_start {
        vec![
            ("added", "a/one"),
            ("added", "a/two"),
            ("added", "a/zzz"),
            ("synced", ""),
        ]
    } else {
        vec![("removed", "a/two"), ("updated", "a/one"), ("synced", "")]
    };
    let want: Vec<(String, String)> = want
        .into_iter()
        .map(|(t, m)| (t.to_string(), m.to_string()))
        .collect();
    assert_eq!(got, want, "exactly the events the changes call for");
    until(&addr, "/readyz", 200);
    // A first batch starts the agent (no signal); a later one signals it.
    let hups = before.hups + usize::from(!phase.from_start);
    let caught_up = || {
        let now = seen();
        now.hups == hups
            && now.reloads == before.reloads + 1
            && now.stdin == before.stdin + want.len()
    };
    let start = Instant::now();
    while !caught_up() {
        assert!(
            start.elapsed() < SOON,
            "every sink to catch up: {:?}",
            seen()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let files = seen().modules;
    let contents: Vec<&String> = files
        .iter()
        .filter(|(k, _)| k.ends_with("/k"))
        .map(|(_, v)| v)
        .collect();
    if phase.from_start {
        assert_eq!(contents, ["1", "2", "3"], "{files:?}");
    } else {
        assert_eq!(contents, ["changed", "3"], "{files:?}");
    }
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn every_fault_in_every_phase_changes_nothing_in_any_sink_and_recovery_is_exact() {
    let mut cases = Vec::new();
    let only = std::env::var("FAULT_CASE").unwrap_or_default();
    for phase in PHASES {
        for (what, fault) in faults() {
            if !format!("{what} / {}", phase.name).contains(&only) {
                continue;
            }
            cases.push((phase, what, fault));
        }
    }
    let total = cases.len();
    assert!(
        total > 0,
        "FAULT_CASE={only:?} selects no case: a matrix that runs nothing proves nothing"
    );
    let queue = Mutex::new(cases);
    let failures = Mutex::new(Vec::new());
    let started = Instant::now();
    // Each case is its own apiserver, daemon and agent; most of their time is waiting.
    std::thread::scope(|scope| {
        for _ in 0..6 {
            scope.spawn(|| {
                loop {
                    let Some((phase, what, fault)) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    let name = format!("{what} / {}", phase.name);
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_case(phase, fault)
                    }));
                    if let Err(e) = result {
                        let msg = e
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        failures.lock().unwrap().push(format!("{name}: {msg}"));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    eprintln!(
        "fault matrix: {total} cases, {} failed, {:.1}s",
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "failed cases:\n{}",
        failures.join("\n\n")
    );
}
