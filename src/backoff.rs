//! Waiting: one exponential backoff for everything that retries — polls, agent restarts,
//! reload calls.
//!
//! Every wait is `base × (1 + random in [0, jitter))`. After each failure the base doubles,
//! from `initial` up to `max`; a floor (the apiserver's `Retry-After`) raises one wait, but
//! never past `max`; a success starts over. A hub that turns a follower away to admit it
//! later (its 429 with `Retry-After`) is `told`: that wait, and no failure counted. Polls wait `interval` between successes and back
//! off from the interval to min(10 × interval, 5 min) (`Backoff::polls`), with jitter so a
//! fleet started together does not poll in lock-step; the agent and reload URLs back off from
//! 1 s to 30 s. All arithmetic saturates: no interval or `Retry-After` can overflow the clock.

use std::time::{Duration, Instant};

/// The longest base wait after failures: min(10 × interval, 5 min), but never below the
/// interval itself.
pub fn cap(interval: Duration) -> Duration {
    interval
        .saturating_mul(10)
        .min(Duration::from_secs(300))
        .max(interval)
}

/// The longest wait anything in cmpoll schedules: far enough to mean "not soon", near
/// enough that adding it to the clock can never overflow.
pub const MAX_WAIT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `now + wait`, saturating at `MAX_WAIT`.
pub fn after(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait.min(MAX_WAIT)).unwrap_or(now)
}

/// A small, seedable PRNG (SplitMix64): enough for jitter, not for secrets.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Seeded from the clock and the process id.
    pub fn from_time() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng(nanos ^ (u64::from(std::process::id()) << 32))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    jitter: f64,
    failures: u32,
    rng: Rng,
}

