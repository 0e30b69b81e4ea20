//! Impersonation (kubeconfig `as`, `as-uid`, `as-groups`, `as-user-extra`) as plain data,
//! and the `Impersonate-*` request headers client-go's round tripper sends for it.

use std::collections::BTreeMap;

/// Who to act as: kubeconfig `as`, `as-uid`, `as-groups`, `as-user-extra`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Impersonate {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Impersonate {
    /// The request headers, as client-go's impersonating round tripper sets them.
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut h = vec![("Impersonate-User".to_string(), self.user.clone())];
        if !self.uid.is_empty() {
            h.push(("Impersonate-Uid".into(), self.uid.clone()));
        }
        for g in &self.groups {
            h.push(("Impersonate-Group".into(), g.clone()));
        }
        for (k, values) in &self.extra {
            for v in values {
                h.push((
                    format!("Impersonate-Extra-{}", header_key_escape(k)),
                    v.clone(),
                ));
            }
        }
        h
    }
}

/// client-go's `headerKeyEscape`: a header name keeps legal token characters and
/// percent-encodes the rest.
fn header_key_escape(key: &str) -> String {
    let legal = |b: u8| {
        b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            )
    };
    let mut out = String::new();
    for b in key.bytes() {
        if legal(b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
