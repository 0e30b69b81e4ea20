//! Unit tests of the output folder sink.

use super::*;
use crate::atomic;
use crate::batch::{Batch, Change, Event, Outcome, Sink, Synced};
use crate::poll::hash::Hash;
use crate::poll::snapshot::Entry;
use crate::poll::spool::{ObjectRef, Spool};
use crate::source::{Content, ModuleFile, Resources};
use record::Record;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An event with its own id and entry (a batch's events borrow them from snapshots).
#[derive(Clone, Debug)]
struct Ev {
    change: Change,
    id: String,
    entry: Entry,
}

fn borrowed(events: &[Ev]) -> Vec<Event<'_>> {
    (events.iter())
        .map(|e| Event::new(e.change, &e.id, &e.entry))
        .collect()
}

struct Fixture {
    dir: tempfile::TempDir,
    spool: Spool,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            spool: Spool::memory(),
        }
    }

    fn options(&self, layout: Layout) -> Options {
        Options {
            dir: self.dir.path().to_path_buf(),
            layout,
            ext: ".conf".into(),
            file_modes: FileModes::all(0o644),
            kinds: Resources::default(),
            folder_annotation: None,
            old_version_ttl: Duration::ZERO,
            template: None,
        }
    }

    fn open(&self, layout: Layout) -> OutDir {
        OutDir::open(self.options(layout)).unwrap()
    }

    fn record(&self) -> Record {
        Record::read(&fs::read(self.path(".cmpoll/state.json")).unwrap()[..]).unwrap()
    }

    fn event(&mut self, change: Change, id: &str, files: &[(&str, &str)]) -> Ev {
        let files: Vec<ModuleFile> = files
            .iter()
            .map(|(k, v)| ModuleFile {
                key: k.to_string(),
                content: Content::Text(v.to_string()),
            })
            .collect();
        let loc = self
            .spool
            .put(&ObjectRef::configmap("u", "1"), &files)
            .unwrap();
        let entry = Entry {
            resource_version: "1".into(),
            hash: Hash::of(files.iter().map(|f| (f.key.as_str(), f.content.bytes()))),
            loc,
        };
        Ev {
            change,
            id: id.to_string(),
            entry,
        }
    }

    fn apply(&self, out: &mut OutDir, events: Vec<Ev>) -> Vec<String> {
        let failed = self.apply_all(out, events).unwritten;
        failed.into_iter().map(|u| u.module).collect()
    }

    fn apply_all(&self, out: &mut OutDir, events: Vec<Ev>) -> Outcome {
        let batch = Batch {
            events: borrowed(&events),
            synced: Synced::default(),
            spool: &self.spool,
            first: false,
        };
        out.apply(&batch).unwrap()
    }

    /// The first batch after a start (the daemon's reconcile batch).
    fn apply_first(&self, out: &mut OutDir, events: Vec<Ev>) -> Vec<String> {
        let batch = Batch {
            events: borrowed(&events),
            synced: Synced::default(),
            spool: &self.spool,
            first: true,
        };
        let failed = out.apply(&batch).unwrap().unwritten;
        failed.into_iter().map(|u| u.module).collect()
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
}

#[test]
fn files_layout_switches_a_symlink_and_records_it() {
    let mut f = Fixture::new();
    let mut out = f.open(Layout::Files);
    let e = f.event(Change::Added, "ns/m", &[("a.conf", "1"), ("b.conf", "2")]);
    assert!(f.apply(&mut out, vec![e]).is_empty());
    assert_eq!(fs::read_to_string(f.path("ns/m/a.conf")).unwrap(), "1");
    let first = fs::read_link(f.path("ns/m")).unwrap();
    assert!(first.starts_with("../.cmpoll/versions"), "{first:?}");
    let e = f.event(Change::Updated, "ns/m", &[("a.conf", "3")]);
    f.apply(&mut out, vec![e]);
    assert_ne!(fs::read_link(f.path("ns/m")).unwrap(), first);
    assert!(!f.path("ns/m/b.conf").exists());
    out.tick(None).unwrap();
    assert_eq!(
        fs::read_dir(f.path(".cmpoll/versions")).unwrap().count(),
        1,
        "old version gone"
    );
    let state = f.record();
    assert!(state.pending.is_empty());
    assert_eq!(
        &**state
            .modules
            .get("ns/m")
            .unwrap()
            .placed
            .version()
            .unwrap()
            .1,
        [Box::from("a.conf")]
    );
    let e = f.event(Change::Removed, "ns/m", &[]);
    f.apply(&mut out, vec![e]);
    assert!(
        !f.path("ns").exists(),
        "an emptied namespace folder cmpoll made goes"
    );
}

