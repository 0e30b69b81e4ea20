//! The cluster's service-account issuer: its name and public keys, read from the
//! apiserver's discovery (`/.well-known/openid-configuration`, then the path of its
//! `jwks_uri`, `/openid/v1/jwks`: KEP-1393, readable by every service account). Two uses:
//!
//! - With `--token-audience`, a follower's token for the hub's audience is verified here,
//!   without a TokenReview (`jwt.rs`), as the apiserver's service-account authenticator
//!   does — but for a token issued to live longer than `MAX_LIFETIME`, which the apiserver
//!   reviews (for the hub's audience), as it would any token at every review.
//! - For every other token, whether the cluster signed it (and it has not expired): the
//!   apiserver still reviews it, but from a larger budget than garbage (`authn.rs`), so a
//!   hub that just started admits its fleet at once.
//!
//! The keys are read again every `REFRESH`, and at once when a token names a key not held
//! (at most every `MISS_EVERY`): a rotated signing key is taken at its first token, or the
//! next one a second later. Keys that cannot be read are asked again every `MISS_EVERY`
//! where `--token-audience` waits for them, else every `REFRESH`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use super::jwt::{self, Key, Token};
use super::user::User;
use crate::locks::Recover;

/// How long read keys are used before they are read again.
pub const REFRESH: Duration = Duration::from_secs(300);
/// How often at most a key nobody knows makes the hub read the keys again (an attacker's
/// made-up key ids cost the apiserver one read of a static document a second at most).
pub const MISS_EVERY: Duration = Duration::from_secs(1);
/// The longest a token for the hub may have been issued to live (`exp` − `iat`) and be
/// verified here: kubelet's default for a projected token (`expirationSeconds` 3600). A
/// longer one (`kubectl create token --duration 8760h`) is reviewed by the apiserver, which
/// checks at each review that its service account and pod still exist.
pub const MAX_LIFETIME: f64 = 3600.0;

/// Reads a path of the apiserver (its body) as the media type given, with the hub's
/// credentials.
pub type Fetch = Box<dyn Fn(&str, &str) -> Result<Vec<u8>, String> + Send + Sync>;

/// A token's service account: namespace, name.
pub type AccountRef = (String, String);

/// What the hub decided of a token.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// For the hub, verified: its user, trusted until this Unix time (its expiry) once
    /// its service account is found to hold.
    User(User, f64, AccountRef),
    /// The issuer's token for the hub, and not valid: why, in the apiserver's words.
    Refused(String),
    /// Signed with a key the hub does not hold (yet: the keys were read less than
    /// `MISS_EVERY` ago): refused now, asked again at the next request.
    NotYet(String),
    /// The issuer's keys cannot be read: as a review that could not be made, a 503.
    Unavailable(String),
    /// The issuer's token for the hub, living longer than `MAX_LIFETIME` (or without
    /// `iat` and `nbf`): the apiserver reviews it for the hub's audience.
    Recheck,
    /// Not the hub's to decide: the apiserver reviews it. `signed`: by the cluster's
    /// issuer, and not expired.
    Ask { signed: bool },
}

struct Held {
    issuer: String,
    keys: BTreeMap<String, Key>,
    read_at: Instant,
}

/// When the keys were last asked for, and whether that read failed.
#[derive(Default)]
struct Asked {
    at: Option<Instant>,
    failed: bool,
}

/// The issuer, as the hub holds it.
pub struct Issuer {
    /// `--token-audience`: tokens for it are verified here.
    audience: Option<String>,
    fetch: Fetch,
    held: Mutex<Option<Held>>,
    asked: Mutex<Asked>,
}

impl Issuer {
    pub fn new(audience: Option<String>, fetch: Fetch) -> Issuer {
        Issuer {
            audience,
            fetch,
            held: Mutex::new(None),
            asked: Mutex::new(Asked::default()),
        }
    }

    /// `--token-audience`, if given.
    pub fn audience(&self) -> Option<&str> {
        self.audience.as_deref()
    }

