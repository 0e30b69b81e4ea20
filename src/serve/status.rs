//! Failures in the apiserver's words (`StatusError`): a `Status` object with its code,
//! reason, message and details, written as the apiserver writes it (field order,
//! `\u003c`-style escapes), so that kubectl, client-go, the Python client and cmpoll read
//! the hub's errors as they read the apiserver's. The texts are apimachinery's
//! (`k8s.io/apimachinery/pkg/api/errors`, the authorization filter's `forbiddenMessage`),
//! checked against the real apiserver in `tests/serve.rs`.

use crate::https::http::{Answer, Body};
use crate::source::Resource;

/// A request the hub answers with a failure `Status` (apimachinery's `StatusError`: a
/// 401, 403, 404, 410, 429, 503…), not to be confused with a rejected module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details`, when the apiserver sends them.
    pub details: Option<Box<Details>>,
    /// `Retry-After` (seconds), also `details.retryAfterSeconds`.
    pub retry_after: Option<u64>,
}

/// What a 403 is about: a resource of a group, in a namespace or at the cluster scope,
/// one object of it or all.
#[derive(Clone, Copy, Debug)]
pub struct Forbidden<'a> {
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// One of a `Status`'s `details.causes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cause {
    /// Empty: left out.
    pub reason: &'static str,
    pub message: String,
    /// Empty: left out.
    pub field: &'static str,
}

/// A field of ListOptions that is wrong, as apimachinery's `field.Error` says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldError {
    Forbidden {
        field: &'static str,
        detail: String,
    },
    NotSupported {
        field: &'static str,
        value: String,
        supported: &'static [&'static str],
    },
}

impl FieldError {
    fn field(&self) -> &'static str {
        match self {
            FieldError::Forbidden { field, .. } | FieldError::NotSupported { field, .. } => field,
        }
    }

    /// Its words without the field (`Forbidden: …`, `Unsupported value: "…": …`).
    fn body(&self) -> String {
        match self {
            FieldError::Forbidden { detail, .. } => format!("Forbidden: {detail}"),
            FieldError::NotSupported {
                value, supported, ..
            } => {
                let quoted: Vec<String> = supported.iter().map(|v| go_quote(v)).collect();
                format!(
                    "Unsupported value: {}: supported values: {}",
                    go_quote(value),
                    quoted.join(", ")
                )
            }
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            FieldError::Forbidden { .. } => "FieldValueForbidden",
            FieldError::NotSupported { .. } => "FieldValueNotSupported",
        }
    }
}

/// A `Status`'s `details`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Details {
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
}

impl StatusError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> StatusError {
        StatusError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    fn about(mut self, kind: Resource, name: Option<&str>) -> StatusError {
        self.details = Some(Box::new(Details {
            name: name.map(str::to_string),
            kind: Some(kind.plural().to_string()),
            ..Details::default()
        }));
        self
    }

    pub fn bad_request(message: impl Into<String>) -> StatusError {
        StatusError::new(400, "BadRequest", message)
    }

    /// A `resourceVersion` that is no version, as the apiserver refuses it: a list's is a
    /// 400 (`invalid resource version: …`), a GET's or a watch's an error the storage
    /// layer gives back unclassified (500, no reason).
    pub fn invalid_resource_version(rv: &str, list: bool) -> StatusError {
        // Go's strconv.ParseUint: digits only, within 64 bits.
        let why = match !rv.is_empty() && rv.bytes().all(|b| b.is_ascii_digit()) {
            true => "value out of range",
            false => "invalid syntax",
        };
        let message = format!(
            "resourceVersion: Invalid value: {}: strconv.ParseUint: parsing {}: {why}",
            go_quote(rv),
            go_quote(rv)
        );
        match list {
            true => StatusError::bad_request(format!("invalid resource version: {message}")),
            false => StatusError::new(500, "", message),
        }
    }

    /// A list's `resourceVersionMatch=Exact` of a version the hub no longer holds, in the
    /// apiserver's words for one etcd compacted.
    pub fn too_old_for_exact() -> StatusError {
        StatusError::new(
            410,
            "Expired",
            "The resourceVersion for the provided list is too old.",
        )
    }

