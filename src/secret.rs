//! `Secret`: a credential that never prints. Debug and Display show `[REDACTED]`, so a
//! token cannot reach a log line or an error message by accident. (A rejection's reason as
//! a Kubernetes Secret's module may show it is `reason::redacted`.)

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
