//! A server that is stopping lets its clients go over a window, spread (Calico's Typha
//! spreads the connections it drops over its shutdown window): each connection open when
//! the drain starts, or accepted during it, is given a moment of its own in what is left of
//! the window, at which a parked request is answered, a stream ends, and the connection
//! closes after its answer. A fleet of followers that reconnect (through a Service, to
//! the servers still ready) then arrive spread over the window, not at one instant.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use crate::backoff::Rng;

/// A drain in progress.
pub struct Drain {
    ends: Instant,
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    rng: Rng,
}

impl Drain {
    /// A drain from `now`, over `window`.
    pub fn new(now: Instant, window: Duration, rng: Rng) -> Drain {
        Drain {
            ends: crate::backoff::after(now, window),
            due: BinaryHeap::new(),
            rng,
        }
    }

    /// Gives connection `key` a moment in what is left of the window.
    pub fn schedule(&mut self, key: u64, now: Instant) {
        let left = self.ends.saturating_duration_since(now);
        let at = now + left.mul_f64(self.rng.unit());
        self.due.push(Reverse((at, key)));
    }

    /// The next moment a connection is due, if any.
    pub fn next(&self) -> Option<Instant> {
        self.due.peek().map(|Reverse((t, _))| *t)
    }

    /// The connections due by `now`.
    pub fn due(&mut self, now: Instant) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(Reverse((t, key))) = self.due.peek().copied() {
            if t > now {
                break;
            }
            self.due.pop();
            out.push(key);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thousand connections let go over 10 s: every one within the window, spread (no
    /// second holds more than a fifth of them), in time order.
    #[test]
    fn connections_are_let_go_spread_over_the_window() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, Duration::from_secs(10), Rng::new(7));
        for key in 0..1000 {
            d.schedule(key, t0);
        }
        let mut per_second = [0usize; 10];
        let mut seen = 0;
        for s in 1..=10u64 {
            let got = d.due(t0 + Duration::from_secs(s));
            per_second[s as usize - 1] = got.len();
            seen += got.len();
        }
        assert_eq!(seen, 1000, "all within the window");
        assert!(per_second.iter().all(|n| *n < 200), "{per_second:?}");
        assert_eq!(d.next(), None);
        // One that comes late gets a moment in what is left.
        let late = t0 + Duration::from_secs(9);
        d.schedule(5000, late);
        assert!(d.next().is_some_and(|t| t >= late && t <= d.ends));
    }
}
