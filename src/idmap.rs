//! `IdMap`: a map from module ids to values, held compact because cmpoll keeps one entry per
//! module of the cluster (a snapshot, the output folder's record): at 100k modules a
//! `BTreeMap<String, V>` costs a pointer, a length and an allocation per id and leaves its
//! nodes half full when filled in order, which is how both are filled.
//!
//! The ids live in one arena string; the values in a vector sorted by id (byte order =
//! module-name order), found by binary search. A map is usually built in one go
//! (`push_unsorted`, then `sort`), or grows at its end (ids inserted in order). For the
//! rest, nothing costs a move of the whole vector per call: an id inserted out of order
//! waits in a small sorted `tail` until enough have come to merge them in one pass, in
//! place; a removed entry leaves a hole that the next insert of that id reuses, and holes
//! are swept once they are many. Iteration is in id order over both.

use std::cell::Cell;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
struct Slot<V> {
    off: u32,
    len: u32,
    /// `None`: removed (a hole, swept later).
    value: Option<V>,
}

#[derive(Clone, Debug)]
pub struct IdMap<V> {
    ids: String,
    slots: Vec<Slot<V>>,
    /// Slots that are holes.
    holes: usize,
    /// Ids inserted out of order, not yet merged into `slots` (disjoint from them).
    tail: BTreeMap<Box<str>, V>,
    /// Where the last lookup ended: lookups often go in id order, so the next id is usually
    /// there or just after it, and found without a binary search.
    hint: Cell<usize>,
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap {
            ids: String::new(),
            slots: Vec::new(),
            holes: 0,
            tail: BTreeMap::new(),
            hint: Cell::new(0),
        }
    }
}

impl<V: PartialEq> PartialEq for IdMap<V> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl<V: Eq> Eq for IdMap<V> {}

/// Out-of-order inserts held before a merge: a few, or a sixteenth of the map, so that a
/// merge (one pass over the map) is paid for by many inserts.
fn tail_room(slots: usize) -> usize {
    (slots / 16).max(64)
}

