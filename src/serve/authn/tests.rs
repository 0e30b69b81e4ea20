//! `Authenticator` against a made-up apiserver (`testing::Fake`): kept and refused
//! tokens, the review budgets, tokens for the hub verified here, a token's lifetime.

use super::*;
use crate::serve::testing::{Fake, Signer};
use std::sync::atomic::Ordering;

fn authn(fake: &Arc<Fake>, rate: f64, burst: f64) -> (ServerCounts, Authenticator) {
    let counts = ServerCounts::default();
    let a = Authenticator::new(
        Arc::new(fake.clone()),
        Decisions::default(),
        counts.clone(),
        (rate, burst),
    );
    (counts, a)
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

#[test]
fn tokens_are_reviewed_once_and_kept() {
    let fake = Arc::new(Fake::default());
    let (_, a) = authn(&fake, REVIEW_RATE, REVIEW_BURST);
    assert_eq!(code(a.authenticate(None, HubLane::Authenticate)), 401);
    assert_eq!(
        code(a.authenticate(Some("Basic eDp5"), HubLane::Authenticate)),
        401
    );
    assert_eq!(
        code(a.authenticate(Some("Bearer bad"), HubLane::Authenticate)),
        401
    );
    assert_eq!(
        code(a.authenticate(Some("Bearer bad"), HubLane::Answer)),
        401
    );
    assert_eq!(
        fake.tokens.load(Ordering::SeqCst),
        1,
        "a refusal is kept too"
    );
    // Where requests are answered, a token not kept goes to be reviewed.
    assert!(matches!(
        a.authenticate(Some("Bearer good"), HubLane::Answer),
        Err(Halt::Lane(HubLane::Authenticate))
    ));
    let alice = a
        .authenticate(Some("Bearer good"), HubLane::Authenticate)
        .unwrap();
    let again = a
        .authenticate(Some("bearer  good "), HubLane::Answer)
        .unwrap();
    assert_eq!((alice.user, alice.holder), (again.user, again.holder));
    assert_eq!(fake.tokens.load(Ordering::SeqCst), 2);
    assert_eq!(*fake.audience.lock().unwrap(), None, "the apiserver's own");
    // A review that cannot be made is a 503, and not kept.
    fake.fail.store(true, Ordering::SeqCst);
    let e = refusal(a.authenticate(Some("Bearer other"), HubLane::Authenticate));
    assert_eq!((e.code, e.retry_after), (503, Some(REVIEW_RETRY_AFTER)));
    assert_eq!(
        code(a.authenticate(Some("Bearer other"), HubLane::Authenticate)),
        503
    );
    assert_eq!(fake.tokens.load(Ordering::SeqCst), 4);
}

/// One token in other spellings (padded, stray bits: the same to go-jose) is not
/// many identities to the hub: refused, and never reviewed.
#[test]
fn a_token_spelled_otherwise_is_refused_unreviewed() {
    let fake = Arc::new(Fake {
        anyone: true,
        ..Fake::default()
    });
    let (_, a) = authn(&fake, REVIEW_RATE, REVIEW_BURST);
    let t = Signer::new("k1").sign(&serde_json::json!({"sub": "x", "exp": 2e9}));
    assert!(
        a.authenticate(Some(&format!("Bearer {t}")), HubLane::Authenticate)
            .is_ok()
    );
    assert_eq!(fake.tokens.load(Ordering::SeqCst), 1);
    for n in 1..=3 {
        let padded = format!("Bearer {t}{}", "=".repeat(n));
        assert_eq!(
            code(a.authenticate(Some(&padded), HubLane::Authenticate)),
            401
        );
    }
    assert_eq!(fake.tokens.load(Ordering::SeqCst), 1, "none reviewed");
}

#[test]
fn entries_reviewed_at_once_do_not_expire_at_once() {
    let (_, a) = authn(&Arc::new(Fake::default()), 1.0, 1.0);
    let lives: Vec<Duration> = (0..200).map(|_| a.spread(TOKEN_TTL)).collect();
    let (min, max) = (lives.iter().min().unwrap(), lives.iter().max().unwrap());
    assert!(*min >= TOKEN_TTL.mul_f64(1.0 - SPREAD), "{min:?}");
    assert!(*max <= TOKEN_TTL, "{max:?}");
    assert!(*max - *min > Duration::from_secs(20), "{min:?}..{max:?}");
}

/// Issue 47.3: a flood of tokens nobody knows costs the apiserver a bounded rate of
/// reviews (beyond it, a 429 with Retry-After); it never reaches a known token, and
/// the refused ones it leaves behind never push a known one out.
#[test]
fn unknown_tokens_are_reviewed_at_a_bounded_rate_and_never_crowd_out_known_ones() {
    let fake = Arc::new(Fake::default());
    let (counts, a) = authn(&fake, 1.0, 10.0);
    let alice = a
        .authenticate(Some("Bearer good"), HubLane::Authenticate)
        .unwrap();
    let mut turned = 0;
    for i in 0..(MAX_ENTRIES + 100) {
        match a.authenticate(Some(&format!("Bearer flood-{i}")), HubLane::Authenticate) {
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
    let again = a
        .authenticate(Some("Bearer good"), HubLane::Answer)
        .unwrap();
    assert_eq!(again.user, alice.user);
    assert_eq!(fake.tokens.load(Ordering::SeqCst), asked);
    // Refused tokens fill their own cache, never the known one's.
    let fake = Arc::new(Fake::default());
    let (_, a) = authn(&fake, 1e9, 1e9);
    a.authenticate(Some("Bearer good"), HubLane::Authenticate)
        .unwrap();
    for i in 0..(MAX_ENTRIES + 10) {
        let _ = a.authenticate(Some(&format!("Bearer refused-{i}")), HubLane::Authenticate);
    }
    assert_eq!(lock(&a.refused).len(), MAX_ENTRIES);
    let asked = fake.tokens.load(Ordering::SeqCst);
    a.authenticate(Some("Bearer good"), HubLane::Answer)
        .unwrap();
    assert_eq!(fake.tokens.load(Ordering::SeqCst), asked, "still kept");
}

/// A follower renewing its token (its kept review expired) is reviewed on a budget
/// of its own: unknown tokens that used up theirs never hold it up (at 10,000
/// followers the renewals alone are about the review rate).
#[test]
fn a_token_whose_review_expired_is_renewed_whatever_unknown_tokens_used() {
    let fake = Arc::new(Fake::default());
    let (counts, a) = authn(&fake, 0.001, 1.0);
    let alice = a
        .authenticate(Some("Bearer good"), HubLane::Authenticate)
        .unwrap();
    let e = refusal(a.authenticate(Some("Bearer flood"), HubLane::Authenticate));
    assert_eq!(e.code, 429, "the budget of unknown tokens is used up");
    // Its review expires.
    let key: [u8; 32] = Sha256::digest(b"good").into();
    let now = Instant::now();
    lock(&a.known).put(key, alice.user.clone(), now);
    assert!(matches!(
        a.authenticate(Some("Bearer good"), HubLane::Answer),
        Err(Halt::Lane(HubLane::Authenticate))
    ));
    let asked = fake.tokens.load(Ordering::SeqCst);
    let again = a
        .authenticate(Some("Bearer good"), HubLane::Authenticate)
        .unwrap();
    assert_eq!(again.user, alice.user);
    assert_eq!(
        fake.tokens.load(Ordering::SeqCst),
        asked + 1,
        "reviewed again"
    );
    assert_eq!(counts.turned_away_for("renewals"), 0);
    // Still the review budget for the others; a refused renewal is no longer known.
    assert_eq!(
        refusal(a.authenticate(Some("Bearer x"), HubLane::Authenticate)).code,
        429
    );
    lock(&a.known).put(Sha256::digest(b"bad").into(), alice.user, now);
    assert_eq!(
        refusal(a.authenticate(Some("Bearer bad"), HubLane::Authenticate)).code,
        401
    );
    assert!(!lock(&a.known).had(&Sha256::digest(b"bad").into()));
}

fn jwt(claims: &str) -> Secret {
    use base64::Engine as _;
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
    let (_, a) = authn(&fake, REVIEW_RATE, REVIEW_BURST);
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
            code(a.authenticate(Some(&header), HubLane::Authenticate)),
            401,
            "{exp}"
        );
    }
    // Authenticated, with an exp past u64: kept for the review's own time.
    let fake = Arc::new(Fake {
        anyone: true,
        ..Fake::default()
    });
    let (_, a) = authn(&fake, REVIEW_RATE, REVIEW_BURST);
    for exp in ["18446744073709551615", "1e300", "-1e300"] {
        let header = format!("Bearer {}", jwt(&format!("{{\"exp\":{exp}}}")).expose());
        a.authenticate(Some(&header), HubLane::Authenticate)
            .unwrap();
        a.authenticate(Some(&header), HubLane::Authenticate)
            .unwrap();
    }
    assert_eq!(
        fake.tokens.load(Ordering::SeqCst),
        4,
        "kept, but for the expired one"
    );
}

const ISS: &str = "https://kubernetes.default.svc";

/// The issuer of the keys `key` signs with, for `audience` (`--token-audience`).
fn issuer_of(key: &Signer, audience: Option<&str>) -> Issuer {
    let jwk = key.jwk();
    let fetch: issuer::Fetch = Box::new(move |path: &str, _: &str| {
        Ok(match path {
            "/.well-known/openid-configuration" => {
                serde_json::json!({"issuer": ISS, "jwks_uri": "https://x/openid/v1/jwks"})
                    .to_string()
                    .into_bytes()
            }
            _ => serde_json::json!({ "keys": [jwk.clone()] })
                .to_string()
                .into_bytes(),
        })
    });
    Issuer::new(audience.map(str::to_string), fetch)
}

/// Claims as the apiserver issues them for `aud`, living `secs`.
fn claims(aud: &str, secs: f64) -> serde_json::Value {
    let now = issuer::unix(std::time::SystemTime::now());
    serde_json::json!({"iss": ISS, "aud": aud, "exp": now + secs, "nbf": now, "iat": now,
        "kubernetes.io": {"namespace": "team",
            "serviceaccount": {"name": "agent", "uid": "sa-uid"}}})
}

fn bearer(t: String) -> String {
    format!("Bearer {t}")
}

/// Issue 49.2: with `--token-audience`, a token the issuer signed for the hub is
/// verified without a TokenReview, one it did not sign is refused without one, and any
/// other token is reviewed by the apiserver as before.
#[test]
fn tokens_for_the_hub_are_verified_here() {
    let key = Signer::new("k1");
    let fake = Arc::new(Fake::default());
    let (_, a) = authn(&fake, REVIEW_RATE, REVIEW_BURST);
    let a = a.verifying(Some(issuer_of(&key, Some("cmpoll-hub"))));
    let who = (a.authenticate(
        Some(&bearer(key.sign(&claims("cmpoll-hub", 600.0)))),
        HubLane::Authenticate,
    ))
    .unwrap();
    assert_eq!(who.user.name, "system:serviceaccount:team:agent");
    let forged = Signer::new("k1").sign(&claims("cmpoll-hub", 600.0));
    assert_eq!(
        code(a.authenticate(Some(&bearer(forged)), HubLane::Authenticate)),
        401
    );
    assert_eq!(fake.tokens.load(Ordering::SeqCst), 0, "no TokenReview");
    assert_eq!(fake.accounts.load(Ordering::SeqCst), 1, "its account read");
    // The apiserver's audience: reviewed by the apiserver (which knows it as "good"
    // here only when it is "good").
    let theirs = key.sign(&claims(ISS, 600.0));
    assert_eq!(
        code(a.authenticate(Some(&bearer(theirs)), HubLane::Authenticate)),
        401
    );
    assert_eq!(fake.tokens.load(Ordering::SeqCst), 1);
    assert!(
        a.authenticate(Some("Bearer good"), HubLane::Authenticate)
            .is_ok()
    );
}

/// Issue 56.7: a token for the hub whose service account is gone or has another uid
/// is refused, as the apiserver's authenticator refuses it; one issued to live longer
/// than `MAX_LIFETIME` is reviewed by the apiserver, for the hub's audience; and where
/// the hub may not read service accounts, so is every token for the hub.
#[test]
fn a_token_for_the_hub_is_checked_as_the_apiserver_checks_it() {
    let key = Signer::new("k1");
    let fake = Arc::new(Fake {
        anyone: true,
        ..Fake::default()
    });
    let (_, a) = authn(&fake, REVIEW_RATE, REVIEW_BURST);
    let a = a.verifying(Some(issuer_of(&key, Some("cmpoll-hub"))));
    let mut other_uid = claims("cmpoll-hub", 600.0);
    other_uid["kubernetes.io"]["serviceaccount"]["uid"] = serde_json::json!("old-uid");
    assert_eq!(
        code(a.authenticate(Some(&bearer(key.sign(&other_uid))), HubLane::Authenticate)),
        401
    );
    assert_eq!(fake.tokens.load(Ordering::SeqCst), 0, "refused here");
    let long = key.sign(&claims("cmpoll-hub", 8760.0 * 3600.0));
    a.authenticate(Some(&bearer(long)), HubLane::Authenticate)
        .unwrap();
    assert_eq!(fake.tokens.load(Ordering::SeqCst), 1, "reviewed");
    assert_eq!(
        fake.audience.lock().unwrap().as_deref(),
        Some("cmpoll-hub"),
        "for the hub's audience"
    );
}

/// Issue 56.7: tokens the hub refuses itself (forged for its audience) draw on the
/// budget of unknown tokens, as garbage reviewed by the apiserver does: beyond it a
/// 429, and no more of them kept than of garbage.
#[test]
fn forged_tokens_for_the_hub_cost_what_garbage_costs() {
    let key = Signer::new("k1");
    let fake = Arc::new(Fake::default());
    let (counts, a) = authn(&fake, 0.001, 5.0);
    let a = a.verifying(Some(issuer_of(&key, Some("cmpoll-hub"))));
    let forger = Signer::new("k1");
    let codes: Vec<u16> = (0..50)
        .map(|i| {
            let t = forger.sign(&claims("cmpoll-hub", 600.0 + f64::from(i)));
            code(a.authenticate(Some(&bearer(t)), HubLane::Authenticate))
        })
        .collect();
    assert_eq!(codes.iter().filter(|c| **c == 401).count(), 5, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 429).count(), 45);
    assert_eq!(lock(&a.refused).len(), 5, "kept: as many as refused");
    assert_eq!(counts.turned_away_for("reviews"), 45);
    // The issuer's own token for the hub meets no budget.
    let good = key.sign(&claims("cmpoll-hub", 600.0));
    assert!(
        a.authenticate(Some(&bearer(good)), HubLane::Authenticate)
            .is_ok()
    );
}

