use super::*;
use crate::serve::held::Gather;
use crate::source::{Collect, Item, Resources};

/// ConfigMap `ns/NAME` at `rv`, its key `k` holding `value`, as the apiserver lists it.
fn item(name: &str, rv: u64, value: &str) -> Item {
    item_of(name, &format!("u-{name}"), rv, value)
}

/// `item`, with uid `uid`.
fn item_of(name: &str, uid: &str, rv: u64, value: &str) -> Item {
    let json = serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid,
            "resourceVersion": rv.to_string(), "labels": {"app": "x"}},
        "data": {"k": value}
    })
    .to_string();
    let (_, _, item) = read_object(
        json.as_bytes(),
        &KeyFilter::all(),
        Resource::ConfigMaps,
        None,
        true,
    )
    .unwrap();
    item
}

/// The poll numbered `n`, listed at `rv`, after `prev` (as listed).
fn poll(prev: &Held, n: u64, rv: u64, items: Vec<Item>) -> Held {
    let mut g = Gather::new(prev);
    for i in items {
        g.item(i).unwrap();
    }
    g.listed(Resource::ConfigMaps, None, &rv.to_string());
    g.finish(n).unwrap()
}

/// A validator that refuses a `k` holding `bad`, and counts its runs in `count`; it
/// cannot run (exit 127) while a file `count.broken` is there.
fn judge(count: &Path, state: Option<&Path>) -> Validated {
    let opts = validate::Options {
        command: format!(
            "test -e '{c}.broken' && exit 127; echo run >> '{c}'; if grep -q bad k; then echo \"bad in $CMPOLL_MODULE\"; exit 3; fi",
            c = count.display()
        ),
        timeout: std::time::Duration::from_secs(10),
        jobs: 2,
        meta_dir: None,
        ext: String::new(),
        template: None,
        kinds: Resources::one(Resource::ConfigMaps),
        confirm: None,
        out_dir: None,
    };
    Validated::open(opts, state).unwrap()
}

