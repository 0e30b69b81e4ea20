//! What goes wrong talking to the apiserver, typed so the loop can branch on it (a 401
//! refreshes credentials, a 410 restarts a paged list, a 504 "Too large resource version"
//! falls back to `resourceVersion=0`, `Retry-After` sets the next wait), and how answers
//! and transport failures become these errors: a `Status` body's reason and message, a
//! plain-text body's first line, ureq's errors by kind. Messages never hold a credential.

use std::fmt;
use std::io;
use std::time::Duration;

/// What went wrong talking to the apiserver. The poll loop branches on these: a 401
/// refreshes credentials, a 410 restarts a paged list, a 504 "Too large resource version"
/// falls back to `resourceVersion=0`, `Retry-After` sets the next wait.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// The apiserver answered with an error status.
    Api {
        action: String,
        code: u16,
        /// The `Status` reason (`Forbidden`, `Expired`…) or the HTTP reason phrase.
        reason: String,
        message: String,
        retry_after: Option<Duration>,
        /// `details.causes[].reason`, to tell a 504 "Too large resource version" apart.
        causes: Box<[String]>,
        /// `details.kind` and `details.name` of a `Status` body: the object it is about
        /// (a 404 NotFound names the resource and the object's name).
        about: Option<Box<(String, String)>>,
        /// A `cmpoll serve` hub answered (it said so: `x-cmpoll-hub`).
        hub: bool,
    },
    /// No usable answer: the connection or TLS failed.
    Transport {
        action: String,
        server: String,
        cause: String,
    },
    /// No answer within `--timeout`.
    Timeout {
        action: String,
        server: String,
        after: Duration,
    },
    /// The body grew past `--max-response-bytes`.
    TooLarge { action: String, limit: u64 },
    /// The body is not what the request asked for.
    Decode { action: String, cause: String },
    /// A credential could not be read or refreshed.
    Credentials(String),
    /// The answer is older than one already seen: results never go back in time.
    Stale {
        action: String,
        got: String,
        had: String,
    },
    /// A paged list that would not end (too many pages, too long, a repeated token).
    Unbounded { action: String, cause: String },
}

impl Error {
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A hub's 429 with `Retry-After`: not a failure but its admission (a review budget,
    /// a lane's queue), saying when to come back (docs/serve.md, "Who may read what").
    pub fn hub_asks_to_wait(&self) -> Option<Duration> {
        match self {
            Error::Api {
                code: 429,
                hub: true,
                retry_after,
                ..
            } => *retry_after,
            _ => None,
        }
    }

    /// The same error, answered by a hub (`hub`) or not.
    pub(crate) fn with_hub(mut self, hub: bool) -> Error {
        if let Error::Api { hub: h, .. } = &mut self {
            *h = hub;
        }
        self
    }

    /// 504 "Too large resource version": the serving apiserver's cache is behind.
    pub fn is_too_large_resource_version(&self) -> bool {
        match self {
            Error::Api {
                code: 504,
                causes,
                message,
                ..
            } => {
                causes.iter().any(|c| c == "ResourceVersionTooLarge")
                    || message.contains("Too large resource version")
            }
            _ => false,
        }
    }

    /// A 404 `Status` NotFound about this very object (`resource` plural, e.g.
    /// `configmaps`, and `name`), as the apiserver answers for an object that does not
    /// exist. A 404 with any other body (a proxy's page, a Status about another object or
    /// about an unknown path) says nothing about the object.
    pub fn is_not_found(&self, resource: &str, name: &str) -> bool {
        match self {
            Error::Api {
                code: 404,
                reason,
                about: Some(about),
                ..
            } => reason == "NotFound" && about.0 == resource && about.1 == name,
            _ => false,
        }
    }

