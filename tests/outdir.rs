//! `--out-dir`: layouts, atomic switches, ownership, restarts and crashes, with the real
//! binary against the test apiserver.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use test_apiserver::TestApiserver;

use crate::util::{
    Cmpoll, Daemon, SOON, cluster, eventually, kinds, labelled, leftovers, map, tree,
};

#[test]
fn files_layout_contents_and_modes() {
    let s = TestApiserver::start();
    s.put(
        labelled("monitoring", "scrape")
            .data("a.alloy", "A")
            .data("b.alloy", "B"),
    );
    s.put(labelled("web", "site").binary("logo.png", &[0, 1, 2, 255]));
    let c = Cmpoll::against(&s);
    let out = c.path("out/modules");
    c.with_args(&[
        "run",
        "--once",
        "--out-dir",
        out.to_str().unwrap(),
        "--file-mode",
        "0640",
    ])
    .run()
    .success();
    assert_eq!(
        fs::read_to_string(out.join("monitoring/scrape/a.alloy")).unwrap(),
        "A"
    );
    assert_eq!(
        fs::read(out.join("web/site/logo.png")).unwrap(),
        [0, 1, 2, 255]
    );
    let file = fs::metadata(out.join("monitoring/scrape/b.alloy")).unwrap();
    assert_eq!(file.mode() & 0o7777, 0o640);
    assert_eq!(
        fs::metadata(out.join("monitoring")).unwrap().mode() & 0o7777,
        0o755
    );
    assert!(
        fs::symlink_metadata(out.join("monitoring/scrape"))
            .unwrap()
            .is_symlink()
    );
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join(".cmpoll/state.json")).unwrap()).unwrap();
    assert_eq!(
        state["modules"]["monitoring/scrape"]["files"],
        serde_json::json!(["a.alloy", "b.alloy"])
    );
    assert!(leftovers(&out).is_empty());
}

#[test]
fn concat_layout_contents() {
    let s = TestApiserver::start();
    s.put(
        labelled("monitoring", "scrape")
            .data("b.alloy", "second")
            .data("a.alloy", "first\n"),
    );
    let c = Cmpoll::against(&s);
    let out = c.out();
    c.with_args(&[
        "run",
        "--once",
        "--out-dir",
        out.to_str().unwrap(),
        "--layout",
        "concat",
        "--ext",
        ".alloy",
    ])
    .run()
    .success();
    assert_eq!(
        tree(&out),
        map(&[("monitoring.scrape.alloy", "first\nsecond\n")])
    );
    assert_eq!(
        fs::metadata(out.join("monitoring.scrape.alloy"))
            .unwrap()
            .mode()
            & 0o7777,
        0o644
    );
}

#[test]
fn a_reader_never_sees_a_mixed_or_partial_version() {
    let s = TestApiserver::start();
    let put = |n: u32| {
        s.put(
            labelled("ns", "m")
                .data("a", &format!("{n}-a"))
                .data("b", &format!("{n}-b")),
        );
    };
    put(0);
    let c = Cmpoll::against(&s);
    let out = c.out();
    let d = c.daemon(&[
        "--interval",
        "5ms",
        "--out-dir",
        out.to_str().unwrap(),
        "--stdout-events",
    ]);
    d.batch(SOON);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (out, stop) = (out.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut reads, mut versions) = (0u64, std::collections::BTreeSet::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Resolve the module path once, then read both files of that version.
                let real = fs::canonicalize(out.join("ns/m")).expect("the module path resolves");
                let a = fs::read_to_string(real.join("a")).expect("a is there");
                let b = fs::read_to_string(real.join("b")).expect("b is there");
                let (va, vb) = (a.trim_end_matches("-a"), b.trim_end_matches("-b"));
                assert_eq!(va, vb, "mixed version: {a} / {b}");
                versions.insert(va.to_string());
                reads += 1;
            }
            (reads, versions.len())
        })
    };
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(2) {
        n += 1;
        put(n);
        std::thread::sleep(Duration::from_millis(3));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, versions) = reader.join().expect("the reader never failed");
    assert!(reads > 1000, "{reads} reads");
    assert!(versions > 20, "{versions} versions seen");
    eprintln!("reader: {reads} reads across {versions} versions");
    d.stop();
}

#[test]
fn foreign_files_survive_and_the_directory_is_written_before_stdout_hears() {
    let (s, c) = cluster(&[("ns", "a", "1"), ("ns", "b", "1")]);
    let out = c.out();
    fs::create_dir_all(out.join("ns")).unwrap();
    fs::write(out.join("ns/README"), "written by a human").unwrap();
    fs::write(out.join("top.txt"), "also foreign").unwrap();
    let d = c.daemon(&[
        "--interval",
        "20ms",
        "--out-dir",
        out.to_str().unwrap(),
        "--stdout-events",
    ]);
    d.batch(SOON);
    for v in 2..5 {
        s.put(labelled("ns", "a").data("k", &v.to_string()));
        let b = d.batch(SOON);
        assert_eq!(b[0]["type"], "updated");
        // Told "synced", the reader finds the directory already switched.
        assert_eq!(
            fs::read_to_string(out.join("ns/a/k")).unwrap(),
            v.to_string()
        );
    }
    s.delete("ns", "a");
    s.delete("ns", "b");
    let b = d.batch(SOON);
    assert_eq!(b.len(), 3);
    assert_eq!(
        tree(&out),
        map(&[
            ("ns/README", "written by a human"),
            ("top.txt", "also foreign")
        ])
    );
    d.stop();
}

