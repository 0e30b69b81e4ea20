//! SPEC's "Never" section under hostile answers, crashes and slow clients, with the real
//! binary: regression tests of issue 13 (`r13`). Each one fails on 38f7d0f, the commit
//! before the fixes (run the suite with `CMPOLL_TEST_BIN=<that build>` to see it).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use test_apiserver::{ConfigMap, Fault, Match, TestApiserver};

use crate::util::http::{get, listening};
use crate::util::{Cmpoll, Daemon, KillOnDrop, SOON, cluster, eventually, leftovers, module, tree};

fn raw_429(retry_after: &str) -> Fault {
    Fault::Raw {
        code: 429,
        headers: vec![("Retry-After".into(), retry_after.into())],
        body: b"Too many requests, please try again later.\n".to_vec(),
    }
}

/// r13.2: no `Retry-After` (header or Status detail) pushes the next poll past the backoff
/// cap, and none crashes the daemon.
#[test]
fn r13_retry_after_past_any_clock_is_capped() {
    let s = TestApiserver::start();
    s.put(module("a", "one", "1"));
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "50ms"]);
    d.batch(SOON);
    let huge_detail = Fault::Raw {
        code: 500,
        headers: Vec::new(),
        body: br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"try later","reason":"ServerTimeout","details":{"retryAfterSeconds":999999999},"code":500}"#.to_vec(),
    };
    for fault in [
        raw_429(&u64::MAX.to_string()),
        raw_429("999999999"),
        huge_detail,
    ] {
        s.fault(Match::lists(), fault, 1);
        // The cap at a 50 ms interval is 500 ms: the daemon polls again, changes get out.
        s.put(module("a", "one", &format!("{:?}", Instant::now())));
        let b = d.batch(SOON);
        assert_eq!(b[0]["type"], "updated", "{b:?}");
    }
    assert!(
        s.requests().iter().filter(|r| r.fault.is_some()).count() == 3,
        "every fault was served"
    );
    d.stop();
    let run = Cmpoll::new()
        .args(&[
            "run",
            "--manifests",
            ".",
            "--interval",
            "10000000000000000000s",
        ])
        .run()
        .failure(2);
    assert!(
        run.error_line()
            .starts_with("--interval: '10000000000000000000s' is too long"),
        "{}",
        run.described
    );
}

/// r13.3: a list without `items`, or with `"items": null`, is a failed poll, not an empty
/// cluster: nothing is removed.
#[test]
fn r13_a_list_without_items_removes_nothing() {
    let (s, c) = cluster(&[("a", "one", "1"), ("a", "two", "2")]);
    let out = c.out();
    let d = c.daemon(&[
        "--interval",
        "30ms",
        "--out-dir",
        out.to_str().unwrap(),
        "--stdout-events",
    ]);
    assert_eq!(d.batch(SOON).len(), 3);
    let before = tree(&out);
    for body in [
        r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"5"}}"#,
        r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":null}"#,
    ] {
        s.fault(Match::lists(), Fault::body(body), 3);
        d.quiet_through(&s, 4, 1);
        assert_eq!(tree(&out), before, "every module is still there");
    }
    assert!(
        d.stderr().contains("has no \"items\" array"),
        "{}",
        d.stderr()
    );
    d.stop();
    s.fault(
        Match::lists(),
        Fault::body(r#"{"kind":"ConfigMapList","items":null}"#),
        1,
    );
    let run = Cmpoll::against(&s).args(&["list"]).run().failure(1);
    assert!(run.stdout.is_empty(), "{}", run.described);
}

/// r13.4: the reload URL's userinfo and query never reach a log line, at any level.
#[test]
fn r13_reload_url_credentials_are_never_logged() {
    let s = TestApiserver::start();
    s.put(module("a", "one", "1"));
    // Nothing listens there: every call fails and is retried with a warning.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://admin:s3cret-pw@127.0.0.1:{port}/-/reload?token=t0ken-value");
    let d = Daemon::start(
        Cmpoll::against(&s).env("RUST_LOG", "trace"),
        &["--interval", "1h", "--reload-url", &url, "--stdout-events"],
    );
    d.batch(SOON);
    eventually("a failed reload call is logged", SOON, || {
        d.stderr().contains("/-/reload") && d.stderr().contains("failed")
    });
    let log = d.stderr();
    for secret in ["s3cret-pw", "admin:", "t0ken-value", "YWRtaW46"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
    assert!(log.contains("[REDACTED]@127.0.0.1"), "{log}");
    d.stop();
}

/// The userinfo is sent as basic auth (and the query as given).
#[test]
fn reload_url_userinfo_is_sent_as_basic_auth() {
    let s = TestApiserver::start();
    s.put(module("a", "one", "1"));
    let (url, calls) = crate::util::http::reload_server_with_headers(vec![]);
    let url = url.replacen("http://", "http://admin:s3cret@", 1) + "?x=1";
    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "1h", "--reload-url", &url, "--stdout-events"],
    );
    d.batch(SOON);
    eventually("the reload call", SOON, || {
        !calls.lock().unwrap().is_empty()
    });
    d.stop();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0, "POST /-/reload?x=1 HTTP/1.1");
    // printf admin:s3cret | base64
    assert_eq!(
        calls[0].1.get("authorization").map(String::as_str),
        Some("Basic YWRtaW46czNjcmV0")
    );
}

