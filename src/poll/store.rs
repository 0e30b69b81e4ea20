//! The daemon's state between polls: the current snapshot and the spool holding its
//! contents, owned together and handed between the loop and the poll thread (so neither
//! needs a lock).
//!
//! `commit` makes a poll's snapshot current once its batch went through the sinks: a module
//! a sink could not write keeps its previous entry (or stays absent), so the next poll
//! tries again; what was delivered into an output folder that can give it back (the
//! spool's shelf) is kept there only; contents no current module uses are released; the
//! spool is compacted when enough of it is dead.

use std::io;

use super::event::{Change, Event};
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

    /// Makes `next` current. `applied`: the events every sink took; `unwritten`: modules a
    /// sink could not write (their events are not in `applied`).
    pub fn commit(
        &mut self,
        mut next: Snapshot,
        applied: &[Event],
        unwritten: &[String],
    ) -> io::Result<()> {
        for id in unwritten {
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
        for e in applied {
            if matches!(e.change, Change::Updated | Change::Removed)
                && let Some(old) = self.snapshot.modules.get(&e.id)
            {
                self.spool.release(old.loc);
            }
        }
        // Delivered: with a shelf (the output folder), the spool keeps only their keys.
        for e in applied.iter().filter(|_| self.shelving) {
            if !matches!(e.change, Change::Added | Change::Updated) {
                continue;
            }
            if let Some(entry) = next.modules.get_mut(&e.id)
                && entry.hash == e.entry.hash
            {
                match self.spool.shelve(&e.id, &entry.hash, entry.loc) {
                    Ok(Some(loc)) => entry.loc = loc,
                    Ok(None) => {}
                    Err(err) => log::debug!("{}: kept in the spool: {err}", e.id),
                }
            }
        }
        self.spool.first_batch_done();
        self.snapshot = next;
        if self.spool.wants_compaction() {
            let Store {
                snapshot, spool, ..
            } = self;
            spool
                .compact(snapshot.modules.values_mut().map(|e| &mut e.loc))
                .map_err(|e| io::Error::new(e.kind(), format!("cannot compact the spool: {e}")))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::event::diff;

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
        let events = diff(&store.snapshot, &first);
        store.commit(first, &events, &[]).unwrap();
        let mut next = Snapshot::default();
        put(&mut store, &mut next, "ns/a", "a2");
        put(&mut store, &mut next, "ns/b", "b1");
        let mut events = diff(&store.snapshot, &next);
        // Neither could be written: a stays at a1, b stays absent.
        events.clear();
        store
            .commit(next, &events, &["ns/a".into(), "ns/b".into()])
            .unwrap();
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
            let events = diff(&store.snapshot, &next);
            store.commit(next, &events, &[]).unwrap();
            assert!(text(&store, "ns/a").starts_with(&round.to_string()));
        }
        assert!(
            store.spool.len() < 5 << 20,
            "compacted: {} bytes",
            store.spool.len()
        );
    }
}
