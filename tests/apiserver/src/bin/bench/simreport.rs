//! The simulated followers' reports to their hub (issue 59), as `cmpoll run` sends them
//! (`src/hub_report/held.rs` builds them, `sender.rs` sends them): the modules a follower
//! holds otherwise than served (here: those its agent refused), POSTed to
//! `hub_protocol::REPORT_PATH` once when it starts following (its first list) and again
//! each time that changes (a change a bookmark commits), with one report in flight and
//! only the newest one pending, a 429 waited as its `Retry-After` says, any other failure
//! retried after a second doubling up to five minutes. (A real follower also sends a
//! report with exceptions again every 10 minutes; the phases here are shorter.)
//!
//! The body is `hub_protocol::Report` as serde writes it: `{"modules":[]}` for a follower
//! that holds what it was served; a refusal as `{"module":"NS/NAME","kind":"ConfigMap",
//! "hash":…,"resourceVersion":…,"refused":{"hash":…,"resourceVersion":…,"by":"confirm",
//! "reason":…}}` (what it holds instead, then what it refused), the modules in id order.
//! What a follower holds is a function of the hub's version it last committed, so the
//! state (and its two bodies, refusing and not) is made once per version and shared by
//! every follower at it; each module's hash (`poll::hash`: per key in order, the key, a 0
//! byte, the content's length as 8 bytes big-endian, the content) once per object and
//! round.
//!
//! Each follower sends on a connection of its own beside its watch (a real follower's
//! report thread has its own), made for a report whenever the hub closed the last one
//! (which it does after each answer to a report).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// The epoll data of a follower's report connection: its index with this bit.
pub const REPORT_BIT: u64 = 1 << 40;

/// Followers who refuse (as `--confirm`'s agent would) every version whose content
/// contains `marker`: the first `share` of them by a stable hash of their index, each
/// `confirm` after it committed the version (its agent's confirm time; zero: at once).
#[derive(Clone, Debug)]
pub struct Refusing {
    pub share: f64,
    pub marker: String,
    pub confirm: Duration,
}

/// A version of a module: its hash and the object's resourceVersion.
type Version = (String, String);

/// A follower's state: module id → version, and the version refused (with the version
/// held instead).
#[derive(Default, Clone)]
struct Held {
    modules: BTreeMap<String, Version>,
    /// Modules whose newest version a refusing follower refuses: the refused version and
    /// the one it holds instead.
    refused: BTreeMap<String, (Version, Version)>,
    bodies: [Option<Arc<Vec<u8>>>; 2],
}

/// One follower's report connection and what it still has to send.
#[derive(Default)]
struct Conn {
    link: Option<(TcpStream, rustls::ClientConnection)>,
    inbuf: Vec<u8>,
    in_flight: bool,
    /// The body in flight.
    sent: Option<Arc<Vec<u8>>>,
    /// The newest body not yet taken, and when it may go.
    pending: Option<Arc<Vec<u8>>>,
    due: Option<Instant>,
    /// The last body the hub took.
    taken: Option<Arc<Vec<u8>>>,
    failures: u32,
}

/// What the reports did.
#[derive(Default, Debug, Clone)]
pub struct Counts {
    pub sent: u64,
    pub codes: HashMap<u16, u64>,
    pub bytes: u64,
    pub broken: u64,
}

/// The fleet's reports.
pub struct Reports {
    conns: Vec<Conn>,
    states: HashMap<u64, Held>,
    hashes: HashMap<(String, u64), String>,
    refusing: Option<Refusing>,
    tokens: Vec<String>,
    port: u16,
    wait: u64,
    pub counts: Counts,
}

impl Reports {
    pub fn new(tokens: Vec<String>, port: u16, wait: u64, refusing: Option<Refusing>) -> Reports {
        Reports {
            conns: (0..tokens.len()).map(|_| Conn::default()).collect(),
            tokens,
            states: HashMap::new(),
            hashes: HashMap::new(),
            refusing,
            port,
            wait,
            counts: Counts::default(),
        }
    }