/// A batch larger than a chunk: every chunk is recorded, then written; the removal comes
/// before the first write; the record ends with every module and nothing pending.
#[test]
fn a_batch_larger_than_a_chunk_is_written_chunk_by_chunk() {
    for layout in [Layout::Files, Layout::Concat, Layout::Flat] {
        let mut f = Fixture::new();
        let mut out = f.open(layout);
        out.chunk = 2;
        let old = f.event(Change::Added, "a/old", &[("shared.conf", "old")]);
        assert!(f.apply(&mut out, vec![old]).is_empty());
        let mut events = vec![f.event(Change::Removed, "a/old", &[])];
        for i in 0..5 {
            // In flat, the first newcomer takes the key the removal frees.
            let key = if i == 0 {
                "shared.conf".to_string()
            } else {
                format!("k{i}.conf")
            };
            events.push(f.event(
                Change::Added,
                &format!("b/m{i}"),
                &[(&key, &format!("v{i}"))],
            ));
        }
        assert!(f.apply(&mut out, events).is_empty(), "{layout:?}");
        let state = f.record();
        assert!(state.pending.is_empty(), "{layout:?}");
        let ids: Vec<&str> = state.modules.keys().collect();
        assert_eq!(ids, ["b/m0", "b/m1", "b/m2", "b/m3", "b/m4"], "{layout:?}");
        let (first, last) = match layout {
            Layout::Files => ("b/m0/shared.conf", "b/m4/k4.conf"),
            Layout::Concat => ("b.m0.conf", "b.m4.conf"),
            Layout::Flat => ("shared.conf", "k4.conf"),
        };
        // (concat ends a file without a newline with one)
        let read = |p: &str| {
            fs::read_to_string(f.path(p))
                .unwrap()
                .trim_end()
                .to_string()
        };
        assert_eq!(
            (read(first), read(last)),
            ("v0".into(), "v4".into()),
            "{layout:?}"
        );
    }
}

#[test]
fn concat_layout_and_newlines() {
    let mut f = Fixture::new();
    let mut out = f.open(Layout::Concat);
    let e = f.event(
        Change::Added,
        "ns/m",
        &[("a", "x"), ("b", "y\n"), ("c", "")],
    );
    f.apply(&mut out, vec![e]);
    assert_eq!(fs::read_to_string(f.path("ns.m.conf")).unwrap(), "x\ny\n\n");
    let e = f.event(Change::Removed, "ns/m", &[]);
    f.apply(&mut out, vec![e]);
    assert!(!f.path("ns.m.conf").exists());
}

#[test]
fn foreign_files_are_never_replaced_or_removed() {
    let mut f = Fixture::new();
    fs::create_dir_all(f.path("ns")).unwrap();
    fs::write(f.path("ns/m"), "mine, not cmpoll's").unwrap();
    fs::write(f.path("ns/notes.txt"), "keep").unwrap();
    let mut out = f.open(Layout::Files);
    let bad = f.event(Change::Added, "ns/m", &[("a", "1")]);
    let good = f.event(Change::Added, "ns/n", &[("a", "1")]);
    assert_eq!(f.apply(&mut out, vec![bad, good]), ["ns/m"]);
    assert_eq!(
        fs::read_to_string(f.path("ns/m")).unwrap(),
        "mine, not cmpoll's"
    );
    let gone = f.event(Change::Removed, "ns/n", &[]);
    f.apply(&mut out, vec![gone]);
    assert!(
        f.path("ns/notes.txt").exists(),
        "a folder cmpoll did not make stays"
    );
    assert!(!f.path("ns/n").exists());
}

#[test]
fn a_second_cmpoll_is_locked_out() {
    let f = Fixture::new();
    let _first = f.open(Layout::Files);
    let e = OutDir::open(f.options(Layout::Files)).err().unwrap();
    assert!(
        e.contains("another cmpoll is writing to this folder"),
        "{e}"
    );
}

