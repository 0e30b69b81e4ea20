//! HTTP/1.1 framing for the HTTPS server, as its clients use it (the apiserver's webhook
//! client, kubectl, client-go and the Python client, kubelet probes, Prometheus): request
//! heads parsed by `httparse` (hyper's parser) from whatever bytes have arrived, bodies
//! framed by `Content-Length` only, keep-alive unless the client says `close` (or speaks
//! HTTP/1.0). Every limit is explicit: a head of at most `MAX_HEAD`, a body of at most the
//! server's `max_body`, and all the bodies the server holds at once at most its `Budget`.
//! What breaks a rule gets its status code and the connection closes. A head is parsed
//! apart from its body (`parse_head`), so that the connection decides whether the body is
//! read at all before a byte of it is kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A request head at most.
pub const MAX_HEAD: usize = 16 * 1024;
/// Header fields of one request at most (one more is a 431).
pub const MAX_HEADERS: usize = 64;

/// One request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string, without `?` (empty when there is none).
    pub query: String,
    /// Headers as sent (names as the client wrote them).
    pub headers: Vec<(String, String)>,
    /// Its body: empty when it had none, or when the server did not read it (`Bodies`).
    pub body: Vec<u8>,
    /// The client asked to close after this answer (or spoke HTTP/1.0).
    pub close: bool,
    /// What its body takes of the server's `Budget`, given back when the last copy of the
    /// request is dropped (a worker's, a parked request's).
    pub taken: Taken,
}

impl Request {
    /// The first header called `name` (in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Bytes to send, shared: a list rendered once per poll goes to a thousand followers as
/// one allocation, each connection holding only its place in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Body(std::sync::Arc<[u8]>);

impl Body {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Body {
    /// Where its bytes are: one address for every copy of it (what a connection that
    /// holds it keeps alive is counted once per identity, `server/shares.rs`).
    pub fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

impl std::ops::Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Vec<u8>> for Body {
    fn from(v: Vec<u8>) -> Body {
        Body(v.into())
    }
}

impl From<&[u8]> for Body {
    fn from(v: &[u8]) -> Body {
        Body(v.into())
    }
}

impl From<String> for Body {
    fn from(s: String) -> Body {
        Body(s.into_bytes().into())
    }
}

/// An answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    /// Headers besides Content-Type, Content-Length and Connection.
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
}

impl Answer {
    pub fn text(status: u16, body: impl Into<String>) -> Answer {
        Answer {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.into().into(),
        }
    }

    pub fn json(status: u16, body: impl Into<Body>) -> Answer {
        Answer {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Prometheus's text (`Metrics::render`), as OpenMetrics.
    pub fn metrics(text: String) -> Answer {
        Answer {
            status: 200,
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
            headers: Vec::new(),
            body: text.into(),
        }
    }

    /// With one more header.
    pub fn with(mut self, name: &'static str, value: impl Into<String>) -> Answer {
        self.headers.push((name, value.into()));
        self
    }

    /// The head on the wire, saying whether the connection stays open; the body follows.
    pub fn head(&self, close: bool) -> Vec<u8> {
        self.head_framed(close, Framing::Length(self.body.len()))
    }

    /// The head of a streamed answer (`Transfer-Encoding: chunked`): its body is ignored,
    /// the stream's chunks follow.
    pub fn stream_head(&self, close: bool) -> Vec<u8> {
        self.head_framed(close, Framing::Chunked)
    }

    fn head_framed(&self, close: bool, framing: Framing) -> Vec<u8> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\n",
            self.status,
            reason(self.status),
            self.content_type,
        );
        match framing {
            Framing::Length(n) => head += &format!("Content-Length: {n}\r\n"),
            Framing::Chunked => head += "Transfer-Encoding: chunked\r\n",
        }
        for (name, value) in &self.headers {
            head += &format!("{name}: {value}\r\n");
        }
        head += if close {
            "Connection: close\r\n\r\n"
        } else {
            "Connection: keep-alive\r\n\r\n"
        };
        head.into_bytes()
    }

