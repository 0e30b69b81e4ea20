//! `--validate CMD` (issue 18): the agent only ever sees the last known good version of a
//! module. Real validators: a shell script, Debian's `promtool` beside a running
//! Prometheus, and `nginx -t` on a configuration that includes only the staged module.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use test_apiserver::TestApiserver;

use crate::agents::{prometheus_log, prometheus_up, rule_file_flags, rules, site};
use crate::util::tools::{curl, free_port, prometheus_rules, tool};
use crate::util::{
    Cmpoll, Daemon, SOON, eventually, eventually_explained, kinds, labelled, lines, map,
    skip_unless, spec_hash, tree,
};

/// A validator that logs each run to `runs` and refuses any file containing `BAD`.
fn marker_validator(runs: &Path) -> String {
    format!(
        "echo \"$CMPOLL_MODULE $CMPOLL_HASH\" >> '{}'; if grep -l BAD \"$CMPOLL_MODULE_DIR\"/*; then echo \"BAD marker in $CMPOLL_MODULE\" >&2; exit 1; fi",
        runs.display()
    )
}

fn module(ns: &str, name: &str, v: &str) -> test_apiserver::ConfigMap {
    labelled(ns, name).data("k.conf", v)
}

fn count(runs: &Path) -> usize {
    lines(runs).len()
}

#[test]
fn a_rejected_version_never_reaches_the_agent_and_is_validated_once() {
    let s = TestApiserver::start();
    s.put(module("ns", "m", "good 1"));
    let c = Cmpoll::against(&s);
    let keep = tempfile::tempdir().unwrap();
    let out = keep.path().join("out");
    let runs = keep.path().join("runs");
    let validator = marker_validator(&runs);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let sinks = [
        "--out-dir",
        out.to_str().unwrap(),
        "--stdout-events",
        "--validate",
        &validator,
    ];
    let mut args = vec!["--interval", "30ms", "--listen", &listen];
    args.extend(sinks);
    let d = Daemon::start(c, &args);
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "added");
    assert_eq!(count(&runs), 1);
    let file = out.join("ns/m/k.conf");
    let before = fs::metadata(&file).unwrap();
    let link = fs::read_link(out.join("ns/m")).unwrap();

    // An update to bad content: the old files stay, one `rejected` with the output.
    s.put(module("ns", "m", "BAD 2"));
    let b = d.batch(SOON);
    let bad_hash = spec_hash(&[("k.conf", b"BAD 2")]);
    assert_eq!(b.len(), 2, "{b:?}");
    assert_eq!(
        (
            b[0]["type"].as_str(),
            b[0]["module"].as_str(),
            b[0]["hash"].as_str()
        ),
        (Some("rejected"), Some("ns/m"), Some(bad_hash.as_str()))
    );
    let reason = b[0]["reason"].as_str().unwrap();
    assert!(reason.contains("BAD marker in ns/m"), "{reason}");
    assert!(
        reason.contains("k.conf"),
        "stdout and stderr together: {reason}"
    );
    assert_eq!(
        (b[1]["modules"].as_u64(), b[1]["rejected"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(fs::read_to_string(&file).unwrap(), "good 1");
    let after = fs::metadata(&file).unwrap();
    assert_eq!(
        (after.ino(), after.mtime_nsec()),
        (before.ino(), before.mtime_nsec())
    );
    assert_eq!(fs::read_link(out.join("ns/m")).unwrap(), link);
    // The same bad content on later polls: the validator does not run again.
    d.quiet_through(&s, 3, 1);
    assert_eq!(count(&runs), 2);
    let (code, metrics) = curl(&format!("http://{listen}/metrics")).unwrap();
    assert_eq!(code, 200);
    for line in [
        "cmpoll_validations_total{result=\"pass\"} 1",
        "cmpoll_validations_total{result=\"fail\"} 1",
        "cmpoll_rejected_modules 1",
        "cmpoll_events_total{type=\"rejected\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert_eq!(
        curl(&format!("http://{listen}/readyz")).unwrap().0,
        200,
        "the agent runs the last good config"
    );
    let warnings = d
        .stderr()
        .lines()
        .filter(|l| l.contains("module ns/m rejected"))
        .count();
    assert_eq!(warnings, 1, "logged once per hash:\n{}", d.stderr());

    // A good update goes out; a new bad module never appears anywhere.
    s.put(module("ns", "m", "good 3"));
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["files"]["k.conf"].as_str()),
        (Some("updated"), Some("good 3"))
    );
    let good = b[0].clone();
    s.put(module("ns", "new", "BAD new"));
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "rejected");
    assert!(b[0].get("files").is_none());
    assert!(!out.join("ns/new").exists());
    // Bad again, then a restart with the bad content in the cluster: the good version stays.
    s.put(module("ns", "m", "BAD 4"));
    assert_eq!(d.batch(SOON)[0]["type"], "rejected");
    d.stop();
    let runs_before = count(&runs);
    let mut once = vec!["run", "--once"];
    once.extend(sinks);
    let r = Cmpoll::against(&s).with_args(&once).run().success();
    assert_eq!(
        tree(&out),
        map(&[("ns/m/k.conf", "good 3")]),
        "{}",
        r.stderr
    );
    assert_eq!(
        count(&runs),
        runs_before,
        "remembered across the restart: {}",
        r.stderr
    );
    // What the sinks hold is announced as this run's stdout consumer never heard it: the
    // good version as it was published (uid, resourceVersion, files), then the rejection.
    let events: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        kinds(&events),
        [
            ("added", "ns/m"),
            ("rejected", "ns/m"),
            ("rejected", "ns/new"),
            ("synced", "")
        ],
        "{}",
        r.stdout
    );
    for field in ["hash", "uid", "resourceVersion", "files"] {
        assert_eq!(events[0][field], good[field], "{field}: {}", r.stdout);
    }
    assert_eq!(
        (events[3]["modules"].as_u64(), events[3]["added"].as_u64()),
        (Some(1), Some(1))
    );
    // The good version comes back to the cluster: published again, validated again.
    s.put(module("ns", "m", "good 3"));
    s.delete("ns", "new");
    Cmpoll::against(&s).with_args(&once).run().success();
    assert_eq!(tree(&out), map(&[("ns/m/k.conf", "good 3")]));
    assert!(
        !fs::read_to_string(out.join(".cmpoll/rejected.json"))
            .unwrap()
            .contains("ns/m"),
        "no longer rejected"
    );
}

