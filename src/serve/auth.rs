//! Who asks, and whether they may: every request's bearer token is authenticated with a
//! TokenReview and what it asks is authorized with a SubjectAccessReview (the
//! `Reviewer`: `reviews.rs` asks the apiserver), as the apiserver's webhook authenticator
//! and authorizer do, with their caches: a token's review is kept 2 minutes (10 seconds
//! when it was refused, never past the token's own `exp`), a decision 5 minutes when
//! allowed and 30 seconds when not (the apiserver's `--authentication-token-webhook-
//! cache-ttl`, `--authorization-webhook-cache-authorized-ttl` and `…-unauthorized-ttl`
//! defaults). Each entry lives a random 75–100 % of its time, so that the reviews of a fleet
//! that came at once (a hub's start) do not come back at once, every two minutes for ever.
//! Both caches are bounded; a token is kept by its SHA-256, never as itself. A
//! review that cannot be made is a 503 (the follower keeps what it has and retries), and
//! is not cached. No token reaches a log line or an error.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::status::Refusal;
use crate::backoff::Rng;
use crate::ops::metrics::Decisions;
use crate::secret::Secret;
use crate::source::Resource;

/// How long a review is kept.
pub const TOKEN_TTL: Duration = Duration::from_secs(120);
pub const TOKEN_REFUSED_TTL: Duration = Duration::from_secs(10);
pub const ALLOWED_TTL: Duration = Duration::from_secs(300);
pub const DENIED_TTL: Duration = Duration::from_secs(30);
/// The share of an entry's time it may lose at random.
pub const SPREAD: f64 = 0.25;
/// Entries each cache holds at most.
pub const MAX_ENTRIES: usize = 16_384;

/// An authenticated user, as the TokenReview said.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

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

/// Makes the reviews (the apiserver, or a test's stand-in).
pub trait Reviewer: Send + Sync {
    /// The user a token is, or `None` when it is not authenticated.
    fn token(&self, token: &Secret) -> Result<Option<User>, String>;
    /// Whether `user` may do `what`.
    fn access(&self, user: &User, what: &Attributes) -> Result<Decision, String>;
}