#[test]
fn recovery_adopts_a_finished_switch_and_drops_an_unfinished_one() {
    let mut f = Fixture::new();
    {
        let mut out = f.open(Layout::Files);
        let e = f.event(Change::Added, "ns/done", &[("a", "1")]);
        let files = f.spool.get(e.entry.loc).unwrap();
        let done = out.writer().plan("ns/done", &e.entry, &files).unwrap();
        let half = out.writer().plan("ns/half", &e.entry, &files).unwrap();
        out.upkeep.record_mut().pending = vec![done.clone(), half.clone()];
        out.upkeep.save().unwrap();
        // A crash after the first switch, in the middle of the second write.
        let staged = out.writer().stage(&done, &files).unwrap();
        out.writer().switch(&done, staged).unwrap();
        let vdir = out
            .upkeep
            .places()
            .versions()
            .join(half.written.placed.version().unwrap().0);
        fs::create_dir(&vdir).unwrap();
        fs::write(vdir.join("a"), "1").unwrap();
    }
    let out = f.open(Layout::Files);
    assert!(out.upkeep.record().modules.contains_key("ns/done"));
    assert!(!out.upkeep.record().modules.contains_key("ns/half"));
    assert_eq!(fs::read_dir(f.path(".cmpoll/versions")).unwrap().count(), 1);
    assert!(out.upkeep.record().pending.is_empty());
    assert!(
        out.upkeep.record().namespaces.contains("ns"),
        "the namespace folder the interrupted run made is known to be cmpoll's"
    );
}

/// r13: a crash between recording a concat write and finishing it never makes a file in
/// the way cmpoll's: it is neither overwritten on restart nor deleted later.
#[test]
fn concat_recovery_adopts_only_what_it_can_prove_it_wrote() {
    let mut f = Fixture::new();
    let e = f.event(Change::Added, "ns/foreign", &[("a", "new")]);
    let done = f.event(Change::Added, "ns/done", &[("a", "1")]);
    {
        let mut out = f.open(Layout::Concat);
        let files = f.spool.get(e.entry.loc).unwrap();
        let p = out.writer().plan("ns/foreign", &e.entry, &files).unwrap();
        let done_files = f.spool.get(done.entry.loc).unwrap();
        let q = out
            .writer()
            .plan("ns/done", &done.entry, &done_files)
            .unwrap();
        out.upkeep.record_mut().pending = vec![p, q.clone()];
        out.upkeep.save().unwrap();
        // Someone's file lands where the module goes, and the crash comes after the second
        // write's rename.
        fs::write(f.path("ns.foreign.conf"), "hand-made").unwrap();
        let staged = out.writer().stage(&q, &done_files).unwrap();
        out.writer().switch(&q, staged).unwrap();
    }
    let mut out = f.open(Layout::Concat);
    assert!(
        !out.upkeep.record().modules.contains_key("ns/foreign"),
        "not adopted"
    );
    assert!(
        out.upkeep.record().modules.contains_key("ns/done"),
        "proved by its digest"
    );
    assert_eq!(
        fs::read_to_string(f.path("ns.foreign.conf")).unwrap(),
        "hand-made"
    );
    // The module stays blocked while the file is there, and its removal leaves the file.
    let again = f.event(Change::Added, "ns/foreign", &[("a", "new")]);
    assert_eq!(f.apply(&mut out, vec![again]), ["ns/foreign"]);
    let gone = f.event(Change::Removed, "ns/foreign", &[]);
    f.apply(&mut out, vec![gone]);
    assert_eq!(
        fs::read_to_string(f.path("ns.foreign.conf")).unwrap(),
        "hand-made"
    );
}

/// r13: switching layouts between runs removes what the old layout wrote, so switching
/// back is not blocked by cmpoll's own leftovers.
#[test]
fn a_layout_switch_cleans_up_and_can_switch_back() {
    let mut f = Fixture::new();
    let layouts = [
        Layout::Files,
        Layout::Concat,
        Layout::Flat,
        Layout::Files,
        Layout::Flat,
        Layout::Concat,
    ];
    for layout in layouts {
        let mut out = f.open(layout);
        let e = f.event(Change::Added, "ns/m", &[("a", "1")]);
        // Every start reconciles: the first batch has every module as added.
        assert!(f.apply_first(&mut out, vec![e]).is_empty(), "{layout:?}");
        out.tick(None).unwrap();
        let names: BTreeSet<String> = fs::read_dir(f.path(""))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let want: BTreeSet<String> = match layout {
            Layout::Files => [".cmpoll", "ns"],
            Layout::Concat => [".cmpoll", "ns.m.conf"],
            Layout::Flat => [".cmpoll", "a"],
        }
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(names, want, "{layout:?}");
        drop(out);
    }
}

/// r13: a recorded namespace folder that became a symlink is never reached through.
#[test]
fn nothing_is_removed_through_a_symlink_cmpoll_did_not_make() {
    let mut f = Fixture::new();
    let elsewhere = tempfile::tempdir().unwrap();
    {
        let mut out = f.open(Layout::Files);
        let e = f.event(Change::Added, "ns/m", &[("a", "1")]);
        f.apply(&mut out, vec![e]);
    }
    // Swap DIR/ns for a symlink to a folder holding a file named like the module.
    fs::remove_file(f.path("ns/m")).unwrap();
    fs::remove_dir(f.path("ns")).unwrap();
    fs::write(elsewhere.path().join("m"), "victim").unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), f.path("ns")).unwrap();
    let mut out = f.open(Layout::Files);
    let gone = f.event(Change::Removed, "ns/m", &[]);
    f.apply(&mut out, vec![gone]);
    assert_eq!(
        fs::read_to_string(elsewhere.path().join("m")).unwrap(),
        "victim"
    );
    let e = f.event(Change::Added, "ns/x", &[("a", "1")]);
    assert_eq!(f.apply(&mut out, vec![e]), ["ns/x"], "nor written through");
    assert!(!elsewhere.path().join("x").exists());
}

