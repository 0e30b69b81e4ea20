//! Issue 49.2's opt-ins on the real apiserver. `--token-audience`: a follower's token
//! requested for the hub's audience is verified by the hub itself (no TokenReview), refused
//! or accepted as the apiserver's own TokenReview for that audience decides it — another
//! audience, an expired token signed with the issuer's key, a token signed by a key the
//! issuer never had, and a token signed with the issuer's next key after it rotated — and
//! access is still reviewed. `--authorize-per-service-account`: pods of one service account
//! cost one SubjectAccessReview per scope.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use test_apiserver::real::RealApiserver;

use super::hub::*;
use super::*;
use crate::util::{SOON, eventually_explained};

const AUDIENCE: &str = "cmpoll-hub";

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn unb64url(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap()
}

/// A token of service account `ns/name` for `audience`, from TokenRequest.
fn token_for(k: &RealApiserver, ns: &str, name: &str, audience: &str) -> String {
    (k.ok(&[
        "create",
        "token",
        name,
        "-n",
        ns,
        "--duration",
        "10m",
        "--audience",
        audience,
    ]))
    .trim()
    .to_string()
}

/// `token`'s header and claims.
fn parts(token: &str) -> (Value, Value) {
    let mut p = token.split('.');
    let head = serde_json::from_slice(&unb64url(p.next().unwrap())).unwrap();
    let claims = serde_json::from_slice(&unb64url(p.next().unwrap())).unwrap();
    (head, claims)
}

/// A token of `header` and `claims` signed (ES256) with the P-256 key in `pem` (PKCS#8).
fn signed(pem: &str, header: &Value, claims: &Value) -> String {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
    let der: String = (pem.lines()).filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(der)
        .unwrap();
    let rng = ring::rand::SystemRandom::new();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng).unwrap();
    let signing = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let sig = key.sign(&rng, signing.as_bytes()).unwrap();
    format!("{signing}.{}", b64url(sig.as_ref()))
}

/// Whether the apiserver's own TokenReview for the hub's audience authenticates `token`.
fn apiserver_says(k: &RealApiserver, token: &str) -> bool {
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token, "audiences": [AUDIENCE]}});
    let out = k.ok_in(
        &["create", "-f", "-", "-o", "json"],
        Some(&review.to_string()),
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    v["status"]["authenticated"] == true
}

fn decisions(hub: &Hub, scraper: &str, labels: &[(&str, &str)]) -> f64 {
    let (_, _, m) = get(&hub.url(), &hub.ca, scraper, "/metrics", &[]);
    metric_sum(
        &String::from_utf8_lossy(&m),
        "cmpoll_serve_decisions_total",
        labels,
    )
}

/// A service account's key pair kept in the cluster's folder: replaced (the next key
/// signs, both verify) and the apiserver restarted on it.
fn rotate_issuer_key(k: &RealApiserver) {
    let dir = k.dir();
    let (next_key, next_pub) = test_apiserver::pki::signing_key();
    let old_pub = std::fs::read_to_string(dir.join("sa.pub")).unwrap();
    k.stop_apiserver();
    std::fs::write(dir.join("sa.key"), next_key).unwrap();
    std::fs::write(dir.join("sa.pub"), format!("{old_pub}{next_pub}")).unwrap();
    k.start_apiserver();
}

