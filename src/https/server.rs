//! The one HTTP server of the binary (`cmpoll serve` and `cmpoll webhook` over HTTPS,
//! `--listen` of `cmpoll run` in plain HTTP), which answers its real clients within a
//! bound whatever other clients do.
//!
//! One thread holds every connection with edge-triggered `epoll(7)` (each socket is
//! registered once; a wake-up costs only the sockets that are ready, and an idle fleet
//! costs nothing but its timers, kept in a heap). Each connection is a state machine of
//! its own (`conn.rs`); handlers run on lanes of workers (`lanes.rs`); streamed answers
//! (watches) are pulled on this thread, so ten thousand watchers need no worker each.
//!
//! TLS handshakes are worked out by workers of their own (`handshakes.rs`): this thread
//! only reads and writes their bytes, so a flood of ClientHellos never holds up the
//! clients it has.
//!
//! The loop's parts are types of their own: `Door` (`server/door.rs`: the listener, and
//! a connection accepted made ready, TLS or plain), `Table` (`server/table.rs`: the
//! connections by key), `Timers` (`server/timers.rs`: deadlines, and a drain's moments),
//! `Workers` (`server/workers.rs`: the lanes, the handler asked inline, the handshakes'
//! workers), `Shared` (`server/handle.rs`: what a `Handle` asked), `Shares`
//! (`server/shares.rs`) and `Limits` (`server/limits.rs`). This file ties them: who gets
//! in, what each event does to a connection, and what follows.
//!
//! Room is kept for the well-behaved (`server/shares.rs` counts who holds what): at most
//! `max_connections` are open (never more than files may be opened); a new connection
//! takes the place of the token-less one (handshaking, reading, refused) silent for
//! longest (a stalled handshake before a client in the middle of its own), else of the
//! idle one of an identity silent for longest, else of the oldest held request (parked,
//! streaming, or written for it) of the identity that holds the most (answered early: a
//! long poll's 304, a watch's end; an answer being written is cut off), else it is closed
//! at once. No identity holds more than `max_held` held requests: one more lets its oldest
//! go. Memory is bounded in bytes too: what one identity's connections hold beyond its
//! largest one (`max_pinned`), and what the token-less connections hold together
//! (`max_loose`); past either, the oldest (the silent for longest) of them is let go.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::event::{EventfdFlags, Timespec, eventfd};
use rustls::ServerConfig;

use self::door::Door;
pub use self::handle::Handle;
use self::handle::Shared;
pub use self::limits::Limits;
use self::shares::{Counted, Shares};
use self::table::Table;
use self::timers::Timers;
use self::workers::Workers;
pub use super::conn::{Bodies, Post};
use super::conn::{Bounds, Conn, Dispatch, Evict};
pub use super::handler::{Call, Handler, Holder, Next, Peer, Pull, Reply, Stream, Wake};
pub use super::handshakes::Sizes;
use super::handshakes::{Step, Stepped};
use super::lanes::{Done, Job, Results};
use super::transport::{Io, Transport};

/// One connection in the server's table.
struct Entry {
    conn: Conn<Io>,
    addr: SocketAddr,
    /// The deadline its timer is set for.
    armed: Option<Instant>,
    /// How it is counted now (`shares.rs`).
    counted: Option<Counted>,
    /// Its client certificate, if any, was looked at (its owner, once the handshake is
    /// over).
    looked: bool,
    /// Asked to make room: it closes once its answer is out.
    leaving: bool,
}

const LISTENER: u64 = u64::MAX;
const WAKE: u64 = u64::MAX - 1;

/// The server: its door (a listener, TLS or plain HTTP), its workers (the handler's and
/// the handshakes'), its connections and their timers, what each identity holds.
pub struct Server {
    door: Door,
    limits: Limits,
    bounds: Bounds,
    epoll: std::os::fd::OwnedFd,
    shared: Arc<Shared>,
    workers: Workers,
    table: Table<Entry>,
    timers: Timers,
    shares: Shares,
    /// Connections asked to make room and not yet gone.
    leaving: usize,
    /// The last `Shared::generation` seen.
    generation: u64,
}