    pub fn unauthorized() -> StatusError {
        StatusError::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 for a resource, as the apiserver's authorization filter words it.
    pub fn forbidden(
        user: &str,
        verb: &str,
        kind: Resource,
        namespace: Option<&str>,
        name: Option<&str>,
        why: &str,
    ) -> StatusError {
        let what = Forbidden {
            group: "",
            resource: kind.plural(),
            subresource: None,
            namespace,
            name,
        };
        StatusError::forbidden_to(user, verb, &what, why)
    }

    /// 403 for `what` in any API group (the impersonation filter's `users`, `uids`,
    /// `userextras/KEY` too): apimachinery's `NewForbidden` of the filter's message.
    pub fn forbidden_to(user: &str, verb: &str, what: &Forbidden<'_>, why: &str) -> StatusError {
        let qualified = match what.group {
            "" => what.resource.to_string(),
            g => format!("{}.{g}", what.resource),
        };
        let subject = match what.name {
            Some(n) => format!("{qualified} {}", go_quote(n)),
            None => qualified,
        };
        let scope = match what.namespace {
            Some(ns) => format!("in the namespace {}", go_quote(ns)),
            None => "at the cluster scope".to_string(),
        };
        let resource = match what.subresource {
            Some(sub) => format!("{}/{sub}", what.resource),
            None => what.resource.to_string(),
        };
        let mut message = format!(
            "{subject} is forbidden: User {} cannot {verb} resource {} in API group {} {scope}",
            go_quote(user),
            go_quote(&resource),
            go_quote(what.group),
        );
        if !why.is_empty() {
            message += &format!(": {why}");
        }
        let mut r = StatusError::new(403, "Forbidden", message);
        r.details = Some(Box::new(Details {
            name: what.name.map(str::to_string),
            group: (!what.group.is_empty()).then(|| what.group.to_string()),
            kind: Some(what.resource.to_string()),
            causes: Vec::new(),
        }));
        r
    }

    /// 403 for a path that is not a resource (`/metrics`, `/status`).
    pub fn forbidden_path(user: &str, verb: &str, path: &str, why: &str) -> StatusError {
        let mut message = format!(
            "forbidden: User {} cannot {verb} path {}",
            go_quote(user),
            go_quote(path)
        );
        if !why.is_empty() {
            message += &format!(": {why}");
        }
        let mut r = StatusError::new(403, "Forbidden", message);
        r.details = Some(Box::default());
        r
    }

    pub fn not_found(kind: Resource, name: &str) -> StatusError {
        StatusError::new(
            404,
            "NotFound",
            format!("{} {} not found", kind.plural(), go_quote(name)),
        )
        .about(kind, Some(name))
    }

    /// A path the hub does not serve.
    pub fn no_such_path() -> StatusError {
        let mut r = StatusError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        r.details = Some(Box::default());
        r
    }

    /// apimachinery's `NewMethodNotSupported`.
    pub fn method_not_supported(kind: Resource, verb: &str) -> StatusError {
        StatusError::new(
            405,
            "MethodNotAllowed",
            format!(
                "{verb} is not supported on resources of kind {}",
                go_quote(kind.plural())
            ),
        )
        .about(kind, None)
    }

    pub fn not_acceptable() -> StatusError {
        StatusError::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json",
        )
    }

    /// apimachinery's `NewInvalid` of ListOptions: the 422 of a query whose options do
    /// not go together.
    pub fn invalid_list_options(errors: &[FieldError]) -> StatusError {
        let words: Vec<String> = (errors.iter())
            .map(|e| format!("{}: {}", e.field(), e.body()))
            .collect();
        let all = match words.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut r = StatusError::new(
            422,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: {all}"),
        );
        r.details = Some(Box::new(Details {
            group: Some("meta.k8s.io".into()),
            kind: Some("ListOptions".into()),
            causes: (errors.iter())
                .map(|e| Cause {
                    reason: e.reason(),
                    message: e.body(),
                    field: e.field(),
                })
                .collect(),
            ..Details::default()
        }));
        r
    }

    pub fn expired(message: impl Into<String>) -> StatusError {
        StatusError::new(410, "Expired", message)
    }

