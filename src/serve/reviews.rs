//! The reviews `auth.rs` asks for, made by the apiserver: `POST` of a TokenReview
//! (`authentication.k8s.io/v1`) and of a SubjectAccessReview (`authorization.k8s.io/v1`)
//! with the hub's own credentials, from a small pool of clients so that the hub's workers
//! review in parallel. The token travels only in the TokenReview's body.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::sync::{Condvar, Mutex};

use serde::Deserialize;

use super::auth::{Attributes, Decision, Reviewer, User};
use crate::kube::Client;
use crate::kube::client::Method;
use crate::secret::Secret;

/// A review's answer at most.
const MAX_ANSWER: u64 = 1 << 20;

/// Reviews by the apiserver, one client per concurrent review.
pub struct ApiReviewer {
    clients: Mutex<Vec<Client>>,
    free: Condvar,
}

impl ApiReviewer {
    pub fn new(clients: Vec<Client>) -> ApiReviewer {
        ApiReviewer {
            clients: Mutex::new(clients),
            free: Condvar::new(),
        }
    }

    /// Posts `body` to `path` with a free client and reads the answer's `status`.
    fn post<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: Vec<u8>,
        action: &str,
    ) -> Result<T, String> {
        let mut client = {
            let mut pool = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(c) = pool.pop() {
                    break c;
                }
                pool = self.free.wait(pool).unwrap_or_else(|p| p.into_inner());
            }
        };
        let got = client
            .request(
                Method::Post {
                    content_type: "application/json",
                    body,
                },
                path,
                "application/json",
                action,
            )
            .map_err(|e| e.to_string())
            .and_then(|b| {
                let mut text = Vec::new();
                b.take(MAX_ANSWER)
                    .read_to_end(&mut text)
                    .map_err(|e| format!("cannot {action}: {e}"))?;
                #[derive(Deserialize)]
                struct Review<T> {
                    status: Option<T>,
                }
                let r: Review<T> = serde_json::from_slice(&text)
                    .map_err(|e| format!("cannot {action}: unexpected answer: {e}"))?;
                r.status
                    .ok_or_else(|| format!("cannot {action}: the answer has no status"))
            });
        self.clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(client);
        self.free.notify_one();
        got
    }
}

/// Whether a review's `error` (TokenReview) or `evaluationError` (SubjectAccessReview)
/// says the apiserver could not make it, rather than that it refused: an authenticator or
/// authorizer webhook it could not reach, that timed out or failed. Every refused token
/// carries an error too (`invalid bearer token`, `service account token has expired`,
/// RBAC's `clusterrole … not found`), so only the words of a failed call count: Go's
/// `net/http` and `net` errors (`Post "URL": dial tcp …: connect: connection refused`,
/// `i/o timeout`, `context deadline exceeded`…) and client-go's words for a webhook that
/// answered 5xx or 429. The apiserver answers 401 or 403 for both; the hub answers a
/// review it could not have made 503, so that an outage never looks like every follower
/// refused (docs/serve.md).
pub fn could_not_check(error: &str) -> bool {
    const FAILED_CALL: [&str; 20] = [
        "Post \"",
        "dial tcp",
        "connect: ",
        "connection refused",
        "connection reset",
        "broken pipe",
        "i/o timeout",
        "context deadline exceeded",
        "context canceled",
        "Client.Timeout exceeded",
        "no such host",
        "TLS handshake",
        "tls: ",
        "x509: ",
        "unexpected EOF",
        "http2: ",
        "an error on the server",
        "the server is currently unable to handle the request",
        "the server was unable to return a response",
        "Too many requests",
    ];
    let error = error.trim();
    !error.is_empty()
        && (FAILED_CALL.iter().any(|w| error.contains(w))
            || error
                .trim_matches(['[', ']'])
                .split(", ")
                .any(|part| part == "EOF"))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TokenStatus {
    authenticated: bool,
    user: ReviewedUser,
    error: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ReviewedUser {
    username: String,
    uid: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct AccessStatus {
    allowed: bool,
    denied: bool,
    reason: String,
    evaluation_error: String,
}

impl Reviewer for ApiReviewer {
    fn token(&self, token: &Secret) -> Result<Option<User>, String> {
        let body = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token.expose()},
        });
        let s: TokenStatus = self.post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            body.to_string().into_bytes(),
            "create a TokenReview",
        )?;
        if !s.authenticated {
            if could_not_check(&s.error) {
                return Err(format!(
                    "the apiserver could not check the token: {}",
                    s.error
                ));
            }
            if !s.error.is_empty() {
                log::debug!("a token was not authenticated: {}", s.error);
            }
            return Ok(None);
        }
        Ok(Some(User {
            name: s.user.username,
            uid: s.user.uid,
            groups: s.user.groups,
            extra: s.user.extra,
        }))
    }

    fn access(&self, user: &User, what: &Attributes) -> Result<Decision, String> {
        let mut spec = serde_json::json!({
            "user": user.name,
            "groups": user.groups,
        });
        if !user.uid.is_empty() {
            spec["uid"] = user.uid.clone().into();
        }
        if !user.extra.is_empty() {
            spec["extra"] = serde_json::json!(user.extra);
        }
        match what {
            Attributes::Resource {
                verb,
                kind,
                namespace,
                name,
            } => {
                let mut a = serde_json::json!({
                    "verb": verb,
                    "version": "v1",
                    "resource": kind.plural(),
                });
                if let Some(ns) = namespace {
                    a["namespace"] = ns.clone().into();
                }
                if let Some(n) = name {
                    a["name"] = n.clone().into();
                }
                spec["resourceAttributes"] = a;
            }
            Attributes::Path { verb, path } => {
                spec["nonResourceAttributes"] = serde_json::json!({"verb": verb, "path": path});
            }
        }
        let body = serde_json::json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        });
        let s: AccessStatus = self.post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body.to_string().into_bytes(),
            "create a SubjectAccessReview",
        )?;
        if s.allowed {
            return Ok(Decision::Allowed);
        }
        if !s.denied && could_not_check(&s.evaluation_error) {
            return Err(format!(
                "the apiserver could not decide: {}",
                s.evaluation_error
            ));
        }
        if !s.evaluation_error.is_empty() {
            log::debug!(
                "access review of {}: evaluation error: {}",
                user.name,
                s.evaluation_error
            );
        }
        Ok(Decision::Denied(s.reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the real apiserver (v1.37.2) wrote in reviews it made and could not make.
    #[test]
    fn a_failed_call_is_told_from_a_refusal() {
        for refused in [
            "",
            "invalid bearer token",
            "service account token has expired",
            "[invalid bearer token, token issuer \"x\" is invalid]",
            "invalid signature, no keys found",
            "token audiences [\"hub\"] is invalid for the target audiences [\"api\"]",
            "clusterrole.rbac.authorization.k8s.io \"gone\" not found",
            "serviceaccounts \"reader\" not found",
        ] {
            assert!(!could_not_check(refused), "{refused}");
        }
        for failed in [
            "[invalid bearer token, Post \"http://127.0.0.1:9/\": dial tcp 127.0.0.1:9: connect: connection refused]",
            "Post \"https://authz.example/\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
            "[invalid bearer token, EOF]",
            "an error on the server (\"\") has prevented the request from succeeding (post tokenreviews.authentication.k8s.io)",
            "Post \"https://10.0.0.9/\": tls: failed to verify certificate: x509: certificate signed by unknown authority",
        ] {
            assert!(could_not_check(failed), "{failed}");
        }
    }
}
