//! An HTTPS server that answers its real clients within a bound whatever other clients do
//! (`cmpoll webhook`: the apiserver's reviews; `cmpoll serve`: a fleet's lists).
//!
//! One thread multiplexes every connection with `poll(2)` over non-blocking sockets and
//! rustls; handlers run on a pool of worker threads, so neither a slow client nor a slow
//! handler holds up the others. Each connection is in one phase at a time, each bounded:
//! reading a request (from accept, or from its first byte after an idle keep-alive, at
//! most `request_deadline` to the last byte of its body: a client that dribbles is cut
//! off with 408), idle between requests (`idle`), being answered by a worker (the
//! handler's own bound), parked until the handler's `Reply::Wait` deadline or a
//! `Handle::notify` (a long poll), and writing the answer (`write_deadline`). When
//! `max_connections` are open, a new connection takes the place of the oldest one that is
//! still reading or idle, so stalled clients cannot keep a well-behaved one out; if every
//! connection is busy being answered, the new one is closed at once. A new request that
//! finds every worker busy and `queue` new requests waiting is answered `busy` at once
//! rather than queued behind them; a parked request asked again is always queued (a
//! thousand followers woken at once are all answered). A parked request keeps its first
//! deadline however often it is asked again.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustls::pki_types::CertificateDer;
use rustls::{ServerConfig, ServerConnection};

use super::http::{self, Answer, Parsed, Request};

/// How the server holds its clients.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections open at once; a new one takes the place of the oldest reading or idle.
    pub max_connections: usize,
    /// From accept (TLS handshake included), or from a request's first byte after an idle
    /// keep-alive, to its last byte.
    pub request_deadline: Duration,
    /// Between two requests of one keep-alive connection.
    pub idle: Duration,
    /// From a complete answer to its last byte on the wire.
    pub write_deadline: Duration,
    /// A request body at most.
    pub max_body: usize,
    /// Threads answering requests.
    pub workers: usize,
    /// Requests waiting for a worker at most; one more is answered `busy` at once.
    pub queue: usize,
    /// What a request gets when the queue is full.
    pub busy: Answer,
    /// What a request gets when its handler panics (the worker goes on).
    pub panicked: Answer,
    /// Counts the handlers that panicked.
    pub panics: prometheus_client::metrics::counter::Counter,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 1024,
            request_deadline: Duration::from_secs(5),
            idle: Duration::from_secs(90),
            write_deadline: Duration::from_secs(10),
            max_body: 1 << 20,
            workers: 4,
            queue: 256,
            busy: Answer::text(503, "too many requests at once; try again\n"),
            panicked: Answer::text(500, "internal error\n"),
            panics: Default::default(),
        }
    }
}

/// Who sent a request.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The client certificate it presented (its leaf), if any.
    pub cert: Option<CertificateDer<'static>>,
}

/// Why a handler is asked (again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The request just arrived.
    First,
    /// It waited (`Reply::Wait`) and `Handle::notify` was called.
    Notified,
    /// It waited until its deadline.
    Expired,
}

/// A handler's reply.
#[derive(Debug)]
pub enum Reply {
    Answer(Answer),
    /// Ask again when notified, or at this deadline at the latest (a long poll).
    Wait(Instant),
}

/// What answers requests. Called on a worker thread.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: &Request, peer: &Peer, wake: Wake) -> Reply;
}

/// A running server: notifies parked requests, stops it.
#[derive(Clone)]
pub struct Handle(Arc<Shared>);

struct Shared {
    stop: AtomicBool,
    /// New requests (`Wake::First`) given to the workers and not yet taken.
    queued: AtomicUsize,
    /// Bumped by `notify`.
    generation: AtomicU64,
    results: Mutex<Vec<Done>>,
    wake: UnixStream,
}

impl Handle {
    /// Asks every parked request again (`Wake::Notified`).
    pub fn notify(&self) {
        self.0.generation.fetch_add(1, Ordering::SeqCst);
        self.0.poke();
    }

    /// Stops the server: its loop ends and every connection closes.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        self.0.poke();
    }
}

