//! `Secret`: a credential that never prints. Debug and Display show `[REDACTED]`, so a
//! token cannot reach a log line or an error message by accident.

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
