//! Who a request is: its bearer token authenticated with a TokenReview (the `Reviewer`),
//! as the apiserver's webhook authenticator does, with its cache: a token's review is kept
//! 2 minutes (10 seconds when it was refused, never past the token's own `exp`), each a
//! random 75–100 % of that, so that a fleet reviewed at once (a hub's start) does not come
//! back at once. With `--token-audience`, a token for the hub is verified here instead
//! (`issuer.rs`), and its service account checked (`accounts.rs`).
//!
//! What a review costs is bounded (docs/serve.md, "Hostile clients"): tokens are reviewed
//! only on a lane of their own (`Halt::Lane`), and tokens not kept draw on budgets —
//! `RENEW_RATE` for a token whose kept review expired (a follower renewing), `SIGNED_RATE`
//! for one the cluster's issuer signed (a fleet arriving: it admits ten thousand followers
//! at once), `REVIEW_RATE` for anything else (garbage, and the tokens the hub refuses
//! itself) — each beyond its rate a 429 whose Retry-After spreads the refused over the
//! budget's time, never to a kept token. Refused tokens are kept apart from known ones, so
//! a flood of them cannot push a follower out. A review the apiserver could not make is a
//! 503 with Retry-After and is not kept. A token is kept by its SHA-256, never as itself;
//! no token reaches a log line or an error.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::accounts::{ACCOUNT_TTL, Accounts, Check};
use super::issuer::{self, AccountRef, Issuer, Verdict};
use super::kept::{Budget, Cache};
use super::reviewer::{self, Halt, HubLane, Quiet, Reviewer};
use super::status::StatusError;
use super::user::User;
use crate::backoff::Rng;
use crate::https::server::Holder;
use crate::locks::Recover;
use crate::ops::metrics::{Decisions, ServerCounts};
use crate::secret::Secret;

/// How long a review is kept.
pub const TOKEN_TTL: Duration = Duration::from_secs(120);
pub const TOKEN_REFUSED_TTL: Duration = Duration::from_secs(10);
/// The share of an entry's time it may lose at random.
pub const SPREAD: f64 = 0.25;
/// Entries each cache holds at most (known tokens, refused tokens).
pub const MAX_ENTRIES: usize = 65_536;
/// TokenReviews of tokens nobody knows and the cluster did not sign (and the refusals the
/// hub makes itself), a second at most, and at once.
pub const REVIEW_RATE: f64 = 100.0;
pub const REVIEW_BURST: f64 = 200.0;
/// TokenReviews of tokens nobody knows that the cluster's issuer signed and that have not
/// expired, a second, and at once: a fleet after a hub's start or rollout (10,000
/// followers arriving at 500 a second) is reviewed as it arrives, while garbage stays at
/// `REVIEW_RATE`.
pub const SIGNED_RATE: f64 = 1000.0;
pub const SIGNED_BURST: f64 = 2000.0;
/// TokenReviews of tokens whose kept review expired (a follower renewing), a second at
/// most, and at once: a budget of their own, so that a flood of unknown tokens never
/// holds up a fleet's renewals and a fleet's renewals (10,000 followers: about 100 a
/// second) never use up the room of new followers.
pub const RENEW_RATE: f64 = 500.0;
pub const RENEW_BURST: f64 = 1000.0;
/// What a follower is told to wait after a review the apiserver could not make.
pub const REVIEW_RETRY_AFTER: u64 = 5;

/// Who a request is: the user, and the key its connections are held under (its token's
/// digest: each pod's token is its own).
#[derive(Clone, Debug)]
pub struct Who {
    pub user: Arc<User>,
    pub holder: Holder,
}

/// Which budget a token's review draws on.
#[derive(Clone, Copy)]
enum Class {
    Unknown,
    Signed,
}

/// The budgets reviews draw on: tokens nobody knows (and the hub's own refusals), those
/// the cluster's issuer signed, and renewals; each by its own lock.
struct ReviewBudgets {
    unknown: Mutex<Budget>,
    signed: Mutex<Budget>,
    renewals: Mutex<Budget>,
}

impl ReviewBudgets {
    fn new((rate, burst): (f64, f64), now: Instant) -> ReviewBudgets {
        ReviewBudgets {
            unknown: Mutex::new(Budget::new(rate, burst, now)),
            signed: Mutex::new(Budget::new(SIGNED_RATE, SIGNED_BURST, now)),
            renewals: Mutex::new(Budget::new(RENEW_RATE, RENEW_BURST, now)),
        }
    }

    /// One review of a token of `class` (a `renewal` whatever its class), or how long to
    /// wait and the budget's name (`cmpoll_serve_turned_away_total`).
    fn take(
        &self,
        renewal: bool,
        class: Class,
        now: Instant,
    ) -> Result<(), (Duration, &'static str)> {
        let (budget, why) = match (renewal, class) {
            (true, _) => (&self.renewals, "renewals"),
            (false, Class::Signed) => (&self.signed, "signed"),
            (false, Class::Unknown) => (&self.unknown, "reviews"),
        };
        lock(budget).take(now).map_err(|wait| (wait, why))
    }
}

