//! What a request to the hub asks, read as the apiserver reads it: the path (`/api/v1/…
//! configmaps|secrets`, in a namespace or all, one object by name), the query
//! (`labelSelector` and `fieldSelector` with cmpoll's port of apimachinery's parsers,
//! `limit`, `continue`, `resourceVersion`, `resourceVersionMatch`, `watch`), the `Accept`
//! header (a full list or object, or metadata only: `as=PartialObjectMetadataList`) and
//! `Accept-Encoding`; and a follower's `x-cmpoll-wait`. A request it cannot read is a
//! `StatusError` in the apiserver's words.

use std::time::Duration;

use super::auth::Attributes;
pub use super::query::Query;
use super::query::is_path_segment_name;
use super::status::{FieldError, StatusError};
use crate::http::url::form_decoded;
use crate::hub_protocol::{MAX_WAIT, WAIT_HEADER};
use crate::selector::{FieldSelector, LabelSelector};
use crate::source::Resource;

/// Where Alloy's `remotecfg` calls go: grafana's `collector.v1.CollectorService`.
pub const COLLECTOR_SERVICE: &str = "/collector.v1.CollectorService/";

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// The read API: one kind, in a namespace or all, one object or a list.
    Read(Target),
    /// `/api`, `/api/v1`, `/apis`: what clients ask before they list.
    Discovery(Discovery),
    /// `/healthz`, `/livez`, `/readyz`, `/metrics`, `/status`.
    Ops(&'static str),
    /// `hub_protocol::REPORT_PATH`: a follower's report.
    Report,
    /// `/collector.v1.CollectorService/…`: a collector's call (`--remotecfg`; the hub
    /// reads which procedure).
    Remotecfg,
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
    /// A follower's wait (`hub_protocol::WAIT_HEADER`), cut to `MAX_WAIT`: its list is
    /// held, its watch is held with a bookmark at least this often.
    pub wait: Option<Duration>,
    /// What only a watch reads.
    pub watching: Watching,
}

/// A watch's own options: `sendInitialEvents` (the streaming list),
/// `allowWatchBookmarks` and `timeoutSeconds`.
#[derive(Clone, Debug, Default)]
pub struct Watching {
    pub send_initial_events: Option<bool>,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
}

