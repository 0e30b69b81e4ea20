//! `--reload-url` as configmap-reload and k8s-sidecar users configure it (issue 17), against
//! real local HTTP endpoints: several URLs each with its own retries, one that fails and
//! comes up late, headers (`@FILE` read at each call), basic auth from the userinfo (an
//! explicit `Authorization` wins), `--reload-skip-first`, and `--once` waiting for delivery.

use crate::util::http::{Call, reload_server_with_headers};
use crate::util::{SOON, cluster, eventually_explained, module};

fn calls(c: &std::sync::Arc<std::sync::Mutex<Vec<Call>>>) -> Vec<Call> {
    c.lock().unwrap().clone()
}

#[test]
fn every_url_is_called_with_the_headers_and_retried_until_it_answers() {
    let (s, c) = cluster(&[("ns", "m", "v1")]);
    // A answers at once; B fails six times (past the old limit of five) and then works.
    let (a, a_calls) = reload_server_with_headers(vec![]);
    let (b, b_calls) = reload_server_with_headers(vec![503, 503, 503, 503, 503, 503]);
    let b = b.replace("http://", "http://ops:s3cret@");
    let token = c.write("reload-token", "first-token\n");
    let d = c.daemon(&[
        "--interval",
        "1h",
        "--stdout-events",
        "--reload-url",
        &a,
        "--reload-url",
        &b,
        "--reload-header",
        "X-Scope: team-a, team-b",
        "--reload-header",
        &format!("X-Token: @{}", token.display()),
    ]);
    d.batch(SOON);
    let explain = || {
        format!(
            "{:?}\n{:?}\n{}",
            calls(&a_calls),
            calls(&b_calls),
            d.stderr()
        )
    };
    eventually_explained("A is called", SOON, || calls(&a_calls).len() == 1, explain);
    let first = &calls(&a_calls)[0];
    assert_eq!(first.0, "POST /-/reload HTTP/1.1");
    assert_eq!(first.1["x-scope"], "team-a, team-b");
    assert_eq!(first.1["x-token"], "first-token");
    assert!(!first.1.contains_key("authorization"));
    // B: 1 + 2 + 4 + 8 + 16 s of backoff would be too long for a test; the retries past
    // the fifth are proved by the unit test with a fast backoff. Here: B is retried,
    // carries basic auth from its userinfo, and the userinfo never reaches the log.
    eventually_explained("B is retried", SOON, || calls(&b_calls).len() >= 3, explain);
    let b_first = &calls(&b_calls)[0];
    assert_eq!(b_first.1["authorization"], "Basic b3BzOnMzY3JldA==");
    assert!(!d.stderr().contains("s3cret") && !d.stderr().contains("first-token"));
    // A rotated token file is read at the next call.
    std::fs::write(&token, "second-token\n").unwrap();
    s.put(module("ns", "m", "v2"));
    d.signal("HUP");
    d.batch(SOON);
    eventually_explained(
        "A is called again",
        SOON,
        || calls(&a_calls).len() == 2,
        explain,
    );
    assert_eq!(calls(&a_calls)[1].1["x-token"], "second-token");
    d.stop();
}

#[test]
fn an_explicit_authorization_header_wins_over_the_userinfo() {
    let (_s, c) = cluster(&[("ns", "m", "v1")]);
    let (u, u_calls) = reload_server_with_headers(vec![]);
    let u = u.replace("http://", "http://user:pw@");
    let d = c.daemon(&[
        "--interval",
        "1h",
        "--stdout-events",
        "--reload-url",
        &u,
        "--reload-header",
        "Authorization: Bearer abc",
    ]);
    d.batch(SOON);
    eventually_explained(
        "called",
        SOON,
        || !calls(&u_calls).is_empty(),
        || d.stderr(),
    );
    assert_eq!(calls(&u_calls)[0].1["authorization"], "Bearer abc");
    d.stop();
}

#[test]
fn skip_first_calls_only_after_a_change() {
    let (s, c) = cluster(&[("ns", "m", "v1")]);
    let (u, u_calls) = reload_server_with_headers(vec![]);
    let d = c.daemon(&[
        "--interval",
        "1h",
        "--stdout-events",
        "--reload-url",
        &u,
        "--reload-skip-first",
    ]);
    d.batch(SOON);
    let explain = || format!("{:?}\n{}", calls(&u_calls), d.stderr());
    // Two changes, each waited for: a call of the first batch, had there been one, was
    // made before them (one caller, in order), so the count proves it away.
    for (v, want) in [("v2", 1), ("v3", 2)] {
        s.put(module("ns", "m", v));
        d.signal("HUP");
        d.batch(SOON);
        eventually_explained(
            "the change is called",
            SOON,
            || calls(&u_calls).len() >= want,
            explain,
        );
    }
    assert_eq!(calls(&u_calls).len(), 2, "{}", explain());
    d.stop();
}

#[test]
fn once_waits_for_the_reload_and_fails_when_it_is_not_delivered() {
    let (_s, c) = cluster(&[("ns", "m", "v1")]);
    // Fails twice, then answers: --once waits through the retries and succeeds.
    let (u, u_calls) = reload_server_with_headers(vec![500, 500]);
    let run = c
        .with_args(&["run", "--once", "--reload-url", &u])
        .run()
        .success();
    assert_eq!(calls(&u_calls).len(), 3, "{}", run.described);
    // Nothing listens: exit 1 after --reload-timeout, naming the URL.
    let dead = format!(
        "http://127.0.0.1:{}/-/reload",
        crate::util::tools::free_port()
    );
    let run = c
        .with_args(&[
            "run",
            "--once",
            "--reload-url",
            &dead,
            "--reload-timeout",
            "2s",
        ])
        .run()
        .failure(1);
    let line = run.error_line();
    assert!(
        line.contains("not delivered") && line.contains(&dead),
        "{}",
        run.described
    );
}