/// `v.judge`, again until every version it sent to its threads is judged: the last
/// poll's served view, with the runs of every turn.
fn settle(v: &mut Validated, up: &Held, prev: &Held) -> (Held, Judgement) {
    let mut runs = Vec::new();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (served, mut j) = v.judge(up, prev);
        runs.append(&mut j.runs);
        // A validator that cannot run is asked again at every turn: done once it said so.
        if j.pending == 0 || (j.cannot.is_some() && !runs.is_empty()) {
            runs.sort_unstable();
            j.runs = runs;
            return (served, j);
        }
        assert!(std::time::Instant::now() < until, "still judging");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn runs(count: &Path) -> usize {
    std::fs::read_to_string(count).map_or(0, |s| s.lines().count())
}

fn annotation(o: &HeldObject) -> Option<String> {
    let meta: serde_json::Value = serde_json::from_slice(o.raw.metadata()).unwrap();
    meta["annotations"][annotation::HELD_BACK]
        .as_str()
        .map(str::to_string)
}

fn empty() -> Held {
    Held::empty(Resources::one(Resource::ConfigMaps))
}

#[test]
fn a_refused_version_is_held_back_at_the_last_good_one_and_judged_once() {
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    let mut v = judge(&count, None);
    let cm = Resource::ConfigMaps;
    // Poll 1: a good and a never-good object.
    let up1 = poll(
        &empty(),
        1,
        10,
        vec![item("a", 5, "good"), item("b", 6, "bad")],
    );
    let (s1, j1) = settle(&mut v, &up1, &empty());
    assert_eq!(runs(&count), 2);
    assert_eq!(j1.runs, ["fail", "pass"]);
    assert_eq!(j1.held_back, 1);
    assert_eq!(s1.get(cm, "ns", "a").unwrap().resource_version, "5");
    assert!(s1.get(cm, "ns", "b").is_none(), "never good: not served");
    assert!(annotation(s1.get(cm, "ns", "a").unwrap()).is_none());
    // Poll 2: `a` refused at 11: its version 5 is served, annotated, same version.
    let bad_a = item("a", 11, "bad");
    let up2 = poll(&up1, 2, 11, vec![bad_a, item("b", 6, "bad")]);
    let (s2, j2) = settle(&mut v, &up2, &s1);
    assert_eq!(runs(&count), 3, "only the new version was validated");
    assert_eq!(j2.runs, ["fail"]);
    let a = s2.get(cm, "ns", "a").unwrap();
    assert_eq!(a.resource_version, "5");
    let refused = up2.get(cm, "ns", "a").unwrap().hash;
    assert_eq!(annotation(a), Some(refused.to_string()));
    assert_eq!(
        a.hash,
        s1.get(cm, "ns", "a").unwrap().hash,
        "data unchanged"
    );
    // What a watcher would be told: nothing changed in the scope.
    assert_eq!(s2.scopes[0].changed, s1.scopes[0].changed);
    // Poll 3: the same again: no run, the same annotated object.
    let up3 = poll(&up2, 3, 12, vec![item("a", 11, "bad"), item("b", 6, "bad")]);
    let (s3, j3) = settle(&mut v, &up3, &s2);
    assert_eq!(runs(&count), 3);
    assert!(j3.runs.is_empty());
    assert!(Arc::ptr_eq(
        s3.get(cm, "ns", "a").unwrap(),
        s2.get(cm, "ns", "a").unwrap()
    ));
    // Poll 4: a good version of each: served, a change.
    let up4 = poll(
        &up3,
        4,
        20,
        vec![item("a", 19, "fine"), item("b", 20, "ok")],
    );
    let (s4, j4) = settle(&mut v, &up4, &s3);
    assert_eq!(j4.runs, ["pass", "pass"]);
    assert_eq!(j4.held_back, 0);
    assert_eq!(s4.get(cm, "ns", "a").unwrap().resource_version, "19");
    assert!(annotation(s4.get(cm, "ns", "a").unwrap()).is_none());
    assert_eq!(s4.get(cm, "ns", "b").unwrap().resource_version, "20");
    assert_eq!(s4.scopes[0].changed, 20);
    // Poll 5: a label edit of a good version (a new resourceVersion, the same hash): served
    // without a run.
    let up5 = poll(
        &up4,
        5,
        21,
        vec![item("a", 21, "fine"), item("b", 20, "ok")],
    );
    let (s5, j5) = settle(&mut v, &up5, &s4);
    assert!(j5.runs.is_empty());
    assert_eq!(s5.get(cm, "ns", "a").unwrap().resource_version, "21");
}

#[test]
fn a_restarted_hub_serves_the_last_good_version_without_judging_again() {
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    let state = dir.path().join("state");
    let cm = Resource::ConfigMaps;
    let up1 = poll(
        &empty(),
        1,
        10,
        vec![item("a", 5, "good"), item("c", 7, "fine")],
    );
    let up2 = poll(
        &up1,
        2,
        11,
        vec![item("a", 11, "bad"), item("c", 7, "fine")],
    );
    {
        let mut v = judge(&count, Some(&state));
        let (s1, _) = settle(&mut v, &up1, &empty());
        v.keep_good();
        settle(&mut v, &up2, &s1);
        v.keep_good();
    }
    assert_eq!(runs(&count), 3);
    // A new hub: its first poll lists the refused version of `a`, and a version of `c`
    // written while no hub ran, which it refuses: both served at their good versions.
    let mut v = judge(&count, Some(&state));
    let first = poll(
        &empty(),
        1,
        12,
        vec![item("a", 11, "bad"), item("c", 12, "bad too")],
    );
    let (s, j) = settle(&mut v, &first, &empty());
    assert_eq!(j.runs, ["fail"], "only c's new version judged");
    assert_eq!(runs(&count), 4);
    let a = s.get(cm, "ns", "a").unwrap();
    assert_eq!(a.resource_version, "5");
    // Its JSON as the apiserver served it then, with the annotation only.
    let then = up1.get(cm, "ns", "a").unwrap();
    let refused = up2.get(cm, "ns", "a").unwrap().hash.to_string();
    let expected = annotation::held_back(&then.raw, &refused).unwrap();
    assert_eq!(a.raw, expected);
    let c = s.get(cm, "ns", "c").unwrap();
    assert_eq!(c.resource_version, "7");
    assert!(annotation(c).is_some());
    // An object gone takes its file with it.
    let gone = poll(&first, 2, 13, vec![item("a", 11, "bad")]);
    settle(&mut v, &gone, &s);
    assert!(!state.join("objects/configmap.ns.c.json").exists());
    // A state file whose good version is another object's is not used (said at start):
    // the object it was kept for is not served while its newest is refused.
    let file = state.join("objects/configmap.ns.a.json");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("\"name\":\"a\"", "\"name\":\"z\"")).unwrap();
    drop(v);
    let mut v = judge(&count, Some(&state));
    let (s, _) = settle(&mut v, &first, &empty());
    assert!(s.get(cm, "ns", "a").is_none());
}