/// A rejection already announced is not news: with stdout the only sink, later polls of the
/// same refused content print nothing (not even an empty `synced`).
#[test]
fn a_remembered_rejection_prints_nothing_on_later_polls() {
    let s = TestApiserver::start();
    s.put(module("ns", "a", "BAD"));
    let d = Daemon::start(
        Cmpoll::against(&s),
        &[
            "--interval",
            "30ms",
            "--validate",
            "! grep -q BAD \"$CMPOLL_MODULE_FILE\"",
        ],
    );
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "rejected");
    d.quiet_through(&s, 3, 1);
    d.stop();
}

/// With stdout or an agent only, modules are still staged for the validator, and every
/// (re)started agent gets the last good versions.
#[test]
fn without_a_folder_the_agent_still_gets_only_good_versions() {
    let s = TestApiserver::start();
    s.put(module("ns", "a", "good"));
    s.put(module("ns", "b", "BAD"));
    let c = Cmpoll::against(&s);
    let keep = tempfile::tempdir().unwrap();
    let seen = keep.path().join("seen");
    let agent = format!("cat > '{}'", seen.display());
    let validator = "! grep -q BAD \"$CMPOLL_MODULE_FILE\"";
    let d = Daemon::start(
        c,
        &[
            "--interval",
            "30ms",
            "--validate",
            validator,
            "--child-stdin",
            "events",
            "--stdout-events",
            "--",
            "/bin/sh",
            "-c",
            &agent,
        ],
    );
    let b = d.batch(SOON);
    let kinds: Vec<&str> = b.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["added", "rejected", "synced"]);
    eventually("the agent got its initial state", SOON, || {
        fs::read_to_string(&seen).is_ok_and(|t| t.contains("\"synced\""))
    });
    // A remembered rejection is not news: stdout stays quiet while polls go on.
    d.quiet_through(&s, 3, 1);
    // The agent starts after the first batch, with the state the sinks hold: ns/a only.
    let fed = fs::read_to_string(&seen).unwrap();
    assert!(fed.contains("\"ns/a\"") && !fed.contains("ns/b"), "{fed}");
    assert!(!fed.contains("BAD"), "{fed}");
    d.stop();
}

