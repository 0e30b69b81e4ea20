use super::*;
use crate::serve::held::Gather;
use crate::source::{Collect, Item, Resources};

/// ConfigMap `ns/NAME` at `rv`, its key `k` holding `value`, as the apiserver lists it.
fn item(name: &str, rv: u64, value: &str) -> Item {
    let json = serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
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

/// A validator that refuses a `k` holding `bad`, and counts its runs in `count`.
fn judge(count: &Path, state: Option<&Path>) -> Validated {
    let opts = validate::Options {
        command: format!(
            "echo run >> '{}'; if grep -q bad k; then echo \"bad in $CMPOLL_MODULE\"; exit 3; fi",
            count.display()
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
    let (s1, j1) = v.judge(&up1, &empty());
    assert_eq!(runs(&count), 2);
    assert_eq!(j1.runs, ["pass", "fail"]);
    assert_eq!(j1.held_back, 1);
    assert_eq!(s1.get(cm, "ns", "a").unwrap().resource_version, "5");
    assert!(s1.get(cm, "ns", "b").is_none(), "never good: not served");
    assert!(annotation(s1.get(cm, "ns", "a").unwrap()).is_none());
    // Poll 2: `a` refused at 11: its version 5 is served, annotated, same version.
    let bad_a = item("a", 11, "bad");
    let up2 = poll(&up1, 2, 11, vec![bad_a, item("b", 6, "bad")]);
    let (s2, j2) = v.judge(&up2, &s1);
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
    let (s3, j3) = v.judge(&up3, &s2);
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
    let (s4, j4) = v.judge(&up4, &s3);
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
    let (s5, j5) = v.judge(&up5, &s4);
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
        let (s1, _) = v.judge(&up1, &empty());
        v.keep_good();
        v.judge(&up2, &s1);
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
    let (s, j) = v.judge(&first, &empty());
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
    v.judge(&gone, &s);
    assert!(!state.join("objects/configmap.ns.c.json").exists());
    // A state file whose good version is another object's is refused at start.
    let file = state.join("objects/configmap.ns.a.json");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("\"name\":\"a\"", "\"name\":\"z\"")).unwrap();
    let opts = v.opts.clone();
    let e = Validated::open(opts, Some(&state)).err().unwrap();
    assert!(
        e.contains("configmap/ns/a: its good version is another object"),
        "{e}"
    );
}

#[test]
fn a_validator_that_cannot_run_judges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    let mut v = judge(&count, None);
    let up1 = poll(&empty(), 1, 10, vec![item("a", 5, "good")]);
    let (s1, _) = v.judge(&up1, &empty());
    v.opts.command = "exit 127".into();
    let up2 = poll(&up1, 2, 11, vec![item("a", 11, "new")]);
    let (s2, j2) = v.judge(&up2, &s1);
    assert_eq!(j2.runs, ["error"]);
    assert!(matches!(j2.runnable, Runnable::Cannot(_)));
    let a = s2.get(Resource::ConfigMaps, "ns", "a").unwrap();
    assert_eq!(a.resource_version, "5", "held back until it can run");
    // Not remembered: tried again at the next poll.
    let up3 = poll(&up2, 3, 12, vec![item("a", 11, "new")]);
    let (_, j3) = v.judge(&up3, &s2);
    assert_eq!(j3.runs, ["error"]);
    // An object gone is forgotten; back with the same content, it is judged again.
    v.opts = judge(&count, None).opts;
    let up4 = poll(&up3, 4, 13, vec![]);
    let (s4, _) = v.judge(&up4, &s2);
    assert_eq!(s4.len(), 0);
    assert!(v.objects.is_empty());
}
