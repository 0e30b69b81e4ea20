//! What a hub keeps of its followers (`Fleet`): per follower — named by its token's pod
//! name, else its user name (`follower_name`) — the scopes it follows and how far it has
//! come in each (`Scope`: its held watch's last bookmark, or its waiting list's version),
//! what it last reported holding otherwise than it was served (its exceptions: a version
//! it or its agent refused, one it could not write), when it was last heard from and its
//! wait; per served object, since when the hub serves its version and the hub's version
//! from which a follower has it (what "current" and "behind" are measured from); per
//! follower, a budget of reports.
//!
//! A follower that holds what it was served reports nothing: the hub reads its state off
//! its own watch, at no cost per change (`view.rs`). Bounds: at most `MAX_FOLLOWERS`
//! followers, `MAX_SCOPES` scopes each, and `MAX_BYTES` of what they keep (ids, reasons cut
//! to `intake::KEPT_REASON`, selectors, the fixed parts); a follower that would pass either
//! makes room by forgetting the followers heard from longest ago first; a follower silent
//! for `FORGET` is forgotten at the next report, watch or view. A follower is added by its
//! first held watch or waiting list (`WAIT_HEADER`; authorized as every watch and list) or
//! by a report naming a module (authorized per namespace); being heard from (`seen`, on
//! every authenticated request, and at every pull of a follower's held watch) only updates
//! one already kept: a read lock, a hash lookup by the name borrowed from the user, two
//! atomic stores — no allocation, so 10,000 followers' requests do not queue on it.

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
use crate::serve::request::Ask;
use crate::serve::user::User;
use crate::serve::watch::{Filter, Watch};
use crate::source::Resource;

/// Followers kept at most (a hub's connections bound its live followers below this).
pub const MAX_FOLLOWERS: usize = 16_384;

/// Scopes kept per follower at most (the newest; a follower lists a few namespaces).
pub const MAX_SCOPES: usize = 16;

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

/// One scope a follower follows (a held watch, or a waiting list), and how far it came.
#[derive(Debug)]
pub struct Scope {
    pub filter: Filter,
    /// `filter` in words (its `Debug`): what scopes are told apart and grouped by.
    pub key: Box<str>,
    /// The hub's newest version up to which the follower has every change of the scope
    /// (its held watch's last `BOOKMARK`; the version of its last list).
    position: AtomicU64,
}

impl Scope {
    pub fn new(filter: Filter, position: u64) -> Scope {
        Scope {
            key: format!("{filter:?}").into(),
            filter,
            position: AtomicU64::new(position),
        }
    }

    pub fn position(&self) -> u64 {
        self.position.load(Ordering::Relaxed)
    }

    /// Moved on to `at`, if that is further (a follower's versions never go back).
    pub fn advance(&self, at: u64) {
        self.position.fetch_max(at, Ordering::Relaxed);
    }

    /// The bytes it keeps (for the fleet's bound).
    fn bytes(&self) -> usize {
        std::mem::size_of::<Scope>() + 2 * self.key.len()
    }
}

/// One follower, as kept.
#[derive(Debug)]
pub struct Follower {
    /// When it was last heard from, in milliseconds since the fleet's `epoch`.
    seen: AtomicU64,
    /// Its wait, in seconds (0: never said).
    wait: AtomicU64,
    /// The scopes it follows, the newest last.
    pub scopes: Vec<Arc<Scope>>,
    /// What it reported holding otherwise than served (its exceptions), in (kind, key)
    /// order.
    pub holds: Box<[Holding]>,
    /// It holds more than it reported.
    pub truncated: bool,
    /// Its cohort (`views::cohort` of its name), made once.
    pub cohort: f64,
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

/// An object's version as the hub serves it, for the fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    pub hash: Hash,
    /// Its resourceVersion.
    pub rv: u64,
    /// Since when the hub serves it.
    pub since: Instant,
    /// The hub's version from which a watcher has it: the kind's version when it was first
    /// served (a watch is released changes up to it: `history.rs`), or its own when newer.
    pub from: u64,
}