/// r13: a hostile record is a start-up error naming the file, and nothing is deleted.
#[test]
fn a_record_pointing_outside_is_a_start_up_error() {
    let f = Fixture::new();
    let victim = tempfile::tempdir().unwrap();
    fs::write(victim.path().join("precious"), "x").unwrap();
    fs::create_dir_all(f.path(".cmpoll/versions")).unwrap();
    let evil = format!(
        r#"{{"version":1,"seq":1,"modules":{{"ns/m":{{"hash":"","mode":420,"file":"../../../../../..{}/precious"}}}},"namespaces":[],"pending":[],"retired":[]}}"#,
        victim.path().display()
    );
    fs::write(f.path(".cmpoll/state.json"), evil).unwrap();
    let e = OutDir::open(f.options(Layout::Concat)).err().unwrap();
    assert!(
        e.contains("state.json' is not valid") && e.contains("modules[\"ns/m\"]"),
        "{e}"
    );
    assert!(victim.path().join("precious").exists());
}

fn rejected_ids(o: &Outcome) -> Vec<&str> {
    o.rejected.iter().map(|r| r.module.as_str()).collect()
}

#[test]
fn flat_layout_writes_keys_and_the_first_holder_keeps_a_key() {
    let mut f = Fixture::new();
    let mut out = f.open(Layout::Flat);
    let a = f.event(
        Change::Added,
        "ns/a",
        &[("shared.yaml", "a"), ("a.yaml", "1")],
    );
    let b = f.event(
        Change::Added,
        "ns/b",
        &[("shared.yaml", "b"), ("b.yaml", "2")],
    );
    let c = f.event(Change::Added, "other/c", &[("c.yaml", "3")]);
    let o = f.apply_all(&mut out, vec![c, a, b]);
    assert!(o.unwritten.is_empty(), "{o:?}");
    assert_eq!(
        rejected_ids(&o),
        ["ns/b"],
        "within a poll: the first in name order"
    );
    let why = &o.rejected[0].reason;
    assert!(
        why.contains("\"shared.yaml\"") && why.contains("ns/a") && why.contains("ns/b"),
        "names both and the key: {why}"
    );
    assert_eq!(fs::read_to_string(f.path("shared.yaml")).unwrap(), "a");
    assert_eq!(fs::read_to_string(f.path("c.yaml")).unwrap(), "3");
    assert!(!f.path("b.yaml").exists(), "rejected whole");
    // Every later poll: still waiting while ns/a holds the key.
    let b = f.event(
        Change::Added,
        "ns/b",
        &[("shared.yaml", "b"), ("b.yaml", "2")],
    );
    assert_eq!(rejected_ids(&f.apply_all(&mut out, vec![b])), ["ns/b"]);
    // ns/a drops the key: ns/b gets it in the same batch (although it sorts first).
    let a = f.event(Change::Updated, "ns/a", &[("a.yaml", "1b")]);
    let b = f.event(
        Change::Added,
        "ns/b",
        &[("shared.yaml", "b"), ("b.yaml", "2")],
    );
    let o = f.apply_all(&mut out, vec![a, b]);
    assert!(o.unwritten.is_empty() && o.rejected.is_empty(), "{o:?}");
    assert_eq!(fs::read_to_string(f.path("shared.yaml")).unwrap(), "b");
    assert_eq!(fs::read_to_string(f.path("a.yaml")).unwrap(), "1b");
    let state = f.record();
    assert_eq!(
        state
            .modules
            .get("ns/b")
            .unwrap()
            .placed
            .flat()
            .keys()
            .collect::<Vec<_>>(),
        ["b.yaml", "shared.yaml"]
    );
    // A removal frees its keys for a waiting module in the same batch.
    let d = f.event(Change::Added, "ns/d", &[("b.yaml", "d")]);
    assert_eq!(rejected_ids(&f.apply_all(&mut out, vec![d])), ["ns/d"]);
    let gone = f.event(Change::Removed, "ns/b", &[]);
    let d = f.event(Change::Added, "ns/d", &[("b.yaml", "d")]);
    let o = f.apply_all(&mut out, vec![gone, d]);
    assert!(o.rejected.is_empty(), "{o:?}");
    assert_eq!(fs::read_to_string(f.path("b.yaml")).unwrap(), "d");
    assert!(!f.path("shared.yaml").exists(), "removed with its module");
}

