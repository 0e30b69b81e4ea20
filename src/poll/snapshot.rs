//! Snapshots: the module set of one complete poll, per module only what the diff and the
//! sinks need (uid, resourceVersion, hash, where its files are in the spool), never the
//! contents themselves. `event::diff` turns one snapshot into the next.
//!
//! A snapshot is a sorted vector (`Modules`), not a tree: a poll collects its entries into
//! a vector anyway, and sorting that vector in place makes the snapshot without a second
//! copy or any per-node overhead; lookups are binary searches. Module ids live in one
//! arena string.

use std::fmt;

use super::hash::Hash;
use super::spool::Loc;

/// What a snapshot keeps of a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub uid: Ident,
    pub resource_version: Ident,
    pub hash: Hash,
    pub loc: Loc,
    pub files: u32,
    pub bytes: u64,
}

/// A uid or resourceVersion, kept small: snapshots hold one of each per module. A
/// canonical lowercase UUID (what the apiserver gives as uid) is 16 bytes, a canonical
/// decimal number (what it gives as resourceVersion) a `u64`, anything else its text. It
/// shows, and compares, as the text it was made from.
#[derive(Clone, PartialEq, Eq)]
pub enum Ident {
    Uuid([u8; 16]),
    Number(u64),
    Text(Box<str>),
}

impl Ident {
    pub fn new(s: &str) -> Ident {
        let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if digits
            && (s == "0" || !s.starts_with('0'))
            && let Ok(n) = s.parse()
        {
            return Ident::Number(n);
        }
        if let Some(bytes) = uuid(s) {
            return Ident::Uuid(bytes);
        }
        Ident::Text(s.into())
    }
}

