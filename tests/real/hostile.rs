//! `cmpoll serve` under a hostile network (issue 47), on the real apiserver: what a client
//! sends is never trusted before its review, and no client, known or not, stops the hub
//! answering the others.

use std::time::{Duration, Instant};

use test_apiserver::real::RealApiserver;

use super::hub::*;
use super::*;
use crate::util::reviewhook::{Mode, ReviewHook};

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

/// A review the hub cannot make, for want of the cluster's own token and authorization
/// webhooks: the real apiserver with `hook` behind it (after its token file, its service
/// accounts and RBAC).
fn cluster_with_webhooks(hook: &ReviewHook) -> RealApiserver {
    let dir = tempfile::tempdir().unwrap();
    let flags = hook.apiserver_flags(dir.path());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let k = RealApiserver::start_with(&flags);
    // The kubeconfigs are read at start.
    drop(dir);
    k
}

/// `GET` the hub's decisions counter for (check, result, cache), as the scraper sees it.
fn decisions(hub: &Hub, scraper: &str, check: &str, result: &str, cache: &str) -> f64 {
    let (code, _, body) = get(&hub.url(), &hub.ca, scraper, "/metrics", &[]);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    metric_sum(
        &String::from_utf8_lossy(&body),
        "cmpoll_serve_decisions_total",
        &[("check", check), ("result", result), ("cache", cache)],
    )
}

/// A hub on a real apiserver whose token and authorization webhooks are `hook`; a
/// follower's token allowed to list the hub's namespace (and kept: listed once), a
/// scraper's token, and the follower's list.
fn outage(hook: &ReviewHook, prefix: &str) -> (RealApiserver, Hub, String, String, String) {
    let k = cluster_with_webhooks(hook);
    let ns = k.namespace(prefix);
    put_module(&k, &ns, "m", "k.yaml", "v");
    let hub = start_hub(&k, &hub_account(&k, &ns, "hub"), &["--namespace", &ns]);
    let token = follower(&k, &ns, "reader", cm_rules(), false);
    let scraper = scraper(&k, &ns);
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    assert_eq!(get(&hub.url(), &hub.ca, &token, &list, &[]).0, 200);
    assert_eq!(get(&hub.url(), &hub.ca, &scraper, "/metrics", &[]).0, 200);
    (k, hub, token, scraper, list)
}

/// Issue 47.5: when the cluster's token and authorization webhooks fail, a review the
/// hub cannot make is a 503 with Retry-After and is not kept (asked again, it is reviewed
/// again), never a 401 or a 403: a fleet-wide outage does not look like every token
/// refused. While the webhooks answer, and once they are back, refusals are 401 and 403.
#[test]
fn a_review_that_errs_is_a_503_and_never_kept_as_a_refusal() {
    if crate::util::skip_unless(test_apiserver::real::built(), "the real kube-apiserver") {
        return;
    }
    let hook = ReviewHook::start();
    let (_k, hub, token, scraper, list) = outage(&hook, "hub-errs");
    let elsewhere = list.replace("/namespaces/hub-errs", "/namespaces/hub-errs-other");
    assert_eq!(get(&hub.url(), &hub.ca, "made-up-0", &list, &[]).0, 401);
    assert_eq!(get(&hub.url(), &hub.ca, &token, &elsewhere, &[]).0, 403);
    hook.set(Mode::Fail);
    let errors = decisions(&hub, &scraper, "authentication", "error", "miss");
    for _ in 0..2 {
        let (code, head, body) = get_within(&hub.url(), &hub.ca, "made-up-1", &list, &[], 30);
        let body = String::from_utf8_lossy(&body);
        assert_eq!(code, 503, "{body}\n{}", hub.d.stderr());
        assert!(head.contains("retry-after:"), "{head}");
        assert!(body.contains("cannot authenticate the request"), "{body}");
    }
    let after = decisions(&hub, &scraper, "authentication", "error", "miss");
    assert_eq!(after - errors, 2.0, "not kept: reviewed twice");
    // An access not kept (another namespace than the refused one, whose 403 is kept).
    let third = list.replace("/namespaces/hub-errs", "/namespaces/hub-errs-third");
    let (code, head, body) = get_within(&hub.url(), &hub.ca, &token, &third, &[], 30);
    let body = String::from_utf8_lossy(&body);
    assert_eq!(code, 503, "an access the webhook could not decide: {body}");
    assert!(
        head.contains("retry-after:") && body.contains("cannot authorize the request"),
        "{body}"
    );
    // Known and kept: answered as before.
    assert_eq!(get(&hub.url(), &hub.ca, &token, &list, &[]).0, 200);
    hook.set(Mode::Refuse);
    assert_eq!(get(&hub.url(), &hub.ca, "made-up-2", &list, &[]).0, 401);
    assert_eq!(get(&hub.url(), &hub.ca, &token, &third, &[]).0, 403);
}

/// Issue 47.4: while the cluster's token webhook hangs, sixteen clients with tokens
/// nobody knows wait on their reviews, and a follower whose token and access are kept is
/// answered at once throughout (its p99 well under a second), as are the probes.
#[test]
fn a_review_that_hangs_holds_no_one_else() {
    if crate::util::skip_unless(test_apiserver::real::built(), "the real kube-apiserver") {
        return;
    }
    let hook = ReviewHook::start();
    let (_k, hub, token, _scraper, list) = outage(&hook, "hub-hangs");
    hook.set(Mode::Hang);
    let url = hub.url();
    let waiting: Vec<_> = (0..16)
        .map(|i| {
            let (url, ca, list) = (url.clone(), hub.ca.clone(), list.clone());
            std::thread::spawn(move || {
                get_within(&url, &ca, &format!("hanging-{i}"), &list, &[], 40).0
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let mut took = Vec::new();
    for _ in 0..20 {
        let at = Instant::now();
        let (code, _, _) = get_within(&hub.url(), &hub.ca, &token, &list, &[], 5);
        assert_eq!(code, 200, "{}", hub.d.stderr());
        assert_eq!(
            get_within(&hub.url(), &hub.ca, "", "/healthz", &[], 5).0,
            200
        );
        took.push(at.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    took.sort();
    let slowest = took[took.len() - 1];
    eprintln!(
        "kept follower's list and probe while 16 reviews hang: median {:?}, slowest {slowest:?}",
        took[took.len() / 2]
    );
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    hook.set(Mode::Refuse);
    for w in waiting {
        let code = w.join().unwrap();
        assert!(
            matches!(code, 401 | 429 | 503),
            "a hanging review ended with {code}"
        );
    }
}
