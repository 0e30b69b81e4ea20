//! HTTP helpers for the tests: a reload endpoint that records its calls, and plain GETs
//! against cmpoll's `--listen` endpoints.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Daemon;

const SOON: Duration = Duration::from_secs(10);

/// A reload endpoint answering `codes` in turn (then 200); returns its URL and the request
/// lines it got.
pub fn reload_server(codes: Vec<u16>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/-/reload", listener.local_addr().unwrap());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let n = Arc::new(AtomicU32::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let mut conn = conn.unwrap();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).unwrap();
                if h == "\r\n" || h.is_empty() {
                    break;
                }
            }
            seen.lock().unwrap().push(line.trim().to_string());
            let i = n.fetch_add(1, Ordering::SeqCst) as usize;
            let code = codes.get(i).copied().unwrap_or(200);
            let _ = write!(
                conn,
                "HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    (url, calls)
}

/// The address cmpoll logged it listens on.
pub fn listening(d: &Daemon) -> String {
    let start = Instant::now();
    loop {
        if let Some(line) = d.stderr().lines().find(|l| l.contains("/metrics on ")) {
            return line.rsplit(' ').next().unwrap().to_string();
        }
        assert!(
            start.elapsed() < SOON,
            "cmpoll never listened:\n{}",
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// GET `path`: (status, body).
pub fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1.to_string();
    (code, body)
}

/// Polls `path` until it answers `code` with a body containing `needle`.
pub fn until_body(addr: &str, path: &str, code: u16, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let (c, body) = get(addr, path);
        if c == code && body.contains(needle) {
            return body;
        }
        assert!(start.elapsed() < SOON, "{path} stayed {c}: {body}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn until(addr: &str, path: &str, code: u16) -> String {
    until_body(addr, path, code, "")
}
