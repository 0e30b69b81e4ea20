//! `Secret`: a credential that never prints. Debug and Display show `[REDACTED]`, so a
//! token cannot reach a log line or an error message by accident. And `redact_reason`: a
//! validator's reason as a Kubernetes Secret's module may show it (its exit status, never
//! its output, which may quote the Secret).

use std::fmt;

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that needs it: building a request header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// A secret given as it is, or as a file read at each use (a password that rotates):
/// a reload URL's header, k8s-sidecar's `REQ_PASSWORD_FILE`.
#[derive(Clone, Debug)]
pub enum SecretSource {
    Text(Secret),
    File(std::path::PathBuf),
}

impl SecretSource {
    /// The secret now: a file is read, its trailing newline trimmed; the error names it.
    pub fn read(&self) -> Result<Secret, String> {
        match self {
            SecretSource::Text(s) => Ok(s.clone()),
            SecretSource::File(p) => std::fs::read_to_string(p)
                .map(|v| Secret::new(v.trim_end_matches(['\n', '\r'])))
                .map_err(|e| format!("cannot read '{}': {e}", p.display())),
        }
    }
}

/// A rejection's reason as a Secret's may be shown (a `Rejected` Event's note, `/status`,
/// a stdout event, a log line): the validator's exit status (the last line of a
/// validator's reason, `(validator exited with status 1)`), never its output, which may
/// quote the Secret. A reason that is not a validator's (a name clash names keys and
/// modules only) is kept.
pub fn redact_reason(reason: &str) -> String {
    let last = reason.lines().last().unwrap_or("");
    if let Some(status) = last
        .strip_prefix("(validator ")
        .and_then(|s| s.strip_suffix(')'))
    {
        return format!("validator {status}");
    }
    if let Some(rest) = reason.strip_prefix("validator cannot run: ") {
        let status = rest.split(": ").next().unwrap_or(rest);
        return format!("validator cannot run: {status}");
    }
    if reason.starts_with("validator ") && !reason.contains('\n') {
        return reason.to_string();
    }
    if reason.contains("validator") || reason.contains('\n') {
        return "rejected by --validate (a Secret's validator output is not shown)".into();
    }
    reason.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_debug_does_not_leak() {
        let s = Secret::new("s3cr3t-token");
        assert_eq!(format!("{s:?} {s}"), "[REDACTED] [REDACTED]");
        assert_eq!(format!("{:?}", Some(&s)), "Some([REDACTED])");
        assert_eq!(s.expose(), "s3cr3t-token");
    }
}
