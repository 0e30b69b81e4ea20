//! A map by (identity, id) bounded three ways (`Bounds`): the entries, the bytes they hold
//! (each entry's weight, as its owner weighs it) and each identity's share of both. An
//! identity over its share makes room from its own entries, the one heard from longest ago
//! first; a map over a bound makes room from the identity that holds the most of what is
//! over (entries, or bytes), the newcomer's own identity first when it holds as much. So an
//! identity takes room from another only while that one holds more than it does: a token
//! cycling ids, once it holds as much as any, evicts only its own, and never an identity
//! that holds one entry (a pod's token) while it holds one or more.

use std::collections::HashMap;
use std::time::Instant;

/// What a map holds at most.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub entries: usize,
    pub bytes: usize,
    /// One identity's share.
    pub identity_entries: usize,
    pub identity_bytes: usize,
}

/// What one identity holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Share {
    entries: usize,
    bytes: usize,
}

/// One entry: its value, its weight and when it was last heard from.
struct Entry<V> {
    value: V,
    weight: usize,
    seen: Instant,
}

/// The map.
pub struct Shares<V> {
    bounds: Bounds,
    map: HashMap<(String, String), Entry<V>>,
    identities: HashMap<String, Share>,
    bytes: usize,
}

impl<V> Shares<V> {
    pub fn new(bounds: Bounds) -> Shares<V> {
        Shares {
            bounds,
            map: HashMap::new(),
            identities: HashMap::new(),
            bytes: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The bytes held, all entries together.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub fn get(&self, key: &(String, String)) -> Option<&V> {
        self.map.get(key).map(|e| &e.value)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&(String, String), &V)> {
        self.map.iter().map(|(k, e)| (k, &e.value))
    }

    pub fn remove(&mut self, key: &(String, String)) -> Option<V> {
        let e = self.map.remove(key)?;
        self.bytes -= e.weight;
        if let Some(s) = self.identities.get_mut(&key.0) {
            s.entries -= 1;
            s.bytes -= e.weight;
            if s.entries == 0 {
                self.identities.remove(&key.0);
            }
        }
        Some(e.value)
    }

    /// Changes entry `key` (made by `make` if new), heard from `now`, weighed again by
    /// `weigh`; then makes room, never from `key` itself: the entries let go.
    pub fn change<T>(
        &mut self,
        key: (String, String),
        now: Instant,
        make: impl FnOnce() -> V,
        change: impl FnOnce(&mut V) -> T,
        weigh: impl Fn(&V) -> usize,
    ) -> (T, Vec<V>) {
        let share = self.identities.entry(key.0.clone()).or_default();
        let e = self.map.entry(key.clone()).or_insert_with(|| {
            share.entries += 1;
            Entry {
                value: make(),
                weight: 0,
                seen: now,
            }
        });
        e.seen = now;
        let out = change(&mut e.value);
        let weight = weigh(&e.value);
        share.bytes = share.bytes + weight - e.weight;
        self.bytes = self.bytes + weight - e.weight;
        e.weight = weight;
        let mut gone = Vec::new();
        while let Some(victim) = self.victim(&key) {
            gone.extend(self.remove(&victim));
        }
        (out, gone)
    }

    /// The entry to forget now, if any: never `keep`.
    fn victim(&self, keep: &(String, String)) -> Option<(String, String)> {
        let b = &self.bounds;
        let own = self.identities.get(&keep.0).copied().unwrap_or_default();
        let measure: fn(&Share) -> usize =
            if own.entries > b.identity_entries || own.bytes > b.identity_bytes {
                return self.oldest(keep, |who| who == keep.0);
            } else if self.map.len() > b.entries {
                |s| s.entries
            } else if self.bytes > b.bytes {
                |s| s.bytes
            } else {
                return None;
            };
        // The most any identity holds (the newcomer's own only if it holds more than the
        // entry kept); its own first, else the oldest entry of those that hold that much.
        let most = (self.identities.iter())
            .filter(|(who, s)| **who != keep.0 || s.entries > 1)
            .map(|(_, s)| measure(s))
            .max()?;
        if own.entries > 1 && measure(&own) == most {
            return self.oldest(keep, |who| who == keep.0);
        }
        let largest = |who: &str| (self.identities.get(who)).is_some_and(|s| measure(s) == most);
        self.oldest(keep, largest)
    }

    /// The entry heard from longest ago of the identities `of` takes, other than `keep`.
    fn oldest(
        &self,
        keep: &(String, String),
        of: impl Fn(&str) -> bool,
    ) -> Option<(String, String)> {
        (self.map.iter())
            .filter(|(k, _)| *k != keep && of(&k.0))
            .min_by_key(|(_, e)| e.seen)
            .map(|(k, _)| k.clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    const BOUNDS: Bounds = Bounds {
        entries: 10,
        bytes: 1000,
        identity_entries: 4,
        identity_bytes: 400,
    };

    fn put(s: &mut Shares<usize>, who: &str, id: usize, weight: usize, at: u64) {
        let t = Instant::now() + Duration::from_secs(at);
        s.change(
            (who.into(), id.to_string()),
            t,
            || weight,
            |v| *v = weight,
            |w| *w,
        );
    }

    fn held(s: &Shares<usize>, who: &str) -> usize {
        s.iter().filter(|(k, _)| k.0 == who).count()
    }

    /// One identity cycling ids holds its share, and forgets its own oldest for each new
    /// one; the others keep theirs.
    #[test]
    fn an_identity_over_its_share_makes_room_from_its_own() {
        let mut s = Shares::new(BOUNDS);
        put(&mut s, "pod-a", 0, 10, 0);
        put(&mut s, "pod-b", 0, 10, 1);
        for i in 0..100 {
            put(&mut s, "evil", i, 10, 2 + i as u64);
        }
        assert_eq!(held(&s, "evil"), BOUNDS.identity_entries);
        assert!(s.get(&("evil".into(), "99".into())).is_some());
        assert!(s.get(&("evil".into(), "95".into())).is_none());
        assert_eq!((held(&s, "pod-a"), held(&s, "pod-b")), (1, 1));
        // Its bytes' share too: 300-byte entries, 400 bytes a share.
        for i in 0..10 {
            put(&mut s, "big", i, 300, 200 + i as u64);
        }
        assert_eq!(held(&s, "big"), 1);
        assert_eq!((held(&s, "pod-a"), held(&s, "pod-b")), (1, 1));
    }

    /// A full map makes room from the identity that holds the most: never from one that
    /// holds one entry while the newcomer's identity holds one or more.
    #[test]
    fn a_full_map_makes_room_from_the_largest_identity() {
        let mut s = Shares::new(BOUNDS);
        for i in 0..BOUNDS.entries {
            put(&mut s, &format!("pod-{i}"), 0, 10, i as u64);
        }
        for i in 0..50 {
            put(&mut s, "evil", i, 10, 100 + i as u64);
        }
        assert_eq!(s.len(), BOUNDS.entries);
        assert_eq!(
            held(&s, "evil"),
            1,
            "it took one pod's room, then only its own"
        );
        assert_eq!(
            (0..BOUNDS.entries)
                .filter(|i| held(&s, &format!("pod-{i}")) == 1)
                .count(),
            9
        );
        assert!(
            s.get(&("pod-0".into(), "0".into())).is_none(),
            "the oldest pod went"
        );
        // Over the bytes: from the identity holding the most bytes, never the entry just
        // changed.
        put(&mut s, "pod-5", 0, 390, 300);
        put(&mut s, "pod-6", 0, 395, 301);
        assert_eq!(s.bytes(), 80 + 390 + 395);
        put(&mut s, "pod-7", 0, 390, 302);
        assert_eq!(s.bytes(), 70 + 390 + 390, "pod-6 went");
        assert_eq!(
            (held(&s, "pod-5"), held(&s, "pod-6"), held(&s, "pod-7")),
            (1, 0, 1)
        );
        assert_eq!(held(&s, "evil"), 1);
        s.remove(&("pod-7".into(), "0".into()));
        assert!(!s.identities.contains_key("pod-7"));
        assert_eq!(s.bytes(), 70 + 390);
    }
}