/// r13.5: `state.json` is checked, never trusted: a record naming a path outside the
/// folder is a start-up error naming the file, and nothing is deleted.
#[test]
fn r13_a_hostile_state_json_is_refused_and_deletes_nothing() {
    let s = TestApiserver::start();
    let c = Cmpoll::against(&s);
    let victim = c.write("victim/precious.conf", "keep");
    let out = c.out();
    fs::create_dir_all(out.join(".cmpoll/versions")).unwrap();
    let record = serde_json::json!({
        "version": 1, "seq": 1,
        "modules": {"ns/m": {"hash": "", "mode": 420, "file": "../victim/precious.conf"}},
        "namespaces": [], "pending": [], "retired": []
    });
    fs::write(out.join(".cmpoll/state.json"), record.to_string()).unwrap();
    let run = c
        .with_args(&[
            "run",
            "--once",
            "--out-dir",
            out.to_str().unwrap(),
            "--layout",
            "concat",
        ])
        .run()
        .failure(2);
    let line = run.error_line();
    assert!(
        line.contains(".cmpoll/state.json' is not valid") && line.contains("modules[\"ns/m\"]"),
        "{}",
        run.described
    );
    assert_eq!(fs::read_to_string(victim).unwrap(), "keep");
    assert!(s.requests().is_empty(), "refused before any poll");
}

/// r13.6: after the 504 fallback to `resourceVersion=0`, a lagging cache answers with an
/// older state; modules never go back in time.
#[test]
fn r13_an_older_list_never_takes_modules_back_in_time() {
    let s = TestApiserver::start();
    s.put(module("a", "one", "old"));
    let old = s.revision();
    let d = Daemon::start(Cmpoll::against(&s), &["--interval", "30ms"]);
    d.batch(SOON);
    s.put(module("a", "one", "new"));
    let b = d.batch(SOON);
    assert_eq!(b[0]["files"]["k"], "new");
    // Another apiserver whose cache still has the old content.
    s.freeze_cache_at(old);
    // Each poll: a 504 for NotOlderThan, then the fallback that answers the old state.
    d.quiet_through(&s, 3, 2);
    assert!(
        d.stderr().contains("older than"),
        "the stale answer is a failed poll: {}",
        d.stderr()
    );
    s.thaw_cache();
    s.put(module("a", "one", "newer"));
    let b = d.batch(SOON);
    assert_eq!(b[0]["files"]["k"], "newer");
    d.stop();
}

/// r13.7: a metadata-first GET that answers with another object fails the poll; it is
/// not a deletion.
#[test]
fn r13_a_get_answering_another_object_is_not_a_deletion() {
    let s = TestApiserver::start();
    s.put(module("a", "one", "1"));
    s.put(module("a", "two", "2"));
    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "30ms", "--metadata-first"],
    );
    assert_eq!(d.batch(SOON).len(), 3);
    let other = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"impostor","namespace":"a","uid":"u","resourceVersion":"99999","labels":{"cmpoll.io/module":"true"}},"data":{"k":"x"}}"#;
    s.fault_always(Match::gets(), Fault::body(other));
    s.put(module("a", "one", "changed"));
    d.quiet_through(&s, 3, 1);
    assert!(
        d.stderr().contains("asked for a/one, got a/impostor"),
        "{}",
        d.stderr()
    );
    s.clear_faults();
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["module"].as_str()),
        (Some("updated"), Some("a/one"))
    );
    d.stop();
}

