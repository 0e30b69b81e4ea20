//! Reaching the apiserver. Config is data, the client is transport (kube-rs's split):
//! `Config::resolve` decides, from flags, kubeconfig files and the environment, where the
//! apiserver is and how to authenticate, without any I/O beyond reading those files;
//! `Client` turns a `Config` into HTTPS requests (ureq + rustls) and typed errors;
//! `decode` streams a list body item by item.

pub mod auth;
pub mod client;
pub mod config;
pub mod decode;
pub mod exec;
pub mod incluster;
pub mod kubeconfig;
pub mod proxy;
pub mod tls;

use std::fmt;
use std::time::Duration;

pub use client::Client;
pub use config::Config;

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
        causes: Vec<String>,
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
    /// Something local failed while handling the answer (for example the spool).
    Local(String),
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
                "cannot {action}: {server} did not answer within {} (--timeout)",
                humantime::format_duration(*after)
            ),
            Error::TooLarge { action, limit } => write!(
                f,
                "cannot {action}: the answer is larger than {limit} bytes (raise --max-response-bytes)"
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
            Error::Local(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_well() {
        let e = Error::Api {
            action: "list configmaps in namespace \"apps\"".into(),
            code: 403,
            reason: "Forbidden".into(),
            message: "configmaps is forbidden: User \"x\" cannot list".into(),
            retry_after: None,
            causes: vec![],
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
            "cannot list configmaps in all namespaces: https://10.0.0.1:443 did not answer within 1s 500ms (--timeout)"
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
            causes: vec!["ResourceVersionTooLarge".into()],
        };
        assert!(e.is_too_large_resource_version());
        let timeout = Error::Api {
            action: String::new(),
            code: 504,
            reason: "Timeout".into(),
            message: "Timeout: request did not complete within the allotted timeout".into(),
            retry_after: None,
            causes: vec![],
        };
        assert!(!timeout.is_too_large_resource_version());
    }
}
