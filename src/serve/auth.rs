//! Who asks, and whether they may: every request's bearer token is authenticated with a
//! TokenReview and what it asks is authorized with a SubjectAccessReview (the
//! `Reviewer`: `reviews.rs` asks the apiserver), as the apiserver's webhook authenticator
//! and authorizer do, with their caches: a token's review is kept 2 minutes (10 seconds
//! when it was refused, never past the token's own `exp`), a decision 5 minutes when
//! allowed and 30 seconds when not (the apiserver's `--authentication-token-webhook-
//! cache-ttl`, `--authorization-webhook-cache-authorized-ttl` and `…-unauthorized-ttl`
//! defaults). Each entry lives a random 75–100 % of its time, so that the reviews of a fleet
//! that came at once (a hub's start) do not come back at once, every two minutes for ever.
//!
//! What a review costs is bounded, so that no client holds up the others (docs/serve.md,
//! "Hostile clients"): a request whose token or access is not kept is not reviewed where
//! requests are answered but moved to a lane of its own (`Halt::Lane`), where waiting
//! for the apiserver holds up no one whose decisions are kept; tokens nobody knows are
//! reviewed at a bounded rate (`REVIEW_RATE`, beyond it a 429 with Retry-After, never to a
//! token that is kept), tokens whose kept review expired at a rate of their own
//! (`RENEW_RATE`: a flood of unknown tokens never holds a fleet's renewals up); refused
//! tokens are kept apart from known ones, so a flood of them cannot push a follower out.
//! A review the apiserver could not make (its webhook down or hanging:
//! `reviews::could_not_check`) is a 503 with Retry-After and is not kept: an outage never
//! looks like every follower refused. A token is kept by its SHA-256, never
//! as itself; no token reaches a log line or an error.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::issuer::{self, Issuer, Verdict};
use super::kept::{Budget, Cache};
use super::status::StatusError;
pub use super::user::User;
use crate::backoff::Rng;
use crate::https::server::Holder;
use crate::ops::metrics::{Decisions, ServerCounts};
use crate::secret::Secret;
use crate::source::Resource;

/// How long a review is kept.
pub const TOKEN_TTL: Duration = Duration::from_secs(120);
pub const TOKEN_REFUSED_TTL: Duration = Duration::from_secs(10);
pub const ALLOWED_TTL: Duration = Duration::from_secs(300);
pub const DENIED_TTL: Duration = Duration::from_secs(30);
/// The share of an entry's time it may lose at random.
pub const SPREAD: f64 = 0.25;
/// Entries each cache holds at most (known tokens, refused tokens, decisions).
pub const MAX_ENTRIES: usize = 65_536;
/// TokenReviews of tokens nobody knows, a second at most, and at once.
pub const REVIEW_RATE: f64 = 100.0;
pub const REVIEW_BURST: f64 = 200.0;
/// TokenReviews of tokens whose kept review expired (a follower renewing), a second at
/// most, and at once: a budget of their own, so that a flood of unknown tokens never
/// holds up a fleet's renewals and a fleet's renewals (10,000 followers: about 100 a
/// second, each first review having been spread by `REVIEW_RATE`) never use up the room
/// of new followers.
pub const RENEW_RATE: f64 = 500.0;
pub const RENEW_BURST: f64 = 1000.0;
/// What a follower is told to wait after a review the apiserver could not make.
pub const REVIEW_RETRY_AFTER: u64 = 5;

/// The hub's lanes: where requests are answered (on the server's own thread: nothing
/// there may wait), where reviews are waited for (tokens nobody knows; accesses not kept,
/// of known users), and where what takes time is made (a list rendered for a poll, a
/// page, a gzipped object, `/metrics`).
pub const ANSWER: usize = 0;
pub const AUTHENTICATE: usize = 1;
pub const AUTHORIZE: usize = 2;
pub const RENDER: usize = 3;

/// What a request does, as an authorizer sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Attributes {
    Resource {
        verb: &'static str,
        kind: Resource,
        namespace: Option<String>,
        name: Option<String>,
    },
    Path {
        verb: &'static str,
        path: String,
    },
}