#[test]
fn a_validator_that_cannot_run_judges_nothing_until_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    let broken = dir.path().join("count.broken");
    let mut v = judge(&count, None);
    let up1 = poll(&empty(), 1, 10, vec![item("a", 5, "good")]);
    let (s1, _) = settle(&mut v, &up1, &empty());
    std::fs::write(&broken, "").unwrap();
    let up2 = poll(&up1, 2, 11, vec![item("a", 11, "new")]);
    let (s2, j2) = settle(&mut v, &up2, &s1);
    assert_eq!(j2.runs, ["error"]);
    assert!(j2.cannot.is_some());
    let a = s2.get(Resource::ConfigMaps, "ns", "a").unwrap();
    assert_eq!(a.resource_version, "5", "held back until it can run");
    assert!(annotation(a).is_none(), "not refused: not said to be");
    // Not remembered: tried again at the next poll.
    let up3 = poll(&up2, 3, 12, vec![item("a", 11, "new")]);
    let (_, j3) = settle(&mut v, &up3, &s2);
    assert_eq!(j3.runs, ["error"]);
    // Back to the good content: nothing left it could not judge, nothing said.
    let back = poll(&up3, 4, 13, vec![item("a", 13, "good")]);
    let (sb, jb) = settle(&mut v, &back, &s2);
    // (A retry already sent may still come back: a run, but nothing it could not judge.)
    assert!(
        jb.runs.iter().all(|r| *r == "error") && jb.cannot.is_none(),
        "{jb:?}"
    );
    assert_eq!(
        sb.get(Resource::ConfigMaps, "ns", "a")
            .unwrap()
            .resource_version,
        "13"
    );
    // It runs again: the new version is judged and served.
    std::fs::remove_file(&broken).unwrap();
    let up5 = poll(&back, 5, 14, vec![item("a", 14, "newer")]);
    let (s5, j5) = settle(&mut v, &up5, &sb);
    assert_eq!(
        (j5.runs.as_slice(), j5.cannot.is_none()),
        (&["pass"][..], true)
    );
    assert_eq!(
        s5.get(Resource::ConfigMaps, "ns", "a")
            .unwrap()
            .resource_version,
        "14"
    );
    // An object gone is forgotten.
    let up6 = poll(&up5, 6, 15, vec![]);
    let (s6, _) = settle(&mut v, &up6, &s5);
    assert_eq!(s6.len(), 0);
    assert!(v.objects.is_empty());
}