/// A bounded map whose entries expire.
struct Cache<K, V> {
    map: HashMap<K, (V, Instant)>,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Cache {
            map: HashMap::new(),
        }
    }

    fn get(&self, k: &K, now: Instant) -> Option<V> {
        self.map
            .get(k)
            .filter(|(_, until)| *until > now)
            .map(|(v, _)| v.clone())
    }

    fn put(&mut self, k: K, v: V, until: Instant, now: Instant) {
        if self.map.len() >= MAX_ENTRIES && !self.map.contains_key(&k) {
            self.map.retain(|_, (_, u)| *u > now);
            if self.map.len() >= MAX_ENTRIES {
                // Still full of live entries: the one closest to expiring goes.
                let first = (self.map.iter())
                    .min_by_key(|(_, (_, u))| *u)
                    .map(|(k, _)| k.clone());
                if let Some(first) = first {
                    self.map.remove(&first);
                }
            }
        }
        self.map.insert(k, (v, until));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Authentication and authorization with their caches.
pub struct Auth {
    reviewer: Box<dyn Reviewer>,
    tokens: Mutex<Cache<[u8; 32], Option<User>>>,
    access: Mutex<Cache<(User, Attributes), Decision>>,
    decisions: Decisions,
    rng: Mutex<Rng>,
}

impl Auth {
    pub fn new(reviewer: Box<dyn Reviewer>, decisions: Decisions) -> Auth {
        Auth {
            reviewer,
            tokens: Mutex::new(Cache::new()),
            access: Mutex::new(Cache::new()),
            decisions,
            rng: Mutex::new(Rng::from_time()),
        }
    }

    /// `ttl` less a random share of it, up to `SPREAD`.
    fn spread(&self, ttl: Duration) -> Duration {
        let r = self.rng.lock().unwrap_or_else(|p| p.into_inner()).unit();
        ttl.mul_f64(1.0 - SPREAD * r)
    }

    /// The user behind an `Authorization` header; 401 without a bearer token or when the
    /// token is not authenticated.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<User, Refusal> {
        let token = authorization
            .and_then(|h| {
                let (scheme, rest) = h.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty())
            .map(Secret::new);
        let Some(token) = token else {
            self.decisions.record("authentication", "denied", "none");
            return Err(Refusal::unauthorized());
        };
        let key: [u8; 32] = Sha256::digest(token.expose().as_bytes()).into();
        let now = Instant::now();
        let cached = self.lock_tokens().get(&key, now);
        let (user, cache) = match cached {
            Some(user) => (user, "hit"),
            None => {
                let user = match self.reviewer.token(&token) {
                    Ok(u) => u,
                    Err(e) => {
                        self.decisions.record("authentication", "error", "miss");
                        log::warn!("cannot review a bearer token: {e}");
                        return Err(Refusal::unavailable(
                            format!("cannot authenticate the request: the TokenReview failed: {e}"),
                            1,
                        ));
                    }
                };
                let ttl = self.spread(if user.is_some() {
                    TOKEN_TTL
                } else {
                    TOKEN_REFUSED_TTL
                });
                // A token's own claims are read only once the review vouched for it, and
                // only to keep its review no longer than the token lives.
                let lives = user.as_ref().and_then(|_| lifetime(&token));
                let until = crate::backoff::after(now, lives.map_or(ttl, |l| l.min(ttl)));
                self.lock_tokens().put(key, user.clone(), until, now);
                (user, "miss")
            }
        };
        match user {
            Some(u) => {
                self.decisions.record("authentication", "allowed", cache);
                Ok(u)
            }
            None => {
                self.decisions.record("authentication", "denied", cache);
                Err(Refusal::unauthorized())
            }
        }
    }

    /// Whether a decision still kept allows `user` to do one of `any`; asks no one.
    pub fn allowed_already(&self, user: &User, any: &[Attributes]) -> bool {
        let now = Instant::now();
        let access = self.lock_access();
        let allowed = (any.iter())
            .any(|what| access.get(&(user.clone(), what.clone()), now) == Some(Decision::Allowed));
        drop(access);
        if allowed {
            self.decisions.record("authorization", "allowed", "hit");
        }
        allowed
    }

    /// Whether `user` may do `what`: `Ok`, or the 403 the apiserver would send.
    pub fn authorize(&self, user: &User, what: &Attributes) -> Result<(), Refusal> {
        let key = (user.clone(), what.clone());
        let now = Instant::now();
        let cached = self.lock_access().get(&key, now);
        let (decision, cache) = match cached {
            Some(d) => (d, "hit"),
            None => {
                let d = match self.reviewer.access(user, what) {
                    Ok(d) => d,
                    Err(e) => {
                        self.decisions.record("authorization", "error", "miss");
                        log::warn!("cannot review the access of {}: {e}", user.name);
                        return Err(Refusal::unavailable(
                            format!(
                                "cannot authorize the request: the SubjectAccessReview failed: {e}"
                            ),
                            1,
                        ));
                    }
                };
                let ttl = self.spread(match d {
                    Decision::Allowed => ALLOWED_TTL,
                    Decision::Denied(_) => DENIED_TTL,
                });
                self.lock_access().put(key, d.clone(), now + ttl, now);
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
                Err(match what {
                    Attributes::Resource {
                        verb,
                        kind,
                        namespace,
                        name,
                    } => Refusal::forbidden(
                        &user.name,
                        verb,
                        *kind,
                        namespace.as_deref(),
                        name.as_deref(),
                        &why,
                    ),
                    Attributes::Path { verb, path } => {
                        Refusal::forbidden_path(&user.name, verb, path, &why)
                    }
                })
            }
        }
    }

    fn lock_tokens(&self) -> std::sync::MutexGuard<'_, Cache<[u8; 32], Option<User>>> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_access(&self) -> std::sync::MutexGuard<'_, Cache<(User, Attributes), Decision>> {
        self.access.lock().unwrap_or_else(|p| p.into_inner())
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
    use std::sync::Arc;
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
        let auth = Auth::new(Box::new(fake.clone()), decisions.clone());
        assert_eq!(auth.authenticate(None).unwrap_err().code, 401);
        assert_eq!(auth.authenticate(Some("Basic eDp5")).unwrap_err().code, 401);
        assert_eq!(auth.authenticate(Some("Bearer bad")).unwrap_err().code, 401);
        assert_eq!(auth.authenticate(Some("Bearer bad")).unwrap_err().code, 401);
        assert_eq!(
            fake.tokens.load(Ordering::SeqCst),
            1,
            "a refusal is cached too"
        );
        let alice = auth.authenticate(Some("Bearer good")).unwrap();
        let again = auth.authenticate(Some("bearer  good ")).unwrap();
        assert_eq!(alice, again);
        assert_eq!(fake.tokens.load(Ordering::SeqCst), 2);
        auth.authorize(&alice, &list(Resource::ConfigMaps, Some("team-a")))
            .unwrap();
        auth.authorize(&alice, &list(Resource::ConfigMaps, Some("team-a")))
            .unwrap();
        assert_eq!(fake.access.load(Ordering::SeqCst), 1);
        let e = auth
            .authorize(&alice, &list(Resource::Secrets, Some("team-a")))
            .unwrap_err();
        assert_eq!(
            e.message,
            "secrets is forbidden: User \"alice\" cannot list resource \"secrets\" in API group \"\" in the namespace \"team-a\""
        );
        let e = auth
            .authorize(&alice, &list(Resource::ConfigMaps, None))
            .unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(decisions.get("authorization", "allowed", "hit"), 1);
        assert_eq!(decisions.get("authentication", "denied", "hit"), 1);
        // A review that cannot be made is a 503, and not kept.
        fake.fail.store(true, Ordering::SeqCst);
        assert_eq!(
            auth.authenticate(Some("Bearer other")).unwrap_err().code,
            503
        );
        assert_eq!(
            auth.authenticate(Some("Bearer other")).unwrap_err().code,
            503
        );
        assert_eq!(fake.tokens.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn only_a_kept_allowed_decision_is_taken_without_asking() {
        let fake = Arc::new(Fake::default());
        let auth = Auth::new(Box::new(fake.clone()), Decisions::default());
        let alice = auth.authenticate(Some("Bearer good")).unwrap();
        let team_a = list(Resource::ConfigMaps, Some("team-a"));
        let everywhere = list(Resource::ConfigMaps, None);
        assert!(
            !auth.allowed_already(&alice, std::slice::from_ref(&team_a)),
            "never asked"
        );
        auth.authorize(&alice, &team_a).unwrap();
        assert!(auth.authorize(&alice, &everywhere).is_err());
        let asked = fake.access.load(Ordering::SeqCst);
        assert!(auth.allowed_already(&alice, &[everywhere.clone(), team_a.clone()]));
        assert!(
            !auth.allowed_already(&alice, &[everywhere]),
            "a kept refusal"
        );
        assert!(!auth.allowed_already(&alice, &[list(Resource::Secrets, Some("team-a"))]));
        assert_eq!(fake.access.load(Ordering::SeqCst), asked, "no one asked");
    }

    #[test]
    fn entries_reviewed_at_once_do_not_expire_at_once() {
        let auth = Auth::new(Box::new(Arc::new(Fake::default())), Decisions::default());
        let lives: Vec<Duration> = (0..200).map(|_| auth.spread(TOKEN_TTL)).collect();
        let (min, max) = (lives.iter().min().unwrap(), lives.iter().max().unwrap());
        assert!(*min >= TOKEN_TTL.mul_f64(1.0 - SPREAD), "{min:?}");
        assert!(*max <= TOKEN_TTL, "{max:?}");
        assert!(*max - *min > Duration::from_secs(20), "{min:?}..{max:?}");
    }

    #[test]
    fn caches_are_bounded() {
        let mut c: Cache<u32, u32> = Cache::new();
        let now = Instant::now();
        for i in 0..(MAX_ENTRIES as u32 + 100) {
            c.put(i, i, now + Duration::from_secs(60 + u64::from(i)), now);
        }
        assert_eq!(c.len(), MAX_ENTRIES);
        assert_eq!(c.get(&0, now), None, "the nearest to expiring went first");
        assert_eq!(
            c.get(&(MAX_ENTRIES as u32 + 99), now),
            Some(MAX_ENTRIES as u32 + 99)
        );
        assert_eq!(c.get(&200, now + Duration::from_secs(400)), None, "expired");
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
        let auth = Auth::new(Box::new(fake.clone()), Decisions::default());
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
            assert_eq!(
                auth.authenticate(Some(&header)).unwrap_err().code,
                401,
                "{exp}"
            );
        }
        // Authenticated, with an exp past u64: kept for the review's own time.
        let fake = Arc::new(Fake {
            anyone: true,
            ..Fake::default()
        });
        let auth = Auth::new(Box::new(fake.clone()), Decisions::default());
        for exp in ["18446744073709551615", "1e300", "-1e300"] {
            let header = format!("Bearer {}", jwt(&format!("{{\"exp\":{exp}}}")).expose());
            auth.authenticate(Some(&header)).unwrap();
            auth.authenticate(Some(&header)).unwrap();
        }
        assert_eq!(
            fake.tokens.load(Ordering::SeqCst),
            4,
            "kept, but for the expired one"
        );
    }
}
