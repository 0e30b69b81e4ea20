//! The apiserver's name rules, with its exact messages: object names and ConfigMap keys as
//! apimachinery `pkg/util/validation` checks them, label keys and values as
//! `pkg/api/validate/content` does (what `labels.Parse` uses since v0.35; lengths there are
//! "bytes", not "characters"). Ported from apimachinery v0.36.3.
//!
//! cmpoll uses them to reject a ConfigMap the apiserver would never have accepted before a
//! name or key reaches a file path, and the selector parser uses them for label keys and
//! values. Self-contained (std only) so the test apiserver can include this file by path.

/// Longest DNS-1123 subdomain (object names, config keys), in bytes.
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Longest DNS-1123 label (namespaces), in bytes.
pub const DNS1123_LABEL_MAX: usize = 63;
const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const CONFIG_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_KEY_MSG: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";

/// `validation.MaxLenError`.
fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `content.MaxLenError`.
fn max_bytes_error(n: usize) -> String {
    format!("must be no more than {n} bytes")
}

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = format!("{msg} (e.g. ");
    for (i, ex) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{ex}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_dns1123_label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    let lower_alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            lower_alnum(f) && lower_alnum(l) && b.iter().all(|c| lower_alnum(c) || *c == b'-')
        }
        _ => false,
    }
}

fn is_dns1123_subdomain_shape(s: &str) -> bool {
    s.split('.').all(is_dns1123_label_shape)
}

/// `content.IsLabelKey`: a label key such as `app.kubernetes.io/name`.
pub fn label_key(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain_content(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX {
        errs.push(format!("name part {}", max_bytes_error(QUALIFIED_NAME_MAX)));
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// `content.IsLabelValue`: empty, or a label-key name part of at most 63 bytes.
pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX {
        errs.push(max_bytes_error(LABEL_VALUE_MAX));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// `content.IsDNS1123Subdomain`: a label key's prefix (its length in bytes).
fn dns1123_subdomain_content(value: &str) -> Vec<String> {
    subdomain(value, max_bytes_error)
}

/// `IsDNS1123Subdomain`: ConfigMap names (their length in characters).
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    subdomain(value, max_len_error)
}

fn subdomain(value: &str, too_long: fn(usize) -> String) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(too_long(DNS1123_SUBDOMAIN_MAX));
    }
    if !is_dns1123_subdomain_shape(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// `IsDNS1123Label`: namespaces.
pub fn dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX {
        errs.push(max_len_error(DNS1123_LABEL_MAX));
    }
    if !is_dns1123_label_shape(value) {
        if is_dns1123_subdomain_shape(value) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// `IsConfigMapKey`: `data` and `binaryData` keys, which cmpoll turns into file names.
pub fn config_map_key(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    let shape = !value.is_empty()
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if !shape {
        errs.push(regex_error(
            CONFIG_KEY_MSG,
            CONFIG_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    if value == "." {
        errs.push("must not be '.'".to_string());
    } else if value == ".." {
        errs.push("must not be '..'".to_string());
    } else if value.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    errs
}

/// Go's `%q` for a string: what apimachinery prints around a bad value.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apimachinery v0.36.3 `pkg/api/validate/content` (`IsLabelKey`): since v0.35 label
    /// keys are "a valid label key" and lengths are in bytes.
    #[test]
    fn label_keys() {
        for ok in ["a", "app", "app.kubernetes.io/name", "A_b-c.D", "x/y", "a1"] {
            assert!(label_key(ok).is_empty(), "{ok}");
        }
        let cases: &[(&str, &str)] = &[
            (
                "app:web",
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            ),
            ("/a", "prefix part must be non-empty"),
            ("a/b/c", "a valid label key must consist of"),
            ("-a", "name part must consist"),
            (
                "Example.com/a",
                "prefix part a lowercase RFC 1123 subdomain",
            ),
        ];
        for (input, want) in cases {
            let got = label_key(input).join("; ");
            assert!(got.starts_with(want), "{input}: {got}");
        }
        assert_eq!(
            label_key(&"a".repeat(64))[0],
            "name part must be no more than 63 bytes"
        );
        assert_eq!(
            label_key(&format!("{}/a", "a".repeat(254)))[0],
            "prefix part must be no more than 253 bytes"
        );
        assert_eq!(label_key("").len(), 2, "empty is both non-empty and regex");
    }

    #[test]
    fn label_values() {
        assert!(label_value("").is_empty());
        assert!(label_value("v1.2_x-y").is_empty());
        assert_eq!(label_value("-x").len(), 1);
        assert_eq!(
            label_value(&"a".repeat(64)),
            ["must be no more than 63 bytes"]
        );
    }

    #[test]
    fn dns_names() {
        assert!(dns1123_label("team-a").is_empty());
        assert_eq!(dns1123_label("a.b"), vec!["must not contain dots"]);
        assert!(dns1123_label("Team")[0].starts_with("a lowercase RFC 1123 label"));
        assert!(dns1123_label(&"a".repeat(64))[0].starts_with("must be no more than 63"));
        assert!(dns1123_subdomain("payments.config-1").is_empty());
        for bad in ["", "a..b", ".a", "a.", "A", "a_b", "-a"] {
            assert!(!dns1123_subdomain(bad).is_empty(), "{bad:?}");
        }
        assert!(!dns1123_subdomain(&"a".repeat(254)).is_empty());
    }

    #[test]
    fn config_keys() {
        for ok in ["a", "config.alloy", ".hidden", "KEY_NAME", "a..b", "-x"] {
            assert!(config_map_key(ok).is_empty(), "{ok}");
        }
        let cases: &[(&str, &str)] = &[
            ("", "a valid config key"),
            (".", "must not be '.'"),
            ("..", "must not be '..'"),
            ("..x", "must not start with '..'"),
            ("a/b", "a valid config key"),
            ("../../x", "a valid config key"),
            ("a\0b", "a valid config key"),
            ("é", "a valid config key"),
        ];
        for (input, want) in cases {
            let got = config_map_key(input).join("; ");
            assert!(got.contains(want), "{input:?}: {got}");
        }
        assert!(config_map_key(&"a".repeat(254))[0].starts_with("must be no more than 253"));
        assert!(config_map_key(&"a".repeat(253)).is_empty());
    }

    #[test]
    fn go_quoting() {
        assert_eq!(go_quote("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\x01\"");
    }
}