#[test]
fn a_hanging_validator_is_killed_with_its_children_and_a_missing_one_fails_readiness() {
    let s = TestApiserver::start();
    s.put(module("ns", "m", "x"));
    let c = Cmpoll::against(&s);
    let keep = tempfile::tempdir().unwrap();
    let pid = keep.path().join("pid");
    // The pid is renamed into place, so the test never reads half of it.
    let hang = format!(
        "sleep 300 & echo $! > '{0}.tmp' && mv '{0}.tmp' '{0}'; sleep 300",
        pid.display()
    );
    let r = c
        .with_args(&[
            "run",
            "--once",
            "--validate",
            &hang,
            "--validate-timeout",
            "1s",
        ])
        .run()
        .success();
    assert!(
        r.stdout.contains("killed after --validate-timeout 1s"),
        "{}",
        r.stdout
    );
    let child: i32 = fs::read_to_string(&pid).unwrap().trim().parse().unwrap();
    eventually("the validator's child is gone", SOON, || {
        !Path::new(&format!("/proc/{child}")).exists()
            || fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|s| s.contains(") Z "))
    });

    // A validator that cannot run (127): readiness says so until one runs again.
    let script = keep.path().join("validator.sh");
    let validator = format!("'{}'", script.display());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = Daemon::start(
        c,
        &[
            "--interval",
            "30ms",
            "--listen",
            &listen,
            "--validate",
            &validator,
        ],
    );
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "rejected");
    let readyz = || curl(&format!("http://{listen}/readyz")).unwrap_or_default();
    eventually_explained(
        "readiness fails",
        SOON,
        || {
            let (code, body) = readyz();
            code == 503 && body.contains("validator cannot run")
        },
        || format!("{:?}", readyz()),
    );
    let metrics = curl(&format!("http://{listen}/metrics")).unwrap().1;
    assert!(
        metrics.contains("cmpoll_validations_total{result=\"error\"}"),
        "{metrics}"
    );
    // The operator fixes it: the next poll validates again, the module goes out.
    fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "added");
    eventually_explained(
        "ready again",
        SOON,
        || readyz().0 == 200,
        || format!("{:?}", readyz()),
    );
    d.stop();
    // With --once, a validator that cannot run is exit 1.
    let r = Cmpoll::against(&s)
        .with_args(&["run", "--once", "--validate", "exit 127"])
        .run()
        .failure(1);
    assert!(
        r.error_line().contains("validator cannot run"),
        "{}",
        r.error_line()
    );
}

/// `--validate-jobs N` runs N validators at once: each waits until all four have started,
/// which only happens if they run side by side (one at a time, each would time out).
#[test]
fn validate_jobs_runs_validators_side_by_side() {
    let s = TestApiserver::start();
    for i in 0..4 {
        s.put(module("ns", &format!("m{i}"), "x"));
    }
    let c = Cmpoll::against(&s);
    let keep = tempfile::tempdir().unwrap();
    let d = keep.path().display();
    let validator = format!(
        "touch \"{d}/$(echo $CMPOLL_MODULE | tr / _)\"; i=0; while [ $(ls '{d}' | wc -l) -lt 4 ]; do i=$((i+1)); [ $i -gt 200 ] && exit 1; sleep 0.05; done"
    );
    let r = c
        .with_args(&[
            "run",
            "--once",
            "--validate",
            &validator,
            "--validate-jobs",
            "4",
        ])
        .run()
        .success();
    assert_eq!(
        r.stdout.matches("\"type\":\"added\"").count(),
        4,
        "{}",
        r.stdout
    );
    let r = c
        .with_args(&["run", "--once", "--validate-jobs", "4"])
        .run()
        .failure(2);
    assert!(
        r.error_line()
            .contains("--validate-jobs: only used with --validate"),
        "{}",
        r.error_line()
    );
}