#[test]
fn tokens_for_the_hubs_audience_are_verified_by_the_hub_as_the_apiserver_would() {
    if crate::util::skip_unless(
        test_apiserver::real::built(),
        "the real kube-apiserver (tests/kube/build.sh)",
    ) {
        return;
    }
    // A cluster of its own: its issuer key is rotated at the end.
    let k = &RealApiserver::start();
    let ns = k.namespace("hub-tokens");
    let other = k.namespace("hub-tokens-other");
    put_module(k, &ns, "m", "k.yaml", "one");
    put_module(k, &other, "m", "k.yaml", "one");
    let hub = start_hub(
        k,
        &hub_account(k, &ns, "hub"),
        &["--token-audience", AUDIENCE, "--interval", "1s"],
    );
    // The reader may list in `ns` only.
    let _ = follower(k, &ns, "reader", cm_rules(), false);
    let scraper = scraper(k, &ns);
    let token = token_for(k, &ns, "reader", AUDIENCE);
    let list = |ns: &str| format!("/api/v1/namespaces/{ns}/configmaps");
    let status = |t: &str, ns: &str| get(&hub.url(), &hub.ca, t, &list(ns), &[]).0;

    // Accepted, without a TokenReview; refused by the apiserver itself (not its audience).
    let reviewed = decisions(
        &hub,
        &scraper,
        &[("check", "authentication"), ("cache", "miss")],
    );
    assert_eq!(status(&token, &ns), 200, "{}", hub.d.stderr());
    assert!(apiserver_says(k, &token));
    assert_eq!(
        decisions(
            &hub,
            &scraper,
            &[
                ("check", "authentication"),
                ("result", "allowed"),
                ("cache", "local")
            ]
        ),
        1.0
    );
    // The scraper's own token (the apiserver's audience) was reviewed; the reader's not.
    assert_eq!(
        decisions(
            &hub,
            &scraper,
            &[("check", "authentication"), ("cache", "miss")]
        ),
        reviewed,
        "no TokenReview for the hub's token"
    );
    let (code, _, _) = get(&k.url, &k.dir().join("ca.crt"), &token, &list(&ns), &[]);
    assert_eq!(
        code, 401,
        "a token for the hub cannot be replayed to the apiserver"
    );
    // Access is still reviewed: no `list` in the other namespace.
    assert_eq!(status(&token, &other), 403);

    // Another audience: the apiserver reviews it, and refuses it.
    let elsewhere = token_for(k, &ns, "reader", "somebody-else");
    assert_eq!(status(&elsewhere, &ns), 401);
    assert!(!apiserver_says(k, &elsewhere));

    // Signed with the issuer's own key, for the hub, expired: refused by both.
    let key_pem = std::fs::read_to_string(k.dir().join("sa.key")).unwrap();
    let (head, claims) = parts(&token);
    let mut expired = claims.clone();
    let now = claims["iat"].as_f64().unwrap();
    expired["exp"] = json!(now as i64 - 300);
    expired["nbf"] = json!(now as i64 - 900);
    expired["iat"] = json!(now as i64 - 900);
    let expired = signed(&key_pem, &head, &expired);
    assert!(!apiserver_says(k, &expired));
    assert_eq!(status(&expired, &ns), 401);
    // The same claims, unexpired, signed by the issuer's key: the oracle accepts them (so
    // the two above differ in their expiry alone).
    let fresh = signed(&key_pem, &head, &claims);
    assert!(apiserver_says(k, &fresh));
    assert_eq!(status(&fresh, &ns), 200);
    // Signed by a key the issuer never had, under its key id: refused by both.
    let (stranger, _) = test_apiserver::pki::signing_key();
    let forged = signed(&stranger, &head, &claims);
    assert!(!apiserver_says(k, &forged));
    assert_eq!(status(&forged, &ns), 401);

    // The issuer's key rotates (the old one still verifies): a token signed with the new
    // one, under a key id the hub has not seen, is taken at once.
    rotate_issuer_key(k);
    let rotated = token_for(k, &ns, "reader", AUDIENCE);
    let (new_head, _) = parts(&rotated);
    assert_ne!(new_head["kid"], head["kid"], "a new key id");
    eventually_explained(
        "the hub polls again after the apiserver's restart",
        SOON,
        || get(&hub.url(), &hub.ca, "", "/readyz", &[]).0 == 200,
        || hub.d.stderr(),
    );
    assert!(apiserver_says(k, &rotated));
    assert_eq!(status(&rotated, &ns), 200, "{}", hub.d.stderr());
    assert_eq!(
        status(&token, &ns),
        200,
        "the old key's tokens still verify"
    );
    let refused_here = decisions(
        &hub,
        &scraper,
        &[
            ("check", "authentication"),
            ("result", "denied"),
            ("cache", "local"),
        ],
    );
    assert_eq!(refused_here, 2.0, "the expired and the forged one");
    let log = hub.d.stderr();
    assert!(
        !log.contains(&token) && !log.contains(&rotated),
        "no token in the log"
    );
}

