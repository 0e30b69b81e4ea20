//! The API: authentication and authorization, discovery, LIST and GET of ConfigMaps with the
//! cacher's resourceVersion routing (1.28–1.34, see `shared/kube-api/README.md` §1–§3),
//! continue tokens, metadata-only and Table responses, fault injection and the request log.
//! Every error is a real `Status` with the apiserver's reason and message.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::http::{Handler, Reply, Request, Response, Written};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Object, ReadError, Store, go_json};

const JSON: &str = "application/json";

/// Which storage path served a request, as the apiserver's cacher would route it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Route {
    /// Served from the watch cache.
    Cache,
    /// A read that reaches etcd (a consistent read, an exact or paged read).
    Etcd,
    /// Not a storage read (discovery, an error before reading, a fault).
    #[default]
    None,
}

/// One request as the test apiserver saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: Vec<(String, String)>,
    /// The authenticated user, if any.
    pub user: Option<String>,
    /// The bearer token sent, if any (the test server may keep it; cmpoll never logs it).
    pub bearer: Option<String>,
    /// The subject CN of the client certificate presented, if any.
    pub client_cn: Option<String>,
    /// The username of a basic-auth header, if any.
    pub basic_user: Option<String>,
    /// `Impersonate-*` headers, lower-cased names, in the order sent.
    pub impersonate: Vec<(String, String)>,
    pub accept: Option<String>,
    pub accept_encoding: Option<String>,
    pub user_agent: Option<String>,
    pub status: u16,
    /// Body bytes put on the wire (after gzip).
    pub bytes: u64,
    pub gzip: bool,
    pub route: Route,
    /// The fault applied, if one was.
    pub fault: Option<String>,
    pub at: Instant,
}

impl Recorded {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn is_list(&self) -> bool {
        self.path.ends_with("/configmaps") || self.path.ends_with("/secrets")
    }
}

/// What a user may do.
#[derive(Clone, Debug)]
pub struct Grant {
    pub list: bool,
    pub get: bool,
    /// `None`: every namespace and the cluster scope; `Some`: only these namespaces.
    pub namespaces: Option<BTreeSet<String>>,
    /// The resources it covers (`configmaps` unless told).
    pub resources: BTreeSet<String>,
}

impl Grant {
    pub fn all() -> Grant {
        Grant {
            list: true,
            get: true,
            namespaces: None,
            resources: BTreeSet::from(["configmaps".to_string()]),
        }
    }

    pub fn namespaces(list: &[&str]) -> Grant {
        Grant {
            namespaces: Some(list.iter().map(|s| s.to_string()).collect()),
            ..Grant::all()
        }
    }

    pub fn list_only(mut self) -> Grant {
        self.get = false;
        self
    }

    /// Covers these resources instead (`secrets`, or both).
    pub fn resources(mut self, list: &[&str]) -> Grant {
        self.resources = list.iter().map(|s| s.to_string()).collect();
        self
    }

    fn allows(&self, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
        let verb_ok = match verb {
            "list" => self.list,
            "get" => self.get,
            _ => false,
        };
        verb_ok
            && self.resources.contains(resource)
            && match (&self.namespaces, namespace) {
                (None, _) => true,
                (Some(set), Some(ns)) => set.contains(ns),
                (Some(_), None) => false,
            }
    }
}

/// Which requests a fault applies to. Every set field must match.
#[derive(Clone, Debug, Default)]
pub struct Match {
    /// The path starts with this.
    pub path_prefix: Option<String>,
    /// Only LISTs (`Some(true)`) or only single GETs (`Some(false)`).
    pub list: Option<bool>,
    /// Only requests that carry (or do not carry) a `continue` token.
    pub continued: Option<bool>,
    /// Only metadata-only requests (or only full ones).
    pub metadata: Option<bool>,
}

impl Match {
    pub fn any() -> Match {
        Match::default()
    }

    pub fn lists() -> Match {
        Match {
            list: Some(true),
            ..Match::default()
        }
    }

    pub fn gets() -> Match {
        Match {
            list: Some(false),
            ..Match::default()
        }
    }

    pub fn continue_pages() -> Match {
        Match {
            list: Some(true),
            continued: Some(true),
            ..Match::default()
        }
    }

    pub fn path(prefix: &str) -> Match {
        Match {
            path_prefix: Some(prefix.to_string()),
            ..Match::default()
        }
    }

    fn matches(&self, req: &Request) -> bool {
        let is_cm = req.path.contains("/configmaps") || req.path.contains("/secrets");
        let is_list = req.path.ends_with("/configmaps") || req.path.ends_with("/secrets");
        let continued = req.param("continue").is_some_and(|c| !c.is_empty());
        let metadata = req
            .header("accept")
            .is_some_and(|a| a.contains("as=Partial"));
        self.path_prefix
            .as_ref()
            .is_none_or(|p| req.path.starts_with(p.as_str()))
            && self.list.is_none_or(|l| is_cm && l == is_list)
            && self.continued.is_none_or(|c| c == continued)
            && self.metadata.is_none_or(|m| m == metadata)
    }
}