impl Backoff {
    /// From `initial`, doubling up to `max`, each wait spread by up to `jitter` of itself.
    pub fn new(initial: Duration, max: Duration, jitter: f64, rng: Rng) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            jitter,
            failures: 0,
            rng,
        }
    }

    /// Polls: `interval` after a success, from it to `cap(interval)` after failures.
    pub fn polls(interval: Duration, jitter: f64, rng: Rng) -> Backoff {
        Backoff::new(interval, cap(interval), jitter, rng)
    }

    /// The longest base wait.
    #[cfg(test)]
    pub fn cap(&self) -> Duration {
        self.max
    }

    fn jittered(&mut self, base: Duration) -> Duration {
        let factor = 1.0 + self.jitter * self.rng.unit();
        Duration::try_from_secs_f64(base.as_secs_f64() * factor)
            .unwrap_or(MAX_WAIT)
            .min(MAX_WAIT)
    }

    /// The wait after a success (and the failure count starts over).
    pub fn after_success(&mut self) -> Duration {
        self.failures = 0;
        self.jittered(self.initial)
    }

    /// The wait after a failure; `floor` (an apiserver's `Retry-After`) raises it, capped at
    /// `max` like the backoff itself: an apiserver cannot push the next poll further out
    /// than failures alone would.
    pub fn after_failure(&mut self, floor: Option<Duration>) -> Duration {
        let doublings = self.failures.min(16);
        self.failures = self.failures.saturating_add(1);
        let base = self.initial.saturating_mul(1u32 << doublings).min(self.max);
        let wait = self.jittered(base);
        wait.max(floor.unwrap_or_default().min(self.max))
    }

    /// Starts over, without a wait (the agent ran long enough to count as stable).
    /// After a failure, anywhere within `spread` doubled for each failure before it in a
    /// row (at least `floor`, never beyond the cap; "full jitter"): for many clients that
    /// all lost one server at the same instant, and come back spread out, soon after it
    /// does.
    pub fn after_failure_spread(&mut self, floor: Option<Duration>, spread: Duration) -> Duration {
        let doublings = self.failures.min(16);
        self.failures = self.failures.saturating_add(1);
        let spread = spread.saturating_mul(1u32 << doublings).min(self.max);
        let wait =
            Duration::try_from_secs_f64(spread.as_secs_f64() * self.rng.unit()).unwrap_or(spread);
        wait.max(floor.unwrap_or_default().min(self.max))
    }

    /// The wait a server asked for when it turned a request away to admit it later (a
    /// hub's 429 with `Retry-After`): `after` (never beyond the cap) and up to a second
    /// more at random, so that those told the same second do not all come back at its
    /// start. Not a failure: the waits after failures go on from where they were.
    pub fn told(&mut self, after: Duration) -> Duration {
        let more = Duration::from_secs_f64(self.rng.unit());
        after.min(self.max).saturating_add(more)
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn doubles_from_the_interval_up_to_the_cap_and_resets() {
        let mut b = Backoff::polls(secs(1.0), 0.0, Rng::new(1));
        let waits: Vec<Duration> = (0..6).map(|_| b.after_failure(None)).collect();
        assert_eq!(
            waits,
            [
                secs(1.0),
                secs(2.0),
                secs(4.0),
                secs(8.0),
                secs(10.0),
                secs(10.0)
            ]
        );
        assert_eq!(b.after_success(), secs(1.0));
        assert_eq!(b.after_failure(None), secs(1.0), "reset by a success");
    }

    #[test]
    fn the_cap_is_at_most_five_minutes() {
        let b = Backoff::polls(secs(60.0), 0.1, Rng::new(1));
        assert_eq!(b.cap(), secs(300.0));
        let b = Backoff::polls(secs(0.05), 0.1, Rng::new(1));
        assert_eq!(b.cap(), secs(0.5));
        let b = Backoff::polls(secs(600.0), 0.1, Rng::new(1));
        assert_eq!(b.cap(), secs(600.0), "never below the interval");
    }

    #[test]
    fn restarts_and_retries_back_off_from_one_to_thirty_seconds() {
        let mut b = Backoff::new(secs(1.0), secs(30.0), 0.0, Rng::new(1));
        let waits: Vec<f64> = (0..7)
            .map(|_| b.after_failure(None).as_secs_f64())
            .collect();
        assert_eq!(waits, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]);
        b.reset();
        assert_eq!(b.after_failure(None), secs(1.0));
    }

    #[test]
    fn retry_after_is_a_floor() {
        let mut b = Backoff::polls(secs(1.0), 0.0, Rng::new(1));
        assert_eq!(b.after_failure(Some(secs(7.0))), secs(7.0));
        assert_eq!(b.after_failure(Some(secs(0.5))), secs(2.0));
    }

    #[test]
    fn retry_after_and_huge_intervals_are_capped_never_overflow() {
        let mut b = Backoff::polls(secs(1.0), 0.1, Rng::new(1));
        for huge in [
            Duration::from_secs(999_999_999),
            Duration::from_secs(u64::MAX),
        ] {
            let w = b.after_failure(Some(huge));
            assert!(
                w <= secs(11.0),
                "{w:?}: capped at min(10 × interval, 5 min)"
            );
        }
        let mut b = Backoff::polls(Duration::from_secs(u64::MAX), 0.5, Rng::new(1));
        assert!(b.after_failure(None) <= MAX_WAIT);
        assert!(b.after_success() <= MAX_WAIT);
        assert_eq!(
            cap(Duration::from_secs(u64::MAX)),
            Duration::from_secs(u64::MAX)
        );
        let now = Instant::now();
        assert!(after(now, Duration::from_secs(u64::MAX)) > now);
    }

    #[test]
    fn jitter_stays_within_the_fraction_and_varies() {
        let mut b = Backoff::polls(secs(10.0), 0.1, Rng::new(42));
        let waits: Vec<Duration> = (0..200).map(|_| b.after_success()).collect();
        assert!(waits.iter().all(|w| *w >= secs(10.0) && *w < secs(11.0)));
        let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
        assert!(distinct.len() > 150, "not lock-step");
        let mut r = Rng::new(7);
        assert!((0..1000).map(|_| r.unit()).all(|u| (0.0..1.0).contains(&u)));
    }

    /// Followers that lost their hub together spread each try over the span, doubled for
    /// each failure in a row (not all at its start), never below Retry-After, never past
    /// the cap.
    #[test]
    fn failures_are_spread_over_a_doubling_span() {
        let span = Duration::from_secs(10);
        let mut firsts = Vec::new();
        for seed in 0..200 {
            let mut b = Backoff::polls(Duration::from_secs(30), 0.1, Rng::new(seed));
            let first = b.after_failure_spread(None, span);
            assert!(first <= span, "{first:?}");
            firsts.push(first);
            let second = b.after_failure_spread(None, span);
            assert!(second <= span * 2, "{second:?}");
            for _ in 0..10 {
                assert!(b.after_failure_spread(None, span) <= b.cap());
            }
        }
        let early = firsts
            .iter()
            .filter(|d| **d < Duration::from_secs(5))
            .count();
        assert!(
            (60..140).contains(&early),
            "{early} of 200 in the first half"
        );
        let mut b = Backoff::polls(Duration::from_secs(30), 0.1, Rng::new(1));
        let floored = b.after_failure_spread(Some(Duration::from_secs(9)), span);
        assert!(floored >= Duration::from_secs(9), "{floored:?}");
    }

    /// Issue 56.8: a hub's "come back in N s" is waited N s and up to a second more, the
    /// failures before it neither reset nor doubled, and never beyond the cap.
    #[test]
    fn a_hubs_retry_after_is_waited_as_told_without_a_failure() {
        let mut b = Backoff::polls(secs(30.0), 0.1, Rng::new(7));
        let first = b.after_failure(None);
        assert!(first >= secs(30.0) && first < secs(33.0), "{first:?}");
        let waits: Vec<Duration> = (0..200).map(|_| b.told(secs(2.0))).collect();
        assert!(waits.iter().all(|w| *w >= secs(2.0) && *w < secs(3.0)));
        let spread = waits
            .iter()
            .max()
            .unwrap()
            .saturating_sub(*waits.iter().min().unwrap());
        assert!(spread > secs(0.8), "spread over the second: {spread:?}");
        let second = b.after_failure(None);
        assert!(
            second >= secs(60.0),
            "the next failure doubles from the first: {second:?}"
        );
        assert!(b.told(secs(1e6)) <= b.cap() + secs(1.0), "capped");
    }
}
