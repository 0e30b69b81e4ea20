//! HTTP/1.1 for the test apiserver: a thread per connection, keep-alive, TLS with optional
//! client certificates or plain TCP, and responses framed as Go's net/http frames them
//! (Content-Length for small bodies, chunked for large ones), gzip as the apiserver does it,
//! plus the transport faults (reset, cut short, trickle). TCP_NODELAY is set and each
//! response head goes out with the first body bytes, so there are no Nagle stalls.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::WebPkiClientVerifier;
use rustls::{ServerConfig, ServerConnection, StreamOwned};

use crate::pki::{Pki, subject_cn};

/// A parsed request head.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub raw_query: String,
    pub query: Vec<(String, String)>,
    /// Header names are lower-cased.
    pub headers: Vec<(String, String)>,
    /// The subject CN of a verified client certificate.
    pub client_cn: Option<String>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first value of a query parameter, as Go's `url.Values.Get` returns it.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A complete response.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, content_type: &'static str, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body,
        }
    }

    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_string(), v.to_string()));
        self
    }
}

/// What to put on the wire for one request.
pub enum Reply {
    Full(Response),
    /// The head advertises the whole body's Content-Length; half of it is sent, then the
    /// connection closes.
    CutShort(Response),
    /// The connection is reset (RST) without a response.
    Reset,
    /// The body is sent in `chunk`-byte pieces with `pause` between them.
    Trickle(Response, usize, Duration),
}

/// What the connection loop tells the handler about a reply, just before sending it.
pub struct Written {
    pub body_bytes: u64,
    pub gzip: bool,
}

/// The request handler: called once per request, then told what will be written.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: &Request) -> Reply;
    fn sending(&self, req: &Request, reply: &Reply, written: Written);
}

const GZIP_THRESHOLD: usize = 128 * 1024;
const CHUNKED_OVER: usize = 4096;
const MAX_HEAD: u64 = 1 << 20;

/// Builds the TLS config: the server certificate, and client certificates verified against
/// the CA but not required (bearer tokens work without them).
pub fn tls_config(pki: &Pki) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(pki.ca_der()))
        .expect("own CA parses");
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .expect("client verifier");
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pki.server.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("own cert parses");
    let key = PrivateKeyDer::from_pem_slice(pki.server.key_pem.as_bytes()).expect("own key");
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server cert");
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// Accepts connections until `stop` is set (the owner then connects once to wake it).
pub fn serve(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    handler: Arc<dyn Handler>,
    stop: Arc<AtomicBool>,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(tcp) = conn else { continue };
        let (tls, handler) = (tls.clone(), handler.clone());
        let _ = thread::Builder::new()
            .name("apiserver-conn".into())
            .spawn(move || {
                let _ = connection(tcp, tls, handler);
            });
    }
}

fn connection(
    tcp: TcpStream,
    tls: Option<Arc<ServerConfig>>,
    handler: Arc<dyn Handler>,
) -> io::Result<()> {
    tcp.set_nodelay(true)?;
    tcp.set_read_timeout(Some(Duration::from_secs(120)))?;
    let raw = tcp.try_clone()?;
    match tls {
        None => serve_requests(tcp, &raw, None, &*handler),
        Some(cfg) => {
            let mut conn = ServerConnection::new(cfg).map_err(io::Error::other)?;
            let mut sock = tcp;
            while conn.is_handshaking() {
                conn.complete_io(&mut sock)?;
            }
            let cn = conn
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| subject_cn(leaf));
            serve_requests(StreamOwned::new(conn, sock), &raw, cn, &*handler)
        }
    }
}

fn serve_requests<S: Read + Write>(
    stream: S,
    raw: &TcpStream,
    client_cn: Option<String>,
    handler: &dyn Handler,
) -> io::Result<()> {
    let mut reader = BufReader::new(stream);
    loop {
        let Some(mut req) = read_head(&mut reader)? else {
            return Ok(());
        };
        req.client_cn = client_cn.clone();
        let close = req
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let reply = handler.handle(&req);
        let gzip_ok = req.header("accept-encoding").is_some_and(accepts_gzip);
        // The request is logged before its answer goes out, so a client that has the
        // answer always finds the request in the log.
        let keep = write_reply(reader.get_mut(), raw, &reply, gzip_ok, |w| {
            handler.sending(&req, &reply, w)
        })?;
        if close || !keep {
            let _ = raw.shutdown(Shutdown::Both);
            return Ok(());
        }
    }
}

/// The apiserver's rule: only a bare `gzip` token counts (`gzip;q=1` does not).
fn accepts_gzip(v: &str) -> bool {
    v.split(',').any(|t| t.trim() == "gzip")
}

