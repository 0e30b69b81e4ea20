//! Whether a user may do what a request asks: a SubjectAccessReview (the `Reviewer`), as
//! the apiserver's webhook authorizer makes it, with its cache — an access allowed is kept
//! 5 minutes and one refused 30 seconds (its `--authorization-webhook-cache-authorized-ttl`
//! and `…-unauthorized-ttl` defaults), each entry a random 75–100 % of that.
//!
//! What it costs is bounded (docs/serve.md, "Hostile clients"): decisions are kept by a
//! digest of who asked and what (32 bytes, whatever the path or name a client wrote; a
//! refusal whose reason is longer than `MAX_REASON` is not kept), and reviews not kept draw
//! on a budget per user (`USER_RATE`) and on the hub's own (`ALL_RATE`): one identity
//! asking random namespaces, names or paths costs the apiserver a bounded rate of reviews
//! and, beyond it, gets 429 with Retry-After, alone. A kept decision never meets either.
//! A review the apiserver could not make is a 503 with Retry-After and is not kept.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::kept::{Budget, Budgets, Cache};
use super::reviewer::{self, Attributes, Decision, Halt, HubLane, Quiet, Reviewer};
use super::status::StatusError;
use super::user::User;
use crate::backoff::Rng;
use crate::locks::Recover;
use crate::ops::metrics::{Decisions, ServerCounts};

/// How long a decision is kept.
pub const ALLOWED_TTL: Duration = Duration::from_secs(300);
pub const DENIED_TTL: Duration = Duration::from_secs(30);
/// The share of an entry's time it may lose at random.
pub const SPREAD: f64 = 0.25;
/// Decisions kept at most (and users whose budgets are kept).
pub const MAX_ENTRIES: usize = 65_536;
/// A refusal's reason kept at most (longer: not kept, asked again).
pub const MAX_REASON: usize = 256;
/// Access reviews not kept, per user: a second, and at once. A follower's first poll asks
/// `list` and `watch` of each scope it follows (200 at once: 100 scopes); later, its kept
/// decisions expire spread over minutes.
pub const USER_RATE: f64 = 10.0;
pub const USER_BURST: f64 = 200.0;
/// Access reviews not kept, all users together: a second, and at once (10,000 followers
/// arriving at 500 a second ask about 1,000 a second).
pub const ALL_RATE: f64 = 2000.0;
pub const ALL_BURST: f64 = 4000.0;
/// What a follower is told to wait after a review the apiserver could not make.
pub const REVIEW_RETRY_AFTER: u64 = 5;

/// Authorization with its cache and budgets.
pub struct Authorizer {
    reviewer: Arc<dyn Reviewer>,
    kept: Mutex<Cache<[u8; 32], Decision>>,
    users: Mutex<Budgets<[u8; 32]>>,
    all: Mutex<Budget>,
    decisions: Decisions,
    counts: ServerCounts,
    rng: Mutex<Rng>,
    quiet: Quiet,
}

impl Authorizer {
    pub fn new(reviewer: Arc<dyn Reviewer>, decisions: Decisions, counts: ServerCounts) -> Self {
        let rates = [(USER_RATE, USER_BURST), (ALL_RATE, ALL_BURST)];
        Authorizer::with_rates(reviewer, decisions, counts, rates)
    }

    /// `new`, with other budgets (rate, burst): per user, and all users together.
    pub fn with_rates(
        reviewer: Arc<dyn Reviewer>,
        decisions: Decisions,
        counts: ServerCounts,
        [user, all]: [(f64, f64); 2],
    ) -> Self {
        let now = Instant::now();
        Authorizer {
            reviewer,
            kept: Mutex::new(Cache::new(MAX_ENTRIES)),
            users: Mutex::new(Budgets::new(user.0, user.1, MAX_ENTRIES)),
            all: Mutex::new(Budget::new(all.0, all.1, now)),
            decisions,
            counts,
            rng: Mutex::new(Rng::from_time()),
            quiet: Quiet::default(),
        }
    }

