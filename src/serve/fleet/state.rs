//! What a hub keeps of its followers (`Fleet`): per follower — named by its token's pod
//! name, else its user name (`follower_name`) — what it last reported it holds, when it
//! was last heard from and its wait; per served object, since when the hub serves its
//! version (what "behind" is measured from); per follower, a budget of reports.
//!
//! Bounds: at most `MAX_FOLLOWERS` followers and `MAX_BYTES` of what they reported (ids,
//! reasons cut to `intake::KEPT_REASON`, the fixed parts); a report that would pass either
//! makes room by forgetting the followers heard from longest ago (the longest gone)
//! first; a follower silent for `FORGET` is forgotten at the next report or view. Only a
//! report (authenticated, authorized, rate-bounded) adds a follower; being heard from
//! (`seen`, on every authenticated request, and at every pull of a follower's held watch)
//! only updates one already kept: a read lock, a hash lookup by the name borrowed from the
//! user, two atomic stores — no allocation, so 10,000 followers' requests do not queue on
//! it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, TryLockError};
use std::time::{Duration, Instant};

use super::intake::{Checked, Holding};
use crate::https::server::{Pull, Stream};
use crate::locks::Recover;
use crate::poll::hash::Hash;
use crate::serve::held::Held;
use crate::serve::kept::Budgets;
use crate::serve::user::User;

/// Followers kept at most (a hub's connections bound its live followers below this).
pub const MAX_FOLLOWERS: usize = 16_384;

/// What the followers' reports keep at most, in bytes (10,000 followers of 100 modules
/// each keep some 10 MiB).
pub const MAX_BYTES: usize = 64 << 20;

/// A follower silent this long is forgotten.
pub const FORGET: Duration = Duration::from_secs(3600);

/// How long past its wait a follower may be silent before it is gone: a follower retries
/// a failed request with a backoff, and a restarted one takes its first list.
pub const GONE_MARGIN: Duration = Duration::from_secs(60);

/// A follower's wait when it never said one (`WAIT_HEADER`): cmpoll's default interval.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// Reports one follower may send: a burst of `REPORT_BURST`, then `REPORT_RATE` a second
/// (4 in 10 s). A follower sends one when what it holds changes; the next one carries
/// the newest state, so a refused one loses nothing.
pub const REPORT_BURST: f64 = 4.0;
pub const REPORT_RATE: f64 = 0.4;

/// The token's pod (`authentication.kubernetes.io/pod-name`, as TokenReview returns it
/// for a bound service-account token) as `NAMESPACE/POD`, the namespace its service
/// account's (`system:serviceaccount:NAMESPACE:NAME`) — a pod's name is unique in its
/// namespace only, so a pod of the same name elsewhere is another follower —, else the
/// user's name.
pub fn follower_name(user: &User) -> Cow<'_, str> {
    let pod = (user.extra.get("authentication.kubernetes.io/pod-name"))
        .and_then(|v| v.first())
        .filter(|p| !p.is_empty());
    let namespace = (user.name.strip_prefix("system:serviceaccount:"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _)| ns);
    match (pod, namespace) {
        (Some(pod), Some(ns)) => Cow::Owned(format!("{ns}/{pod}")),
        (Some(pod), None) => Cow::Borrowed(pod.as_str()),
        _ => Cow::Borrowed(&user.name),
    }
}

/// One follower, as kept.
#[derive(Debug)]
pub struct Follower {
    /// When it was last heard from, in milliseconds since the fleet's `epoch`.
    seen: AtomicU64,
    /// Its wait, in seconds (0: never said).
    wait: AtomicU64,
    /// What it holds, in (kind, key) order.
    pub holds: Box<[Holding]>,
    /// It holds more than it reported.
    pub truncated: bool,
    /// What it keeps, in bytes.
    bytes: usize,
}