/// An authorizer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Not allowed, with the authorizer's reason (often empty).
    Denied(String),
}

/// Makes the reviews (the apiserver, or a test's stand-in). An `Err` is a review that
/// could not be made.
pub trait Reviewer: Send + Sync {
    /// The user a token is, or `None` when it is not authenticated.
    fn token(&self, token: &Secret) -> Result<Option<User>, String>;
    /// Whether `user` may do `what`.
    fn access(&self, user: &User, what: &Attributes) -> Result<Decision, String>;
}

/// Why a request does not go on here.
#[derive(Debug)]
pub enum Halt {
    /// Refused, in the apiserver's words.
    Refused(StatusError),
    /// It needs work that may wait (a review, a render): ask again on this lane.
    Lane(usize),
}

impl From<StatusError> for Halt {
    fn from(r: StatusError) -> Halt {
        Halt::Refused(r)
    }
}

/// Who a request is: the user, and the key its connections are held under (its token's
/// digest: each pod's token is its own).
#[derive(Clone, Debug)]
pub struct Who {
    pub user: Arc<User>,
    pub holder: Holder,
}

/// Authentication and authorization with their caches.
pub struct Auth {
    reviewer: Box<dyn Reviewer>,
    known: Mutex<Cache<[u8; 32], Arc<User>>>,
    refused: Mutex<Cache<[u8; 32], ()>>,
    access: Mutex<Cache<(Arc<User>, Attributes), Decision>>,
    budget: Mutex<Budget>,
    renewals: Mutex<Budget>,
    decisions: Decisions,
    counts: ServerCounts,
    rng: Mutex<Rng>,
    quiet: Quiet,
    /// `--token-audience`: tokens for the hub verified here (`issuer.rs`).
    issuer: Option<Issuer>,
    /// `--authorize-per-service-account`: a service account's pods share their access
    /// reviews (their users kept without `extra`).
    per_account: bool,
}

impl Auth {
    pub fn new(reviewer: Box<dyn Reviewer>, decisions: Decisions, counts: ServerCounts) -> Auth {
        Auth::with_rate(reviewer, decisions, counts, REVIEW_RATE, REVIEW_BURST)
    }

    /// `new`, with another bound on the reviews of unknown tokens.
    pub fn with_rate(
        reviewer: Box<dyn Reviewer>,
        decisions: Decisions,
        counts: ServerCounts,
        rate: f64,
        burst: f64,
    ) -> Auth {
        Auth {
            reviewer,
            known: Mutex::new(Cache::new(MAX_ENTRIES)),
            refused: Mutex::new(Cache::new(MAX_ENTRIES)),
            access: Mutex::new(Cache::new(MAX_ENTRIES)),
            budget: Mutex::new(Budget::new(rate, burst, Instant::now())),
            renewals: Mutex::new(Budget::new(RENEW_RATE, RENEW_BURST, Instant::now())),
            decisions,
            counts,
            rng: Mutex::new(Rng::from_time()),
            quiet: Quiet::default(),
            issuer: None,
            per_account: false,
        }
    }

    /// Verifies tokens for the hub's audience itself (`--token-audience`).
    pub fn verifying(mut self, issuer: Option<Issuer>) -> Auth {
        self.issuer = issuer;
        self
    }

    /// Reviews a service account's access once for all its pods
    /// (`--authorize-per-service-account`).
    pub fn per_service_account(mut self, on: bool) -> Auth {
        self.per_account = on;
        self
    }

    /// The user as its access is reviewed and kept: with `per_account`, a service
    /// account's without `extra` (its pod, node and credential), which RBAC never reads,
    /// so that its pods share one review per scope.
    fn as_reviewed(&self, mut user: User) -> User {
        if self.per_account && user.name.starts_with("system:serviceaccount:") {
            user.extra.clear();
        }
        user
    }