impl Ask {
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
/// authorizer (and its impersonation filter), before anything else of it is read
/// (k8s.io/apiserver `NewRequestInfo`): the legacy `/watch/` path is `watch`, of the
/// object it names if any; a GET that names an object is `get` whatever its query says
/// (`…/NAME?watch=true` included: the apiserver answers it with the object); a GET of a
/// collection is `watch` or `list` by its `watch` parameter, and is about one name when its
/// `fieldSelector` requires `metadata.name=NAME` — unless any list option fails to decode,
/// when it is about no name. Any other path is a path.
pub fn attributes(method: &str, path: &str, query: &Query, route: &Route) -> Attributes {
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
    let by_method = |collection: bool| match method {
        "GET" | "HEAD" => "get",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if collection => "deletecollection",
        "DELETE" => "delete",
        // The apiserver's resolver names no verb for any other method (requestinfo.go:
        // `default: requestInfo.Verb = ""`), and is asked about that.
        _ => "",
    };
    let (verb, name) = match (&target.name, target.watch_path) {
        (name, true) => ("watch", name.clone()),
        (Some(name), false) => (by_method(false), Some(name.clone())),
        (None, false) if matches!(method, "GET" | "HEAD") => {
            let verb = match query.flag("watch") {
                Some(true) => "watch",
                _ => "list",
            };
            let name = decoded_fields(query)
                .and_then(|f| f.exact_name().map(str::to_string))
                .filter(|n| is_path_segment_name(n));
            (verb, name)
        }
        (None, false) => (by_method(true), None),
    };
    Attributes::Resource {
        verb,
        kind: target.kind,
        namespace: target.namespace.clone(),
        name,
    }
}

/// The field selector of a list's options, when every option decodes (the parameter
/// codec's conversions: both selectors' syntax, `limit` and `timeoutSeconds` numbers).
fn decoded_fields(query: &Query) -> Option<FieldSelector> {
    let labels = LabelSelector::parse(query.first("labelSelector").unwrap_or(""));
    let fields = FieldSelector::parse_syntax(query.first("fieldSelector").unwrap_or(""));
    let numbers = query.int("limit").is_ok() && query.int("timeoutSeconds").is_ok();
    match (labels, fields, numbers) {
        (Ok(_), Ok(f), true) => Some(f),
        _ => None,
    }
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
    if a.watching.send_initial_events.is_some() {
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
    if a.watching.send_initial_events.is_some() && rv_match != Some("NotOlderThan") {
        errors.push(forbidden(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if let Some(m) = rv_match {
        if a.watching.send_initial_events.is_none() {
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
    // Exactly this path: the server reads a body only for it (`serve::limits`).
    if path == crate::hub_protocol::REPORT_PATH {
        return Route::Report;
    }
    if path.starts_with(COLLECTOR_SERVICE) {
        return Route::Remotecfg;
    }
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

/// Reads the query and headers of a request for `target`, as the apiserver's handlers do,
/// in their order: the `Accept` header (406), then a GET of one object's options (its
/// `resourceVersion`: selectors and list options mean nothing to a GET), or a list's or
/// watch's (a decode error is 400, an invalid combination 422, a field the kind does not
/// have 400); a request about one name (the legacy `/watch/…/NAME` path, or a list whose
/// `fieldSelector` requires `metadata.name`) joins that name to its field selector, and a
/// field selector that requires another one is 400.
pub fn ask(
    target: Target,
    query: &Query,
    header: &dyn Fn(&str) -> Option<String>,
) -> Result<Ask, StatusError> {
    // One object's metadata for a GET, and for each event of a watch; a list's for a list.
    let get = target.name.is_some() && !target.watch_path;
    let watching = !get && (target.watch_path || query.flag("watch") == Some(true));
    let form = form(header("accept").as_deref().unwrap_or(""), get || watching)?;
    let gzip = (header("accept-encoding").unwrap_or_default().split(',')).any(|e| {
        e.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("gzip")
    });
    let wait = header(WAIT_HEADER)
        .and_then(|w| w.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s).min(MAX_WAIT));
    let mut a = Ask {
        watch: target.watch_path,
        target,
        labels: LabelSelector::default(),
        fields: FieldSelector::default(),
        limit: None,
        continue_token: None,
        resource_version: nonempty(query.first("resourceVersion")),
        exact: false,
        form,
        gzip,
        wait,
        watching: Watching::default(),
    };
    if a.target.name.is_some() && !a.target.watch_path {
        get_options(query)?;
    } else {
        list_options_of(&mut a, query)?;
    }
    if let Some(rv) = &a.resource_version
        && !(rv.bytes().all(|b| b.is_ascii_digit()) && rv.parse::<u64>().is_ok())
    {
        let list = !a.watch && (a.target.name.is_none() || a.target.watch_path);
        return Err(StatusError::invalid_resource_version(rv, list));
    }
    Ok(a)
}

fn nonempty(v: Option<&str>) -> Option<String> {
    v.filter(|v| !v.is_empty()).map(str::to_string)
}

/// A GET's options (`GetResource`): only `resourceVersion`, and the long-gone `export`.
fn get_options(query: &Query) -> Result<(), StatusError> {
    if query.flag("export") == Some(true) {
        return Err(StatusError::bad_request(
            "the export parameter, deprecated since v1.14, is no longer supported",
        ));
    }
    Ok(())
}

/// A list's or watch's options (`listOpts`): decoded, defaulted
/// (`SetListOptionsDefaults`: a watch from no version or `0` is a streaming list),
/// validated, its fields checked, and the request's name joined to them.
fn list_options_of(a: &mut Ask, query: &Query) -> Result<(), StatusError> {
    let labels = query.first("labelSelector").unwrap_or("");
    a.labels = LabelSelector::parse(labels).map_err(StatusError::bad_request)?;
    let fields = query.first("fieldSelector").unwrap_or("");
    let syntax = FieldSelector::parse_syntax(fields).map_err(StatusError::bad_request)?;
    let number = |key| query.int(key).map_err(StatusError::bad_request);
    a.limit = number("limit")?
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| *n > 0);
    // 0: the apiserver's own timeout (30 to 60 minutes); below 0: one already past (the
    // watch ends with what it sends at once).
    a.watching.timeout = number("timeoutSeconds")?.and_then(|n| match n {
        0 => None,
        n => Some(Duration::from_secs(u64::try_from(n).unwrap_or(0))),
    });
    // Options are defaulted and checked by the `watch` parameter alone: the legacy
    // `/watch/` path is a watch (`ListResource`'s forceWatch) whose options are read as a
    // list's, as the apiserver reads them.
    let watch = query.flag("watch") == Some(true);
    a.watch |= watch;
    a.continue_token = nonempty(query.first("continue"));
    a.watching.send_initial_events = query.flag("sendInitialEvents");
    a.watching.bookmarks = query.flag("allowWatchBookmarks") == Some(true);
    let mut rv_match = nonempty(query.first("resourceVersionMatch"));
    let legacy = matches!(a.resource_version.as_deref(), None | Some("0"));
    if watch && a.watching.send_initial_events.is_none() && rv_match.is_none() && legacy {
        a.watching.send_initial_events = Some(true);
        rv_match = Some("NotOlderThan".to_string());
    }
    let errors = if watch {
        watch_options(a, rv_match.as_deref())
    } else {
        list_options(a, rv_match.as_deref())
    };
    if !errors.is_empty() {
        return Err(StatusError::invalid_list_options(&errors));
    }
    // A list with a limit and a version but no match is read at exactly that version,
    // the legacy meaning the apiserver keeps (`resourceVersionMatch` unset, `limit` set).
    let paged_at = a.limit.is_some() && !legacy && a.continue_token.is_none();
    a.exact = rv_match.as_deref() == Some("Exact") || (!watch && rv_match.is_none() && paged_at);
    if !watch && a.continue_token.is_some() && !legacy {
        return Err(StatusError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    a.fields = FieldSelector::parse(fields).map_err(StatusError::bad_request)?;
    // The request's name: the legacy path's, or (not on that path) the one its field
    // selector requires, as the request-info resolver takes it.
    let name = match (&a.target.name, a.target.watch_path) {
        (Some(name), _) => Some(name.clone()),
        (None, false) => (syntax.exact_name())
            .filter(|n| is_path_segment_name(n))
            .map(str::to_string),
        (None, true) => None,
    };
    if let Some(name) = name {
        if a.fields.is_empty() {
            a.fields = FieldSelector::name(&name);
        } else if a.fields.exact_name() != Some(name.as_str()) {
            return Err(StatusError::bad_request(
                "fieldSelector metadata.name doesn't match requested name",
            ));
        }
    }
    Ok(())
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
mod tests;