impl<V> IdMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    fn arena(&mut self, id: &str) -> (u32, u32) {
        let off = u32::try_from(self.ids.len()).expect("module ids under 4 GiB in all");
        self.ids.push_str(id);
        (off, id.len() as u32)
    }

    fn id(&self, i: usize) -> &str {
        let s = &self.slots[i];
        &self.ids[s.off as usize..(s.off + s.len) as usize]
    }

    /// Appends without keeping the order: for a map built in one go, which calls `sort`
    /// once at the end.
    pub fn push_unsorted(&mut self, id: &str, value: V) {
        let (off, len) = self.arena(id);
        self.slots.push(Slot {
            off,
            len,
            value: Some(value),
        });
    }

    /// Forgets what `push_unsorted` added after the first `n` (a `len()` taken while the
    /// map was only pushed to).
    pub fn truncate(&mut self, n: usize) {
        if let Some(s) = self.slots.get(n) {
            self.ids.truncate(s.off as usize);
        }
        self.slots.truncate(n);
    }

    /// Sorts what was pushed, in place; of two values for one id the later pushed wins.
    /// Returns the ids that were pushed more than once.
    pub fn sort(&mut self) -> Vec<String> {
        self.merge_tail();
        let ids = std::mem::take(&mut self.ids);
        let key = |s: &Slot<V>| &ids[s.off as usize..(s.off + s.len) as usize];
        // Equal ids keep their push order (a later push has a larger offset). In place: a
        // stable sort would allocate half the vector again.
        self.slots
            .sort_unstable_by(|a, b| key(a).cmp(key(b)).then(a.off.cmp(&b.off)));
        let mut twice = Vec::new();
        self.slots.dedup_by(|later, earlier| {
            if key(later) == key(earlier) {
                std::mem::swap(&mut later.value, &mut earlier.value);
                twice.push(key(earlier).to_string());
                true
            } else {
                false
            }
        });
        self.slots.retain(|s| s.value.is_some());
        self.holes = 0;
        self.slots.shrink_to_fit();
        self.ids = ids;
        twice
    }

    /// The slot of `id` (a hole included), or where it would go.
    fn find(&self, id: &str) -> Result<usize, usize> {
        let h = self.hint.get();
        for i in [h, h + 1] {
            if i < self.slots.len() && self.id(i) == id {
                self.hint.set(i);
                return Ok(i);
            }
        }
        let found = self
            .slots
            .binary_search_by(|s| self.ids[s.off as usize..(s.off + s.len) as usize].cmp(id));
        if let Ok(i) = found {
            self.hint.set(i);
        }
        found
    }

    pub fn get(&self, id: &str) -> Option<&V> {
        match self.find(id) {
            Ok(i) => self.slots[i].value.as_ref(),
            Err(_) => self.tail.get(id),
        }
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut V> {
        match self.find(id) {
            Ok(i) => self.slots[i].value.as_mut(),
            Err(_) => self.tail.get_mut(id),
        }
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// Inserts or replaces; the value replaced.
    pub fn insert(&mut self, id: &str, value: V) -> Option<V> {
        match self.find(id) {
            Ok(i) => {
                let old = self.slots[i].value.replace(value);
                if old.is_none() {
                    self.holes -= 1;
                }
                old
            }
            Err(i) if i == self.slots.len() && self.tail.is_empty() => {
                self.push_unsorted(id, value);
                None
            }
            Err(_) => {
                let old = self.tail.insert(id.into(), value);
                if self.tail.len() > tail_room(self.slots.len()) {
                    self.merge_tail();
                }
                old
            }
        }
    }

    pub fn remove(&mut self, id: &str) -> Option<V> {
        let old = match self.find(id) {
            Ok(i) => self.slots[i].value.take(),
            Err(_) => return self.tail.remove(id),
        };
        if old.is_some() {
            self.holes += 1;
            if self.holes > tail_room(self.slots.len()) * 4 {
                self.sweep();
            }
        }
        old
    }

    pub fn len(&self) -> usize {
        self.slots.len() - self.holes + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// In id order.
    pub fn iter(&self) -> Iter<'_, V> {
        Iter {
            map: self,
            at: 0,
            tail: self.tail.iter().peekable(),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.iter().map(|(id, _)| id)
    }

    /// In no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        (self.slots.iter_mut().filter_map(|s| s.value.as_mut())).chain(self.tail.values_mut())
    }

    /// Calls `f` with each id and its value, in no particular order.
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&str, &mut V)) {
        let ids = &self.ids;
        for s in &mut self.slots {
            if let Some(v) = &mut s.value {
                f(&ids[s.off as usize..(s.off + s.len) as usize], v);
            }
        }
        for (id, v) in &mut self.tail {
            f(id, v);
        }
    }

    /// Merges the tail into the sorted slots, in place, from the back: O(slots + tail).
    fn merge_tail(&mut self) {
        if self.tail.is_empty() {
            return;
        }
        let tail = std::mem::take(&mut self.tail);
        let mut new: Vec<Slot<V>> = Vec::with_capacity(tail.len());
        for (id, value) in tail {
            let (off, len) = self.arena(&id);
            new.push(Slot {
                off,
                len,
                value: Some(value),
            });
        }
        let ids = &self.ids;
        let key = |s: &Slot<V>| &ids[s.off as usize..(s.off + s.len) as usize];
        let mut i = self.slots.len();
        self.slots.resize_with(i + new.len(), || Slot {
            off: 0,
            len: 0,
            value: None,
        });
        // Filled from the back with the larger of the two heads; every slot at or past
        // `w` is free (a placeholder, or one already moved), since `w` = i + new.len().
        let mut w = self.slots.len();
        while let Some(last) = new.last() {
            w -= 1;
            if i > 0 && key(&self.slots[i - 1]) > key(last) {
                self.slots.swap(i - 1, w);
                i -= 1;
            } else if let Some(s) = new.pop() {
                self.slots[w] = s;
            }
        }
    }

    /// Drops the holes, and the arena's bytes of their ids when those are many.
    fn sweep(&mut self) {
        self.slots.retain(|s| s.value.is_some());
        self.holes = 0;
        let live: usize = self.slots.iter().map(|s| s.len as usize).sum();
        if self.ids.len() > 2 * live {
            let mut ids = String::with_capacity(live);
            for s in &mut self.slots {
                let off = ids.len() as u32;
                ids.push_str(&self.ids[s.off as usize..(s.off + s.len) as usize]);
                s.off = off;
            }
            self.ids = ids;
        }
        self.hint.set(0);
    }
}

/// `IdMap::iter`: the sorted slots and the tail, merged.
pub struct Iter<'a, V> {
    map: &'a IdMap<V>,
    at: usize,
    tail: std::iter::Peekable<std::collections::btree_map::Iter<'a, Box<str>, V>>,
}

impl<'a, V> Iterator for Iter<'a, V> {
    type Item = (&'a str, &'a V);

