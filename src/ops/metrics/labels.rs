//! A metric's labels, as every family of `Metrics` keys them.

pub type Labels = Vec<(String, String)>;

/// One label.
pub fn label(k: &str, v: &str) -> Labels {
    vec![(k.to_string(), v.to_string())]
}