fn read_head<R: BufRead>(r: &mut R) -> io::Result<Option<Request>> {
    let mut limited = r.take(MAX_HEAD);
    let mut line = String::new();
    if limited.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad request line",
        ));
    };
    let (path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    let mut req = Request {
        method: method.to_string(),
        path: percent_decode(path, false),
        raw_query: raw_query.to_string(),
        query: parse_query(raw_query),
        ..Request::default()
    };
    loop {
        let mut h = String::new();
        if limited.read_line(&mut h)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            req.headers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    if let Some(n) = req
        .header("content-length")
        .and_then(|v| v.parse::<u64>().ok())
    {
        io::copy(&mut r.take(n), &mut io::sink())?;
    }
    Ok(Some(req))
}

/// `url.ParseQuery`: `&`-separated `k=v`, percent-decoded, `+` is a space.
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        410 => "Gone",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

fn head(resp: &Response, length: Option<usize>, gzip: bool) -> Vec<u8> {
    let mut h = format!(
        "HTTP/1.1 {} {}\r\nAudit-Id: test-apiserver\r\nCache-Control: no-cache, private\r\nContent-Type: {}\r\nDate: {}\r\n",
        resp.status,
        reason(resp.status),
        resp.content_type,
        httpdate_now()
    );
    for (k, v) in &resp.headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    if gzip {
        h.push_str("Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n");
    }
    match length {
        Some(n) => h.push_str(&format!("Content-Length: {n}\r\n\r\n")),
        None => h.push_str("Transfer-Encoding: chunked\r\n\r\n"),
    }
    h.into_bytes()
}

fn httpdate_now() -> String {
    // RFC 7231 IMF-fixdate, e.g. "Sun, 29 Nov 2026 10:30:00 GMT".
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = secs / 86400;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    let (y, mo, d) = civil_from_days(days as i64);
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(mo - 1) as usize];
    format!("{weekday}, {d:02} {month} {y} {h:02}:{m:02}:{s:02} GMT")
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::new(1),
    );
    enc.write_all(body).expect("vec write");
    enc.finish().expect("vec write")
}

/// Writes `reply`, calling `ready` with what is about to go out just before the first
/// byte; returns whether the connection may be reused.
fn write_reply<W: Write>(
    w: &mut W,
    raw: &TcpStream,
    reply: &Reply,
    gzip_ok: bool,
    ready: impl FnOnce(Written),
) -> io::Result<bool> {
    let plain = |n: usize| Written {
        body_bytes: n as u64,
        gzip: false,
    };
    match reply {
        Reply::Reset => {
            ready(plain(0));
            let _ = socket2::SockRef::from(raw).set_linger(Some(Duration::ZERO));
            let _ = raw.shutdown(Shutdown::Both);
            Ok(false)
        }
        Reply::CutShort(resp) => {
            let half = resp.body.len() / 2;
            let mut out = head(resp, Some(resp.body.len()), false);
            out.extend_from_slice(&resp.body[..half]);
            ready(plain(half));
            w.write_all(&out)?;
            w.flush()?;
            Ok(false)
        }
        Reply::Trickle(resp, chunk, pause) => {
            ready(plain(resp.body.len()));
            w.write_all(&head(resp, Some(resp.body.len()), false))?;
            w.flush()?;
            for piece in resp.body.chunks((*chunk).max(1)) {
                thread::sleep(*pause);
                w.write_all(piece)?;
                w.flush()?;
            }
            Ok(true)
        }
        Reply::Full(resp) => {
            let compress = gzip_ok && resp.body.len() > GZIP_THRESHOLD;
            let zipped;
            let body = if compress {
                zipped = gzip(&resp.body);
                &zipped[..]
            } else {
                &resp.body[..]
            };
            ready(Written {
                body_bytes: body.len() as u64,
                gzip: compress,
            });
            if body.len() <= CHUNKED_OVER && !compress {
                let mut out = head(resp, Some(body.len()), false);
                out.extend_from_slice(body);
                w.write_all(&out)?;
            } else {
                let mut out = head(resp, None, compress);
                for piece in body.chunks(64 * 1024) {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                    w.write_all(&out)?;
                    out.clear();
                }
                w.write_all(b"0\r\n\r\n")?;
            }
            w.flush()?;
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding_is_gos() {
        let q = parse_query("labelSelector=a+in+%28x%2Cy%29%2C%21b&limit=3&x");
        assert_eq!(q[0], ("labelSelector".into(), "a in (x,y),!b".into()));
        assert_eq!(q[1], ("limit".into(), "3".into()));
        assert_eq!(q[2], ("x".into(), "".into()));
        assert_eq!(percent_decode("%2B%zz%", true), "+%zz%");
    }

    #[test]
    fn gzip_needs_a_bare_token() {
        assert!(accepts_gzip("gzip"));
        assert!(accepts_gzip("deflate, gzip"));
        assert!(!accepts_gzip("gzip;q=1.0"));
        assert!(!accepts_gzip("identity"));
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
    }
}
