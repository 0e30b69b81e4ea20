//! Taking a lock whose last holder panicked: every lock of cmpoll is taken through
//! `Recover::recover`, which goes on with the data as the holder left it.
//!
//! Why that is safe here: a panic is a bug, caught where a request or a review runs
//! (`https::server`, `https::lanes`) so that one bad request does not take the hub or the
//! webhook down; the data behind each lock is a cache, a counter, a queue or a snapshot
//! written whole under the lock (never half a value a reader could trust), so the next
//! holder finds a state it already handles. Refusing the lock instead would turn one
//! request's bug into every later request's failure.

use std::sync::{LockResult, PoisonError};

/// `.recover()` on what `lock`, `read`, `write` or a condvar's `wait` returns.
pub trait Recover<G> {
    /// The guard, poisoned or not.
    fn recover(self) -> G;
}

impl<G> Recover<G> for LockResult<G> {
    fn recover(self) -> G {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_lock_whose_holder_panicked_is_taken_as_left() {
        let m = Arc::new(Mutex::new(1));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = held.lock().recover();
            *g = 2;
            panic!("a bug while holding it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.lock().recover(), 2);
    }
}