/// r13.8: a paged list ends: a continue token that repeats fails at once, and pages that
/// never end fail after 10 × `--timeout` in all.
#[test]
fn r13_a_paged_list_that_never_ends_is_bounded() {
    let s = TestApiserver::start();
    for i in 0..40 {
        s.put(module("p", &format!("m{i:02}"), "v"));
    }
    let endless = r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1","continue":"again"},"items":[]}"#;
    s.fault_always(Match::continue_pages(), Fault::body(endless));
    let run = Cmpoll::against(&s)
        .args(&["list", "--page-size", "1"])
        .run()
        .failure(1);
    assert!(
        run.error_line().contains("the same continue token twice"),
        "{}",
        run.described
    );
    s.clear_faults();
    // Every page is slow: 40 pages of 50 ms exceed 10 × 100 ms.
    s.fault_always(Match::lists(), Fault::Delay(Duration::from_millis(50)));
    let run = Cmpoll::against(&s)
        .args(&["list", "--page-size", "1", "--timeout", "100ms"])
        .run()
        .failure(1);
    assert!(
        run.error_line().contains("took more than 10 × --timeout"),
        "{}",
        run.described
    );
    let pages = s.requests().iter().filter(|r| r.is_list()).count();
    assert!(pages < 40 + 3, "stopped early: {pages} requests");
}

/// r13.9: slow clients holding connections never keep `/healthz` from answering.
#[test]
fn r13_slow_clients_never_make_healthz_fail() {
    let s = TestApiserver::start();
    let d = Daemon::start(
        Cmpoll::against(&s),
        &["--interval", "1h", "--listen", "127.0.0.1:0"],
    );
    d.batch(SOON);
    let addr = listening(&d);
    // More than the old 32 slots, each sending a byte now and then and never finishing.
    struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _stop_on_drop = StopOnDrop(stop.clone());
    // How many are connected and dribbling now.
    let connected = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let dribblers: Vec<_> = (0..48)
        .map(|_| {
            let (addr, stop, connected) = (addr.clone(), stop.clone(), connected.clone());
            std::thread::spawn(move || {
                use std::sync::atomic::Ordering::Relaxed;
                while !stop.load(Relaxed) {
                    let Ok(mut c) = TcpStream::connect(&addr) else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    let mut counted = false;
                    for b in b"GET /healthz HTTP/1.1\r\n" {
                        if c.write_all(&[*b]).is_err() || stop.load(Relaxed) {
                            break;
                        }
                        if !counted {
                            connected.fetch_add(1, Relaxed);
                            counted = true;
                        }
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    if counted {
                        connected.fetch_sub(1, Relaxed);
                    }
                }
            })
        })
        .collect();
    eventually("48 slow clients connected at once", SOON, || {
        connected.load(std::sync::atomic::Ordering::Relaxed) == 48
    });
    for _ in 0..10 {
        let (code, body) = get(&addr, "/healthz");
        assert_eq!((code, body.as_str()), (200, "ok\n"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in dribblers {
        t.join().unwrap();
    }
    d.stop();
}

/// The `(deleted)` files a process holds open: its spool and feed files.
fn open_deleted_files(pid: u32) -> Vec<String> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| fs::read_link(e.path()).ok())
                .map(|p| p.display().to_string())
                .filter(|p| p.ends_with(" (deleted)"))
                .collect()
        })
        .unwrap_or_default()
}

/// r13.10: with `--out-dir` the spool lives in `DIR/.cmpoll`, compactions included, even
/// when `$TMPDIR` is unusable; without a usable folder it is an error, not memory.
#[test]
fn r13_the_spool_stays_in_the_output_folder() {
    let s = TestApiserver::start();
    let big = "x".repeat(1 << 20);
    s.put(module("a", "one", &big));
    s.put(module("a", "two", &big));
    let c = Cmpoll::against(&s).env("TMPDIR", "/nonexistent");
    let out = c.out();
    let d = c.daemon(&[
        "--interval",
        "20ms",
        "--out-dir",
        out.to_str().unwrap(),
        "--stdout-events",
    ]);
    d.batch(SOON);
    // Enough superseded contents (over 4 MiB, more than what is live) for compactions.
    for i in 0..8 {
        s.put(module("a", "one", &format!("{i}{big}")));
        s.put(module("a", "two", &format!("{i}{big}")));
        d.batch(SOON);
    }
    let spool = open_deleted_files(d.child.id());
    let meta = out.join(".cmpoll").display().to_string();
    assert!(!spool.is_empty(), "a spool file is open");
    assert!(
        spool.iter().all(|p| p.starts_with(&meta)),
        "all in {meta}: {spool:?}"
    );
    assert!(!d.stderr().contains("in memory"), "{}", d.stderr());
    d.stop();
    let run = Cmpoll::against(&s)
        .env("TMPDIR", "/nonexistent")
        .args(&["list"])
        .run()
        .failure(1);
    assert!(
        run.error_line()
            .contains("cannot create the spool file in '/nonexistent'"),
        "{}",
        run.described
    );
}

