//! Impersonation headers (`Impersonate-User`, `-Group`, `-Uid`, `-Extra-KEY`): the hub does
//! not act as another user, and says so rather than ignoring them, which would answer a
//! request with a view the client did not ask for. A request that asks is refused as the
//! real apiserver (v1.37, constrained impersonation, KEP-5284) refuses a user that may not
//! impersonate at all: with the error of the first impersonation mode that applies to who
//! it asks to be — `associated-node`, `arbitrary-node`, `serviceaccount`, `user-info`,
//! each a 403 about the request itself with the verb `impersonate-on:MODE:VERB`, else the
//! legacy mode's 403 about the user or service account — with the hub's reason after it;
//! groups, a uid or extras without a user are its 400. Checked against the real
//! apiserver in `tests/real/hostile.rs`.

use std::collections::BTreeMap;

use super::auth::{Attributes, User};
use super::status::{Forbidden, StatusError};
use crate::names::go_quote;

/// Why the hub refuses what it is asked to be.
pub const REASON: &str = "cmpoll serve does not act as another user";

/// The extra key that ties a pod's service-account token to its node.
const NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// Who a request asks to be.
#[derive(Debug, Default)]
struct Wanted<'a> {
    name: &'a str,
    uid: &'a str,
    groups: Vec<&'a str>,
    extra: BTreeMap<String, Vec<&'a str>>,
}

impl Wanted<'_> {
    fn only_name(&self) -> bool {
        self.uid.is_empty() && self.groups.is_empty() && self.extra.is_empty()
    }
}

/// The refusal of a request (`what`, by `requester`) that asks to impersonate, or
/// `None`.
pub fn refused(
    requester: &User,
    headers: &[(String, String)],
    what: &Attributes,
) -> Option<StatusError> {
    let wanted = wanted(headers);
    if wanted.name.is_empty() {
        if wanted.only_name() {
            return None;
        }
        return Some(StatusError::bad_request(format!(
            "requested {} without impersonating a user name",
            go_syntax(&wanted)
        )));
    }
    let node = node_username(wanted.name);
    let account = service_account(wanted.name);
    let mode = match (node, account) {
        (Some(n), _) if wanted.only_name() && associated(requester, n) => "associated-node",
        (Some(_), _) if wanted.only_name() => "arbitrary-node",
        (_, Some(_)) if wanted.only_name() => "serviceaccount",
        (None, None) => "user-info",
        // A node or a service account with more than a name: the legacy mode, which
        // asks about the user (or the service account) first.
        (_, Some((ns, name))) => {
            let about = Forbidden {
                group: "",
                resource: "serviceaccounts",
                subresource: None,
                namespace: Some(ns),
                name: Some(name),
            };
            return Some(StatusError::forbidden_to(
                &requester.name,
                "impersonate",
                &about,
                REASON,
            ));
        }
        (Some(_), None) => {
            let about = Forbidden {
                group: "",
                resource: "users",
                subresource: None,
                namespace: None,
                name: Some(wanted.name),
            };
            return Some(StatusError::forbidden_to(
                &requester.name,
                "impersonate",
                &about,
                REASON,
            ));
        }
    };
    Some(on_request(requester, mode, what))
}

/// The 403 of `impersonate-on:MODE:VERB` about the request itself.
fn on_request(requester: &User, mode: &str, what: &Attributes) -> StatusError {
    match what {
        Attributes::Resource {
            verb,
            kind,
            namespace,
            name,
        } => {
            let about = Forbidden {
                group: "",
                resource: kind.plural(),
                subresource: None,
                namespace: namespace.as_deref(),
                name: name.as_deref(),
            };
            let verb = format!("impersonate-on:{mode}:{verb}");
            StatusError::forbidden_to(&requester.name, &verb, &about, REASON)
        }
        Attributes::Path { verb, path } => {
            let verb = format!("impersonate-on:{mode}:{verb}");
            StatusError::forbidden_path(&requester.name, &verb, path, REASON)
        }
    }
}

/// The impersonation headers, read as the filter reads them.
fn wanted(headers: &[(String, String)]) -> Wanted<'_> {
    let first = |name: &str| {
        (headers.iter())
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map_or("", |(_, v)| v.as_str())
    };
    let mut w = Wanted {
        name: first("Impersonate-User"),
        uid: first("Impersonate-Uid"),
        ..Wanted::default()
    };
    for (n, v) in headers {
        if n.eq_ignore_ascii_case("Impersonate-Group") {
            w.groups.push(v);
        } else if let Some(key) = extra_key(n) {
            w.extra.entry(key).or_default().push(v);
        }
    }
    w
}

