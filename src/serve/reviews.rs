//! The reviews `authn.rs` and `authz.rs` ask for, made by the apiserver: `POST` of a
//! TokenReview (`authentication.k8s.io/v1`) and of a SubjectAccessReview
//! (`authorization.k8s.io/v1`), and `GET` of a service account (`--token-audience`), with
//! the hub's own credentials, from a small pool of clients so that the hub's workers
//! review in parallel. The token travels only in the TokenReview's body.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::sync::{Condvar, Mutex};

use serde::Deserialize;

use super::reviewer::{Account, Attributes, Decision, Reviewer};
use super::user::User;
use crate::kube::Client;
use crate::kube::client::Method;
use crate::locks::Recover;
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

    /// `f` with a free client.
    fn with_client<T>(&self, f: impl FnOnce(&mut Client) -> T) -> T {
        let mut client = {
            let mut pool = self.clients.lock().recover();
            loop {
                if let Some(c) = pool.pop() {
                    break c;
                }
                pool = self.free.wait(pool).recover();
            }
        };
        let got = f(&mut client);
        self.clients.lock().recover().push(client);
        self.free.notify_one();
        got
    }

    /// Posts `body` to `path` with a free client and reads the answer's `status`.
    fn post<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: Vec<u8>,
        action: &str,
    ) -> Result<T, String> {
        self.with_client(|client| {
            client
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
                })
        })
    }
}

/// Whether a review's `error` (TokenReview) or `evaluationError` (SubjectAccessReview)
/// says the apiserver could not make it, rather than that it refused: an authenticator or
/// authorizer webhook it could not reach, that timed out or failed. Every refused token
/// carries an error too (`invalid bearer token`, `service account token has expired`,
/// RBAC's `clusterrole … not found`), and some echo what the client sent (`token issuer
/// "…" is invalid`: a token's own `iss`), so only an error that *begins* as a failed call
/// does (`failed_call`), each error of the apiserver's aggregate (`[a, b]`) on its own,
/// split outside the quoted strings in which the apiserver echoes a client's text. The
/// apiserver answers 401 or 403 for both; the hub answers a review it could not have made
/// 503, so that an outage never looks like every follower refused (docs/serve.md).
pub fn could_not_check(error: &str) -> bool {
    let mut parts = Vec::new();
    split_aggregate(error, &mut parts);
    parts.into_iter().any(failed_call)
}

/// How a failed call's error begins: Go's `net` (`dial tcp …`, `read tcp …: connection
/// reset by peer`), a context's end, a connection cut (`EOF`), TLS, and client-go's words
/// for a webhook that answered 5xx or 429; besides Go's `*url.Error` (`Post "URL": …`).
const FAILED_CALL: [&str; 15] = [
    "dial tcp",
    "read tcp",
    "write tcp",
    "context deadline exceeded",
    "context canceled",
    "net/http: ",
    "http2: ",
    "tls: ",
    "x509: ",
    "unexpected EOF",
    "an error on the server",
    "the server is currently unable to handle the request",
    "the server was unable to return a response",
    "the server has received too many requests",
    "Too many requests",
];

/// Whether one error (of an aggregate) is a failed call.
fn failed_call(error: &str) -> bool {
    let e = error.trim();
    e == "EOF" || url_error(e) || FAILED_CALL.iter().any(|w| e.starts_with(w))
}

/// Go's `*url.Error`: `Op "URL": cause`, the op an HTTP method (`Post`, `Get`…).
fn url_error(e: &str) -> bool {
    let Some((op, rest)) = e.split_once(' ') else {
        return false;
    };
    matches!(op, "Post" | "Get" | "Put" | "Patch" | "Delete")
        && quoted_len(rest).is_some_and(|n| rest[n..].starts_with(": "))
}