#[test]
fn a_path_cmpoll_did_not_write_blocks_only_that_module_until_it_is_gone() {
    let (_s, c) = cluster(&[("ns", "blocked", "v"), ("ns", "fine", "v")]);
    let out = c.out();
    fs::create_dir_all(out.join("ns/blocked")).unwrap();
    fs::write(out.join("ns/blocked/mine"), "keep").unwrap();
    let d = c.daemon(&[
        "--interval",
        "20ms",
        "--out-dir",
        out.to_str().unwrap(),
        "--stdout-events",
    ]);
    let b = d.batch(SOON);
    assert_eq!(b.len(), 2, "only ns/fine is reported: {b:?}");
    assert_eq!(b[0]["module"], "ns/fine");
    assert!(
        d.stderr().contains("cannot write ns/blocked"),
        "{}",
        d.stderr()
    );
    assert_eq!(
        fs::read_to_string(out.join("ns/blocked/mine")).unwrap(),
        "keep"
    );
    // Once the human removes it, the next poll writes the module and reports it.
    fs::remove_dir_all(out.join("ns/blocked")).unwrap();
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["module"].as_str()),
        (Some("added"), Some("ns/blocked"))
    );
    assert_eq!(fs::read_to_string(out.join("ns/blocked/k")).unwrap(), "v");
    d.stop();
}

/// A restart reconciles the folder with the cluster, in every layout: modules removed
/// while cmpoll was down go, changed ones are rewritten, new ones are added, and unchanged
/// ones are left as they are (same inode and mtime), with nothing left over. Each
/// module's one key is named after it, so the flat layout's files do not clash.
#[test]
fn a_restart_reconciles_and_leaves_unchanged_modules_untouched() {
    struct Case {
        layout: &'static str,
        args: &'static [&'static str],
        /// Where module ns/keep's content is.
        keep: &'static str,
        after: &'static [(&'static str, &'static str)],
    }
    let cases = [
        Case {
            layout: "files",
            args: &["--old-version-ttl", "0s"],
            keep: "ns/keep/keep.conf",
            after: &[
                ("ns/change/change.conf", "new"),
                ("ns/keep/keep.conf", "same"),
                ("other/new/new.conf", "n"),
            ],
        },
        Case {
            layout: "concat",
            args: &["--ext", ".conf"],
            keep: "ns.keep.conf",
            after: &[
                ("ns.change.conf", "new\n"),
                ("ns.keep.conf", "same\n"),
                ("other.new.conf", "n\n"),
            ],
        },
        Case {
            layout: "flat",
            args: &[],
            keep: "keep.conf",
            after: &[
                ("change.conf", "new"),
                ("keep.conf", "same"),
                ("new.conf", "n"),
            ],
        },
    ];
    for case in cases {
        let s = TestApiserver::start();
        let put = |ns: &str, name: &str, v: &str| {
            s.put(labelled(ns, name).data(&format!("{name}.conf"), v));
        };
        put("ns", "keep", "same");
        put("ns", "change", "old");
        put("ns", "gone", "x");
        let c = Cmpoll::against(&s);
        let out = c.out();
        let mut args = vec!["run", "--once", "--out-dir", out.to_str().unwrap()];
        args.extend(["--layout", case.layout]);
        args.extend(case.args);
        c.with_args(&args).run().success();
        assert!(tree(&out).contains_key(case.keep), "{}", case.layout);
        let before = fs::metadata(out.join(case.keep)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        // While cmpoll is down: one module deleted, one changed, one added.
        s.delete("ns", "gone");
        put("ns", "change", "new");
        put("other", "new", "n");
        c.with_args(&args).run().success();
        let after = fs::metadata(out.join(case.keep)).unwrap();
        assert_eq!(
            (after.ino(), after.mtime_nsec()),
            (before.ino(), before.mtime_nsec()),
            "{}: not rewritten",
            case.layout
        );
        assert_eq!(tree(&out), map(case.after), "{}", case.layout);
        assert!(leftovers(&out).is_empty(), "{}", case.layout);
        if case.layout == "files" {
            let versions = fs::read_dir(out.join(".cmpoll/versions")).unwrap().count();
            assert_eq!(versions, 3, "one version folder per module, no orphans");
        }
    }
}

/// Issue 29: a restart takes the folder's record as proof of what it holds instead of
/// reading every file back, unless a sink reads every module in the first batch anyway:
/// stdout events then still carry the cluster's content for a file someone changed
/// behind cmpoll's back (keeping its length, so the record's proof would pass).
#[test]
fn a_restart_with_stdout_events_sends_the_clusters_content_not_a_changed_file() {
    let (_s, c) = cluster(&[("ns", "keep", "same"), ("ns", "other", "x")]);
    let out = c.out();
    let dir = out.to_str().unwrap();
    c.with_args(&["run", "--once", "--out-dir", dir])
        .run()
        .success();
    let file = fs::canonicalize(out.join("ns/keep/k")).unwrap();
    fs::remove_file(&file).unwrap();
    fs::write(&file, "SAME").unwrap();
    let run = c
        .with_args(&["run", "--once", "--out-dir", dir, "--stdout-events"])
        .run()
        .success();
    let added: Vec<serde_json::Value> = (run.stdout.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["type"] == "added")
        .collect();
    assert_eq!(added.len(), 2, "{}", run.described);
    assert_eq!(added[0]["module"], "ns/keep");
    assert_eq!(added[0]["files"]["k"], "same", "{}", run.described);
    // The folder itself is not rewritten for it: its record says it holds that content.
    assert_eq!(fs::read_to_string(out.join("ns/keep/k")).unwrap(), "SAME");
}