    /// Head and body, as one piece.
    #[cfg(test)]
    pub fn encode(&self, close: bool) -> Vec<u8> {
        let mut out = self.head(close);
        out.extend_from_slice(&self.body);
        out
    }
}

enum Framing {
    Length(usize),
    Chunked,
}

/// The size line of a chunk of `n` bytes (`n` > 0), as `Transfer-Encoding: chunked`
/// frames it; the chunk's bytes and `CHUNK_END` follow.
pub fn chunk_head(n: usize) -> Vec<u8> {
    format!("{n:x}\r\n").into_bytes()
}

/// What ends each chunk.
pub const CHUNK_END: &[u8] = b"\r\n";
/// The last chunk: a stream's end.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// The reason phrase of a status code (RFC 9110's, as the `http` crate has them).
fn reason(status: u16) -> &'static str {
    (http::StatusCode::from_u16(status).ok())
        .and_then(|s| s.canonical_reason())
        .unwrap_or("")
}

/// What the bytes received so far hold (`parse`).
#[cfg(test)]
#[derive(Debug)]
pub enum Parsed {
    /// Not a whole request yet.
    Partial,
    /// A request, and how many bytes it took (the rest is the next one's).
    Complete(Request, usize),
    /// A request that breaks a rule: answer this, then close.
    Bad(Answer),
}

/// Parses the request at the start of `buf`, whose body may be `max_body` bytes at most
/// (and its head `MAX_HEAD`), body and all.
#[cfg(test)]
pub fn parse(buf: &[u8], max_body: usize) -> Parsed {
    match parse_head(buf, MAX_HEAD, max_body) {
        Head::Partial => Parsed::Partial,
        Head::Bad(a) => Parsed::Bad(a),
        Head::Complete {
            mut req,
            head,
            body,
        } => match buf.get(head..head + body) {
            Some(b) => {
                req.body = b.to_vec();
                Parsed::Complete(req, head + body)
            }
            None => Parsed::Partial,
        },
    }
}

/// What the bytes received so far hold of a request's head.
#[derive(Debug)]
pub enum Head {
    /// Not a whole head yet.
    Partial,
    /// A head (`req`, its body still empty) of `head` bytes, and the length of the body
    /// that follows it.
    Complete {
        req: Request,
        head: usize,
        body: usize,
    },
    /// A request that breaks a rule: answer this, then close.
    Bad(Answer),
}

/// Parses the head at the start of `buf`, of at most `max_head` bytes (`MAX_HEAD` at
/// most), whose body may be `max_body` bytes at most.
pub fn parse_head(buf: &[u8], max_head: usize, max_body: usize) -> Head {
    let max_head = max_head.min(MAX_HEAD);
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Head::Partial,
        Ok(httparse::Status::Partial) => {
            return Head::Bad(Answer::text(431, "request head too large\n"));
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Head::Bad(Answer::text(
                431,
                format!("more than {MAX_HEADERS} header fields\n"),
            ));
        }
        Err(e) => return Head::Bad(Answer::text(400, format!("{e}\n"))),
    };
    if head_len > max_head {
        return Head::Bad(Answer::text(431, "request head too large\n"));
    }
    let mut length: Option<usize> = None;
    let mut close = req.version == Some(0);
    let mut kept = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let value = String::from_utf8_lossy(h.value).into_owned();
        if h.name.eq_ignore_ascii_case("content-length") {
            // RFC 9112 §6.3: 1*DIGIT, and a second one only if it says the same; anything
            // else could frame the bytes after it as another request.
            let n = Some(value.trim())
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<usize>().ok());
            match (n, length) {
                (Some(n), None) => length = Some(n),
                (Some(n), Some(before)) if n == before => {}
                (Some(_), Some(_)) => {
                    return Head::Bad(Answer::text(400, "two different Content-Lengths\n"));
                }
                (None, _) => return Head::Bad(Answer::text(400, "bad Content-Length\n")),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Head::Bad(Answer::text(411, "a body needs Content-Length\n"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            close |= value.eq_ignore_ascii_case("close");
        }
        kept.push((h.name.to_string(), value));
    }
    let length = length.unwrap_or(0);
    if length > max_body {
        return Head::Bad(Answer::text(
            413,
            format!("a body of at most {max_body} bytes\n"),
        ));
    }
    let target = req.path.unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let req = Request {
        method: req.method.unwrap_or("").to_string(),
        path: path.to_string(),
        query: query.to_string(),
        headers: kept,
        body: Vec::new(),
        close,
        taken: Taken::default(),
    };
    Head::Complete {
        req,
        head: head_len,
        body: length,
    }
}

/// What the request bodies a server holds at once may take together: a body is taken as
/// its bytes arrive (`Taken::grow`: a head that announces a body and stalls takes
/// nothing), and its bytes are given back when the last copy of its request is dropped.
#[derive(Clone, Debug)]
pub struct Budget {
    used: Arc<AtomicUsize>,
    cap: usize,
}

/// Two budgets are equal when they are the same one.
impl PartialEq for Budget {
    fn eq(&self, other: &Budget) -> bool {
        Arc::ptr_eq(&self.used, &other.used)
    }
}

impl Eq for Budget {}

impl Budget {
    pub fn new(cap: usize) -> Budget {
        Budget {
            used: Arc::new(AtomicUsize::new(0)),
            cap,
        }
    }