/// The length of the Go-quoted string `s` begins with (`"…"`, with backslash escapes).
fn quoted_len(s: &str) -> Option<usize> {
    let mut chars = s.char_indices();
    if chars.next()?.1 != '"' {
        return None;
    }
    let mut escaped = false;
    for (i, c) in chars {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '"') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// The errors of an apimachinery aggregate (`[a, b, [c, d]]`, or one error alone), split
/// at the `, ` between them and never inside a quoted string.
fn split_aggregate<'a>(error: &'a str, out: &mut Vec<&'a str>) {
    let e = error.trim();
    let inner = match e.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        Some(inner) => inner,
        None => {
            out.push(e);
            return;
        }
    };
    let (mut depth, mut start, mut i) = (0usize, 0usize, 0usize);
    let bytes = inner.as_bytes();
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += quoted_len(&inner[i..]).unwrap_or(inner.len() - i);
                continue;
            }
            b'[' => depth += 1,
            b']' => depth = depth.saturating_sub(1),
            b',' if depth == 0 && bytes.get(i + 1) == Some(&b' ') => {
                split_aggregate(&inner[start..i], out);
                start = i + 2;
            }
            _ => {}
        }
        i += 1;
    }
    split_aggregate(&inner[start..], out);
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
    fn token(&self, token: &Secret, audience: Option<&str>) -> Result<Option<User>, String> {
        let mut body = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token.expose()},
        });
        if let Some(a) = audience {
            body["spec"]["audiences"] = serde_json::json!([a]);
        }
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

    fn account(&self, namespace: &str, name: &str) -> Result<Account, String> {
        #[derive(Deserialize, Default)]
        #[serde(default, rename_all = "camelCase")]
        struct Meta {
            uid: String,
            deletion_timestamp: Option<String>,
        }
        #[derive(Deserialize)]
        struct ServiceAccount {
            metadata: Meta,
        }
        let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}");
        let action = format!("get serviceaccount {namespace}/{name}");
        let got = self.with_client(|c| {
            let body = c.get(&path, "application/json", &action)?;
            let mut text = Vec::new();
            (body.take(MAX_ANSWER).read_to_end(&mut text)).map_err(|e| {
                crate::kube::Error::Decode {
                    action: action.clone(),
                    cause: e.to_string(),
                }
            })?;
            Ok::<_, crate::kube::Error>(text)
        });
        let text = match got {
            Ok(text) => text,
            Err(e) if e.code() == Some(404) => return Ok(Account::Gone),
            Err(e) if e.code() == Some(403) => return Ok(Account::Unreadable),
            Err(e) => return Err(e.to_string()),
        };
        let sa: ServiceAccount = serde_json::from_slice(&text)
            .map_err(|e| format!("cannot {action}: unexpected answer: {e}"))?;
        let deleted = (sa.metadata.deletion_timestamp.as_deref())
            .map(|t| humantime::parse_rfc3339(t).map(super::issuer::unix))
            .transpose()
            .map_err(|e| format!("cannot {action}: its deletionTimestamp: {e}"))?;
        Ok(Account::Exists {
            uid: sa.metadata.uid,
            deleted,
        })
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
            // Issue 56.9: what a client wrote, echoed by the apiserver (quoted), is never
            // read as a failed call, wherever it stands.
            "[invalid bearer token, token issuer \"dial tcp\" is invalid]",
            "token issuer \"Post \\\"http://x/\\\": dial tcp 1.2.3.4:5: connect: connection refused\" is invalid",
            "[invalid bearer token, token issuer \"x, Post \\\"h\\\": EOF, EOF\" is invalid]",
            "token audiences [\"i/o timeout\" \"context deadline exceeded\"] is invalid for the target audiences [\"api\"]",
            "[invalid bearer token, oidc: verify token: oidc: expected audience \"EOF\" got [\"x509: \"]]",
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
            "[invalid bearer token, [Post \"http://h/\": EOF, token issuer \"x\" is invalid]]",
            "the server is currently unable to handle the request (post tokenreviews.authentication.k8s.io)",
            "[clusterrole.rbac.authorization.k8s.io \"gone\" not found, Post \"http://127.0.0.1:1/authz?timeout=30s\": context deadline exceeded]",
        ] {
            assert!(could_not_check(failed), "{failed}");
        }
    }
}