/// Issue 29: the record is the first poll's proof of what the folder holds; a module
/// whose files someone removed behind cmpoll's back cannot be written from the folder, so
/// its record loses its hash and the next run writes it from the cluster's copy (the next
/// poll of a daemon, the next `--once` of an init container: never stuck).
#[test]
fn files_removed_behind_cmpolls_back_are_written_again_by_the_next_run() {
    let (_s, c) = cluster(&[("ns", "keep", "same"), ("ns", "other", "x")]);
    let out = c.out();
    let dir = out.to_str().unwrap();
    let once = ["run", "--once", "--out-dir", dir];
    c.with_args(&once).run().success();
    let version = fs::canonicalize(out.join("ns/keep")).unwrap();
    fs::remove_dir_all(&version).unwrap();
    let run = c.with_args(&once).run().failure(1);
    assert!(
        run.stderr.contains("cannot write ns/keep"),
        "{}",
        run.described
    );
    c.with_args(&once).run().success();
    assert_eq!(
        tree(&out),
        map(&[("ns/keep/k", "same"), ("ns/other/k", "x")])
    );
    // A daemon heals it one poll later, without a restart.
    fs::remove_dir_all(fs::canonicalize(out.join("ns/other")).unwrap()).unwrap();
    let d = c.daemon(&["--out-dir", dir, "--interval", "100ms"]);
    // The switch comes before the batch's record and clean-up, so "done" is both: the
    // file is back and no temporary is left (a leftover that stays fails here too).
    crate::util::eventually("ns/other written again, batch finished", SOON, || {
        tree(&out).get("ns/other/k").map(String::as_str) == Some("x") && leftovers(&out).is_empty()
    });
    d.stop();
}

#[test]
fn a_crash_mid_batch_then_a_restart_ends_equal_to_the_cluster() {
    let s = TestApiserver::start();
    s.bulk_load(1500, 4096, 5);
    let c = Cmpoll::against(&s);
    let out = c.out();
    let mut child = c
        .with_args(&[
            "run",
            "--interval",
            "1h",
            "--out-dir",
            out.to_str().unwrap(),
        ])
        .spawn();
    // Kill -9 once the batch is well under way.
    let started = Instant::now();
    loop {
        let written = fs::read_dir(out.join(".cmpoll/versions"))
            .map(|d| d.count())
            .unwrap_or(0);
        if written >= 200 {
            break;
        }
        assert!(started.elapsed() < SOON, "the batch never got going");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let pending = crate::util::pending_writes(&out);
    assert!(
        pending > 0,
        "killed in the middle of the batch (the record still lists its writes)"
    );
    // The cluster moves on while cmpoll is down.
    s.delete("ns-00", "module-000000");
    s.put(labelled("ns-01", "module-000001").data("config.alloy", "changed"));
    c.with_args(&[
        "run",
        "--once",
        "--out-dir",
        out.to_str().unwrap(),
        "--old-version-ttl",
        "0s",
    ])
    .run()
    .success();
    let on_disk = tree(&out);
    assert_eq!(on_disk.len(), 1499);
    for o in s.objects() {
        let key = format!("{}/{}/config.alloy", o.spec.namespace, o.spec.name);
        assert_eq!(on_disk.get(&key), o.spec.data.get("config.alloy"), "{key}");
    }
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
    let versions = fs::read_dir(out.join(".cmpoll/versions")).unwrap().count();
    assert_eq!(versions, 1499, "no orphaned version folders");
    assert_eq!(crate::util::pending_writes(&out), 0);
    assert!(
        !out.join(".cmpoll/journal.jsonl").exists(),
        "the journal goes with the batch"
    );
}

#[test]
fn a_hostile_key_never_escapes_while_other_modules_are_written() {
    let s = TestApiserver::start();
    s.put(
        labelled("ns", "evil")
            .data("../../x", "pwned")
            .data("ok", "fine"),
    );
    s.put(labelled("ns", "good").data("k", "v"));
    let c = Cmpoll::against(&s);
    let out = c.path("deep/out");
    let run = c
        .with_args(&["run", "--once", "--out-dir", out.to_str().unwrap()])
        .run()
        .success();
    assert!(
        run.stderr
            .contains("configmap ns/evil rejected: invalid key \"../../x\""),
        "{}",
        run.stderr
    );
    assert_eq!(tree(&out), map(&[("ns/good/k", "v")]));
    assert!(!c.path("x").exists() && !c.path("deep/x").exists());
}

#[test]
fn an_unwritable_folder_is_a_start_up_error() {
    let s = TestApiserver::start();
    let run = Cmpoll::against(&s)
        .args(&["run", "--once", "--out-dir", "/proc"])
        .run()
        .failure(2);
    assert!(
        run.error_line()
            .starts_with("--out-dir '/proc': cannot write to it"),
        "{}",
        run.described
    );
    assert!(s.requests().is_empty(), "nothing was polled");
    let c = Cmpoll::new();
    c.write("file", "x");
    let run = c
        .with_args(&["run", "--once", "--manifests", ".", "--out-dir", "file"])
        .run()
        .failure(2);
    assert!(
        run.error_line().starts_with("--out-dir 'file':"),
        "{}",
        run.described
    );
}

#[test]
fn two_daemons_cannot_share_a_folder() {
    let s = TestApiserver::start();
    let c = Cmpoll::against(&s);
    let out = c.out();
    let d = c.daemon(&[
        "--interval",
        "1h",
        "--out-dir",
        out.to_str().unwrap(),
        "--stdout-events",
    ]);
    d.batch(SOON);
    let run = Cmpoll::against(&s)
        .args(&["run", "--once", "--out-dir", out.to_str().unwrap()])
        .run()
        .failure(2);
    assert!(
        run.error_line()
            .contains("another cmpoll is writing to this folder")
    );
    d.stop();
}

/// SIGTERM while a large batch is being written: the write in progress is finished (the
/// whole batch, recorded as done), then cmpoll exits 0.
#[test]
fn sigterm_finishes_the_write_in_progress() {
    let s = TestApiserver::start();
    s.bulk_load(1500, 4096, 5);
    let c = Cmpoll::against(&s);
    let out = c.out();
    let mut d = c.daemon(&["--interval", "1h", "--out-dir", out.to_str().unwrap()]);
    let started = Instant::now();
    while fs::read_dir(out.join(".cmpoll/versions"))
        .map(|d| d.count())
        .unwrap_or(0)
        < 100
    {
        assert!(started.elapsed() < SOON, "the batch never got going");
        std::thread::sleep(Duration::from_millis(1));
    }
    d.signal("TERM");
    let written_at_term = fs::read_dir(out.join(".cmpoll/versions")).unwrap().count();
    assert!(
        written_at_term < 1500,
        "TERM came mid-batch ({written_at_term})"
    );
    assert_eq!(d.wait(SOON), Some(0));
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join(".cmpoll/state.json")).unwrap()).unwrap();
    assert_eq!(
        crate::util::pending_writes(&out),
        0,
        "nothing left half-done"
    );
    assert_eq!(state["modules"].as_object().unwrap().len(), 1500);
    assert_eq!(tree(&out).len(), 1500);
    assert!(leftovers(&out).is_empty());
}

