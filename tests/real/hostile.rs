//! `cmpoll serve` under a hostile network (issue 47), on the real apiserver: what a client
//! sends is never trusted before its review, and no client, known or not, stops the hub
//! answering the others.

use std::time::{Duration, Instant};

use super::hub::*;
use super::*;

/// A JWT-shaped bearer token whose payload is `claims` (its signature made up).
fn crafted(claims: &str) -> String {
    use base64::Engine as _;
    let b = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!("{}.{}.sig", b(r#"{"alg":"RS256"}"#), b(claims))
}

/// Issue 47.1: a token's unverified claims reached arithmetic that panicked (`exp`
/// 2^64 − 1 added to the clock), and eight such requests took every worker of the hub.
/// Now each is refused (401) at once, however many come, and the hub goes on answering
/// its probes and a known follower.
#[test]
fn a_tokens_own_claims_never_stop_the_hub() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-claims");
    put_module(k, &ns, "m", "k.yaml", "v");
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--namespace", &ns]);
    let token = follower(k, &ns, "reader", cm_rules(), false);
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    assert_eq!(get(&hub.url(), &hub.ca, &token, &list, &[]).0, 200);
    let claims = [
        r#"{"exp":18446744073709551615}"#,
        r#"{"exp":10000000000000000000}"#,
        r#"{"exp":1e300,"nbf":-1e300,"iat":18446744073709551616}"#,
        r#"{"exp":-18446744073709551615}"#,
    ];
    // Twice the hub's workers, each asked with a crafted token.
    for round in 0..4 {
        for c in claims {
            let at = Instant::now();
            let (code, _, body) = get_within(&hub.url(), &hub.ca, &crafted(c), &list, &[], 5);
            assert_eq!(
                code,
                401,
                "round {round}, {c}: {}\n{}",
                String::from_utf8_lossy(&body),
                hub.d.stderr()
            );
            assert!(at.elapsed() < Duration::from_secs(5));
        }
    }
    assert_eq!(
        get_within(&hub.url(), &hub.ca, "", "/healthz", &[], 5).0,
        200
    );
    assert_eq!(
        get_within(&hub.url(), &hub.ca, "", "/readyz", &[], 5).0,
        200
    );
    let (code, _, body) = get_within(&hub.url(), &hub.ca, &token, &list, &[], 5);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert!(!hub.d.stderr().contains("panicked"), "{}", hub.d.stderr());
}

/// Issue 47.6: a body whose length is told twice (0 and N, N and 0) or not as 1*DIGIT
/// (`+N`, `N, 0`) is a 400 with the connection closed (RFC 9112 §6.3): the request hidden
/// behind it is never answered, nor its body swallowed.
#[test]
fn a_length_told_twice_or_wrongly_is_refused_whole() {
    use crate::util::flood::{refused_whole, smuggled};
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-length");
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--namespace", &ns]);
    let addr = format!("127.0.0.1:{}", hub.port);
    for request in smuggled("/healthz") {
        if let Err(e) = refused_whole(&addr, &hub.ca_pem, &request) {
            panic!("{}: {e}", String::from_utf8_lossy(&request));
        }
    }
    assert_eq!(get(&hub.url(), &hub.ca, "", "/healthz", &[]).0, 200);
}
