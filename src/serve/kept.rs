//! What the hub keeps of its reviews, and what bounds how many it makes: `Cache`, a
//! bounded map whose entries expire (the closest to expiring goes first when it is full of
//! live ones); `Budget`, a token bucket (a rate and a burst) that reviews not kept draw on,
//! so that what clients send costs the apiserver a bounded rate of reviews whatever its
//! volume, and that tells each caller it refuses a moment of its own to come back (its
//! `Retry-After`), so that a crowd refused at once comes back spread at the budget's rate,
//! not together; and `Budgets`, one budget per key (a user's access reviews), bounded.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// A bounded map whose entries expire. Kept in order of expiry too, so that making room
/// costs a lookup, not a scan: a cache full of live entries is met on every miss of a
/// busy hub, under a lock its loop takes for every request.
pub struct Cache<K, V> {
    map: HashMap<K, (V, Instant, u64)>,
    /// Each entry by (expiry, the order it was put in).
    order: BTreeMap<(Instant, u64), K>,
    next: u64,
    max: usize,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Cache<K, V> {
    pub fn new(max: usize) -> Self {
        Cache {
            map: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            max,
        }
    }

    pub fn get(&self, k: &K, now: Instant) -> Option<V> {
        self.map
            .get(k)
            .filter(|(_, until, _)| *until > now)
            .map(|(v, _, _)| v.clone())
    }

    pub fn put(&mut self, k: K, v: V, until: Instant) {
        self.remove(&k);
        while self.map.len() >= self.max.max(1) {
            // The first to expire goes: an expired one if any, else the closest to it.
            let Some((_, first)) = self.order.pop_first() else {
                break;
            };
            self.map.remove(&first);
        }
        let n = self.next;
        self.next += 1;
        self.order.insert((until, n), k.clone());
        self.map.insert(k, (v, until, n));
    }

    /// Whether `k` is held, live or expired (an expired entry stays until room is needed).
    pub fn had(&self, k: &K) -> bool {
        self.map.contains_key(k)
    }

    pub fn remove(&mut self, k: &K) {
        if let Some((_, until, n)) = self.map.remove(k) {
            self.order.remove(&(until, n));
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// The furthest a refused caller is told to come back: beyond it, every caller is told
/// this (a flood's callers, who would otherwise be promised hours).
pub const MAX_PROMISE: Duration = Duration::from_secs(30);

/// A token bucket: `rate` a second, at most `burst` at once. A caller it refuses is
/// promised a moment of its own: the first the next token, each next one `1 / rate`
/// later (up to `MAX_PROMISE` ahead), so that refused callers who come back when told
/// find a token each, about, rather than all coming back at the next second.
#[derive(Debug, Clone)]
pub struct Budget {
    rate: f64,
    burst: f64,
    left: f64,
    at: Instant,
    /// The moment promised to the next caller refused.
    promised: Instant,
}

impl Budget {
    pub fn new(rate: f64, burst: f64, now: Instant) -> Budget {
        Budget {
            rate,
            burst,
            left: burst,
            at: now,
            promised: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let since = now.saturating_duration_since(self.at).as_secs_f64();
        self.left = (self.left + since * self.rate).min(self.burst);
        self.at = self.at.max(now);
    }

    /// Takes one if there is one; otherwise how long the caller is to wait.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.left >= 1.0 {
            self.left -= 1.0;
            return Ok(());
        }
        let rate = self.rate.max(f64::MIN_POSITIVE);
        let next = secs((1.0 - self.left) / rate);
        let slot = self.promised.max(crate::backoff::after(now, next));
        let horizon = crate::backoff::after(now, MAX_PROMISE);
        let slot = slot.min(horizon);
        self.promised = crate::backoff::after(slot, secs(1.0 / rate)).min(horizon);
        Err(slot.saturating_duration_since(now))
    }

    /// Gives back one taken (what it was taken for was not done).
    pub fn refund(&mut self) {
        self.left = (self.left + 1.0).min(self.burst);
    }

    /// Whether it is full again at `now` (as good as a new one).
    fn full(&self, now: Instant) -> bool {
        let since = now.saturating_duration_since(self.at).as_secs_f64();
        self.left + since * self.rate >= self.burst
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(MAX_PROMISE)
}

/// A budget per key, each `rate` a second and `burst` at once, for at most `max` keys: a
/// key whose budget is full again is forgotten first (a new one is the same), then the
/// one idle longest.
pub struct Budgets<K> {
    map: HashMap<K, Budget>,
    rate: f64,
    burst: f64,
    max: usize,
}

impl<K: std::hash::Hash + Eq + Clone> Budgets<K> {
    pub fn new(rate: f64, burst: f64, max: usize) -> Self {
        Budgets {
            map: HashMap::new(),
            rate,
            burst,
            max,
        }
    }

    /// Takes one from `key`'s budget (`Budget::take`).
    pub fn take(&mut self, key: &K, now: Instant) -> Result<(), Duration> {
        if !self.map.contains_key(key) && self.map.len() >= self.max {
            self.map.retain(|_, b| !b.full(now));
            if self.map.len() >= self.max {
                let idle = (self.map.iter())
                    .min_by_key(|(_, b)| b.at)
                    .map(|(k, _)| k.clone());
                if let Some(idle) = idle {
                    self.map.remove(&idle);
                }
            }
        }
        (self.map.entry(key.clone()))
            .or_insert_with(|| Budget::new(self.rate, self.burst, now))
            .take(now)
    }

    /// Gives back one taken from `key`'s budget.
    pub fn refund(&mut self, key: &K) {
        if let Some(b) = self.map.get_mut(key) {
            b.refund();
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_are_bounded() {
        let mut c: Cache<u32, u32> = Cache::new(1000);
        let now = Instant::now();
        for i in 0..1100u32 {
            c.put(i, i, now + Duration::from_secs(60 + u64::from(i)));
        }
        assert_eq!(c.len(), 1000);
        assert_eq!(c.get(&0, now), None, "the nearest to expiring went first");
        assert_eq!(c.get(&1099, now), Some(1099));
        assert_eq!(c.get(&200, now + Duration::from_secs(400)), None, "expired");
    }

    #[test]
    fn a_full_cache_lets_the_first_to_expire_go_whatever_the_order_of_puts() {
        let mut c: Cache<u32, u32> = Cache::new(3);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        c.put(1, 1, at(30));
        c.put(2, 2, at(10));
        c.put(3, 3, at(20));
        // Put again: its old expiry is forgotten, not left behind in the order.
        c.put(2, 2, at(40));
        assert_eq!((c.len(), c.order.len()), (3, 3));
        c.put(4, 4, at(50));
        assert!(!c.had(&3), "20 s, the first to expire");
        assert!(c.had(&2) && c.had(&1) && c.had(&4));
        // An expired entry stays until room is needed, then goes before any live one.
        assert_eq!(c.get(&1, at(35)), None);
        assert!(c.had(&1));
        c.put(5, 5, at(60));
        assert!(!c.had(&1) && c.had(&2));
        c.remove(&2);
        assert_eq!((c.len(), c.order.len()), (2, 2));
    }

    #[test]
    fn a_budget_gives_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = Budget::new(10.0, 5.0, t0);
        for _ in 0..5 {
            b.take(t0).unwrap();
        }
        let wait = b.take(t0).unwrap_err();
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        // A second later: ten more, not fifteen (the burst caps what it saved).
        let t1 = t0 + Duration::from_secs(1);
        let taken = (0..20).filter(|_| b.take(t1).is_ok()).count();
        assert_eq!(taken, 5);
        let t2 = t1 + Duration::from_millis(500);
        let taken = (0..20).filter(|_| b.take(t2).is_ok()).count();
        assert_eq!(taken, 5);
    }

    /// Issue 56.8: a crowd refused at once is told to come back spread at the budget's
    /// rate, each caller a moment of its own, never further than `MAX_PROMISE`; those
    /// who come back when told find the budget refilled for them.
    #[test]
    fn refused_callers_are_told_moments_of_their_own() {
        let t0 = Instant::now();
        let mut b = Budget::new(100.0, 1.0, t0);
        b.take(t0).unwrap();
        let waits: Vec<Duration> = (0..500).map(|_| b.take(t0).unwrap_err()).collect();
        for (i, w) in waits.iter().enumerate() {
            let want = (i + 1) as f64 / 100.0;
            assert!(
                (w.as_secs_f64() - want).abs() < 1e-6,
                "caller {i}: {w:?}, not {want}"
            );
        }
        // Coming back as told, each finds a token (the budget refilled by then).
        let mut b = Budget::new(10.0, 1.0, t0);
        b.take(t0).unwrap();
        let told: Vec<Duration> = (0..20).map(|_| b.take(t0).unwrap_err()).collect();
        for w in told {
            assert!(b.take(t0 + w).is_ok(), "{w:?}");
        }
        // A flood is told MAX_PROMISE at most, and the clock never runs away.
        let mut b = Budget::new(1.0, 1.0, t0);
        b.take(t0).unwrap();
        let last = (0..10_000).map(|_| b.take(t0).unwrap_err()).last().unwrap();
        assert_eq!(last, MAX_PROMISE);
        let later = t0 + MAX_PROMISE + Duration::from_secs(1);
        assert!(b.take(later).is_ok(), "refilled, whatever was promised");
        assert!(b.take(later).unwrap_err() <= Duration::from_secs(1));
    }

    #[test]
    fn a_budget_per_key_is_its_own_and_bounded() {
        let t0 = Instant::now();
        let mut b: Budgets<u32> = Budgets::new(1.0, 2.0, 3);
        assert!(b.take(&1, t0).is_ok());
        assert!(b.take(&1, t0).is_ok());
        assert!(b.take(&1, t0).is_err(), "1 used its own");
        assert!(b.take(&2, t0).is_ok(), "2 has its own");
        b.refund(&1);
        assert!(b.take(&1, t0).is_ok(), "given back");
        // Full: the one whose budget is full again goes first, then the idlest.
        assert!(b.take(&3, t0).is_ok());
        let t1 = t0 + Duration::from_millis(1500);
        assert!(b.take(&4, t1).is_ok());
        assert_eq!(b.len(), 2, "2 and 3 were full again: forgotten");
        assert!(b.take(&1, t1).is_ok(), "1 still has what it saved");
        assert!(b.take(&1, t1).is_err(), "and no more: it was kept");
        // None full again: the idlest goes.
        let mut b: Budgets<u32> = Budgets::new(1.0, 2.0, 2);
        let at = |ms| t0 + Duration::from_millis(ms);
        for (k, ms) in [(1, 0), (1, 0), (2, 100), (2, 100)] {
            b.take(&k, at(ms)).unwrap();
        }
        b.take(&3, at(500)).unwrap();
        assert!(b.take(&2, at(500)).is_err(), "2 kept, its budget used");
        assert_eq!(b.len(), 2);
    }
}