    fn next(&mut self) -> Option<(&'a str, &'a V)> {
        let map = self.map;
        while self.at < map.slots.len() && map.slots[self.at].value.is_none() {
            self.at += 1;
        }
        let slot = (self.at < map.slots.len()).then(|| map.id(self.at));
        match (slot, self.tail.peek()) {
            (Some(id), Some((t, _))) if &***t < id => self.tail.next().map(|(t, v)| (&**t, v)),
            (Some(id), _) => {
                let v = map.slots[self.at].value.as_ref()?;
                self.at += 1;
                Some((id, v))
            }
            (None, _) => self.tail.next().map(|(t, v)| (&**t, v)),
        }
    }
}

impl<V> std::ops::Index<&str> for IdMap<V> {
    type Output = V;

    fn index(&self, id: &str) -> &V {
        self.get(id).expect("an id of the map")
    }
}

impl<K: AsRef<str>, V> FromIterator<(K, V)> for IdMap<V> {
    /// Sorted once at the end; of two values for one id, the later wins.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(it: I) -> Self {
        let mut m = IdMap::new();
        for (k, v) in it {
            m.push_unsorted(k.as_ref(), v);
        }
        m.sort();
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn it_is_a_sorted_map() {
        let mut m: IdMap<u32> = [("b/x", 1), ("a/y", 2), ("b/x", 3)].into_iter().collect();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a/y", "b/x"]);
        assert_eq!(m["b/x"], 3, "the later of two wins");
        let mut t = m.clone();
        t.push_unsorted("c/c", 9);
        t.truncate(t.len() - 1);
        assert_eq!(t, m, "truncated back");
        assert_eq!(m.insert("a-b/z", 4), None);
        assert_eq!(m.insert("a/y", 5), Some(2));
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a-b/z", "a/y", "b/x"]);
        assert_eq!(m.remove("a/y"), Some(5));
        assert!(!m.contains_key("a/y") && m.contains_key("a-b/z"));
        assert_eq!(m.len(), 2);
        assert!(m.get("zz").is_none());
        assert_eq!(m.insert("a/y", 6), None, "a hole is filled again");
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a-b/z", "a/y", "b/x"]);
    }

    #[test]
    fn twice_pushed_ids_are_reported() {
        let mut m = IdMap::new();
        for (id, v) in [("b", 1), ("a", 2), ("b", 3), ("b", 4)] {
            m.push_unsorted(id, v);
        }
        assert_eq!(m.sort(), ["b", "b"]);
        assert_eq!(m.iter().collect::<Vec<_>>(), [("a", &2), ("b", &4)]);
    }

    /// Random inserts, replacements and removals, in and out of order, against a BTreeMap:
    /// every step, the same entries in the same order; the tail is merged and holes swept
    /// many times on the way.
    #[test]
    fn it_does_what_a_btree_map_does() {
        let mut rng = crate::backoff::Rng::new(7);
        let mut m: IdMap<u64> = IdMap::new();
        let mut b: BTreeMap<String, u64> = BTreeMap::new();
        for step in 0..20_000u64 {
            let id = format!("ns-{}/m-{:04}", rng.next_u64() % 3, rng.next_u64() % 1500);
            match rng.next_u64() % 10 {
                0..=5 => assert_eq!(m.insert(&id, step), b.insert(id.clone(), step), "{id}"),
                6..=8 => assert_eq!(m.remove(&id), b.remove(&id), "{id}"),
                _ => {
                    // Ids past the last one: the map grows at its end.
                    let id = format!("zz/{step:08}");
                    assert_eq!(m.insert(&id, step), b.insert(id, step));
                }
            }
            assert_eq!(m.len(), b.len());
            assert_eq!(m.get(&id), b.get(&id));
            if step % 997 == 0 {
                let got: Vec<(&str, &u64)> = m.iter().collect();
                let want: Vec<(&str, &u64)> = b.iter().map(|(k, v)| (k.as_str(), v)).collect();
                assert_eq!(got, want, "step {step}");
            }
        }
        for v in m.values_mut() {
            *v += 1;
        }
        assert!(m.iter().all(|(id, v)| b[id] + 1 == *v));
    }

    #[test]
    fn a_merge_keeps_the_order_when_new_ids_interleave() {
        let mut m: IdMap<u32> = (0..200u32).map(|i| (format!("{:04}", 2 * i), i)).collect();
        for i in 0..200u32 {
            m.insert(&format!("{:04}", 2 * i + 1), 1000 + i);
        }
        assert!(m.tail.len() < 200, "merged on the way");
        let ids: Vec<String> = m.keys().map(String::from).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert_eq!(ids.len(), 400);
        assert_eq!(m["0003"], 1001);
    }
}