    fn refuses(&self, i: usize) -> bool {
        self.refusing.as_ref().is_some_and(|r| {
            let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11;
            ((x % 10_000) as f64) < r.share * 10_000.0
        })
    }

    /// Follower `i` listed: it holds the list at `rv` (`body`, gzipped or not), and
    /// reports it (`first`: it starts following, and says so even if unchanged).
    pub fn listed(&mut self, i: usize, rv: u64, body: &[u8], gzip: bool, first: bool) {
        self.states
            .entry(rv)
            .or_insert_with(|| Self::held_of_list(body, gzip));
        if first {
            self.conns[i].taken = None;
        }
        self.hand(i, rv);
    }

    /// Follower `i` at `from` committed `events` (lines) with a bookmark at `to`.
    pub fn committed(&mut self, i: usize, from: u64, to: u64, events: &[Vec<u8>]) {
        if events.is_empty() {
            return;
        }
        if !self.states.contains_key(&to) {
            let mut held = self.states.get(&from).cloned().unwrap_or_default();
            held.bodies = [None, None];
            for line in events {
                self.apply(&mut held, line);
            }
            self.states.insert(to, held);
        }
        self.hand(i, to);
    }

    /// Follower `i` now holds the state at `rv`: its body is pending unless the hub took it.
    fn hand(&mut self, i: usize, rv: u64) {
        let refuses = self.refuses(i);
        let Some(held) = self.states.get_mut(&rv) else {
            return;
        };
        let k = usize::from(refuses);
        // A refusal leaves once the agent said so: `confirm` after the version came.
        let delay = match &self.refusing {
            Some(r) if refuses && !held.refused.is_empty() => r.confirm,
            _ => Duration::ZERO,
        };
        let body = match &held.bodies[k] {
            Some(b) => b.clone(),
            None => {
                let b = Arc::new(body(held, refuses));
                held.bodies[k] = Some(b.clone());
                b
            }
        };
        let c = &mut self.conns[i];
        if c.taken.as_ref().is_some_and(|t| **t == *body) {
            c.pending = None;
            return;
        }
        c.pending = Some(body);
        if !c.in_flight && (c.due.is_none() || delay > Duration::ZERO) {
            c.due = Some(Instant::now() + delay);
        }
    }

    fn held_of_list(body: &[u8], gzip: bool) -> Held {
        let mut raw = Vec::new();
        if gzip {
            let _ = flate2::read::GzDecoder::new(body).read_to_end(&mut raw);
        } else {
            raw = body.to_vec();
        }
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap_or_default();
        let mut held = Held::default();
        for item in v["items"].as_array().into_iter().flatten() {
            if let Some((id, hash)) = module(item) {
                held.modules.insert(id, (hash, rv_of(item)));
            }
        }
        held
    }

    fn apply(&mut self, held: &mut Held, line: &[u8]) {
        let Ok(e) = serde_json::from_slice::<serde_json::Value>(line) else {
            return;
        };
        let o = &e["object"];
        let Some((id, hash)) = self.hash_of(o) else {
            return;
        };
        if e["type"] == "DELETED" {
            held.modules.remove(&id);
            held.refused.remove(&id);
            return;
        }
        let version = (hash, rv_of(o));
        let marked = (self.refusing.as_ref())
            .is_some_and(|r| o["data"].to_string().contains(r.marker.as_str()));
        if marked {
            let before = held.modules.get(&id).cloned().unwrap_or_default();
            let before = match held.refused.get(&id) {
                Some((_, kept)) => kept.clone(),
                None => before,
            };
            held.refused.insert(id.clone(), (version.clone(), before));
        } else {
            held.refused.remove(&id);
        }
        held.modules.insert(id, version);
    }