impl Followers {
    /// The scope of `name` kept with `scope`'s filter, moved on to `scope`'s position (a
    /// follower's versions never go back; a watch's start, clamped to the hub's, may).
    fn taken_over(&self, name: &str, scope: &Scope) -> Option<Arc<Scope>> {
        let kept = (self.map.get(name))?
            .scopes
            .iter()
            .find(|s| s.key == scope.key)?;
        kept.position.fetch_max(scope.position(), Ordering::Relaxed);
        Some(kept.clone())
    }
}

/// Per kind, `namespace/name` → its version served.
pub type ServedSince = [HashMap<Box<str>, Served>; 2];

/// The fleet as the hub knows it.
pub struct Fleet {
    epoch: Instant,
    followers: RwLock<Followers>,
    rates: Mutex<Budgets<Box<str>>>,
    /// Swapped whole at each publish: a view reads its own copy, holding no lock.
    served: Mutex<Arc<ServedSince>>,
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
            served: Mutex::new(Arc::default()),
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
    /// name not kept changes nothing (`false`: not kept; `true` also when it could not
    /// look).
    ///
    /// It runs on the server's own thread (every request, every pull of a held watch), so
    /// it never waits: while a report or a view holds the followers for writing, a sighting
    /// is let go (the next one counts; gone takes a wait and a minute of silence).
    pub fn seen_name(&self, name: &str, wait: Option<u64>, now: Instant) -> bool {
        let followers = match self.followers.try_read() {
            Ok(f) => f,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return true,
        };
        let Some(f) = followers.map.get(name) else {
            return false;
        };
        f.seen.fetch_max(self.ms(now), Ordering::Relaxed);
        if let Some(w) = wait.filter(|w| *w > 0) {
            let w = w.min(crate::hub_protocol::MAX_WAIT.as_secs());
            f.wait.store(w, Ordering::Relaxed);
        }
        true
    }

    /// One report from `name` allowed now, or how long until the next is.
    pub fn rate(&self, name: &str, now: Instant) -> Result<(), Duration> {
        (self.rates.lock().recover()).take(&Box::from(name), now)
    }

    /// `name`'s report taken: what it holds replaces what it held. Room is made first by
    /// forgetting the silent (`FORGET`), then the longest gone.
    pub fn take(&self, name: &str, wait: Option<u64>, report: Checked, now: Instant) {
        if report.holds.is_empty() && !self.followers.read().recover().map.contains_key(name) {
            // No exception, and not kept: nothing to keep (a report naming no module is
            // authorized for nothing, so it must not add, nor make room by forgetting; its
            // watch adds it).
            return;
        }
        let holds = report.holds.into_boxed_slice();
        let truncated = report.truncated;
        self.replace(name, wait, now, move |before| {
            let scopes = before.map(|b| b.scopes).unwrap_or_default();
            (scopes, holds, truncated)
        });
    }

    /// The follower `name`, made again by `make` from what was kept of it (its scopes,
    /// exceptions and whether they were cut), heard from now, with its wait if it said
    /// one; room is made first by forgetting the silent (`FORGET`), then the longest gone.
    pub(super) fn replace(
        &self,
        name: &str,
        wait: Option<u64>,
        now: Instant,
        make: impl FnOnce(Option<Follower>) -> (Vec<Arc<Scope>>, Box<[Holding]>, bool),
    ) {
        self.replace_in(&mut self.followers.write().recover(), name, wait, now, make);
    }

    /// `replace`, the followers held for writing.
    fn replace_in(
        &self,
        followers: &mut Followers,
        name: &str,
        wait: Option<u64>,
        now: Instant,
        make: impl FnOnce(Option<Follower>) -> (Vec<Arc<Scope>>, Box<[Holding]>, bool),
    ) {
        let before = followers.map.remove(name);
        if let Some(b) = &before {
            followers.bytes -= b.bytes;
        }
        let kept_wait = before
            .as_ref()
            .map_or(0, |b| b.wait.load(Ordering::Relaxed));
        let cohort =
            (before.as_ref()).map_or_else(|| crate::serve::views::cohort(name), |b| b.cohort);
        let (scopes, holds, truncated) = make(before);
        let bytes = std::mem::size_of::<Follower>()
            + name.len()
            + scopes.iter().map(|s| s.bytes()).sum::<usize>()
            + holds.iter().map(Holding::bytes).sum::<usize>();
        self.forget_silent(followers, now);
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
        let wait = wait.filter(|w| *w > 0).map_or(kept_wait, |w| {
            w.min(crate::hub_protocol::MAX_WAIT.as_secs())
        });
        followers.bytes += bytes;
        followers.map.insert(
            name.into(),
            Follower {
                seen: AtomicU64::new(self.ms(now)),
                wait: AtomicU64::new(wait),
                scopes,
                holds,
                truncated,
                cohort,
                bytes,
            },
        );
    }

