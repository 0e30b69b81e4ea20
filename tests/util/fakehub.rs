//! A scripted `cmpoll serve` hub in plain HTTP, for what the real hub never does on
//! purpose: a watch cut in the middle of an event, an event or bookmark older than what a
//! follower holds, a 410 at a chosen moment, a hub that goes quiet. Each request gets the
//! bytes its script gives (then the connection closes, unless they start with `HOLD`:
//! then it stays open, silent, as a frozen hub's); every request line is recorded. A
//! follower's reports (`POST /cmpoll/v1/report`) are not the script's: each is recorded
//! with its headers and body (`reports`) and answered `report_status` (204 unless told).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

type Script = Box<dyn FnMut(&str) -> Vec<u8> + Send>;

/// An answer that starts with this is written without it, and its connection is kept open
/// and silent (`hold`).
const HOLD: &[u8] = b"HOLD";

/// `answer`, then silence on an open connection: a hub that froze.
pub fn hold(answer: Vec<u8>) -> Vec<u8> {
    [HOLD, &answer].concat()
}

pub struct FakeHub {
    pub url: String,
    /// Each request's line (`GET /api/v1/… HTTP/1.1`), but the reports'.
    pub requests: Arc<Mutex<Vec<String>>>,
    /// Each report a follower sent.
    pub reports: Arc<Mutex<Vec<Posted>>>,
    /// The status a report is answered with (204: taken).
    pub report_status: Arc<Mutex<u16>>,
}

/// A follower's report as the hub got it.
#[derive(Clone, Debug)]
pub struct Posted {
    /// Its headers, each `name: value` with the name in lower case.
    pub headers: Vec<String>,
    pub body: serde_json::Value,
}

impl Posted {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter()).find_map(|h| h.strip_prefix(name)?.strip_prefix(": "))
    }
}

/// Where a follower reports (`hub_protocol::REPORT_PATH`).
const REPORT_LINE: &str = "POST /cmpoll/v1/report ";

impl FakeHub {
    pub fn start(script: impl FnMut(&str) -> Vec<u8> + Send + 'static) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reports = Arc::new(Mutex::new(Vec::new()));
        let report_status = Arc::new(Mutex::new(204));
        let script: Arc<Mutex<Script>> = Arc::new(Mutex::new(Box::new(script)));
        let seen = requests.clone();
        let (posted, status) = (reports.clone(), report_status.clone());
        std::thread::spawn(move || {
            let mut frozen = Vec::new();
            for conn in listener.incoming().flatten() {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let mut headers = Vec::new();
                let mut h = String::new();
                while reader.read_line(&mut h).is_ok_and(|n| n > 2) {
                    let (name, value) = h.trim().split_once(':').unwrap_or((h.trim(), ""));
                    headers.push(format!("{}: {}", name.to_ascii_lowercase(), value.trim()));
                    h.clear();
                }
                if line.starts_with(REPORT_LINE) {
                    let length = (headers.iter())
                        .find_map(|h| h.strip_prefix("content-length: "))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    let mut body = vec![0; length];
                    let _ = reader.read_exact(&mut body);
                    let body = serde_json::from_slice(&body).unwrap_or_default();
                    posted.lock().unwrap().push(Posted { headers, body });
                    let code = *status.lock().unwrap();
                    let mut conn = conn;
                    let _ = conn.write_all(
                        format!("HTTP/1.1 {code} Report\r\nx-cmpoll-hub: fake\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
                    );
                    continue;
                }
                let line = line.trim().to_string();
                seen.lock().unwrap().push(line.clone());
                let answer = (script.lock().unwrap())(&line);
                let mut conn = conn;
                match answer.strip_prefix(HOLD) {
                    Some(answer) => {
                        let _ = conn.write_all(answer);
                        frozen.push(conn);
                    }
                    None => {
                        let _ = conn.write_all(&answer);
                    }
                }
            }
        });
        FakeHub {
            url,
            requests,
            reports,
            report_status,
        }
    }

    /// The reports' bodies so far.
    pub fn reported(&self) -> Vec<serde_json::Value> {
        (self.reports.lock().unwrap().iter())
            .map(|p| p.body.clone())
            .collect()
    }

    /// The request lines so far that are watches.
    pub fn watches(&self) -> Vec<String> {
        (self.requests.lock().unwrap().iter())
            .filter(|l| l.contains("watch=true"))
            .cloned()
            .collect()
    }
}

/// A ConfigMap of namespace `ns`, selected (`cmpoll.io/module=true`), as a list item.
pub fn configmap(ns: &str, name: &str, rv: u64, value: &str) -> String {
    format!(
        r#"{{"metadata":{{"name":"{name}","namespace":"{ns}","uid":"uid-{name}","resourceVersion":"{rv}","labels":{{"cmpoll.io/module":"true"}}}},"data":{{"k":"{value}"}}}}"#
    )
}

/// A hub's list answer at `rv`.
pub fn list(rv: u64, items: &[String]) -> Vec<u8> {
    let body = format!(
        r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}},"items":[{}]}}"#,
        items.join(",")
    );
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-cmpoll-hub: fake\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A watch event line of type `t` about `item` (a list item: `kind` and `apiVersion` put
/// in front, as a watch carries the object).
pub fn event(t: &str, item: &str) -> String {
    let object = format!(r#"{{"kind":"ConfigMap","apiVersion":"v1",{}"#, &item[1..]);
    format!(r#"{{"type":"{t}","object":{object}}}"#)
}

pub fn bookmark(rv: u64) -> String {
    format!(
        r#"{{"type":"BOOKMARK","object":{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}}}}}}"#
    )
}

pub fn expired() -> String {
    r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (10)","reason":"Expired","code":410}}"#.to_string()
}

/// A watch answer: `lines`, each a chunk; with `cut`, the last line is cut after that
/// many bytes and the connection closes in the middle of its chunk.
pub fn watch(lines: &[String], cut: Option<usize>) -> Vec<u8> {
    let mut out = watch_open(lines, cut);
    if cut.is_none() {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    out
}

/// `watch` without its end: the stream stays open after `lines`.
pub fn watch_open(lines: &[String], cut: Option<usize>) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-cmpoll-hub: fake\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for (i, l) in lines.iter().enumerate() {
        let l = format!("{l}\n");
        out.extend_from_slice(format!("{:x}\r\n", l.len()).as_bytes());
        match cut {
            Some(n) if i + 1 == lines.len() => {
                out.extend_from_slice(&l.as_bytes()[..n.min(l.len())]);
                return out;
            }
            _ => {
                out.extend_from_slice(l.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        }
    }
    out
}

/// The `resourceVersion` a request line asks from.
pub fn asked_rv(line: &str) -> Option<u64> {
    let q = line.split_whitespace().nth(1)?.split_once('?')?.1;
    q.split('&')
        .find_map(|p| p.strip_prefix("resourceVersion="))
        .and_then(|v| v.parse().ok())
}
