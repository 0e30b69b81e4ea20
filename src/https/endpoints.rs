//! `--listen ADDR`: `/healthz`, `/readyz`, `/metrics` and (`cmpoll run`) `/status` in
//! plain HTTP, on the binary's one server (`server.rs`).
//!
//! The server must stay answerable whatever its clients do: a kubelet that gets no answer
//! from `/healthz` restarts a healthy pod. So each connection has `REQUEST_DEADLINE` from
//! accept to the last byte of its request (a client that dribbles is cut off, not waited
//! for), the request head is capped at 8 KiB, every answer closes the connection, and when
//! `MAX_CONNECTIONS` are open the oldest unfinished one is dropped to make room: a new,
//! well-behaved request (a probe sends its head at once) is always served.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use super::http::{Answer, Request};
use super::server::{Bodies, Call, Handler, Limits, Peer, Reply, Server, Sizes};
use crate::locks::Recover;
use crate::ops::health::Health;
use crate::ops::metrics::{Metrics, ServerCounts};

/// Open connections at most; the oldest unfinished one makes room for a new one.
pub const MAX_CONNECTIONS: usize = 64;
/// From accept to the last byte of the request (and from the answer to its last byte).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
const MAX_HEAD: usize = 8 * 1024;

/// What writes `/status`'s report (`cmpoll status`'s `StatusReport`) for a query string.
pub type StatusReporter = Arc<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// What the endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub health: Arc<Mutex<Health>>,
    pub metrics: Arc<Mutex<Metrics>>,
    /// `/status`'s JSON for a query string, where the command has one (`cmpoll run`); an
    /// error is a bad query, answered 400.
    pub status: Option<StatusReporter>,
}

fn limits() -> Limits {
    Limits {
        max_connections: MAX_CONNECTIONS,
        request_deadline: REQUEST_DEADLINE,
        idle: REQUEST_DEADLINE,
        write_deadline: REQUEST_DEADLINE,
        max_head: MAX_HEAD,
        max_body: 0,
        bodies: Bodies::None,
        max_bodies: 0,
        keep_alive: false,
        lanes: Limits::one_lane(2, 64, Answer::text(503, "busy\n")),
        max_held: usize::MAX,
        max_pinned: 16 << 20,
        // Every connection is token-less: at most what 64 stalled ones hold.
        max_loose: 16 << 20,
        handshakes: Sizes {
            workers: 1,
            queue: 1,
        },
        inline: false,
        panicked: Answer::text(500, "internal error\n"),
        counts: ServerCounts::default(),
    }
}

/// Binds and serves in the background; a bind error is a start-up error.
pub fn start(addr: SocketAddr, endpoints: Endpoints) -> Result<SocketAddr, StartError> {
    let fail = |what: &'static str| move |cause| StartError { addr, what, cause };
    let listener = TcpListener::bind(addr).map_err(fail("cannot listen"))?;
    let bound = listener.local_addr().map_err(fail("cannot listen"))?;
    let (server, _handle) = Server::new(listener, None, Arc::new(endpoints), limits())
        .map_err(fail("cannot start the server"))?;
    thread::Builder::new()
        .name("http".into())
        .spawn(move || server.run(&AtomicBool::new(false)))
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

impl Handler for Endpoints {
    fn handle(&self, req: &Request, _peer: &Peer, _call: Call) -> Reply {
        Reply::Answer(self.answer(req))
    }
}

impl Endpoints {
    fn answer(&self, req: &Request) -> Answer {
        let path = req.path.as_str();
        let known = matches!(path, "/healthz" | "/readyz" | "/metrics")
            || (path == "/status" && self.status.is_some());
        if !known {
            return Answer::text(404, "not found\n");
        }
        if req.method != "GET" {
            return Answer::text(405, "only GET\n");
        }
        let check = |f: &dyn Fn(&Health) -> Result<(), String>, ok: &str| {
            let verdict = f(&self.health.lock().recover());
            match verdict {
                Ok(()) => Answer::text(200, ok),
                Err(why) => Answer::text(503, format!("{why}\n")),
            }
        };
        match path {
            "/metrics" => Answer::metrics(self.metrics.lock().recover().render()),
            "/status" => match self.status.as_ref().map(|render| render(&req.query)) {
                Some(Ok(json)) => Answer::json(200, json.into_bytes()),
                Some(Err(why)) => Answer::text(400, format!("{why}\n")),
                None => Answer::text(404, "not found\n"),
            },
            "/healthz" => check(&|h| h.liveness(Instant::now(), SystemTime::now()), "ok\n"),
            _ => check(&|h| h.readiness(Instant::now()), "ready\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

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
            h.succeeded(Instant::now(), 0);
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
        // A client that never finishes its request is cut off at the deadline (told so
        // with a 408).
        let mut stalled = TcpStream::connect(addr).unwrap();
        stalled.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
        stalled
            .set_read_timeout(Some(REQUEST_DEADLINE * 10))
            .unwrap();
        let mut rest = Vec::new();
        let read = stalled.read_to_end(&mut rest);
        let rest = String::from_utf8_lossy(&rest);
        assert!(
            read.is_ok() && (rest.is_empty() || rest.starts_with("HTTP/1.1 408 ")),
            "closed with at most a 408: {read:?} {rest}"
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
