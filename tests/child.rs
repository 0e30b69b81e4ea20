//! Supervising the agent (`cmpoll run -- AGENT`) and the reload URL, with real child
//! programs: small shell scripts that log what they get and trap signals.

use std::time::{Duration, Instant};

use test_apiserver::TestApiserver;

use crate::util::http::reload_server;
use crate::util::{
    Cmpoll, KillOnDrop, SOON, agent_env, cluster, deaf_agent, eventually, heard, lines, module,
    recording_agent, script,
};

#[test]
fn the_agent_gets_the_full_state_then_live_batches_and_a_signal_after_the_folder() {
    let s = TestApiserver::start();
    s.put(module("ns", "m", "v1"));
    s.put(module("ns", "other", "x"));
    let c = agent_env(Cmpoll::against(&s));
    let agent = recording_agent(&c);
    let (log, stdin) = (c.path("logs/agent.log"), c.path("logs/stdin.log"));
    let out = c.out();
    let mut d = c.daemon(&[
        "--interval",
        "30ms",
        "--out-dir",
        out.to_str().unwrap(),
        "--child-stdin",
        "events",
        "--reload-signal",
        "HUP",
        "--",
        agent.to_str().unwrap(),
    ]);
    eventually("the full state on stdin", SOON, || heard(&stdin).len() >= 3);
    let first = heard(&stdin);
    assert!(
        first[0].starts_with(r#"{"type":"added","module":"ns/m""#),
        "{first:?}"
    );
    assert!(first[1].starts_with(r#"{"type":"added","module":"ns/other""#));
    assert!(first[2].starts_with(r#"{"type":"synced","modules":2,"added":2"#));
    assert_eq!(
        lines(&log).len(),
        1,
        "no signal for the state it started with"
    );

    s.put(module("ns", "m", "v2"));
    eventually("the update on stdin", SOON, || heard(&stdin).len() >= 5);
    let l = heard(&stdin);
    assert!(
        l[3].starts_with(r#"{"type":"updated","module":"ns/m""#),
        "{l:?}"
    );
    assert!(l[3].contains(r#""files":{"k":"v2"}"#));
    assert!(l[4].starts_with(r#"{"type":"synced","modules":2,"added":0,"updated":1"#));
    eventually("the HUP", SOON, || {
        lines(&log).iter().any(|l| l.starts_with("hup"))
    });
    assert_eq!(
        lines(&log)[1],
        "hup v2",
        "the folder held the new content when HUP came"
    );

    // A label-only edit is no batch: no signal, nothing on stdin (two polls after it).
    s.put(module("ns", "m", "v2").label("x", "y"));
    d.quiet_through(&s, 2, 1);
    assert_eq!(lines(&log).len(), 2);
    assert_eq!(heard(&stdin).len(), 5);
    assert!(d.is_running());
    d.signal("TERM");
    assert_eq!(d.wait(SOON), Some(0));
    assert_eq!(
        lines(&log).last().map(String::as_str),
        Some("term"),
        "SIGTERM reached the agent"
    );
}

#[test]
fn a_killed_agent_is_restarted_with_backoff_and_gets_the_full_state_again() {
    let s = TestApiserver::start();
    s.put(module("ns", "m", "v1"));
    let c = agent_env(Cmpoll::against(&s));
    let agent = recording_agent(&c);
    let (log, stdin) = (c.path("logs/agent.log"), c.path("logs/stdin.log"));
    let d = c.daemon(&[
        "--interval",
        "30ms",
        "--child-stdin",
        "events",
        "--stdout-events",
        "--",
        agent.to_str().unwrap(),
    ]);
    d.batch(SOON);
    eventually("started", SOON, || lines(&log).len() == 1);
    let pid: i32 = lines(&log)[0].trim_start_matches("start ").parse().unwrap();
    s.put(module("ns", "m", "v2"));
    d.batch(SOON);
    eventually("the update reached the first agent", SOON, || {
        heard(&stdin).len() >= 4
    });
    let killed = Instant::now();
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    eventually("restarted", SOON, || {
        lines(&log)
            .iter()
            .filter(|l| l.starts_with("start"))
            .count()
            == 2
    });
    assert!(
        killed.elapsed() >= Duration::from_millis(900),
        "restarted after the 1 s backoff"
    );
    eventually("the full state again", SOON, || heard(&stdin).len() >= 6);
    let l = heard(&stdin);
    assert!(
        l[4].starts_with(r#"{"type":"added","module":"ns/m""#),
        "{l:?}"
    );
    assert!(l[4].contains(r#""k":"v2""#));
    assert!(l[5].starts_with(r#"{"type":"synced","modules":1,"added":1"#));
    assert!(
        d.stderr()
            .contains("agent was killed by SIGKILL; restarting it in 1s"),
        "{}",
        d.stderr()
    );
    d.stop();
}

#[test]
fn restart_never_ends_cmpoll_with_the_agents_exit_code() {
    let (s, c) = cluster(&[("ns", "m", "v1")]);
    let agent = script(&c, "agent.sh", "sleep 0.2\nexit 7\n");
    let mut d = c.daemon(&[
        "--interval",
        "30ms",
        "--restart",
        "never",
        "--",
        agent.to_str().unwrap(),
    ]);
    assert_eq!(d.wait(SOON), Some(7));
    let c = Cmpoll::against(&s);
    let agent = script(&c, "agent.sh", "kill -TERM $$\n");
    let mut d = c.daemon(&[
        "--interval",
        "30ms",
        "--restart",
        "never",
        "--",
        agent.to_str().unwrap(),
    ]);
    assert_eq!(d.wait(SOON), Some(143), "128 + SIGTERM");
    let c = Cmpoll::against(&s);
    let agent = script(&c, "agent.sh", "exit 0\n");
    let mut d = c.daemon(&[
        "--interval",
        "30ms",
        "--restart",
        "on-failure",
        "--",
        agent.to_str().unwrap(),
    ]);
    assert_eq!(
        d.wait(SOON),
        Some(0),
        "on-failure: a clean exit ends cmpoll"
    );
}

#[test]
fn shutdown_reaches_the_process_group_and_sigkill_follows_the_grace() {
    let s = TestApiserver::start();
    s.put(module("ns", "m", "v1"));
    let c = agent_env(Cmpoll::against(&s));
    // The agent's own child must not be orphaned: it is in the agent's process group.
    let agent = script(
        &c,
        "agent.sh",
        r#"sh -c 'trap "echo grandchild-term >> \"$LOGDIR/g.log\"; exit 0" TERM; echo up >> "$LOGDIR/g.log"; while true; do sleep 0.02; done' &
trap 'echo term >> "$LOGDIR/agent.log"; wait; exit 0' TERM
while kill -0 $PPID 2>/dev/null; do sleep 0.02; done
"#,
    );
    let glog = c.path("logs/g.log");
    let alog = c.path("logs/agent.log");
    let mut d = c.daemon(&["--interval", "30ms", "--", agent.to_str().unwrap()]);
    eventually("the grandchild runs", SOON, || !lines(&glog).is_empty());
    d.signal("TERM");
    assert_eq!(d.wait(SOON), Some(0));
    assert_eq!(lines(&alog), ["term"]);
    assert_eq!(lines(&glog), ["up", "grandchild-term"]);

    // An agent that ignores SIGTERM gets SIGKILL after --shutdown-grace.
    let c = Cmpoll::against(&s);
    let agent = script(
        &c,
        "stubborn.sh",
        "trap '' TERM\nwhile kill -0 $PPID 2>/dev/null; do sleep 0.02; done\n",
    );
    let mut d = c.daemon(&[
        "--interval",
        "30ms",
        "--shutdown-grace",
        "500ms",
        "--",
        agent.to_str().unwrap(),
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    d.signal("TERM");
    assert_eq!(d.wait(SOON), Some(0));
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert!(
        d.stderr().contains("did not stop within 500ms; SIGKILL"),
        "{}",
        d.stderr()
    );
}

#[test]
fn an_agent_that_never_reads_stdin_does_not_stall_polling() {
    let s = TestApiserver::start();
    // Big modules, so the pipe fills at once.
    let big = "x".repeat(200_000);
    s.put(module("ns", "m", &big));
    let c = agent_env(Cmpoll::against(&s));
    let agent = deaf_agent(&c);
    let d = c.daemon(&[
        "--interval",
        "20ms",
        "--child-stdin",
        "events",
        "--stdout-events",
        "--",
        agent.to_str().unwrap(),
    ]);
    d.batch(SOON);
    for i in 0..5 {
        s.put(module("ns", "m", &format!("{big}{i}")));
        let b = d.batch(SOON);
        assert_eq!(b[0]["type"], "updated", "polling goes on");
    }
    d.stop();
}

#[test]
fn an_agent_too_far_behind_on_stdin_is_restarted_with_the_full_state() {
    let s = TestApiserver::start();
    let big = "y".repeat(900_000);
    s.put(module("ns", "m", "small"));
    let c = agent_env(Cmpoll::against(&s));
    let agent = deaf_agent(&c);
    let log = c.path("logs/agent.log");
    let d = c.daemon(&[
        "--interval",
        "20ms",
        "--child-stdin",
        "events",
        "--stdout-events",
        "--",
        agent.to_str().unwrap(),
    ]);
    d.batch(SOON);
    // Each update is ~1 MB of events the agent never reads: past 8 MiB it is recycled.
    for i in 0..12 {
        s.put(module("ns", "m", &format!("{big}{i}")));
        d.batch(SOON);
    }
    eventually("recycled", SOON, || lines(&log).len() >= 2);
    assert!(
        d.stderr()
            .contains("MiB behind on its stdin; restarting it"),
        "{}",
        d.stderr()
    );
    d.stop();
}

/// A tiny HTTP server: answers `codes` in turn (then 200), counting calls by method.
#[test]
fn the_reload_url_is_called_once_per_changed_batch_and_retried_on_failure() {
    let s = TestApiserver::start();
    s.put(module("ns", "m", "v1"));
    let (url, calls) = reload_server(vec![200, 503, 500]);
    let c = Cmpoll::against(&s).env("RUST_LOG", "info,cmpoll::sink::reload_url=debug");
    let out = c.out();
    let d = c.daemon(&[
        "--interval",
        "30ms",
        "--out-dir",
        out.to_str().unwrap(),
        "--reload-url",
        &url,
        "--stdout-events",
    ]);
    d.batch(SOON);
    eventually("the first batch's call", SOON, || {
        calls.lock().unwrap().len() == 1
    });
    assert_eq!(calls.lock().unwrap()[0], "POST /-/reload HTTP/1.1");
    d.quiet_through(&s, 3, 1);
    assert_eq!(calls.lock().unwrap().len(), 1, "no call without changes");
    s.put(module("ns", "m", "v2"));
    d.batch(SOON);
    // 503, then 500, then 200: three calls for one batch, with backoff between.
    eventually("the retries", Duration::from_secs(15), || {
        calls.lock().unwrap().len() == 4
    });
    // The fourth call succeeded, which ends the retries (logged at debug), and polls
    // without changes call nothing.
    eventually("the success", SOON, || {
        d.stderr().matches(": reloaded (poll ").count() == 2
    });
    d.quiet_through(&s, 3, 1);
    assert_eq!(calls.lock().unwrap().len(), 4);
    assert!(
        d.stderr()
            .contains("503 Service Unavailable; retrying in 1s"),
        "{}",
        d.stderr()
    );
    d.stop();
}

#[test]
fn as_pid_1_orphaned_grandchildren_are_reaped() {
    if !crate::util::unshare_available() {
        return;
    }
    let s = TestApiserver::start();
    s.put(module("ns", "m", "v1"));
    let c = agent_env(Cmpoll::against(&s));
    // Orphans: each inner sh exits at once, leaving its sleep to PID 1 (cmpoll).
    let agent = script(
        &c,
        "agent.sh",
        r#"for i in 1 2 3 4 5; do sh -c 'sleep 0.1 &'; done
sleep 1
zombies=$(cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == "Z"' | wc -l)
echo "pid1=$(cat /proc/1/comm) zombies=$zombies" >> "$LOGDIR/agent.log"
while true; do sleep 0.05; done
"#,
    );
    let log = c.path("logs/agent.log");
    let child = KillOnDrop(
        c.wrapped(
            &["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"],
            &["run", "--interval", "1h", "--", agent.to_str().unwrap()],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap(),
    );
    eventually("the agent's report", SOON, || !lines(&log).is_empty());
    let report = lines(&log)[0].clone();
    drop(child);
    assert_eq!(
        report, "pid1=cmpoll zombies=0",
        "cmpoll is PID 1 and reaped the orphans"
    );
}

/// `--restart on-failure`: restarted after a non-zero exit and after a signal; a clean
/// exit then ends cmpoll with status 0.
#[test]
fn restart_on_failure_after_an_error_and_a_signal_then_a_clean_exit_ends_cmpoll() {
    let s = TestApiserver::start();
    s.put(module("ns", "m", "v1"));
    let c = agent_env(Cmpoll::against(&s));
    let logs = c.path("logs");
    let agent = script(
        &c,
        "agent.sh",
        // Each file is renamed into place, the pid before the count: the test reads the
        // count while this script runs and must never see a half-written file or a count
        // whose pid is still the previous run's.
        r#"n=$(( $(cat "$LOGDIR/runs" 2>/dev/null || echo 0) + 1 ))
echo $$ > "$LOGDIR/pid.tmp" && mv "$LOGDIR/pid.tmp" "$LOGDIR/pid"
echo $n > "$LOGDIR/runs.tmp" && mv "$LOGDIR/runs.tmp" "$LOGDIR/runs"
[ $n = 1 ] && exit 3
while kill -0 $PPID 2>/dev/null; do [ -f "$LOGDIR/exit0" ] && exit 0; sleep 0.02; done
"#,
    );
    let mut d = c.daemon(&[
        "--interval",
        "1h",
        "--restart",
        "on-failure",
        "--stdout-events",
        "--",
        agent.to_str().unwrap(),
    ]);
    d.batch(SOON);
    let runs = || {
        std::fs::read_to_string(logs.join("runs"))
            .map(|s| s.trim().parse::<u32>().unwrap())
            .unwrap_or(0)
    };
    eventually("a restart after exit 3", SOON, || runs() == 2);
    let pid = std::fs::read_to_string(logs.join("pid")).unwrap();
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status()
            .unwrap()
            .success()
    );
    eventually("a restart after SIGKILL", SOON, || runs() == 3);
    let log = d.stderr();
    assert!(
        log.contains("agent exited with status 3; restarting it"),
        "{log}"
    );
    assert!(
        log.contains("agent was killed by SIGKILL; restarting it"),
        "{log}"
    );
    std::fs::write(logs.join("exit0"), "").unwrap();
    assert_eq!(d.wait(SOON), Some(0), "a clean exit ends cmpoll with 0");
}

/// r13.12: when an event cannot be queued for the agent's stdin, the agent is restarted
/// (and then gets the full state) instead of silently missing a batch. The feed file is
/// made unwritable past 128 KiB with RLIMIT_FSIZE (SIGXFSZ ignored: the write fails); the
/// module stays below the 256 KiB the spool gathers in memory before it writes.
#[test]
fn r13_a_failed_write_to_the_agents_stdin_restarts_it() {
    let prlimit = std::process::Command::new("prlimit")
        .arg("--version")
        .output();
    if crate::util::skip_unless(
        prlimit.is_ok_and(|o| o.status.success()),
        "prlimit (util-linux)",
    ) {
        return;
    }
    let s = TestApiserver::start();
    s.put(module("ns", "m", "v1"));
    let c = agent_env(Cmpoll::against(&s));
    let logs = c.path("logs");
    let agent = script(
        &c,
        "agent.sh",
        r#"echo start >> "$LOGDIR/agent.log"
exec 3<&0
cat <&3 >> "$LOGDIR/stdin-$$.log" &
while kill -0 $PPID 2>/dev/null; do sleep 0.02; done
"#,
    );
    let wrapper = [
        "sh",
        "-c",
        "trap '' XFSZ; exec prlimit --fsize=131072 -- \"$@\"",
        "sh",
    ];
    let mut cmd = c.wrapped(
        &wrapper,
        &[
            "run",
            "--interval",
            "30ms",
            "--child-stdin",
            "events",
            "--",
            agent.to_str().unwrap(),
        ],
    );
    let child = KillOnDrop(
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(c.path("cmpoll.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let starts = || lines(&logs.join("agent.log")).len();
    let explain = || {
        let log = std::fs::read_to_string(c.path("cmpoll.log")).unwrap_or_default();
        format!("agent starts: {}\ncmpoll's log:\n{log}", starts())
    };
    crate::util::eventually_explained("the agent starts", SOON, || starts() == 1, explain);
    // A module larger than what the feed file may hold: queuing its event fails.
    s.put(module("ns", "big", &"x".repeat(200 << 10)));
    crate::util::eventually_explained("the agent is restarted", SOON, || starts() >= 2, explain);
    let log = std::fs::read_to_string(c.path("cmpoll.log")).unwrap();
    assert!(
        log.contains("cannot queue events for the agent") && log.contains("restarting it"),
        "{log}"
    );
    // Once the module shrinks the restarted agent gets the full state, and it is current.
    s.put(module("ns", "big", "small"));
    let stdin_logs = || -> Vec<String> {
        std::fs::read_dir(&logs)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("stdin-"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect()
    };
    crate::util::eventually_explained(
        "an agent got the full current state",
        SOON,
        || {
            stdin_logs().iter().any(|l| {
                l.contains(r#""module":"ns/big""#)
                    && l.contains(r#""files":{"k":"small"}"#)
                    && l.contains(r#""module":"ns/m""#)
                    && !l.contains("xxxx")
            })
        },
        || {
            let sizes: Vec<usize> = stdin_logs().iter().map(String::len).collect();
            format!("agents' stdin log sizes: {sizes:?}\n{}", explain())
        },
    );
    drop(child);
}

/// The test CA's certificate, for `--reload-ca-file`.
fn https_endpoint(
    c: &Cmpoll,
) -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<crate::util::http::Call>>>,
    std::path::PathBuf,
) {
    let pki = test_apiserver::Pki::new("reload-ca");
    let ca = c.write("reload-ca.pem", &pki.ca_pem());
    let (url, calls) = crate::util::http::https_reload_server(&pki);
    (url, calls, ca)
}

/// `--reload-method` and `--reload-ca-file` against an https endpoint.
#[test]
fn reload_url_over_https_with_a_ca_file_and_another_method() {
    let (s, c) = cluster(&[("ns", "m", "v1")]);
    let (url, calls, ca) = https_endpoint(&c);
    let d = c.daemon(&[
        "--interval",
        "30ms",
        "--reload-url",
        &url,
        "--reload-method",
        "put",
        "--reload-ca-file",
        ca.to_str().unwrap(),
        "--stdout-events",
    ]);
    d.batch(SOON);
    eventually("the reload call", SOON, || {
        !calls.lock().unwrap().is_empty()
    });
    assert_eq!(calls.lock().unwrap()[0].0, "PUT /-/reload HTTP/1.1");
    d.stop();
    // Without the CA the endpoint's certificate is not trusted: the call fails.
    let c = Cmpoll::against(&s);
    let (url, calls, _) = https_endpoint(&c);
    let d = c.daemon(&["--interval", "1h", "--reload-url", &url, "--stdout-events"]);
    d.batch(SOON);
    eventually("a failed call is logged", SOON, || {
        d.stderr().contains("/-/reload failed")
    });
    assert!(calls.lock().unwrap().is_empty());
    d.stop();
}