/// Authentication with its caches and budgets.
pub struct Authenticator {
    reviewer: Arc<dyn Reviewer>,
    known: Mutex<Cache<[u8; 32], Arc<User>>>,
    refused: Mutex<Cache<[u8; 32], ()>>,
    budgets: ReviewBudgets,
    decisions: Decisions,
    counts: ServerCounts,
    rng: Mutex<Rng>,
    quiet: Quiet,
    /// The cluster's issuer: which tokens it signed; with `--token-audience`, tokens for
    /// the hub verified here.
    issuer: Option<Issuer>,
    accounts: Accounts,
    /// `--authorize-per-service-account`: a service account's pods share their access
    /// reviews (their users kept without `extra`).
    per_account: bool,
}

impl Authenticator {
    /// Unknown tokens reviewed at `rate` a second (a burst of `burst`).
    pub fn new(
        reviewer: Arc<dyn Reviewer>,
        decisions: Decisions,
        counts: ServerCounts,
        (rate, burst): (f64, f64),
    ) -> Self {
        let now = Instant::now();
        Authenticator {
            reviewer,
            known: Mutex::new(Cache::new(MAX_ENTRIES)),
            refused: Mutex::new(Cache::new(MAX_ENTRIES)),
            budgets: ReviewBudgets::new((rate, burst), now),
            decisions,
            counts,
            rng: Mutex::new(Rng::from_time()),
            quiet: Quiet::default(),
            issuer: None,
            accounts: Accounts::default(),
            per_account: false,
        }
    }

    pub fn verifying(mut self, issuer: Option<Issuer>) -> Self {
        self.issuer = issuer;
        self
    }

