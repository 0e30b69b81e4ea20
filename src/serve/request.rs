//! What a request to the hub asks, read as the apiserver reads it: the path (`/api/v1/…
//! configmaps|secrets`, in a namespace or all, one object by name), the query
//! (`labelSelector` and `fieldSelector` with cmpoll's port of apimachinery's parsers,
//! `limit`, `continue`, `resourceVersion`, `resourceVersionMatch`, `watch`), the `Accept`
//! header (a full list or object, or metadata only: `as=PartialObjectMetadataList`) and
//! `Accept-Encoding`; and a follower's `x-cmpoll-wait`. A request it cannot read is a
//! `StatusError` in the apiserver's words.

use std::time::Duration;

use super::auth::Attributes;
use super::status::{FieldError, StatusError};
use crate::http::url::form_decoded;
use crate::kube::client::{HOLD_HEADER, WAIT_HEADER};
use crate::selector::{FieldSelector, LabelSelector};
use crate::source::Resource;

/// The longest a follower may be held (`x-cmpoll-wait`); longer asks are cut to it.
pub const MAX_FOLLOWER_WAIT: Duration = Duration::from_secs(300);

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// The read API: one kind, in a namespace or all, one object or a list.
    Read(Target),
    /// `/api`, `/api/v1`, `/apis`: what clients ask before they list.
    Discovery(Discovery),
    /// `/healthz`, `/livez`, `/readyz`, `/metrics`, `/status`.
    Ops(&'static str),
    /// Nothing the hub serves.
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discovery {
    Api,
    ApiV1,
    Apis,
}

/// A kind, in a namespace or all of them, and one object of it or all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub kind: Resource,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// A legacy `/api/v1/watch/…` path.
    pub watch_path: bool,
}

/// What the answer holds: the objects, or their metadata only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    Full,
    Metadata,
}

/// A read of the API, with its query.
#[derive(Clone, Debug)]
pub struct Ask {
    pub target: Target,
    pub watch: bool,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    /// `NotOlderThan` (also what a list with a resourceVersion and no match means) or
    /// `Exact`.
    pub exact: bool,
    pub form: Form,
    pub gzip: bool,
    /// A follower's wait (`x-cmpoll-wait`), cut to `MAX_FOLLOWER_WAIT`.
    pub wait: Option<Duration>,
    /// A follower's watch goes on after each change (`x-cmpoll-hold`, with a wait).
    pub hold: bool,
    /// A watch's `sendInitialEvents` (the streaming list), `allowWatchBookmarks` and
    /// `timeoutSeconds`.
    pub send_initial_events: Option<bool>,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
}

impl Ask {
    /// The verb RBAC knows it by.
    pub fn verb(&self) -> &'static str {
        match (self.watch, &self.target.name) {
            (true, _) => "watch",
            (false, Some(_)) => "get",
            (false, None) => "list",
        }
    }

    /// The resourceVersion a list must not be older than (`None`: any).
    pub fn not_older_than(&self) -> Option<u64> {
        let rv = self.resource_version.as_deref()?;
        if self.exact || rv == "0" {
            return None;
        }
        rv.parse().ok()
    }
}

/// What a request does, as the apiserver's request-info resolver names it for its
/// authorizer (and its impersonation filter), before anything else of it is read: the
/// read API's verb from its method, name and `watch`; any other path as a path.
pub fn attributes(method: &str, path: &str, query: &str, route: &Route) -> Attributes {
    let Route::Read(target) = route else {
        let verb = match method {
            "POST" => "post",
            "PUT" => "put",
            "PATCH" => "patch",
            "DELETE" => "delete",
            "HEAD" => "head",
            _ => "get",
        };
        return Attributes::Path {
            verb,
            path: path.to_string(),
        };
    };
    let watch = target.watch_path
        || form_pairs(query).any(|(k, v)| k == "watch" && matches!(v.as_str(), "true" | "1"));
    let verb = match (method, &target.name) {
        ("GET" | "HEAD", _) if watch => "watch",
        ("GET" | "HEAD", Some(_)) => "get",
        ("GET" | "HEAD", None) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", Some(_)) => "delete",
        ("DELETE", None) => "deletecollection",
        _ => "request",
    };
    Attributes::Resource {
        verb,
        kind: target.kind,
        namespace: target.namespace.clone(),
        name: target.name.clone(),
    }
}