impl Server {
    /// A server on `listener` with its workers started; `run` serves.
    pub fn new(
        listener: TcpListener,
        config: Option<Arc<ServerConfig>>,
        handler: Arc<dyn Handler>,
        limits: Limits,
    ) -> io::Result<(Server, Handle)> {
        let door = Door::open(listener, config)?;
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
        let wake = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        let results = Arc::new(Results::new(wake));
        let shared = Shared::new(results.clone());
        let workers = Workers::start(&limits, handler, &results, door.tls())?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &epoll,
            door.listener(),
            EventData::new_u64(LISTENER),
            EventFlags::IN,
        )?;
        epoll::add(
            &epoll,
            results.fd(),
            EventData::new_u64(WAKE),
            EventFlags::IN | EventFlags::ET,
        )?;
        let server = Server {
            door,
            bounds: limits.bounds(),
            limits,
            epoll,
            shared: shared.clone(),
            workers,
            table: Table::new(),
            timers: Timers::new(),
            shares: Shares::default(),
            leaving: 0,
            generation: 0,
        };
        Ok((server, Handle::new(shared)))
    }

    /// The address it listens on.
    #[cfg(test)]
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.door.listener().local_addr()
    }

    /// Serves until `Handle::stop` (or `stop` is set: a signal's flag).
    pub fn run(mut self, stop: &AtomicBool) {
        let mut events = Vec::with_capacity(1024);
        while !stop.load(Ordering::Relaxed) && !self.shared.stopped() {
            let now = Instant::now();
            let nearest = (self.timers.nearest())
                .map(|t| t.saturating_duration_since(now))
                .unwrap_or(Duration::from_secs(1))
                // A stop flag set by a signal handler is seen this often at least.
                .min(Duration::from_millis(200));
            let timeout = Timespec::try_from(nearest).unwrap_or_default();
            events.clear();
            match epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                Some(&timeout),
            ) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    log::warn!("https: epoll failed: {e}; the server stops");
                    return;
                }
            }
            let mut accept = false;
            for ev in &events {
                match ev.data.u64() {
                    LISTENER => accept = true,
                    WAKE => self.woken(),
                    key => self.ready(key),
                }
            }
            self.fire(Instant::now());
            if accept {
                self.accept_all();
            }
        }
        for e in self.table.values_mut() {
            e.conn.drop_now();
        }
    }

    /// The wake fd: workers' answers, a notify, a stop.
    fn woken(&mut self) {
        let mut buf = [0u8; 8];
        while rustix::io::read(self.shared.results().fd(), &mut buf).is_ok() {}
        let now = Instant::now();
        for d in self.shared.results().take() {
            self.answered(d, now);
        }
        for s in self.workers.stepped() {
            self.stepped(s);
        }
        if let Some(window) = (self.shared.drain_asked()).filter(|_| !self.timers.draining()) {
            self.start_draining(window, now);
        }
        let generation = self.shared.generation();
        if generation != self.generation {
            self.generation = generation;
            for key in self.shares.all_held() {
                self.with(key, |conn, b, now| conn.notify(now, b), now);
            }
        }
    }

    fn answered(&mut self, d: Done, now: Instant) {
        let Done {
            key,
            dispatch,
            reply,
        } = d;
        self.with(
            key,
            move |conn, b, now| conn.reply(dispatch, reply, now, b),
            now,
        );
    }

    /// A connection's socket is ready.
    fn ready(&mut self, key: u64) {
        self.with(key, |conn, b, now| conn.ready(now, b), Instant::now());
    }

    /// A handshake step back from its worker: the connection goes on (its flight goes
    /// out, what came meanwhile is read), or, refused, says why (an alert) and closes.
    fn stepped(&mut self, s: Stepped) {
        let Stepped { key, tls, result } = s;
        let Some(e) = self.table.get_mut(key) else {
            return;
        };
        let Io::Tls(t) = &mut e.conn.io else {
            return;
        };
        t.back(tls);
        match result {
            Some(Ok(())) => self.ready(key),
            Some(Err(err)) => {
                log::debug!("https: {}: TLS handshake: {err}", e.addr);
                t.alert();
                self.drop_now(key);
            }
            None => self.drop_now(key),
        }
    }

    /// A connection whose handshake bytes wait to be processed goes to a handshake
    /// worker; one given up for room (the newcomer itself, or the newest of the address
    /// with the most waiting) is closed.
    fn offload(&mut self, key: u64, now: Instant) {
        if !self.workers.handshaking() {
            return;
        }
        let Some(e) = self.table.get_mut(key).filter(|e| !e.conn.done()) else {
            return;
        };
        let (from, until) = (e.addr.ip(), e.conn.deadline().unwrap_or(now));
        let Io::Tls(t) = &mut e.conn.io else {
            return;
        };
        let Some(tls) = t.handshake_step() else {
            return;
        };
        let step = Step {
            key,
            from,
            tls,
            until,
        };
        if let Some(s) = self.workers.handshake(step) {
            log::debug!("https: too many handshakes waiting: closing one");
            self.limits.counts.turned_away("handshakes");
            self.drop_now(s.key);
        }
    }

    /// Closes a connection now, without a word.
    fn drop_now(&mut self, key: u64) {
        if let Some(e) = self.table.get_mut(key) {
            e.conn.drop_now();
            self.remove(key);
        }
    }

    /// From now on every answer closes its connection, and each connection is let go at
    /// a moment of its own within `window`.
    fn start_draining(&mut self, window: Duration, now: Instant) {
        self.bounds.keep_alive = false;
        let keys = self.table.iter().map(|(key, _)| key);
        self.timers.drain(window, keys, now);
        log::info!(
            "https: letting {} connections go over {}",
            self.table.len(),
            humantime::format_duration(window)
        );
    }

    /// Timers that are due.
    fn fire(&mut self, now: Instant) {
        for key in self.timers.drained(now) {
            self.evict(key, now, Evict::Politely);
        }
        while let Some((t, key)) = self.timers.due(now) {
            if let Some(e) = self.table.get_mut(key)
                && e.armed == Some(t)
            {
                e.armed = None;
                self.with(key, |conn, b, now| conn.tick(now, b), now);
            }
        }
        // Stale timers (deadlines moved on) are dropped when there are many.
        let table = &self.table;
        self.timers.prune(table.len(), || {
            (table.iter())
                .filter_map(|(key, e)| Some((e.armed?, key)))
                .collect()
        });
    }

    /// Does `f` to a connection, then settles what follows: its request to the workers,
    /// its timer, its holder, its end.
    fn with(
        &mut self,
        key: u64,
        f: impl FnOnce(&mut Conn<Io>, &Bounds, Instant) -> Option<Dispatch>,
        now: Instant,
    ) {
        let bounds = self.bounds.clone();
        let Some(e) = self.table.get_mut(key) else {
            return;
        };
        let mut next = f(&mut e.conn, &bounds, now);
        while let Some(d) = next.take() {
            let Some(e) = self.table.get_mut(key) else {
                return;
            };
            let peer = Peer {
                addr: e.addr,
                cert: e.conn.io.peer_cert(),
            };
            if self.limits.inline && d.lane == 0 {
                let reply = self.workers.inline(&d, &peer, &self.limits);
                let Some(e) = self.table.get_mut(key) else {
                    return;
                };
                next = e.conn.reply(d, reply, now, &bounds);
                continue;
            }
            let job = Job {
                key,
                peer,
                dispatch: d,
            };
            if let Err(job) = self.workers.give(job) {
                let busy = self.workers.busy(job.dispatch.lane);
                self.limits.counts.answered(busy.status);
                self.limits.counts.turned_away("queue");
                let Some(e) = self.table.get_mut(key) else {
                    return;
                };
                next = e
                    .conn
                    .reply(job.dispatch, Reply::Answer(busy), now, &bounds);
            }
        }
        self.offload(key, now);
        self.settle(key, now);
    }

    /// After a connection moved: its timer, how it is counted, its end; then the bounds
    /// its share may have passed.
    fn settle(&mut self, key: u64, now: Instant) {
        let Some(e) = self.table.get_mut(key) else {
            return;
        };
        if e.conn.done() {
            self.remove(key);
            return;
        }
        let deadline = e.conn.deadline();
        if deadline != e.armed {
            e.armed = deadline;
            if let Some(d) = deadline {
                self.timers.set(d, key);
            }
        }
        if !e.looked && !e.conn.io.handshaking() {
            // A client certificate the TLS layer verified names who this is.
            e.looked = true;
            if let Some(cert) = e.conn.io.peer_cert() {
                e.conn.owner = e.conn.owner.or(Some(Holder::certificate(&cert)));
            }
        }
        let counted = Counted::of(&e.conn);
        if Some(counted) == e.counted {
            return;
        }
        let before = e.counted.replace(counted);
        self.shares.recount(key, before.as_ref(), Some(&counted));
        let held_before = before.is_some_and(|b| matches!(b.place, shares::Place::Held(_)));
        if let (Some(h), shares::Place::Held(_), false) =
            (counted.owner, counted.place, held_before)
            && self.shares.held(h) > self.limits.max_held
        {
            // One identity holds too many: its oldest is let go now.
            if let Some(k) = self.shares.oldest_held(h) {
                self.limits.counts.turned_away("held");
                self.evict(k, now, Evict::Now);
            }
        }
        let grew = before.is_none_or(|b| {
            b.owner != counted.owner || b.footprint.bytes() < counted.footprint.bytes()
        });
        if grew {
            self.bound(counted.owner, now);
        }
    }

    /// Lets connections of `owner`'s share go, oldest first, while it holds more than its
    /// bound in bytes.
    fn bound(&mut self, owner: Option<Holder>, now: Instant) {
        let mut last = None;
        for _ in 0..1024 {
            let over = match owner {
                None if self.shares.loose.bytes() > self.limits.max_loose => {
                    self.shares.oldest_loose()
                }
                None => None,
                Some(h) => self.shares.over(h, self.limits.max_pinned, |k| {
                    (self.table.get(k))
                        .and_then(|e| e.counted)
                        .map_or(0, |c| c.footprint.bytes())
                }),
            };
            let Some(key) = over else {
                return;
            };
            log::debug!("https: a share over its bytes: letting its oldest connection go");
            self.limits.counts.turned_away("memory");
            self.evict(key, now, Evict::Now);
            if last == Some(key) {
                // It cannot go now (it waits for a worker's answer).
                return;
            }
            last = Some(key);
        }
    }

    /// Asks a connection to go (`how`), or, one with a worker, to close once answered.
    fn evict(&mut self, key: u64, now: Instant, how: Evict) {
        if let Some(e) = self.table.get_mut(key)
            && !e.leaving
        {
            e.leaving = true;
            self.leaving += 1;
        }
        self.with(key, |conn, b, now| conn.evict(now, b, how), now);
    }

    fn remove(&mut self, key: u64) {
        let Some(e) = self.table.remove(key) else {
            return;
        };
        let _ = epoll::delete(&self.epoll, e.conn.io.sock());
        self.shares.recount(key, e.counted.as_ref(), None);
        self.leaving -= usize::from(e.leaving);
    }

    /// Accepts waiting connections (a bounded number a round, so that a storm of new ones
    /// does not hold up the others).
    fn accept_all(&mut self) {
        for _ in 0..512 {
            let (sock, addr) = match self.door.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock: all taken. Anything else (EMFILE…): again at the next wake.
                Err(_) => return,
            };
            let now = Instant::now();
            if self.table.len() >= self.limits.max_connections && !self.make_room(now) {
                log::debug!("https: every connection is busy: closing {addr}'s");
                self.limits.counts.turned_away("connections");
                continue;
            }
            match self.admit(sock, addr, now) {
                Ok(()) => self.limits.counts.accepted(),
                Err(e) => log::debug!("https: {addr}: {e}"),
            }
        }
    }

    /// Frees a place: the least valuable connection (`Shares::room`). `false` when nothing
    /// can go.
    fn make_room(&mut self, now: Instant) -> bool {
        if self.leaving >= MAX_LEAVING {
            return false;
        }
        let Some(key) = self.shares.room() else {
            return false;
        };
        log::debug!("https: {} connections: one gives way", self.table.len());
        self.limits.counts.turned_away("evicted");
        self.evict(key, now, Evict::Now);
        // It leaves once answered: the newcomer may come in meanwhile (within
        // `FILES_KEPT`).
        true
    }

    /// A connection accepted comes in: registered once with epoll, its timer set.
    fn admit(&mut self, sock: TcpStream, addr: SocketAddr, now: Instant) -> io::Result<()> {
        let io = self.door.io(sock)?;
        let epoll = &self.epoll;
        let bounds = &self.bounds;
        let key = self.table.insert(|key| {
            epoll::add(
                epoll,
                io.sock(),
                EventData::new_u64(key),
                EventFlags::IN | EventFlags::OUT | EventFlags::RDHUP | EventFlags::ET,
            )?;
            Ok(Entry {
                conn: Conn::new(io, now, bounds),
                addr,
                armed: None,
                counted: None,
                looked: false,
                leaving: false,
            })
        })?;
        self.timers.admitted(key, now);
        self.settle(key, now);
        Ok(())
    }
}

/// Connections asked to make room and not yet gone, at most (each is over the cap until
/// its answer is out).
const MAX_LEAVING: usize = 32;

/// Open files kept for what is not a connection: the listener, the wake and epoll fds,
/// the apiserver's connections, files read, the workers' (and connections leaving).
const FILES_KEPT: u64 = 64 + MAX_LEAVING as u64;

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

mod door;
mod handle;
mod limits;
mod shares;
mod table;
#[cfg(test)]
mod tests;
mod timers;
mod workers;