    /// An object's module id and hash, once per object and round.
    fn hash_of(&mut self, o: &serde_json::Value) -> Option<(String, String)> {
        let rv: u64 = o["metadata"]["resourceVersion"].as_str()?.parse().ok()?;
        let (id, _) = ids(o)?;
        let key = (id.clone(), rv);
        if let Some(h) = self.hashes.get(&key) {
            return Some((id, h.clone()));
        }
        let (id, hash) = module(o)?;
        self.hashes.insert(key, hash.clone());
        Some((id, hash))
    }

    /// Whether every report was taken: none in flight, none waiting to go (again).
    pub fn settled(&self) -> bool {
        (self.conns.iter()).all(|c| !c.in_flight && c.pending.is_none())
    }

    /// The earliest moment a report is due.
    pub fn next_due(&self) -> Option<Instant> {
        (self.conns.iter())
            .filter(|c| !c.in_flight && c.pending.is_some())
            .filter_map(|c| c.due)
            .min()
    }

    /// Sends each report that is due.
    pub fn tick(&mut self, ep: &std::os::fd::OwnedFd, config: &Arc<rustls::ClientConfig>) {
        let now = Instant::now();
        for i in 0..self.conns.len() {
            let c = &self.conns[i];
            if c.in_flight || c.pending.is_none() || c.due.is_none_or(|d| d > now) {
                continue;
            }
            self.send(i, ep, config);
        }
    }

    fn send(&mut self, i: usize, ep: &std::os::fd::OwnedFd, config: &Arc<rustls::ClientConfig>) {
        let port = self.port;
        let c = &mut self.conns[i];
        if c.link.is_none() {
            let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
            match super::simclient::connect(ep, addr, config, (i as u64 | REPORT_BIT) as usize) {
                Ok(mut l) => {
                    // A report is larger than rustls buffers by default (64 KiB): the
                    // whole of it waits for the socket.
                    l.1.set_buffer_limit(None);
                    c.link = Some(l);
                }
                Err(_) => {
                    c.due = Some(Instant::now() + Duration::from_secs(1));
                    return;
                }
            }
        }
        let (Some(body), Some((_, tls))) = (c.pending.take(), c.link.as_mut()) else {
            return;
        };
        c.due = None;
        c.in_flight = true;
        c.sent = Some(body.clone());
        c.inbuf.clear();
        self.counts.sent += 1;
        self.counts.bytes += body.len() as u64;
        let token = &self.tokens[i];
        // As `Client::post_to_hub` sends it (ureq's order and case, as the GETs).
        let head = format!(
            "POST /cmpoll/v1/report HTTP/1.1\r\naccept-encoding: gzip\r\nuser-agent: cmpoll/0.1.0\r\nhost: 127.0.0.1:{port}\r\naccept: application/json\r\nauthorization: Bearer {token}\r\nx-cmpoll-wait: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.wait,
            body.len()
        );
        let mut w = tls.writer();
        let _ = w.write_all(head.as_bytes());
        let _ = w.write_all(&body);
        self.io(i);
    }