/// r13.11: switching `--layout` between runs cleans up what the old layout wrote, and
/// switching back works.
#[test]
fn r13_switching_layouts_between_runs() {
    let (_s, c) = cluster(&[("ns", "a", "1"), ("ns", "b", "2")]);
    let out = c.out();
    let want_files = BTreeMap::from([
        ("ns/a/k".to_string(), "1\n".trim_end().to_string()),
        ("ns/b/k".to_string(), "2".to_string()),
    ]);
    let want_concat = BTreeMap::from([
        ("ns.a.conf".to_string(), "1\n".to_string()),
        ("ns.b.conf".to_string(), "2\n".to_string()),
    ]);
    for (layout, want) in [
        ("files", &want_files),
        ("concat", &want_concat),
        ("files", &want_files),
        ("concat", &want_concat),
    ] {
        let mut args = vec!["run", "--once", "--out-dir", out.to_str().unwrap()];
        args.extend(["--layout", layout, "--old-version-ttl", "0s"]);
        if layout == "concat" {
            args.extend(["--ext", ".conf"]);
        }
        c.with_args(&args).run().success();
        assert_eq!(&tree(&out), want, "{layout}");
        let top: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != ".cmpoll")
            .collect();
        let expected = if layout == "files" { 1 } else { 2 };
        assert_eq!(
            top.len(),
            expected,
            "{layout}: nothing of the other layout: {top:?}"
        );
    }
}

/// r13.13: manifests with more than 1,024 YAML documents, and concatenated JSON ones.
#[test]
fn r13_long_manifest_files_are_read_whole() {
    let c = Cmpoll::new();
    let yaml: String = (0..1500)
        .map(|i| {
            format!("---\nkind: ConfigMap\nmetadata: {{name: m{i:04}, namespace: a, labels: {{cmpoll.io/module: 'true'}}}}\ndata: {{k: v}}\n")
        })
        .collect();
    c.write("m/many.yaml", &yaml);
    let one = |n: &str| {
        format!(
            r#"{{"kind":"ConfigMap","metadata":{{"name":"{n}","namespace":"j","labels":{{"cmpoll.io/module":"true"}}}},"data":{{"k":"v"}}}}"#
        )
    };
    c.write("m/two.json", &format!("{}\n{}", one("x"), one("y")));
    let run = c
        .with_args(&["list", "--manifests", "m", "--json"])
        .run()
        .success();
    let modules = run.modules();
    assert_eq!(modules.len(), 1502);
    assert!(modules.contains(&"j/y".to_string()));
}

