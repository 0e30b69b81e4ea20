//! What each client is served. Without a rollout, one complete poll (`Held`) for every
//! client. During rollouts (`rollout/`), clients are told apart by their cohort (a number
//! in [0, 1) made of their name: `rollout::steps::cohort`) and the hub serves several
//! views of one poll, cut at the steps' thresholds: a client is served the view of the
//! lowest cut above its cohort, or the top view (the versions that completed their
//! rollouts) when it is above every cut. The views share every object they do not tell
//! apart (`Arc`s of one poll).

use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use super::held::Held;

/// A client's cohort: where its name (`NAMESPACE/POD`, else its user name) falls in
/// [0, 1), the same on every hub and at every start. The first 8 bytes of SHA-256 of the
/// name, a big-endian u64, divided by 2^64 — rounded down to an f64's 53 bits, so that it
/// stays below 1 (`u64::MAX as f64` is 2^64 itself: that client would be in no step).
pub fn cohort(name: &str) -> f64 {
    fraction(prefix(name))
}

/// The first 8 bytes of SHA-256 of `name`, big-endian.
fn prefix(name: &str) -> u64 {
    let digest = Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// `x / 2^64`, rounded down to 53 bits: exact, and below 1.
fn fraction(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// A range of cohorts, `[lo, hi)`: whom a view, or a change between two, is for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Band {
    pub lo: f64,
    pub hi: f64,
}

impl Band {
    /// Every client.
    pub const ALL: Band = Band {
        lo: 0.0,
        hi: f64::INFINITY,
    };

    /// Whether a client of cohort `h` is in it.
    pub fn has(&self, h: f64) -> bool {
        h >= self.lo && h < self.hi
    }
}

/// The views of one poll.
#[derive(Clone, Debug)]
pub struct Views {
    /// What a client above every cut is served (every client, without rollouts).
    pub top: Arc<Held>,
    /// Ascending cuts, each with the view of the clients below it (and not below the
    /// cut before it).
    pub cuts: Vec<(f64, Arc<Held>)>,
}

impl Views {
    /// One view for every client.
    pub fn one(held: Arc<Held>) -> Views {
        Views {
            top: held,
            cuts: Vec::new(),
        }
    }

    /// The view of a client of cohort `h`, and its place: 0 the top, `i + 1` the view
    /// below `cuts[i]`.
    pub fn view(&self, h: f64) -> (usize, &Arc<Held>) {
        match self.cuts.iter().position(|(c, _)| h < *c) {
            Some(i) => (i + 1, &self.cuts[i].1),
            None => (0, &self.top),
        }
    }

    /// Each view with the cohorts it is for, from the lowest.
    pub fn bands(&self) -> Vec<(Band, &Arc<Held>)> {
        let mut lo = 0.0;
        let mut out = Vec::with_capacity(self.cuts.len() + 1);
        for (c, v) in &self.cuts {
            out.push((Band { lo, hi: *c }, v));
            lo = *c;
        }
        out.push((
            Band {
                lo,
                hi: f64::INFINITY,
            },
            &self.top,
        ));
        out
    }

    /// Every cut of `self` and `other`, ascending, once each: the bands in which neither
    /// changes its view.
    pub fn joint_cuts(&self, other: &Views) -> Vec<f64> {
        let mut cuts: Vec<f64> = (self.cuts.iter().chain(&other.cuts))
            .map(|(c, _)| *c)
            .collect();
        cuts.sort_by(f64::total_cmp);
        cuts.dedup();
        cuts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Resources;

    fn held() -> Arc<Held> {
        Arc::new(Held::empty(Resources::default()))
    }

    #[test]
    fn a_client_is_served_the_view_of_the_lowest_cut_above_it() {
        let (a, b, top) = (held(), held(), held());
        let v = Views {
            top: top.clone(),
            cuts: vec![(0.01, a.clone()), (0.5, b.clone())],
        };
        assert!(Arc::ptr_eq(v.view(0.0).1, &a));
        assert_eq!(v.view(0.0).0, 1);
        assert!(Arc::ptr_eq(v.view(0.0099).1, &a));
        assert!(Arc::ptr_eq(v.view(0.01).1, &b));
        assert_eq!(v.view(0.49).0, 2);
        assert!(Arc::ptr_eq(v.view(0.5).1, &top));
        assert_eq!(v.view(0.999).0, 0);
        let bands = v.bands();
        assert_eq!(bands.len(), 3);
        assert_eq!(bands[0].0, Band { lo: 0.0, hi: 0.01 });
        assert_eq!(bands[1].0, Band { lo: 0.01, hi: 0.5 });
        assert!(bands[2].0.has(0.5) && bands[2].0.has(0.9999) && !bands[2].0.has(0.4));
        let one = Views::one(top.clone());
        assert_eq!(one.view(0.3).0, 0);
        assert_eq!(one.bands().len(), 1);
        assert_eq!(one.bands()[0].0, Band::ALL);
        assert_eq!(v.joint_cuts(&one), vec![0.01, 0.5]);
    }

    /// The cohort of a name, fixed: `printf %s monitoring/alloy-x7k2p | sha256sum` is
    /// 228c5fe791e6dbfd3c89…, and
    /// `printf %s system:serviceaccount:monitoring:alloy | sha256sum` is 7218bb533f59bfa5….
    #[test]
    fn cohort_is_the_hash_prefix_over_2_64() {
        assert_eq!(prefix("monitoring/alloy-x7k2p"), 0x228c_5fe7_91e6_dbfd);
        assert_eq!(cohort("monitoring/alloy-x7k2p"), 0.1349544468265792);
        assert_eq!(
            prefix("system:serviceaccount:monitoring:alloy"),
            0x7218_bb53_3f59_bfa5
        );
        assert_eq!(
            cohort("system:serviceaccount:monitoring:alloy"),
            0.44568987638863333
        );
        // printf %s '' | sha256sum: e3b0c44298fc1c14…
        assert_eq!(prefix(""), 0xe3b0_c442_98fc_1c14);
        let exact = 0x228c_5fe7_91e6_dbfd_u64 as f64 / 2f64.powi(64);
        assert!((cohort("monitoring/alloy-x7k2p") - exact).abs() < 1e-15);
    }

    #[test]
    fn cohorts_stay_in_zero_to_one() {
        assert_eq!(fraction(0), 0.0);
        assert_eq!(fraction(1 << 63), 0.5);
        assert!(fraction(u64::MAX) < 1.0, "not rounded up to 1");
        assert!(fraction(u64::MAX - 1) < 1.0);
        for i in 0..1000 {
            let h = cohort(&format!("ns/pod-{i}"));
            assert!((0.0..1.0).contains(&h), "{h}");
        }
    }
}
