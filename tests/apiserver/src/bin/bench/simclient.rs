//! The fleet simulator's followers (issue 48.5): N followers of one hub in one process,
//! each with its own token and TLS connection, sending on the wire exactly what `cmpoll
//! run` sends its hub (the same request lines and headers, in the same order; checked
//! against real followers in `simfleet.rs`) and doing no local work beyond what the
//! protocol needs: the resourceVersion at the start of a list, each event's name and
//! round, a bookmark's version.
//!
//! Two protocols, as a follower speaks them:
//! - **watch** (cmpoll now): the first list of the scope in full (`resourceVersion=0`),
//!   then a held watch from its version (`timeoutSeconds` a random 30 to 60 minutes,
//!   `x-cmpoll-wait` the follower's interval: the watch is held), on which the hub
//!   commits each change (events, then a bookmark) and sends a bookmark alone when the
//!   wait passes with none; when it ends, the next from the last bookmark's version.
//! - **long poll** (the waiting list: a follower of a hub that refuses watch): the first
//!   list in full, then metadata lists with `x-cmpoll-wait` answered 304 or with the list,
//!   and a GET of each object that changed (the simulator is told which by the churn, as a
//!   real follower finds it by comparing versions).
//!
//! Behind a balancer (`reconnect: true`), a follower whose connection the hub closes (an
//! answer with `Connection: close`, a drained watch, a hub gone) connects again, as a real
//! follower does: at once after an answer that closed it, else at a random moment within
//! 10 s (its backoff after a failed poll); a watch answered `410 Expired` (a hub that
//! started after the follower's version) is followed by a full list, as a relist.
//!
//! A real follower's next request leaves some time after its answer (its batch's delivery
//! and a 100 ms pause): each simulated follower waits 100 ms plus a random share of 50 ms,
//! and the first requests are spread over `spread`, so that arrivals at the hub are as
//! scattered as a real fleet's (an event loop woken once per arrival, not once per burst).
//! With `arrival`, followers come at that rate instead, each connecting when it arrives (a
//! fleet coming to a hub that just started, issue 56.8).
//!
//! Told to wait (429, 503), a follower waits as `retry` says: a second (`Fixed`, the
//! simulator before issue 56), as `cmpoll run` did before 56 (`Backoff`: its interval,
//! doubling up to five minutes, `Retry-After` a floor) or as it does since (`Told`: a hub's
//! 429 with `Retry-After` waited as told and up to a second more; anything else as
//! `Backoff`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::epoll::{self, EventData, EventFlags};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};

use super::simreport::{REPORT_BIT, Refusing, Reports};

/// Which protocol the followers speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Watch,
    LongPoll,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Watch => "watch",
            Protocol::LongPoll => "long poll",
        }
    }
}

/// What the followers are and where their hub is.
pub struct Setup {
    pub addr: std::net::SocketAddr,
    pub ca_pem: String,
    pub tokens: Vec<String>,
    pub protocol: Protocol,
    /// The follower's interval: its wait at the hub.
    pub wait: Duration,
    /// The first requests spread over this.
    pub spread: Duration,
    /// A lost connection is made again (followers behind a balancer); else it counts as
    /// broken and the follower stops.
    pub reconnect: bool,
    /// Followers arriving at this rate (a second), each connecting as it comes; `None`:
    /// all connected at the start, their first requests over `spread`.
    pub arrival: Option<f64>,
    /// How a follower told to wait waits.
    pub retry: Retry,
}

/// How a follower told to wait (429, 503) waits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Retry {
    /// A second (and its pause).
    Fixed,
    /// `cmpoll run` before issue 56: a failed poll, its wait from the interval doubling up
    /// to `min(10 × interval, 5 min)`, 10 % jitter, `Retry-After` a floor.
    Backoff { interval: Duration },
    /// `cmpoll run` since: a hub's 429 with `Retry-After` waited as told and up to a
    /// second more (no failure counted); anything else as `Backoff`.
    Told { interval: Duration },
}

/// Per follower: when it got each (object name, round).
pub type Seen = HashMap<(String, u64), Instant>;

/// A version of the tracked object (`Sim::track`) as a follower's watch brought it: its
/// round, when, and whether the hub held it back (`cmpoll.io/held-back`: a rollback).
#[derive(Clone, Copy, Debug)]
pub struct Served {
    pub round: u64,
    pub at: Instant,
    pub held_back: bool,
}