/// A fault to inject in place of (or around) the normal answer.
#[derive(Clone, Debug)]
pub enum Fault {
    /// 500 InternalError ("etcdserver: request timed out").
    InternalError,
    /// 500 ServerTimeout: the list could not reach etcd, with `retryAfterSeconds`.
    EtcdUnreachable(u32),
    /// 500 with the plain-text body of a handler panic.
    Panic,
    /// 503 ServiceUnavailable with `Retry-After` (seconds).
    Unavailable(u32),
    /// 504 Timeout, as the apiserver's timeout filter answers.
    GatewayTimeout,
    /// The API Priority and Fairness rejection: plain text 429 with `Retry-After`.
    TooManyRequests(u32),
    /// 429 JSON Status "storage is (re)initializing" with `Retry-After`.
    CacheInitializing(u32),
    /// Any Status: code, reason, message.
    Status(u16, String, String),
    /// Answer normally after this delay.
    Delay(Duration),
    /// Reset the connection without an answer.
    Reset,
    /// Send the head and half of the body, then close.
    CutShort,
    /// Answer 200 with a body that is not JSON.
    NotJson,
    /// Answer normally, but trickle the body: `bytes` every `pause`.
    Trickle { bytes: usize, pause: Duration },
    /// Answer 200 with a valid ConfigMapList holding one object of about this many bytes.
    Huge(usize),
    /// Answer exactly this: status code, extra headers, body (served as JSON). For crafted
    /// and hostile answers: a list without `items`, a `Retry-After` past any clock, another
    /// object than the one asked for.
    Raw {
        code: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
}

impl Fault {
    /// A 200 JSON answer with this body.
    pub fn body(body: &str) -> Fault {
        Fault::Raw {
            code: 200,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        }
    }
}

struct FaultRule {
    when: Match,
    fault: Fault,
    /// Matches left to skip before the fault applies.
    skip: u32,
    /// Times left to apply; `None` until cleared.
    times: Option<u32>,
}

/// Tunables of the apiserver's behaviour.
#[derive(Clone, Debug)]
pub struct Behaviour {
    /// How long a `resourceVersion` newer than the cache waits before 504 (the apiserver
    /// waits up to 3 s).
    pub too_large_wait: Duration,
    /// How long continue tokens live: history is compacted on this period to the revision
    /// seen one period earlier (kube-apiserver's `--etcd-compaction-interval`, 5 min).
    pub compaction_interval: Duration,
    /// Whether requests without credentials are let through as `system:anonymous`.
    pub anonymous: bool,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            too_large_wait: Duration::from_secs(3),
            compaction_interval: Duration::from_secs(300),
            anonymous: false,
        }
    }
}

/// Everything the apiserver knows; tests reach it through `TestApiserver`.
pub struct State {
    pub store: Store,
    /// A frozen watch cache: the cache's revision and objects, while it lags the store.
    pub frozen_cache: Option<(u64, Vec<Arc<Object>>)>,
    pub tokens: HashMap<String, String>,
    pub basic: HashMap<(String, String), String>,
    pub grants: HashMap<String, Grant>,
    faults: Vec<FaultRule>,
    pub log: Vec<Recorded>,
    pub behaviour: Behaviour,
    last_compaction: (Instant, u64),
    pub address: String,
}

impl State {
    pub fn new(behaviour: Behaviour, start_revision: u64) -> State {
        State {
            store: Store::new(start_revision),
            frozen_cache: None,
            tokens: HashMap::new(),
            basic: HashMap::new(),
            grants: HashMap::new(),
            faults: Vec::new(),
            log: Vec::new(),
            behaviour,
            last_compaction: (Instant::now(), 0),
            address: String::new(),
        }
    }

    pub fn add_fault(&mut self, when: Match, fault: Fault, skip: u32, times: Option<u32>) {
        self.faults.push(FaultRule {
            when,
            fault,
            skip,
            times,
        });
    }

    pub fn clear_faults(&mut self) {
        self.faults.clear();
    }

    fn take_fault(&mut self, req: &Request) -> Option<Fault> {
        let rule = self
            .faults
            .iter_mut()
            .find(|r| r.times != Some(0) && r.when.matches(req))?;
        if rule.skip > 0 {
            rule.skip -= 1;
            return None;
        }
        if let Some(t) = rule.times.as_mut() {
            *t -= 1;
        }
        Some(rule.fault.clone())
    }

    /// Compacts on the configured period, to the revision of the previous period.
    fn maybe_compact(&mut self) {
        let (at, rev) = self.last_compaction;
        if at.elapsed() >= self.behaviour.compaction_interval {
            self.store.compact(rev);
            self.last_compaction = (Instant::now(), self.store.revision());
        }
    }

    /// Makes every continue token issued so far expire, as a compaction after a write does.
    pub fn expire_continue_tokens(&mut self) {
        self.store.bump();
        let rev = self.store.revision();
        self.store.compact(rev);
        self.last_compaction = (Instant::now(), rev);
    }

    fn cache_revision(&self) -> u64 {
        self.frozen_cache
            .as_ref()
            .map_or(self.store.revision(), |(rev, _)| *rev)
    }
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusBody<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    kind: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    api_version: &'a str,
    metadata: Value,
    status: &'a str,
    message: &'a str,
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    code: u16,
}

/// `StatusDetails`, fields in Go's order.
#[derive(serde::Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Details {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
}

/// `StatusCause`, fields in Go's order.
#[derive(serde::Serialize)]
pub struct Cause {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl Details {
    fn kind(kind: &str) -> Details {
        Details {
            kind: Some(kind.into()),
            ..Details::default()
        }
    }

