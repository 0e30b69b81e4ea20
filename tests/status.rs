//! `cmpoll status`: the real binary asks a real daemon (and reads its folder) while a module
//! is rejected and a reload fails, then again once both are put right.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::util::http::{listening, until_body};
use crate::util::{Cmpoll, Daemon, Run, SOON, cluster, module};

/// `cmpoll status ARGS` with `env`, as an operator runs it beside the daemon.
fn status(env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut c = Cmpoll::new();
    for (k, v) in env {
        c = c.env(k, v);
    }
    let mut all = vec!["status"];
    all.extend(args);
    c.with_args(&all).run()
}

fn module_row<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    (report["modules"].as_array().unwrap().iter())
        .find(|m| m["module"] == id)
        .unwrap_or_else(|| panic!("no {id} in {report:#}"))
}

#[test]
fn status_from_a_daemon_and_from_its_folder_with_a_rejection_and_a_failing_reload() {
    let (s, c) = cluster(&[("a", "good", "fine"), ("a", "bad", "reject-me")]);
    let good_rv = s.get("a", "good").unwrap().resource_version.to_string();
    let reload_ok = Arc::new(AtomicBool::new(false));
    let url = crate::ops::reload_target(reload_ok.clone());
    // Outlives the daemon (whose own folder goes when it stops).
    let kept = tempfile::tempdir().unwrap();
    let out_arg = kept.path().join("out").to_str().unwrap().to_string();
    let validator = "if grep -rq reject-me .; then echo 'bad value: reject-me'; exit 1; fi";
    let d = Daemon::start(
        c,
        &[
            "--interval",
            "100ms",
            "--listen",
            "127.0.0.1:0",
            "--out-dir",
            &out_arg,
            "--validate",
            validator,
            "--reload-url",
            &url,
        ],
    );
    let addr = listening(&d);
    until_body(&addr, "/readyz", 503, "the last reload failed");
    let server = format!("http://{addr}");

    // The table: the counts, the module that is not delivered, the sink with its failing
    // reload; exit 1. Issue 42.4: the daemon is asked for no more than that.
    let run = status(&[], &["--server-url", &server]).failure(1);
    assert!(
        run.stdout
            .contains("modules: 2 (1 delivered, 1 rejected, 0 not written)"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("a/good "), "{}", run.stdout);
    // --all: every module with its state.
    let all = status(&[], &["--server-url", &server, "--all"]).failure(1);
    assert_eq!(
        all.stdout.lines().filter(|l| l.starts_with("a/")).count(),
        2
    );
    let rows: Vec<&str> = run.stdout.lines().collect();
    let row = |id: &str| {
        *rows
            .iter()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id}:\n{}", run.stdout))
    };
    assert!(row("a/bad ").contains(" rejected "), "{}", run.stdout);
    assert!(
        row("a/bad ").ends_with("bad value: reject-me"),
        "{}",
        run.stdout
    );
    let good = (all.stdout.lines())
        .find(|l| l.starts_with("a/good "))
        .unwrap_or_else(|| panic!("{}", all.stdout));
    assert!(good.contains(" delivered "), "{}", all.stdout);
    assert!(good.contains(&format!(" {good_rv}")), "{}", all.stdout);
    assert!(row("reload-url ").contains("failed: 500"), "{}", run.stdout);
    assert!(
        run.stderr
            .contains("cmpoll status: a/bad rejected: bad value: reject-me"),
        "{}",
        run.stderr
    );

    // The JSON, found from the daemon's own CMPOLL_LISTEN (kubectl exec into its container).
    let run = status(&[("CMPOLL_LISTEN", &addr)], &["--json", "--all"]).failure(1);
    let report = run.json();
    assert_eq!(report["counts"]["rejected"], 1, "{report:#}");
    // --module: that module, whatever its state.
    let one = status(
        &[("CMPOLL_LISTEN", &addr)],
        &["--json", "--module", "a/good"],
    )
    .failure(1);
    let one = one.json();
    assert_eq!(one["modules"].as_array().unwrap().len(), 1, "{one:#}");
    assert_eq!(module_row(&one, "a/good")["state"], "delivered");
    assert_eq!(report["lastPoll"]["result"], "ok", "{report:#}");
    assert_eq!(report["ready"], false);
    assert_eq!(module_row(&report, "a/good")["state"], "delivered");
    assert_eq!(
        module_row(&report, "a/good")["resourceVersion"],
        good_rv.as_str()
    );
    assert_eq!(module_row(&report, "a/bad")["state"], "rejected");
    let reloads = &report["sinks"][1]["reloads"];
    assert_eq!(report["sinks"][1]["sink"], "reload-url");
    assert_eq!(reloads[0]["result"], "error", "{report:#}");
    // The folder's own record says the same of the modules (the validator's exit status
    // only: a folder does not say which modules are Secrets).
    let run = status(&[], &["--out-dir", &out_arg]).failure(1);
    assert!(
        run.stdout.contains("validator exited with status 1"),
        "{}",
        run.stdout
    );
    let folder = status(&[], &["--out-dir", &out_arg, "--json", "--all"])
        .failure(1)
        .json();
    assert_eq!(module_row(&folder, "a/bad")["state"], "rejected");
    assert_eq!(
        module_row(&folder, "a/good")["hash"],
        module_row(&report, "a/good")["hash"]
    );

    // Both put right: exit 0 from the daemon, then from its folder once it has stopped.
    reload_ok.store(true, Ordering::SeqCst);
    s.put(module("a", "bad", "fixed"));
    let start = Instant::now();
    let run = loop {
        let run = status(&[], &["--server-url", &server]);
        if run.code == Some(0) {
            break run;
        }
        assert!(
            start.elapsed() < SOON,
            "status never healthy:\n{}",
            run.described
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(run.stdout.contains("ready: yes"), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("modules: 2 (2 delivered, 0 rejected, 0 not written)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("every module is delivered"),
        "{}",
        run.stdout
    );
    d.stop();
    let run = status(&[], &["--out-dir", &out_arg, "--all"]).success();
    assert_eq!(
        run.stdout.matches(" delivered ").count(),
        2,
        "{}",
        run.stdout
    );
}

#[test]
fn status_errors_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let run = status(&[], &["--out-dir", path]).failure(2);
    assert!(
        run.error_line()
            .contains("not an output folder cmpoll has written"),
        "{}",
        run.stderr
    );
    let run = status(&[], &["--out-dir", path, "--server-url", "http://x"]).failure(2);
    assert_eq!(
        run.error_line(),
        "--out-dir: not used with --server-url: give one (a daemon to ask, or a folder to read)"
    );
    // Nothing listens there: exit 1, saying where it asked.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let run = status(&[("CMPOLL_LISTEN", &free.to_string())], &[]).failure(1);
    assert!(
        run.error_line()
            .starts_with(&format!("cannot ask http://{free}/status: ")),
        "{}",
        run.stderr
    );
}

/// A cmpoll listing both kinds restarts with a rejection on record (its `rejected.json`
/// holds kind-qualified ids: it was a start-up error), and `cmpoll status --out-dir` reads
/// that record.
#[test]
fn both_kinds_restart_with_a_rejection_on_record() {
    let c = Cmpoll::new();
    c.write(
        "m/cms.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: good, namespace: a, labels: {cmpoll.io/module: 'true'}}\ndata: {k: fine}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad, namespace: a, labels: {cmpoll.io/module: 'true'}}\ndata: {k: reject-me}\n",
    );
    let m = c.path("m");
    let out = c.path("out");
    let args = [
        "run",
        "--once",
        "--resource",
        "configmaps,secrets",
        "--manifests",
        m.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
        "--validate",
        "! grep -rq reject-me .",
    ];
    c.with_args(&args).run().success();
    c.with_args(&args).run().success();
    let run = c
        .with_args(&["status", "--out-dir", out.to_str().unwrap(), "--all"])
        .run()
        .failure(1);
    let bad = (run.stdout.lines())
        .find(|l| l.starts_with("configmap/a/bad "))
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(bad.contains(" rejected "), "{}", run.stdout);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("configmap/a/good ") && l.contains(" delivered ")),
        "{}",
        run.stdout
    );
}