/// `--layout flat`: `DIR/KEY` for every module's files; a key clash rejects the later
/// module whole, announced once per content; when the holder goes, the waiting module is
/// published in that same batch; a restart keeps what was written.
#[test]
fn flat_layout_clashes_are_rejected_once_and_handed_over() {
    let s = TestApiserver::start();
    s.put(
        labelled("a", "first")
            .data("shared.yaml", "A")
            .data("a.yaml", "a"),
    );
    s.put(
        labelled("b", "second")
            .data("shared.yaml", "B")
            .data("b.yaml", "b"),
    );
    let c = Cmpoll::against(&s);
    // Outlives the daemon's own folder.
    let keep = tempfile::tempdir().unwrap();
    let out = keep.path().join("out");
    let flat = [
        "--out-dir",
        out.to_str().unwrap(),
        "--layout",
        "flat",
        "--stdout-events",
    ];
    let mut args = vec!["--interval", "30ms"];
    args.extend(flat);
    let d = Daemon::start(c, &args);
    let b = d.batch(SOON);
    assert_eq!(
        kinds(&b),
        [
            ("added", "a/first"),
            ("rejected", "b/second"),
            ("synced", "")
        ]
    );
    let reason = b[1]["reason"].as_str().unwrap();
    assert!(
        reason.contains("\"shared.yaml\"")
            && reason.contains("a/first")
            && reason.contains("b/second"),
        "{reason}"
    );
    assert!(b[1]["hash"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(
        (b[2]["modules"].as_u64(), b[2]["rejected"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(tree(&out), map(&[("a.yaml", "a"), ("shared.yaml", "A")]));
    // Announced once per content, not once per poll.
    d.quiet_through(&s, 3, 1);
    s.put(
        labelled("b", "second")
            .data("shared.yaml", "B2")
            .data("b.yaml", "b"),
    );
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b.len()),
        (Some("rejected"), 2),
        "{b:?}"
    );
    // The holder goes: the waiting module takes the key in the same batch.
    s.delete("a", "first");
    let b = d.batch(SOON);
    let kinds: Vec<&str> = b.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["removed", "added", "synced"], "{b:?}");
    assert_eq!(b[1]["module"], "b/second");
    assert_eq!(tree(&out), map(&[("b.yaml", "b"), ("shared.yaml", "B2")]));
    assert!(
        d.stderr()
            .lines()
            .filter(|l| l.contains("rejected"))
            .count()
            >= 2,
        "{}",
        d.stderr()
    );
    d.stop();
    // A restart: nothing rewritten; a newcomer wanting a held key waits.
    let before = fs::metadata(out.join("shared.yaml")).unwrap();
    s.put(labelled("a", "again").data("shared.yaml", "X"));
    let mut once = vec!["run", "--once"];
    once.extend(flat);
    let r = Cmpoll::against(&s).with_args(&once).run().success();
    let after = fs::metadata(out.join("shared.yaml")).unwrap();
    assert_eq!(
        (after.ino(), after.mtime_nsec()),
        (before.ino(), before.mtime_nsec())
    );
    assert!(
        r.stdout.contains(r#""type":"rejected","module":"a/again""#),
        "the holder keeps its key over a restart, although a/again sorts first: {}",
        r.stdout
    );
    assert_eq!(tree(&out), map(&[("b.yaml", "b"), ("shared.yaml", "B2")]));
    assert!(leftovers(&out).is_empty());
}

/// Issue 23.1: the longest names the apiserver accepts (a 63-byte namespace, a 253-byte
/// name) are delivered in the files layout and validated, at any age of the folder: after
/// a restart whose record's sequence is near its end, an update still reaches the folder.
#[test]
fn the_longest_valid_names_are_delivered_at_any_age_of_the_folder() {
    let ns = format!("n{}", "s".repeat(62));
    let name = format!("{}.{}", "a".repeat(200), "b".repeat(52));
    let s = TestApiserver::start();
    s.put(labelled(&ns, &name).data("k.conf", "v1"));
    let c = Cmpoll::against(&s);
    let out = c.path("out");
    let once = |c: &Cmpoll| {
        c.with_args(&[
            "run",
            "--once",
            "--out-dir",
            out.to_str().unwrap(),
            "--validate",
            "test -f \"$CMPOLL_MODULE_DIR/k.conf\" && test -f \"$CMPOLL_MODULE_FILE\"",
        ])
        .run()
        .success()
    };
    once(&c);
    let file = out.join(&ns).join(&name).join("k.conf");
    assert_eq!(fs::read_to_string(&file).unwrap(), "v1");
    // An old folder: its record's sequence is near the end of its range.
    let state = out.join(".cmpoll/state.json");
    let mut record: serde_json::Value = serde_json::from_slice(&fs::read(&state).unwrap()).unwrap();
    record["seq"] = serde_json::json!(u64::MAX - 2);
    fs::write(&state, record.to_string()).unwrap();
    s.put(labelled(&ns, &name).data("k.conf", "v2"));
    let run = once(&c);
    assert_eq!(fs::read_to_string(&file).unwrap(), "v2", "{}", run.stderr);
    assert!(!run.stderr.contains("too long"), "{}", run.stderr);
    for v in fs::read_dir(out.join(".cmpoll/versions")).unwrap() {
        let v = v.unwrap().file_name();
        assert!(v.len() <= 255, "{v:?}");
    }
}

/// Issue 42.5: the output folder's record cannot be saved (`ENOSPC`, injected by strace
/// into the first writes of `.state.json.tmp`: the saves at start and after the first batch, as a full volume would
/// answer it). The daemon goes on: the batch is left unwritten and `/readyz` says why;
/// the next poll writes it again, the save succeeds, and the folder, its record and
/// readiness agree with the cluster. (It exited 1 with "cannot save" before.)
#[test]
fn a_record_that_cannot_be_saved_stops_nothing() {
    let strace = std::process::Command::new("strace").arg("-V").output();
    assert!(
        strace.is_ok_and(|o| o.status.success()),
        "strace is needed (apt install strace; .ci/run installs it)"
    );
    let (s, c) = cluster(&[("ns", "a", "1"), ("ns", "b", "2")]);
    let out = c.out();
    let tmp = out.join(".cmpoll/.state.json.tmp");
    let listen = format!("127.0.0.1:{}", crate::util::tools::free_port());
    let wrapper = [
        "strace",
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        "-P",
        tmp.to_str().unwrap(),
        "-e",
        "trace=write",
        "-e",
        "inject=write:error=ENOSPC:when=1..3",
    ];
    let mut d = Daemon::start_wrapped(
        c,
        &wrapper,
        &[
            "--interval",
            "500ms",
            "--out-dir",
            out.to_str().unwrap(),
            "--listen",
            &listen,
        ],
    );
    let readyz = || crate::util::tools::curl(&format!("http://{listen}/readyz"));
    eventually(
        "/readyz to say the batch is unwritten, and why",
        SOON,
        || {
            readyz().is_some_and(|(code, body)| {
                code == 503 && body.contains("unwritten") && body.contains("cannot save the record")
            })
        },
    );
    assert!(d.is_running(), "{}", d.stderr());
    eventually("/readyz ready once a save succeeds", SOON, || {
        readyz().is_some_and(|(code, _)| code == 200)
    });
    assert!(
        d.stderr().contains("No space left on device"),
        "{}",
        d.stderr()
    );
    s.put(labelled("ns", "c").data("k", "3"));
    eventually("the next module", SOON, || {
        tree(&out).contains_key("ns/c/k")
    });
    assert_eq!(
        tree(&out),
        map(&[("ns/a/k", "1"), ("ns/b/k", "2"), ("ns/c/k", "3")])
    );
    // The record is saved after the batch's files are switched (the journal covers the
    // moment between): it names ns/c once that save is done.
    let recorded = || -> Vec<String> {
        let Ok(bytes) = fs::read(out.join(".cmpoll/state.json")) else {
            return Vec::new();
        };
        let record: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        (record["modules"].as_object().into_iter().flatten())
            .map(|(k, _)| k.clone())
            .collect()
    };
    eventually("the record to name every module", SOON, || {
        recorded() == ["ns/a", "ns/b", "ns/c"]
    });
    assert!(d.is_running());
    // strace passes no signal on: cmpoll, its child, is stopped itself.
    let pid = d.pid().to_string();
    let stopped = std::process::Command::new("pkill")
        .args(["-TERM", "-P", &pid])
        .status()
        .unwrap();
    assert!(stopped.success());
    assert_eq!(d.wait(SOON), Some(0), "a clean stop");
}

/// Issue 29: a batch is staged, synced once, switched, synced once. `strace` kills cmpoll
/// (SIGKILL, injected at the syscall) at the sync after the staging (nothing switched yet)
/// and at the sync after the switches (the record not yet saved), in every layout, with a
/// foreign file where one module goes and the cluster moving meanwhile; each time a
/// restart ends with the folder equal to the cluster, the foreign file untouched, nothing
/// left over.
#[test]
fn a_kill_at_either_grouped_sync_is_recovered_exactly() {
    let strace = std::process::Command::new("strace").arg("-V").output();
    assert!(
        strace.is_ok_and(|o| o.status.success()),
        "strace is needed (apt install strace; .ci/run installs it)"
    );
    for layout in ["files", "concat", "flat"] {
        // syncfs 1 is recovery's at start; 2: after the staging; 3: after the switches.
        for (at, what) in [(2, "staged, none switched"), (3, "switched, not recorded")] {
            let s = TestApiserver::start();
            for i in 0..40 {
                s.put(
                    labelled(&format!("ns-{}", i % 3), &format!("m-{i:02}"))
                        .data(&format!("k{i:02}.conf"), &format!("v{i}\n")),
                );
            }
            let c = Cmpoll::against(&s);
            let out = c.out();
            let foreign = match layout {
                "files" => "ns-0/m-03".to_string(),
                "concat" => "ns-0.m-03".to_string(),
                _ => "k03.conf".to_string(),
            };
            c.write(&format!("out/{foreign}"), "hand-made\n");
            let args = [
                "run",
                "--once",
                "--out-dir",
                out.to_str().unwrap(),
                "--layout",
                layout,
                "--old-version-ttl",
                "0s",
            ];
            let inject = format!("inject=syncfs:signal=KILL:when={at}");
            let killed = c
                .wrapped(
                    &["strace", "-f", "-qq", "-o", "/dev/null", "-e", &inject],
                    &args,
                )
                .output()
                .unwrap();
            assert!(
                !killed.status.success(),
                "{layout} at {at}: killed\n{}",
                String::from_utf8_lossy(&killed.stderr)
            );
            let pending = crate::util::pending_writes(&out);
            // A flat target is checked at the switch, so the blocked module is planned too.
            let planned = if layout == "flat" { 40 } else { 39 };
            assert_eq!(
                pending, planned,
                "{layout} at {at} ({what}): the record lists the writes"
            );
            // What an agent reads: temporary names are hidden (staged concat/flat files).
            let published = tree(&out)
                .keys()
                .filter(|k| {
                    !k.rsplit('/')
                        .next()
                        .unwrap_or(k)
                        .starts_with(".cmpoll-tmp.")
                })
                .count();
            match at {
                2 => assert_eq!(published, 1, "{layout}: {what}: only the foreign file"),
                _ => assert_eq!(
                    published, 40,
                    "{layout}: {what}: 39 modules and the foreign file"
                ),
            }
            // The cluster moves on while cmpoll is down.
            s.delete("ns-1", "m-01");
            s.put(labelled("ns-2", "m-02").data("k02.conf", "changed\n"));
            let run = c.with_args(&args).run();
            assert_eq!(
                run.code,
                Some(1),
                "the blocked module fails --once\n{}",
                run.described
            );
            let on_disk = tree(&out);
            let mut want = std::collections::BTreeMap::new();
            for o in s.objects() {
                let (key, value) = o.spec.data.iter().next().unwrap();
                let rel = match layout {
                    "files" => format!("{}/{}/{key}", o.spec.namespace, o.spec.name),
                    "concat" => format!("{}.{}", o.spec.namespace, o.spec.name),
                    _ => key.clone(),
                };
                if o.spec.name != "m-03" {
                    want.insert(rel, value.clone());
                }
            }
            want.insert(foreign.clone(), "hand-made\n".to_string());
            assert_eq!(
                on_disk, want,
                "{layout} at {at}: the folder equals the cluster"
            );
            assert!(
                leftovers(&out).is_empty(),
                "{layout}: {:?}",
                leftovers(&out)
            );
            if layout == "files" {
                let versions = fs::read_dir(out.join(".cmpoll/versions")).unwrap().count();
                assert_eq!(versions, 38, "no orphaned version folders");
            }
        }
    }
}

/// Issue 29: state.json is held smaller in memory and written without indentation; what
/// a released cmpoll (11f9bac) wrote is still read. The fixtures are the output folders
/// that binary wrote for k8s/examples in each layout (`cmpoll run --once --manifests
/// k8s/examples --out-dir tests/fixtures/outdir-11f9bac/LAYOUT --layout LAYOUT`), and the
/// examples as they were then (`manifests/`); today's binary takes them over without
/// rewriting a module, and keeps their hashes.
#[test]
fn a_folder_written_by_the_released_binary_is_taken_over_unchanged() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for layout in ["files", "concat", "flat"] {
        let c = Cmpoll::new();
        let out = c.out();
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(root.join("tests/fixtures/outdir-11f9bac").join(layout))
            .arg(&out)
            .status()
            .unwrap();
        assert!(copied.success());
        let old: serde_json::Value =
            serde_json::from_slice(&fs::read(out.join(".cmpoll/state.json")).unwrap()).unwrap();
        let before = crate::util::tree_with_links(&out);
        let inodes = |p: &std::path::Path| -> Vec<u64> {
            let mut v: Vec<u64> = fs::read_dir(p)
                .unwrap()
                .map(|e| fs::symlink_metadata(e.unwrap().path()).unwrap().ino())
                .collect();
            v.sort();
            v
        };
        let inodes_before = inodes(&out);
        c.with_args(&[
            "run",
            "--once",
            "--manifests",
            root.join("tests/fixtures/outdir-11f9bac/manifests")
                .to_str()
                .unwrap(),
            "--out-dir",
            out.to_str().unwrap(),
            "--layout",
            layout,
        ])
        .run()
        .success();
        assert_eq!(crate::util::tree_with_links(&out), before, "{layout}");
        assert_eq!(inodes(&out), inodes_before, "{layout}: nothing replaced");
        let text = fs::read_to_string(out.join(".cmpoll/state.json")).unwrap();
        assert!(
            !text.contains("\n  "),
            "{layout}: written without indentation"
        );
        let new: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(new["modules"], old["modules"], "{layout}: the same record");
        assert_eq!(new["version"], 1, "{layout}: the same format");
    }
}

const FOLDER: &str = "k8s-sidecar-target-directory";

/// Issue 26: `--folder-annotation` (k8s-sidecar's FOLDER_ANNOTATION): each module's files
/// in the folder its annotation names, relative to the output folder or absolute inside
/// it; the same key in two folders is no clash; a changed annotation moves the files in
/// one batch (the folder is part of the module: an update) and the folder cmpoll made goes
/// when it empties; a value that leaves the folder, or a folder that is a symlink cmpoll
/// did not make, rejects the module and writes nothing anywhere.
#[test]
fn the_folder_annotation_places_files_inside_the_folder_only() {
    let s = TestApiserver::start();
    let c = Cmpoll::against(&s);
    let out = c.out();
    let elsewhere = c.path("elsewhere");
    let escape = c.path("escape");
    fs::create_dir_all(&elsewhere).unwrap();
    fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("linked")).unwrap();
    let at = |ns: &str, name: &str, folder: Option<&str>| {
        let cm = labelled(ns, name).data("dash.json", name);
        s.put(match folder {
            Some(f) => cm.annotation(FOLDER, f),
            None => cm,
        });
    };
    at("a", "plain", None);
    at("a", "team-a", Some("team-a"));
    at("b", "team-b", Some(&format!("{}/nested/b/", out.display())));
    at("b", "same-key", Some("other"));
    at("c", "dotdot", Some("../escape"));
    at("c", "absolute", Some(elsewhere.to_str().unwrap()));
    at("c", "through-link", Some("linked"));
    let dir = out.to_str().unwrap().to_string();
    let d = c.daemon(&[
        "--out-dir",
        &dir,
        "--layout",
        "flat",
        "--folder-annotation",
        FOLDER,
        "--interval",
        "50ms",
        "--stdout-events",
    ]);
    let first = d.batch(SOON);
    let kinds: Vec<(&str, &str)> = (first.iter())
        .filter(|e| e["type"] != "synced")
        .map(|e| (e["type"].as_str().unwrap(), e["module"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("added", "a/plain"),
            ("added", "a/team-a"),
            ("added", "b/same-key"),
            ("added", "b/team-b"),
            ("rejected", "c/absolute"),
            ("rejected", "c/dotdot"),
            ("rejected", "c/through-link"),
        ]
    );
    let reason = |m: &str| {
        let e = first.iter().find(|e| e["module"] == m).unwrap();
        e["reason"].as_str().unwrap().to_string()
    };
    assert!(
        reason("c/dotdot").contains(FOLDER),
        "{}",
        reason("c/dotdot")
    );
    assert!(
        reason("c/through-link").contains("symlink"),
        "{}",
        reason("c/through-link")
    );
    let mut want = map(&[
        ("dash.json", "plain"),
        ("team-a/dash.json", "team-a"),
        ("nested/b/dash.json", "team-b"),
        ("other/dash.json", "same-key"),
    ]);
    assert_eq!(
        tree(&out),
        want,
        "the files in the folders, linked not followed"
    );
    assert!(
        fs::read_dir(&elsewhere).unwrap().next().is_none(),
        "nothing outside"
    );
    assert!(!escape.exists());
    // A moved annotation moves the files in one batch; the emptied folder goes.
    at("a", "team-a", Some("team-c"));
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["module"].as_str()),
        (Some("updated"), Some("a/team-a"))
    );
    want.remove("team-a/dash.json");
    want.insert("team-c/dash.json".into(), "team-a".into());
    assert_eq!(tree(&out), want);
    assert!(
        !out.join("team-a").exists(),
        "the folder cmpoll made goes with its last file"
    );
    // Without its annotation b/team-b wants `dash.json`, which a/plain holds: it waits
    // (rejected, keeping its last version) until a/plain is gone, then moves in the same
    // batch, and the folders cmpoll made for it go.
    at("b", "team-b", None);
    let b = d.batch(SOON);
    assert_eq!(
        (b[0]["type"].as_str(), b[0]["module"].as_str()),
        (Some("rejected"), Some("b/team-b"))
    );
    assert_eq!(tree(&out), want);
    s.delete("a", "plain");
    let b = d.batch(SOON);
    let kinds: Vec<(&str, &str)> = (b.iter())
        .filter(|e| e["type"] != "synced")
        .map(|e| (e["type"].as_str().unwrap(), e["module"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("removed", "a/plain"), ("updated", "b/team-b")]);
    want.remove("nested/b/dash.json");
    want.insert("dash.json".into(), "team-b".into());
    assert_eq!(tree(&out), want);
    assert!(!out.join("nested").exists());
    assert!(leftovers(&out).is_empty());
    d.stop();
}

/// Issue 26: `--unique-filenames` names files as k8s-sidecar does
/// (`namespace_<NS>.<configmap|secret>_<NAME>.<KEY>`), so the same key in a ConfigMap and
/// a Secret of the same name is two files; with a folder annotation, in its folder; a
/// restart rewrites nothing and keeps the folders it made.
#[test]
fn unique_filenames_with_both_kinds_and_folders() {
    let s = TestApiserver::start();
    s.grant(
        test_apiserver::USER,
        test_apiserver::Grant::all().resources(&["configmaps", "secrets"]),
    );
    s.put(labelled("mon", "dash").data("a.json", "cm"));
    s.put(
        test_apiserver::ConfigMap::secret("mon", "dash")
            .label("cmpoll.io/module", "true")
            .annotation(FOLDER, "secrets")
            .data("a.json", "secret"),
    );
    let c = Cmpoll::against(&s);
    let out = c.out();
    let dir = out.to_str().unwrap();
    let args = [
        "run",
        "--once",
        "--resource",
        "configmaps,secrets",
        "--out-dir",
        dir,
        "--layout",
        "flat",
        "--unique-filenames",
        "--folder-annotation",
        FOLDER,
    ];
    c.with_args(&args).run().success();
    let want = map(&[
        ("namespace_mon.configmap_dash.a.json", "cm"),
        ("secrets/namespace_mon.secret_dash.a.json", "secret"),
    ]);
    assert_eq!(tree(&out), want);
    let before = fs::metadata(out.join("secrets/namespace_mon.secret_dash.a.json")).unwrap();
    c.with_args(&args).run().success();
    let after = fs::metadata(out.join("secrets/namespace_mon.secret_dash.a.json")).unwrap();
    assert_eq!(
        (before.ino(), before.mtime_nsec()),
        (after.ino(), after.mtime_nsec())
    );
    assert_eq!(tree(&out), want);
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join(".cmpoll/state.json")).unwrap()).unwrap();
    assert_eq!(state["namespaces"], serde_json::json!(["secrets"]));
    // The flags belong to the flat layout.
    let r = c
        .with_args(&["run", "--once", "--out-dir", dir, "--unique-filenames"])
        .run()
        .failure(2);
    assert!(r.error_line().contains("--layout flat"), "{}", r.described);
}

