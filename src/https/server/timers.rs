//! When the server must next act on a connection (`Timers`): each connection's deadline in
//! a heap (a deadline moved on leaves a stale timer behind, checked when it fires and
//! dropped when there are many), and, once a drain is asked for, the moment each
//! connection is let go (`Drain`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use crate::https::drain::Drain;

/// The server's timers.
pub(super) struct Timers {
    /// Deadlines and their connections' keys, the nearest first.
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The drain asked for, if any.
    draining: Option<Drain>,
}

impl Timers {
    pub fn new() -> Timers {
        Timers {
            heap: BinaryHeap::new(),
            draining: None,
        }
    }

    /// The nearest moment something is due.
    pub fn nearest(&self) -> Option<Instant> {
        let first = (self.heap.peek()).map(|Reverse((t, _))| *t);
        let drained = self.draining.as_ref().and_then(Drain::next);
        first.into_iter().chain(drained).min()
    }

    /// Sets a timer for `key` at `at`.
    pub fn set(&mut self, at: Instant, key: u64) {
        self.heap.push(Reverse((at, key)));
    }

    /// The next timer due by `now`, taken out.
    pub fn due(&mut self, now: Instant) -> Option<(Instant, u64)> {
        let Reverse((t, key)) = self.heap.peek().copied()?;
        if t > now {
            return None;
        }
        self.heap.pop();
        Some((t, key))
    }

    /// When there are many more timers than `open` connections (most of them stale),
    /// keeps only the `live` ones.
    pub fn prune(&mut self, open: usize, live: impl FnOnce() -> Vec<(Instant, u64)>) {
        if self.heap.len() > 4 * open + 1024 {
            self.heap = live().into_iter().map(Reverse).collect();
        }
    }

    pub fn draining(&self) -> bool {
        self.draining.is_some()
    }

    /// Lets every connection (`keys`) go at a moment of its own within `window`.
    pub fn drain(&mut self, window: Duration, keys: impl Iterator<Item = u64>, now: Instant) {
        let mut drain = Drain::new(now, window, crate::backoff::Rng::from_time());
        for key in keys {
            drain.schedule(key, now);
        }
        self.draining = Some(drain);
    }

    /// A connection come in while draining is let go too, in its turn.
    pub fn admitted(&mut self, key: u64, now: Instant) {
        if let Some(d) = &mut self.draining {
            d.schedule(key, now);
        }
    }

    /// The connections whose moment to be let go has come.
    pub fn drained(&mut self, now: Instant) -> Vec<u64> {
        (self.draining.as_mut())
            .map(|d| d.due(now))
            .unwrap_or_default()
    }
}