impl Shared {
    /// Wakes the loop (one byte is enough: a full pipe already will).
    fn poke(&self) {
        let _ = (&self.wake).write(&[1]);
    }
}

/// A request for a worker.
struct Job {
    conn: u64,
    req: Request,
    peer: Peer,
    wake: Wake,
    /// Its deadline when it was parked before.
    parked_until: Option<Instant>,
}

/// A worker's answer, with the request back (a parked one is asked again).
struct Done {
    conn: u64,
    req: Request,
    reply: Reply,
    parked_until: Option<Instant>,
    wake: Wake,
}

/// The server: a listener, its TLS config, the handler.
pub struct Server {
    listener: TcpListener,
    config: Arc<ServerConfig>,
    limits: Limits,
    shared: Arc<Shared>,
    wake: UnixStream,
    jobs: Sender<Job>,
    conns: Vec<Conn>,
    next_id: u64,
    generation: u64,
}

impl Server {
    /// A server on `listener` with its workers started; `run` serves.
    pub fn new(
        listener: TcpListener,
        config: Arc<ServerConfig>,
        handler: Arc<dyn Handler>,
        limits: Limits,
    ) -> io::Result<(Server, Handle)> {
        listener.set_nonblocking(true)?;
        let mut limits = limits;
        // Never more connections than files may be opened: at the limit, accept would
        // fail and leave the listener ready, refusing every newcomer, good or not.
        let files = raise_open_files();
        let room = usize::try_from(files.saturating_sub(FILES_KEPT)).unwrap_or(usize::MAX);
        if room < limits.max_connections {
            log::info!(
                "https: at most {room} connections at once (the open-file limit is {files})"
            );
            limits.max_connections = room.max(1);
        }
        let (wake, wake_tx) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wake_tx.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            results: Mutex::new(Vec::new()),
            wake: wake_tx,
        });
        let (jobs, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for n in 0..limits.workers.max(1) {
            let (rx, handler, shared) = (rx.clone(), handler.clone(), shared.clone());
            let limits = limits.clone();
            thread::Builder::new()
                .name(format!("https-{n}"))
                .spawn(move || work(&rx, handler.as_ref(), &shared, &limits))?;
        }
        let server = Server {
            listener,
            config,
            limits,
            shared: shared.clone(),
            wake,
            jobs,
            conns: Vec::new(),
            next_id: 0,
            generation: 0,
        };
        Ok((server, Handle(shared)))
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `Handle::stop` (or `stop` is set: a signal's flag).
    pub fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) && !self.shared.stop.load(Ordering::Relaxed) {
            let ready = match self.wait() {
                Ok(r) => r,
                Err(e) => {
                    log::warn!("https: poll failed: {e}; the server stops");
                    return;
                }
            };
            if ready.wake {
                self.drain_wake();
                self.take_results();
                self.wake_parked();
            }
            for (i, flags) in ready.conns.iter().enumerate() {
                if !flags.is_empty() {
                    self.ready(i, *flags);
                }
            }
            self.expire(Instant::now());
            self.conns.retain(|c| !c.done);
            if ready.listener {
                self.accept_all();
            }
        }
    }

    /// Polls the listener, the wake pipe and every connection, until something is ready
    /// or the nearest deadline.
    fn wait(&self) -> io::Result<Ready> {
        let now = Instant::now();
        let nearest = (self.conns.iter())
            .filter_map(Conn::deadline)
            .map(|d| d.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1))
            // A stop flag set by a signal handler is seen this often at least.
            .min(Duration::from_millis(200));
        let mut fds = Vec::with_capacity(self.conns.len() + 2);
        fds.push(PollFd::new(&self.listener, PollFlags::IN));
        fds.push(PollFd::new(&self.wake, PollFlags::IN));
        for c in &self.conns {
            fds.push(PollFd::new(&c.sock, c.interest(self.limits.max_body)));
        }
        let timeout = Timespec::try_from(nearest).unwrap_or_default();
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Ready {
            listener: !fds[0].revents().is_empty(),
            wake: !fds[1].revents().is_empty(),
            conns: fds[2..].iter().map(PollFd::revents).collect(),
        })
    }

    fn drain_wake(&self) {
        let mut buf = [0u8; 256];
        while let Ok(n) = (&self.wake).read(&mut buf) {
            if n < buf.len() {
                break;
            }
        }
    }

    /// Answers, or parks, what the workers finished.
    fn take_results(&mut self) {
        let done = std::mem::take(
            &mut *self
                .shared
                .results
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for d in done {
            let Some(c) = self.conns.iter_mut().find(|c| c.id == d.conn) else {
                continue; // It went away meanwhile.
            };
            match d.reply {
                Reply::Answer(a) => c.answer(&a, d.req.close, &self.limits),
                Reply::Wait(_) if d.wake == Wake::Expired => {
                    // Its time is up: a handler that would wait on is answered for.
                    let late = Answer::text(503, "no answer within the request's wait\n");
                    c.answer(&late, d.req.close, &self.limits);
                }
                Reply::Wait(until) => {
                    let until = d.parked_until.map_or(until, |first| first.min(until));
                    c.state = State::Parked { req: d.req, until };
                }
            }
        }
        // Pipelined requests behind the answers just given.
        for i in 0..self.conns.len() {
            self.next_request(i);
        }
    }

    /// After `notify`: every parked request is asked again.
    fn wake_parked(&mut self) {
        let generation = self.shared.generation.load(Ordering::SeqCst);
        if generation == self.generation {
            return;
        }
        self.generation = generation;
        for i in 0..self.conns.len() {
            if matches!(self.conns[i].state, State::Parked { .. }) {
                self.unpark(i, Wake::Notified);
            }
        }
    }

    fn unpark(&mut self, i: usize, wake: Wake) {
        let state = std::mem::replace(&mut self.conns[i].state, State::Working);
        if let State::Parked { req, until } = state {
            self.dispatch(i, req, wake, Some(until));
        }
    }

    /// A connection's socket is ready.
    fn ready(&mut self, i: usize, flags: PollFlags) {
        let cap = MAX_BUFFERED + self.limits.max_body;
        let limits = &self.limits;
        let c = &mut self.conns[i];
        if flags.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) {
            let before = c.inbuf.len();
            if let Err(e) = c.read(cap) {
                log::debug!("https: {}: {e}", c.peer);
                c.done = true;
                return;
            }
            if c.inbuf.len() > before
                && let State::Reading { started: false } = c.state
            {
                // A request began after an idle keep-alive: its deadline runs from its
                // first byte.
                c.state = State::Reading { started: true };
                c.deadline = Some(Instant::now() + limits.request_deadline);
            }
        }
        if let Err(e) = c.flush() {
            log::debug!("https: {}: {e}", c.peer);
            c.done = true;
            return;
        }
        c.after_write(limits);
        self.next_request(i);
        let c = &mut self.conns[i];
        if c.eof && matches!(c.state, State::Reading { .. } | State::Parked { .. }) {
            // Gone: nothing to answer (a request cut short, a long poll given up).
            c.done = true;
        }
    }

    /// Parses a request waiting in a reading connection's buffer and hands it on.
    fn next_request(&mut self, i: usize) {
        let c = &mut self.conns[i];
        if !matches!(c.state, State::Reading { .. }) || c.inbuf.is_empty() || c.tls.is_handshaking()
        {
            return;
        }
        match http::parse(&c.inbuf, self.limits.max_body) {
            Parsed::Partial => {}
            Parsed::Bad(a) => c.answer(&a, true, &self.limits),
            Parsed::Complete(req, n) => {
                c.inbuf.drain(..n);
                self.dispatch(i, req, Wake::First, None);
            }
        }
    }

    /// Hands a request to the workers, or answers a new one `busy` at once when they are
    /// all taken and `queue` new requests wait.
    fn dispatch(&mut self, i: usize, req: Request, wake: Wake, parked_until: Option<Instant>) {
        let c = &mut self.conns[i];
        let peer = Peer {
            addr: c.peer,
            cert: (c.tls.peer_certificates())
                .and_then(|certs| certs.first())
                .map(|c| c.clone().into_owned()),
        };
        let close = req.close;
        let first = wake == Wake::First;
        if first && self.shared.queued.load(Ordering::SeqCst) >= self.limits.queue {
            c.answer(&self.limits.busy, close, &self.limits);
            return;
        }
        let job = Job {
            conn: c.id,
            req,
            peer,
            wake,
            parked_until,
        };
        if first {
            self.shared.queued.fetch_add(1, Ordering::SeqCst);
        }
        match self.jobs.send(job) {
            Ok(()) => {
                c.state = State::Working;
                c.deadline = None;
            }
            Err(_) => {
                if first {
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                }
                c.answer(&self.limits.busy, close, &self.limits);
            }
        }
    }

    /// Past their deadline: a request too slow (408), an idle keep-alive, a write that
    /// does not get out; a parked request at its deadline is asked again.
    fn expire(&mut self, now: Instant) {
        for i in 0..self.conns.len() {
            let c = &mut self.conns[i];
            let late = c.deadline.is_some_and(|d| d <= now);
            match &c.state {
                State::Parked { until, .. } if *until <= now => self.unpark(i, Wake::Expired),
                State::Reading { started } if late => {
                    let (started, handshaking) = (*started, c.tls.is_handshaking());
                    if started && !handshaking && !c.inbuf.is_empty() {
                        let slow = Answer::text(408, "request too slow\n");
                        c.answer(&slow, true, &self.limits);
                        let _ = c.flush();
                    }
                    c.done = true;
                }
                State::Writing if late => c.done = true,
                _ => {}
            }
        }
    }

    /// Accepts every waiting connection; at capacity, each takes the place of the oldest
    /// one still reading or idle, or is closed at once when there is none.
    fn accept_all(&mut self) {
        loop {
            let (sock, peer) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock: all taken. Anything else (EMFILE…): again at the next wake.
                Err(_) => return,
            };
            if self.conns.len() >= self.limits.max_connections {
                let oldest = (self.conns.iter().enumerate())
                    .filter(|(_, c)| matches!(c.state, State::Reading { .. }))
                    .min_by_key(|(_, c)| c.since)
                    .map(|(i, _)| i);
                match oldest {
                    Some(i) => {
                        log::debug!(
                            "https: {} connections: dropping {}'s",
                            self.conns.len(),
                            self.conns[i].peer
                        );
                        self.conns.swap_remove(i);
                    }
                    None => {
                        log::debug!("https: every connection is busy: closing {peer}'s");
                        continue;
                    }
                }
            }
            if sock.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = sock.set_nodelay(true);
            let Ok(mut tls) = ServerConnection::new(self.config.clone()) else {
                continue;
            };
            tls.set_buffer_limit(None);
            let now = Instant::now();
            self.next_id += 1;
            self.conns.push(Conn {
                id: self.next_id,
                sock,
                tls,
                peer,
                // Its deadline runs from accept: the handshake and the first request.
                state: State::Reading { started: true },
                inbuf: Vec::new(),
                deadline: Some(now + self.limits.request_deadline),
                since: now,
                close: false,
                eof: false,
                done: false,
            });
        }
    }
}

