//! One complete poll: every item of every namespace and page becomes a module (or is
//! skipped with a reason) and the result is a new snapshot, or an error and nothing else.
//!
//! Items stream from the source one at a time. A module whose hash equals the previous
//! snapshot's keeps its spooled contents; a new or changed one is appended to the spool.
//! If the poll fails anywhere, what it appended is truncated away and the caller keeps its
//! previous snapshot: a failed poll changes nothing.

use std::collections::HashMap;

use crate::kube;
use crate::module::{Item, Module, NotAModule};
use crate::snapshot::{Entry, Ident, Snapshot};
use crate::source::{Mark, Source, Visit};
use crate::spool::Spool;

/// Counts of one poll, for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollStats {
    pub items: usize,
    pub modules: usize,
    pub rejected: usize,
    pub without_keys: usize,
}

pub struct Poller {
    source: Box<dyn Source>,
    /// ConfigMaps that are not modules (`id` → the resourceVersion seen): said once per
    /// version, not once per poll, and (metadata-first) not fetched again until they change.
    noted: HashMap<String, Noted>,
}

/// What is remembered of a ConfigMap that is not a module.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Noted {
    resource_version: String,
    rejected: bool,
}

impl Poller {
    pub fn new(source: Box<dyn Source>) -> Poller {
        Poller {
            source,
            noted: HashMap::new(),
        }
    }

    pub fn describe(&self) -> String {
        self.source.describe()
    }

    /// The source's running request totals (see `Source::counters`).
    pub fn counters(&self) -> (std::collections::BTreeMap<String, u64>, u64) {
        self.source.counters()
    }

    /// Polls once; on success the new snapshot, whose new contents are in `spool`.
    pub fn poll(
        &mut self,
        prev: &Snapshot,
        spool: &mut Spool,
    ) -> Result<(Snapshot, PollStats), kube::Error> {
        let start = spool.len();
        let mut collector = Collector {
            prev,
            spool,
            // About as many as last time: no doubling past the cluster's size.
            entries: Vec::with_capacity(prev.modules.len()),
            noted: &mut self.noted,
            not_modules: Vec::new(),
            stats: PollStats::default(),
        };
        let result = self.source.list(&mut collector);
        let Collector {
            entries,
            stats,
            not_modules,
            ..
        } = collector;
        if let Err(e) = result {
            spool
                .truncate(start)
                .map_err(|io| kube::Error::Local(format!("spool: {io}")))?;
            return Err(e);
        }
        // Forget ConfigMaps that are gone, so the memory follows the cluster.
        let still: std::collections::HashSet<String> = not_modules.into_iter().collect();
        self.noted.retain(|id, _| still.contains(id));
        Ok((snapshot(entries), stats))
    }
}

/// The snapshot of a poll's entries, built in one pass: sorted (stably, so the last of
/// two entries for one ConfigMap wins) and bulk-loaded, which packs the map's nodes full
/// instead of leaving them half-empty as one-by-one inserts in key order do.
fn snapshot(mut entries: Vec<(String, Entry)>) -> Snapshot {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for pair in entries.windows(2) {
        if pair[0].0 == pair[1].0 {
            log::warn!(
                "configmap {} was listed twice; using the last one",
                pair[0].0
            );
        }
    }
    Snapshot {
        modules: entries.into_iter().collect(),
    }
}

struct Collector<'a> {
    prev: &'a Snapshot,
    spool: &'a mut Spool,
    entries: Vec<(String, Entry)>,
    noted: &'a mut HashMap<String, Noted>,
    /// The ids of this poll's ConfigMaps that are not modules.
    not_modules: Vec<String>,
    stats: PollStats,
}

impl Collector<'_> {
    /// Logs about a ConfigMap once per resourceVersion.
    fn note(&mut self, id: &str, rv: &str, rejected: bool, log: impl FnOnce()) {
        self.not_modules.push(id.to_string());
        if self
            .noted
            .get(id)
            .is_none_or(|seen| seen.resource_version != rv)
        {
            let noted = Noted {
                resource_version: rv.to_string(),
                rejected,
            };
            self.noted.insert(id.to_string(), noted);
            log();
        }
    }
}