    /// A method the path does not take (a report that is not a POST): the apiserver's
    /// `NewMethodNotSupported` words for a path of its own.
    pub fn method_not_allowed() -> StatusError {
        let mut r = StatusError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        );
        r.details = Some(Box::default());
        r
    }

    pub fn too_many_requests() -> StatusError {
        let mut r = StatusError::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        );
        r.details = Some(Box::default());
        r.retry_after = Some(1);
        r
    }

    /// What a request gets when the hub fails it by a fault of its own (a handler that
    /// panicked), in apimachinery's `NewInternalError` form.
    pub fn internal_error(cause: &'static str) -> StatusError {
        let mut r = StatusError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {cause}"),
        );
        r.details = Some(Box::new(Details {
            causes: vec![Cause {
                message: cause.to_string(),
                ..Cause::default()
            }],
            ..Details::default()
        }));
        r
    }

    pub fn unavailable(message: impl Into<String>, retry_after: u64) -> StatusError {
        let mut r = StatusError::new(503, "ServiceUnavailable", message);
        r.retry_after = Some(retry_after);
        r
    }

    /// The watch cache's answer to a list newer than it has.
    pub fn too_large_resource_version(asked: u64, current: u64) -> StatusError {
        let mut r = StatusError::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {asked}, current: {current}"),
        );
        r.details = Some(Box::new(Details {
            causes: vec![Cause {
                reason: "ResourceVersionTooLarge",
                message: "Too large resource version".into(),
                field: "",
            }],
            ..Details::default()
        }));
        r.retry_after = Some(1);
        r
    }

    /// The `Status` as a watch's `ERROR` event carries it.
    pub fn event(&self) -> Body {
        let status = self.body();
        super::event::frame("ERROR", super::event::trim_newline(&status))
    }

    /// The `Status` object, as the apiserver writes it (no `reason` when it has none).
    pub fn body(&self) -> Vec<u8> {
        let mut out = format!(
            "{{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{{}},\"status\":\"Failure\",\"message\":{}",
            json_string(&self.message),
        );
        if !self.reason.is_empty() {
            out.push_str(&format!(",\"reason\":{}", json_string(self.reason)));
        }
        if let Some(d) = &self.details {
            let mut fields = Vec::new();
            if let Some(n) = &d.name {
                fields.push(format!("\"name\":{}", json_string(n)));
            }
            if let Some(g) = &d.group {
                fields.push(format!("\"group\":{}", json_string(g)));
            }
            if let Some(k) = &d.kind {
                fields.push(format!("\"kind\":{}", json_string(k)));
            }
            if !d.causes.is_empty() {
                let causes: Vec<String> = (d.causes.iter())
                    .map(|c| {
                        let mut f = Vec::new();
                        if !c.reason.is_empty() {
                            f.push(format!("\"reason\":{}", json_string(c.reason)));
                        }
                        f.push(format!("\"message\":{}", json_string(&c.message)));
                        if !c.field.is_empty() {
                            f.push(format!("\"field\":{}", json_string(c.field)));
                        }
                        format!("{{{}}}", f.join(","))
                    })
                    .collect();
                fields.push(format!("\"causes\":[{}]", causes.join(",")));
            }
            if let Some(s) = self.retry_after.filter(|_| self.code != 503) {
                fields.push(format!("\"retryAfterSeconds\":{s}"));
            }
            out += &format!(",\"details\":{{{}}}", fields.join(","));
        }
        out += &format!(",\"code\":{}}}\n", self.code);
        out.into_bytes()
    }

    /// The answer: the `Status`, with `Retry-After` when it has one.
    pub fn answer(&self) -> Answer {
        let a = Answer::json(self.code, self.body());
        match self.retry_after {
            Some(s) => a.with("Retry-After", s.to_string()),
            None => a,
        }
    }
}

/// A JSON string as Go's encoding/json writes it: `<`, `>`, `&`, U+2028 and U+2029
/// escaped.
pub fn json_string(s: &str) -> String {
    let plain = serde_json::Value::String(s.to_string()).to_string();
    if !plain.contains(['<', '>', '&', '\u{2028}', '\u{2029}']) {
        return plain;
    }
    plain
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// Go's `%q` of a string.
fn go_quote(s: &str) -> String {
    crate::names::go_quote(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte for byte what the real apiserver (v1.37.2) sent for the same refusals.
    #[test]
    fn statuses_as_the_apiserver_writes_them() {
        let cases = [
            (
                StatusError::forbidden("alice", "list", Resource::ConfigMaps, None, None, ""),
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps is forbidden: User \"alice\" cannot list resource \"configmaps\" in API group \"\" at the cluster scope","reason":"Forbidden","details":{"kind":"configmaps"},"code":403}"#,
            ),
            (
                StatusError::forbidden(
                    "alice",
                    "get",
                    Resource::ConfigMaps,
                    Some("team-a"),
                    Some("m1"),
                    "",
                ),
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"m1\" is forbidden: User \"alice\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"team-a\"","reason":"Forbidden","details":{"name":"m1","kind":"configmaps"},"code":403}"#,
            ),
            (
                StatusError::unauthorized(),
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#,
            ),
            (
                StatusError::not_found(Resource::ConfigMaps, "nope"),
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"nope\" not found","reason":"NotFound","details":{"name":"nope","kind":"configmaps"},"code":404}"#,
            ),
            (
                StatusError::no_such_path(),
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#,
            ),
            (
                StatusError::too_large_resource_version(99999, 222),
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Timeout: Too large resource version: 99999, current: 222","reason":"Timeout","details":{"causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],"retryAfterSeconds":1},"code":504}"#,
            ),
        ];
        for (r, want) in cases {
            assert_eq!(String::from_utf8(r.body()).unwrap(), format!("{want}\n"));
        }
        assert_eq!(
            json_string("v <&> \"q\" é"),
            r#""v \u003c\u0026\u003e \"q\" é""#
        );
    }
}