/// Bytes buffered for a connection beyond a body at most (a head, and the next request's
/// start).
const MAX_BUFFERED: usize = 2 * http::MAX_HEAD;

/// What `poll` found ready.
struct Ready {
    listener: bool,
    wake: bool,
    conns: Vec<PollFlags>,
}

/// A worker: takes jobs until the server is gone. A handler that panics costs its request
/// a 500, never the worker: whatever a client sends, the pool stays whole.
fn work(rx: &Mutex<Receiver<Job>>, handler: &dyn Handler, shared: &Shared, limits: &Limits) {
    loop {
        let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(job) = job else { return };
        if job.wake == Wake::First {
            shared.queued.fetch_sub(1, Ordering::SeqCst);
        }
        let asked = std::panic::AssertUnwindSafe(|| handler.handle(&job.req, &job.peer, job.wake));
        let reply = std::panic::catch_unwind(asked).unwrap_or_else(|_| {
            limits.panics.inc();
            log::error!(
                "https: the answer to {} {} panicked",
                job.req.method,
                job.req.path
            );
            Reply::Answer(limits.panicked.clone())
        });
        shared
            .results
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Done {
                conn: job.conn,
                req: job.req,
                reply,
                parked_until: job.parked_until,
                wake: job.wake,
            });
        shared.poke();
    }
}

