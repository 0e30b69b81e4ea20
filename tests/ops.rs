//! Operations: the endpoints across a daemon's life, metrics a real Prometheus parser
//! accepts, sd_notify on a real socket, and JSON logs.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use test_apiserver::{Fault, Match, TestApiserver};

use crate::util::http::{get, listening, until, until_body};
use crate::util::{Cmpoll, Daemon, SOON, cluster, module};

pub fn reload_target(ok: std::sync::Arc<std::sync::atomic::AtomicBool>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/-/reload", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for c in l.incoming() {
            let mut c = c.unwrap();
            // The whole request before the answer: closing with a part of it unread
            // resets the connection, and the daemon would see that instead of the code.
            read_request(&mut c);
            let code = if ok.load(std::sync::atomic::Ordering::SeqCst) {
                200
            } else {
                500
            };
            let _ = write!(
                c,
                "HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    url
}

/// Reads one request from `c`: its head, then as many body bytes as it says it has.
fn read_request(c: &mut std::net::TcpStream) {
    let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match c.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    let length: usize = (head.lines())
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while got.len() < head_end + length {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn endpoints_across_start_up_failures_reloads_and_recovery() {
    let s = TestApiserver::start();
    s.put(module("a", "m", "1"));
    s.fault_always(Match::lists(), Fault::InternalError);
    let reload_ok = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let url = reload_target(reload_ok.clone());
    let d = Daemon::start(
        Cmpoll::against(&s),
        &[
            "--interval",
            "50ms",
            "--listen",
            "127.0.0.1:0",
            "--reload-url",
            &url,
            "--stdout-events",
        ],
    );
    let addr = listening(&d);
    // Start-up with a failing apiserver: alive, not ready, and it says why.
    assert_eq!(get(&addr, "/healthz").0, 200);
    let body = until(&addr, "/readyz", 503);
    assert!(body.starts_with("no complete poll yet"), "{body}");
    let body = until_body(&addr, "/readyz", 503, "500 InternalError");
    assert!(body.starts_with("no complete poll yet: "), "{body}");
    // Success.
    s.clear_faults();
    d.batch(SOON);
    assert_eq!(until(&addr, "/readyz", 200), "ready\n");
    // Failed polls for longer than 3 x interval + the backoff cap (0.15 s + 0.5 s).
    s.fault_always(Match::lists(), Fault::Unavailable(0));
    let body = until_body(&addr, "/readyz", 503, "the last successful poll was");
    assert!(body.contains("503 ServiceUnavailable"), "{body}");
    assert_eq!(
        get(&addr, "/healthz").0,
        200,
        "failing polls are not a dead loop"
    );
    s.clear_faults();
    until(&addr, "/readyz", 200);
    // A failing reload URL makes cmpoll unready until a reload succeeds again.
    reload_ok.store(false, std::sync::atomic::Ordering::SeqCst);
    s.put(module("a", "m", "2"));
    d.batch(SOON);
    until_body(&addr, "/readyz", 503, "the last reload failed: 500");
    reload_ok.store(true, std::sync::atomic::Ordering::SeqCst);
    until(&addr, "/readyz", 200);
    assert_eq!(get(&addr, "/nope").0, 404);
    d.stop();
}

/// Parses OpenMetrics text with the Python prometheus_client: {"name{labels}": value}.
fn parse_metrics(text: &str) -> serde_json::Value {
    let script = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        out[f"{s.name}{{{labels}}}"] = s.value
print(json.dumps(out))
"#;
    let mut child = std::process::Command::new(crate::util::tools::python())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python (bash .ci/run installs prometheus_client)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the parser refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The metrics (parsed by the Prometheus client) once `key` reads `value`, or at `SOON`:
/// they follow the sinks, so a batch on stdout may be a moment ahead of them.
fn metrics_once(addr: &str, key: &str, value: f64) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let m = parse_metrics(&get(addr, "/metrics").1);
        if m[key] == value || start.elapsed() > SOON {
            return m;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn metrics_parse_with_prometheus_client_and_counters_move() {
    let s = TestApiserver::start();
    s.put(module("a", "one", "1"));
    s.put(module("a", "two", "2"));
    let d = Daemon::start(
        Cmpoll::against(&s),
        &[
            "--interval",
            "30ms",
            "--listen",
            "127.0.0.1:0",
            "--stdout-events",
        ],
    );
    let addr = listening(&d);
    d.batch(SOON);
    let (code, _) = get(&addr, "/metrics");
    assert_eq!(code, 200);
    let m = metrics_once(&addr, "cmpoll_modules{}", 2.0);
    assert_eq!(m["cmpoll_modules{}"], 2.0);
    assert_eq!(m["cmpoll_events_total{type=added}"], 2.0);
    assert!(m["cmpoll_polls_total{result=success}"].as_f64().unwrap() >= 1.0);
    assert!(
        m["cmpoll_apiserver_requests_total{code=200}"]
            .as_f64()
            .unwrap()
            >= 1.0
    );
    assert!(
        m["cmpoll_apiserver_response_bytes_total{}"]
            .as_f64()
            .unwrap()
            > 100.0
    );
    assert!(
        m["cmpoll_last_success_timestamp_seconds{}"]
            .as_f64()
            .unwrap()
            > 1.7e9
    );
    assert!(
        m.as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("cmpoll_poll_duration_seconds_bucket"))
    );
    s.put(module("a", "one", "changed"));
    s.delete("a", "two");
    s.fault(Match::lists(), Fault::InternalError, 2);
    d.batch(SOON);
    // The update and the removal may land in two polls (30 ms apart), and the two failed
    // lists before, between or after them: wait for every counter, then check them all.
    let want = [
        ("cmpoll_events_total{type=updated}", 1.0),
        ("cmpoll_events_total{type=removed}", 1.0),
        ("cmpoll_modules{}", 1.0),
        ("cmpoll_polls_total{result=error}", 2.0),
    ];
    let start = Instant::now();
    let m = loop {
        let m = parse_metrics(&get(&addr, "/metrics").1);
        if want.iter().all(|(k, v)| m[*k] == *v) || start.elapsed() > SOON {
            break m;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(m["cmpoll_events_total{type=updated}"], 1.0);
    assert_eq!(m["cmpoll_events_total{type=removed}"], 1.0);
    assert_eq!(m["cmpoll_modules{}"], 1.0);
    assert_eq!(m["cmpoll_polls_total{result=error}"], 2.0);
    assert_eq!(m["cmpoll_apiserver_requests_total{code=500}"], 2.0);
    d.stop();
}

#[test]
fn sd_notify_ready_after_the_first_batch_then_watchdog_status_and_stopping() {
    let (_s, c) = cluster(&[("a", "m", "1")]);
    let sock_path = c.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(SOON)).unwrap();
    let c = c
        .env("NOTIFY_SOCKET", sock_path.to_str().unwrap())
        .env("WATCHDOG_USEC", "200000");
    let d = c.daemon(&["--interval", "1h", "--stdout-events"]);
    let recv = || {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m.contains("READY=1")) {
        seen.push(recv());
    }
    assert_eq!(seen.last().unwrap(), "READY=1\nSTATUS=1 modules");
    assert!(
        seen[..seen.len() - 1].iter().all(|m| m == "WATCHDOG=1"),
        "{seen:?}"
    );
    d.batch(SOON);
    // The watchdog keeps coming (every 100 ms) while cmpoll idles for an hour.
    let t = Instant::now();
    let pings = (0..5).map(|_| recv()).filter(|m| m == "WATCHDOG=1").count();
    assert_eq!(pings, 5);
    assert!(t.elapsed() < Duration::from_secs(2));
    d.signal("TERM");
    loop {
        let m = recv();
        if m == "STOPPING=1" {
            break;
        }
        assert_eq!(m, "WATCHDOG=1");
    }
}

#[test]
fn json_logs_are_one_object_per_line() {
    let s = TestApiserver::start();
    s.put(module("a", "m", "1"));
    s.fault(Match::lists(), Fault::InternalError, 1);
    let parse = |stderr: &str| -> Vec<serde_json::Value> {
        stderr
            .lines()
            .map(|line| {
                let v: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                for field in ["timestamp", "level", "target", "message"] {
                    assert!(v.get(field).is_some(), "{field} missing: {line}");
                }
                v
            })
            .collect()
    };
    // Even the final error of a failed run is a JSON line.
    let run = Cmpoll::against(&s)
        .args(&["run", "--once", "--log-format", "json"])
        .run()
        .failure(1);
    let last = parse(&run.stderr).pop().unwrap();
    assert_eq!(last["level"], "error");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("500 InternalError")
    );
    let run = Cmpoll::against(&s)
        .env("RUST_LOG", "debug")
        .args(&["run", "--once", "--log-format", "json"])
        .run()
        .success();
    let lines = parse(&run.stderr);
    assert!(lines.len() >= 2, "{}", run.stderr);
    assert!(
        lines
            .iter()
            .any(|l| l["level"] == "info" && l["target"] == "cmpoll::daemon")
    );
}

/// Under systemd (stderr is the journal's stream, named by `JOURNAL_STREAM`), every line
/// carries its sd-daemon(3) priority, the final error included; with a stale
/// `JOURNAL_STREAM` (another stream's) lines stay plain.
#[test]
fn journal_lines_carry_their_priority() {
    use std::os::unix::fs::MetadataExt as _;
    let s = TestApiserver::start();
    s.put(module("a", "m", "1"));
    s.fault(Match::lists(), Fault::InternalError, 4);
    let c = Cmpoll::against(&s).env("RUST_LOG", "debug");
    let run = |format: &str, stale: bool| -> Vec<String> {
        let path = c.path(&format!("stderr-{format}-{stale}"));
        let file = std::fs::File::create(&path).unwrap();
        let m = file.metadata().unwrap();
        let stream = format!("{}:{}", m.dev(), m.ino() + u64::from(stale));
        let mut cmd = c.command();
        cmd.args(["run", "--once", "--log-format", format])
            .env("JOURNAL_STREAM", stream)
            .stdout(std::process::Stdio::null())
            .stderr(file);
        let mut child = crate::util::KillOnDrop(cmd.spawn().unwrap());
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.0.try_wait().unwrap() {
                break st;
            }
            assert!(start.elapsed() < SOON, "cmpoll did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(status.code(), Some(1));
        std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    };
    for format in ["text", "json"] {
        let lines = run(format, false);
        assert!(
            lines.iter().any(|l| l.starts_with("<7>"))
                && lines.iter().any(|l| l.starts_with("<6>")),
            "{lines:?}"
        );
        for l in &lines {
            assert!(
                ["<3>", "<4>", "<6>", "<7>"]
                    .iter()
                    .any(|p| l.starts_with(p)),
                "{l}"
            );
        }
        let last = lines.last().unwrap();
        assert!(
            last.starts_with("<3>") && last.contains("500 InternalError"),
            "{last}"
        );
        if format == "json" {
            let v: serde_json::Value = serde_json::from_str(&last[3..]).unwrap();
            assert_eq!(v["level"], "error");
        }
        let plain = run(format, true);
        assert!(plain.iter().all(|l| !l.starts_with('<')), "{plain:?}");
        assert!(plain.last().unwrap().contains("500 InternalError"));
    }
}
