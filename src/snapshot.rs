//! Snapshots and diffs.
//!
//! A snapshot is the module set of one complete poll: per module only what the diff and the
//! sinks need (uid, resourceVersion, hash, where its files are in the spool), never the
//! contents themselves. `Snapshot::diff` turns the previous snapshot into the next one as
//! events: removals first, then additions and updates together, each in module-name order.
//! Only the hash decides: a label edit, or a delete and re-create with the same content,
//! changes nothing.

use std::collections::BTreeMap;

use crate::hash::Hash;
use crate::spool::Loc;

/// What a snapshot keeps of a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub uid: String,
    pub resource_version: String,
    pub hash: Hash,
    pub loc: Loc,
    pub files: u32,
    pub bytes: u64,
}

/// The modules of one complete poll, by `namespace/name` (byte order = module-name order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub modules: BTreeMap<String, Entry>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Added,
    Updated,
    Removed,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Updated => "updated",
            Change::Removed => "removed",
        }
    }
}

/// One change: for `Removed` the entry is the last one seen, otherwise the new one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub change: Change,
    pub id: String,
    pub entry: Entry,
}

impl Snapshot {
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// The events that turn `self` into `next`.
    pub fn diff(&self, next: &Snapshot) -> Vec<Event> {
        let mut events: Vec<Event> = self
            .modules
            .iter()
            .filter(|(id, _)| !next.modules.contains_key(*id))
            .map(|(id, e)| Event {
                change: Change::Removed,
                id: id.clone(),
                entry: e.clone(),
            })
            .collect();
        for (id, e) in &next.modules {
            let change = match self.modules.get(id) {
                None => Change::Added,
                Some(old) if old.hash != e.hash => Change::Updated,
                Some(_) => continue,
            };
            events.push(Event {
                change,
                id: id.clone(),
                entry: e.clone(),
            });
        }
        events
    }
}

/// `namespace/name` → (`namespace`, `name`).
pub fn split_id(id: &str) -> (&str, &str) {
    id.split_once('/').unwrap_or(("", id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(hash: u8, uid: &str) -> Entry {
        Entry {
            uid: uid.into(),
            resource_version: "1".into(),
            hash: Hash([hash; 32]),
            loc: Loc::default(),
            files: 1,
            bytes: 1,
        }
    }

    fn snap(mods: &[(&str, u8, &str)]) -> Snapshot {
        Snapshot {
            modules: mods
                .iter()
                .map(|(id, h, uid)| (id.to_string(), entry(*h, uid)))
                .collect(),
        }
    }

    fn changes(events: &[Event]) -> Vec<(Change, &str)> {
        events.iter().map(|e| (e.change, e.id.as_str())).collect()
    }

    #[test]
    fn removals_first_then_additions_and_updates_in_module_order() {
        let prev = snap(&[
            ("a/x", 1, "u"),
            ("b/y", 1, "u"),
            ("c/z", 1, "u"),
            ("d/w", 1, "u"),
        ]);
        let next = snap(&[
            ("a/a", 1, "u"),
            ("b/y", 2, "u"),
            ("d/w", 1, "u"),
            ("e/v", 1, "u"),
        ]);
        assert_eq!(
            changes(&prev.diff(&next)),
            [
                (Change::Removed, "a/x"),
                (Change::Removed, "c/z"),
                (Change::Added, "a/a"),
                (Change::Updated, "b/y"),
                (Change::Added, "e/v"),
            ]
        );
        let removed = &prev.diff(&next)[0];
        assert_eq!(
            removed.entry.hash,
            Hash([1; 32]),
            "a removal carries the last hash"
        );
    }

    #[test]
    fn only_content_counts() {
        let prev = snap(&[("a/x", 1, "uid-1")]);
        let relabelled = Snapshot {
            modules: [(
                "a/x".to_string(),
                Entry {
                    resource_version: "9".into(),
                    ..entry(1, "uid-1")
                },
            )]
            .into(),
        };
        assert!(prev.diff(&relabelled).is_empty(), "metadata-only edit");
        let recreated = snap(&[("a/x", 1, "uid-2")]);
        assert!(
            prev.diff(&recreated).is_empty(),
            "deleted and re-created, same content"
        );
        assert!(Snapshot::default().diff(&Snapshot::default()).is_empty());
    }

    #[test]
    fn module_order_is_byte_order() {
        let next = snap(&[("a-b/x", 1, "u"), ("a/x", 1, "u"), ("B/x", 1, "u")]);
        assert_eq!(
            changes(&Snapshot::default().diff(&next)),
            [
                (Change::Added, "B/x"),
                (Change::Added, "a-b/x"),
                (Change::Added, "a/x")
            ]
        );
        assert_eq!(split_id("ns/name"), ("ns", "name"));
    }
}