#[test]
fn flat_files_cmpoll_did_not_write_or_that_changed_are_left_alone() {
    let mut f = Fixture::new();
    fs::write(f.path("theirs.yaml"), "hand-made").unwrap();
    let mut out = f.open(Layout::Flat);
    let m = f.event(Change::Added, "ns/m", &[("theirs.yaml", "x")]);
    assert_eq!(f.apply(&mut out, vec![m]), ["ns/m"]);
    assert_eq!(
        fs::read_to_string(f.path("theirs.yaml")).unwrap(),
        "hand-made"
    );
    let n = f.event(Change::Added, "ns/n", &[("n.yaml", "1"), ("n2.yaml", "2")]);
    assert!(f.apply(&mut out, vec![n]).is_empty());
    fs::write(f.path("n.yaml"), "edited by hand").unwrap();
    let n = f.event(Change::Updated, "ns/n", &[("n.yaml", "3")]);
    assert_eq!(f.apply(&mut out, vec![n]), ["ns/n"], "not overwritten");
    assert_eq!(
        fs::read_to_string(f.path("n.yaml")).unwrap(),
        "edited by hand"
    );
    let gone = f.event(Change::Removed, "ns/n", &[]);
    assert!(f.apply(&mut out, vec![gone]).is_empty());
    assert_eq!(
        fs::read_to_string(f.path("n.yaml")).unwrap(),
        "edited by hand",
        "nor removed"
    );
    assert!(!f.path("n2.yaml").exists(), "what is still cmpoll's goes");
    // A key that is one of cmpoll's temporary names can never be placed: refused.
    let tmp_key = f.event(Change::Added, "ns/t", &[(".cmpoll-tmp.1.x", "1")]);
    let o = f.apply_all(&mut out, vec![tmp_key]);
    assert_eq!(rejected_ids(&o), ["ns/t"], "{o:?}");
}

#[test]
fn flat_recovery_adopts_files_with_the_new_bytes_and_restart_keeps_the_holder() {
    let mut f = Fixture::new();
    let old = f.event(Change::Added, "ns/m", &[("a", "old"), ("b", "old")]);
    let new = f.event(Change::Updated, "ns/m", &[("a", "new"), ("b", "new")]);
    {
        let mut out = f.open(Layout::Flat);
        assert!(f.apply(&mut out, vec![old.clone()]).is_empty());
        let files = f.spool.get(new.entry.loc).unwrap();
        let p = out.writer().plan("ns/m", &new.entry, &files).unwrap();
        out.upkeep.record_mut().pending = vec![p.clone()];
        out.upkeep.save().unwrap();
        // A crash after the first file's rename, with the second's temporary file written.
        atomic::replace_file(f.dir.path(), "a", &format!("{}.0", p.tmp), b"new", 0o644).unwrap();
        atomic::write_new(&f.path(&format!("{}.1", p.tmp)), b"new", 0o644).unwrap();
    }
    let mut out = f.open(Layout::Flat);
    let names: BTreeSet<String> = fs::read_dir(f.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [".cmpoll", "a", "b"].map(String::from).into());
    let w = out.upkeep.record().modules.get("ns/m").unwrap();
    assert_eq!(w.hash, None, "neither version");
    assert_eq!(w.placed.flat().len(), 2, "both files still cmpoll's");
    // The reconcile batch finishes the write; another module wanting "a" waits.
    let rival = f.event(Change::Added, "aa/rival", &[("a", "rival")]);
    let events = [rival, new];
    let batch = Batch {
        events: borrowed(&events),
        synced: Synced::default(),
        spool: &f.spool,
        first: true,
    };
    let o = out.apply(&batch).unwrap();
    assert_eq!(
        rejected_ids(&o),
        ["aa/rival"],
        "the holder keeps its key over a restart"
    );
    assert_eq!(fs::read_to_string(f.path("b")).unwrap(), "new");
    assert_eq!(fs::read_to_string(f.path("a")).unwrap(), "new");
}