/// What the simulator reports.
#[derive(Default, Debug, Clone)]
pub struct Report {
    /// Requests sent, answers by status code.
    pub requests: u64,
    pub codes: HashMap<u16, u64>,
    /// Bytes read from the wire (TLS records), all followers.
    pub wire_bytes: u64,
    /// Connections that failed (reset, TLS error, bad framing).
    pub broken: u64,
    /// Connections made again (`Setup::reconnect`), and relists after a 410.
    pub reconnects: u64,
    pub relists: u64,
    /// Events older than one the follower had of the same object: a change going back.
    pub backwards: u64,
}

const ACCEPT_JSON: &str = "application/json";
const ACCEPT_METADATA: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const SCOPE: &str = "/api/v1/configmaps";
const SELECTOR: &str = "labelSelector=cmpoll.io%2Fmodule%3Dtrue";

/// What a follower is waiting for.
#[derive(Clone, Debug, PartialEq)]
enum Want {
    /// Its first list.
    List,
    /// A watch's events.
    Watch,
    /// A held metadata list (long poll).
    Waiting,
    /// GETs of changed objects (long poll): the name and round it asked for.
    Get(String, u64),
}

struct Follower {
    sock: TcpStream,
    tls: rustls::ClientConnection,
    token: String,
    want: Want,
    /// Plaintext received, not yet parsed.
    inbuf: Vec<u8>,
    /// The response being read: its head is parsed.
    body: Option<Body>,
    rv: u64,
    /// When to send the next request (`None`: one is out).
    next_at: Option<Instant>,
    /// Long poll: objects that changed since its last list, still to GET.
    to_get: Vec<(String, u64)>,
    seen: Seen,
    synced: bool,
    rng: u64,
    /// The answer being read closes its connection.
    closing: bool,
    /// The watch being read said 410: list next.
    relist: bool,
    /// The newest round held of each object.
    newest: HashMap<String, u64>,
    /// Its connections so far (one more each reconnect).
    connection: u64,
    /// Failed polls in a row (`Retry::Backoff`).
    failures: u32,
    /// When its first list was answered.
    pub listed_at: Option<Instant>,
    /// With reports: the watch's events not yet committed by a bookmark.
    events: Vec<Vec<u8>>,
    /// Each version of the tracked object its watch brought, in order.
    served: Vec<Served>,
}

/// Framing of the response being read.
struct Body {
    code: u16,
    retry_after: Option<u64>,
    gzip: bool,
    framing: Framing,
    /// Decoded body so far (for chunked: the chunks' data).
    data: Vec<u8>,
    /// For a watch: where the next line starts in `data`.
    line_at: usize,
}

enum Framing {
    Length(usize),
    /// `left` bytes of the chunk to read, then (`crlf`) its CRLF.
    Chunked {
        left: usize,
        crlf: bool,
        done: bool,
    },
}

/// The fleet.
pub struct Sim {
    epoll: std::os::fd::OwnedFd,
    followers: Vec<Follower>,
    setup: Arc<Setup>,
    config: Arc<rustls::ClientConfig>,
    /// The churn's changes not yet seen, for long-poll followers: every change so far.
    changes: Vec<(String, u64)>,
    /// Followers still to arrive (`Setup::arrival`): when the first did, and when the
    /// next one does.
    arrivals_from: Option<Instant>,
    next_arrival: Option<Instant>,
    pub report: Report,
    /// Each follower's reports to the hub (`with_reports`), as `cmpoll run` sends them.
    pub reports: Option<Reports>,
    /// The object whose every version each follower was served is kept (`track`).
    tracked: Option<String>,
}

/// A new connection to `addr` for follower `i`, registered with `epoll`.
pub(super) fn connect(
    epoll: &std::os::fd::OwnedFd,
    addr: std::net::SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    i: usize,
) -> std::io::Result<(TcpStream, rustls::ClientConnection)> {
    let sock = TcpStream::connect(addr)?;
    sock.set_nonblocking(true)?;
    let _ = sock.set_nodelay(true);
    let name = ServerName::try_from("127.0.0.1").expect("name");
    let tls = rustls::ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
    epoll::add(
        epoll,
        sock.as_fd(),
        EventData::new_u64(i as u64),
        EventFlags::IN | EventFlags::OUT | EventFlags::ET | EventFlags::RDHUP,
    )?;
    Ok((sock, tls))
}