/// `--module-template` (issue 28): each module's concat file is the template around it,
/// `--offer-arguments` gives a module the offered arguments it declares; a new template
/// (or new arguments) rewrites every module at the next start, though no module changed.
#[test]
fn a_module_template_wraps_each_module_and_a_new_one_rewrites_them() {
    let (s, c) = cluster(&[("team-a", "web", "x")]);
    s.put(labelled("team-b", "web").data("k", "argument \"receiver\" { }\ny = 1\n"));
    let out = c.out();
    let t = c.write(
        "module.tmpl",
        "declare \"{{ident}}\" {\n{{content}}}\n{{ident}} \"m\" {\n  {{arguments}}\n}\n",
    );
    let a = c.write("offered", "receiver = root.out\nunused = 1\n");
    let args = |t: &std::path::Path| {
        vec![
            "run".to_string(),
            "--once".into(),
            "--out-dir".into(),
            out.display().to_string(),
            "--layout".into(),
            "concat".into(),
            "--ext".into(),
            ".alloy".into(),
            "--module-template".into(),
            t.display().to_string(),
            "--offer-arguments".into(),
            a.display().to_string(),
        ]
    };
    c.with_args(&args(&t)).run().success();
    assert_eq!(
        tree(&out),
        map(&[
            (
                "team-a.web.alloy",
                "declare \"team_a_S_web\" {\nx\n}\nteam_a_S_web \"m\" {\n  \n}\n"
            ),
            (
                "team-b.web.alloy",
                "declare \"team_b_S_web\" {\nargument \"receiver\" { }\ny = 1\n}\nteam_b_S_web \"m\" {\n  receiver = root.out\n}\n"
            ),
        ])
    );
    let before = fs::metadata(out.join("team-a.web.alloy")).unwrap().ino();
    // The same template again: nothing rewritten.
    c.with_args(&args(&t)).run().success();
    assert_eq!(
        fs::metadata(out.join("team-a.web.alloy")).unwrap().ino(),
        before
    );
    // Another template: every module rewritten, though none changed in the cluster.
    let t2 = c.write("module2.tmpl", "// {{module}}\n{{content}}{{arguments}}\n");
    c.with_args(&args(&t2)).run().success();
    assert_eq!(
        fs::read_to_string(out.join("team-a.web.alloy")).unwrap(),
        "// team-a/web\nx\n\n"
    );
    // A template's mistake is a start-up error naming the flag.
    let bad = c.write("bad.tmpl", "{{content}} {{namespaces}}");
    let run = c.with_args(&args(&bad)).run().failure(2);
    assert!(
        run.stderr.contains("--module-template") && run.stderr.contains("{{namespaces}}"),
        "{}",
        run.described
    );
    let run = c
        .with_args(&[
            "run",
            "--once",
            "--out-dir",
            out.to_str().unwrap(),
            "--offer-arguments",
            a.to_str().unwrap(),
        ])
        .run()
        .failure(2);
    assert!(
        run.stderr
            .contains("--offer-arguments: only used with --module-template"),
        "{}",
        run.described
    );
}