impl Follower {
    /// Its wait (`DEFAULT_WAIT` when it never said one).
    pub fn wait(&self) -> Duration {
        match self.wait.load(Ordering::Relaxed) {
            0 => DEFAULT_WAIT,
            s => Duration::from_secs(s),
        }
    }
}

/// The followers, by name, and what they keep in all.
#[derive(Debug, Default)]
pub struct Followers {
    pub map: HashMap<Box<str>, Follower>,
    bytes: usize,
}

/// Since when the hub serves each object's version: by kind, `namespace/name` → (its
/// hash, since).
/// Per kind and object: the version served (hash, resourceVersion) and since when.
type ServedSince = [HashMap<Box<str>, (Hash, u64, Instant)>; 2];

/// The fleet as the hub knows it.
pub struct Fleet {
    epoch: Instant,
    followers: RwLock<Followers>,
    rates: Mutex<Budgets<Box<str>>>,
    served: Mutex<ServedSince>,
}

impl Default for Fleet {
    fn default() -> Fleet {
        Fleet::new(Instant::now())
    }
}

impl Fleet {
    pub fn new(epoch: Instant) -> Fleet {
        Fleet {
            epoch,
            followers: RwLock::new(Followers::default()),
            rates: Mutex::new(Budgets::new(REPORT_RATE, REPORT_BURST, MAX_FOLLOWERS)),
            served: Mutex::new(Default::default()),
        }
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// When a follower was last heard from.
    pub fn seen_at(&self, f: &Follower) -> Instant {
        self.epoch + Duration::from_millis(f.seen.load(Ordering::Relaxed))
    }

    /// Whether `f` is gone at `now`: silent for longer than its wait and `GONE_MARGIN`.
    pub fn gone(&self, f: &Follower, now: Instant) -> bool {
        now.saturating_duration_since(self.seen_at(f)) > f.wait() + GONE_MARGIN
    }

    /// `user` was heard from (an authenticated request, with its `WAIT_HEADER` if any).
    pub fn seen(&self, user: &User, wait: Option<&str>, now: Instant) {
        let wait = wait.and_then(|w| w.trim().parse::<u64>().ok());
        self.seen_name(&follower_name(user), wait, now);
    }

    /// The follower `name` was heard from, with its wait in seconds if it said one. A
    /// name not kept changes nothing (only a report adds a follower).
    ///
    /// It runs on the server's own thread (every request, every pull of a held watch), so
    /// it never waits: while a report or a view holds the followers for writing, a sighting
    /// is let go (the next one counts; gone takes a wait and a minute of silence).
    pub fn seen_name(&self, name: &str, wait: Option<u64>, now: Instant) {
        let followers = match self.followers.try_read() {
            Ok(f) => f,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        if let Some(f) = followers.map.get(name) {
            f.seen.fetch_max(self.ms(now), Ordering::Relaxed);
            if let Some(w) = wait.filter(|w| *w > 0) {
                let w = w.min(crate::hub_protocol::MAX_WAIT.as_secs());
                f.wait.store(w, Ordering::Relaxed);
            }
        }
    }

    /// One report from `name` allowed now, or how long until the next is.
    pub fn rate(&self, name: &str, now: Instant) -> Result<(), Duration> {
        (self.rates.lock().recover()).take(&Box::from(name), now)
    }

    /// `name`'s report taken: what it holds replaces what it held. Room is made first by
    /// forgetting the silent (`FORGET`), then the longest gone.
    pub fn take(&self, name: &str, wait: Option<u64>, report: Checked, now: Instant) {
        if report.holds.is_empty() && !self.followers.read().recover().map.contains_key(name) {
            // Holding nothing, and not kept: nothing to keep (a report naming no module is
            // authorized for nothing, so it must not add, nor make room by forgetting).
            return;
        }
        let holds = report.holds.into_boxed_slice();
        let bytes = std::mem::size_of::<Follower>()
            + name.len()
            + holds.iter().map(Holding::bytes).sum::<usize>();
        let mut followers = self.followers.write().recover();
        let before = followers.map.remove(name);
        if let Some(b) = &before {
            followers.bytes -= b.bytes;
        }
        self.forget_silent(&mut followers, now);
        while !followers.map.is_empty()
            && (followers.map.len() >= MAX_FOLLOWERS || followers.bytes + bytes > MAX_BYTES)
        {
            let longest = (followers.map.iter())
                .min_by_key(|(_, f)| f.seen.load(Ordering::Relaxed))
                .map(|(n, _)| n.clone());
            if let Some(n) = longest
                && let Some(f) = followers.map.remove(&n)
            {
                followers.bytes -= f.bytes;
            }
        }
        let kept_wait = before.map_or(0, |b| b.wait.load(Ordering::Relaxed));
        let wait = wait.filter(|w| *w > 0).map_or(kept_wait, |w| {
            w.min(crate::hub_protocol::MAX_WAIT.as_secs())
        });
        followers.bytes += bytes;
        followers.map.insert(
            name.into(),
            Follower {
                seen: AtomicU64::new(self.ms(now)),
                wait: AtomicU64::new(wait),
                holds,
                truncated: report.truncated,
                bytes,
            },
        );
    }

    /// Forgets who has been silent for `FORGET`.
    fn forget_silent(&self, followers: &mut Followers, now: Instant) {
        let before = self.ms(now).saturating_sub(FORGET.as_millis() as u64);
        let mut freed = 0;
        followers.map.retain(|_, f| {
            let keep = f.seen.load(Ordering::Relaxed) >= before;
            if !keep {
                freed += f.bytes;
            }
            keep
        });
        followers.bytes -= freed;
    }

    /// The followers, read (`view.rs`); who has been silent for `FORGET` forgotten first.
    pub fn read(&self, now: Instant) -> std::sync::RwLockReadGuard<'_, Followers> {
        self.forget_silent(&mut self.followers.write().recover(), now);
        self.followers.read().recover()
    }

    /// How many followers are kept, and their bytes.
    pub fn size(&self) -> (usize, usize) {
        let f = self.followers.read().recover();
        (f.map.len(), f.bytes)
    }

    /// `held` is served from `now`: each object's version is served since it was first
    /// served (kept when the same), or since now.
    pub fn served(&self, held: &Held, now: Instant) {
        let mut served = self.served.lock().recover();
        let mut next: ServedSince = Default::default();
        for kind in [
            crate::source::Resource::ConfigMaps,
            crate::source::Resource::Secrets,
        ] {
            let before = &served[kind.index()];
            for o in held.objects(kind, None) {
                let key = o.key();
                // A new resourceVersion (a label edited) is a new version to be taken, as
                // followers tell theirs by it: since now.
                let rv = o.resource_version.parse().unwrap_or(0);
                let since = match before.get(key.as_str()) {
                    Some((h, r, since)) if *h == o.hash && *r == rv => *since,
                    _ => now,
                };
                next[kind.index()].insert(key.into(), (o.hash, rv, since));
            }
        }
        *served = next;
    }

    /// Since when the hub serves `hash` of the object `kind` `key` (`None`: it serves
    /// another version, or none).
    pub fn served_since(
        &self,
        kind: crate::source::Resource,
        key: &str,
        hash: &Hash,
    ) -> Option<Instant> {
        let served = self.served.lock().recover();
        (served[kind.index()].get(key))
            .filter(|(h, _, _)| h == hash)
            .map(|(_, _, since)| *since)
    }

    /// A follower's held watch, heard from at every pull the server makes of it (each of
    /// its events and bookmarks, at least once a wait): a follower holding one long watch
    /// counts as heard from while the hub still sends on it; once its connection is gone
    /// (closed, or unwritable past the server's deadlines), the stream is dropped and the
    /// follower is gone a wait and `GONE_MARGIN` later.
    pub fn watching(
        self: &Arc<Fleet>,
        stream: Box<dyn Stream>,
        user: &User,
        wait: Duration,
    ) -> Box<dyn Stream> {
        Box::new(Watching {
            inner: stream,
            fleet: self.clone(),
            name: follower_name(user).as_ref().into(),
            wait: wait.as_secs(),
        })
    }
}

/// A follower's watch, counted as hearing from it (`Fleet::watching`).
struct Watching {
    inner: Box<dyn Stream>,
    fleet: Arc<Fleet>,
    name: Box<str>,
    wait: u64,
}

impl Stream for Watching {
    fn pull(&mut self, now: Instant, room: usize) -> Pull {
        self.fleet.seen_name(&self.name, Some(self.wait), now);
        self.inner.pull(now, room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Resource;

    fn holding(key: &str, reason: usize) -> Holding {
        Holding {
            kind: Resource::ConfigMaps,
            key: key.into(),
            hash: Some(Hash([1; 32])),
            resource_version: None,
            refused: (reason > 0).then(|| {
                Box::new(super::super::intake::Refusal {
                    hash: Hash([2; 32]),
                    resource_version: None,
                    by: super::super::intake::By::Validate,
                    reason: "r".repeat(reason).into(),
                })
            }),
        }
    }

    fn report(n: usize) -> Checked {
        Checked {
            holds: (0..n).map(|i| holding(&format!("ns/m{i}"), 0)).collect(),
            truncated: false,
        }
    }

    fn user(name: &str, pod: Option<&str>) -> User {
        User {
            name: name.into(),
            uid: String::new(),
            groups: Vec::new(),
            extra: pod
                .map(|p| {
                    (
                        "authentication.kubernetes.io/pod-name".to_string(),
                        vec![p.to_string()],
                    )
                })
                .into_iter()
                .collect(),
        }
    }

    /// A bound service-account token names its pod, in its namespace (a pod of the same
    /// name in another namespace is another follower); any other user is its name.
    #[test]
    fn a_follower_is_its_pods_name_else_its_users() {
        let sa = "system:serviceaccount:monitoring:alloy";
        assert_eq!(
            follower_name(&user(sa, Some("alloy-x7k2p"))),
            "monitoring/alloy-x7k2p"
        );
        let other = "system:serviceaccount:team-a:default";
        assert_eq!(
            follower_name(&user(other, Some("alloy-x7k2p"))),
            "team-a/alloy-x7k2p"
        );
        assert_eq!(follower_name(&user("jane", Some("p"))), "p");
        assert_eq!(follower_name(&user(sa, None)), sa);
        assert_eq!(follower_name(&user(sa, Some(""))), sa);
    }

    /// A report naming no module (authorized for nothing) adds no follower, nor makes room
    /// by forgetting one; from a follower kept, it says it holds nothing.
    #[test]
    fn an_empty_report_adds_no_follower() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        fleet.take("stranger", None, report(0), t0);
        assert_eq!(fleet.size().0, 0);
        fleet.take("node-1", None, report(1), t0);
        fleet.take("node-1", None, report(0), t0);
        assert!(fleet.read(t0).map["node-1"].holds.is_empty());
    }

    /// Being heard from updates a follower kept, never adds one; its wait comes along.
    #[test]
    fn seen_updates_only_followers_kept() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        let pod = user("jane", Some("node-1"));
        fleet.seen(&pod, Some("30"), t0);
        assert_eq!(fleet.size().0, 0);
        fleet.take("node-1", None, report(1), t0);
        let later = t0 + Duration::from_secs(200);
        let f = fleet.read(t0);
        assert_eq!(f.map["node-1"].wait(), DEFAULT_WAIT);
        assert!(fleet.gone(&f.map["node-1"], later));
        drop(f);
        fleet.seen(&pod, Some("30"), later);
        let f = fleet.read(later);
        assert_eq!(f.map["node-1"].wait(), Duration::from_secs(30));
        assert!(!fleet.gone(&f.map["node-1"], later + Duration::from_secs(90)));
        assert!(fleet.gone(&f.map["node-1"], later + Duration::from_secs(91)));
    }

