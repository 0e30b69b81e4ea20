//! The server's table of connections (`Table`): each in a slot of its own, named by a key
//! (its slot and the slot's epoch, bumped each time the slot is taken, so that the key of
//! a connection gone finds nothing, not the one in its place); a slot freed is taken
//! again first, and a lookup is an index.

use std::io;

/// Connections (`E`) by key.
pub(super) struct Table<E> {
    slots: Vec<Option<E>>,
    /// Slots freed, to be taken again.
    free: Vec<usize>,
    /// Each slot's epoch: its entry's, while one is there.
    epochs: Vec<u32>,
    /// Entries in it.
    open: usize,
}

impl<E> Table<E> {
    pub fn new() -> Table<E> {
        Table {
            slots: Vec::new(),
            free: Vec::new(),
            epochs: Vec::new(),
            open: 0,
        }
    }

    /// Entries in it.
    pub fn len(&self) -> usize {
        self.open
    }

    pub fn get(&self, key: u64) -> Option<&E> {
        let (i, epoch) = split(key);
        if *self.epochs.get(i)? != epoch {
            return None;
        }
        self.slots.get(i)?.as_ref()
    }

    pub fn get_mut(&mut self, key: u64) -> Option<&mut E> {
        let (i, epoch) = split(key);
        if *self.epochs.get(i)? != epoch {
            return None;
        }
        self.slots.get_mut(i)?.as_mut()
    }

    /// Puts in the entry `make` makes for its key (nothing when it fails); its key.
    pub fn insert(&mut self, make: impl FnOnce(u64) -> io::Result<E>) -> io::Result<u64> {
        let i = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.epochs.push(0);
            self.slots.len() - 1
        });
        self.epochs[i] = self.epochs[i].wrapping_add(1);
        let key = key_of(i, self.epochs[i]);
        match make(key) {
            Ok(e) => {
                self.slots[i] = Some(e);
                self.open += 1;
                Ok(key)
            }
            Err(err) => {
                self.free.push(i);
                Err(err)
            }
        }
    }

    /// Takes out the entry of `key`, if it is there.
    pub fn remove(&mut self, key: u64) -> Option<E> {
        let (i, epoch) = split(key);
        if *self.epochs.get(i)? != epoch {
            return None;
        }
        let e = self.slots.get_mut(i).and_then(Option::take)?;
        self.free.push(i);
        self.open -= 1;
        Some(e)
    }

    /// Every entry, with its key.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &E)> {
        let epochs = &self.epochs;
        (self.slots.iter().enumerate())
            .filter_map(move |(i, e)| Some((key_of(i, epochs[i]), e.as_ref()?)))
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut E> {
        self.slots.iter_mut().flatten()
    }
}

fn key_of(i: usize, epoch: u32) -> u64 {
    (u64::from(epoch) << 32) | (i as u64 & 0xffff_ffff)
}

fn split(key: u64) -> (usize, u32) {
    ((key & 0xffff_ffff) as usize, (key >> 32) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_finds_its_own_entry_only_and_a_slot_is_taken_again() {
        let mut t = Table::new();
        let a = t.insert(|_| Ok("a")).unwrap();
        let b = t.insert(|_| Ok("b")).unwrap();
        assert_eq!((t.len(), t.get(a), t.get(b)), (2, Some(&"a"), Some(&"b")));
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!((t.len(), t.get(a)), (1, None));
        assert_eq!(t.remove(a), None);
        // `a`'s slot, a new epoch: `a` finds nothing there.
        let c = t.insert(|_| Ok("c")).unwrap();
        assert_eq!(split(c).0, split(a).0);
        assert_eq!((t.get(a), t.get(c)), (None, Some(&"c")));
        assert_eq!(t.get_mut(a), None);
        // A connection that could not come in leaves its slot free.
        assert!(t.insert(|_| Err(io::Error::other("no"))).is_err());
        let d = t.insert(|_| Ok("d")).unwrap();
        let keys: Vec<u64> = t.iter().map(|(k, _)| k).collect();
        assert_eq!((t.len(), keys), (3, vec![c, b, d]));
    }
}