    /// 410 Expired (a continue token or resourceVersion that was compacted away).
    pub fn is_expired(&self) -> bool {
        matches!(self, Error::Api { code: 410, .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api {
                action,
                code,
                reason,
                message,
                ..
            } => {
                let verb = if *code >= 500 { "failed" } else { "refused" };
                write!(f, "apiserver {verb} to {action}: {code} {reason}")?;
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            Error::Transport {
                action,
                server,
                cause,
            } => write!(f, "cannot {action}: {server}: {cause}"),
            Error::Timeout {
                action,
                server,
                after,
            } => write!(
                f,
                "cannot {action}: {server} did not answer within {} (raise --timeout, or list less per request: --namespace, --page-size)",
                humantime::format_duration(*after)
            ),
            Error::TooLarge { action, limit } => write!(
                f,
                "cannot {action}: the answer is larger than {limit} bytes (raise --max-response-bytes, e.g. --max-response-bytes {}, or list less per request: --namespace, --page-size)",
                suggest_size(*limit)
            ),
            Error::Decode { action, cause } => {
                write!(f, "cannot {action}: unexpected answer: {cause}")
            }
            Error::Credentials(why) => f.write_str(why),
            Error::Stale { action, got, had } => write!(
                f,
                "cannot {action}: the answer is at resourceVersion {got}, older than the {had} already seen (a lagging apiserver cache); not going back in time"
            ),
            Error::Unbounded { action, cause } => write!(f, "cannot {action}: {cause}"),
        }
    }
}

impl std::error::Error for Error {}

/// A cap four times `limit`, as the flag takes it (`256MiB`).
fn suggest_size(limit: u64) -> String {
    let want = limit.saturating_mul(4);
    let mib = want.div_ceil(1 << 20);
    if mib >= 1024 && mib.is_multiple_of(1024) {
        format!("{}GiB", mib / 1024)
    } else {
        format!("{mib}MiB")
    }
}

pub(crate) fn classify(
    e: ureq::Error,
    action: &str,
    server: &str,
    timeout: Duration,
    limit: u64,
) -> Error {
    let action = action.to_string();
    let server = server.to_string();
    match e {
        ureq::Error::Timeout(_) => Error::Timeout {
            action,
            server,
            after: timeout,
        },
        ureq::Error::BodyExceedsLimit(_) => Error::TooLarge { action, limit },
        ureq::Error::Io(io) => {
            let cause = match io.get_ref().and_then(|r| r.downcast_ref::<rustls::Error>()) {
                Some(tls) => format!("TLS: {tls}"),
                None if io.kind() == io::ErrorKind::UnexpectedEof => {
                    "the connection closed before the answer was complete".into()
                }
                None => io.to_string(),
            };
            Error::Transport {
                action,
                server,
                cause,
            }
        }
        ureq::Error::HostNotFound => Error::Transport {
            action,
            server,
            cause: "host not found".into(),
        },
        other => Error::Transport {
            action,
            server,
            cause: other.to_string(),
        },
    }
}

/// The typed error for a non-2xx answer, from its `Status` body when it has one.
pub(crate) fn api_error(
    action: &str,
    code: u16,
    phrase: &str,
    body: &[u8],
    retry_after: Option<Duration>,
) -> Error {
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Status {
        kind: String,
        message: String,
        reason: String,
        details: Option<Details>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct Details {
        kind: String,
        name: String,
        causes: Vec<Cause>,
        retry_after_seconds: Option<u64>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Cause {
        reason: String,
    }
    let status: Status = serde_json::from_slice(body).unwrap_or_default();
    let (reason, message, causes, detail_retry, about) =
        if status.kind == "Status" || !status.reason.is_empty() {
            let d = status.details.unwrap_or_default();
            let about =
                (status.kind == "Status" && !d.name.is_empty()).then(|| Box::new((d.kind, d.name)));
            (
                status.reason,
                status.message,
                d.causes.into_iter().map(|c| c.reason).collect(),
                d.retry_after_seconds,
                about,
            )
        } else {
            // A plain-text body (the APF 429, a proxy's error page): its first line, bounded.
            let text = String::from_utf8_lossy(body);
            let line: String = text
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .chars()
                .take(200)
                .collect();
            (String::new(), line, Box::default(), None, None)
        };
    Error::Api {
        action: action.to_string(),
        code,
        reason: if reason.is_empty() {
            phrase.to_string()
        } else {
            reason
        },
        message,
        retry_after: retry_after.or(detail_retry.map(Duration::from_secs)),
        causes,
        about,
        hub: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::fixture;

    #[test]
    fn messages_read_well() {
        let e = Error::Api {
            action: "list configmaps in namespace \"apps\"".into(),
            code: 403,
            reason: "Forbidden".into(),
            message: "configmaps is forbidden: User \"x\" cannot list".into(),
            retry_after: None,
            causes: Box::default(),
            about: None,
            hub: false,
        };
        assert_eq!(
            e.to_string(),
            "apiserver refused to list configmaps in namespace \"apps\": 403 Forbidden: configmaps is forbidden: User \"x\" cannot list"
        );
        let e = Error::Timeout {
            action: "list configmaps in all namespaces".into(),
            server: "https://10.0.0.1:443".into(),
            after: Duration::from_millis(1500),
        };
        assert_eq!(
            e.to_string(),
            "cannot list configmaps in all namespaces: https://10.0.0.1:443 did not answer within 1s 500ms (raise --timeout, or list less per request: --namespace, --page-size)"
        );
    }

    #[test]
    fn too_large_resource_version_is_recognised() {
        let e = Error::Api {
            action: String::new(),
            code: 504,
            reason: "Timeout".into(),
            message: "Timeout: Too large resource version: 5, current: 4".into(),
            retry_after: None,
            causes: Box::new(["ResourceVersionTooLarge".into()]),
            about: None,
            hub: false,
        };
        assert!(e.is_too_large_resource_version());
        let timeout = Error::Api {
            action: String::new(),
            code: 504,
            reason: "Timeout".into(),
            message: "Timeout: request did not complete within the allotted timeout".into(),
            retry_after: None,
            causes: Box::default(),
            about: None,
            hub: false,
        };
        assert!(!timeout.is_too_large_resource_version());
    }

    /// Issue 56.8: only a hub's 429 with Retry-After asks a follower to come back then;
    /// an apiserver's (APF) or a hub's without one is a failure as before.
    #[test]
    fn a_hubs_429_says_when_to_come_back() {
        let busy = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{},"code":429}"#;
        let after = Some(Duration::from_secs(3));
        let e =
            |code, hub, ra| api_error("list", code, "Too Many Requests", busy, ra).with_hub(hub);
        assert_eq!(e(429, true, after).hub_asks_to_wait(), after);
        assert_eq!(
            e(429, false, after).hub_asks_to_wait(),
            None,
            "an apiserver's"
        );
        assert_eq!(e(429, true, None).hub_asks_to_wait(), None);
        assert_eq!(e(503, true, after).hub_asks_to_wait(), None, "an outage");
        assert_eq!(e(429, false, after).retry_after(), after, "still a floor");
    }

    /// Issue 23.2: only the apiserver's NotFound about this very object means "gone".
    #[test]
    fn not_found_is_about_the_object_asked_for_or_nothing() {
        let at = |body: &[u8]| api_error("get configmap", 404, "Not Found", body, None);
        let named = at(&fixture("status-404-configmap.json"));
        assert!(named.is_not_found("configmaps", "payments-config"));
        assert!(!named.is_not_found("configmaps", "other"));
        assert!(!named.is_not_found("secrets", "payments-config"));
        let path = at(&fixture("status-404-unknown-resource-under-api-v1.json"));
        assert!(!path.is_not_found("configmaps", "payments-config"));
        assert!(!at(b"404 page not found\n").is_not_found("configmaps", "payments-config"));
        // A body that names the object but is not a Status.
        let not_status =
            br#"{"kind":"ConfigMap","reason":"NotFound","details":{"name":"payments-config","kind":"configmaps"}}"#;
        assert!(!at(not_status).is_not_found("configmaps", "payments-config"));
    }

    #[test]
    fn status_bodies_become_typed_errors() {
        let e = api_error(
            "list configmaps",
            403,
            "Forbidden",
            &fixture("status-403-namespace.json"),
            None,
        );
        assert_eq!(e.code(), Some(403));
        assert!(e.to_string().starts_with(
            "apiserver refused to list configmaps: 403 Forbidden: configmaps is forbidden: User"
        ));
        let e = api_error(
            "list",
            504,
            "Gateway Timeout",
            &fixture("status-504-too-large-resource-version.json"),
            None,
        );
        assert!(e.is_too_large_resource_version());
        assert_eq!(
            e.retry_after(),
            Some(Duration::from_secs(1)),
            "from details"
        );
        let e = api_error(
            "list",
            410,
            "Gone",
            &fixture("status-410-continue-expired.json"),
            None,
        );
        assert!(e.is_expired());
        let e = api_error(
            "list",
            429,
            "Too Many Requests",
            &fixture("apf-429-body.txt"),
            Some(Duration::from_secs(4)),
        );
        assert_eq!(
            e.to_string(),
            "apiserver refused to list: 429 Too Many Requests: Too many requests, please try again later."
        );
        assert_eq!(e.retry_after(), Some(Duration::from_secs(4)));
        let e = api_error("list", 502, "Bad Gateway", b"", None);
        assert_eq!(e.to_string(), "apiserver failed to list: 502 Bad Gateway");
    }
}