/// r13.14: `run --once` exits 1 when a module could not be written, and the running
/// daemon counts such modules in `cmpoll_module_write_failures`.
#[test]
fn r13_a_module_that_cannot_be_written_is_a_failure() {
    let (s, c) = cluster(&[("ns", "blocked", "1"), ("ns", "fine", "1")]);
    let out = c.out();
    c.write("out/ns/blocked", "a file of someone else's");
    let run = c
        .with_args(&["run", "--once", "--out-dir", out.to_str().unwrap()])
        .run()
        .failure(1);
    assert!(
        run.error_line()
            .contains("1 module(s) could not be written: ns/blocked"),
        "{}",
        run.described
    );
    assert_eq!(
        fs::read_to_string(out.join("ns/blocked")).unwrap(),
        "a file of someone else's"
    );
    let d = Daemon::start(
        Cmpoll::against(&s),
        &[
            "--interval",
            "50ms",
            "--out-dir",
            out.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
    );
    let addr = listening(&d);
    crate::util::http::until_body(&addr, "/metrics", 200, "cmpoll_module_write_failures 1");
    fs::remove_file(out.join("ns/blocked")).unwrap();
    crate::util::http::until_body(&addr, "/metrics", 200, "cmpoll_module_write_failures 0");
    d.stop();
}

/// r13.1: `kill -9` at many points of a large batch, in both layouts, with files of
/// someone else's in the way of some modules: after a restart those files are byte for
/// byte what they were, the folder equals the cluster otherwise, and no temporary is left.
#[test]
fn r13_crashes_at_many_points_never_touch_foreign_files() {
    for layout in ["concat", "files"] {
        let s = TestApiserver::start();
        s.bulk_load(600, 2048, 3);
        let c = Cmpoll::against(&s);
        let out = c.out();
        // Foreign files where three modules go.
        let blocked = ["module-000007", "module-000300", "module-000599"];
        let mut foreign = BTreeMap::new();
        for (i, name) in blocked.iter().enumerate() {
            let o = s
                .objects()
                .into_iter()
                .find(|o| &o.spec.name == name)
                .unwrap();
            let rel = match layout {
                "concat" => format!("{}.{}.alloy", o.spec.namespace, name),
                _ => format!("{}/{}", o.spec.namespace, name),
            };
            let text = format!("hand-made {i}\n");
            c.write(&format!("out/{rel}"), &text);
            foreign.insert(rel, text);
        }
        let mut args = vec![
            "run".to_string(),
            "--interval".into(),
            "1h".into(),
            "--out-dir".into(),
            out.to_str().unwrap().into(),
            "--layout".into(),
            layout.into(),
            "--old-version-ttl".into(),
            "0s".into(),
        ];
        if layout == "concat" {
            args.extend(["--ext".into(), ".alloy".into()]);
        }
        // Kill at several points of the batch, with the cluster moving in between.
        let mut mid_batch = 0;
        for (round, at) in [20usize, 150, 320, 480, 590].into_iter().enumerate() {
            let written = || match layout {
                "concat" => fs::read_dir(&out).map(|d| d.count()).unwrap_or(0),
                _ => fs::read_dir(out.join(".cmpoll/versions"))
                    .map(|d| d.count())
                    .unwrap_or(0),
            };
            let base = written();
            let mut child = KillOnDrop(c.with_args(&args).spawn());
            // Wait for the batch to be recorded (its journal gets the planned writes, or the
            // record's `seq` moves; under load, start-up and the first poll take longer than the quiet
            // spell below, and recovery alone changes the folder), then reach `at` new
            // entries, or the batch's end (nothing new for a while), then kill -9.
            let seq = || {
                let bytes = fs::read(out.join(".cmpoll/state.json")).unwrap_or_default();
                serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|r| r["seq"].as_u64())
            };
            let (seq0, begun) = (seq().unwrap_or(0), Instant::now());
            let recorded = || seq().unwrap_or(0) != seq0 || crate::util::pending_writes(&out) > 0;
            while !recorded() && begun.elapsed() < SOON {
                if child.0.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let (mut last, mut since) = (written(), Instant::now());
            while written() < base + at && since.elapsed() < Duration::from_millis(500) {
                if child.0.try_wait().unwrap().is_some() {
                    break;
                }
                if written() != last {
                    (last, since) = (written(), Instant::now());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = child.0.kill();
            let _ = child.0.wait();
            if crate::util::pending_writes(&out) > 0 {
                mid_batch += 1;
            }
            // Between crashes the cluster changes: an update, a removal.
            let (up, gone) = (100 + round, 50 + 7 * round);
            s.put(
                ConfigMap::new(&format!("ns-{:02}", up % 3), &format!("module-{up:06}"))
                    .label("cmpoll.io/module", "true")
                    .data("config.alloy", &format!("round {round}")),
            );
            s.delete(&format!("ns-{:02}", gone % 3), &format!("module-{gone:06}"));
        }
        assert!(
            mid_batch >= 2,
            "{layout}: killed with writes under way in {mid_batch} of 5 rounds"
        );
        let mut last: Vec<String> = args.clone();
        last[1] = "--once".into();
        last.remove(2);
        let run = c.with_args(&last).run();
        assert_eq!(
            run.code,
            Some(1),
            "blocked modules fail --once\n{}",
            run.described
        );
        let on_disk = tree(&out);
        for (rel, text) in &foreign {
            assert_eq!(on_disk.get(rel), Some(text), "{layout}: {rel} untouched");
        }
        let mut want = BTreeMap::new();
        for o in s.objects() {
            if blocked.contains(&o.spec.name.as_str()) {
                continue;
            }
            let data = o.spec.data["config.alloy"].clone();
            match layout {
                "concat" => {
                    let text = if data.ends_with('\n') {
                        data
                    } else {
                        data + "\n"
                    };
                    want.insert(format!("{}.{}.alloy", o.spec.namespace, o.spec.name), text)
                }
                _ => want.insert(
                    format!("{}/{}/config.alloy", o.spec.namespace, o.spec.name),
                    data,
                ),
            };
        }
        for rel in foreign.keys() {
            want.insert(rel.clone(), foreign[rel].clone());
        }
        assert_eq!(on_disk.len(), want.len(), "{layout}");
        assert!(on_disk == want, "{layout}: the folder equals the cluster");
        assert!(
            leftovers(&out).is_empty(),
            "{layout}: {:?}",
            leftovers(&out)
        );
        if layout == "files" {
            let versions = fs::read_dir(out.join(".cmpoll/versions")).unwrap().count();
            assert_eq!(versions, want.len() - foreign.len(), "no orphaned versions");
        }
    }
}