#[test]
fn promtool_keeps_a_bad_rule_file_from_a_running_prometheus() {
    if skip_unless(
        tool("prometheus").is_some() && tool("promtool").is_some() && tool("curl").is_some(),
        "prometheus, promtool and curl (Debian packages prometheus, curl)",
    ) {
        return;
    }
    let port = free_port();
    let s = TestApiserver::start();
    s.put(rules("monitoring", "good", "good:up:sum"));
    let mut bad = rules("monitoring", "broken", "broken:up:sum");
    bad.data.insert(
        "app.rules.yaml".into(),
        "groups:\n- name: broken\n  rules:\n  - record: broken:up:sum\n    expr: sum(up{\n".into(),
    );
    s.put(bad);
    let c = Cmpoll::against(&s);
    let (_prom, dir) = prometheus_up(&c, port);
    let prom_log = || prometheus_log(&dir);
    let out_dir = c.out();
    let out = out_dir.display().to_string();
    let flags = rule_file_flags(&out_dir, port);
    let mut args = vec!["--interval", "1s"];
    args.extend(flags.iter().map(String::as_str));
    args.extend([
        "--stdout-events",
        "--validate",
        "promtool check rules \"$CMPOLL_MODULE_DIR\"/*",
    ]);
    let d = c.daemon(&args);
    let b = d.batch(SOON);
    assert_eq!(
        kinds(&b),
        [
            ("rejected", "monitoring/broken"),
            ("added", "monitoring/good"),
            ("synced", "")
        ]
    );
    assert!(
        b[0]["reason"].as_str().unwrap().contains("FAILED"),
        "promtool's words: {}",
        b[0]["reason"]
    );
    eventually_explained(
        "the good rules are loaded, the broken ones never reach Prometheus",
        SOON,
        || prometheus_rules(port) == Some(vec!["good:up:sum".to_string()]),
        || {
            format!(
                "{:?}\n{}\n{}",
                prometheus_rules(port),
                d.stderr(),
                prom_log()
            )
        },
    );
    assert!(!Path::new(&out).join("monitoring.broken.yaml").exists());
    assert!(
        !prom_log().contains("error loading rules"),
        "{}",
        prom_log()
    );
    d.stop();
}