    /// A token the hub verifies itself (`--token-audience`): `None` when the apiserver
    /// must review it.
    fn verified_here(
        &self,
        token: &Secret,
        key: [u8; 32],
        holder: Holder,
        now: Instant,
    ) -> Option<Result<Who, Halt>> {
        let issuer = self.issuer.as_ref()?;
        match issuer.verify(token.expose(), now) {
            Verdict::Ask => None,
            Verdict::User(user, expires) => {
                let user = Arc::new(self.as_reviewed(user));
                // Kept as long as the token lives: verifying it again would say the same.
                let left = expires - issuer::unix(std::time::SystemTime::now());
                let lives =
                    Duration::try_from_secs_f64(left.clamp(0.0, 86_400.0)).unwrap_or_default();
                let until = crate::backoff::after(now, lives);
                lock(&self.known).put(key, user.clone(), until, now);
                self.decisions.record("authentication", "allowed", "local");
                Some(Ok(Who { user, holder }))
            }
            Verdict::Unavailable(why) => {
                self.decisions.record("authentication", "error", "local");
                self.quiet
                    .warn(|n| log::warn!("--token-audience: cannot verify a token{n}: {why}"));
                Some(Err(StatusError::unavailable(
                    format!("cannot authenticate the request: {why}"),
                    REVIEW_RETRY_AFTER,
                )
                .into()))
            }
            Verdict::NotYet(why) => {
                log::debug!("--token-audience: a token for the hub refused for now: {why}");
                self.decisions.record("authentication", "denied", "local");
                Some(Err(StatusError::unauthorized().into()))
            }
            Verdict::Refused(why) => {
                log::debug!("--token-audience: a token for the hub refused: {why}");
                let until = crate::backoff::after(now, self.spread(TOKEN_REFUSED_TTL));
                lock(&self.known).remove(&key);
                lock(&self.refused).put(key, (), until, now);
                self.decisions.record("authentication", "denied", "local");
                Some(Err(StatusError::unauthorized().into()))
            }
        }
    }

    /// `ttl` less a random share of it, up to `SPREAD`.
    fn spread(&self, ttl: Duration) -> Duration {
        let r = lock(&self.rng).unit();
        ttl.mul_f64(1.0 - SPREAD * r)
    }