    /// Reads the keys now (at the hub's start, so that its first followers find them).
    pub fn prefetch(&self) {
        self.read_keys(Instant::now(), true);
    }

    /// Decides `token` at `now`; may read the keys (blocking: called where reviews wait).
    pub fn verify(&self, token: &str, now: Instant) -> Verdict {
        let Some(t) = jwt::read(token) else {
            return Verdict::Ask { signed: false };
        };
        let aud = self.audience.as_ref();
        let for_hub = aud.is_some_and(|a| t.claims.aud.contains(a));
        let ours = |h: &Held| h.issuer == t.claims.iss;
        let stale = self.with(|h| now.saturating_duration_since(h.read_at) > REFRESH);
        let unknown = |h: &Held| ours(h) && t.kid.as_ref().is_some_and(|k| !h.keys.contains_key(k));
        if stale != Some(false) || self.with(unknown) == Some(true) {
            self.read_keys(now, for_hub);
        }
        let held = self.held.lock().recover();
        let h = match held.as_ref() {
            Some(h) if ours(h) => h,
            Some(_) => return Verdict::Ask { signed: false },
            // The keys cannot be read (yet): for the hub, as a review the apiserver could
            // not make.
            None if for_hub => {
                return Verdict::Unavailable(
                    "cannot read the service-account issuer's keys".into(),
                );
            }
            None => return Verdict::Ask { signed: false },
        };
        let unix_now = unix(SystemTime::now());
        if !for_hub {
            // Only which budget its review draws on: an expired token's is garbage's.
            let signed = t.fresh(unix_now) && signature(&t, h) == Ok(Some(true));
            return Verdict::Ask { signed };
        }
        match signature(&t, h) {
            Err(why) => return Verdict::NotYet(why),
            Ok(None) => return Verdict::Ask { signed: false },
            Ok(Some(false)) => {
                return Verdict::Refused("invalid bearer token: bad signature".into());
            }
            Ok(Some(true)) => {}
        }
        let audience = aud.map(String::as_str).unwrap_or_default();
        if let Err(why) = t.valid(&h.issuer, audience, unix_now) {
            return Verdict::Refused(why);
        }
        if !t.lifetime().is_some_and(|l| l <= MAX_LIFETIME) {
            return Verdict::Recheck;
        }
        match (t.user(), t.claims.kubernetes.as_ref()) {
            (Some(u), Some(p)) => Verdict::User(
                u,
                t.expires(),
                (p.namespace.clone(), p.serviceaccount.name.clone()),
            ),
            _ => Verdict::Ask { signed: true },
        }
    }

    fn with<T>(&self, f: impl FnOnce(&Held) -> T) -> Option<T> {
        let held = self.held.lock().recover();
        held.as_ref().map(f)
    }

    /// Reads the issuer and its keys, unless they were asked for within `MISS_EVERY` (or,
    /// after a failure and not `urgent`, within `REFRESH`); a failure keeps what is held.
    fn read_keys(&self, now: Instant, urgent: bool) {
        // Held while the keys are read: a review lane's other workers wait for this read
        // (and then use what it read) rather than find no keys (a hub just started).
        let mut asked = self.asked.lock().recover();
        let within = match (asked.failed, urgent) {
            (true, false) => REFRESH,
            _ => MISS_EVERY,
        };
        if asked
            .at
            .is_some_and(|a| now.saturating_duration_since(a) < within)
        {
            return;
        }
        let first = asked.at.is_none();
        asked.at = Some(now);
        match self.discover() {
            Ok((issuer, keys)) => {
                log::info!(
                    "{} key(s) of the service-account issuer {issuer}",
                    keys.len()
                );
                asked.failed = false;
                *self.held.lock().recover() = Some(Held {
                    issuer,
                    keys,
                    read_at: now,
                });
            }
            Err(e) => {
                let again = asked.failed;
                asked.failed = true;
                match (&self.audience, again && !first) {
                    (Some(_), _) => log::warn!(
                        "--token-audience: cannot read the service-account issuer's keys: {e}; tokens for the hub wait for them (others are reviewed)"
                    ),
                    (None, false) => log::info!(
                        "cannot read the service-account issuer's keys ({e}): tokens the hub does not know are all reviewed at the rate of unknown tokens"
                    ),
                    (None, true) => {
                        log::debug!("cannot read the service-account issuer's keys: {e}")
                    }
                }
            }
        }
    }