    /// Over the count, the longest gone is forgotten first; over the bytes too; and one
    /// silent for `FORGET` at the next report.
    #[test]
    fn bounds_forget_the_longest_gone_first() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        for i in 0..MAX_FOLLOWERS {
            fleet.take(&format!("f{i}"), None, report(1), at(1));
        }
        fleet.seen_name("f0", None, at(5));
        fleet.take("new", None, report(1), at(6));
        let (n, _) = fleet.size();
        assert_eq!(n, MAX_FOLLOWERS);
        let f = fleet.read(at(6));
        assert!(f.map.contains_key("f0"), "heard from later: kept");
        assert!(f.map.contains_key("new"));
        assert_eq!(
            (1..MAX_FOLLOWERS)
                .filter(|i| !f.map.contains_key(format!("f{i}").as_str()))
                .count(),
            1
        );
        drop(f);
        // Bytes: a report of 4,096 modules with long reasons each, from many followers.
        let fleet = Fleet::new(t0);
        let big = || Checked {
            holds: (0..4096)
                .map(|i| holding(&format!("ns/m{i}"), 256))
                .collect(),
            truncated: true,
        };
        for i in 0..200u64 {
            fleet.take(&format!("b{i}"), None, big(), at(i));
        }
        let (n, bytes) = fleet.size();
        assert!(bytes <= MAX_BYTES, "{bytes}");
        assert!(n < 200, "{n}");
        let f = fleet.read(at(200));
        assert!(f.map.contains_key("b199") && !f.map.contains_key("b0"));
        drop(f);
        // Silent an hour: forgotten.
        fleet.take(
            "late",
            None,
            report(1),
            at(200) + FORGET + Duration::from_secs(1),
        );
        assert_eq!(fleet.size().0, 1);
    }

