//! `--listen ADDR`: `/healthz`, `/readyz`, `/metrics` and (`cmpoll run`) `/status` over a
//! small HTTP/1.1 server.
//!
//! Three fixed GETs need no framework, but the server must stay answerable whatever its
//! clients do: a kubelet that gets no answer from `/healthz` restarts a healthy pod. So it is
//! one thread multiplexing non-blocking sockets with `poll(2)`, never blocked by any one
//! client: each connection has `REQUEST_DEADLINE` from accept to the last byte of the answer
//! (a client that dribbles its request is cut off, not waited for), the request head is
//! capped at 8 KiB, every answer closes the connection, and when `MAX_CONNECTIONS` are open
//! the oldest unfinished one is dropped to make room: a new, well-behaved request (a probe
//! sends its head at once) is always served.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use super::health::Health;
use super::metrics::Metrics;

/// Open connections at most; the oldest unfinished one makes room for a new one.
pub const MAX_CONNECTIONS: usize = 64;
/// From accept to the last byte of the answer.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
const MAX_HEAD: usize = 8 * 1024;

/// `/status`: the answer to a query string.
pub type Status = Arc<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// What the endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub health: Arc<Mutex<Health>>,
    pub metrics: Arc<Mutex<Metrics>>,
    /// `/status`'s JSON for a query string, where the command has one (`cmpoll run`); an
    /// error is a bad query, answered 400.
    pub status: Option<Status>,
}

/// Binds and serves in the background; a bind error is a start-up error.
pub fn start(addr: SocketAddr, endpoints: Endpoints) -> Result<SocketAddr, StartError> {
    let fail = |what: &'static str| move |cause| StartError { addr, what, cause };
    let listener = TcpListener::bind(addr).map_err(fail("cannot listen"))?;
    let bound = listener.local_addr().map_err(fail("cannot listen"))?;
    listener
        .set_nonblocking(true)
        .map_err(fail("cannot listen"))?;
    thread::Builder::new()
        .name("http".into())
        .spawn(move || serve(&listener, &endpoints))
        .map_err(fail("cannot start the server"))?;
    log::info!("serving /healthz, /readyz and /metrics on {bound}");
    Ok(bound)
}

/// Why the endpoints could not start, typed for the caller that decides on it (`cmpoll
/// sidecar` falls back to IPv4 where the pod has no IPv6, and goes on without the
/// endpoints when the port is taken).
#[derive(Debug)]
pub struct StartError {
    pub addr: SocketAddr,
    what: &'static str,
    pub cause: std::io::Error,
}

impl StartError {
    /// The address's family is not there (a pod without IPv6).
    pub fn no_such_family(&self) -> bool {
        use rustix::io::Errno;
        matches!(
            Errno::from_io_error(&self.cause),
            Some(Errno::AFNOSUPPORT | Errno::ADDRNOTAVAIL)
        )
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "--listen {}: {}: {}", self.addr, self.what, self.cause)
    }
}

impl std::error::Error for StartError {}

/// One client connection: reading its head, then writing the answer.
struct Conn {
    stream: TcpStream,
    accepted: Instant,
    head: Vec<u8>,
    /// The answer once the head is read; `sent` bytes of it are out.
    answer: Option<Vec<u8>>,
    sent: usize,
    done: bool,
}

impl Conn {
    fn deadline(&self) -> Instant {
        self.accepted + REQUEST_DEADLINE
    }