/// With `--authorize-per-service-account`, three pods of one service account (tokens bound
/// to each pod, so their users differ in `extra`) cost one SubjectAccessReview for their
/// namespace's list; without it, three. A pod of an account without `list` there is still
/// refused.
#[test]
fn a_service_accounts_pods_share_one_access_review_when_asked() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-per-account");
    put_module(k, &ns, "m", "k.yaml", "one");
    let _ = follower(k, &ns, "agent", cm_rules(), false);
    let _ = follower(k, &ns, "nobody", json!([]), false);
    // Pods for the tokens to be bound to (no kubelet runs them: they need only exist).
    for (pod, sa) in [
        ("agent-0", "agent"),
        ("agent-1", "agent"),
        ("agent-2", "agent"),
        ("nobody-0", "nobody"),
    ] {
        k.apply(
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": ns},
                "spec": {"serviceAccountName": sa, "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "busybox"}]}})
            .to_string(),
        );
    }
    let bound = |pod: &str, sa: &str| {
        let uid = k.ok(&[
            "get",
            "pod",
            pod,
            "-n",
            &ns,
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        (k.ok(&[
            "create",
            "token",
            sa,
            "-n",
            &ns,
            "--duration",
            "10m",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            pod,
            "--bound-object-uid",
            uid.trim(),
        ]))
        .trim()
        .to_string()
    };
    let tokens: Vec<String> = (0..3)
        .map(|i| bound(&format!("agent-{i}"), "agent"))
        .collect();
    let (_, claims) = parts(&tokens[0]);
    assert!(
        claims["kubernetes.io"]["pod"]["name"] == "agent-0",
        "{claims}"
    );
    for (per_account, reviews) in [(false, 3.0), (true, 1.0)] {
        let mut args = vec!["--namespace", &ns];
        if per_account {
            args.push("--authorize-per-service-account");
        }
        let hub = start_hub(k, &hub_account(k, &ns, "hub"), &args);
        let scraper = scraper(k, &ns);
        let made = |hub: &Hub| {
            decisions(
                hub,
                &scraper,
                &[("check", "authorization"), ("cache", "miss")],
            )
        };
        let before = made(&hub);
        for t in &tokens {
            let path = format!("/api/v1/namespaces/{ns}/configmaps");
            assert_eq!(get(&hub.url(), &hub.ca, t, &path, &[]).0, 200);
        }
        assert_eq!(made(&hub) - before, reviews, "per account: {per_account}");
        let refused = bound("nobody-0", "nobody");
        let path = format!("/api/v1/namespaces/{ns}/configmaps");
        assert_eq!(get(&hub.url(), &hub.ca, &refused, &path, &[]).0, 403);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A token of `ns/name` for `audience`, issued to live `duration`.
fn token_living(k: &RealApiserver, ns: &str, name: &str, audience: &str, duration: &str) -> String {
    (k.ok(&[
        "create",
        "token",
        name,
        "-n",
        ns,
        "--duration",
        duration,
        "--audience",
        audience,
    ]))
    .trim()
    .to_string()
}

/// Issue 56.7: with `--token-audience` the hub checks a token for it as the apiserver's
/// service-account authenticator does. A token whose account was deleted and made again
/// (another uid) is refused, as the apiserver's own TokenReview for that audience refuses
/// it, while the new account's token is accepted; a token issued to live a year is not
/// trusted on its signature: the apiserver reviews it (for the hub's audience) and refuses
/// it once its account is gone. (On 55fa4de both old tokens were accepted.)
#[test]
fn a_token_for_the_hub_is_refused_once_its_account_is_gone() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-account");
    put_module(k, &ns, "m", "k.yaml", "one");
    let hub = start_hub(
        k,
        &hub_account(k, &ns, "hub"),
        &["--token-audience", AUDIENCE, "--namespace", &ns],
    );
    let _ = follower(k, &ns, "reader", cm_rules(), false);
    let scraper = scraper(k, &ns);
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    let status = |t: &str| get(&hub.url(), &hub.ca, t, &list, &[]).0;
    let reviewed = || {
        decisions(
            &hub,
            &scraper,
            &[("check", "authentication"), ("cache", "miss")],
        )
    };
    let local = || {
        decisions(
            &hub,
            &scraper,
            &[("check", "authentication"), ("cache", "local")],
        )
    };
    // A year's token: reviewed by the apiserver, not verified here.
    let year = token_living(k, &ns, "reader", AUDIENCE, "8760h");
    let (_, claims) = parts(&year);
    assert!(claims["exp"].as_f64().unwrap() - claims["iat"].as_f64().unwrap() > 8000.0 * 3600.0);
    let (before, here) = (reviewed(), local());
    assert_eq!(status(&year), 200, "{}", hub.d.stderr());
    assert_eq!(
        reviewed() - before,
        1.0,
        "a TokenReview for the hub's audience"
    );
    assert_eq!(local(), here, "not verified here");
    // Tokens made before the account is deleted and made again, first shown after.
    let old = token_for(k, &ns, "reader", AUDIENCE);
    let old_year = token_living(k, &ns, "reader", AUDIENCE, "8760h");
    let uid = |k: &RealApiserver| {
        k.ok(&[
            "get",
            "serviceaccount",
            "reader",
            "-n",
            &ns,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
    };
    let was = uid(k);
    k.ok(&["delete", "serviceaccount", "reader", "-n", &ns]);
    k.apply(
        &json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "reader", "namespace": ns}})
        .to_string(),
    );
    assert_ne!(uid(k), was, "made again: another uid");
    assert!(!apiserver_says(k, &old), "the oracle refuses the old token");
    assert!(!apiserver_says(k, &old_year));
    assert_eq!(status(&old), 401, "{}", hub.d.stderr());
    assert_eq!(status(&old_year), 401, "{}", hub.d.stderr());
    let new = token_for(k, &ns, "reader", AUDIENCE);
    assert!(apiserver_says(k, &new));
    assert_eq!(status(&new), 200, "{}", hub.d.stderr());
    let log = hub.d.stderr();
    assert!(!log.contains(&old) && !log.contains(&new) && !log.contains(&year));
}

/// Issue 56.9: the apiserver echoes what a client wrote in a refusal (`token audiences
/// ["…"] is invalid for the target audiences …`); a token whose audience reads like a
/// failed call (`dial tcp …`, `i/o timeout`) is a 401 at the hub, as at the apiserver,
/// never a 503 that tells the follower the cluster is down. (On 55fa4de: 503.)
#[test]
fn a_refusal_that_echoes_a_clients_words_is_not_an_outage() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-echo");
    put_module(k, &ns, "m", "k.yaml", "one");
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--namespace", &ns]);
    let _ = follower(k, &ns, "reader", cm_rules(), false);
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    for audience in [
        "dial tcp 10.0.0.1:443: connect: connection refused",
        "Post \"https://10.0.0.1/\": i/o timeout",
    ] {
        let token = token_for(k, &ns, "reader", audience);
        let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}});
        let out = k.ok_in(
            &["create", "-f", "-", "-o", "json"],
            Some(&review.to_string()),
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        let error = v["status"]["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_eq!(v["status"]["authenticated"], Value::Null, "{v}");
        assert!(error.contains("token audiences"), "echoed: {error}");
        let (code, _, body) = get(&hub.url(), &hub.ca, &token, &list, &[]);
        assert_eq!(code, 401, "{audience}: {}", String::from_utf8_lossy(&body));
    }
}
