//! HTTP/1.1 on one connection, as the webhook needs it: request heads parsed by `httparse`
//! (hyper's parser), bodies by `Content-Length` only, keep-alive as the apiserver's client
//! uses it, and every limit explicit: a head of at most `MAX_HEAD`, a body of at most
//! `MAX_BODY`, `REQUEST_DEADLINE` from a request's first byte to its last, `IDLE` between
//! requests. Anything else gets its status code and the connection closes.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

/// A request head at most.
pub const MAX_HEAD: usize = 16 * 1024;
/// A body at most: an AdmissionReview of a 1 MiB ConfigMap and its old version, as JSON.
pub const MAX_BODY: usize = 16 << 20;
/// From a request's first byte to its last.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// Between two requests of one connection.
pub const IDLE: Duration = Duration::from_secs(60);

/// One request.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
    /// The client asked to close after this answer (or spoke HTTP/1.0).
    pub close: bool,
}

/// An answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn text(status: u16, body: impl Into<String>) -> Answer {
        Answer {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into().into_bytes(),
        }
    }
}

/// Why no request could be read.
#[derive(Debug)]
pub enum Failed {
    /// The connection ended or idled out between requests: nothing to answer.
    Gone,
    /// A bad request: answer this, then close.
    Answer(Answer),
}

/// The connection's bytes read past the last request (a pipelined next one).
#[derive(Default)]
pub struct Conn {
    buf: Vec<u8>,
}

/// What a stream needs: reads and writes, and a read timeout to set.
pub trait Stream: Read + Write {
    fn set_read_timeout(&mut self, t: Duration) -> io::Result<()>;
}

impl Conn {
    /// Reads the next request.
    pub fn read<S: Stream>(&mut self, s: &mut S) -> Result<Request, Failed> {
        let mut started: Option<Instant> = (!self.buf.is_empty()).then(Instant::now);
        let (head_len, method, path, length, close) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&self.buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let mut length: Option<usize> = None;
                    let mut close = req.version == Some(0);
                    for h in req.headers.iter() {
                        let value = String::from_utf8_lossy(h.value);
                        if h.name.eq_ignore_ascii_case("content-length") {
                            length = Some(value.trim().parse().map_err(|_| {
                                Failed::Answer(Answer::text(400, "bad Content-Length\n"))
                            })?);
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            return Err(Failed::Answer(Answer::text(
                                411,
                                "a body needs Content-Length\n",
                            )));
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            close |= value.eq_ignore_ascii_case("close");
                        }
                    }
                    let method = req.method.unwrap_or("").to_string();
                    let path = req.path.unwrap_or("").split('?').next().unwrap_or("");
                    break (n, method, path.to_string(), length.unwrap_or(0), close);
                }
                Ok(httparse::Status::Partial) if self.buf.len() < MAX_HEAD => {}
                Ok(httparse::Status::Partial) => {
                    return Err(Failed::Answer(Answer::text(
                        431,
                        "request head too large\n",
                    )));
                }
                Err(e) => return Err(Failed::Answer(Answer::text(400, format!("{e}\n")))),
            }
            self.fill(s, &mut started)?;
        };
        if length > MAX_BODY {
            return Err(Failed::Answer(Answer::text(
                413,
                format!("a body of at most {MAX_BODY} bytes\n"),
            )));
        }
        while self.buf.len() < head_len + length {
            self.fill(s, &mut started)?;
        }
        let body = self.buf[head_len..head_len + length].to_vec();
        self.buf.drain(..head_len + length);
        Ok(Request {
            method,
            path,
            body,
            close,
        })
    }

    /// Reads more into the buffer, within the deadline that applies.
    fn fill<S: Stream>(&mut self, s: &mut S, started: &mut Option<Instant>) -> Result<(), Failed> {
        let left = match started {
            None => IDLE,
            Some(t) => REQUEST_DEADLINE
                .checked_sub(t.elapsed())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| Failed::Answer(Answer::text(408, "request too slow\n")))?,
        };
        s.set_read_timeout(left).map_err(|_| Failed::Gone)?;
        let mut chunk = [0u8; 16 * 1024];
        match s.read(&mut chunk) {
            Ok(0) => Err(Failed::Gone),
            Ok(n) => {
                started.get_or_insert_with(Instant::now);
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(_) if started.is_none() => Err(Failed::Gone),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(Failed::Answer(Answer::text(408, "request too slow\n")))
            }
            Err(_) => Err(Failed::Gone),
        }
    }
}

/// Writes `a`, saying whether the connection stays open.
pub fn write<S: Write>(s: &mut S, a: &Answer, close: bool) -> io::Result<()> {
    let reason = match a.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        a.status,
        a.content_type,
        a.body.len(),
        if close { "close" } else { "keep-alive" }
    );
    s.write_all(head.as_bytes())?;
    s.write_all(&a.body)?;
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that hands out its input in the given pieces.
    struct Pieces {
        pieces: Vec<Vec<u8>>,
        out: Vec<u8>,
    }

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.pieces.is_empty() {
                return Ok(0);
            }
            let p = &mut self.pieces[0];
            let n = p.len().min(buf.len());
            buf[..n].copy_from_slice(&p[..n]);
            p.drain(..n);
            if p.is_empty() {
                self.pieces.remove(0);
            }
            Ok(n)
        }
    }

    impl Write for Pieces {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.out.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Stream for Pieces {
        fn set_read_timeout(&mut self, _: Duration) -> io::Result<()> {
            Ok(())
        }
    }

    fn stream(pieces: &[&[u8]]) -> Pieces {
        Pieces {
            pieces: pieces.iter().map(|p| p.to_vec()).collect(),
            out: Vec::new(),
        }
    }

    #[test]
    fn requests_in_pieces_and_pipelined_on_one_connection() {
        let mut s = stream(&[
            b"POST /validate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Le",
            b"ngth: 5\r\n\r\nhel",
            b"loGET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
        ]);
        let mut c = Conn::default();
        let r = c.read(&mut s).unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), &r.body[..], r.close),
            ("POST", "/validate", &b"hello"[..], false)
        );
        let r = c.read(&mut s).unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.close),
            ("GET", "/healthz", true)
        );
        assert!(matches!(c.read(&mut s), Err(Failed::Gone)));
    }

    #[test]
    fn what_is_refused_and_how() {
        let cases: [(&[u8], u16); 4] = [
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
            let mut s = stream(&[input]);
            match Conn::default().read(&mut s) {
                Err(Failed::Answer(a)) => assert_eq!(a.status, status, "{input:?}"),
                other => panic!("{input:?}: {other:?}"),
            }
        }
        let big = vec![b'a'; MAX_HEAD + 10];
        let mut s = stream(&[b"GET /", &big]);
        match Conn::default().read(&mut s) {
            Err(Failed::Answer(a)) => assert_eq!(a.status, 431),
            other => panic!("{other:?}"),
        }
        // A body cut short: the connection is gone, nothing to answer.
        let mut s = stream(&[b"POST /v HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"]);
        assert!(matches!(Conn::default().read(&mut s), Err(Failed::Gone)));
    }

    #[test]
    fn answers_say_their_length_and_whether_the_connection_stays() {
        let mut s = stream(&[]);
        write(&mut s, &Answer::text(200, "ok\n"), false).unwrap();
        assert_eq!(
            String::from_utf8(s.out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nok\n"
        );
    }
}