/// Issue 56.8: a token the cluster signed is reviewed from a budget of its own, so a
/// fleet arriving after a hub's start is admitted as it comes while garbage (and
/// expired or forged tokens) stays at the rate of unknown tokens.
#[test]
fn tokens_the_cluster_signed_are_reviewed_from_a_larger_budget() {
    let key = Signer::new("k1");
    let fake = Arc::new(Fake {
        anyone: true,
        ..Fake::default()
    });
    let (counts, a) = authn(&fake, 0.001, 3.0);
    let a = a.verifying(Some(issuer_of(&key, None)));
    let admitted = (0..1000)
        .filter(|i| {
            let t = key.sign(&claims(ISS, 600.0 + f64::from(*i)));
            a.authenticate(Some(&bearer(t)), HubLane::Authenticate)
                .is_ok()
        })
        .count();
    assert_eq!(admitted, 1000, "within SIGNED_BURST");
    assert_eq!(counts.turned_away_for("signed"), 0);
    let garbage = (0..20)
        .filter(|i| {
            a.authenticate(Some(&format!("Bearer g{i}")), HubLane::Authenticate)
                .is_ok()
        })
        .count();
    assert_eq!(garbage, 3, "garbage: its own budget");
    let forged = Signer::new("k1").sign(&claims(ISS, 600.0));
    assert_eq!(
        code(a.authenticate(Some(&bearer(forged)), HubLane::Authenticate)),
        429
    );
    let mut expired = claims(ISS, 600.0);
    expired["exp"] = serde_json::json!(1000.0);
    assert_eq!(
        code(a.authenticate(Some(&bearer(key.sign(&expired))), HubLane::Authenticate)),
        429
    );
    assert_eq!(counts.turned_away_for("reviews"), 19);
    assert_eq!(*fake.audience.lock().unwrap(), None, "reviewed as before");
}
