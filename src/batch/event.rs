//! Events: what changed between two snapshots (`diff`), and the counts that close a batch
//! (`Synced`). Their JSON shapes are `lines.rs`.
//!
//! `diff` orders a batch as SPEC does: removals first, then additions and updates together,
//! each in module-name order. Only the hash decides: a label edit, or a delete and
//! re-create with the same content, changes nothing. An added or updated module the gate
//! or a sink refuses becomes `rejected` (`Event::reject`): the sinks keep its previous
//! version.

use std::borrow::Cow;

use serde::Serialize;

use crate::poll::snapshot::{Entry, Snapshot};
use crate::reason::{MAX_REASON, cut};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Added,
    Updated,
    Removed,
    /// Not published: the sinks keep the previous version (`Event::reason` says why).
    Rejected,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Updated => "updated",
            Change::Removed => "removed",
            Change::Rejected => "rejected",
        }
    }
}

/// One change: for `Removed` the entry is the last one seen, otherwise the new one (for
/// `Rejected`, the one rejected). It borrows the module's id and entry from the snapshot
/// they are in: a first batch has an event per module of the cluster, which would
/// otherwise hold a second copy of the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event<'a> {
    pub change: Change,
    pub id: &'a str,
    pub entry: &'a Entry,
    /// Why a `Rejected` module was rejected.
    pub reason: Option<Box<str>>,
}

impl<'a> Event<'a> {
    pub fn new(change: Change, id: &'a str, entry: &'a Entry) -> Event<'a> {
        Event {
            change,
            id,
            entry,
            reason: None,
        }
    }

    /// This (added or updated) module, rejected for `reason` (cut to `MAX_REASON`).
    pub fn reject(&mut self, reason: String) {
        self.change = Change::Rejected;
        self.reason = Some(match cut(&reason, MAX_REASON) {
            Cow::Borrowed(_) => reason.into(),
            Cow::Owned(cut) => cut.into(),
        });
    }

    /// Whether a sink that delivers contents acts on it (`rejected` is news, not a change).
    pub fn is_change(&self) -> bool {
        self.change != Change::Rejected
    }
}

/// The events that turn `prev` into `next`.
pub fn diff<'a>(prev: &'a Snapshot, next: &'a Snapshot) -> Vec<Event<'a>> {
    // A first batch holds every module: allocated once at its size, not grown by doubling
    // (up to twice that). Later batches are small and pay nothing for counting.
    let mut events: Vec<Event<'a>> = if prev.is_empty() {
        Vec::with_capacity(next.len())
    } else {
        Vec::new()
    };
    events.extend(
        prev.modules
            .iter()
            .filter(|(id, _)| !next.modules.contains_key(id))
            .map(|(id, e)| Event::new(Change::Removed, id, e)),
    );
    for (id, e) in next.modules.iter() {
        let change = match prev.modules.get(id) {
            None => Change::Added,
            Some(old) if old.hash != e.hash => Change::Updated,
            Some(_) => continue,
        };
        events.push(Event::new(change, id, e));
    }
    events
}

/// The counts that close a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Synced {
    pub modules: usize,
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
    pub rejected: usize,
    pub poll: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::hash::Hash;
    use crate::poll::spool::Loc;

    /// An entry whose contents are at a place named after `uid` (the uid itself is in the
    /// spool record, which these tests do not need).
    fn entry_of(hash: u8, uid: &str) -> Entry {
        Entry {
            hash: Hash([hash; 32]),
            loc: Loc {
                off: uid.len() as u64,
                len: 0,
            },
            resource_version: "1".into(),
        }
    }

    fn snap(mods: &[(&str, u8, &str)]) -> Snapshot {
        Snapshot {
            modules: mods
                .iter()
                .map(|(id, h, uid)| (id.to_string(), entry_of(*h, uid)))
                .collect(),
        }
    }

    fn changes<'a>(events: &[Event<'a>]) -> Vec<(Change, &'a str)> {
        events.iter().map(|e| (e.change, e.id)).collect()
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
            changes(&diff(&prev, &next)),
            [
                (Change::Removed, "a/x"),
                (Change::Removed, "c/z"),
                (Change::Added, "a/a"),
                (Change::Updated, "b/y"),
                (Change::Added, "e/v"),
            ]
        );
        let removed = &diff(&prev, &next)[0];
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
                    ..entry_of(1, "uid-1")
                },
            )]
            .into_iter()
            .collect(),
        };
        assert!(diff(&prev, &relabelled).is_empty(), "metadata-only edit");
        let recreated = snap(&[("a/x", 1, "uid-2")]);
        assert!(
            diff(&prev, &recreated).is_empty(),
            "deleted and re-created, same content"
        );
        assert!(diff(&Snapshot::default(), &Snapshot::default()).is_empty());
    }

    #[test]
    fn module_order_is_byte_order() {
        let next = snap(&[("a-b/x", 1, "u"), ("a/x", 1, "u"), ("B/x", 1, "u")]);
        assert_eq!(
            changes(&diff(&Snapshot::default(), &next)),
            [
                (Change::Added, "B/x"),
                (Change::Added, "a-b/x"),
                (Change::Added, "a/x")
            ]
        );
        assert_eq!(crate::poll::snapshot::split_id("ns/name"), ("ns", "name"));
    }
}