/// The 16 bytes of a canonical lowercase UUID (`8-4-4-4-12` hex digits).
fn uuid(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    let mut out = [0u8; 16];
    let mut hex = b.iter().filter(|&&c| c != b'-');
    for byte in &mut out {
        let mut v = 0u8;
        for _ in 0..2 {
            let c = *hex.next()?;
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                _ => return None,
            };
            v = v << 4 | d;
        }
        *byte = v;
    }
    Some(out)
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ident::Number(n) => write!(f, "{n}"),
            Ident::Text(t) => f.write_str(t),
            Ident::Uuid(b) => {
                for (i, byte) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl PartialEq<str> for Ident {
    fn eq(&self, other: &str) -> bool {
        match self {
            Ident::Text(t) => &**t == other,
            _ => *self == Ident::new(other),
        }
    }
}

impl PartialEq<&str> for Ident {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl From<&str> for Ident {
    fn from(s: &str) -> Ident {
        Ident::new(s)
    }
}

impl From<String> for Ident {
    fn from(s: String) -> Ident {
        Ident::new(&s)
    }
}

/// Entries by module id (`namespace/name`), sorted by id (byte order = module-name order),
/// each id once. The ids live in one arena string (8 bytes per module and the id's own
/// bytes, not a pointer, a length and an allocation each).
#[derive(Clone, Debug, Default)]
pub struct Modules {
    ids: String,
    /// (offset in `ids`, length, entry).
    v: Vec<(u32, u32, Entry)>,
    /// Where the last lookup ended: a list arrives in id order, so the next id is usually
    /// there or just after it, and is found without a binary search.
    hint: std::cell::Cell<usize>,
}

impl PartialEq for Modules {
    fn eq(&self, other: &Modules) -> bool {
        self.len() == other.len() && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl Eq for Modules {}

impl Modules {
    /// Appends without keeping the order: for a poll collecting its entries, which calls
    /// `sorted` once at the end.
    pub fn push_unsorted(&mut self, id: &str, entry: Entry) {
        let off = u32::try_from(self.ids.len()).expect("module ids under 4 GiB in all");
        self.ids.push_str(id);
        self.v.push((off, id.len() as u32, entry));
    }

    /// Forgets what was pushed after the first `n`.
    pub fn truncate(&mut self, n: usize) {
        if let Some(&(off, _, _)) = self.v.get(n) {
            self.ids.truncate(off as usize);
        }
        self.v.truncate(n);
    }

    /// Sorts what was pushed; of two entries for one id, the later wins (warned).
    pub fn sorted(mut self) -> Modules {
        let ids = std::mem::take(&mut self.ids);
        let key = |e: &(u32, u32, Entry)| &ids[e.0 as usize..(e.0 + e.1) as usize];
        // Equal ids keep their push order (ids are appended to the arena, so a later push
        // has a larger offset), so the last is the later one. In place: a stable sort would
        // allocate half the vector again (12 MB at 100k modules) on top of the poll.
        self.v
            .sort_unstable_by(|a, b| key(a).cmp(key(b)).then(a.0.cmp(&b.0)));
        let mut dup = Vec::new();
        self.v.dedup_by(|later, earlier| {
            if key(later) == key(earlier) {
                // Keep the later entry in the earlier slot.
                std::mem::swap(&mut later.2, &mut earlier.2);
                dup.push(key(earlier).to_string());
                true
            } else {
                false
            }
        });
        for id in dup {
            log::warn!("configmap {id} was listed twice; using the last one");
        }
        self.v.shrink_to_fit();
        self.ids = ids;
        self
    }

    fn id(&self, i: usize) -> &str {
        let (off, len, _) = self.v[i];
        &self.ids[off as usize..(off + len) as usize]
    }

    fn find(&self, id: &str) -> Result<usize, usize> {
        let h = self.hint.get();
        for i in [h, h + 1] {
            if i < self.v.len() && self.id(i) == id {
                self.hint.set(i);
                return Ok(i);
            }
        }
        let found = self
            .v
            .binary_search_by(|e| self.ids[e.0 as usize..(e.0 + e.1) as usize].cmp(id));
        if let Ok(i) = found {
            self.hint.set(i);
        }
        found
    }

    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.find(id).ok().map(|i| &self.v[i].2)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Entry> {
        self.find(id).ok().map(|i| &mut self.v[i].2)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.find(id).is_ok()
    }

    /// Inserts or replaces, keeping the order; the replaced entry.
    pub fn insert(&mut self, id: &str, entry: Entry) -> Option<Entry> {
        match self.find(id) {
            Ok(i) => Some(std::mem::replace(&mut self.v[i].2, entry)),
            Err(i) => {
                let off = u32::try_from(self.ids.len()).expect("module ids under 4 GiB in all");
                self.ids.push_str(id);
                self.v.insert(i, (off, id.len() as u32, entry));
                None
            }
        }
    }

    /// Removes (the id's bytes stay in the arena until the snapshot is replaced).
    pub fn remove(&mut self, id: &str) -> Option<Entry> {
        self.find(id).ok().map(|i| self.v.remove(i).2)
    }

    pub fn len(&self) -> usize {
        self.v.len()
    }

    pub fn is_empty(&self) -> bool {
        self.v.is_empty()
    }

    /// In id order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        (0..self.v.len()).map(|i| (self.id(i), &self.v[i].2))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        (0..self.v.len()).map(|i| self.id(i))
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Entry> {
        self.v.iter_mut().map(|(_, _, e)| e)
    }
}

impl std::ops::Index<&str> for Modules {
    type Output = Entry;

    fn index(&self, id: &str) -> &Entry {
        self.get(id).expect("a module of the snapshot")
    }
}

impl<K: AsRef<str>> FromIterator<(K, Entry)> for Modules {
    fn from_iter<I: IntoIterator<Item = (K, Entry)>>(it: I) -> Modules {
        let mut m = Modules::default();
        for (k, e) in it {
            m.push_unsorted(k.as_ref(), e);
        }
        m.sorted()
    }
}

/// The modules of one complete poll, by `namespace/name` (byte order = module-name order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub modules: Modules,
}

impl Snapshot {
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }
}

/// `namespace/name` → (`namespace`, `name`).
pub fn split_id(id: &str) -> (&str, &str) {
    id.split_once('/').unwrap_or(("", id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::spool::Loc;

    #[test]
    fn idents_are_compact_and_show_as_given() {
        for (text, compact) in [
            ("184467120", true),
            ("0", true),
            ("6f1c2d3e-8a9b-4c5d-9e0f-1a2b3c4d5e6f", true),
            ("007", false),
            ("6F1C2D3E-8A9B-4C5D-9E0F-1A2B3C4D5E6F", false),
            ("6f1c2d3e-8a9b-4c5d-9e0f-1a2b3c4d5e6", false),
            ("18446744073709551616", false),
            ("", false),
            ("uid-a", false),
        ] {
            let id = Ident::new(text);
            assert_eq!(id.to_string(), text);
            assert!(id == text, "{text}");
            assert_eq!(!matches!(id, Ident::Text(_)), compact, "{text}");
        }
        assert!(Ident::new("12") != "012");
        assert!(Ident::new("uid-a") != "uid-b");
        assert!(std::mem::size_of::<Ident>() <= 24);
    }

    fn entry(n: u8) -> Entry {
        Entry {
            uid: Ident::new("u"),
            resource_version: Ident::new("1"),
            hash: Hash([n; 32]),
            loc: Loc::default(),
            files: 1,
            bytes: 1,
        }
    }

    #[test]
    fn modules_are_a_sorted_map() {
        let mut m: Modules = [("b/x", entry(1)), ("a/y", entry(2)), ("b/x", entry(3))]
            .into_iter()
            .collect();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a/y", "b/x"]);
        assert_eq!(m["b/x"].hash, Hash([3; 32]), "the later of two wins");
        assert_eq!(m.insert("a-b/z", entry(4)), None);
        let mut t = m.clone();
        t.push_unsorted("c/c", entry(9));
        t.truncate(t.len() - 1);
        assert_eq!(t, m, "truncated back");
        assert_eq!(
            m.insert("a/y", entry(5)).map(|e| e.hash),
            Some(Hash([2; 32]))
        );
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a-b/z", "a/y", "b/x"]);
        assert_eq!(m.remove("a/y").map(|e| e.hash), Some(Hash([5; 32])));
        assert!(!m.contains_key("a/y") && m.contains_key("a-b/z"));
        assert_eq!(m.len(), 2);
        assert!(m.get("zz").is_none());
    }
}
