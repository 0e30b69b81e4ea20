//! What other threads hold of a running server (`Handle`): they notify it (every parked
//! request asked again, every stream pulled), ask it to drain, stop it, each waking its
//! loop; and what the loop reads of what they asked (`Shared`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::https::lanes::Results;
use crate::locks::Recover;

/// A running server: notifies parked requests and streams, drains it, stops it.
#[derive(Clone)]
pub struct Handle(Arc<Shared>);

/// What the server's loop reads of what its handles asked.
pub(super) struct Shared {
    stop: AtomicBool,
    /// A drain asked for (`Handle::drain`), over this window.
    drain: std::sync::Mutex<Option<Duration>>,
    /// Bumped by `notify`.
    generation: AtomicU64,
    results: Arc<Results>,
}

impl Shared {
    pub fn new(results: Arc<Results>) -> Arc<Shared> {
        Arc::new(Shared {
            stop: AtomicBool::new(false),
            drain: std::sync::Mutex::new(None),
            generation: AtomicU64::new(0),
            results,
        })
    }

    /// `Handle::stop` was called.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The wake fd and the workers' answers.
    pub fn results(&self) -> &Results {
        &self.results
    }

    /// The drain asked for since the last look, over this window.
    pub fn drain_asked(&self) -> Option<Duration> {
        (self.drain.lock())
            .map(|mut d| d.take())
            .unwrap_or_default()
    }

    /// Bumped by each `Handle::notify`.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

impl Handle {
    pub(super) fn new(shared: Arc<Shared>) -> Handle {
        Handle(shared)
    }

    /// Asks every parked request again (`Wake::Notified`) and pulls every stream.
    pub fn notify(&self) {
        self.0.generation.fetch_add(1, Ordering::SeqCst);
        self.0.results.poke();
    }

    /// Lets every client go over `window`, spread (`drain.rs`): from now on each answer
    /// closes its connection, and each connection, open or yet to come, is let go at a
    /// moment of its own within the window. The server serves on until `stop`.
    pub fn drain(&self, window: Duration) {
        *self.0.drain.lock().recover() = Some(window);
        self.0.results.poke();
    }

    /// Stops the server: its loop ends and every connection closes.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        self.0.results.poke();
    }
}
