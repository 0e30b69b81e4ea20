//! HTTP helpers for the tests: a reload endpoint that records its calls, and plain GETs
//! against cmpoll's `--listen` endpoints.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Daemon, SOON};

/// A reload endpoint answering `codes` in turn (then 200); returns its URL and the request
/// lines it got.
pub fn reload_server(codes: Vec<u16>) -> (String, Arc<Mutex<Vec<String>>>) {
    let (url, _, lines) = endpoint(codes);
    (url, lines)
}

/// One call to a test endpoint: the request line and the headers (names lowercased).
pub type Call = (String, BTreeMap<String, String>);

/// A reload endpoint answering `codes` in turn (then 200), recording each request line
/// with its headers.
pub fn reload_server_with_headers(codes: Vec<u16>) -> (String, Arc<Mutex<Vec<Call>>>) {
    let (url, calls, _) = endpoint(codes);
    (url, calls)
}

/// The same on a given loopback port (an agent's port that a manifest names).
pub fn reload_server_on(port: u16) -> Arc<Mutex<Vec<Call>>> {
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    endpoint_on(listener, vec![]).1
}

type Recorded = (String, Arc<Mutex<Vec<Call>>>, Arc<Mutex<Vec<String>>>);

fn endpoint(codes: Vec<u16>) -> Recorded {
    endpoint_on(TcpListener::bind("127.0.0.1:0").unwrap(), codes)
}

fn endpoint_on(listener: TcpListener, codes: Vec<u16>) -> Recorded {
    let url = format!("http://{}/-/reload", listener.local_addr().unwrap());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (seen, seen_lines) = (calls.clone(), lines.clone());
    let n = Arc::new(AtomicU32::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let i = n.fetch_add(1, Ordering::SeqCst) as usize;
            let code = codes.get(i).copied().unwrap_or(200);
            if let Some((line, _)) = answer(conn, code, &seen) {
                seen_lines.lock().unwrap().push(line);
            }
        }
    });
    (url, calls, lines)
}

/// Reads one request head from `conn`, records it, answers `code`; the call recorded.
pub fn answer(mut conn: TcpStream, code: u16, calls: &Mutex<Vec<Call>>) -> Option<Call> {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return None;
    }
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let call = (line.trim().to_string(), headers);
    calls.lock().unwrap().push(call.clone());
    let _ = write!(
        conn,
        "HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    Some(call)
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

/// GET `path`: (status, body); `None` while nothing listens there.
pub fn try_get(addr: &str, path: &str) -> Option<(u16, String)> {
    TcpStream::connect(addr).ok()?;
    Some(get(addr, path))
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

/// An https reload endpoint with a certificate of `pki` for 127.0.0.1, answering 200 and
/// recording each call.
pub fn https_reload_server(pki: &test_apiserver::Pki) -> (String, Arc<Mutex<Vec<Call>>>) {
    struct Recorder(Arc<Mutex<Vec<Call>>>);
    impl test_apiserver::http::Handler for Recorder {
        fn handle(&self, req: &test_apiserver::http::Request) -> test_apiserver::http::Reply {
            let line = format!("{} {} HTTP/1.1", req.method, req.path);
            self.0
                .lock()
                .unwrap()
                .push((line, req.headers.iter().cloned().collect()));
            test_apiserver::http::Reply::Full(test_apiserver::http::Response::new(
                200,
                "text/plain",
                Vec::new(),
            ))
        }
        fn sending(
            &self,
            _: &test_apiserver::http::Request,
            _: &test_apiserver::http::Reply,
            _: test_apiserver::http::Written,
        ) {
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}/-/reload", listener.local_addr().unwrap());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let handler: Arc<dyn test_apiserver::http::Handler> = Arc::new(Recorder(calls.clone()));
    let tls = test_apiserver::http::tls_config(pki);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::spawn(move || test_apiserver::http::serve(listener, Some(tls), handler, stop));
    (url, calls)
}

/// An answer of `web_server`: status, extra headers, body.
pub type Page = (u16, Vec<(String, String)>, Vec<u8>);

/// A small web server (`.url` keys, reload calls): `route(path, headers)` answers each
/// request; returns its base URL (`http://127.0.0.1:P`) and every call (request line and
/// headers; a request body under the name `" body"`).
pub fn web_server(
    route: impl Fn(&str, &BTreeMap<String, String>) -> Page + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<Call>>>) {
    web_server_at("127.0.0.1:0", route)
}

/// `web_server` on `addr` (`[::]:3000`: where a chart's agent listens).
pub fn web_server_at(
    addr: &str,
    route: impl Fn(&str, &BTreeMap<String, String>) -> Page + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<Call>>>) {
    let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    let base = format!("http://{}", listener.local_addr().unwrap());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let route = Arc::new(route);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let (seen, route) = (seen.clone(), route.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut headers = BTreeMap::new();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                        }
                    }
                    if let Some(n) = headers.get("content-length").and_then(|n| n.parse().ok()) {
                        let mut body = vec![0u8; n];
                        let _ = reader.read_exact(&mut body);
                        // Recorded with the headers, under a name no header has.
                        headers.insert(" body".into(), String::from_utf8_lossy(&body).into());
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    seen.lock()
                        .unwrap()
                        .push((line.trim().to_string(), headers.clone()));
                    let (code, extra, body) = route(&path, &headers);
                    let mut head =
                        format!("HTTP/1.1 {code} X\r\nContent-Length: {}\r\n", body.len());
                    for (k, v) in extra {
                        head += &format!("{k}: {v}\r\n");
                    }
                    head += "\r\n";
                    let mut out = head.into_bytes();
                    out.extend_from_slice(&body);
                    if conn.write_all(&out).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (base, calls)
}