    /// Whether `user` may do `what`: `Ok`, or the 403 the apiserver would send. A decision
    /// not kept is reviewed only on a `lane` that `may_wait` (a review lane); elsewhere the request is sent
    /// there.
    pub fn authorize(&self, user: &User, what: &Attributes, lane: HubLane) -> Result<(), Halt> {
        let who = user_digest(user);
        let key = digest(&who, what);
        let now = Instant::now();
        let cached = lock(&self.kept).get(&key, now);
        let (decision, cache) = match cached {
            Some(d) => (d, "hit"),
            None if !lane.may_wait() => return Err(Halt::Lane(HubLane::Authorize)),
            None => {
                self.budget(&who, now)?;
                let d = self.review(user, what)?;
                let ttl = self.spread(match d {
                    Decision::Allowed => ALLOWED_TTL,
                    Decision::Denied(_) => DENIED_TTL,
                });
                let keep = !matches!(&d, Decision::Denied(why) if why.len() > MAX_REASON);
                if keep {
                    lock(&self.kept).put(key, d.clone(), now + ttl);
                }
                (d, "miss")
            }
        };
        match decision {
            Decision::Allowed => {
                self.decisions.record("authorization", "allowed", cache);
                Ok(())
            }
            Decision::Denied(why) => {
                self.decisions.record("authorization", "denied", cache);
                Err(forbidden(user, what, &why).into())
            }
        }
    }

    /// One review from `who`'s budget and the hub's; beyond either, a 429 (not a
    /// decision: none was made).
    fn budget(&self, who: &[u8; 32], now: Instant) -> Result<(), Halt> {
        if let Err(wait) = lock(&self.users).take(who, now) {
            self.counts.turned_away("access");
            return Err(reviewer::over_budget(wait));
        }
        if let Err(wait) = lock(&self.all).take(now) {
            lock(&self.users).refund(who);
            self.counts.turned_away("access_all");
            return Err(reviewer::over_budget(wait));
        }
        Ok(())
    }

    fn review(&self, user: &User, what: &Attributes) -> Result<Decision, Halt> {
        self.reviewer.access(user, what).map_err(|e| {
            self.decisions.record("authorization", "error", "miss");
            let name = &user.name;
            self.quiet
                .warn(|n| log::warn!("cannot review the access of {name}{n}: {e}"));
            StatusError::unavailable(
                format!("cannot authorize the request: the SubjectAccessReview failed: {e}"),
                REVIEW_RETRY_AFTER,
            )
            .into()
        })
    }

    /// `ttl` less a random share of it, up to `SPREAD`.
    fn spread(&self, ttl: Duration) -> Duration {
        let r = lock(&self.rng).unit();
        ttl.mul_f64(1.0 - SPREAD * r)
    }
}

/// A digest of everything a SubjectAccessReview says of the user, each part with its
/// length: two users or requests that differ anywhere differ here.
fn user_digest(user: &User) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut part = |b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    part(user.name.as_bytes());
    part(user.uid.as_bytes());
    part(&(user.groups.len() as u64).to_be_bytes());
    for g in &user.groups {
        part(g.as_bytes());
    }
    part(&(user.extra.len() as u64).to_be_bytes());
    for (k, vs) in &user.extra {
        part(k.as_bytes());
        part(&(vs.len() as u64).to_be_bytes());
        for v in vs {
            part(v.as_bytes());
        }
    }
    h.finalize().into()
}

/// The key a decision is kept under: who (`user_digest`) and what.
fn digest(who: &[u8; 32], what: &Attributes) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(who);
    let mut part = |b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    match what {
        Attributes::Resource {
            verb,
            kind,
            namespace,
            name,
        } => {
            part(b"resource");
            part(verb.as_bytes());
            part(kind.plural().as_bytes());
            for s in [namespace, name] {
                match s {
                    Some(s) => part(&[&[1u8][..], s.as_bytes()].concat()),
                    None => part(&[0u8]),
                }
            }
        }
        Attributes::Path { verb, path } => {
            part(b"path");
            part(verb.as_bytes());
            part(path.as_bytes());
        }
    }
    h.finalize().into()
}