/// Issue 23.1: the longest valid namespace (63) and name (253) are written in the files
/// layout, also when the folder's sequence is near its end, and restart and update from
/// there; a version folder named as cmpoll named them before (`NS.NAME.SEQ`) is read back
/// and replaced.
#[test]
fn the_longest_valid_names_are_written_at_any_age_of_the_folder() {
    let ns = format!("n{}", "s".repeat(62));
    let name = format!("{}.{}", "a".repeat(200), "b".repeat(52));
    let twin = format!("{}.{}", "a".repeat(200), "c".repeat(52));
    assert_eq!((ns.len(), name.len()), (63, 253));
    let id = format!("{ns}/{name}");
    let twin_id = format!("{ns}/{twin}");
    let mut f = Fixture::new();
    let mut out = f.open(Layout::Files);
    out.upkeep.record_mut().seq = u64::MAX - 10;
    let events = vec![
        f.event(Change::Added, &id, &[("k", "1")]),
        f.event(Change::Added, &twin_id, &[("k", "twin")]),
    ];
    assert_eq!(f.apply(&mut out, events), Vec::<String>::new());
    let read = |f: &Fixture, id: &str| fs::read_to_string(f.path(&format!("{id}/k"))).unwrap();
    assert_eq!(
        (read(&f, &id), read(&f, &twin_id)),
        ("1".into(), "twin".into())
    );
    let v = out
        .upkeep
        .record()
        .modules
        .get(id.as_str())
        .unwrap()
        .placed
        .version()
        .unwrap()
        .0
        .to_string();
    assert!(v.len() <= 255 && v.contains('~'), "{v}");
    assert_ne!(
        v,
        out.upkeep
            .record()
            .modules
            .get(twin_id.as_str())
            .unwrap()
            .placed
            .version()
            .unwrap()
            .0
            .to_string()
    );
    // A restart reads the record back, and an update still switches.
    drop(out);
    let mut out = f.open(Layout::Files);
    let e = f.event(Change::Updated, &id, &[("k", "2")]);
    assert_eq!(f.apply(&mut out, vec![e]), Vec::<String>::new());
    assert_eq!(read(&f, &id), "2");
    drop(out);
    // What an older cmpoll wrote for a long name that fitted (`NS.NAME.SEQ`, 255 bytes).
    let old_ns = "monitoring";
    let old_name = "x".repeat(242);
    let old_id = format!("{old_ns}/{old_name}");
    let old_version = format!("{old_ns}.{old_name}.1");
    assert_eq!(old_version.len(), 255);
    fs::create_dir_all(f.path(&format!(".cmpoll/versions/{old_version}"))).unwrap();
    fs::write(f.path(&format!(".cmpoll/versions/{old_version}/k")), "old").unwrap();
    fs::create_dir(f.path(old_ns)).unwrap();
    std::os::unix::fs::symlink(
        format!("../.cmpoll/versions/{old_version}"),
        f.path(&old_id),
    )
    .unwrap();
    let mut state: serde_json::Value =
        serde_json::from_slice(&fs::read(f.path(".cmpoll/state.json")).unwrap()).unwrap();
    let old_entry = f.event(Change::Added, &old_id, &[("k", "old")]);
    state["modules"][&old_id] = serde_json::json!({
        "hash": old_entry.entry.hash.to_string(), "mode": 420,
        "version": old_version, "files": ["k"]});
    state["namespaces"] = serde_json::json!([ns, old_ns]);
    fs::write(f.path(".cmpoll/state.json"), state.to_string()).unwrap();
    let mut out = f.open(Layout::Files);
    let e = f.event(Change::Updated, &old_id, &[("k", "new")]);
    assert_eq!(f.apply(&mut out, vec![e]), Vec::<String>::new());
    assert_eq!(read(&f, &old_id), "new");
    out.tick(None).unwrap();
    assert!(!f.path(&format!(".cmpoll/versions/{old_version}")).exists());
}

/// The concat layout's `NS.NAME{EXT}` cannot hold every valid name: the error says why.
#[test]
fn a_concat_name_too_long_for_a_file_says_so() {
    let mut f = Fixture::new();
    let mut out = f.open(Layout::Concat);
    let id = format!("ns/{}", "a".repeat(253));
    let e = f.event(Change::Added, &id, &[("k", "1")]);
    assert_eq!(f.apply(&mut out, vec![e]), vec![id.clone()]);
    let e = out.upkeep.places().concat_name(&id).unwrap_err();
    assert!(
        e.to_string()
            .contains("more than a file name may have (255)"),
        "{e}"
    );
}