/// One client connection.
struct Conn {
    id: u64,
    sock: TcpStream,
    tls: ServerConnection,
    peer: SocketAddr,
    state: State,
    /// Plaintext received and not yet parsed.
    inbuf: Vec<u8>,
    /// When the current phase ends (`None`: a worker has it).
    deadline: Option<Instant>,
    /// Accepted, or last idle, at: the oldest makes room first.
    since: Instant,
    /// Close once the answer is out.
    close: bool,
    /// The client closed its side.
    eof: bool,
    done: bool,
}

#[derive(Debug)]
enum State {
    /// Handshaking, reading a request, or idle (`started`: a request's first byte came).
    Reading { started: bool },
    /// A worker has the request.
    Working,
    /// The handler asked to be asked again (a long poll).
    Parked { req: Request, until: Instant },
    /// The answer is going out.
    Writing,
}

impl Conn {
    /// The nearest moment something must happen to it.
    fn deadline(&self) -> Option<Instant> {
        match &self.state {
            State::Parked { until, .. } => Some(*until),
            _ => self.deadline,
        }
    }

    /// What to wait for: bytes to read while reading (or parked: a client that goes
    /// away), and room to write while rustls has bytes to send.
    fn interest(&self, max_body: usize) -> PollFlags {
        let mut want = PollFlags::empty();
        let reading = matches!(self.state, State::Reading { .. } | State::Parked { .. });
        if reading && self.inbuf.len() < MAX_BUFFERED + max_body && !self.eof {
            want |= PollFlags::IN;
        }
        if self.tls.wants_write() {
            want |= PollFlags::OUT;
        }
        want
    }