    pub fn per_service_account(mut self, on: bool) -> Self {
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

    /// `ttl` less a random share of it, up to `SPREAD`.
    pub fn spread(&self, ttl: Duration) -> Duration {
        let r = lock(&self.rng).unit();
        ttl.mul_f64(1.0 - SPREAD * r)
    }

    /// The user behind an `Authorization` header; 401 without a bearer token or when the
    /// token is not authenticated. A token not kept is reviewed only on a `lane` that
    /// `may_wait` (a review
    /// lane); elsewhere the request is sent there.
    pub fn authenticate(&self, authorization: Option<&str>, lane: HubLane) -> Result<Who, Halt> {
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
        let holder = holder(&key);
        let now = Instant::now();
        if let Some(user) = lock(&self.known).get(&key, now) {
            self.decisions.record("authentication", "allowed", "hit");
            return Ok(Who { user, holder });
        }
        if lock(&self.refused).get(&key, now).is_some() {
            self.decisions.record("authentication", "denied", "hit");
            return Err(StatusError::unauthorized().into());
        }
        if super::jwt::noncanonical(token.expose()) {
            // One token in many spellings would be many to the hub: refused, unreviewed
            // (never kept, so a token found above is canonical).
            self.decisions.record("authentication", "denied", "none");
            return Err(StatusError::unauthorized().into());
        }
        if !lane.may_wait() {
            return Err(Halt::Lane(HubLane::Authenticate));
        }
        let verdict = (self.issuer.as_ref()).map_or(Verdict::Ask { signed: false }, |i| {
            i.verify(token.expose(), now)
        });
        let user = match verdict {
            Verdict::User(user, expires, account) => {
                return self.verified(&token, key, user, (expires, account), now);
            }
            Verdict::Refused(why) => return Err(self.refused_here(key, &why, true, now)),
            Verdict::NotYet(why) => return Err(self.refused_here(key, &why, false, now)),
            Verdict::Unavailable(why) => return Err(self.unavailable(&why)),
            Verdict::Recheck => self.reviewed(&token, key, Class::Signed, true, now)?,
            Verdict::Ask { signed: true } => {
                self.reviewed(&token, key, Class::Signed, false, now)?
            }
            Verdict::Ask { signed: false } => {
                self.reviewed(&token, key, Class::Unknown, false, now)?
            }
        };
        Ok(Who { user, holder })
    }

    /// A token for the hub its issuer signed (`--token-audience`): its service account
    /// checked as the apiserver checks it, then kept while both hold (the account's read is
    /// a minute old at most), never past the token's expiry.
    fn verified(
        &self,
        token: &Secret,
        key: [u8; 32],
        user: User,
        (expires, (ns, name)): (f64, AccountRef),
        now: Instant,
    ) -> Result<Who, Halt> {
        let unix = issuer::unix(std::time::SystemTime::now());
        let holder = holder(&key);
        let check = self
            .accounts
            .check(self.reviewer.as_ref(), (&ns, &name, &user.uid), now, unix);
        match check {
            Check::Holds => {}
            Check::Refused(why) => return Err(self.refused_here(key, &why, true, now)),
            Check::Unavailable(why) => return Err(self.unavailable(&why)),
            Check::Unreadable => {
                self.quiet.warn(|n| {
                    log::warn!(
                        "--token-audience: the hub may not get serviceaccounts{n}, so it cannot check that a token's account still exists: tokens for it are reviewed by the apiserver instead (k8s/serve/clusterrole.yaml grants get serviceaccounts)"
                    )
                });
                let user = self.reviewed(token, key, Class::Signed, true, now)?;
                return Ok(Who { user, holder });
            }
        }
        let user = Arc::new(self.as_reviewed(user));
        let left = (expires - unix).clamp(0.0, ACCOUNT_TTL.as_secs_f64());
        let lives = self.spread(Duration::try_from_secs_f64(left).unwrap_or_default());
        lock(&self.known).put(key, user.clone(), crate::backoff::after(now, lives));
        self.decisions.record("authentication", "allowed", "local");
        Ok(Who { user, holder })
    }

    /// A token the hub refuses itself (`--token-audience`: not what the issuer signed, not
    /// valid, its account gone): a 401, kept (`keep`) as a refusal — from the budget of
    /// unknown tokens, as a review would be, so that forged tokens cost what garbage costs
    /// and fill the refusal cache no faster (beyond it, 429).
    fn refused_here(&self, key: [u8; 32], why: &str, keep: bool, now: Instant) -> Halt {
        log::debug!("--token-audience: a token for the hub refused: {why}");
        if let Err((wait, why)) = self.budgets.take(false, Class::Unknown, now) {
            self.counts.turned_away(why);
            return reviewer::over_budget(wait);
        }
        if keep {
            let until = crate::backoff::after(now, self.spread(TOKEN_REFUSED_TTL));
            lock(&self.known).remove(&key);
            lock(&self.refused).put(key, (), until);
        }
        self.decisions.record("authentication", "denied", "local");
        StatusError::unauthorized().into()
    }

    fn unavailable(&self, why: &str) -> Halt {
        self.decisions.record("authentication", "error", "local");
        self.quiet
            .warn(|n| log::warn!("--token-audience: cannot verify a token{n}: {why}"));
        StatusError::unavailable(
            format!("cannot authenticate the request: {why}"),
            REVIEW_RETRY_AFTER,
        )
        .into()
    }

    /// A TokenReview of `token` (for the hub's audience: `for_hub`), from its budget; the
    /// user it is, kept.
    fn reviewed(
        &self,
        token: &Secret,
        key: [u8; 32],
        class: Class,
        for_hub: bool,
        now: Instant,
    ) -> Result<Arc<User>, Halt> {
        let renewal = lock(&self.known).had(&key);
        if let Err((wait, why)) = self.budgets.take(renewal, class, now) {
            // Not a decision: no review was made (cmpoll_serve_turned_away_total counts it).
            self.counts.turned_away(why);
            return Err(reviewer::over_budget(wait));
        }
        let audience = (self.issuer.as_ref())
            .and_then(Issuer::audience)
            .filter(|_| for_hub);
        let user = self.reviewer.token(token, audience).map_err(|e| {
            self.decisions.record("authentication", "error", "miss");
            self.quiet
                .warn(|n| log::warn!("cannot review a bearer token{n}: {e}"));
            Halt::from(StatusError::unavailable(
                format!("cannot authenticate the request: the TokenReview failed: {e}"),
                REVIEW_RETRY_AFTER,
            ))
        })?;
        match user {
            Some(user) => {
                let user = Arc::new(self.as_reviewed(user));
                // A token's own claims are read only once the review vouched for it, and
                // only to keep its review no longer than the token lives.
                let ttl = self.spread(TOKEN_TTL);
                let lives = lifetime(token).map_or(ttl, |l| l.min(ttl));
                let until = crate::backoff::after(now, lives);
                lock(&self.known).put(key, user.clone(), until);
                self.decisions.record("authentication", "allowed", "miss");
                Ok(user)
            }
            None => {
                let until = crate::backoff::after(now, self.spread(TOKEN_REFUSED_TTL));
                // Refused now: no longer one to renew.
                lock(&self.known).remove(&key);
                lock(&self.refused).put(key, (), until);
                self.decisions.record("authentication", "denied", "miss");
                Err(StatusError::unauthorized().into())
            }
        }
    }
}

/// The key a token's connections are held under.
fn holder(key: &[u8; 32]) -> Holder {
    Holder(u64::from_be_bytes([
        key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
    ]))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().recover()
}

/// How long an authenticated JWT still lives (its `exp`, as the TokenReview left it
/// unchecked by us: only to keep its review no longer). Any `exp`, however large or
/// small, is a duration and never overflows.
fn lifetime(token: &Secret) -> Option<Duration> {
    let exp = super::jwt::expiry(token.expose())?;
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
mod tests;
