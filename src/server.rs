//! `--listen ADDR`: `/healthz`, `/readyz` and `/metrics` over a small synchronous HTTP/1.1
//! server. Three fixed GETs need no framework, but this one is careful: a thread per
//! connection with at most `MAX_CONNECTIONS` at once (more are answered 503 and closed),
//! read and write timeouts, an 8 KiB cap on the request head, `Connection: close`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::health::Health;
use crate::metrics::Metrics;

pub const MAX_CONNECTIONS: usize = 32;
const IO_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_HEAD: u64 = 8 * 1024;

/// What the endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub health: Arc<Mutex<Health>>,
    pub metrics: Arc<Mutex<Metrics>>,
}

/// Binds and serves in the background; a bind error is a start-up error.
pub fn start(addr: SocketAddr, endpoints: Endpoints) -> Result<SocketAddr, String> {
    let listener =
        TcpListener::bind(addr).map_err(|e| format!("--listen {addr}: cannot listen: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("--listen {addr}: {e}"))?;
    let active = Arc::new(AtomicUsize::new(0));
    thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                    active.fetch_sub(1, Ordering::AcqRel);
                    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
                    let _ = respond(&stream, "503 Service Unavailable", "text/plain", "busy\n");
                    continue;
                }
                let (endpoints, active) = (endpoints.clone(), active.clone());
                let spawned = thread::Builder::new()
                    .name("http-conn".into())
                    .spawn(move || {
                        let _ = handle(stream, &endpoints);
                        active.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    log::warn!("--listen: cannot start a connection thread");
                }
            }
        })
        .map_err(|e| format!("--listen {addr}: cannot start the server: {e}"))?;
    log::info!("serving /healthz, /readyz and /metrics on {bound}");
    Ok(bound)
}

fn respond(mut w: &TcpStream, status: &str, content_type: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes())?;
    w.write_all(body.as_bytes())?;
    w.flush()
}

fn handle(stream: TcpStream, e: &Endpoints) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new((&stream).take(MAX_HEAD));
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 || !line.ends_with('\n') {
        return respond(&stream, "400 Bad Request", "text/plain", "bad request\n");
    }
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || !h.ends_with('\n') {
            // The head did not end within the cap: too large, or cut short.
            return respond(
                &stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            );
        }
        if h == "\r\n" || h == "\n" {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let (Some(method), Some(target), Some(version)) = (method, target, version) else {
        return respond(&stream, "400 Bad Request", "text/plain", "bad request\n");
    };
    if !version.starts_with("HTTP/1.") {
        return respond(&stream, "400 Bad Request", "text/plain", "bad request\n");
    }
    let path = target.split('?').next().unwrap_or("");
    if !matches!(path, "/healthz" | "/readyz" | "/metrics") {
        return respond(&stream, "404 Not Found", "text/plain", "not found\n");
    }
    if method != "GET" {
        return respond(
            &stream,
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n",
        );
    }
    let lock = |h: &Arc<Mutex<Health>>| {
        let g = h.lock().unwrap_or_else(|p| p.into_inner());
        (
            g.liveness(Instant::now(), SystemTime::now()),
            g.readiness(Instant::now()),
        )
    };
    match path {
        "/metrics" => {
            let text = e.metrics.lock().unwrap_or_else(|p| p.into_inner()).render();
            respond(
                &stream,
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                &text,
            )
        }
        "/healthz" => match lock(&e.health).0 {
            Ok(()) => respond(&stream, "200 OK", "text/plain", "ok\n"),
            Err(why) => respond(
                &stream,
                "503 Service Unavailable",
                "text/plain",
                &format!("{why}\n"),
            ),
        },
        _ => match lock(&e.health).1 {
            Ok(()) => respond(&stream, "200 OK", "text/plain", "ready\n"),
            Err(why) => respond(
                &stream,
                "503 Service Unavailable",
                "text/plain",
                &format!("{why}\n"),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::InFlight;

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
        };
        (
            start("127.0.0.1:0".parse().unwrap(), endpoints).unwrap(),
            health,
        )
    }

    fn raw(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
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
        let m = raw(addr, b"GET /metrics HTTP/1.0\r\n\r\n");
        assert!(
            m.contains("application/openmetrics-text") && m.contains("# EOF"),
            "{m}"
        );
        assert!(raw(addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(raw(addr, b"POST /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    }

    #[test]
    fn malformed_oversized_and_slow_requests() {
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
        // Slow clients hold a slot for at most the read timeout; the rest are answered.
        let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        // Once the server has taken them all (a loaded machine may take a moment, well
        // within the read timeout that would free them), the next one is turned away.
        let start = std::time::Instant::now();
        while !raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503") {
            assert!(
                start.elapsed() < IO_TIMEOUT / 2,
                "the cap holds: never turned away"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(IO_TIMEOUT + Duration::from_millis(500));
        assert!(
            raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"),
            "slots freed"
        );
        drop(idle);
    }
}