/// The spool's shelf reads only what cmpoll wrote: through its own symlink, regular
/// files, never past the recorded length; concat has none.
#[test]
fn the_shelf_reads_back_only_what_cmpoll_wrote() {
    let mut f = Fixture::new();
    let mut out = f.open(Layout::Files);
    let e = f.event(Change::Added, "ns/m", &[("a.conf", "one")]);
    assert!(f.apply(&mut out, vec![e]).is_empty());
    let files = shelf_of(&f, Layout::Files);
    assert_eq!(files.read("ns/m", "a.conf", 3).unwrap(), b"one");
    assert!(
        files.read("ns/m", "a.conf", 2).is_err(),
        "longer than recorded"
    );
    assert!(files.read("ns/m", "../x", 10).is_err());
    assert!(files.read("ns/other", "a.conf", 10).is_err());
    // A symlink cmpoll did not make is not followed.
    fs::create_dir(f.path("elsewhere")).unwrap();
    fs::write(f.path("elsewhere/a.conf"), "one").unwrap();
    std::os::unix::fs::symlink("../elsewhere", f.path("ns/foreign")).unwrap();
    assert!(files.read("ns/foreign", "a.conf", 10).is_err());
    // Not a regular file (a FIFO would block a plain read).
    let fifo = f.path("fifo.conf");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let flat = shelf_of(&f, Layout::Flat);
    assert!(flat.read("ns/m", "fifo.conf", 10).is_err());
    fs::write(f.path("k.conf"), "flat").unwrap();
    assert_eq!(flat.read("ns/m", "k.conf", 4).unwrap(), b"flat");
    std::os::unix::fs::symlink("k.conf", f.path("link.conf")).unwrap();
    assert!(flat.read("ns/m", "link.conf", 10).is_err());
    assert!(shelf(&f.options(Layout::Concat), None).is_none());
}

/// Issue 29: at a start the record says what the folder holds, without reading it
/// back: only for the content it recorded; without proofs (a sink reads every module back
/// anyway) it does not say, and once the first batch is done it no longer does.
#[test]
fn the_record_proves_what_the_folder_holds_at_a_start() {
    for layout in [Layout::Files, Layout::Flat] {
        let mut f = Fixture::new();
        let mut out = f.open(layout);
        let m = f.event(
            Change::Added,
            "ns/m",
            &[("a.conf", "one"), ("b.conf", "two")],
        );
        let n = f.event(Change::Added, "ns/n", &[("c.conf", "three")]);
        assert!(f.apply(&mut out, vec![m.clone(), n]).is_empty());
        drop(out);
        let out = f.open(layout);
        let mut shelf = shelf(&f.options(layout), Some(out.proofs())).unwrap();
        let files = |pairs: &[(&str, &str)]| -> Vec<ModuleFile> {
            (pairs.iter())
                .map(|(k, v)| ModuleFile {
                    key: k.to_string(),
                    content: Content::Text(v.to_string()),
                })
                .collect()
        };
        let both = files(&[("a.conf", "one"), ("b.conf", "two")]);
        let hash = m.entry.hash;
        assert_eq!(shelf.holds("ns/m", &hash, &both), Some(true), "{layout:?}");
        let other = files(&[("a.conf", "uno"), ("b.conf", "two")]);
        let other_hash = Hash::of(other.iter().map(|f| (f.key.as_str(), f.content.bytes())));
        assert_eq!(
            shelf.holds("ns/m", &other_hash, &other),
            Some(false),
            "not what it recorded"
        );
        assert_eq!(
            shelf.holds("ns/x", &hash, &both),
            Some(false),
            "not recorded"
        );
        shelf.settled();
        assert_eq!(
            shelf.holds("ns/m", &hash, &both),
            None,
            "after the first batch"
        );
        let without = shelf_of(&f, layout);
        assert_eq!(without.holds("ns/m", &hash, &both), None);
    }
}

fn shelf_of(f: &Fixture, layout: Layout) -> Box<dyn crate::poll::spool::Shelf> {
    shelf(&f.options(layout), None).unwrap()
}

/// Issue 29.3: a batch says how far it is while it writes (readiness reads it), and says
/// nothing once it is done.
#[test]
fn a_batch_reports_how_far_it_is_and_stops_when_done() {
    let mut f = Fixture::new();
    let writing = crate::ops::health::Writing::default();
    let mut out = f.open(Layout::Files).with_progress(writing.clone());
    out.progress_every = Duration::ZERO;
    out.chunk = 2;
    let events: Vec<Ev> = (0..5)
        .map(|i| f.event(Change::Added, &format!("ns/m{i}"), &[("k", "v")]))
        .collect();
    writing.set(0, 1);
    assert!(f.apply(&mut out, events).is_empty());
    assert_eq!(writing.get(), None, "cleared when the batch is done");
    assert_eq!(fs::read_to_string(f.path("ns/m4/k")).unwrap(), "v");
}

