//! The daemon's state between polls: the current snapshot and the spool holding its
//! contents, owned together and handed between the loop and the poll thread (so neither
//! needs a lock).
//!
//! `commit` makes a poll's snapshot current once its batch went through the sinks: a module
//! a sink could not write keeps its previous entry (or stays absent), so the next poll
//! tries again; what was delivered into an output folder that can give it back (the
//! spool's shelf) is kept there only; contents no current module uses are released; the
//! spool is compacted when enough of it is dead. Nothing here fails a commit: a compaction
//! that cannot run (a full volume) leaves the spool as it was, and is tried again after
//! the next poll.

use super::snapshot::Snapshot;
use super::spool::Spool;

pub struct Store {
    pub snapshot: Snapshot,
    pub spool: Spool,
    /// Whether delivered modules are shelved (see `commit`).
    shelving: bool,
}

impl Store {
    pub fn new(spool: Spool) -> Store {
        Store {
            snapshot: Snapshot::default(),
            spool,
            shelving: true,
        }
    }

    /// No shelving after a commit: for `--once`, which exits right after its one batch,
    /// reading every delivered file back would only cost time (0.3 s at 10k modules).
    pub fn without_shelving(mut self) -> Store {
        self.shelving = false;
        self
    }

    /// Makes `next` current. `kept`: modules the sinks did not take (a write failed, or
    /// rejected): each keeps its previous version, or stays absent. `first`: this was a
    /// run's first batch, which delivered every module.
    ///
    /// What to release and what to shelve follows from the two snapshots, not from the
    /// batch's events (which borrow them): contents the current snapshot has and `next`
    /// no longer uses are released; a module `next` delivered (new or changed, or any in
    /// a first batch) is shelved.
    pub fn commit(&mut self, mut next: Snapshot, kept: &[String], first: bool) {
        for id in kept {
            let old = self.snapshot.modules.get(id);
            let refused = match old {
                Some(old) => next.modules.insert(id, old.clone()),
                None => next.modules.remove(id),
            };
            // Contents this poll spooled for it are nobody's now.
            if let Some(e) = refused
                && old.is_none_or(|old| old.loc != e.loc)
            {
                self.spool.release(e.loc);
            }
        }
        let Store {
            snapshot: current,
            spool,
            shelving,
        } = self;
        for (id, old) in current.modules.iter() {
            if (next.modules.get(id)).is_none_or(|e| e.loc != old.loc) {
                spool.release(old.loc);
            }
        }
        // Delivered: with a shelf (the output folder), the spool keeps only their keys.
        if *shelving {
            let kept: std::collections::HashSet<&str> = kept.iter().map(String::as_str).collect();
            next.modules.for_each_mut(|id, entry| {
                let delivered =
                    first || (current.modules.get(id)).is_none_or(|old| old.hash != entry.hash);
                if !delivered || kept.contains(id) {
                    return;
                }
                match spool.shelve(id, entry.loc) {
                    Ok(Some(loc)) => entry.loc = loc,
                    Ok(None) => {}
                    Err(err) => log::debug!("{id}: kept in the spool: {err}"),
                }
            });
        }
        self.spool.first_batch_done();
        self.snapshot = next;
        if self.spool.wants_compaction() {
            let Store {
                snapshot, spool, ..
            } = self;
            let compacted = spool.compact(snapshot.modules.values_mut().map(|e| &mut e.loc));
            if let Err(e) = compacted {
                log::warn!(
                    "cannot compact the spool: {e}; keeping it as it is, trying again after the next poll"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(store: &mut Store, snap: &mut Snapshot, id: &str, v: &str) {
        let entry = crate::poll::testing::entry(&mut store.spool, v);
        snap.modules.insert(id, entry);
    }

    fn text(store: &Store, id: &str) -> String {
        let files = store.spool.get(store.snapshot.modules[id].loc).unwrap();
        String::from_utf8(files[0].content.bytes().to_vec()).unwrap()
    }

    #[test]
    fn an_unwritten_module_keeps_its_previous_version_or_stays_absent() {
        let mut store = Store::new(Spool::memory());
        let mut first = Snapshot::default();
        put(&mut store, &mut first, "ns/a", "a1");
        store.commit(first, &[], true);
        let mut next = Snapshot::default();
        put(&mut store, &mut next, "ns/a", "a2");
        put(&mut store, &mut next, "ns/b", "b1");
        // Neither could be written: a stays at a1, b stays absent.
        store.commit(next, &["ns/a".into(), "ns/b".into()], false);
        assert_eq!(store.snapshot.modules.keys().collect::<Vec<_>>(), ["ns/a"]);
        assert_eq!(text(&store, "ns/a"), "a1");
    }

    #[test]
    fn superseded_contents_are_released_and_compacted_away() {
        let mut store = Store::new(Spool::memory());
        let big = "x".repeat(1 << 20);
        for round in 0..12 {
            let mut next = Snapshot::default();
            put(&mut store, &mut next, "ns/a", &format!("{round}{big}"));
            store.commit(next, &[], round == 0);
            assert!(text(&store, "ns/a").starts_with(&round.to_string()));
        }
        assert!(
            store.spool.len() < 5 << 20,
            "compacted: {} bytes",
            store.spool.len()
        );
    }
}
