//! What the hub keeps of its reviews, and what bounds how many it makes: `Cache`, a
//! bounded map whose entries expire (the closest to expiring goes first when it is full of
//! live ones), and `Budget`, a token bucket (a rate and a burst) that the reviews of tokens
//! nobody knows yet draw on, so that unauthenticated traffic costs the apiserver a bounded
//! rate of TokenReviews whatever its volume (and, apart, the reviews of tokens whose kept
//! review expired).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A bounded map whose entries expire.
pub struct Cache<K, V> {
    map: HashMap<K, (V, Instant)>,
    max: usize,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Cache<K, V> {
    pub fn new(max: usize) -> Self {
        Cache {
            map: HashMap::new(),
            max,
        }
    }

    pub fn get(&self, k: &K, now: Instant) -> Option<V> {
        self.map
            .get(k)
            .filter(|(_, until)| *until > now)
            .map(|(v, _)| v.clone())
    }

    pub fn put(&mut self, k: K, v: V, until: Instant, now: Instant) {
        if self.map.len() >= self.max && !self.map.contains_key(&k) {
            self.map.retain(|_, (_, u)| *u > now);
            if self.map.len() >= self.max {
                // Still full of live entries: the one closest to expiring goes.
                let first = (self.map.iter())
                    .min_by_key(|(_, (_, u))| *u)
                    .map(|(k, _)| k.clone());
                if let Some(first) = first {
                    self.map.remove(&first);
                }
            }
        }
        self.map.insert(k, (v, until));
    }

    /// Whether `k` is held, live or expired (an expired entry stays until room is needed).
    pub fn had(&self, k: &K) -> bool {
        self.map.contains_key(k)
    }

    pub fn remove(&mut self, k: &K) {
        self.map.remove(k);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// A token bucket: `rate` a second, at most `burst` at once.
#[derive(Debug)]
pub struct Budget {
    rate: f64,
    burst: f64,
    left: f64,
    at: Instant,
}

impl Budget {
    pub fn new(rate: f64, burst: f64, now: Instant) -> Budget {
        Budget {
            rate,
            burst,
            left: burst,
            at: now,
        }
    }

    /// Takes one if there is one; otherwise how long until there is.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let since = now.saturating_duration_since(self.at).as_secs_f64();
        self.left = (self.left + since * self.rate).min(self.burst);
        self.at = now;
        if self.left >= 1.0 {
            self.left -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - self.left) / self.rate.max(f64::MIN_POSITIVE);
        Err(Duration::try_from_secs_f64(wait).unwrap_or(Duration::from_secs(1)))
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
            c.put(i, i, now + Duration::from_secs(60 + u64::from(i)), now);
        }
        assert_eq!(c.len(), 1000);
        assert_eq!(c.get(&0, now), None, "the nearest to expiring went first");
        assert_eq!(c.get(&1099, now), Some(1099));
        assert_eq!(c.get(&200, now + Duration::from_secs(400)), None, "expired");
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
}