    /// The user behind an `Authorization` header; 401 without a bearer token or when the
    /// token is not authenticated. A token not kept is reviewed only `here` (a review
    /// lane); elsewhere the request is sent there.
    pub fn authenticate(&self, authorization: Option<&str>, here: bool) -> Result<Who, Halt> {
        let token = authorization
            .and_then(|h| {
                let (scheme, rest) = h.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty())
            .map(Secret::new);
        let Some(token) = token else {
            self.decisions.record("authentication", "denied", "none");
            return Err(StatusError::unauthorized().into());
        };
        let key: [u8; 32] = Sha256::digest(token.expose().as_bytes()).into();
        let holder = Holder(u64::from_be_bytes([
            key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
        ]));
        let now = Instant::now();
        if let Some(user) = lock(&self.known).get(&key, now) {
            self.decisions.record("authentication", "allowed", "hit");
            return Ok(Who { user, holder });
        }
        if lock(&self.refused).get(&key, now).is_some() {
            self.decisions.record("authentication", "denied", "hit");
            return Err(StatusError::unauthorized().into());
        }
        if !here {
            return Err(Halt::Lane(AUTHENTICATE));
        }
        if let Some(verdict) = self.verified_here(&token, key, holder, now) {
            return verdict;
        }
        let renewal = lock(&self.known).had(&key);
        let (budget, why) = match renewal {
            true => (&self.renewals, "renewals"),
            false => (&self.budget, "reviews"),
        };
        if let Err(wait) = lock(budget).take(now) {
            // Not a decision: no review was made (cmpoll_serve_turned_away_total counts it).
            self.counts.turned_away(why);
            let mut r = StatusError::too_many_requests();
            r.retry_after = Some(wait.as_secs().max(1));
            return Err(r.into());
        }
        let user = match self.reviewer.token(&token) {
            Ok(u) => u,
            Err(e) => {
                self.decisions.record("authentication", "error", "miss");
                self.quiet
                    .warn(|n| log::warn!("cannot review a bearer token{n}: {e}"));
                return Err(StatusError::unavailable(
                    format!("cannot authenticate the request: the TokenReview failed: {e}"),
                    REVIEW_RETRY_AFTER,
                )
                .into());
            }
        };
        match user {
            Some(user) => {
                let user = Arc::new(self.as_reviewed(user));
                // A token's own claims are read only once the review vouched for it, and
                // only to keep its review no longer than the token lives.
                let ttl = self.spread(TOKEN_TTL);
                let lives = lifetime(&token).map_or(ttl, |l| l.min(ttl));
                let until = crate::backoff::after(now, lives);
                lock(&self.known).put(key, user.clone(), until, now);
                self.decisions.record("authentication", "allowed", "miss");
                Ok(Who { user, holder })
            }
            None => {
                let until = crate::backoff::after(now, self.spread(TOKEN_REFUSED_TTL));
                // Refused now: no longer one to renew.
                lock(&self.known).remove(&key);
                lock(&self.refused).put(key, (), until, now);
                self.decisions.record("authentication", "denied", "miss");
                Err(StatusError::unauthorized().into())
            }
        }
    }

    /// Whether `user` may do `what`: `Ok`, or the 403 the apiserver would send. A decision
    /// not kept is reviewed only `here` (a review lane); elsewhere the request is sent
    /// there.
    pub fn authorize(&self, user: &Arc<User>, what: &Attributes, here: bool) -> Result<(), Halt> {
        let key = (user.clone(), what.clone());
        let now = Instant::now();
        let cached = lock(&self.access).get(&key, now);
        let (decision, cache) = match cached {
            Some(d) => (d, "hit"),
            None if !here => return Err(Halt::Lane(AUTHORIZE)),
            None => {
                let d = match self.reviewer.access(user, what) {
                    Ok(d) => d,
                    Err(e) => {
                        self.decisions.record("authorization", "error", "miss");
                        let name = &user.name;
                        self.quiet
                            .warn(|n| log::warn!("cannot review the access of {name}{n}: {e}"));
                        return Err(StatusError::unavailable(
                            format!(
                                "cannot authorize the request: the SubjectAccessReview failed: {e}"
                            ),
                            REVIEW_RETRY_AFTER,
                        )
                        .into());
                    }
                };
                let ttl = self.spread(match d {
                    Decision::Allowed => ALLOWED_TTL,
                    Decision::Denied(_) => DENIED_TTL,
                });
                lock(&self.access).put(key, d.clone(), now + ttl, now);
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
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A warning said at most every 10 seconds, with how many were left unsaid: an outage
/// seen by ten thousand followers is a line, not ten thousand.
#[derive(Default)]
struct Quiet(Mutex<(Option<Instant>, u64)>);

impl Quiet {
    fn warn(&self, say: impl FnOnce(&str)) {
        let mut q = lock(&self.0);
        let now = Instant::now();
        if q.0
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(10))
        {
            q.1 += 1;
            return;
        }
        let more = match q.1 {
            0 => String::new(),
            n => format!(" (and {n} more since the last such line)"),
        };
        *q = (Some(now), 0);
        say(&more);
    }
}

/// How long an authenticated JWT still lives (its `exp`, as the TokenReview left it
/// unchecked by us: only to keep its review no longer). Any `exp`, however large or
/// small, is a duration and never overflows.
fn lifetime(token: &Secret) -> Option<Duration> {
    let payload = token.expose().split('.').nth(1)?;
    let bytes = (base64::engine::general_purpose::URL_SAFE_NO_PAD)
        .decode(payload.trim_end_matches('='))
        .ok()?;
    #[derive(serde::Deserialize)]
    struct Claims {
        exp: Option<serde_json::Number>,
    }
    let exp = serde_json::from_slice::<Claims>(&bytes).ok()?.exp?;
    // An `exp` of any JSON number: a float, a negative or one past u64 is read as what it
    // bounds (past: now; beyond u64: the largest).
    let exp = exp
        .as_u64()
        .or_else(|| exp.as_f64().map(|f| if f <= 0.0 { 0 } else { f as u64 }))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    Some(Duration::from_secs(exp.saturating_sub(now)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Knows token "good" as alice, who may list configmaps in "team-a" only.
    #[derive(Default)]
    struct Fake {
        tokens: AtomicUsize,
        access: AtomicUsize,
        fail: std::sync::atomic::AtomicBool,
        /// Every token is alice.
        anyone: bool,
    }

    impl Reviewer for Arc<Fake> {
        fn token(&self, token: &Secret) -> Result<Option<User>, String> {
            self.tokens.fetch_add(1, Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            Ok((self.anyone || token.expose() == "good").then(|| User {
                name: "alice".into(),
                uid: "u1".into(),
                groups: vec!["system:authenticated".into()],
                extra: BTreeMap::new(),
            }))
        }

        fn access(&self, _user: &User, what: &Attributes) -> Result<Decision, String> {
            self.access.fetch_add(1, Ordering::SeqCst);
            Ok(match what {
                Attributes::Resource {
                    verb: "list",
                    kind: Resource::ConfigMaps,
                    namespace: Some(ns),
                    ..
                } if ns == "team-a" => Decision::Allowed,
                _ => Decision::Denied(String::new()),
            })
        }
    }

    fn hub_auth(fake: &Arc<Fake>, decisions: &Decisions) -> Auth {
        Auth::new(
            Box::new(fake.clone()),
            decisions.clone(),
            ServerCounts::default(),
        )
    }

    /// The code of a refusal (0: sent to a lane).
    fn code<T: std::fmt::Debug>(r: Result<T, Halt>) -> u16 {
        match r.unwrap_err() {
            Halt::Refused(r) => r.code,
            Halt::Lane(_) => 0,
        }
    }

    fn refusal<T: std::fmt::Debug>(r: Result<T, Halt>) -> StatusError {
        match r.unwrap_err() {
            Halt::Refused(r) => r,
            other => panic!("{other:?}"),
        }
    }

    fn list(kind: Resource, ns: Option<&str>) -> Attributes {
        Attributes::Resource {
            verb: "list",
            kind,
            namespace: ns.map(str::to_string),
            name: None,
        }
    }

    #[test]
    fn decisions_are_reviewed_once_and_cached() {
        let fake = Arc::new(Fake::default());
        let decisions = Decisions::default();
        let auth = hub_auth(&fake, &decisions);
        assert_eq!(code(auth.authenticate(None, true)), 401);
        assert_eq!(code(auth.authenticate(Some("Basic eDp5"), true)), 401);
        assert_eq!(code(auth.authenticate(Some("Bearer bad"), true)), 401);
        assert_eq!(code(auth.authenticate(Some("Bearer bad"), false)), 401);
        assert_eq!(
            fake.tokens.load(Ordering::SeqCst),
            1,
            "a refusal is cached too"
        );
        // Where requests are answered, a token not kept goes to be reviewed.
        assert!(matches!(
            auth.authenticate(Some("Bearer good"), false),
            Err(Halt::Lane(AUTHENTICATE))
        ));
        let alice = auth.authenticate(Some("Bearer good"), true).unwrap();
        let again = auth.authenticate(Some("bearer  good "), false).unwrap();
        assert_eq!(alice.user, again.user);
        assert_eq!(alice.holder, again.holder);
        let alice = alice.user;
        assert_eq!(fake.tokens.load(Ordering::SeqCst), 2);
        let team_a = list(Resource::ConfigMaps, Some("team-a"));
        assert!(matches!(
            auth.authorize(&alice, &team_a, false),
            Err(Halt::Lane(AUTHORIZE))
        ));
        auth.authorize(&alice, &team_a, true).unwrap();
        auth.authorize(&alice, &team_a, false).unwrap();
        assert_eq!(fake.access.load(Ordering::SeqCst), 1);
        let e = refusal(auth.authorize(&alice, &list(Resource::Secrets, Some("team-a")), true));
        assert_eq!(
            e.message,
            "secrets is forbidden: User \"alice\" cannot list resource \"secrets\" in API group \"\" in the namespace \"team-a\""
        );
        assert_eq!(
            code(auth.authorize(&alice, &list(Resource::ConfigMaps, None), true)),
            403
        );
        assert_eq!(decisions.get("authorization", "allowed", "hit"), 1);
        assert_eq!(decisions.get("authentication", "denied", "hit"), 1);
        // A review that cannot be made is a 503, and not kept.
        fake.fail.store(true, Ordering::SeqCst);
        let e = refusal(auth.authenticate(Some("Bearer other"), true));
        assert_eq!((e.code, e.retry_after), (503, Some(REVIEW_RETRY_AFTER)));
        assert_eq!(code(auth.authenticate(Some("Bearer other"), true)), 503);
        assert_eq!(fake.tokens.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn entries_reviewed_at_once_do_not_expire_at_once() {
        let auth = hub_auth(&Arc::new(Fake::default()), &Decisions::default());
        let lives: Vec<Duration> = (0..200).map(|_| auth.spread(TOKEN_TTL)).collect();
        let (min, max) = (lives.iter().min().unwrap(), lives.iter().max().unwrap());
        assert!(*min >= TOKEN_TTL.mul_f64(1.0 - SPREAD), "{min:?}");
        assert!(*max <= TOKEN_TTL, "{max:?}");
        assert!(*max - *min > Duration::from_secs(20), "{min:?}..{max:?}");
    }

    /// An `Auth` on a fake apiserver whose unknown tokens are reviewed at `rate` a second
    /// (a burst of `burst`), with the counts it keeps.
    fn rated(rate: f64, burst: f64) -> (Arc<Fake>, ServerCounts, Auth) {
        let fake = Arc::new(Fake::default());
        let counts = ServerCounts::default();
        let auth = Auth::with_rate(
            Box::new(fake.clone()),
            Decisions::default(),
            counts.clone(),
            rate,
            burst,
        );
        (fake, counts, auth)
    }

    /// Issue 47.3: a flood of tokens nobody knows costs the apiserver a bounded rate of
    /// reviews (beyond it, a 429 with Retry-After); it never reaches a known token, and
    /// the refused ones it leaves behind never push a known one out.
    #[test]
    fn unknown_tokens_are_reviewed_at_a_bounded_rate_and_never_crowd_out_known_ones() {
        let (fake, counts, auth) = rated(1.0, 10.0);
        let alice = auth.authenticate(Some("Bearer good"), true).unwrap();
        let mut turned = 0;
        for i in 0..(MAX_ENTRIES + 100) {
            match auth.authenticate(Some(&format!("Bearer flood-{i}")), true) {
                Err(Halt::Refused(r)) if r.code == 429 => {
                    assert!(r.retry_after.is_some_and(|s| s >= 1));
                    turned += 1;
                }
                Err(Halt::Refused(r)) => assert_eq!(r.code, 401),
                other => panic!("{other:?}"),
            }
        }
        assert!(fake.tokens.load(Ordering::SeqCst) <= 12, "reviews bounded");
        assert!(turned >= MAX_ENTRIES, "{turned}");
        assert_eq!(counts.turned_away_for("reviews"), turned as u64);
        // The known token is still known, without a review and without the budget.
        let asked = fake.tokens.load(Ordering::SeqCst);
        let again = auth.authenticate(Some("Bearer good"), false).unwrap();
        assert_eq!(again.user, alice.user);
        assert_eq!(fake.tokens.load(Ordering::SeqCst), asked);
        // Refused tokens fill their own cache, never the known one's.
        let fake = Arc::new(Fake::default());
        let auth = Auth::with_rate(
            Box::new(fake.clone()),
            Decisions::default(),
            ServerCounts::default(),
            1e9,
            1e9,
        );
        auth.authenticate(Some("Bearer good"), true).unwrap();
        for i in 0..(MAX_ENTRIES + 10) {
            let _ = auth.authenticate(Some(&format!("Bearer refused-{i}")), true);
        }
        assert_eq!(lock(&auth.refused).len(), MAX_ENTRIES);
        let asked = fake.tokens.load(Ordering::SeqCst);
        auth.authenticate(Some("Bearer good"), false).unwrap();
        assert_eq!(fake.tokens.load(Ordering::SeqCst), asked, "still kept");
    }

    /// A follower renewing its token (its kept review expired) is reviewed on a budget
    /// of its own: unknown tokens that used up theirs never hold it up (at 10,000
    /// followers the renewals alone are about the review rate).
    #[test]
    fn a_token_whose_review_expired_is_renewed_whatever_unknown_tokens_used() {
        let (fake, counts, auth) = rated(0.001, 1.0);
        let alice = auth.authenticate(Some("Bearer good"), true).unwrap();
        let e = refusal(auth.authenticate(Some("Bearer flood"), true));
        assert_eq!(e.code, 429, "the budget of unknown tokens is used up");
        // Its review expires.
        let key: [u8; 32] = Sha256::digest(b"good").into();
        let now = Instant::now();
        lock(&auth.known).put(key, alice.user.clone(), now, now);
        assert!(matches!(
            auth.authenticate(Some("Bearer good"), false),
            Err(Halt::Lane(AUTHENTICATE))
        ));
        let asked = fake.tokens.load(Ordering::SeqCst);
        let again = auth.authenticate(Some("Bearer good"), true).unwrap();
        assert_eq!(again.user, alice.user);
        assert_eq!(
            fake.tokens.load(Ordering::SeqCst),
            asked + 1,
            "reviewed again"
        );
        assert_eq!(counts.turned_away_for("renewals"), 0);
        // Still the review budget for the others; a refused renewal is no longer known.
        assert_eq!(refusal(auth.authenticate(Some("Bearer x"), true)).code, 429);
        lock(&auth.known).put(Sha256::digest(b"bad").into(), alice.user, now, now);
        assert_eq!(
            refusal(auth.authenticate(Some("Bearer bad"), true)).code,
            401
        );
        assert!(!lock(&auth.known).had(&Sha256::digest(b"bad").into()));
    }

    fn jwt(claims: &str) -> Secret {
        let b = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        Secret::new(format!("{}.{}.sig", b("{\"alg\":\"RS256\"}"), b(claims)))
    }

    #[test]
    fn a_jwt_is_not_trusted_past_its_exp() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let soon = lifetime(&jwt(&format!("{{\"exp\":{}}}", now + 5))).unwrap();
        assert!(soon <= Duration::from_secs(5));
        assert_eq!(
            lifetime(&jwt(&format!("{{\"exp\":{}}}", now - 5))),
            Some(Duration::ZERO)
        );
        assert_eq!(lifetime(&Secret::new("opaque")), None);
    }

    /// Issue 47: a token's claims reached `Instant + Duration`, which panics past the
    /// clock's range; eight such requests took every worker. No `exp` a client may write
    /// panics, authenticated or not.
    #[test]
    fn no_exp_a_client_writes_panics() {
        let fake = Arc::new(Fake::default());
        let auth = hub_auth(&fake, &Decisions::default());
        for exp in [
            "18446744073709551615",
            "10000000000000000000",
            "1e300",
            "-1",
            "-1e300",
            "0.5",
            "99999999999999999999999999999999",
        ] {
            let token = jwt(&format!("{{\"exp\":{exp}}}"));
            let header = format!("Bearer {}", token.expose());
            assert_eq!(code(auth.authenticate(Some(&header), true)), 401, "{exp}");
        }
        // Authenticated, with an exp past u64: kept for the review's own time.
        let fake = Arc::new(Fake {
            anyone: true,
            ..Fake::default()
        });
        let auth = hub_auth(&fake, &Decisions::default());
        for exp in ["18446744073709551615", "1e300", "-1e300"] {
            let header = format!("Bearer {}", jwt(&format!("{{\"exp\":{exp}}}")).expose());
            auth.authenticate(Some(&header), true).unwrap();
            auth.authenticate(Some(&header), true).unwrap();
        }
        assert_eq!(
            fake.tokens.load(Ordering::SeqCst),
            4,
            "kept, but for the expired one"
        );
    }

    /// Every token "pod-N" is service account team/agent in pod N.
    #[derive(Default)]
    struct Pods {
        tokens: AtomicUsize,
        access: AtomicUsize,
    }

    impl Reviewer for Arc<Pods> {
        fn token(&self, token: &Secret) -> Result<Option<User>, String> {
            self.tokens.fetch_add(1, Ordering::SeqCst);
            let pod = token.expose().strip_prefix("pod-").map(str::to_string);
            Ok(pod.map(|pod| User {
                name: "system:serviceaccount:team:agent".into(),
                uid: "sa-uid".into(),
                groups: vec!["system:serviceaccounts".into()],
                extra: [(
                    "authentication.kubernetes.io/pod-name".to_string(),
                    vec![pod],
                )]
                .into(),
            }))
        }

        fn access(&self, _user: &User, _what: &Attributes) -> Result<Decision, String> {
            self.access.fetch_add(1, Ordering::SeqCst);
            Ok(Decision::Allowed)
        }
    }

    /// Issue 49.2: a DaemonSet's pods differ only in `extra`; with
    /// `--authorize-per-service-account` their access is reviewed once per scope, without
    /// it once per pod.
    #[test]
    fn a_service_accounts_pods_share_their_access_review_when_asked() {
        for (per_account, reviews) in [(false, 5), (true, 1)] {
            let pods = Arc::new(Pods::default());
            let auth = Auth::new(
                Box::new(pods.clone()),
                Decisions::default(),
                ServerCounts::default(),
            )
            .per_service_account(per_account);
            for n in 0..5 {
                let who = auth
                    .authenticate(Some(&format!("Bearer pod-{n}")), true)
                    .unwrap();
                let what = list(Resource::ConfigMaps, Some("team"));
                auth.authorize(&who.user, &what, true).unwrap();
            }
            assert_eq!(pods.access.load(Ordering::SeqCst), reviews, "{per_account}");
            assert_eq!(pods.tokens.load(Ordering::SeqCst), 5, "each token reviewed");
        }
    }

    /// Issue 49.2: with `--token-audience`, a token the issuer signed for the hub is
    /// verified without a TokenReview, one it did not sign is refused without one, and any
    /// other token is reviewed by the apiserver as before.
    #[test]
    fn tokens_for_the_hub_are_verified_here() {
        use crate::serve::testing::Signer;
        let key = Signer::new("k1");
        let jwk = key.jwk();
        let fetch: issuer::Fetch = Box::new(move |path: &str, _: &str| {
            Ok(match path {
                "/.well-known/openid-configuration" => {
                    br#"{"issuer":"https://kubernetes.default.svc","jwks_uri":"https://x/openid/v1/jwks"}"#.to_vec()
                }
                _ => serde_json::json!({ "keys": [jwk.clone()] }).to_string().into_bytes(),
            })
        });
        let fake = Arc::new(Fake::default());
        let decisions = Decisions::default();
        let auth =
            hub_auth(&fake, &decisions).verifying(Some(Issuer::new("cmpoll-hub".into(), fetch)));
        let now = issuer::unix(std::time::SystemTime::now());
        let claims = |aud: &str| {
            serde_json::json!({"iss": "https://kubernetes.default.svc", "aud": aud,
                "exp": now + 600.0, "nbf": now,
                "kubernetes.io": {"namespace": "team",
                    "serviceaccount": {"name": "agent", "uid": "sa-uid"}}})
        };
        let bearer = |t: String| format!("Bearer {t}");
        let who = auth
            .authenticate(Some(&bearer(key.sign(&claims("cmpoll-hub")))), true)
            .unwrap();
        assert_eq!(who.user.name, "system:serviceaccount:team:agent");
        let forged = Signer::new("k1").sign(&claims("cmpoll-hub"));
        assert_eq!(code(auth.authenticate(Some(&bearer(forged)), true)), 401);
        assert_eq!(fake.tokens.load(Ordering::SeqCst), 0, "no TokenReview");
        // The apiserver's audience: reviewed by the apiserver (which knows it as "good"
        // here only when it is "good").
        let theirs = key.sign(&claims("https://kubernetes.default.svc"));
        assert_eq!(code(auth.authenticate(Some(&bearer(theirs)), true)), 401);
        assert_eq!(fake.tokens.load(Ordering::SeqCst), 1);
        assert!(auth.authenticate(Some("Bearer good"), true).is_ok());
    }
}
