//! Unit tests of one poll with sources that deliver fixed pages, fail, start a scope over,
//! and consult the previous poll as the apiserver source does.

use std::sync::{Arc, Mutex};

use super::*;
use crate::source::{Content, ModuleFile};

/// A source that delivers fixed pages and can fail or start its scope over. With
/// `ask_previous`, it asks `Previous` for each item first, as the apiserver source does,
/// and records the answers.
struct Pages {
    pages: Vec<Vec<Item>>,
    fail_at: Option<usize>,
    restart_after: Option<usize>,
    ask_previous: Option<Arc<Mutex<Vec<bool>>>>,
}

impl Source for Pages {
    fn list(&mut self, prev: &dyn Previous, out: &mut dyn Collect) -> Result<(), Error> {
        let scope = out.mark();
        for (i, page) in self.pages.iter().enumerate() {
            if self.fail_at == Some(i) {
                return Err(Error::Manifests("page failed".into()));
            }
            if self.restart_after == Some(i) {
                out.rewind(scope)?;
            }
            for item in page {
                if let Some(answers) = &self.ask_previous {
                    let has = prev.has(&item.id(), &item.resource_version);
                    answers.lock().unwrap().push(has);
                    if has {
                        out.unchanged(&item.id());
                        continue;
                    }
                }
                out.item(item.clone())?;
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "pages".into()
    }
}

fn item(name: &str, v: &str) -> Item {
    Item {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: "1".into(),
        files: vec![ModuleFile {
            key: "k".into(),
            content: Content::Text(v.into()),
        }],
        ..Item::default()
    }
}

fn poller(pages: Vec<Vec<Item>>, fail_at: Option<usize>, restart_after: Option<usize>) -> Poller {
    Poller::new(Box::new(Pages {
        pages,
        fail_at,
        restart_after,
        ask_previous: None,
    }))
}

#[test]
fn failed_page_changes_nothing() {
    let mut spool = Spool::memory();
    let mut p = poller(
        vec![vec![item("a", "1")], vec![item("b", "2")]],
        Some(1),
        None,
    );
    let err = p.poll(&Snapshot::default(), &mut spool).unwrap_err();
    assert_eq!(err.to_string(), "--manifests: page failed");
    assert_eq!(spool.len(), 0, "the first page's contents were dropped");
}

#[test]
fn unchanged_modules_keep_their_spooled_contents() {
    let mut spool = Spool::memory();
    let mut p = poller(vec![vec![item("a", "1"), item("b", "2")]], None, None);
    let first = p.poll(&Snapshot::default(), &mut spool).unwrap();
    assert_eq!(first.stats.modules, 2);
    let after_first = spool.len();
    let second = p.poll(&first.snapshot, &mut spool).unwrap();
    assert_eq!(spool.len(), after_first, "nothing new was spooled");
    assert_eq!(first.snapshot, second.snapshot);
    assert_eq!(
        spool.get(second.snapshot.modules["ns/b"].loc).unwrap()[0].content,
        Content::Text("2".into())
    );
}

#[test]
fn a_configmap_listed_twice_keeps_the_last() {
    let mut spool = Spool::memory();
    let mut p = poller(
        vec![vec![item("b", "x"), item("a", "first"), item("a", "last")]],
        None,
        None,
    );
    let snap = p.poll(&Snapshot::default(), &mut spool).unwrap().snapshot;
    assert_eq!(snap.modules.keys().collect::<Vec<_>>(), ["ns/a", "ns/b"]);
    let files = spool.get(snap.modules["ns/a"].loc).unwrap();
    assert_eq!(files[0].content, Content::Text("last".into()));

    // Large enough for the sort's own algorithm (not its small-input path): 300 ids, each
    // listed three times out of order; the last listing of each wins.
    let mut items = Vec::new();
    for round in 0..3 {
        for i in 0..300 {
            let id = (i * 7 + round * 13) % 300;
            items.push(item(&format!("m{id:03}"), &format!("v{round}")));
        }
    }
    let mut p = poller(vec![items], None, None);
    let snap = p.poll(&Snapshot::default(), &mut spool).unwrap().snapshot;
    assert_eq!(snap.len(), 300);
    for (id, e) in snap.modules.iter() {
        let files = spool.get(e.loc).unwrap();
        assert_eq!(files[0].content, Content::Text("v2".into()), "{id}");
    }
}

#[test]
fn a_restarted_scope_forgets_what_it_delivered() {
    let mut spool = Spool::memory();
    let mut p = poller(
        vec![
            vec![item("a", "old")],
            vec![item("a", "new"), item("b", "2")],
        ],
        None,
        Some(1),
    );
    let polled = p.poll(&Snapshot::default(), &mut spool).unwrap();
    assert_eq!(polled.snapshot.len(), 2);
    assert_eq!(polled.stats.items, 2, "the forgotten page is not counted");
    let files = spool.get(polled.snapshot.modules["ns/a"].loc).unwrap();
    assert_eq!(files[0].content, Content::Text("new".into()));
}

#[test]
fn rejected_and_keyless_items_are_not_modules() {
    let mut spool = Spool::memory();
    let mut bad = item("bad", "x");
    bad.files[0].key = "../x".into();
    let mut keyless = item("keyless", "x");
    keyless.files.clear();
    let mut p = poller(vec![vec![bad, keyless, item("ok", "1")]], None, None);
    let polled = p.poll(&Snapshot::default(), &mut spool).unwrap();
    assert_eq!(
        polled.snapshot.modules.keys().collect::<Vec<_>>(),
        ["ns/ok"]
    );
    let s = polled.stats;
    assert_eq!((s.invalid, s.without_keys, s.items), (1, 1, 3));
}

#[test]
fn previous_means_the_last_poll_had_it_at_that_version() {
    let mut spool = Spool::memory();
    let mut keyless = item("keyless", "x");
    keyless.files.clear();
    let mut bad = item("bad", "x");
    bad.files[0].key = "../x".into();
    let answers = Arc::new(Mutex::new(Vec::new()));
    let items = vec![item("a", "1"), keyless, bad];
    let source = |items: Vec<Item>| Pages {
        pages: vec![items],
        fail_at: None,
        restart_after: None,
        ask_previous: Some(answers.clone()),
    };
    let mut p = Poller::new(Box::new(source(items.clone())));
    let first = p.poll(&Snapshot::default(), &mut spool).unwrap();
    assert_eq!(*answers.lock().unwrap(), [false, false, false]);
    answers.lock().unwrap().clear();
    let second = p.poll(&first.snapshot, &mut spool).unwrap();
    assert_eq!(*answers.lock().unwrap(), [true, true, true]);
    assert_eq!(
        (first.snapshot, first.stats),
        (second.snapshot.clone(), second.stats),
        "unchanged items keep the same entries and counts"
    );
    // A new resourceVersion is not what the last poll had.
    let mut changed = items;
    changed[0].resource_version = "2".into();
    answers.lock().unwrap().clear();
    let mut p2 = Poller::new(Box::new(source(changed)));
    p2.poll(&second.snapshot, &mut spool).unwrap();
    assert!(!answers.lock().unwrap()[0]);
}
