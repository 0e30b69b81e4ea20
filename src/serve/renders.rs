//! Whole lists as the hub rendered them, kept for the next client that asks the same:
//! a fleet asking one list costs one render (and one gzip), however many ask.
//!
//! A render is kept by the list's shape — its kind and namespace, its selectors in their
//! canonical form (two spellings of one selector are one list), its form, and the
//! versions of what it read (`listed` and `changed`: a list of the same versions holds the
//! same objects, so a render outlives a poll that changed nothing). What the renders keep
//! alive is bounded in bytes and in number, the least recently asked going first (the
//! newest render always stays): a client choosing a new selector for each request makes
//! the hub render for it, not hold more (issue 56.4: 64 renders of a 4 MB list, dropped
//! only at the next poll, once pinned 256 MB).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::request::Form;
use crate::https::http::Body;
use crate::locks::Recover;
use crate::source::Resource;

/// Renders kept at most, and the bytes they may keep alive (plain and gzipped).
pub const MAX_RENDERS: usize = 64;
pub const MAX_BYTES: usize = 64 << 20;

/// A whole list as rendered: its JSON, gzipped when large, and how many items it holds.
pub struct Rendered {
    pub plain: Body,
    pub gzip: Option<Body>,
    pub items: usize,
}

impl Rendered {
    fn bytes(&self) -> usize {
        self.plain.len() + self.gzip.as_ref().map_or(0, |g| g.len())
    }
}

/// What a whole list is, for its render.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub target: (Resource, Option<String>),
    /// The selectors, canonical.
    pub labels: String,
    pub fields: String,
    pub form: Form,
    /// The versions of what it read: `listed` (the list's own), `changed`.
    pub versions: (u64, u64),
    /// Which view of the poll (`views.rs`; 0: the top): during a rollout, a list differs
    /// by the client's cohort.
    pub view: usize,
}

/// The renders kept.
#[derive(Default)]
pub struct Renders(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    bodies: HashMap<Shape, (Arc<Rendered>, u64)>,
    bytes: usize,
    /// Bumped at each use: what was asked last is kept longest.
    clock: u64,
    /// Renders kept since the start.
    made: u64,
}

impl Renders {
    /// The render of `shape`, if kept.
    pub fn get(&self, shape: &Shape) -> Option<Arc<Rendered>> {
        let mut k = self.0.lock().recover();
        k.clock += 1;
        let now = k.clock;
        let (r, used) = k.bodies.get_mut(shape)?;
        *used = now;
        Some(r.clone())
    }

    /// Keeps `rendered` as `shape`'s, letting the least recently asked go while the
    /// renders are over their bounds (never the one just kept).
    pub fn put(&self, shape: Shape, rendered: Arc<Rendered>) {
        let mut k = self.0.lock().recover();
        k.clock += 1;
        let now = k.clock;
        k.made += 1;
        k.bytes += rendered.bytes();
        if let Some((old, _)) = k.bodies.insert(shape.clone(), (rendered, now)) {
            k.bytes = k.bytes.saturating_sub(old.bytes());
        }
        while k.bytes > MAX_BYTES || k.bodies.len() > MAX_RENDERS {
            let oldest = (k.bodies.iter())
                .filter(|(s, _)| **s != shape)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(s, _)| s.clone());
            let Some(gone) = oldest.and_then(|s| k.bodies.remove(&s)) else {
                break;
            };
            k.bytes = k.bytes.saturating_sub(gone.0.bytes());
        }
    }

    /// (renders, bytes) kept.
    pub fn size(&self) -> (usize, usize) {
        let k = self.0.lock().recover();
        (k.bodies.len(), k.bytes)
    }

    /// Renders kept since the start.
    pub fn made(&self) -> u64 {
        (self.0.lock().recover()).made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(labels: &str, listed: u64) -> Shape {
        Shape {
            target: (Resource::ConfigMaps, None),
            labels: labels.into(),
            fields: String::new(),
            form: Form::Full,
            versions: (listed, listed),
            view: 0,
        }
    }

    fn rendered(size: usize) -> Arc<Rendered> {
        Arc::new(Rendered {
            plain: vec![b'x'; size].into(),
            gzip: None,
            items: 1,
        })
    }

    #[test]
    fn renders_are_bounded_in_bytes_and_number_the_least_recently_asked_going_first() {
        let r = Renders::default();
        let big = MAX_BYTES / 4 + 1;
        for i in 0..4 {
            r.put(shape(&format!("x!={i}"), 1), rendered(big));
        }
        // The fourth would pass the bound: the first went.
        assert_eq!(r.size().0, 3);
        assert!(r.size().1 <= MAX_BYTES);
        assert!(r.get(&shape("x!=0", 1)).is_none());
        // Asked again, the second is kept when the next comes; the third goes.
        assert!(r.get(&shape("x!=1", 1)).is_some());
        r.put(shape("x!=4", 1), rendered(big));
        assert!(r.get(&shape("x!=1", 1)).is_some());
        assert!(r.get(&shape("x!=2", 1)).is_none());
        // Many small ones: no more than MAX_RENDERS.
        for i in 0..(2 * MAX_RENDERS) {
            r.put(shape(&format!("y={i}"), 2), rendered(10));
        }
        assert_eq!(r.size().0, MAX_RENDERS);
        // One larger than the bound alone is kept (the newest always is).
        r.put(shape("z", 3), rendered(MAX_BYTES + 1));
        assert!(r.get(&shape("z", 3)).is_some());
        assert_eq!(r.size().0, 1);
        // The same shape again replaces it, counted once.
        r.put(shape("z", 3), rendered(10));
        assert_eq!(r.size(), (1, 10));
    }
}