    fn named(name: &str, resource: &str) -> Details {
        Details {
            name: Some(name.into()),
            kind: Some(resource.into()),
            ..Details::default()
        }
    }

    fn retry(secs: u32) -> Details {
        Details {
            retry_after_seconds: Some(secs),
            ..Details::default()
        }
    }

    fn cause(mut self, reason: Option<&str>, message: &str, field: Option<&str>) -> Details {
        self.causes.push(Cause {
            reason: reason.map(str::to_string),
            message: message.into(),
            field: field.map(str::to_string),
        });
        self
    }
}

/// Builds a `Status` body, fields in the apiserver's order.
pub fn status_json(code: u16, reason: &str, message: &str, details: Option<Details>) -> Vec<u8> {
    status_with_meta(code, reason, message, details, json!({}))
}

fn status_with_meta(
    code: u16,
    reason: &str,
    message: &str,
    details: Option<Details>,
    metadata: Value,
) -> Vec<u8> {
    go_json(
        serde_json::to_vec(&StatusBody {
            kind: "Status",
            api_version: "v1",
            metadata,
            status: "Failure",
            message,
            reason,
            details,
            code,
        })
        .expect("JSON of a plain value"),
    )
}

/// An error answer: a `Status` response plus any extra headers.
struct ApiError(Response);

fn status(code: u16, reason: &str, message: &str, details: Option<Details>) -> ApiError {
    ApiError(Response::new(
        code,
        JSON,
        status_json(code, reason, message, details),
    ))
}

fn bad_request(message: &str) -> ApiError {
    status(400, "BadRequest", message, None)
}

/// The representation the client negotiated with `Accept`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Want {
    Plain,
    PartialList,
    Partial,
    Table,
}

fn negotiate(accept: Option<&str>) -> Option<Want> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Want::Plain);
    };
    for clause in accept.split(',') {
        let mut parts = clause.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        if !matches!(media, "application/json" | "*/*" | "application/*") {
            continue;
        }
        let params: HashMap<&str, &str> = parts.filter_map(|p| p.split_once('=')).collect();
        let Some(as_) = params.get("as") else {
            return Some(Want::Plain);
        };
        let g = params.get("g").copied().unwrap_or("");
        let v = params.get("v").copied().unwrap_or("");
        if g != "meta.k8s.io" || !matches!(v, "v1" | "v1beta1") {
            continue;
        }
        match *as_ {
            "PartialObjectMetadataList" => return Some(Want::PartialList),
            "PartialObjectMetadata" => return Some(Want::Partial),
            "Table" => return Some(Want::Table),
            _ => continue,
        }
    }
    None
}

/// A decoded continue token.
struct Continue {
    rv: i64,
    start: String,
}

/// A token to go on from the store key `start` (`resource/ns/name\0`); like the
/// apiserver's, it holds the key below the resource's prefix (`ns/name\0`).
fn encode_continue(rv: i64, start: &str) -> String {
    let start = start.split_once('/').map_or(start, |(_, rest)| rest);
    // Field order as Go's continueToken struct encodes it: v, rv, start.
    let start = serde_json::to_string(start).expect("JSON string");
    let json = format!("{{\"v\":\"meta.k8s.io/v1\",\"rv\":{rv},\"start\":{start}}}");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// The token's revision and start key (as a store key of `resource`).
fn decode_continue(token: &str, resource: &str) -> Result<Continue, String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| format!("continue key is not valid: {e}"))?;
    let v: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("continue key is not valid: {e}"))?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(format!(
            "continue key is not valid: server does not recognize this encoded version {}",
            v["v"].as_str().unwrap_or("")
        ));
    }
    let rv = v["rv"].as_i64().unwrap_or(0);
    if rv == 0 {
        return Err("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into());
    }
    let start = v["start"].as_str().unwrap_or("").to_string();
    if start.is_empty() {
        return Err(
            "continue key is not valid: encoded start key empty (version meta.k8s.io/v1)".into(),
        );
    }
    Ok(Continue {
        rv,
        start: format!("{resource}/{start}"),
    })
}

const EXPIRED_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// 410 for a continue token whose revision was compacted, with a fresh token to go on
/// from the same key at the newest revision (rv -1).
fn expired_continue(start: &str) -> ApiError {
    ApiError(Response::new(
        410,
        JSON,
        status_with_meta(
            410,
            "Expired",
            EXPIRED_CONTINUE,
            None,
            json!({"continue": encode_continue(-1, start)}),
        ),
    ))
}

/// How one LIST is served.
enum Plan {
    /// From the watch cache, which must have reached `at_least`.
    Cache { at_least: u64 },
    /// From etcd as of `rev` (`None`: the newest revision, which must be at least
    /// `at_least`), from `start`, at most `limit` items (0: all).
    Etcd {
        rev: Option<u64>,
        at_least: u64,
        start: String,
        limit: usize,
    },
}

/// The request handler: shared state behind a mutex.
pub struct Api {
    pub state: Arc<Mutex<State>>,
}