    /// Reads what is there; builds the answer once the head is complete (or too large).
    fn readable(&mut self, e: &Endpoints) {
        let mut buf = [0u8; 2048];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    // The client closed before finishing its request.
                    if self.answer.is_none() {
                        self.done = true;
                    }
                    return;
                }
                Ok(n) => {
                    self.head.extend_from_slice(&buf[..n]);
                    if let Some(answer) = answer_for(&self.head, e) {
                        self.answer = Some(answer);
                        return;
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.done = true;
                    return;
                }
            }
        }
    }

    fn writable(&mut self) {
        let Some(answer) = &self.answer else { return };
        while self.sent < answer.len() {
            match self.stream.write(&answer[self.sent..]) {
                Ok(0) => break,
                Ok(n) => self.sent += n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.done = true;
    }
}

fn serve(listener: &TcpListener, endpoints: &Endpoints) {
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        let now = Instant::now();
        let wait = conns
            .iter()
            .map(|c| c.deadline().saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(60));
        let ready: Vec<PollFlags> = {
            let mut fds = Vec::with_capacity(conns.len() + 1);
            fds.push(PollFd::new(listener, PollFlags::IN));
            for c in &conns {
                let want = if c.answer.is_some() {
                    PollFlags::OUT
                } else {
                    PollFlags::IN
                };
                fds.push(PollFd::new(&c.stream, want));
            }
            let timeout = Timespec::try_from(wait).unwrap_or_default();
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) => fds.iter().map(PollFd::revents).collect(),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    log::warn!("--listen: poll failed: {e}; the health server stops");
                    return;
                }
            }
        };
        for (c, flags) in conns.iter_mut().zip(&ready[1..]) {
            if flags.is_empty() {
                continue;
            }
            if c.answer.is_none() {
                c.readable(endpoints);
            }
            if c.answer.is_some() {
                c.writable();
            }
        }
        let now = Instant::now();
        // A connection past its deadline is dropped, answered or not.
        conns.retain(|c| !c.done && now < c.deadline());
        if !ready[0].is_empty() {
            accept_all(listener, &mut conns);
        }
    }
}

/// Accepts every waiting connection, dropping the oldest unfinished ones beyond the cap.
fn accept_all(listener: &TcpListener, conns: &mut Vec<Conn>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                if conns.len() >= MAX_CONNECTIONS {
                    // `conns` is in accept order: the first is the oldest.
                    conns.remove(0);
                }
                conns.push(Conn {
                    stream,
                    accepted: Instant::now(),
                    head: Vec::new(),
                    answer: None,
                    sent: 0,
                    done: false,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // WouldBlock: all taken. Anything else (EMFILE…): try again at the next wake.
            Err(_) => return,
        }
    }
}