    /// `n` bytes, if that many are left.
    #[cfg(test)]
    pub fn take(&self, n: usize) -> Option<Taken> {
        let mut t = Taken::default();
        t.grow(self, n).then_some(t)
    }

    /// Counts `n` more bytes, if that many are left.
    fn reserve(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::SeqCst);
        loop {
            let Some(after) = used.checked_add(n).filter(|a| *a <= self.cap) else {
                return false;
            };
            match (self.used).compare_exchange(used, after, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    /// What is taken now.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }
}

/// A share of a `Budget`, given back when its last copy is dropped. Two requests are equal
/// whatever they took.
#[derive(Clone, Debug, Default)]
pub struct Taken {
    /// Kept for what its drop does.
    _held: Option<Arc<Held>>,
}

impl Taken {
    /// The bytes it holds.
    pub fn len(&self) -> usize {
        self._held
            .as_ref()
            .map_or(0, |h| h.n.load(Ordering::SeqCst))
    }

    /// Holds `to` bytes of `budget` in all, if that many more are left (a body taken as
    /// it arrives; `to` at most what it holds leaves it as it is).
    pub fn grow(&mut self, budget: &Budget, to: usize) -> bool {
        let more = to.saturating_sub(self.len());
        if more == 0 {
            return true;
        }
        if !budget.reserve(more) {
            return false;
        }
        match &self._held {
            Some(h) => {
                h.n.fetch_add(more, Ordering::SeqCst);
            }
            None => {
                self._held = Some(Arc::new(Held {
                    used: budget.used.clone(),
                    n: AtomicUsize::new(more),
                }));
            }
        }
        true
    }
}

impl PartialEq for Taken {
    fn eq(&self, _: &Taken) -> bool {
        true
    }
}

impl Eq for Taken {}

#[derive(Debug)]
struct Held {
    used: Arc<AtomicUsize>,
    n: AtomicUsize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.used
            .fetch_sub(self.n.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way of cutting the bytes arrives at the same requests.
    #[test]
    fn requests_in_pieces_and_pipelined_on_one_connection() {
        let wire: &[u8] = b"POST /validate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n";
        for cut in 0..wire.len() {
            let mut buf = wire[..cut].to_vec();
            let mut got = Vec::new();
            let mut rest = &wire[cut..];
            loop {
                match parse(&buf, 1024) {
                    Parsed::Complete(r, n) => {
                        buf.drain(..n);
                        got.push(r);
                    }
                    Parsed::Partial if rest.is_empty() => break,
                    Parsed::Partial => {
                        buf.extend_from_slice(rest);
                        rest = &[];
                    }
                    Parsed::Bad(a) => panic!("{cut}: {a:?}"),
                }
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            let (a, b) = (&got[0], &got[1]);
            assert_eq!(
                (a.method.as_str(), a.path.as_str(), a.query.as_str()),
                ("POST", "/validate", "timeout=10s")
            );
            assert_eq!(
                (&a.body[..], a.close, a.header("HOST")),
                (&b"hello"[..], false, Some("x"))
            );
            assert_eq!(
                (b.method.as_str(), b.path.as_str(), b.close),
                ("GET", "/healthz", true)
            );
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn what_is_refused_and_how() {
        let cases: [(&[u8], u16); 9] = [
            // Issue 47.6: differing or malformed lengths smuggle a second request.
            (
                b"GET / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 66\r\n\r\n",
                400,
            ),
            (
                b"GET / HTTP/1.1\r\nContent-Length: 66\r\nContent-Length: 0\r\n\r\n",
                400,
            ),
            (b"GET / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", 400),
            (b"GET / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello", 400),
            (b"GET / HTTP/1.1\r\nContent-Length: \r\n\r\n", 400),
            (b"BAD\x01 / HTTP/1.1\r\n\r\n", 400),
            (
                b"POST /validate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                411,
            ),
            (
                b"POST /validate HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
                413,
            ),
            (b"POST /validate HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
        ];
        for (input, status) in cases {
            match parse(input, 1 << 20) {
                Parsed::Bad(a) => assert_eq!(a.status, status, "{input:?}"),
                other => panic!("{input:?}: {other:?}"),
            }
        }
        let mut big = b"GET /".to_vec();
        big.extend(vec![b'a'; MAX_HEAD + 10]);
        assert!(matches!(parse(&big, 0), Parsed::Bad(a) if a.status == 431));
        // Issue 47.8: one header field too many is a 431 too.
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert!(matches!(parse(many.as_bytes(), 0), Parsed::Bad(a) if a.status == 431));
        let enough: String = (0..MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let enough = format!("GET / HTTP/1.1\r\n{enough}\r\n");
        assert!(matches!(parse(enough.as_bytes(), 0), Parsed::Complete(..)));
        // The same length twice is one length (as Go's net/http reads it).
        let twice = b"POST /v HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nokGET";
        assert!(matches!(parse(twice, 1024), Parsed::Complete(r, 60) if r.body == b"ok"));
        // A body not all there yet.
        let cut = b"POST /v HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
        assert!(matches!(parse(cut, 1024), Parsed::Partial));
        // HTTP/1.0 closes.
        assert!(matches!(parse(b"GET / HTTP/1.0\r\n\r\n", 0), Parsed::Complete(r, _) if r.close));
    }

    /// Bodies take from a budget what they hold, and give it back with the last copy of
    /// their request; what would pass the cap is not taken.
    #[test]
    fn a_budget_is_given_back_by_the_last_copy() {
        let budget = Budget::new(100);
        let a = budget.take(60).unwrap();
        assert!(budget.take(41).is_none(), "past the cap");
        let b = budget.take(40).unwrap();
        assert_eq!((budget.used(), a.len(), b.len()), (100, 60, 40));
        let copy = a.clone();
        drop(a);
        assert_eq!(budget.used(), 100, "a copy still holds it");
        drop(copy);
        assert_eq!(budget.used(), 40);
        assert!(budget.take(usize::MAX).is_none(), "no overflow");
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn answers_say_their_length_and_whether_the_connection_stays() {
        let a = Answer::text(200, "ok\n").with("Retry-After", "1");
        assert_eq!(
            String::from_utf8(a.encode(false)).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 3\r\nRetry-After: 1\r\nConnection: keep-alive\r\n\r\nok\n"
        );
        assert!(
            String::from_utf8(Answer::json(404, b"{}".to_vec()).encode(true))
                .unwrap()
                .contains("404 Not Found\r\n")
        );
    }
}