    fn discover(&self) -> Result<(String, BTreeMap<String, Key>), String> {
        #[derive(serde::Deserialize)]
        struct Discovery {
            issuer: String,
            jwks_uri: String,
        }
        let doc = (self.fetch)("/.well-known/openid-configuration", "application/json")?;
        let d: Discovery = serde_json::from_slice(&doc)
            .map_err(|e| format!("/.well-known/openid-configuration: {e}"))?;
        // The keys are read from the apiserver, whatever host the document names (it may
        // be one only the cluster's outside reaches).
        let path = d
            .jwks_uri
            .split_once("://")
            .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
            .unwrap_or("/openid/v1/jwks");
        // The apiserver serves the keys as this media type only (406 for JSON).
        let jwks = (self.fetch)(path, "application/jwk-set+json")?;
        let keys = jwt::keys(&jwks).map_err(|e| format!("{path}: {e}"))?;
        Ok((d.issuer, keys))
    }
}

/// Whether one of `h`'s keys signed `t`: `Ok(None)` for an algorithm the hub does not
/// check; `Err` for a key id it does not hold.
fn signature(t: &Token<'_>, h: &Held) -> Result<Option<bool>, String> {
    match &t.kid {
        Some(kid) => match h.keys.get(kid) {
            Some(key) => Ok(t.signed_by(key)),
            None => Err("invalid bearer token: unknown signing key".into()),
        },
        None => {
            let any: Vec<Option<bool>> = h.keys.values().map(|k| t.signed_by(k)).collect();
            Ok(match any.contains(&Some(true)) {
                true => Some(true),
                false if any.contains(&None) => None,
                false => Some(false),
            })
        }
    }
}

