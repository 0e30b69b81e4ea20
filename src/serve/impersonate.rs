//! Impersonation headers (`Impersonate-User`, `-Group`, `-Uid`, `-Extra-KEY`): the hub does
//! not act as another user, and says so rather than ignoring them, which would answer a
//! request with a view the client did not ask for. A request that asks is refused as the
//! apiserver's impersonation filter refuses a user that may not impersonate: a 403 about
//! the first thing it asks to be (`users "bob" is forbidden: User "alice" cannot
//! impersonate resource "users" in API group "" at the cluster scope`), with the hub's
//! reason after it; groups, a uid or extras without a user are the filter's 400. The
//! apiserver's own words are checked against the real one in `tests/real/hostile.rs`.

use super::status::{Forbidden, Refusal};

/// Why the hub refuses what it is asked to be.
pub const REASON: &str = "cmpoll serve does not act as another user";

/// The refusal of a request that asks to impersonate, or `None`.
pub fn refused(user: &str, headers: &[(String, String)]) -> Option<Refusal> {
    let named = |name: &'static str| {
        (headers.iter())
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let who = named("Impersonate-User").next().filter(|v| !v.is_empty());
    let groups: Vec<&str> = named("Impersonate-Group").collect();
    let uid = named("Impersonate-Uid").next().filter(|v| !v.is_empty());
    let extra = (headers.iter())
        .filter_map(|(n, v)| Some((extra_key(n)?, v.as_str())))
        .next();
    let Some(who) = who else {
        if groups.is_empty() && uid.is_none() && extra.is_none() {
            return None;
        }
        return Some(Refusal::bad_request(format!(
            "requested {} without impersonating a user",
            requests(&groups, extra, uid)
        )));
    };
    let (namespace, name, resource) = match service_account(who) {
        Some((ns, name)) => (Some(ns), name, "serviceaccounts"),
        None => (None, who, "users"),
    };
    let what = Forbidden {
        group: "",
        resource,
        subresource: None,
        namespace,
        name: Some(name),
    };
    Some(Refusal::forbidden_to(user, "impersonate", &what, REASON))
}

/// `system:serviceaccount:NS:NAME`, split.
fn service_account(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// The extra's key of an `Impersonate-Extra-KEY` header (lowercase, %-decoded).
fn extra_key(header: &str) -> Option<String> {
    let lower = header.to_ascii_lowercase();
    let key = lower.strip_prefix("impersonate-extra-")?;
    Some(crate::http::url::form_decoded(key).unwrap_or_else(|_| key.to_string()))
}

/// What the filter prints of its requests (Go's `%v` of `[]ObjectReference`).
fn requests(groups: &[&str], extra: Option<(String, &str)>, uid: Option<&str>) -> String {
    let mut refs: Vec<String> = groups
        .iter()
        .map(|g| format!("{{Group  {g}    }}"))
        .collect();
    if let Some((key, value)) = extra {
        refs.push(format!(
            "{{UserExtra  {value}  authentication.k8s.io/v1  {key}}}"
        ));
    }
    if let Some(uid) = uid {
        refs.push(format!("{{UID  {uid}  authentication.k8s.io/v1  }}"));
    }
    format!("[{}]", refs.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        (pairs.iter())
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_request_that_asks_to_be_someone_else_is_refused_in_the_filters_words() {
        assert!(refused("alice", &h(&[("Authorization", "Bearer x")])).is_none());
        let r = refused("alice", &h(&[("impersonate-user", "bob")])).unwrap();
        assert_eq!(r.code, 403);
        assert_eq!(
            r.message,
            format!(
                "users \"bob\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope: {REASON}"
            )
        );
        let r = refused(
            "alice",
            &h(&[("Impersonate-User", "system:serviceaccount:team-a:reader")]),
        )
        .unwrap();
        assert!(
            r.message.starts_with("serviceaccounts \"reader\" is forbidden: User \"alice\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"team-a\""),
            "{}",
            r.message
        );
        let r = refused("alice", &h(&[("Impersonate-Group", "system:masters")])).unwrap();
        assert_eq!(r.code, 400);
        assert_eq!(
            r.message,
            "requested [{Group  system:masters    }] without impersonating a user"
        );
    }
}