/// The 403 the apiserver sends for `what`.
fn forbidden(user: &User, what: &Attributes, why: &str) -> StatusError {
    match what {
        Attributes::Resource {
            verb,
            kind,
            namespace,
            name,
        } => StatusError::forbidden(
            &user.name,
            verb,
            *kind,
            namespace.as_deref(),
            name.as_deref(),
            why,
        ),
        Attributes::Path { verb, path } => StatusError::forbidden_path(&user.name, verb, path, why),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().recover()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::testing::{Fake, alice};
    use crate::source::Resource;
    use std::sync::atomic::Ordering;

    fn authz(fake: &Arc<Fake>, user: (f64, f64)) -> (ServerCounts, Authorizer) {
        authz_all(fake, user, (ALL_RATE, ALL_BURST))
    }

    fn authz_all(
        fake: &Arc<Fake>,
        user: (f64, f64),
        all: (f64, f64),
    ) -> (ServerCounts, Authorizer) {
        let counts = ServerCounts::default();
        let a = Authorizer::with_rates(
            Arc::new(fake.clone()),
            Decisions::default(),
            counts.clone(),
            [user, all],
        );
        (counts, a)
    }

    fn list(kind: Resource, ns: Option<&str>) -> Attributes {
        Attributes::Resource {
            verb: "list",
            kind,
            namespace: ns.map(str::to_string),
            name: None,
        }
    }

    fn refusal(r: Result<(), Halt>) -> StatusError {
        match r.unwrap_err() {
            Halt::Refused(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn decisions_are_reviewed_once_and_kept() {
        let fake = Arc::new(Fake::default());
        let (_, a) = authz(&fake, (USER_RATE, USER_BURST));
        let alice = alice();
        let team_a = list(Resource::ConfigMaps, Some("team-a"));
        assert!(matches!(
            a.authorize(&alice, &team_a, HubLane::Answer),
            Err(Halt::Lane(HubLane::Authorize))
        ));
        a.authorize(&alice, &team_a, HubLane::Authorize).unwrap();
        a.authorize(&alice, &team_a, HubLane::Answer).unwrap();
        assert_eq!(fake.access.load(Ordering::SeqCst), 1);
        let e = refusal(a.authorize(
            &alice,
            &list(Resource::Secrets, Some("team-a")),
            HubLane::Authorize,
        ));
        assert_eq!(
            e.message,
            "secrets is forbidden: User \"alice\" cannot list resource \"secrets\" in API group \"\" in the namespace \"team-a\""
        );
        assert_eq!(
            refusal(a.authorize(
                &alice,
                &list(Resource::ConfigMaps, None),
                HubLane::Authorize
            ))
            .code,
            403
        );
        // A review that cannot be made is a 503, and not kept.
        fake.fail.store(true, Ordering::SeqCst);
        let elsewhere = list(Resource::ConfigMaps, Some("team-b"));
        let e = refusal(a.authorize(&alice, &elsewhere, HubLane::Authorize));
        assert_eq!((e.code, e.retry_after), (503, Some(REVIEW_RETRY_AFTER)));
        assert_eq!(
            refusal(a.authorize(&alice, &elsewhere, HubLane::Authorize)).code,
            503
        );
        assert_eq!(fake.access.load(Ordering::SeqCst), 5);
    }

    /// Issue 56.5: one identity asking random namespaces (each a review) gets its burst,
    /// then its rate, then a 429 with Retry-After — alone: another user is reviewed as
    /// before, and a decision kept is answered whatever the budget says.
    #[test]
    fn one_user_asking_at_random_is_reviewed_at_its_own_bounded_rate() {
        let fake = Arc::new(Fake::default());
        let (counts, a) = authz(&fake, (0.001, 20.0));
        let alice = alice();
        let team_a = list(Resource::ConfigMaps, Some("team-a"));
        a.authorize(&alice, &team_a, HubLane::Authorize).unwrap();
        let mut told = Vec::new();
        for i in 0..1000 {
            let r = a.authorize(
                &alice,
                &list(Resource::ConfigMaps, Some(&format!("r{i}"))),
                HubLane::Authorize,
            );
            let e = refusal(r);
            if e.code == 429 {
                told.push(e.retry_after.unwrap());
            } else {
                assert_eq!(e.code, 403);
            }
        }
        assert_eq!(fake.access.load(Ordering::SeqCst), 20, "its burst, no more");
        assert_eq!(told.len(), 981);
        assert!(told.iter().all(|s| *s >= 1 && *s <= 30), "{told:?}");
        assert_eq!(counts.turned_away_for("access"), 981);
        // Kept: answered without the budget.
        a.authorize(&alice, &team_a, HubLane::Answer).unwrap();
        a.authorize(&alice, &team_a, HubLane::Authorize).unwrap();
        // Someone else: a budget of their own.
        let mut bob = alice.clone();
        bob.name = "bob".into();
        a.authorize(&bob, &team_a, HubLane::Authorize).unwrap();
        assert_eq!(fake.access.load(Ordering::SeqCst), 21);
    }

    /// Issue 56.5: all users together are reviewed at the hub's own rate at most (beyond
    /// it a 429, which gives the user's budget back).
    #[test]
    fn all_users_together_are_reviewed_at_a_bounded_rate() {
        let fake = Arc::new(Fake::default());
        let (counts, a) = authz_all(&fake, (0.001, 1.0), (0.001, 50.0));
        let asked = (0..500)
            .filter(|i| {
                let mut u = alice();
                u.name = format!("user-{i}");
                let r = a.authorize(
                    &u,
                    &list(Resource::ConfigMaps, Some("team-a")),
                    HubLane::Authorize,
                );
                !matches!(r, Err(Halt::Refused(e)) if e.code == 429)
            })
            .count();
        assert_eq!(asked, 50);
        assert_eq!(fake.access.load(Ordering::SeqCst), 50);
        assert_eq!(counts.turned_away_for("access_all"), 450);
        assert_eq!(counts.turned_away_for("access"), 0);
        // A user turned away by the hub's bound kept its own budget.
        let mut u = alice();
        u.name = "user-499".into();
        let a = {
            let (_, a) = authz_all(&fake, (0.001, 1.0), (0.001, 0.0));
            let e = refusal(a.authorize(
                &u,
                &list(Resource::ConfigMaps, Some("x")),
                HubLane::Authorize,
            ));
            assert_eq!(e.code, 429);
            a
        };
        let who = user_digest(&u);
        assert!(
            lock(&a.users).take(&who, Instant::now()).is_ok(),
            "refunded"
        );
    }

    /// Issue 56.5: what a client wrote (a 16 KiB path, a namespace) is kept as 32 bytes;
    /// requests that differ in any part are kept apart; a refusal with a reason past
    /// `MAX_REASON` is not kept (asked again), so that the cache's size is bounded.
    #[test]
    fn decisions_are_kept_by_a_digest_of_who_and_what() {
        let alice = alice();
        let who = user_digest(&alice);
        let path = |p: String| Attributes::Path {
            verb: "get",
            path: p,
        };
        let long = "/api/".to_string() + &"/".repeat(16 * 1024);
        assert_ne!(
            digest(&who, &path(long.clone())),
            digest(&who, &path(long + "/"))
        );
        let both = Attributes::Resource {
            verb: "get",
            kind: Resource::ConfigMaps,
            namespace: Some("ab".into()),
            name: None,
        };
        let split = Attributes::Resource {
            verb: "get",
            kind: Resource::ConfigMaps,
            namespace: Some("a".into()),
            name: Some("b".into()),
        };
        assert_ne!(digest(&who, &both), digest(&who, &split));
        let mut other = alice.clone();
        other.groups.push("x".into());
        assert_ne!(who, user_digest(&other));
        let mut other = alice.clone();
        other.extra.insert("k".into(), vec!["v".into()]);
        assert_ne!(who, user_digest(&other));

        struct Wordy(Arc<Fake>);
        impl Reviewer for Wordy {
            fn token(
                &self,
                _: &crate::secret::Secret,
                _: Option<&str>,
            ) -> Result<Option<User>, String> {
                unreachable!()
            }
            fn access(&self, _: &User, _: &Attributes) -> Result<Decision, String> {
                self.0.access.fetch_add(1, Ordering::SeqCst);
                Ok(Decision::Denied("no ".repeat(MAX_REASON)))
            }
            fn account(&self, _: &str, _: &str) -> Result<super::super::reviewer::Account, String> {
                unreachable!()
            }
        }
        let fake = Arc::new(Fake::default());
        let a = Authorizer::new(
            Arc::new(Wordy(fake.clone())),
            Decisions::default(),
            ServerCounts::default(),
        );
        for _ in 0..3 {
            let e = refusal(a.authorize(&alice, &both, HubLane::Authorize));
            assert!(
                e.message.contains(&"no ".repeat(MAX_REASON)),
                "{}",
                e.message
            );
        }
        assert_eq!(fake.access.load(Ordering::SeqCst), 3, "not kept");
    }
}