/// `system:node:NAME` with a valid node name: NAME.
fn node_username(user: &str) -> Option<&str> {
    let name = user.strip_prefix("system:node:")?;
    crate::names::dns1123_subdomain(name)
        .is_empty()
        .then_some(name)
}

/// `system:serviceaccount:NS:NAME`, split, when both are valid.
fn service_account(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    let valid = crate::names::dns1123_label(ns).is_empty()
        && crate::names::dns1123_subdomain(name).is_empty();
    valid.then_some((ns, name))
}

/// Whether `requester` is a service account whose token is bound to node `node`.
fn associated(requester: &User, node: &str) -> bool {
    service_account(&requester.name).is_some()
        && requester
            .extra
            .get(NODE_NAME)
            .is_some_and(|v| v.len() == 1 && v[0] == node)
}

/// The extra's key of an `Impersonate-Extra-KEY` header (lowercase, %-decoded).
fn extra_key(header: &str) -> Option<String> {
    let lower = header.to_ascii_lowercase();
    let key = lower.strip_prefix("impersonate-extra-")?;
    Some(crate::http::url::form_decoded(key).unwrap_or_else(|_| key.to_string()))
}

/// Go's `%#v` of the `*user.DefaultInfo` the filter built.
fn go_syntax(w: &Wanted<'_>) -> String {
    let strings = |v: &[&str]| {
        let quoted: Vec<String> = v.iter().map(|s| go_quote(s)).collect();
        format!("[]string{{{}}}", quoted.join(", "))
    };
    let groups = match w.groups.as_slice() {
        [] => "[]string(nil)".to_string(),
        g => strings(g),
    };
    let extra = if w.extra.is_empty() {
        "map[string][]string(nil)".to_string()
    } else {
        let pairs: Vec<String> = (w.extra.iter())
            .map(|(k, v)| format!("{}:{}", go_quote(k), strings(v)))
            .collect();
        format!("map[string][]string{{{}}}", pairs.join(", "))
    };
    format!(
        "&user.DefaultInfo{{Name:{}, UID:{}, Groups:{groups}, Extra:{extra}}}",
        go_quote(w.name),
        go_quote(w.uid)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Resource;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        (pairs.iter())
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    fn alice() -> User {
        User {
            name: "alice".into(),
            uid: String::new(),
            groups: Vec::new(),
            extra: BTreeMap::new(),
        }
    }

    fn list() -> Attributes {
        Attributes::Resource {
            verb: "list",
            kind: Resource::ConfigMaps,
            namespace: Some("team-a".into()),
            name: None,
        }
    }

    #[test]
    fn a_request_that_asks_to_be_someone_else_is_refused_in_the_filters_words() {
        let r = |pairs: &[(&str, &str)]| refused(&alice(), &h(pairs), &list());
        assert!(r(&[("Authorization", "Bearer x")]).is_none());
        let e = r(&[("impersonate-user", "bob")]).unwrap();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            format!(
                "configmaps is forbidden: User \"alice\" cannot impersonate-on:user-info:list resource \"configmaps\" in API group \"\" in the namespace \"team-a\": {REASON}"
            )
        );
        let e = r(&[("Impersonate-User", "system:serviceaccount:team-a:reader")]).unwrap();
        assert!(
            e.message
                .contains("cannot impersonate-on:serviceaccount:list resource")
        );
        let e = r(&[("Impersonate-User", "system:node:n1")]).unwrap();
        assert!(
            e.message
                .contains("cannot impersonate-on:arbitrary-node:list resource")
        );
        let e = r(&[
            ("Impersonate-User", "system:serviceaccount:team-a:reader"),
            ("Impersonate-Group", "g"),
        ])
        .unwrap();
        assert!(
            e.message.starts_with("serviceaccounts \"reader\" is forbidden: User \"alice\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"team-a\""),
            "{}",
            e.message
        );
        let e = r(&[("Impersonate-Group", "system:masters")]).unwrap();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "requested &user.DefaultInfo{Name:\"\", UID:\"\", Groups:[]string{\"system:masters\"}, Extra:map[string][]string(nil)} without impersonating a user name"
        );
    }
}