fn response(status: &str, content_type: &str, body: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

fn text(status: &str, body: &str) -> Vec<u8> {
    response(status, "text/plain", body)
}

/// The answer to a request head, once it is complete (`None`: read on).
fn answer_for(head: &[u8], e: &Endpoints) -> Option<Vec<u8>> {
    let end = head
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| i + 2)
        .or_else(|| {
            head.windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|i| i + 4)
        });
    let Some(end) = end.filter(|&end| end <= MAX_HEAD) else {
        return (head.len() > MAX_HEAD)
            .then(|| text("431 Request Header Fields Too Large", "request too large\n"));
    };
    let head = String::from_utf8_lossy(&head[..end]);
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Some(text("400 Bad Request", "bad request\n"));
    };
    if !version.starts_with("HTTP/1.") {
        return Some(text("400 Bad Request", "bad request\n"));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let known = matches!(path, "/healthz" | "/readyz" | "/metrics")
        || (path == "/status" && e.status.is_some());
    if !known {
        return Some(text("404 Not Found", "not found\n"));
    }
    if method != "GET" {
        return Some(text("405 Method Not Allowed", "only GET\n"));
    }
    let check = |f: &dyn Fn(&Health) -> Result<(), String>, ok: &str| {
        let verdict = f(&e.health.lock().unwrap_or_else(|p| p.into_inner()));
        match verdict {
            Ok(()) => text("200 OK", ok),
            Err(why) => text("503 Service Unavailable", &format!("{why}\n")),
        }
    };
    Some(match path {
        "/metrics" => {
            let body = e.metrics.lock().unwrap_or_else(|p| p.into_inner()).render();
            response(
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                &body,
            )
        }
        "/status" => match e.status.as_ref().map(|render| render(query)) {
            Some(Ok(json)) => response("200 OK", "application/json", &json),
            Some(Err(why)) => text("400 Bad Request", &format!("{why}\n")),
            None => text("404 Not Found", "not found\n"),
        },
        "/healthz" => check(&|h| h.liveness(Instant::now(), SystemTime::now()), "ok\n"),
        _ => check(&|h| h.readiness(Instant::now()), "ready\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod without IPv6 is told apart from a port already in use, by errno.
    #[test]
    fn a_missing_address_family_is_told_apart_from_a_busy_port() {
        let err = |errno| StartError {
            addr: "[::]:8080".parse().unwrap(),
            what: "cannot listen",
            cause: std::io::Error::from_raw_os_error(errno),
        };
        let (afnosupport, addrnotavail, addrinuse) = (97, 99, 98);
        assert!(err(afnosupport).no_such_family());
        assert!(err(addrnotavail).no_such_family());
        assert!(!err(addrinuse).no_such_family());
        assert!(
            err(addrinuse)
                .to_string()
                .starts_with("--listen [::]:8080: cannot listen: Address already in use"),
            "{}",
            err(addrinuse)
        );
    }
    use crate::ops::health::InFlight;

    fn serve() -> (SocketAddr, Arc<Mutex<Health>>) {
        let health = Arc::new(Mutex::new(Health::new(
            Duration::from_secs(30),
            Duration::from_secs(300),
            Duration::from_secs(10),
            InFlight::default(),
        )));
        let endpoints = Endpoints {
            health: health.clone(),
            metrics: Arc::new(Mutex::new(Metrics::new())),
            status: None,
        };
        (
            start("127.0.0.1:0".parse().unwrap(), endpoints).unwrap(),
            health,
        )
    }

    fn raw(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn endpoints_and_codes() {
        let (addr, health) = serve();
        assert!(raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
        let r = raw(addr, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 503") && r.ends_with("no complete poll yet\n"),
            "{r}"
        );
        {
            let mut h = health.lock().unwrap();
            h.first_batch = true;
            h.last_success = Some(Instant::now());
        }
        assert!(raw(addr, b"GET /readyz?verbose HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
        let m = raw(addr, b"GET /metrics HTTP/1.0\n\n");
        assert!(
            m.contains("application/openmetrics-text") && m.contains("# EOF"),
            "{m}"
        );
        assert!(raw(addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        // Only a command with a ledger serves /status.
        assert!(raw(addr, b"GET /status HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(raw(addr, b"POST /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    }

    #[test]
    fn malformed_and_oversized_requests() {
        let (addr, _) = serve();
        assert!(raw(addr, b"garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(raw(addr, b"GET /healthz SPDY/3\r\n\r\n").starts_with("HTTP/1.1 400"));
        let mut big = b"GET /healthz HTTP/1.1\r\n".to_vec();
        big.extend(
            std::iter::repeat_n(
                b"X-Pad: yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\r\n",
                300,
            )
            .flatten(),
        );
        big.extend_from_slice(b"\r\n");
        assert!(raw(addr, &big).starts_with("HTTP/1.1 431"));
        // A client that never finishes its request is cut off at the deadline.
        let mut stalled = TcpStream::connect(addr).unwrap();
        stalled.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
        stalled
            .set_read_timeout(Some(REQUEST_DEADLINE * 10))
            .unwrap();
        let mut rest = Vec::new();
        let read = stalled.read_to_end(&mut rest);
        assert!(
            matches!(read, Ok(0)) || rest.is_empty(),
            "closed without an answer: {read:?} {rest:?}"
        );
    }

    /// r13: slow clients that hold every slot must not turn a probe away.
    #[test]
    fn slow_clients_never_keep_a_probe_waiting() {
        let (addr, _) = serve();
        // Twice as many dribbling clients as there are slots, each one byte in.
        let slow: Vec<TcpStream> = (0..MAX_CONNECTIONS * 2)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"G").unwrap();
                s
            })
            .collect();
        for _ in 0..5 {
            let r = raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n");
            assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        }
        drop(slow);
    }
}