    /// Reads TLS records and their plaintext, up to `cap` buffered bytes.
    fn read(&mut self, cap: usize) -> io::Result<()> {
        while self.inbuf.len() < cap && !self.eof {
            match self.tls.read_tls(&mut self.sock) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let state = match self.tls.process_new_packets() {
                Ok(s) => s,
                Err(e) => {
                    // Tell the client why (an alert), then close.
                    let _ = self.tls.write_tls(&mut self.sock);
                    return Err(io::Error::other(e));
                }
            };
            let n = state.plaintext_bytes_to_read();
            if n > 0 {
                let at = self.inbuf.len();
                self.inbuf.resize(at + n, 0);
                let got = self.tls.reader().read(&mut self.inbuf[at..]).unwrap_or(0);
                self.inbuf.truncate(at + got);
            }
            if state.peer_has_closed() {
                self.eof = true;
            }
        }
        Ok(())
    }

    /// Sends what rustls holds, as far as the socket takes it.
    fn flush(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Queues `a` (closing after it if `close`) and starts writing.
    fn answer(&mut self, a: &Answer, close: bool, limits: &Limits) {
        self.close |= close;
        if self.tls.writer().write_all(&a.encode(self.close)).is_err() {
            self.done = true;
            return;
        }
        if self.close {
            self.tls.send_close_notify();
        }
        self.state = State::Writing;
        self.deadline = Some(Instant::now() + limits.write_deadline);
        if self.flush().is_err() {
            self.done = true;
            return;
        }
        self.after_write(limits);
    }

    /// Once an answer is all out: closed, or idle for the next request.
    fn after_write(&mut self, limits: &Limits) {
        if !matches!(self.state, State::Writing) || self.tls.wants_write() {
            return;
        }
        if self.close {
            self.done = true;
            return;
        }
        let now = Instant::now();
        self.state = State::Reading { started: false };
        self.since = now;
        self.deadline = Some(now + limits.idle);
    }
}

/// Open files kept for what is not a connection: the listener, the wake pipe, the
/// apiserver's connections, files read, the workers'.
const FILES_KEPT: u64 = 64;

/// Lifts the soft limit on open files to the hard one, as Go's runtime does: a server
/// holding a fleet needs more than the usual 1,024. The soft limit now (unlimited: the
/// largest number).
fn raise_open_files() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}