/// A query's pairs, decoded (those that do not decode are left out).
fn form_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    (query.split('&'))
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((form_decoded(k).ok()?, form_decoded(v).ok()?))
        })
}

/// Go's `strconv.ParseBool`, as the apiserver reads its boolean parameters.
fn parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// apimachinery's `ValidateListOptions` for a list.
fn list_options(a: &Ask, rv_match: Option<&str>) -> Vec<FieldError> {
    let forbidden = |field, detail: &str| FieldError::Forbidden {
        field,
        detail: detail.to_string(),
    };
    let mut errors = Vec::new();
    if let Some(m) = rv_match {
        if a.resource_version.is_none() {
            errors.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if a.continue_token.is_some() {
            errors.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if m != "Exact" && m != "NotOlderThan" {
            errors.push(FieldError::NotSupported {
                field: "resourceVersionMatch",
                value: m.to_string(),
                supported: &["Exact", "NotOlderThan", ""],
            });
        }
        if m == "Exact" && a.resource_version.as_deref() == Some("0") {
            errors.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if a.send_initial_events.is_some() {
        errors.push(forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    errors
}

/// apimachinery's `ValidateListOptions` for a watch (the WatchList feature on, as in
/// v1.37).
fn watch_options(a: &Ask, rv_match: Option<&str>) -> Vec<FieldError> {
    let forbidden = |field, detail: &str| FieldError::Forbidden {
        field,
        detail: detail.to_string(),
    };
    let mut errors = Vec::new();
    if a.send_initial_events.is_some() && rv_match != Some("NotOlderThan") {
        errors.push(forbidden(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if let Some(m) = rv_match {
        if a.send_initial_events.is_none() {
            errors.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if m != "NotOlderThan" {
            errors.push(FieldError::NotSupported {
                field: "resourceVersionMatch",
                value: m.to_string(),
                supported: &["NotOlderThan"],
            });
        }
        if a.continue_token.is_some() {
            errors.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
    }
    errors
}

/// Where `path` goes.
pub fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let kind = |s: &str| match s {
        "configmaps" => Some(Resource::ConfigMaps),
        "secrets" => Some(Resource::Secrets),
        _ => None,
    };
    let read = |kind: Resource, namespace: Option<&str>, name: Option<&str>, watch_path| {
        let decode = |s: &str| form_decoded(&s.replace('+', "%2B")).ok();
        let namespace = match namespace.map(decode) {
            Some(None) => return Route::Unknown,
            other => other.flatten(),
        };
        let name = match name.map(decode) {
            Some(None) => return Route::Unknown,
            other => other.flatten(),
        };
        Route::Read(Target {
            kind,
            namespace,
            name,
            watch_path,
        })
    };
    let (watch_path, rest) = match segs.as_slice() {
        ["api", "v1", "watch", rest @ ..] => (true, rest),
        ["api", "v1", rest @ ..] => (false, rest),
        _ => (false, &[][..]),
    };
    match (segs.as_slice(), rest) {
        (["api"], _) => Route::Discovery(Discovery::Api),
        (["api", "v1"], _) => Route::Discovery(Discovery::ApiV1),
        (["apis"], _) => Route::Discovery(Discovery::Apis),
        (["healthz"], _) => Route::Ops("/healthz"),
        (["livez"], _) => Route::Ops("/livez"),
        (["readyz"], _) => Route::Ops("/readyz"),
        (["metrics"], _) => Route::Ops("/metrics"),
        (["status"], _) => Route::Ops("/status"),
        (["api", "v1", ..], [k]) => match kind(k) {
            Some(k) => read(k, None, None, watch_path),
            None => Route::Unknown,
        },
        (["api", "v1", ..], ["namespaces", ns, k]) => match kind(k) {
            Some(k) => read(k, Some(ns), None, watch_path),
            None => Route::Unknown,
        },
        (["api", "v1", ..], ["namespaces", ns, k, name]) => match kind(k) {
            Some(k) => read(k, Some(ns), Some(name), watch_path),
            None => Route::Unknown,
        },
        _ => Route::Unknown,
    }
}

/// Reads the query and headers of a request for `target`.
pub fn ask(
    target: Target,
    query: &str,
    header: &dyn Fn(&str) -> Option<String>,
) -> Result<Ask, StatusError> {
    let mut a = Ask {
        watch: target.watch_path,
        target,
        labels: LabelSelector::default(),
        fields: FieldSelector::default(),
        limit: None,
        continue_token: None,
        resource_version: None,
        exact: false,
        form: Form::Full,
        gzip: false,
        wait: None,
        hold: false,
        send_initial_events: None,
        bookmarks: false,
        timeout: None,
    };
    let mut rv_match: Option<String> = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = form_decoded(value).map_err(StatusError::bad_request)?;
        match key {
            "labelSelector" => {
                a.labels = LabelSelector::parse(&value).map_err(StatusError::bad_request)?;
            }
            "fieldSelector" => {
                a.fields = FieldSelector::parse(&value).map_err(StatusError::bad_request)?;
            }
            "limit" => {
                let n: i64 = value.parse().map_err(|_| {
                    StatusError::bad_request(format!(
                        "limit: Invalid value: \"{value}\": not a number"
                    ))
                })?;
                a.limit = usize::try_from(n).ok().filter(|n| *n > 0);
            }
            "continue" => a.continue_token = Some(value).filter(|v| !v.is_empty()),
            "resourceVersion" => a.resource_version = Some(value).filter(|v| !v.is_empty()),
            "resourceVersionMatch" => rv_match = Some(value).filter(|v| !v.is_empty()),
            "watch" => a.watch |= parse_bool(&value),
            "sendInitialEvents" => a.send_initial_events = Some(parse_bool(&value)),
            "allowWatchBookmarks" => a.bookmarks = parse_bool(&value),
            "timeoutSeconds" => {
                let n: i64 = value.parse().map_err(|_| {
                    StatusError::bad_request(format!(
                        "timeoutSeconds: Invalid value: \"{value}\": not a number"
                    ))
                })?;
                a.timeout = u64::try_from(n)
                    .ok()
                    .filter(|n| *n > 0)
                    .map(Duration::from_secs);
            }
            // Read by the apiserver and harmless here.
            _ => {}
        }
    }
    let errors = if a.watch {
        watch_options(&a, rv_match.as_deref())
    } else {
        list_options(&a, rv_match.as_deref())
    };
    if !errors.is_empty() {
        return Err(StatusError::invalid_list_options(&errors));
    }
    a.exact = rv_match.as_deref() == Some("Exact");
    if let Some(rv) = &a.resource_version
        && rv.parse::<u64>().is_err()
    {
        return Err(StatusError::bad_request(format!(
            "resourceVersion: Invalid value: \"{rv}\": must be a number"
        )));
    }
    a.form = form(
        header("accept").as_deref().unwrap_or(""),
        a.target.name.is_some(),
    )?;
    a.gzip = (header("accept-encoding").unwrap_or_default().split(',')).any(|e| {
        e.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("gzip")
    });
    a.wait = header(WAIT_HEADER)
        .and_then(|w| w.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s).min(MAX_FOLLOWER_WAIT));
    a.hold = a.wait.is_some() && header(HOLD_HEADER).is_some_and(|h| h.trim() == "true");
    Ok(a)
}

/// The first media range in `accept` the hub serves, in the client's order, as the
/// apiserver chooses: JSON, whole or (`as=PartialObjectMetadata[List]`) metadata only.
/// Protobuf and tables are not served; a client that accepts nothing else gets 406.
fn form(accept: &str, one: bool) -> Result<Form, StatusError> {
    if accept.trim().is_empty() {
        return Ok(Form::Full);
    }
    let metadata_kind = if one {
        "PartialObjectMetadata"
    } else {
        "PartialObjectMetadataList"
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let params: Vec<(String, String)> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        if !matches!(media.as_str(), "application/json" | "application/*" | "*/*") {
            continue;
        }
        match param("as") {
            None => return Ok(Form::Full),
            Some(kind)
                if kind == metadata_kind
                    && param("g") == Some("meta.k8s.io")
                    && matches!(param("v"), Some("v1") | None) =>
            {
                return Ok(Form::Metadata);
            }
            Some(_) => {}
        }
    }
    Err(StatusError::not_acceptable())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(kind: Resource, ns: Option<&str>, name: Option<&str>) -> Route {
        Route::Read(Target {
            kind,
            namespace: ns.map(str::to_string),
            name: name.map(str::to_string),
            watch_path: false,
        })
    }

    #[test]
    fn routes() {
        use Resource::*;
        assert_eq!(route("/api/v1/configmaps"), target(ConfigMaps, None, None));
        assert_eq!(
            route("/api/v1/namespaces/team-a/secrets"),
            target(Secrets, Some("team-a"), None)
        );
        assert_eq!(
            route("/api/v1/namespaces/team-a/configmaps/m1"),
            target(ConfigMaps, Some("team-a"), Some("m1"))
        );
        assert!(matches!(
            route("/api/v1/watch/configmaps"),
            Route::Read(Target {
                watch_path: true,
                ..
            })
        ));
        for unknown in [
            "/api/v1/pods",
            "/api/v1/namespaces/a/pods",
            "/api/v1/namespaces/a/configmaps/b/status",
            "/apis/apps/v1/deployments",
            "/",
            "/api/v2/configmaps",
        ] {
            assert_eq!(route(unknown), Route::Unknown, "{unknown}");
        }
        assert_eq!(route("/api"), Route::Discovery(Discovery::Api));
        assert_eq!(route("/api/v1/"), Route::Discovery(Discovery::ApiV1));
        assert_eq!(route("/readyz"), Route::Ops("/readyz"));
    }

    fn ask_of(query: &str, headers: &[(&str, &str)]) -> Result<Ask, StatusError> {
        let Route::Read(t) = route("/api/v1/configmaps") else {
            panic!()
        };
        let headers: Vec<(String, String)> = (headers.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ask(t, query, &|name| {
            (headers.iter())
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn queries_as_the_apiserver_reads_them() {
        let a = ask_of(
            "labelSelector=cmpoll.io%2Fmodule%3Dtrue&limit=2&resourceVersion=12&resourceVersionMatch=NotOlderThan&timeoutSeconds=3",
            &[("Accept-Encoding", "gzip, deflate")],
        )
        .unwrap();
        assert_eq!(a.labels.as_str(), "cmpoll.io/module=true");
        assert_eq!(a.limit, Some(2));
        assert_eq!(a.not_older_than(), Some(12));
        assert!(a.gzip);
        assert_eq!(a.verb(), "list");
        assert_eq!(a.form, Form::Full);
        assert!(ask_of("watch=true", &[]).unwrap().watch);
        assert!(!ask_of("watch=false", &[]).unwrap().watch);
        assert_eq!(
            ask_of("resourceVersion=0", &[]).unwrap().not_older_than(),
            None
        );
        assert_eq!(ask_of("limit=0", &[]).unwrap().limit, None);
        // The apiserver's own words (labels.Parse, the field label check).
        let e = ask_of("labelSelector=a%20b", &[]).unwrap_err();
        assert_eq!(
            e.message,
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(e.code, 400);
        let e = ask_of("fieldSelector=foo%3Dbar", &[]).unwrap_err();
        assert_eq!(
            e.message,
            "\"foo\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
        assert!(ask_of("resourceVersionMatch=Exact", &[]).is_err());
        assert!(ask_of("resourceVersion=x", &[]).is_err());
        let w = ask_of("", &[("X-Cmpoll-Wait", "9999")]).unwrap();
        assert_eq!(w.wait, Some(MAX_FOLLOWER_WAIT));
    }

    #[test]
    fn accept_is_negotiated_in_the_clients_order() {
        let form_of = |accept: &str| ask_of("", &[("Accept", accept)]).map(|a| a.form);
        // cmpoll's own metadata request: protobuf first (not served), then JSON.
        assert_eq!(
            form_of(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
            )
            .unwrap(),
            Form::Metadata
        );
        // kubectl get: tables first (not served), then JSON.
        assert_eq!(
            form_of(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            )
            .unwrap(),
            Form::Full
        );
        assert_eq!(form_of("*/*").unwrap(), Form::Full);
        let e = form_of("application/vnd.kubernetes.protobuf").unwrap_err();
        assert_eq!(e.code, 406);
    }
}