#[test]
fn nginx_t_checks_the_staged_module_alone() {
    let Some(nginx) = tool("nginx") else {
        skip_unless(false, "nginx (Debian package nginx)");
        return;
    };
    let s = TestApiserver::start();
    let port = free_port();
    s.put(site("web", "good", port, "hello"));
    s.put(labelled("web", "broken").data(
        "site.conf",
        "server { listen 127.0.0.1:1; location / { retrun 200; } }\n",
    ));
    let c = Cmpoll::against(&s);
    let keep = tempfile::tempdir().unwrap();
    // `nginx -t` on a main configuration that includes only the staged module's files.
    let script = keep.path().join("nginx-t.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\nt=$(mktemp -d)\ntrap 'rm -rf \"$t\"' EXIT\ncat > \"$t/nginx.conf\" <<EOF\npid $t/nginx.pid;\nerror_log stderr;\nevents {{}}\nhttp {{\n  client_body_temp_path $t/body;\n  proxy_temp_path $t/proxy;\n  fastcgi_temp_path $t/fastcgi;\n  uwsgi_temp_path $t/uwsgi;\n  scgi_temp_path $t/scgi;\n  include $CMPOLL_MODULE_DIR/*.conf;\n}}\nEOF\nexec {} -e stderr -t -q -c \"$t/nginx.conf\"\n",
            nginx.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = c.out();
    let r = c
        .with_args(&[
            "run",
            "--once",
            "--out-dir",
            out.to_str().unwrap(),
            "--stdout-events",
            "--validate",
            script.to_str().unwrap(),
        ])
        .run()
        .success();
    assert!(
        r.stdout
            .contains(r#""type":"rejected","module":"web/broken""#),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("unknown directive"),
        "nginx's words: {}",
        r.stdout
    );
    assert!(out.join("web/good/site.conf").exists());
    assert!(!out.join("web/broken").exists());
}

/// Issue 23.3: a rejection's reason holds at most 4 KiB in all, the exit status or the
/// timeout included, and is cut on a character boundary (the output here is all `é`, two
/// bytes each, so a cut at a byte count splits one).
#[test]
fn a_reason_is_at_most_4_kib_cut_on_a_character_boundary() {
    let s = TestApiserver::start();
    s.put(module("ns", "exit", "x"));
    s.put(module("ns", "slow", "x"));
    let c = Cmpoll::against(&s);
    // 3 bytes of `a` first, so that every `é` starts at an odd offset.
    let validator = "printf aaa; yes é | tr -d '\\n' | head -c 9000; \
         if [ \"$CMPOLL_MODULE\" = ns/slow ]; then sleep 5; fi; exit 3";
    let run = c
        .with_args(&[
            "run",
            "--once",
            "--stdout-events",
            "--validate",
            validator,
            "--validate-timeout",
            "1s",
        ])
        .run();
    let events: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let reasons: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "rejected")
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), 2, "{}", run.described);
    for (reason, end) in reasons.iter().zip([
        "(validator exited with status 3)",
        "(validator killed after --validate-timeout 1s)",
    ]) {
        assert!(reason.len() <= 4096, "{} bytes", reason.len());
        assert!(reason.len() > 4000, "{} bytes", reason.len());
        assert!(reason.starts_with("aaaé"), "{}", &reason[..20]);
        assert!(reason.ends_with(end), "{}", &reason[reason.len() - 80..]);
        assert!(!reason.contains('\u{fffd}'), "a character was split");
    }
}

/// `--confirm`: an agent that cannot be asked (its command fails: the agent is down) makes
/// `/readyz` fail and say so, as a failed reload does, and `cmpoll status` exit 1; once the
/// agent answers again, the module is delivered and cmpoll is ready.
#[test]
fn an_agent_that_cannot_be_asked_fails_readiness_until_it_answers() {
    let s = TestApiserver::start();
    s.put(module("ns", "m", "good 1"));
    let c = Cmpoll::against(&s);
    let keep = tempfile::tempdir().unwrap();
    let out = keep.path().join("out");
    let up = keep.path().join("agent-up");
    let asked = keep.path().join("asked");
    let confirm = format!(
        "echo asked >> '{}'; test -e '{}' || {{ echo 'the agent is down' >&2; exit 1; }}",
        asked.display(),
        up.display()
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start(
        c,
        &[
            "--interval",
            "30ms",
            "--listen",
            &listen,
            "--out-dir",
            out.to_str().unwrap(),
            "--validate",
            "true",
            "--confirm",
            &confirm,
        ],
    );
    let readyz = || curl(&format!("http://{listen}/readyz")).unwrap_or_default();
    eventually_explained(
        "readiness fails: the agent could not be asked",
        SOON,
        || {
            let (code, body) = readyz();
            code == 503 && body.contains("the last reload failed: the agent could not be asked")
        },
        || format!("{:?}", readyz()),
    );
    // Asked again on later polls, and still not ready while the agent is down.
    eventually("asked twice", SOON, || lines(&asked).len() >= 2);
    assert_eq!(readyz().0, 503);
    let status = Cmpoll::new()
        .with_args(&["status", "--server-url", &format!("http://{listen}")])
        .run()
        .failure(1);
    assert!(status.stdout.contains("--confirm"), "{}", status.described);
    fs::write(&up, "").unwrap();
    eventually_explained(
        "ready once the agent answers",
        SOON,
        || readyz().0 == 200,
        || format!("{:?}", readyz()),
    );
    assert_eq!(tree(&out), map(&[("ns/m/k.conf", "good 1")]));
    d.stop();
}