fn tls_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()).flatten() {
        let _ = roots.add(c);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

impl Sim {
    /// Connects every follower (each its own connection) and schedules its first list;
    /// with `Setup::arrival`, followers connect as they arrive (`arrive`).
    pub fn start(setup: Setup) -> Sim {
        raise_files(setup.tokens.len() as u64 + 256);
        let config = tls_config(&setup.ca_pem);
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).expect("epoll");
        let now = Instant::now();
        let mut sim = Sim {
            epoll,
            followers: Vec::with_capacity(setup.tokens.len()),
            config,
            changes: Vec::new(),
            arrivals_from: setup.arrival.map(|_| now),
            next_arrival: setup.arrival.map(|_| now),
            report: Report::default(),
            reports: None,
            tracked: None,
            setup: Arc::new(setup),
        };
        if sim.setup.arrival.is_none() {
            let n = sim.setup.tokens.len().max(1);
            for i in 0..sim.setup.tokens.len() {
                let start = now + sim.setup.spread.mul_f64(i as f64 / n as f64);
                sim.join(start);
            }
        }
        sim
    }

    /// Each follower reports what it holds to the hub (issue 59), those `refusing`
    /// refusing what it names.
    pub fn with_reports(&mut self, refusing: Option<Refusing>) {
        let wait = self.setup.wait.as_secs().max(1);
        self.reports = Some(Reports::new(
            self.setup.tokens.clone(),
            self.setup.addr.port(),
            wait,
            refusing,
        ));
    }

    /// The next follower joins, its first list due at `start`.
    fn join(&mut self, start: Instant) {
        let i = self.followers.len();
        let (sock, tls) =
            connect(&self.epoll, self.setup.addr, &self.config, i).expect("connect to the hub");
        self.followers.push(Follower {
            sock,
            tls,
            token: self.setup.tokens[i].clone(),
            want: Want::List,
            inbuf: Vec::new(),
            body: None,
            rv: 0,
            next_at: Some(start),
            to_get: Vec::new(),
            seen: Seen::new(),
            synced: false,
            rng: (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            closing: false,
            relist: false,
            newest: HashMap::new(),
            connection: 0,
            failures: 0,
            listed_at: None,
            events: Vec::new(),
            served: Vec::new(),
        });
    }

    /// Followers whose moment came (`Setup::arrival`) join, each on a connection of its
    /// own, and ask at once.
    fn arrive(&mut self, now: Instant) {
        let (Some(rate), Some(from)) = (self.setup.arrival, self.arrivals_from) else {
            return;
        };
        let n = self.setup.tokens.len();
        let at = |i: usize| from + Duration::from_secs_f64(i as f64 / rate.max(1e-9));
        while self.followers.len() < n && at(self.followers.len()) <= now {
            self.join(at(self.followers.len()));
        }
        self.next_arrival = (self.followers.len() < n).then(|| at(self.followers.len()));
    }

    /// Every follower's first list, when it was answered (`None`: not yet, or not
    /// arrived).
    pub fn listed(&self) -> Vec<Option<Instant>> {
        let mut out: Vec<Option<Instant>> = self.followers.iter().map(|f| f.listed_at).collect();
        out.resize(self.setup.tokens.len(), None);
        out
    }

    /// Follower `i`'s connection is gone: connect again and ask at `at` (if the balancer
    /// refuses, try again within 10 s); without `reconnect`, it counts as broken.
    fn lost(&mut self, i: usize, at: Instant) {
        if !self.setup.reconnect {
            self.report.broken += 1;
            return;
        }
        let f = &mut self.followers[i];
        f.inbuf.clear();
        f.body = None;
        f.closing = false;
        let _ = epoll::delete(&self.epoll, f.sock.as_fd());
        match connect(&self.epoll, self.setup.addr, &self.config, i) {
            Ok((sock, tls)) => {
                self.report.reconnects += 1;
                let f = &mut self.followers[i];
                (f.sock, f.tls) = (sock, tls);
                f.connection += 1;
                f.next_at = Some(at);
                if f.want == Want::Watch && f.relist {
                    f.want = Want::List;
                }
            }
            Err(_) => {
                let f = &mut self.followers[i];
                let later = Duration::from_millis(next_random(&mut f.rng) % 10_000);
                f.next_at = Some(Instant::now() + later);
                f.want = if f.synced { Want::Watch } else { Want::List };
            }
        }
    }

    /// The churn changed `name` to `round` (long-poll followers GET it once their list
    /// says so).
    pub fn changed(&mut self, name: &str, round: u64) {
        self.changes.push((name.to_string(), round));
    }

    /// Runs the loop for `d`.
    pub fn run_for(&mut self, d: Duration) {
        let until = Instant::now() + d;
        let mut events = Vec::with_capacity(4096);
        while Instant::now() < until {
            let now = Instant::now();
            self.arrive(now);
            let next = (self.followers.iter())
                .filter_map(|f| f.next_at)
                .chain(self.next_arrival)
                .chain(self.reports.as_ref().and_then(Reports::next_due))
                .min()
                .map_or(Duration::from_millis(50), |t| {
                    t.saturating_duration_since(now)
                })
                .min(until.saturating_duration_since(now))
                .min(Duration::from_millis(50));
            let timeout = rustix::event::Timespec::try_from(next).unwrap_or_default();
            events.clear();
            let _ = epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                Some(&timeout),
            );
            let ready: Vec<u64> = events.iter().map(|e| e.data.u64()).collect();
            for d in ready {
                match self.reports.as_mut() {
                    Some(r) if d & REPORT_BIT != 0 => r.io((d & !REPORT_BIT) as usize),
                    _ => self.io(d as usize),
                }
            }
            let now = Instant::now();
            for i in 0..self.followers.len() {
                if self.followers[i].next_at.is_some_and(|t| t <= now) {
                    self.send(i);
                }
            }
            if let Some(r) = self.reports.as_mut() {
                r.tick(&self.epoll, &self.config);
            }
        }
    }

    /// From now on, each version of object `name` a follower's watch brings is kept, in
    /// order (`served`).
    pub fn track(&mut self, name: &str) {
        self.tracked = Some(name.to_string());
    }

    /// Every follower's versions of the tracked object, in order.
    pub fn served(&self) -> impl Iterator<Item = &[Served]> {
        self.followers.iter().map(|f| f.served.as_slice())
    }

    /// Every follower's (name, round) → when it was held.
    pub fn seen(&self) -> impl Iterator<Item = &Seen> {
        self.followers.iter().map(|f| &f.seen)
    }

    /// What the followers are doing, for a run that does not end.
    pub fn describe(&self) -> String {
        let mut states: HashMap<String, usize> = HashMap::new();
        for f in &self.followers {
            let s = format!(
                "{:?}{}{}",
                f.want,
                if f.next_at.is_some() {
                    " (due)"
                } else {
                    " (out)"
                },
                if f.body.is_some() { " reading" } else { "" }
            );
            *states.entry(s).or_default() += 1;
        }
        format!("{states:?}; {:?}", self.report)
    }

    pub fn synced(&self) -> usize {
        self.followers.iter().filter(|f| f.synced).count()
    }

    fn send(&mut self, i: usize) {
        let wait = self.setup.wait.as_secs().max(1);
        let protocol = self.setup.protocol;
        let f = &mut self.followers[i];
        f.next_at = None;
        let (path, accept, wait_header) = match (&f.want, protocol) {
            (Want::List, _) => (
                format!("{SCOPE}?{SELECTOR}&resourceVersion=0"),
                ACCEPT_JSON,
                None,
            ),
            (_, Protocol::Watch) => {
                f.want = Want::Watch;
                // As `source::api` asks it: 1,800 s × (1 + a random unit).
                let lasts = 1800 + next_random(&mut f.rng) % 1800;
                (
                    format!(
                        "{SCOPE}?{SELECTOR}&watch=true&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={lasts}",
                        f.rv
                    ),
                    ACCEPT_JSON,
                    Some(wait),
                )
            }
            (_, Protocol::LongPoll) => match f.to_get.pop() {
                Some((name, round)) => {
                    let ns = format!(
                        "fleet-{}",
                        module_index(&name) % super::apifleet::NAMESPACES
                    );
                    let ns = if name == "marker" {
                        "fleet-0".to_string()
                    } else {
                        ns
                    };
                    f.want = Want::Get(name.clone(), round);
                    (
                        format!("/api/v1/namespaces/{ns}/configmaps/{name}"),
                        ACCEPT_JSON,
                        None,
                    )
                }
                None => {
                    f.want = Want::Waiting;
                    (
                        format!(
                            "{SCOPE}?{SELECTOR}&resourceVersion={}&resourceVersionMatch=NotOlderThan",
                            f.rv
                        ),
                        ACCEPT_METADATA,
                        Some(wait),
                    )
                }
            },
        };
        // The head as cmpoll's ureq writes it (order and case as on the wire).
        let mut head = format!(
            "GET {path} HTTP/1.1\r\naccept-encoding: gzip\r\nuser-agent: cmpoll/0.1.0\r\nhost: 127.0.0.1:{}\r\naccept: {accept}\r\nauthorization: Bearer {}\r\n",
            self.setup.addr.port(),
            f.token
        );
        if let Some(w) = wait_header {
            head += &format!("x-cmpoll-wait: {w}\r\n");
        }
        head += "\r\n";
        let _ = f.tls.writer().write_all(head.as_bytes());
        self.report.requests += 1;
        self.io(i);
    }

    /// The socket is ready: reads and writes what it can, and handles whole answers.
    fn io(&mut self, i: usize) {
        let f = &mut self.followers[i];
        let mut gone = false;
        loop {
            let mut progressed = false;
            while f.tls.wants_write() {
                match f.tls.write_tls(&mut f.sock) {
                    Ok(_) => progressed = true,
                    Err(_) => break,
                }
            }
            match f.tls.read_tls(&mut f.sock) {
                Ok(0) => gone = true,
                Ok(n) => {
                    self.report.wire_bytes += n as u64;
                    progressed = true;
                    if f.tls.process_new_packets().is_err() {
                        gone = true;
                    }
                    let mut buf = [0u8; 16384];
                    while let Ok(m) = f.tls.reader().read(&mut buf) {
                        if m == 0 {
                            break;
                        }
                        f.inbuf.extend_from_slice(&buf[..m]);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => gone = true,
            }
            if !progressed || gone {
                break;
            }
        }
        let connection = f.connection;
        self.parse(i);
        // Gone, unless an answer that closed it was read whole (and it connected again).
        if gone && self.followers[i].connection == connection {
            let pause = self.pause(i);
            self.lost(i, Instant::now() + pause);
        }
    }

    /// A follower's pause before its next request (its batch, then 100 ms).
    fn pause(&mut self, i: usize) -> Duration {
        Duration::from_millis(100 + next_random(&mut self.followers[i].rng) % 50)
    }

    fn parse(&mut self, i: usize) {
        loop {
            let f = &mut self.followers[i];
            if f.body.is_none() {
                let Some(end) = find(&f.inbuf, b"\r\n\r\n") else {
                    return;
                };
                let head = String::from_utf8_lossy(&f.inbuf[..end]).to_string();
                f.inbuf.drain(..end + 4);
                let code: u16 = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let header = |n: &str| {
                    head.lines().find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.trim()
                            .eq_ignore_ascii_case(n)
                            .then(|| v.trim().to_string())
                    })
                };
                f.closing = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
                let framing = match header("content-length").and_then(|v| v.parse().ok()) {
                    Some(n) => Framing::Length(n),
                    None => Framing::Chunked {
                        left: 0,
                        crlf: false,
                        done: false,
                    },
                };
                f.body = Some(Body {
                    code,
                    retry_after: header("retry-after").and_then(|v| v.parse().ok()),
                    gzip: header("content-encoding").is_some_and(|v| v == "gzip"),
                    framing,
                    data: Vec::new(),
                    line_at: 0,
                });
                *self.report.codes.entry(code).or_default() += 1;
            }
            let f = &mut self.followers[i];
            let Some(b) = f.body.as_mut() else { return };
            let complete = match &mut b.framing {
                Framing::Length(n) => {
                    let take = (*n - b.data.len()).min(f.inbuf.len());
                    b.data.extend(f.inbuf.drain(..take));
                    b.data.len() == *n
                }
                Framing::Chunked { left, crlf, done } => {
                    loop {
                        if *left > 0 {
                            let take = (*left).min(f.inbuf.len());
                            b.data.extend(f.inbuf.drain(..take));
                            *left -= take;
                            if *left > 0 {
                                break;
                            }
                            *crlf = true;
                        }
                        if *crlf {
                            if f.inbuf.len() < 2 {
                                break;
                            }
                            f.inbuf.drain(..2);
                            *crlf = false;
                        }
                        let Some(e) = find(&f.inbuf, b"\r\n") else {
                            break;
                        };
                        let line = String::from_utf8_lossy(&f.inbuf[..e]).to_string();
                        let size = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
                        if size == 0 {
                            if f.inbuf.len() < e + 4 {
                                break;
                            }
                            f.inbuf.drain(..e + 4);
                            *done = true;
                            break;
                        }
                        f.inbuf.drain(..e + 2);
                        *left = size;
                    }
                    *done
                }
            };
            // A watch's lines as they come.
            if f.want == Want::Watch {
                let now = Instant::now();
                let b = f.body.as_mut().expect("body");
                while let Some(nl) = b.data[b.line_at..].iter().position(|c| *c == b'\n') {
                    let line = &b.data[b.line_at..b.line_at + nl];
                    if let Some(rv) = bookmark(line) {
                        if let Some(r) = self.reports.as_mut()
                            && rv > f.rv
                        {
                            r.committed(i, f.rv, rv, &f.events);
                        }
                        f.events.clear();
                        f.rv = f.rv.max(rv);
                    } else if line.starts_with(b"{\"type\":\"ERROR\"") {
                        // 410 Expired (or any error): list again.
                        f.relist = true;
                    } else if let Some((name, round)) = name_and_round(line) {
                        if self.reports.is_some() {
                            f.events.push(line.to_vec());
                        }
                        f.seen.entry((name.clone(), round)).or_insert(now);
                        if self.tracked.as_ref() == Some(&name) {
                            f.served.push(Served {
                                round,
                                at: now,
                                held_back: find(line, b"cmpoll.io/held-back").is_some(),
                            });
                        }
                        let newest = f.newest.entry(name).or_default();
                        if round < *newest {
                            self.report.backwards += 1;
                        }
                        *newest = (*newest).max(round);
                    }
                    b.line_at += nl + 1;
                }
                // A held watch's lines are read: only what follows them is kept.
                b.data.drain(..b.line_at);
                b.line_at = 0;
            }
            if !complete {
                return;
            }
            let b = f.body.take().expect("body");
            self.answered(i, b);
        }
    }

    /// A whole answer.
    fn answered(&mut self, i: usize, b: Body) {
        let now = Instant::now();
        let pause = Duration::from_millis(100 + next_random(&mut self.followers[i].rng) % 50);
        let changes = self.changes.clone();
        let f = &mut self.followers[i];
        if matches!(b.code, 200 | 304) {
            f.failures = 0;
        }
        match (&f.want, b.code) {
            (Want::List, 200) => {
                f.listed_at.get_or_insert(now);
                f.rv = list_rv(&b.data, b.gzip).unwrap_or(0);
                f.events.clear();
                if let Some(r) = self.reports.as_mut() {
                    r.listed(i, f.rv, &b.data, b.gzip, !f.synced);
                }
                if f.synced {
                    // A relist: it holds the newest of every change made so far (about:
                    // one written while the list was on its way may be counted too).
                    self.report.relists += 1;
                    for (name, round) in &changes {
                        f.seen.entry((name.clone(), *round)).or_insert(now);
                        let newest = f.newest.entry(name.clone()).or_default();
                        *newest = (*newest).max(*round);
                    }
                }
                f.relist = false;
                f.synced = true;
                f.want = Want::Waiting;
                f.next_at = Some(now + pause);
            }
            (Want::Waiting, 200) => {
                f.rv = list_rv(&b.data, b.gzip).unwrap_or(f.rv);
                // What changed since: a GET of each object whose newest change it does not
                // hold (the churn says which, as comparing versions tells a follower).
                let mut newest: HashMap<&str, u64> = HashMap::new();
                for (name, round) in &changes {
                    let r = newest.entry(name).or_default();
                    *r = (*r).max(*round);
                }
                f.to_get.clear();
                for (name, round) in newest {
                    if !f.seen.contains_key(&(name.to_string(), round)) {
                        f.to_get.push((name.to_string(), round));
                    }
                }
                f.next_at = Some(now + pause);
            }
            (Want::Get(name, round), 200) => {
                f.seen.entry((name.clone(), *round)).or_insert(now);
                f.next_at = Some(now + pause);
            }
            (_, 200 | 304) => f.next_at = Some(now + pause),
            // Told to wait (429, 503): as `Setup::retry` says.
            (_, code) => {
                let wait = retry_wait(self.setup.retry, f, code, b.retry_after);
                f.next_at = Some(now + wait + pause);
            }
        }
        if f.relist {
            f.want = Want::List;
        }
        if f.closing {
            let at = f.next_at.unwrap_or(now + pause);
            self.lost(i, at);
        }
    }
}