/// Unix seconds of `t` (0 before the epoch).
pub fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::serve::testing::Signer;

    const ISS: &str = "https://kubernetes.default.svc";

    /// An issuer whose keys are `keys` (switchable), and how often they were read.
    fn issuer(keys: Arc<Mutex<Vec<serde_json::Value>>>) -> (Issuer, Arc<Mutex<usize>>) {
        let reads = Arc::new(Mutex::new(0));
        let r = reads.clone();
        let fetch: Fetch = Box::new(move |path: &str, _: &str| match path {
            "/.well-known/openid-configuration" => Ok(serde_json::json!({
                "issuer": ISS,
                "jwks_uri": "https://10.0.0.1:6443/openid/v1/jwks",
            })
            .to_string()
            .into_bytes()),
            "/openid/v1/jwks" => {
                *r.lock().unwrap() += 1;
                let keys = keys.lock().unwrap().clone();
                Ok(serde_json::json!({ "keys": keys }).to_string().into_bytes())
            }
            other => Err(format!("no {other}")),
        });
        (Issuer::new(Some("cmpoll-hub".into()), fetch), reads)
    }

    fn claims(aud: &str) -> serde_json::Value {
        let now = unix(SystemTime::now());
        serde_json::json!({"iss": ISS, "sub": "system:serviceaccount:team:agent",
            "aud": [aud], "exp": now + 600.0, "nbf": now, "iat": now,
            "kubernetes.io": {"namespace": "team",
                "serviceaccount": {"name": "agent", "uid": "sa-uid"}}})
    }

    #[test]
    fn a_token_for_the_hub_is_verified_here_and_others_are_asked() {
        let key = Signer::new("k1");
        let (iss, reads) = issuer(Arc::new(Mutex::new(vec![key.jwk()])));
        let t0 = Instant::now();
        match iss.verify(&key.sign(&claims("cmpoll-hub")), t0) {
            Verdict::User(u, _, account) => {
                assert_eq!(u.name, "system:serviceaccount:team:agent");
                assert_eq!(account, ("team".to_string(), "agent".to_string()));
            }
            other => panic!("{other:?}"),
        }
        // Another audience (the apiserver's own), an opaque token: the apiserver decides.
        assert_eq!(
            iss.verify(&key.sign(&claims("https://kubernetes.default.svc")), t0),
            Verdict::Ask { signed: true }
        );
        assert_eq!(iss.verify("opaque", t0), Verdict::Ask { signed: false });
        // A key the issuer never had: refused.
        let stranger = Signer::new("k1");
        assert!(matches!(
            iss.verify(&stranger.sign(&claims("cmpoll-hub")), t0),
            Verdict::Refused(why) if why.contains("signature")
        ));
        assert_eq!(*reads.lock().unwrap(), 1, "read once");
    }

    #[test]
    fn a_rotated_key_is_read_at_its_first_token_and_an_unknown_one_at_most_every_second() {
        let old = Signer::new("k1");
        let keys = Arc::new(Mutex::new(vec![old.jwk()]));
        let (iss, reads) = issuer(keys.clone());
        let t0 = Instant::now();
        assert!(matches!(
            iss.verify(&old.sign(&claims("cmpoll-hub")), t0),
            Verdict::User(..)
        ));
        // The issuer rotates: a new key beside the old one.
        let new = Signer::new("k2");
        keys.lock().unwrap().push(new.jwk());
        let t1 = t0 + MISS_EVERY + Duration::from_secs(1);
        assert!(matches!(
            iss.verify(&new.sign(&claims("cmpoll-hub")), t1),
            Verdict::User(..)
        ));
        assert_eq!(
            *reads.lock().unwrap(),
            2,
            "read again for the key it did not know"
        );
        // Tokens naming keys nobody has: refused (not kept), and the keys read at most
        // once a second.
        let nobody = Signer::new("k9");
        for ms in (0..1000).step_by(100) {
            let at = t1 + Duration::from_millis(ms);
            assert!(matches!(
                iss.verify(&nobody.sign(&claims("cmpoll-hub")), at),
                Verdict::NotYet(why) if why.contains("unknown signing key")
            ));
        }
        assert_eq!(*reads.lock().unwrap(), 2, "not again within MISS_EVERY");
        // The old key's tokens still verify while the issuer lists it.
        assert!(matches!(
            iss.verify(&old.sign(&claims("cmpoll-hub")), t1),
            Verdict::User(..)
        ));
        // After REFRESH the keys are read again, unasked.
        let later = t1 + REFRESH + Duration::from_secs(1);
        let _ = iss.verify(&old.sign(&claims("cmpoll-hub")), later);
        assert_eq!(*reads.lock().unwrap(), 3);
    }

    /// Keys that cannot be read make a token for the hub a review that could not be made
    /// (503, not kept), never a refusal; a token for another audience is still asked.
    #[test]
    fn keys_that_cannot_be_read_are_an_outage_not_a_refusal() {
        let fetch: Fetch = Box::new(|_: &str, _: &str| Err("connection refused".into()));
        let iss = Issuer::new(Some("cmpoll-hub".into()), fetch);
        let key = Signer::new("k1");
        assert!(matches!(
            iss.verify(&key.sign(&claims("cmpoll-hub")), Instant::now()),
            Verdict::Unavailable(_)
        ));
        assert_eq!(
            iss.verify(&key.sign(&claims("other")), Instant::now()),
            Verdict::Ask { signed: false }
        );
    }

    /// Issue 56.8: without `--token-audience`, a token is only told signed by the cluster
    /// (its review then draws on a larger budget) or not: signed by another key, expired,
    /// of another issuer, or no JWT at all is not.
    #[test]
    fn any_token_is_told_signed_by_the_cluster_or_not() {
        let key = Signer::new("k1");
        let (keys, _) = issuer(Arc::new(Mutex::new(vec![key.jwk()])));
        let iss = Issuer {
            audience: None,
            ..keys
        };
        let t0 = Instant::now();
        let signed = |c: &serde_json::Value| iss.verify(&key.sign(c), t0);
        assert_eq!(
            signed(&claims("https://kubernetes.default.svc")),
            Verdict::Ask { signed: true }
        );
        assert_eq!(
            signed(&claims("cmpoll-hub")),
            Verdict::Ask { signed: true },
            "no audience of its own: reviewed"
        );
        let mut expired = claims("api");
        expired["exp"] = serde_json::json!(1000.0);
        assert_eq!(signed(&expired), Verdict::Ask { signed: false });
        let mut elsewhere = claims("api");
        elsewhere["iss"] = serde_json::json!("https://dex.example");
        assert_eq!(signed(&elsewhere), Verdict::Ask { signed: false });
        let forged = Signer::new("k1").sign(&claims("api"));
        assert_eq!(iss.verify(&forged, t0), Verdict::Ask { signed: false });
        let unknown = Signer::new("k7").sign(&claims("api"));
        assert_eq!(iss.verify(&unknown, t0), Verdict::Ask { signed: false });
        assert_eq!(iss.verify("garbage", t0), Verdict::Ask { signed: false });
    }

    /// Issue 56.7: a token for the hub issued to live longer than `MAX_LIFETIME` (or
    /// without `iat` and `nbf`) is not verified here: the apiserver reviews it.
    #[test]
    fn a_long_lived_token_for_the_hub_is_reviewed_by_the_apiserver() {
        let key = Signer::new("k1");
        let (iss, _) = issuer(Arc::new(Mutex::new(vec![key.jwk()])));
        let t0 = Instant::now();
        let now = unix(SystemTime::now());
        let living = |secs: f64| {
            let mut c = claims("cmpoll-hub");
            c["iat"] = serde_json::json!(now);
            c["nbf"] = serde_json::json!(now);
            c["exp"] = serde_json::json!(now + secs);
            iss.verify(&key.sign(&c), t0)
        };
        assert!(matches!(living(600.0), Verdict::User(..)));
        assert!(matches!(living(MAX_LIFETIME), Verdict::User(..)));
        assert_eq!(living(MAX_LIFETIME + 1.0), Verdict::Recheck);
        assert_eq!(living(8760.0 * 3600.0), Verdict::Recheck);
        let mut c = claims("cmpoll-hub");
        c.as_object_mut().unwrap().remove("iat");
        c.as_object_mut().unwrap().remove("nbf");
        assert_eq!(iss.verify(&key.sign(&c), t0), Verdict::Recheck);
    }

    /// Requests that come together at a hub that just started all wait for the one read
    /// of the keys, and none is refused for want of them.
    #[test]
    fn concurrent_first_tokens_wait_for_one_read_of_the_keys() {
        let key = Signer::new("k1");
        let jwk = key.jwk();
        let reads = Arc::new(Mutex::new(0));
        let r = reads.clone();
        let fetch: Fetch = Box::new(move |path: &str, _: &str| {
            if path == "/.well-known/openid-configuration" {
                return Ok(serde_json::json!({"issuer": ISS,
                    "jwks_uri": "https://x/openid/v1/jwks"})
                .to_string()
                .into_bytes());
            }
            *r.lock().unwrap() += 1;
            std::thread::sleep(Duration::from_millis(200));
            Ok(serde_json::json!({ "keys": [jwk.clone()] })
                .to_string()
                .into_bytes())
        });
        let iss = Arc::new(Issuer::new(Some("cmpoll-hub".into()), fetch));
        let token = key.sign(&claims("cmpoll-hub"));
        let verdicts: Vec<Verdict> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| iss.verify(&token, Instant::now())))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            verdicts.iter().all(|v| matches!(v, Verdict::User(..))),
            "{verdicts:?}"
        );
        assert_eq!(*reads.lock().unwrap(), 1);
    }
}