/// A reload call without a body is framed as Python's requests frames it (k8s-sidecar's
/// client for REQ_URL; Go's client does the same): a POST says `Content-Length: 0`, a GET
/// sends no body; never `Transfer-Encoding: chunked`, whose terminator an endpoint that
/// reads only the head leaves unread (closing on it resets the connection, and a reload
/// the agent made looked failed: seen on a loaded CI machine).
#[test]
fn an_empty_reload_is_framed_as_requests_frames_it() {
    let (_s, c) = cluster(&[("ns", "m", "v1")]);
    let (url, seen) = reload_server_with_headers(vec![]);
    let framing = |calls: Vec<Call>| -> Vec<(String, Option<String>, Option<String>)> {
        (calls.into_iter())
            .map(|(line, h)| {
                let te = h.get("transfer-encoding").cloned();
                (line, h.get("content-length").cloned(), te)
            })
            .collect()
    };
    for method in ["POST", "GET"] {
        let oracle = std::process::Command::new(crate::util::tools::python())
            .args([
                "-c",
                "import requests, sys; requests.request(sys.argv[1], sys.argv[2], timeout=10).raise_for_status()",
                method,
                &url,
            ])
            .status()
            .unwrap();
        assert!(oracle.success(), "python requests {method}");
    }
    let oracle = framing(std::mem::take(&mut *seen.lock().unwrap()));
    for method in ["POST", "GET"] {
        let args = [
            "run",
            "--once",
            "--reload-url",
            &url,
            "--reload-method",
            method,
        ];
        c.with_args(&args).run().success();
    }
    let ours = framing(calls(&seen));
    assert_eq!(
        oracle[0].1.as_deref(),
        Some("0"),
        "requests' POST: {oracle:?}"
    );
    assert_eq!(ours, oracle);
}

/// `--on-change` (k8s-sidecar's SCRIPT): after each batch with changes, once the folder is
/// written, with the counts and the absolute folder; a failure or a hang (killed with its
/// process group after --reload-timeout) is a failed reload; `--once` fails with it.
#[test]
fn on_change_runs_after_the_folder_is_written() {
    let (s, c) = cluster(&[("ns", "m", "v1")]);
    let log = c.path("on-change.log");
    let cmd = format!(
        "echo \"$CMPOLL_ADDED $CMPOLL_UPDATED $CMPOLL_REMOVED $CMPOLL_OUT_DIR $(cat \"$CMPOLL_OUT_DIR/ns/m/k\" 2>/dev/null)\" >> {}",
        log.display()
    );
    let d = c.daemon(&[
        "--interval",
        "1h",
        "--stdout-events",
        "--out-dir",
        "out",
        "--on-change",
        &cmd,
    ]);
    d.batch(SOON);
    let out = std::fs::canonicalize(d.cmd().path("out")).unwrap();
    let lines = || crate::util::lines(&log);
    assert_eq!(
        lines(),
        [format!("1 0 0 {} v1", out.display())],
        "{}",
        d.stderr()
    );
    s.put(module("ns", "m", "v2"));
    d.signal("HUP");
    d.batch(SOON);
    assert_eq!(lines()[1], format!("0 1 0 {} v2", out.display()));
    // A poll without changes runs nothing: the removal's poll comes after it (one poll at
    // a time), so its run being the third proves the moment passed.
    let lists = || s.requests().iter().filter(|r| r.is_list()).count();
    let before = lists();
    d.signal("HUP");
    eventually_explained(
        "the no-change poll",
        SOON,
        || lists() > before,
        || d.stderr(),
    );
    s.delete("ns", "m");
    d.signal("HUP");
    d.batch(SOON);
    assert_eq!(lines().len(), 3, "{:?}", lines());
    assert_eq!(lines()[2], format!("0 0 1 {} ", out.display()));
    d.stop();
}

/// A hang is killed with its process group; `--once` exits 1 for it, and for a failure.
#[test]
fn on_change_failures_and_hangs_fail_once() {
    let (_s, c) = cluster(&[("ns", "m", "v1")]);
    let marker = c.path("child-of-on-change");
    let hang = format!("sleep 30 & echo $! > {}; wait", marker.display());
    let run = c
        .with_args(&[
            "run",
            "--once",
            "--on-change",
            &hang,
            "--reload-timeout",
            "1s",
        ])
        .run()
        .failure(1);
    assert!(
        run.error_line()
            .contains("--on-change: killed after --reload-timeout 1s"),
        "{}",
        run.described
    );
    let pid = std::fs::read_to_string(&marker).unwrap();
    // Gone, or a zombie waiting for whoever inherited it: not running.
    let running = || {
        std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).is_ok_and(|st| {
            st.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
    };
    eventually_explained(
        "the command's own child is killed",
        SOON,
        || !running(),
        || pid.clone(),
    );
    let run = c
        .with_args(&["run", "--once", "--on-change", "exit 3"])
        .run()
        .failure(1);
    assert!(
        run.error_line()
            .contains("--on-change: exited with status 3"),
        "{}",
        run.described
    );
}