/// How long follower `f`, told `code` (with `Retry-After` `retry_after`), waits before
/// its next poll (its pause after).
fn retry_wait(retry: Retry, f: &mut Follower, code: u16, retry_after: Option<u64>) -> Duration {
    let unit = |f: &mut Follower| (next_random(&mut f.rng) % 1_000_000) as f64 / 1e6;
    let floor = Duration::from_secs(retry_after.unwrap_or(0));
    let backoff = |f: &mut Follower, interval: Duration| {
        // `backoff::Backoff::polls` and `after_failure`, as `cmpoll run` waits.
        let cap = (interval * 10).min(Duration::from_secs(300)).max(interval);
        let base = (interval * (1u32 << f.failures.min(16))).min(cap);
        f.failures += 1;
        base.mul_f64(1.0 + 0.1 * unit(f)).max(floor.min(cap))
    };
    match retry {
        Retry::Fixed => Duration::from_secs(1),
        Retry::Backoff { interval } => backoff(f, interval),
        Retry::Told { interval } => match (code, retry_after) {
            (429, Some(_)) => {
                let cap = (interval * 10).min(Duration::from_secs(300)).max(interval);
                floor.min(cap) + Duration::from_secs_f64(unit(f))
            }
            _ => backoff(f, interval),
        },
    }
}