impl Visit for Collector<'_> {
    fn item(&mut self, item: Item) -> Result<(), kube::Error> {
        self.stats.items += 1;
        let (id, rv, keys_seen) = (item.id(), item.resource_version.clone(), item.keys_seen);
        let module = match Module::from_item(item) {
            Ok(m) => m,
            Err(NotAModule::NoMatchingKey) => {
                self.stats.without_keys += 1;
                self.note(&id, &rv, false, || {
                    log::info!(
                        "configmap {id}: none of its {keys_seen} keys matches --keys; not a module"
                    )
                });
                return Ok(());
            }
            Err(NotAModule::Rejected(why)) => {
                self.stats.rejected += 1;
                self.note(&id, &rv, true, || {
                    log::warn!("configmap {id} rejected: {why}")
                });
                return Ok(());
            }
        };
        self.stats.modules += 1;
        let loc = match self.prev.modules.get(&id) {
            Some(old) if old.hash == module.hash => old.loc,
            _ => self
                .spool
                .put(&module.files)
                .map_err(|e| kube::Error::Local(format!("spool: {e}")))?,
        };
        self.entries.push((
            id,
            Entry {
                uid: Ident::new(&module.uid),
                resource_version: Ident::new(&module.resource_version),
                hash: module.hash,
                loc,
                files: module.files.len() as u32,
                bytes: module.bytes(),
            },
        ));
        Ok(())
    }

    fn mark(&mut self) -> Mark {
        Mark {
            entries: self.entries.len(),
            spool: self.spool.len(),
            not_modules: self.not_modules.len(),
            stats: self.stats,
        }
    }

    fn rollback(&mut self, to: Mark) -> Result<(), kube::Error> {
        self.entries.truncate(to.entries);
        self.not_modules.truncate(to.not_modules);
        self.stats = to.stats;
        self.spool
            .truncate(to.spool)
            .map_err(|e| kube::Error::Local(format!("spool: {e}")))
    }

    fn known(&self, id: &str, resource_version: &str) -> bool {
        self.prev
            .modules
            .get(id)
            .is_some_and(|old| old.resource_version == resource_version)
            || self
                .noted
                .get(id)
                .is_some_and(|n| n.resource_version == resource_version)
    }

    fn reuse(&mut self, id: &str, resource_version: &str) -> bool {
        if let Some(old) = self.prev.modules.get(id)
            && old.resource_version == resource_version
        {
            self.stats.items += 1;
            self.stats.modules += 1;
            self.entries.push((id.to_string(), old.clone()));
            return true;
        }
        if let Some(n) = self
            .noted
            .get(id)
            .filter(|n| n.resource_version == resource_version)
        {
            self.stats.items += 1;
            if n.rejected {
                self.stats.rejected += 1;
            } else {
                self.stats.without_keys += 1;
            }
            self.not_modules.push(id.to_string());
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::{Content, File};

    /// A source that delivers fixed pages and can fail or restart.
    struct Pages {
        pages: Vec<Vec<Item>>,
        fail_at: Option<usize>,
        restart_after: Option<usize>,
    }

    impl Source for Pages {
        fn list(&mut self, visit: &mut dyn Visit) -> Result<(), kube::Error> {
            let start = visit.mark();
            for (i, page) in self.pages.iter().enumerate() {
                if self.fail_at == Some(i) {
                    return Err(kube::Error::Local("page failed".into()));
                }
                if self.restart_after == Some(i) {
                    visit.rollback(start)?;
                }
                for item in page {
                    visit.item(item.clone())?;
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
            files: vec![File {
                key: "k".into(),
                content: Content::Text(v.into()),
            }],
            ..Item::default()
        }
    }

    fn poller(
        pages: Vec<Vec<Item>>,
        fail_at: Option<usize>,
        restart_after: Option<usize>,
    ) -> Poller {
        Poller::new(Box::new(Pages {
            pages,
            fail_at,
            restart_after,
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
        assert_eq!(err.to_string(), "page failed");
        assert_eq!(spool.len(), 0, "the first page's contents were dropped");
    }

    #[test]
    fn unchanged_modules_keep_their_spooled_contents() {
        let mut spool = Spool::memory();
        let mut p = poller(vec![vec![item("a", "1"), item("b", "2")]], None, None);
        let (first, stats) = p.poll(&Snapshot::default(), &mut spool).unwrap();
        assert_eq!(stats.modules, 2);
        let after_first = spool.len();
        let (second, _) = p.poll(&first, &mut spool).unwrap();
        assert_eq!(spool.len(), after_first, "nothing new was spooled");
        assert_eq!(first, second);
        assert_eq!(
            spool.get(second.modules["ns/b"].loc).unwrap()[0].content,
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
        let (snap, _) = p.poll(&Snapshot::default(), &mut spool).unwrap();
        assert_eq!(snap.modules.keys().collect::<Vec<_>>(), ["ns/a", "ns/b"]);
        let files = spool.get(snap.modules["ns/a"].loc).unwrap();
        assert_eq!(files[0].content, Content::Text("last".into()));
    }

    #[test]
    fn rollback_forgets_a_restarted_listing() {
        let mut spool = Spool::memory();
        let mut p = poller(
            vec![
                vec![item("a", "old")],
                vec![item("a", "new"), item("b", "2")],
            ],
            None,
            Some(1),
        );
        let (snap, stats) = p.poll(&Snapshot::default(), &mut spool).unwrap();
        assert_eq!(snap.len(), 2);
        assert_eq!(stats.items, 2, "the forgotten page is not counted");
        let files = spool.get(snap.modules["ns/a"].loc).unwrap();
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
        let (snap, stats) = p.poll(&Snapshot::default(), &mut spool).unwrap();
        assert_eq!(snap.modules.keys().collect::<Vec<_>>(), ["ns/ok"]);
        assert_eq!((stats.rejected, stats.without_keys, stats.items), (1, 1, 3));
    }

    /// Asks `known` for each item, as the apiserver source does before reading contents,
    /// and records the answers.
    struct Asks {
        items: Vec<Item>,
        answers: std::sync::Arc<std::sync::Mutex<Vec<bool>>>,
    }

    impl Source for Asks {
        fn list(&mut self, visit: &mut dyn Visit) -> Result<(), kube::Error> {
            let mut answers = self.answers.lock().unwrap();
            answers.clear();
            for it in &self.items {
                let known = visit.known(&it.id(), &it.resource_version);
                answers.push(known);
                if known {
                    assert!(visit.reuse(&it.id(), &it.resource_version));
                } else {
                    visit.item(it.clone())?;
                }
            }
            Ok(())
        }

        fn describe(&self) -> String {
            "asks".into()
        }
    }

    #[test]
    fn known_means_the_last_poll_has_it_at_that_version() {
        let mut spool = Spool::memory();
        let mut keyless = item("keyless", "x");
        keyless.files.clear();
        let mut bad = item("bad", "x");
        bad.files[0].key = "../x".into();
        let answers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let items = vec![item("a", "1"), keyless, bad];
        let mut p = Poller::new(Box::new(Asks {
            items: items.clone(),
            answers: answers.clone(),
        }));
        let (first, stats1) = p.poll(&Snapshot::default(), &mut spool).unwrap();
        assert_eq!(*answers.lock().unwrap(), [false, false, false]);
        let (second, stats2) = p.poll(&first, &mut spool).unwrap();
        assert_eq!(*answers.lock().unwrap(), [true, true, true]);
        assert_eq!((first, stats1), (second.clone(), stats2));
        // A new resourceVersion is not known.
        let mut changed = items;
        changed[0].resource_version = "2".into();
        let mut p2 = Poller::new(Box::new(Asks {
            items: changed,
            answers: answers.clone(),
        }));
        p2.poll(&second, &mut spool).unwrap();
        assert!(!answers.lock().unwrap()[0]);
    }
}