    /// A report replaces what the follower held; its bytes are counted once.
    #[test]
    fn a_report_replaces_the_last() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        fleet.take("a", Some(20), report(10), t0);
        let (_, ten) = fleet.size();
        fleet.take("a", None, report(1), t0);
        let (n, one) = fleet.size();
        assert_eq!(n, 1);
        assert!(one < ten);
        let f = fleet.read(t0);
        assert_eq!(f.map["a"].holds.len(), 1);
        assert_eq!(f.map["a"].wait(), Duration::from_secs(20), "its wait kept");
    }

    /// A follower holding one long watch is heard from at each pull of it: not gone
    /// while the hub still sends on it, gone a wait and the margin after its last pull.
    #[test]
    fn a_held_watch_keeps_its_follower_heard_from() {
        struct Quiet;
        impl Stream for Quiet {
            fn pull(&mut self, now: Instant, _: usize) -> Pull {
                Pull {
                    chunks: Vec::new(),
                    next: crate::https::server::Next::At(now),
                }
            }
        }
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let fleet = Arc::new(Fleet::new(t0));
        fleet.take("node-1", None, report(1), t0);
        let pod = user("jane", Some("node-1"));
        let mut watch = fleet.watching(Box::new(Quiet), &pod, Duration::from_secs(30));
        for s in (30..=3000).step_by(30) {
            watch.pull(at(s), 4096);
        }
        let f = fleet.read(at(3000));
        assert!(
            !fleet.gone(&f.map["node-1"], at(3000 + 90)),
            "its wait came with it"
        );
        assert!(fleet.gone(&f.map["node-1"], at(3000 + 91)));
    }

    /// Reports are bounded per follower: a burst, then the rate, with a moment to come back.
    #[test]
    fn reports_are_rate_bounded_per_follower() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        for _ in 0..4 {
            fleet.rate("a", t0).unwrap();
        }
        let wait = fleet.rate("a", t0).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(3),
            "{wait:?}"
        );
        fleet.rate("b", t0).unwrap();
        fleet.rate("a", t0 + Duration::from_secs(3)).unwrap();
    }
}