impl Api {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn authenticate(
        &self,
        st: &State,
        req: &Request,
    ) -> Result<(Option<String>, Option<String>), ApiError> {
        let unauthorized = || status(401, "Unauthorized", "Unauthorized", None);
        if let Some(auth) = req.header("authorization") {
            if let Some(token) = auth.strip_prefix("Bearer ") {
                let token = token.trim();
                return match st.tokens.get(token) {
                    Some(user) => Ok((Some(user.clone()), Some(token.to_string()))),
                    None => Err(unauthorized()),
                };
            }
            if let Some(b64) = auth.strip_prefix("Basic ") {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(unauthorized)?;
                let (u, p) = decoded.split_once(':').ok_or_else(unauthorized)?;
                return match st.basic.get(&(u.to_string(), p.to_string())) {
                    Some(user) => Ok((Some(user.clone()), None)),
                    None => Err(unauthorized()),
                };
            }
            return Err(unauthorized());
        }
        if let Some(cn) = &req.client_cn {
            return Ok((Some(cn.clone()), None));
        }
        if st.behaviour.anonymous {
            return Ok((Some("system:anonymous".into()), None));
        }
        Err(unauthorized())
    }

    fn authorize(
        st: &State,
        user: &str,
        verb: &str,
        resource: &str,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> Result<(), ApiError> {
        if st
            .grants
            .get(user)
            .is_some_and(|g| g.allows(verb, resource, ns))
        {
            return Ok(());
        }
        let scope = match ns {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let subject = match name {
            Some(n) => format!("{resource} \"{n}\""),
            None => resource.to_string(),
        };
        let details = match name {
            Some(n) => Details::named(n, resource),
            None => Details::kind(resource),
        };
        Err(status(
            403,
            "Forbidden",
            &format!(
                "{subject} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"\" {scope}"
            ),
            Some(details),
        ))
    }

    fn route(&self, req: &Request, log: &mut LogFields) -> Result<Response, ApiError> {
        let segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
        if req.path == "/version" {
            return Ok(json_response(version_json()));
        }
        {
            let st = self.lock();
            let (user, bearer) = self.authenticate(&st, req)?;
            log.user = user;
            log.bearer = bearer;
        }
        let user = log.user.clone().unwrap_or_default();
        match segments.as_slice() {
            ["api"] => return Ok(json_response(self.api_versions())),
            ["apis"] => {
                return Ok(json_response(
                    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
                ));
            }
            ["api", "v1"] => return Ok(json_response(api_resources())),
            _ => {}
        }
        let resource = |r: &str| ["configmaps", "secrets"].into_iter().find(|x| *x == r);
        let (resource, ns, name) = match segments.as_slice() {
            ["api", "v1", r] if resource(r).is_some() => (resource(r), None, None),
            ["api", "v1", "namespaces", ns, r] if resource(r).is_some() => {
                (resource(r), Some(*ns), None)
            }
            ["api", "v1", "namespaces", ns, r, name] if resource(r).is_some() => {
                (resource(r), Some(*ns), Some(*name))
            }
            ["api", ..] => {
                return Err(status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                    Some(Details::default()),
                ));
            }
            _ => {
                return Ok(Response::new(
                    404,
                    "text/plain; charset=utf-8",
                    b"404 page not found\n".to_vec(),
                ));
            }
        };
        if req.method != "GET" {
            return Err(status(
                405,
                "MethodNotAllowed",
                &format!(
                    "the server does not allow this method on the requested resource ({} is read-only in the test apiserver)",
                    req.method
                ),
                None,
            ));
        }
        let want = negotiate(req.header("accept")).ok_or_else(|| {
            status(
                406,
                "NotAcceptable",
                "only the following media types are accepted: application/json",
                None,
            )
        })?;
        let resource = resource.unwrap_or("configmaps");
        match name {
            Some(name) => self.get(req, &user, resource, ns.unwrap_or(""), name, want, log),
            None => self.list(req, &user, resource, ns, want, log),
        }
    }

    fn api_versions(&self) -> Value {
        let address = self.lock().address.clone();
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn get(
        &self,
        req: &Request,
        user: &str,
        resource: &str,
        ns: &str,
        name: &str,
        want: Want,
        log: &mut LogFields,
    ) -> Result<Response, ApiError> {
        let st = self.lock();
        Self::authorize(&st, user, "get", resource, Some(ns), Some(name))?;
        let kind = if resource == "secrets" {
            "Secret"
        } else {
            "ConfigMap"
        };
        match want {
            Want::PartialList => {
                return Err(status(
                    406,
                    "NotAcceptable",
                    &format!(
                        "you requested PartialObjectMetadataList, but the requested object is not a list (*core.{kind})"
                    ),
                    None,
                ));
            }
            Want::Table => {
                return Err(status(
                    406,
                    "NotAcceptable",
                    "the test apiserver serves tables for lists only",
                    None,
                ));
            }
            Want::Plain | Want::Partial => {}
        }
        let key = crate::store::key(resource, ns, name);
        // A GET with a resourceVersion is served from the cache ("not older than"); without
        // one it is a quorum read from etcd.
        let obj = match req.param("resourceVersion").filter(|v| !v.is_empty()) {
            Some(rv) => {
                let n = parse_rv(rv)?;
                if n > st.cache_revision() {
                    return Err(too_large(n, st.cache_revision()));
                }
                log.route = Route::Cache;
                cache_objects(&st, &key)?
                    .into_iter()
                    .find(|o| o.key() == key)
            }
            None => {
                log.route = Route::Etcd;
                st.store
                    .get_at(&key, st.store.revision())
                    .map_err(|e| read_error(e, 0))?
            }
        };
        let obj = obj.ok_or_else(|| {
            status(
                404,
                "NotFound",
                &format!("{resource} \"{name}\" not found"),
                Some(Details::named(name, resource)),
            )
        })?;
        let body = if want == Want::Partial {
            obj.partial_json()
        } else {
            obj.get_json()
        };
        Ok(Response::new(200, JSON, body))
    }

    fn list(
        &self,
        req: &Request,
        user: &str,
        resource: &str,
        ns: Option<&str>,
        want: Want,
        log: &mut LogFields,
    ) -> Result<Response, ApiError> {
        if matches!(req.param("watch"), Some("true" | "1")) {
            return Err(bad_request("watch is not supported by the test apiserver"));
        }
        {
            let st = self.lock();
            Self::authorize(&st, user, "list", resource, ns, None)?;
        }
        if want == Want::Partial {
            return Err(status(
                406,
                "NotAcceptable",
                &format!(
                    "you requested PartialObjectMetadata, but the requested object is a list (*core.{}List)",
                    if resource == "secrets" {
                        "Secret"
                    } else {
                        "ConfigMap"
                    }
                ),
                None,
            ));
        }
        let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
            .map_err(|e| bad_request(&e))?;
        let fields = FieldSelector::parse(req.param("fieldSelector").unwrap_or(""))
            .map_err(|e| bad_request(&e))?;
        let prefix = match ns {
            Some(n) => format!("{resource}/{n}/"),
            None => format!("{resource}/"),
        };
        let plan = plan_list(req, resource, &prefix)?;
        let deadline = Instant::now() + self.lock().behaviour.too_large_wait;
        loop {
            let mut st = self.lock();
            st.maybe_compact();
            match self.read_list(&st, &plan, &prefix, &labels, &fields, log) {
                Err(TooLarge(n)) if Instant::now() < deadline => {
                    let _ = n;
                    drop(st);
                    thread::sleep(Duration::from_millis(5));
                }
                Err(TooLarge(n)) => return Err(too_large(n, st.cache_revision())),
                Ok(page) => return page.map(|p| p.render(want)),
            }
        }
    }

    /// One attempt at a LIST; `Err(TooLarge)` when the cache is behind the requested RV.
    fn read_list(
        &self,
        st: &State,
        plan: &Plan,
        prefix: &str,
        labels: &LabelSelector,
        fields: &FieldSelector,
        log: &mut LogFields,
    ) -> Result<Result<Page, ApiError>, TooLarge> {
        let keep = |o: &Arc<Object>| {
            labels.matches(|k| o.spec.labels.get(k).map(String::as_str))
                && fields.matches(&o.spec.namespace, &o.spec.name)
        };
        match plan {
            Plan::Cache { at_least } if *at_least > st.cache_revision() => Err(TooLarge(*at_least)),
            Plan::Cache { .. } => Ok((|| {
                log.route = Route::Cache;
                let items = cache_objects(st, prefix)?
                    .into_iter()
                    .filter(|o| o.key().starts_with(prefix) && keep(o))
                    .collect();
                Ok(Page {
                    secrets: prefix.starts_with("secrets/"),
                    rv: st.cache_revision(),
                    items,
                    next: None,
                    remaining: None,
                })
            })()),
            Plan::Etcd {
                rev,
                at_least,
                start,
                limit,
            } => {
                let wanted = rev.unwrap_or(*at_least);
                if wanted > st.store.revision() {
                    return Err(TooLarge(wanted));
                }
                log.route = Route::Etcd;
                let rev = rev.unwrap_or(st.store.revision());
                let all = match st.store.range_at(prefix, start, rev) {
                    Ok(all) => all,
                    Err(ReadError::Compacted) if !start.is_empty() => {
                        return Ok(Err(expired_continue(start)));
                    }
                    Err(e) => return Ok(Err(read_error(e, rev))),
                };
                let mut items = Vec::new();
                let mut last = None;
                for (i, o) in all.iter().enumerate() {
                    if *limit > 0 && items.len() >= *limit {
                        break;
                    }
                    last = Some(i);
                    if keep(o) {
                        items.push(o.clone());
                    }
                }
                let examined = last.map_or(0, |i| i + 1);
                let more = *limit > 0 && examined < all.len();
                let next = more.then(|| {
                    let key = all[examined - 1].key();
                    encode_continue(rev as i64, &format!("{key}\0"))
                });
                let unfiltered = labels.requirements().is_empty() && fields.is_empty();
                let remaining = (more && unfiltered).then(|| (all.len() - examined) as u64);
                Ok(Ok(Page {
                    secrets: prefix.starts_with("secrets/"),
                    rv: rev,
                    items,
                    next,
                    remaining,
                }))
            }
        }
    }
}

struct TooLarge(u64);

fn too_large(requested: u64, current: u64) -> ApiError {
    let mut e = status(
        504,
        "Timeout",
        &format!("Timeout: Too large resource version: {requested}, current: {current}"),
        Some(Details::retry(1).cause(
            Some("ResourceVersionTooLarge"),
            "Too large resource version",
            None,
        )),
    );
    e.0 = e.0.header("Retry-After", "1");
    e
}

fn read_error(e: ReadError, rev: u64) -> ApiError {
    match e {
        ReadError::Compacted => status(
            410,
            "Expired",
            "The resourceVersion for the provided list is too old.",
            None,
        ),
        ReadError::Future => too_large(rev, 0),
    }
}

fn cache_objects(st: &State, prefix: &str) -> Result<Vec<Arc<Object>>, ApiError> {
    match &st.frozen_cache {
        Some((_, objs)) => Ok(objs.clone()),
        None => st
            .store
            .range_at(prefix, "", st.store.revision())
            .map_err(|e| read_error(e, 0)),
    }
}

fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse::<u64>().map_err(|_| {
        status(
            400,
            "BadRequest",
            &format!("invalid resource version: strconv.ParseUint: parsing {rv:?}: invalid syntax"),
            None,
        )
    })
}

/// The cacher's routing decision for one LIST (see the module doc).
fn plan_list(req: &Request, resource: &str, prefix: &str) -> Result<Plan, ApiError> {
    let rv = req.param("resourceVersion").filter(|v| !v.is_empty());
    let rvm = req.param("resourceVersionMatch").filter(|v| !v.is_empty());
    let cont = req.param("continue").filter(|v| !v.is_empty());
    let limit = match req.param("limit").filter(|v| !v.is_empty()) {
        Some(l) => l.parse::<i64>().map_err(|_| {
            bad_request(&format!(
                "limit: Invalid value: {l:?}: strconv.ParseInt: parsing {l:?}: invalid syntax"
            ))
        })?,
        None => 0,
    }
    .max(0) as usize;
    let invalid = |msg: &str, reason: &str| {
        status(
            422,
            "Invalid",
            &format!("ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: {msg}"),
            Some(
                Details {
                    group: Some("meta.k8s.io".into()),
                    kind: Some("ListOptions".into()),
                    ..Details::default()
                }
                .cause(Some(reason), msg, Some("resourceVersionMatch")),
            ),
        )
    };
    if let Some(m) = rvm {
        if rv.is_none() {
            return Err(invalid(
                "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                "FieldValueForbidden",
            ));
        }
        if m != "NotOlderThan" && m != "Exact" {
            return Err(invalid(
                &format!("Unsupported value: {m:?}: supported values: \"Exact\", \"NotOlderThan\""),
                "FieldValueNotSupported",
            ));
        }
        if m == "Exact" && rv == Some("0") {
            return Err(invalid(
                "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                "FieldValueForbidden",
            ));
        }
    }
    if let Some(token) = cont {
        if rv.is_some_and(|v| v != "0") {
            return Err(bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let c = decode_continue(token, resource)
            .map_err(|e| bad_request(&format!("invalid continue token: {e}")))?;
        let start = if c.start.as_str() < prefix {
            prefix.to_string()
        } else {
            c.start
        };
        // A token from a 410 carries rv -1: continue as a consistent read.
        let rev = (c.rv > 0).then_some(c.rv as u64);
        return Ok(Plan::Etcd {
            rev,
            at_least: 0,
            start,
            limit,
        });
    }
    let etcd = |rev, at_least| Plan::Etcd {
        rev,
        at_least,
        start: String::new(),
        limit,
    };
    Ok(match rv {
        // resourceVersion=0: the whole list from the cache; limit is ignored.
        Some("0") => Plan::Cache { at_least: 0 },
        Some(v) => {
            let n = parse_rv(v)?;
            match (rvm, limit > 0) {
                // Paged with a resourceVersion: etcd (NotOlderThan reads the newest state).
                (Some("NotOlderThan"), true) => etcd(None, n),
                (_, true) | (Some("Exact"), false) => etcd(Some(n), 0),
                // Not older than N, unpaged: the cache, once it has reached N.
                _ => Plan::Cache { at_least: n },
            }
        }
        // No resourceVersion: a consistent ("most recent") read.
        None => etcd(None, 0),
    })
}

/// One page of a LIST, ready to render.
struct Page {
    /// A SecretList (else a ConfigMapList).
    secrets: bool,
    rv: u64,
    items: Vec<Arc<Object>>,
    next: Option<String>,
    remaining: Option<u64>,
}

impl Page {
    fn list_meta(&self) -> String {
        let mut meta = format!("{{\"resourceVersion\":\"{}\"", self.rv);
        if let Some(next) = &self.next {
            meta.push_str(&format!(",\"continue\":\"{next}\""));
        }
        if let Some(n) = self.remaining {
            meta.push_str(&format!(",\"remainingItemCount\":{n}"));
        }
        meta.push('}');
        meta
    }

    fn render(self, want: Want) -> Response {
        if want == Want::Table {
            return json_response(table(&self));
        }
        let partial = want == Want::PartialList;
        let head: &[u8] = if partial {
            b"{\"kind\":\"PartialObjectMetadataList\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":"
        } else if self.secrets {
            b"{\"kind\":\"SecretList\",\"apiVersion\":\"v1\",\"metadata\":"
        } else {
            b"{\"kind\":\"ConfigMapList\",\"apiVersion\":\"v1\",\"metadata\":"
        };
        let size: usize = self.items.iter().map(|o| o.item_json.len() + 1).sum();
        let mut body = Vec::with_capacity(size + 256);
        body.extend_from_slice(head);
        body.extend_from_slice(self.list_meta().as_bytes());
        if partial && self.items.is_empty() {
            // As the real apiserver writes it (a nil slice through the meta codecs, not
            // the streaming list encoder): `tests/differential.rs` holds it to that.
            body.extend_from_slice(b",\"items\":null}");
            return Response::new(200, JSON, body);
        }
        body.extend_from_slice(b",\"items\":[");
        for (i, o) in self.items.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            if partial {
                body.extend_from_slice(&o.partial_json());
            } else {
                body.extend_from_slice(&o.item_json);
            }
        }
        body.extend_from_slice(b"]}");
        Response::new(200, JSON, body)
    }
}

/// A `meta.k8s.io/v1` Table, as `kubectl get` asks for.
fn table(page: &Page) -> Value {
    let now = SystemTime::now();
    let rows: Vec<Value> = page
        .items
        .iter()
        .map(|o| {
            let age = humantime::parse_rfc3339(&o.creation_timestamp)
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .map_or("<unknown>".to_string(), human_duration);
            let partial: Value = serde_json::from_slice(&o.partial_json()).unwrap_or(Value::Null);
            let data = o.spec.data.len() + o.spec.binary_data.len();
            let cells = match &o.spec.secret {
                Some(kind) => json!([o.spec.name, kind, data, age]),
                None => json!([o.spec.name, data, age]),
            };
            json!({"cells": cells, "object": partial})
        })
        .collect();
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(next) = &page.next {
        meta["continue"] = json!(next);
    }
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
        json!({"name": "Data", "type": "string", "format": "", "description": "Data contains the configuration data.", "priority": 0}),
        json!({"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}),
    ];
    if page.secrets {
        columns.insert(1, json!({"name": "Type", "type": "string", "format": "", "description": "Used to facilitate programmatic handling of secret data.", "priority": 0}));
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// apimachinery's `duration.HumanDuration`, as `kubectl get` shows ages.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        return match secs % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            dy => format!("{}y{dy}d", hours / 24 / 365),
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn json_response(v: Value) -> Response {
    Response::new(
        200,
        JSON,
        serde_json::to_vec(&v).expect("JSON of a plain value"),
    )
}

fn version_json() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "emulationMajor": "1",
        "emulationMinor": "34",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "33",
        "gitVersion": "v1.34.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-08-27T00:00:00Z",
        "goVersion": "go1.24.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn api_resources() -> Value {
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [{
            "name": "configmaps",
            "singularName": "configmap",
            "namespaced": true,
            "kind": "ConfigMap",
            "verbs": ["get", "list"],
            "shortNames": ["cm"],
            "storageVersionHash": "qFsyl6wFWjQ=",
        }, {
            "name": "secrets",
            "singularName": "secret",
            "namespaced": true,
            "kind": "Secret",
            "verbs": ["get", "list"],
            "storageVersionHash": "S6u1pOWzb84=",
        }],
    })
}

/// What the log records about a request while it is handled.
#[derive(Default)]
struct LogFields {
    user: Option<String>,
    bearer: Option<String>,
    route: Route,
    fault: Option<String>,
}

/// The fault's answer, given the answer the request would have had.
fn apply_fault(fault: &Fault, normal: impl FnOnce() -> Response) -> Reply {
    let plain = |code, body: &str| {
        Response::new(code, "text/plain; charset=utf-8", body.as_bytes().to_vec())
    };
    match fault {
        Fault::InternalError => Reply::Full(Response::new(
            500,
            JSON,
            status_json(
                500,
                "InternalError",
                "Internal error occurred: etcdserver: request timed out",
                Some(Details::default().cause(None, "etcdserver: request timed out", None)),
            ),
        )),
        Fault::EtcdUnreachable(secs) => Reply::Full(Response::new(
            500,
            JSON,
            status_json(
                500,
                "ServerTimeout",
                "The list operation against configmaps could not be completed at this time, please try again.",
                Some(Details {
                    name: Some("list".into()),
                    kind: Some("configmaps".into()),
                    retry_after_seconds: Some(*secs),
                    ..Details::default()
                }),
            ),
        )),
        Fault::Panic => Reply::Full(plain(
            500,
            "This request caused apiserver to panic. Look in the logs for details.\n",
        )),
        Fault::Unavailable(secs) => Reply::Full(
            Response::new(
                503,
                JSON,
                status_json(
                    503,
                    "ServiceUnavailable",
                    "the request has been made before all known HTTP paths have been installed, please try again",
                    Some(Details::retry(*secs)),
                ),
            )
            .header("Retry-After", &secs.to_string()),
        ),
        // The timeout filter's body has no kind or apiVersion.
        Fault::GatewayTimeout => Reply::Full(Response::new(
            504,
            JSON,
            serde_json::to_vec(&StatusBody {
                kind: "",
                api_version: "",
                metadata: json!({}),
                status: "Failure",
                message: "Timeout: request did not complete within the allotted timeout",
                reason: "Timeout",
                details: Some(Details::default()),
                code: 504,
            })
            .expect("JSON"),
        )),
        Fault::TooManyRequests(secs) => Reply::Full(
            plain(429, "Too many requests, please try again later.\n")
                .header("Retry-After", &secs.to_string())
                .header("X-Content-Type-Options", "nosniff"),
        ),
        Fault::CacheInitializing(secs) => Reply::Full(
            Response::new(
                429,
                JSON,
                status_json(
                    429,
                    "TooManyRequests",
                    "storage is (re)initializing",
                    Some(Details::retry(*secs)),
                ),
            )
            .header("Retry-After", &secs.to_string()),
        ),
        Fault::Status(code, reason, message) => {
            Reply::Full(Response::new(*code, JSON, status_json(*code, reason, message, None)))
        }
        Fault::Delay(d) => {
            thread::sleep(*d);
            Reply::Full(normal())
        }
        Fault::Reset => Reply::Reset,
        Fault::CutShort => Reply::CutShort(normal()),
        Fault::NotJson => Reply::Full(Response::new(
            200,
            JSON,
            b"<html><body>502 Bad Gateway</body></html>\n".to_vec(),
        )),
        Fault::Trickle { bytes, pause } => Reply::Trickle(normal(), *bytes, *pause),
        Fault::Huge(size) => {
            let mut body = Vec::with_capacity(size + 512);
            body.extend_from_slice(b"{\"kind\":\"ConfigMapList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[{\"metadata\":{\"name\":\"huge\",\"namespace\":\"default\",\"uid\":\"00000000-0000-4000-8000-000000000000\",\"resourceVersion\":\"1\",\"labels\":{\"cmpoll.io/module\":\"true\"}},\"data\":{\"huge\":\"");
            body.resize(body.len() + size, b'x');
            body.extend_from_slice(b"\"}}]}");
            Reply::Full(Response::new(200, JSON, body))
        }
        Fault::Raw {
            code,
            headers,
            body,
        } => {
            let mut r = Response::new(*code, JSON, body.clone());
            for (k, v) in headers {
                r = r.header(k, v);
            }
            Reply::Full(r)
        }
    }
}

impl Handler for Api {
    fn handle(&self, req: &Request) -> Reply {
        let fault = self.lock().take_fault(req);
        let mut log = LogFields::default();
        let mut answer = || match self.route(req, &mut log) {
            Ok(r) => r,
            Err(ApiError(r)) => r,
        };
        let reply = match &fault {
            Some(f) => {
                let r = apply_fault(f, &mut answer);
                log.fault = Some(format!("{f:?}"));
                r
            }
            None => Reply::Full(answer()),
        };
        PENDING.with(|p| *p.borrow_mut() = Some(log));
        reply
    }

    fn sending(&self, req: &Request, reply: &Reply, written: Written) {
        let log = PENDING.with(|p| p.borrow_mut().take()).unwrap_or_default();
        let status = match reply {
            Reply::Full(r) | Reply::CutShort(r) | Reply::Trickle(r, ..) => r.status,
            Reply::Reset => 0,
        };
        let rec = Recorded {
            method: req.method.clone(),
            path: req.path.clone(),
            query: req.query.clone(),
            user: log.user,
            bearer: log.bearer,
            client_cn: req.client_cn.clone(),
            basic_user: req
                .header("authorization")
                .and_then(|a| a.strip_prefix("Basic "))
                .and_then(|b| {
                    base64::engine::general_purpose::STANDARD
                        .decode(b.trim())
                        .ok()
                })
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| s.split_once(':').map(|(u, _)| u.to_string())),
            impersonate: req
                .headers
                .iter()
                .filter(|(k, _)| k.starts_with("impersonate-"))
                .cloned()
                .collect(),
            accept: req.header("accept").map(str::to_string),
            accept_encoding: req.header("accept-encoding").map(str::to_string),
            user_agent: req.header("user-agent").map(str::to_string),
            status,
            bytes: written.body_bytes,
            gzip: written.gzip,
            route: log.route,
            fault: log.fault,
            at: Instant::now(),
        };
        self.lock().log.push(rec);
    }
}

thread_local! {
    /// The log fields of the request this connection thread is answering.
    static PENDING: std::cell::RefCell<Option<LogFields>> = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        assert_eq!(negotiate(None), Some(Want::Plain));
        assert_eq!(negotiate(Some("application/json")), Some(Want::Plain));
        assert_eq!(
            negotiate(Some(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
            )),
            Some(Want::PartialList)
        );
        assert_eq!(
            negotiate(Some(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
            )),
            Some(Want::Plain)
        );
        assert_eq!(
            negotiate(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
            )),
            Some(Want::Table)
        );
        assert_eq!(negotiate(Some("application/yaml")), None);
    }

    #[test]
    fn continue_tokens_round_trip_in_the_apiservers_format() {
        let t = encode_continue(184467302, "configmaps/team-a/payments-config\0");
        assert_eq!(
            t,
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTg0NDY3MzAyLCJzdGFydCI6InRlYW0tYS9wYXltZW50cy1jb25maWdcdTAwMDAifQ",
            "byte-identical to the fixture: the key below the resource's prefix"
        );
        let c = decode_continue(&t, "configmaps").unwrap();
        assert_eq!(
            (c.rv, c.start.as_str()),
            (184467302, "configmaps/team-a/payments-config\0")
        );
        assert!(decode_continue("!!", "configmaps").is_err());
        assert!(decode_continue(&encode_continue(0, "configmaps/a"), "configmaps").is_err());
    }

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (5, "5s"),
            (130, "2m10s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (30 * 3600, "30h"),
            (50 * 3600, "2d2h"),
            (400 * 86400, "400d"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(Duration::from_secs(secs)), want);
        }
    }
}