    /// The report connection of follower `i` is ready.
    pub fn io(&mut self, i: usize) {
        let c = &mut self.conns[i];
        let Some((sock, tls)) = c.link.as_mut() else {
            return;
        };
        let mut gone = false;
        loop {
            let mut progressed = false;
            while tls.wants_write() {
                match tls.write_tls(sock) {
                    Ok(_) => progressed = true,
                    Err(_) => break,
                }
            }
            match tls.read_tls(sock) {
                Ok(0) => gone = true,
                Ok(_) => {
                    progressed = true;
                    if tls.process_new_packets().is_err() {
                        gone = true;
                    }
                    let mut buf = [0u8; 4096];
                    while let Ok(m) = tls.reader().read(&mut buf) {
                        if m == 0 {
                            break;
                        }
                        c.inbuf.extend_from_slice(&buf[..m]);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => gone = true,
            }
            if !progressed || gone {
                break;
            }
        }
        if let Some((code, retry_after, close)) = answer(&c.inbuf) {
            c.inbuf.clear();
            c.in_flight = false;
            *self.counts.codes.entry(code).or_default() += 1;
            let sent = c.sent.take();
            let now = Instant::now();
            match code {
                200..=299 => {
                    c.failures = 0;
                    // A newer state that came meanwhile goes next, unless it is this one.
                    if c.pending == sent {
                        c.pending = None;
                    }
                    c.taken = sent;
                }
                _ => {
                    // The newest state goes next, after the wait.
                    c.pending = c.pending.take().or(sent);
                    let wait = match (code, retry_after) {
                        (429 | 503, Some(s)) => Duration::from_secs(s),
                        _ => Duration::from_secs(1 << c.failures.min(8)).min(LONGEST),
                    };
                    c.failures += 1;
                    c.due = Some(now + wait);
                }
            }
            if c.pending.is_some() && c.due.is_none() {
                c.due = Some(now);
            }
            if close {
                gone = true;
            }
        }
        if gone {
            // Closing the socket takes it out of the epoll set.
            c.link = None;
            if c.in_flight {
                c.in_flight = false;
                c.pending = c.pending.take().or(c.sent.take());
                self.counts.broken += 1;
                c.due = Some(Instant::now() + Duration::from_secs(1));
            }
        }
    }
}

const LONGEST: Duration = Duration::from_secs(300);

/// A whole answer's status, `Retry-After` and `Connection: close`, once its head and its
/// `Content-Length` bytes are in.
fn answer(buf: &[u8]) -> Option<(u16, Option<u64>, bool)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let header = |n: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(n).map(|v| v.trim().to_string()))
    };
    let len: usize = header("content-length:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if buf.len() < end + 4 + len {
        return None;
    }
    let retry = header("retry-after:").and_then(|v| v.parse().ok());
    let close = header("connection:").is_some_and(|v| v == "close");
    Some((code, retry, close))
}

fn ids(o: &serde_json::Value) -> Option<(String, ())> {
    let m = &o["metadata"];
    Some((
        format!("{}/{}", m["namespace"].as_str()?, m["name"].as_str()?),
        (),
    ))
}

/// A ConfigMap's module id and hash (`poll::hash`: its `data`, keys in byte order).
fn module(o: &serde_json::Value) -> Option<(String, String)> {
    let (id, _) = ids(o)?;
    let mut files: Vec<(&str, &str)> = (o["data"].as_object().into_iter().flatten())
        .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
        .collect();
    files.sort();
    let mut h = Sha256::new();
    for (k, v) in files {
        h.update(k.as_bytes());
        h.update([0u8]);
        h.update((v.len() as u64).to_be_bytes());
        h.update(v.as_bytes());
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Some((id, format!("sha256:{hex}")))
}

/// The object's resourceVersion.
fn rv_of(o: &serde_json::Value) -> String {
    o["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The report's JSON, as serde writes `hub_protocol::Report` (field order and omissions):
/// only the modules held otherwise than served — a refusing follower's refusals.
fn body(held: &Held, refuses: bool) -> Vec<u8> {
    let q = |v: &str| serde_json::to_string(v).unwrap_or_default();
    let mut out = String::from("{\"modules\":[");
    let refused = held.refused.iter().filter(|_| refuses);
    for (k, (id, ((hash, rv), (kept, kept_rv)))) in refused.enumerate() {
        if k > 0 {
            out.push(',');
        }
        out += &format!("{{\"module\":{},\"kind\":\"ConfigMap\"", q(id));
        if !kept.is_empty() {
            out += &format!(",\"hash\":{},\"resourceVersion\":{}", q(kept), q(kept_rv));
        }
        out += &format!(
            ",\"refused\":{{\"hash\":{},\"resourceVersion\":{},\"by\":\"confirm\",\"reason\":{}}}}}",
            q(hash),
            q(rv),
            q(REASON)
        );
    }
    out += "]}";
    out.into_bytes()
}

/// What a refusing follower's agent says.
const REASON: &str = "the bench's agent refused it";
