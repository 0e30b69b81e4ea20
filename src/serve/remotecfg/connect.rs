//! The Connect protocol's unary calls, as connect-go v1.20's server answers them, for the
//! three procedures of `collector.v1.CollectorService`: `POST /collector.v1.CollectorService/
//! NAME` at the root of the hub's port (no path prefix: Alloy's `url` is the hub's address),
//! the binary codec only (`Content-Type: application/proto`; else 415 with `Accept-Post`),
//! requests not compressed (`Content-Encoding` other than `identity`: `unimplemented`),
//! `Connect-Protocol-Version: 1` when sent (else `invalid_argument`), any method but POST a
//! 405 with `Allow: POST` (connect-go would take a GET of `GetConfig`; Alloy never sends
//! one). A success is 200 with `Content-Type: application/proto` exactly (Alloy refuses
//! anything after it) and the message, gzipped when large and accepted; a failure is the
//! JSON `{"code","message"}` with the HTTP status connect-go gives the code.

use crate::https::http::{Answer, Body, Request};
use crate::serve::status::StatusError;

/// A procedure of `collector.v1.CollectorService`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    RegisterCollector,
    GetConfig,
    UnregisterCollector,
}

/// Each procedure's path.
pub const PATHS: [(&str, Rpc); 3] = [
    (
        "/collector.v1.CollectorService/RegisterCollector",
        Rpc::RegisterCollector,
    ),
    ("/collector.v1.CollectorService/GetConfig", Rpc::GetConfig),
    (
        "/collector.v1.CollectorService/UnregisterCollector",
        Rpc::UnregisterCollector,
    ),
];

impl Rpc {
    /// The procedure at `path`, exactly.
    pub fn at(path: &str) -> Option<Rpc> {
        PATHS.iter().find(|(p, _)| *p == path).map(|(_, r)| *r)
    }
}

/// Answers from this size are gzipped for a client that accepts it.
const GZIP_FROM: usize = 16 * 1024;

/// A Connect error: its code's word and HTTP status, and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectError {
    pub code: &'static str,
    pub message: String,
    pub retry_after: Option<u64>,
}