/// A follower's next random number (xorshift).
fn next_random(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

fn module_index(name: &str) -> usize {
    name.strip_prefix("module-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A list's `metadata.resourceVersion`, from the start of its body (gzipped or not).
fn list_rv(body: &[u8], gzip: bool) -> Option<u64> {
    let head = if gzip {
        let mut d = flate2::read::GzDecoder::new(body);
        let mut out = vec![0u8; 512];
        let n = d.read(&mut out).ok()?;
        out.truncate(n);
        out
    } else {
        body[..body.len().min(512)].to_vec()
    };
    let key = b"\"resourceVersion\":\"";
    let at = find(&head, key)? + key.len();
    let end = head[at..].iter().position(|c| *c == b'"')? + at;
    std::str::from_utf8(&head[at..end]).ok()?.parse().ok()
}

/// A bookmark line's version.
fn bookmark(line: &[u8]) -> Option<u64> {
    if !line.starts_with(b"{\"type\":\"BOOKMARK\"") {
        return None;
    }
    let key = b"\"resourceVersion\":\"";
    let at = find(line, key)? + key.len();
    let end = line[at..].iter().position(|c| *c == b'"')? + at;
    std::str::from_utf8(&line[at..end]).ok()?.parse().ok()
}

/// An event's object name and its data's round (the first 8 digits of its value).
fn name_and_round(line: &[u8]) -> Option<(String, u64)> {
    let key = b"\"name\":\"";
    let at = find(line, key)? + key.len();
    let end = line[at..].iter().position(|c| *c == b'"')? + at;
    let name = String::from_utf8_lossy(&line[at..end]).to_string();
    let data = find(line, b"\"data\":{")?;
    let colon = line[data + 8..].iter().position(|c| *c == b':')? + data + 8;
    let digits = &line[colon + 2..colon + 10];
    let round = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some((name, round))
}

fn raise_files(want: u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    let max = l.maximum.unwrap_or(u64::MAX);
    l.current = Some(want.max(l.current.unwrap_or(0)).min(max));
    let _ = setrlimit(Resource::Nofile, l);
}