    /// The follower `name` follows `scope` (a held watch starts, a waiting list is
    /// answered): the scope kept (one per filter, the newest `MAX_SCOPES`) at `scope`'s
    /// position, the follower added if new. It runs on the server's own thread, so it
    /// never waits: `None` while a view or a report holds the followers (try again);
    /// else the scope the fleet keeps, to be moved on from now on (an earlier one of the
    /// same filter, taken over, or this one).
    pub fn following(
        &self,
        name: &str,
        scope: Arc<Scope>,
        wait: Option<u64>,
        now: Instant,
    ) -> Option<Arc<Scope>> {
        let followers = match self.followers.try_read() {
            Ok(f) => f,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        if let Some(s) = followers.taken_over(name, &scope) {
            drop(followers);
            self.seen_name(name, wait, now);
            return Some(s);
        }
        drop(followers);
        let mut followers = match self.followers.try_write() {
            Ok(f) => f,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        // Kept meanwhile (another watch of it, between the two locks): that one.
        if let Some(s) = followers.taken_over(name, &scope) {
            return Some(s);
        }
        let ours = scope.clone();
        self.replace_in(
            &mut followers,
            name,
            wait,
            now,
            move |before| match before {
                Some(b) => {
                    let mut scopes = b.scopes;
                    scopes.retain(|s| s.key != scope.key);
                    if scopes.len() >= MAX_SCOPES {
                        scopes.remove(0);
                    }
                    scopes.push(scope);
                    (scopes, b.holds, b.truncated)
                }
                None => (vec![scope], Box::default(), false),
            },
        );
        Some(ours)
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

    /// The followers, read as they are (none forgotten first).
    pub(super) fn read_now(&self) -> std::sync::RwLockReadGuard<'_, Followers> {
        self.followers.read().recover()
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
        let served = self.served.lock().recover().clone();
        let mut next: ServedSince = Default::default();
        for kind in [Resource::ConfigMaps, Resource::Secrets] {
            let before = &served[kind.index()];
            let version = held.versions(kind, None).map_or(0, |v| v.listed);
            for o in held.objects(kind, None) {
                let key = o.key();
                // A new resourceVersion (a label edited) is a new version to be taken, as
                // followers tell theirs by it: since now.
                let rv = o.resource_version.parse().unwrap_or(0);
                let kept = before.get(key.as_str()).copied();
                let s = match kept {
                    Some(s) if s.hash == o.hash && s.rv == rv => s,
                    _ => Served {
                        hash: o.hash,
                        rv,
                        since: now,
                        from: version.max(rv),
                    },
                };
                next[kind.index()].insert(key.into(), s);
            }
        }
        *self.served.lock().recover() = Arc::new(next);
    }

    /// Each object's version served, by kind and `namespace/name` (its own copy: no lock
    /// is held while it is read).
    pub fn served_now<T>(&self, read: impl FnOnce(&ServedSince) -> T) -> T {
        let served = self.served.lock().recover().clone();
        read(&served)
    }

    /// `user` is answered the list `ask` at the hub's version `at`: a follower's (it sent
    /// its wait) follows that scope from there (the list before its watch, or its waiting
    /// list).
    pub fn listed(&self, user: &User, ask: &Ask, at: u64, now: Instant) {
        if let Some(wait) = ask.wait {
            let scope = Arc::new(Scope::new(Filter::of(ask), at));
            // Not kept now (the followers held): its next list will be.
            let _ = self.following(&follower_name(user), scope, Some(wait.as_secs()), now);
        }
    }

    /// A follower's held watch: its scope kept (`following`) and moved on at every
    /// bookmark it is given, and the follower heard from at every pull the server makes
    /// of it (each of its events and bookmarks, at least once a wait): a follower holding
    /// one long watch counts as heard from while the hub still sends on it; once its
    /// connection is gone (closed, or unwritable past the server's deadlines), the stream
    /// is dropped and the follower is gone a wait and `GONE_MARGIN` later.
    pub fn watching(
        self: &Arc<Fleet>,
        watch: Watch,
        user: &User,
        wait: Duration,
    ) -> Box<dyn Stream> {
        let mut w = Watching {
            scope: Arc::new(Scope::new(watch.filter().clone(), watch.committed())),
            kept: false,
            inner: watch,
            fleet: self.clone(),
            name: follower_name(user).as_ref().into(),
            wait: wait.as_secs(),
        };
        w.keep(Instant::now());
        Box::new(w)
    }
}

/// A follower's watch, counted as hearing from it (`Fleet::watching`).
struct Watching {
    inner: Watch,
    fleet: Arc<Fleet>,
    name: Box<str>,
    wait: u64,
    scope: Arc<Scope>,
    /// Whether the fleet keeps `scope` (else it is tried again at the next pull).
    kept: bool,
}

impl Watching {
    fn keep(&mut self, now: Instant) {
        let scope = self.scope.clone();
        if let Some(kept) = (self.fleet).following(&self.name, scope, Some(self.wait), now) {
            self.scope = kept;
            self.kept = true;
        }
    }
}

impl Stream for Watching {
    fn pull(&mut self, now: Instant, room: usize) -> Pull {
        if !self.fleet.seen_name(&self.name, Some(self.wait), now) {
            // Forgotten meanwhile (room made for others): kept again.
            self.kept = false;
        }
        let pulled = self.inner.pull(now, room);
        (self.scope.position).fetch_max(self.inner.committed(), Ordering::Relaxed);
        if !self.kept {
            self.keep(now);
        }
        pulled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::request::{self, Route};

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

    /// A hub's timeline that polled `a/x` once, at version 10, and a follower's held watch
    /// of namespace `a` from `rv`, with `wait` seconds.
    fn held_watch(rv: u64, wait: u64) -> (Arc<RwLock<crate::serve::watch::Timeline>>, Watch) {
        use crate::serve::testing::{item, kinds, poll};
        let first = poll(
            &Held::empty(kinds()),
            1,
            &[(None, 10)],
            vec![item("a", "x", 5, &[])],
        );
        let mut t = crate::serve::watch::Timeline::default();
        t.history.record(&Held::empty(kinds()), &first);
        t.held = Some(Arc::new(first));
        let timeline = Arc::new(RwLock::new(t));
        let Route::Read(target) = request::route("/api/v1/namespaces/a/configmaps") else {
            panic!()
        };
        let query = format!("watch=true&resourceVersion={rv}&allowWatchBookmarks=true");
        let query = request::Query::parse(&query);
        let header = |h: &str| (h == crate::hub_protocol::WAIT_HEADER).then(|| wait.to_string());
        let ask = request::ask(target, &query, &header).unwrap();
        let w = Watch::start(
            timeline.clone(),
            &ask,
            &mut crate::backoff::Rng::from_time(),
        );
        (timeline, w)
    }

    /// A follower's held watch adds it, in the scope it watches at the version it
    /// watches from; each bookmark moves the scope on; it is heard from at each pull: not
    /// gone while the hub still sends on it, gone a wait and the margin after its last
    /// pull.
    #[test]
    fn a_held_watch_keeps_its_follower_heard_from_and_moves_on() {
        use crate::serve::testing::{item, poll};
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let (timeline, w) = held_watch(10, 30);
        let fleet = Arc::new(Fleet::new(t0));
        let pod = user("jane", Some("node-1"));
        let mut watch = fleet.watching(w, &pod, Duration::from_secs(30));
        let position = |f: &Fleet| f.read(t0).map["node-1"].scopes[0].position();
        assert_eq!(position(&fleet), 10, "the version it watches from");
        // The hub's next poll, at 20, with a change: its events and a bookmark at 20.
        {
            let mut t = timeline.write().unwrap();
            let prev = t.held.clone().unwrap();
            let next = poll(&prev, 2, &[(None, 20)], vec![item("a", "x", 15, &[])]);
            t.history.record(&prev, &next);
            t.held = Some(Arc::new(next));
        }
        for s in (30..=3000).step_by(30) {
            watch.pull(at(s), 1 << 20);
        }
        assert_eq!(position(&fleet), 20, "moved on by its bookmark");
        let f = fleet.read(at(3000));
        assert!(
            !fleet.gone(&f.map["node-1"], at(3000 + 90)),
            "its wait came with it"
        );
        assert!(fleet.gone(&f.map["node-1"], at(3000 + 91)));
        drop(f);
        // The same scope listed again is the same scope, moved; another is another.
        let listed = crate::serve::testing::filter("/api/v1/namespaces/a/configmaps", "");
        fleet
            .following(
                "node-1",
                Arc::new(Scope::new(listed.clone(), 25)),
                None,
                at(3000),
            )
            .unwrap();
        let other = crate::serve::testing::filter("/api/v1/namespaces/b/configmaps", "");
        fleet
            .following(
                "node-1",
                Arc::new(Scope::new(other.clone(), 25)),
                None,
                at(3000),
            )
            .unwrap();
        let f = fleet.read(at(3000));
        let scopes: Vec<u64> = f.map["node-1"]
            .scopes
            .iter()
            .map(|s| s.position())
            .collect();
        assert_eq!(scopes, [25, 25]);
    }

    /// `following` runs on the server's thread: while a view holds the followers it does
    /// not wait (`None`), a held watch's scope is kept at a later pull.
    #[test]
    fn following_never_waits() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        let f = crate::serve::testing::filter("/api/v1/namespaces/a/configmaps", "");
        let viewing = fleet.read(t0);
        let scope = || Arc::new(Scope::new(f.clone(), 1));
        assert!(fleet.following("a", scope(), None, t0).is_none());
        drop(viewing);
        assert!(fleet.following("a", scope(), None, t0).is_some());
        let viewing = fleet.read(t0);
        assert!(
            fleet.following("a", scope(), None, t0).is_some(),
            "kept already: a read lock is enough"
        );
        drop(viewing);
    }

    /// A watch from a version ahead of the hub's (the other hub's, or made up) counts from
    /// the hub's, and its commits move it only as far as the hub's version.
    #[test]
    fn a_watch_ahead_of_the_hub_counts_from_the_hubs_version() {
        let t0 = Instant::now();
        let (_timeline, w) = held_watch(1000, 1);
        let fleet = Arc::new(Fleet::new(t0));
        let mut watch = fleet.watching(w, &user("jane", Some("node-1")), Duration::from_secs(1));
        let position = |f: &Fleet| f.read(t0).map["node-1"].scopes[0].position();
        assert_eq!(position(&fleet), 10);
        for s in 1..5 {
            watch.pull(t0 + Duration::from_secs(s), 1 << 20);
        }
        assert_eq!(
            position(&fleet),
            10,
            "its commits say 1000; it has 10 from here"
        );
    }

    /// A follower keeps its newest `MAX_SCOPES` scopes.
    #[test]
    fn scopes_are_bounded() {
        let t0 = Instant::now();
        let fleet = Fleet::new(t0);
        for i in 0..MAX_SCOPES + 3 {
            let f =
                crate::serve::testing::filter(&format!("/api/v1/namespaces/n{i}/configmaps"), "");
            fleet
                .following("a", Arc::new(Scope::new(f.clone(), i as u64)), None, t0)
                .unwrap();
        }
        let f = fleet.read(t0);
        let kept: Vec<u64> = f.map["a"].scopes.iter().map(|s| s.position()).collect();
        assert_eq!(kept, (3..MAX_SCOPES as u64 + 3).collect::<Vec<_>>());
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