impl ConnectError {
    pub fn new(code: &'static str, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The HTTP status connect-go's server gives `code` (protocol_connect.go).
    fn status(&self) -> u16 {
        match self.code {
            "canceled" => 499,
            "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
            "deadline_exceeded" => 504,
            "not_found" => 404,
            "already_exists" | "aborted" => 409,
            "permission_denied" => 403,
            "resource_exhausted" => 429,
            "unimplemented" => 501,
            "unavailable" => 503,
            "unauthenticated" => 401,
            _ => 500,
        }
    }

    pub fn answer(&self) -> Answer {
        let body = serde_json::json!({"code": self.code, "message": self.message}).to_string();
        let a = Answer::json(self.status(), body);
        match self.retry_after {
            Some(s) => a.with("Retry-After", s.to_string()),
            None => a,
        }
    }
}

impl From<StatusError> for ConnectError {
    /// A refusal in the apiserver's words (the hub's authentication and authorization),
    /// given the Connect code of its HTTP status.
    fn from(s: StatusError) -> ConnectError {
        let code = match s.code {
            400 | 422 => "invalid_argument",
            401 => "unauthenticated",
            403 => "permission_denied",
            404 => "not_found",
            405 => "unimplemented",
            409 => "aborted",
            413 | 429 => "resource_exhausted",
            503 => "unavailable",
            504 => "deadline_exceeded",
            500 => "internal",
            _ => "unknown",
        };
        ConnectError {
            code,
            message: s.message,
            retry_after: s.retry_after,
        }
    }
}

/// Why `req` is not a unary call this server takes, as connect-go says it; `None`: it is.
pub fn refused(req: &Request) -> Option<Answer> {
    if req.method != "POST" {
        let mut a = Answer::text(405, "");
        a.headers.push(("Allow", "POST".into()));
        return Some(a);
    }
    let content_type = req.header("content-type").unwrap_or("").trim();
    if !content_type.eq_ignore_ascii_case("application/proto") {
        let mut a = Answer::text(415, "");
        a.headers.push(("Accept-Post", "application/proto".into()));
        return Some(a);
    }
    if let Some(e) = req.header("content-encoding").map(str::trim)
        && !e.is_empty()
        && !e.eq_ignore_ascii_case("identity")
    {
        let why = format!(
            "unknown compression {}: supported encodings are identity",
            crate::names::go_quote(&crate::reason::cut(e, 32))
        );
        return Some(ConnectError::new("unimplemented", why).answer());
    }
    if let Some(v) = req.header("connect-protocol-version").map(str::trim)
        && v != "1"
    {
        let why = format!(
            "connect-protocol-version must be \"1\": got {}",
            crate::names::go_quote(&crate::reason::cut(v, 32))
        );
        return Some(ConnectError::new("invalid_argument", why).answer());
    }
    None
}

/// A message sent back: 200, `application/proto`; when large and the client accepts it,
/// gzipped (`gzipped` makes it: a composition's is made once).
pub fn message(req: &Request, body: Body, gzipped: impl FnOnce() -> Body) -> Answer {
    let gzip = body.len() >= GZIP_FROM
        && (req.header("accept-encoding").unwrap_or(""))
            .split(',')
            .any(|e| e.split(';').next().unwrap_or("").trim() == "gzip");
    let a = |body: Body| Answer {
        status: 200,
        content_type: "application/proto",
        headers: Vec::new(),
        body,
    };
    match gzip {
        true => a(gzipped()).with("Content-Encoding", "gzip"),
        false => a(body),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn req(method: &str, headers: &[(&str, &str)]) -> Request {
        let mut wire = format!("{method} /collector.v1.CollectorService/GetConfig HTTP/1.1\r\n");
        for (k, v) in headers {
            wire += &format!("{k}: {v}\r\n");
        }
        wire += "\r\n";
        match crate::https::http::parse_head(wire.as_bytes(), 8192, 0) {
            crate::https::http::Head::Complete { req, .. } => req,
            _ => panic!("{wire}"),
        }
    }

    fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
        (a.headers.iter())
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn body(a: &Answer) -> serde_json::Value {
        serde_json::from_slice(&a.body).unwrap()
    }

    #[test]
    fn paths_name_their_procedures_exactly() {
        assert_eq!(
            Rpc::at("/collector.v1.CollectorService/GetConfig"),
            Some(Rpc::GetConfig)
        );
        assert_eq!(Rpc::at("/rc/collector.v1.CollectorService/GetConfig"), None);
        assert_eq!(Rpc::at("/collector.v1.CollectorService/GetConfig/"), None);
        assert_eq!(Rpc::at("/collector.v1.CollectorService/Other"), None);
    }

    /// What Alloy sends is taken; each other shape is refused as connect-go refuses it.
    #[test]
    fn calls_are_checked_as_connect_go_checks_them() {
        let proto = ("Content-Type", "application/proto");
        assert!(refused(&req("POST", &[proto, ("Connect-Protocol-Version", "1")])).is_none());
        assert!(refused(&req("POST", &[proto, ("Content-Encoding", "identity")])).is_none());
        let a = refused(&req("GET", &[proto])).unwrap();
        assert_eq!((a.status, header(&a, "allow")), (405, Some("POST")));
        let a = refused(&req("POST", &[("Content-Type", "application/json")])).unwrap();
        assert_eq!(
            (a.status, header(&a, "accept-post")),
            (415, Some("application/proto"))
        );
        assert_eq!(refused(&req("POST", &[])).unwrap().status, 415);
        let a = refused(&req("POST", &[proto, ("Content-Encoding", "gzip")])).unwrap();
        assert_eq!(a.status, 501);
        assert_eq!(body(&a)["code"], "unimplemented");
        let a = refused(&req("POST", &[proto, ("Connect-Protocol-Version", "2")])).unwrap();
        assert_eq!(
            (a.status, body(&a)["code"].as_str()),
            (400, Some("invalid_argument"))
        );
    }

    #[test]
    fn errors_have_connect_gos_codes_and_statuses() {
        let e = ConnectError::from(StatusError::unauthorized());
        let a = e.answer();
        assert_eq!((a.status, a.content_type), (401, "application/json"));
        assert_eq!(body(&a)["code"], "unauthenticated");
        let a = ConnectError::from(StatusError::unavailable("not ready", 1)).answer();
        assert_eq!((a.status, header(&a, "retry-after")), (503, Some("1")));
        assert_eq!(body(&a)["code"], "unavailable");
        assert_eq!(
            ConnectError::from(StatusError::too_many_requests())
                .answer()
                .status,
            429
        );
        assert_eq!(
            ConnectError::new("permission_denied", "no").answer().status,
            403
        );
        assert_eq!(ConnectError::new("internal", "x").answer().status, 500);
    }

    #[test]
    fn a_message_is_application_proto_exactly() {
        let r = req("POST", &[("Accept-Encoding", "gzip")]);
        let gz = |b: &[u8]| -> Body { crate::serve::render::gzip(b).into() };
        let small = message(&r, vec![1, 2].into(), || unreachable!("small"));
        assert_eq!(
            (small.status, small.content_type),
            (200, "application/proto")
        );
        assert_eq!(header(&small, "content-encoding"), None);
        let large = message(&r, vec![b'a'; GZIP_FROM].into(), || gz(&[b'a'; GZIP_FROM]));
        assert_eq!(header(&large, "content-encoding"), Some("gzip"));
        assert!(large.body.len() < GZIP_FROM);
        let plain = message(&req("POST", &[]), vec![b'a'; GZIP_FROM].into(), || {
            unreachable!("not accepted")
        });
        assert_eq!(header(&plain, "content-encoding"), None);
    }
}
