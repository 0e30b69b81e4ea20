//! HTTP/1.1 framing for the HTTPS server, as its clients use it (the apiserver's webhook
//! client, kubectl, client-go and the Python client, kubelet probes, Prometheus): request
//! heads parsed by `httparse` (hyper's parser) from whatever bytes have arrived, bodies
//! framed by `Content-Length` only, keep-alive unless the client says `close` (or speaks
//! HTTP/1.0). Every limit is explicit: a head of at most `MAX_HEAD`, a body of at most the
//! server's `max_body`. What breaks a rule gets its status code and the connection closes.

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
    pub body: Vec<u8>,
    /// The client asked to close after this answer (or spoke HTTP/1.0).
    pub close: bool,
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

/// What the bytes received so far hold.
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
/// (and its head `MAX_HEAD`).
#[cfg(test)]
pub fn parse(buf: &[u8], max_body: usize) -> Parsed {
    parse_within(buf, MAX_HEAD, max_body)
}

/// `parse`, with a head of at most `max_head` bytes.
pub fn parse_within(buf: &[u8], max_head: usize, max_body: usize) -> Parsed {
    let max_head = max_head.min(MAX_HEAD);
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Parsed::Partial,
        Ok(httparse::Status::Partial) => {
            return Parsed::Bad(Answer::text(431, "request head too large\n"));
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Parsed::Bad(Answer::text(
                431,
                format!("more than {MAX_HEADERS} header fields\n"),
            ));
        }
        Err(e) => return Parsed::Bad(Answer::text(400, format!("{e}\n"))),
    };
    if head_len > max_head {
        return Parsed::Bad(Answer::text(431, "request head too large\n"));
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
                    return Parsed::Bad(Answer::text(400, "two different Content-Lengths\n"));
                }
                (None, _) => return Parsed::Bad(Answer::text(400, "bad Content-Length\n")),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Parsed::Bad(Answer::text(411, "a body needs Content-Length\n"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            close |= value.eq_ignore_ascii_case("close");
        }
        kept.push((h.name.to_string(), value));
    }
    let length = length.unwrap_or(0);
    if length > max_body {
        return Parsed::Bad(Answer::text(
            413,
            format!("a body of at most {max_body} bytes\n"),
        ));
    }
    if buf.len() < head_len + length {
        return Parsed::Partial;
    }
    let target = req.path.unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let request = Request {
        method: req.method.unwrap_or("").to_string(),
        path: path.to_string(),
        query: query.to_string(),
        headers: kept,
        body: buf[head_len..head_len + length].to_vec(),
        close,
    };
    Parsed::Complete(request, head_len + length)
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