/// A slow validator never holds up a poll: what it has not judged yet is held back (the
/// good version, unannotated; a new object not served), and taken at a later turn.
#[test]
fn the_poll_never_waits_for_the_validator() {
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow");
    std::fs::write(&slow, "").unwrap();
    let o = validate::Options {
        command: format!("while test -e '{}'; do sleep 0.05; done", slow.display()),
        timeout: std::time::Duration::from_secs(20),
        jobs: 1,
        meta_dir: None,
        ext: String::new(),
        template: None,
        kinds: Resources::one(Resource::ConfigMaps),
        confirm: None,
        out_dir: None,
    };
    let mut v = Validated::open(o, None).unwrap();
    let cm = Resource::ConfigMaps;
    let up1 = poll(&empty(), 1, 10, vec![item("a", 5, "x")]);
    let t = std::time::Instant::now();
    let (s1, j1) = v.judge(&up1, &empty());
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(j1.pending, 1);
    assert!(
        s1.get(cm, "ns", "a").is_none(),
        "not judged yet: not served"
    );
    std::fs::remove_file(&slow).unwrap();
    let (s2, _) = settle(&mut v, &up1, &s1);
    assert_eq!(s2.get(cm, "ns", "a").unwrap().resource_version, "5");
    std::fs::write(&slow, "").unwrap();
    let up2 = poll(&up1, 2, 11, vec![item("a", 11, "y")]);
    let (s3, j3) = v.judge(&up2, &s2);
    assert_eq!((j3.pending, j3.held_back), (1, 1));
    let a = s3.get(cm, "ns", "a").unwrap();
    assert_eq!(a.resource_version, "5");
    assert!(annotation(a).is_none());
    std::fs::remove_file(&slow).unwrap();
    let (s4, _) = settle(&mut v, &up2, &s3);
    assert_eq!(s4.get(cm, "ns", "a").unwrap().resource_version, "11");
}

/// A verdict on an object deleted (and made again, another uid) while it was judged is not
/// the new object's: it is judged itself, and nothing of the old one is served for it.
#[test]
fn a_verdict_on_an_object_made_again_is_not_its() {
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow");
    std::fs::write(&slow, "").unwrap();
    let o = validate::Options {
        command: format!(
            "while test -e '{}'; do sleep 0.05; done; if grep -q bad k; then exit 3; fi",
            slow.display()
        ),
        timeout: std::time::Duration::from_secs(20),
        jobs: 1,
        meta_dir: None,
        ext: String::new(),
        template: None,
        kinds: Resources::one(Resource::ConfigMaps),
        confirm: None,
        out_dir: None,
    };
    let mut v = Validated::open(o, None).unwrap();
    let cm = Resource::ConfigMaps;
    let up1 = poll(
        &empty(),
        1,
        10,
        vec![item_of("a", "first", 5, "old secret")],
    );
    let (s1, j1) = v.judge(&up1, &empty());
    assert_eq!(j1.pending, 1);
    // Deleted and made again with content it refuses, before the first verdict.
    let up2 = poll(&up1, 2, 11, vec![item_of("a", "second", 11, "bad")]);
    std::fs::remove_file(&slow).unwrap();
    let (s2, _) = settle(&mut v, &up2, &s1);
    assert!(
        s2.get(cm, "ns", "a").is_none(),
        "the old object's version is not served for the new one"
    );
}

/// While a version is judged, the versions of the scopes that hold it stay below it (a
/// watcher told past it would never take it, published later at its own version); the
/// other scopes, and a version that cannot be judged, hold nothing back.
#[test]
fn a_version_judged_keeps_its_scopes_versions_below_it() {
    use crate::serve::testing::{item, kinds, poll};
    let scopes = [(Some("a"), 120), (Some("b"), 130)];
    let items = vec![item("a", "x", 115, &[]), item("b", "y", 125, &[])];
    let mut served = poll(&Held::empty(kinds()), 1, &scopes, items);
    let cm = crate::source::Resource::ConfigMaps;
    let before = served.scopes.clone();
    awaiting(&mut served, &Held::empty(kinds()), &[(cm, "a".into(), 115)]);
    let got: Vec<(u64, u64)> = (served.scopes.iter())
        .map(|s| (s.listed, s.changed))
        .collect();
    assert_eq!(got, [(114, 114), (130, 130)]);
    assert_eq!(served.versions(cm, None).unwrap().listed, 114);
    // Never below what was published already.
    let published = poll(&Held::empty(kinds()), 1, &[(Some("a"), 117)], Vec::new());
    served.scopes = before;
    awaiting(&mut served, &published, &[(cm, "a".into(), 115)]);
    assert_eq!(
        (served.scopes[0].listed, served.scopes[0].changed),
        (117, 117)
    );
}