/// Issue 29: a crash after a chunk was staged (and synced) but before any switch leaves
/// the folder as it was, in every layout: recovery removes what was staged, adopts none
/// of it, and the next batch writes the modules.
#[test]
fn a_crash_between_the_grouped_sync_and_the_switches_changes_nothing() {
    for layout in [Layout::Files, Layout::Concat, Layout::Flat] {
        let mut f = Fixture::new();
        let old = f.event(Change::Added, "ns/m", &[("a.conf", "old")]);
        let new = f.event(Change::Updated, "ns/m", &[("a.conf", "new")]);
        // In the flat layout, in folders (as a folder annotation makes them).
        let o = if layout == Layout::Flat {
            "team/sub/o.conf"
        } else {
            "o.conf"
        };
        let other = f.event(Change::Added, "ns/o", &[(o, "1")]);
        let before;
        {
            let mut out = f.open(layout);
            assert!(
                f.apply(&mut out, vec![old.clone()]).is_empty(),
                "{layout:?}"
            );
            before = tree(f.dir.path());
            let mut pending = Vec::new();
            for e in [&new, &other] {
                let files = f.spool.get(e.entry.loc).unwrap();
                pending.push((out.writer().plan(&e.id, &e.entry, &files).unwrap(), files));
            }
            out.upkeep.record_mut().pending = pending.iter().map(|(p, _)| p.clone()).collect();
            out.upkeep.save().unwrap();
            for (p, files) in &pending {
                out.writer().stage(p, files).unwrap();
            }
            atomic::sync_volume(f.dir.path()).unwrap();
            // The crash: nothing switched.
        }
        let mut out = f.open(layout);
        assert_eq!(
            tree(f.dir.path()),
            before,
            "{layout:?}: as before the batch"
        );
        assert!(out.upkeep.record().pending.is_empty());
        assert!(
            !out.upkeep.record().modules.contains_key("ns/o"),
            "{layout:?}"
        );
        assert!(
            !f.path("team").exists(),
            "the folders the staged write made go"
        );
        assert!(out.upkeep.record().namespaces.is_empty() || layout == Layout::Files);
        assert_eq!(
            out.upkeep.record().modules.get("ns/m").unwrap().hash,
            Some(old.entry.hash),
            "{layout:?}"
        );
        assert!(
            f.apply(&mut out, vec![new.clone(), other.clone()])
                .is_empty()
        );
        assert!(
            out.upkeep.record().modules.contains_key("ns/o"),
            "{layout:?}"
        );
        if layout == Layout::Flat {
            assert_eq!(fs::read_to_string(f.path(o)).unwrap(), "1");
            let gone = f.event(Change::Removed, "ns/o", &[]);
            assert!(f.apply(&mut out, vec![gone]).is_empty());
            assert!(!f.path("team").exists(), "removed with its last file");
        }
    }
}

/// Every path below `dir` but cmpoll's own folder, with a file's bytes or a link's target.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if rel == super::paths::META {
                continue;
            }
            let meta = fs::symlink_metadata(&path).unwrap();
            let what = if meta.is_symlink() {
                format!("-> {}", fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                todo.push(path.clone());
                "dir".to_string()
            } else {
                String::from_utf8_lossy(&fs::read(&path).unwrap()).into_owned()
            };
            out.insert(rel, what);
        }
    }
    out
}

/// A crash mid-batch leaves the chunks' writes in the journal, not in state.json: the
/// restart recovers them from there, and names made after the record was saved are not
/// made again.
#[test]
fn the_journal_is_recovered_and_its_names_are_not_reused() {
    let mut f = Fixture::new();
    let e = f.event(Change::Added, "ns/m", &[("a", "1")]);
    let files = f.spool.get(e.entry.loc).unwrap();
    let seq;
    {
        let mut out = f.open(Layout::Files);
        out.upkeep.record_mut().seq = 40;
        let p = out.writer().plan("ns/m", &e.entry, &files).unwrap();
        seq = out.upkeep.record().seq;
        out.upkeep.record_mut().pending = vec![p.clone()];
        out.upkeep.journal().unwrap();
        out.upkeep.record_mut().pending.clear();
        let staged = out.writer().stage(&p, &files).unwrap();
        out.writer().switch(&p, staged).unwrap();
        // The crash: state.json still says seq 0 and no modules.
    }
    assert!(f.path(".cmpoll/journal.jsonl").exists());
    let out = f.open(Layout::Files);
    assert!(
        out.upkeep.record().modules.contains_key("ns/m"),
        "adopted from the journal"
    );
    assert!(
        out.upkeep.record().seq >= seq,
        "{} < {seq}",
        out.upkeep.record().seq
    );
    assert!(
        !f.path(".cmpoll/journal.jsonl").exists(),
        "dropped once recorded"
    );
    assert_eq!(fs::read_to_string(f.path("ns/m/a")).unwrap(), "1");
}
