//! One client connection as a state machine, apart from its socket (hyper's
//! `proto/h1/conn.rs` is the model): the server's loop tells it what happened — bytes can
//! be read or written, a worker answered, the hub has news, a deadline passed, room is
//! needed — and it says what to do next: at most one request to hand to a worker. All its
//! I/O goes through a `Transport`, so the unit tests below drive it over a fake.
//!
//! A connection is in one phase at a time, each bounded: reading a request (from accept,
//! or from its first byte after an idle keep-alive, at most `request_deadline` to the last
//! byte of its body: a client that dribbles is cut off with 408), idle between requests
//! (`idle`), with a worker (the handler's own bound), parked until notified or its
//! deadline (a long poll), streaming (a watch: chunks pulled from its `Stream` while what
//! it has queued is under `WATERMARK`, so a watcher that does not read holds no more than
//! that and is cut off once it has not taken a byte for `write_deadline`), and writing an
//! answer (`write_deadline`). A parked or streaming connection, or one writing an answer
//! for an identity (`Reply::Held`), is held for that identity (`Holder`), which the server
//! bounds; the connection is the identity's (`owner`) from then on.
//!
//! A body is read only when the server's rule (`Bodies`) says the request needs it and
//! the server's `Budget` has room for it (else 503); any other body is never kept: the
//! request is answered without it (a 401, a 405), what arrives of it is dropped, and the
//! connection closes after the answer. What it received is its `Inbox` (`conn/inbox.rs`:
//! the receive buffer, which gives its room back once a request is out of it), what it
//! queued for the client its `Outbox` (`conn/outbox.rs`), and what it holds is counted
//! (`footprint`).

use std::time::{Duration, Instant};

pub use self::bounds::{Bodies, Bounds, Post};
use self::inbox::{Inbox, RECORD};
use self::outbox::{Bytes, Outbox};
use super::handler::{Holder, Next, Reply, Stream, Wake};
use super::http::{self, Answer, Body, Request};
use super::transport::Transport;

/// What a stream may have queued, not yet taken by the transport, before it is asked for
/// more.
pub const WATERMARK: usize = 64 * 1024;

/// How long a connection whose body was not read is drained after its answer before it
/// closes (a lingering close: closed at once with bytes unread, the kernel would reset it,
/// and the client could lose the answer).
const LINGER: Duration = Duration::from_millis(500);

/// What a connection costs besides its buffers, as the server counts it: its state and its
/// transport's at rest (a TLS connection idle after a request: 8.5 KiB measured) and a TLS
/// record partly received.
pub const CONN_COST: usize = 16 * 1024;

/// The most a handshake in progress may hold of what the client sent: a handshake message
/// rustls joins across records (64 KiB at most) and the record it is joining.
const HANDSHAKE_HELD: usize = 64 * 1024 + RECORD;

/// What a connection holds in memory, as the server counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes of its own: `CONN_COST`, its receive buffer (less a body the `Budget` counts)
    /// and the record what it holds came in, what it queued (heads, chunks) and what its
    /// transport holds for the wire.
    pub own: usize,
    /// The largest shared body it keeps alive (an answer's, a watch event's): its address
    /// and length, so that one kept alive by several connections of an identity is
    /// counted once for it.
    pub body: Option<(usize, usize)>,
}

impl Footprint {
    /// All it holds, its body counted whole.
    pub fn bytes(&self) -> usize {
        self.own + self.body.map_or(0, |(_, n)| n)
    }
}

/// A request to hand to a worker.
#[derive(Debug)]
pub struct Dispatch {
    pub req: Request,
    pub wake: Wake,
    pub lane: usize,
    /// When it was parked first, and its first deadline (kept however often it is asked
    /// again).
    pub parked: Option<Parked>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parked {
    pub at: Instant,
    pub until: Instant,
}

/// How a connection is let go (`Conn::evict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evict {
    /// A drain: an answer being written is finished first.
    Politely,
    /// Its place or its memory is needed now.
    Now,
}

/// What a connection is doing, as the server sees it (who may make room, and for whom).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Handshaking, reading a request, or idle: the first to make room.
    Reading,
    /// With a worker.
    Working,
    /// Writing an answer no identity holds.
    Writing,
    /// Parked, streaming, or writing an answer for a holder, since then.
    Held(Holder, Instant),
    Done,
}

enum Phase {
    Reading {
        started: bool,
    },
    Working,
    Parked {
        req: Request,
        parked: Parked,
        holder: Holder,
    },
    Writing,
    Streaming {
        stream: Box<dyn Stream>,
        holder: Holder,
        at: Instant,
        /// Ask it again at this moment (`None`: at a notify).
        due: Option<Instant>,
    },
    /// Answered, closing: what still arrives of a body not read is dropped until the
    /// client closes or `LINGER` passes; `shut` once the end of our side is sent.
    Lingering {
        shut: bool,
    },
    Done,
}

/// What `progress` does next.
enum Step {
    Written,
    Shut,
    Pull,
    Parse,
    Stop,
}

/// One client connection.
pub struct Conn<T> {
    pub io: T,
    phase: Phase,
    /// What it received, not yet parsed.
    inbox: Inbox,
    /// What it queued for the client.
    outbox: Outbox,
    /// Close once what is queued is out.
    close: bool,
    /// When the phase ends (reading, idle, writing).
    deadline: Option<Instant>,
    /// Accepted, or last heard from (its socket was ready: bytes came, or the client took
    /// some), or last idle, at: of the connections that may give way, the one silent for
    /// longest goes first (a client that stalled, not one in the middle of its handshake).
    pub since: Instant,
    /// The identity whose connection this is (the last to hold it), if any.
    pub owner: Option<Holder>,
    /// The answer being written is held for this holder, since then.
    writing_for: Option<(Holder, Instant)>,
}

impl<T: Transport> Conn<T> {
    /// A connection just accepted: its deadline runs from now (the handshake and the
    /// first request).
    pub fn new(io: T, now: Instant, b: &Bounds) -> Conn<T> {
        Conn {
            io,
            phase: Phase::Reading { started: true },
            inbox: Inbox::default(),
            outbox: Outbox::new(b.write_deadline),
            close: false,
            deadline: Some(now + b.request_deadline),
            since: now,
            owner: None,
            writing_for: None,
        }
    }

    pub fn kind(&self) -> Kind {
        match &self.phase {
            Phase::Reading { .. } => Kind::Reading,
            Phase::Working => Kind::Working,
            Phase::Writing => match self.writing_for {
                Some((h, at)) => Kind::Held(h, at),
                None => Kind::Writing,
            },
            Phase::Lingering { .. } => Kind::Writing,
            Phase::Parked { holder, parked, .. } => Kind::Held(*holder, parked.at),
            Phase::Streaming { holder, at, .. } => Kind::Held(*holder, *at),
            Phase::Done => Kind::Done,
        }
    }

    /// What it holds in memory now.
    pub fn footprint(&self) -> Footprint {
        let (queued, body) = self.outbox.footprint();
        let own =
            CONN_COST + self.io.handshake_bytes().min(HANDSHAKE_HELD) + self.inbox.held() + queued;
        Footprint { own, body }
    }

    pub fn done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// The nearest moment something must happen to it.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Reading { .. } | Phase::Writing | Phase::Lingering { .. } => self.deadline,
            Phase::Parked { parked, .. } => Some(parked.until),
            // A stream whose queue is full is asked again once it drains, not by a timer.
            Phase::Streaming { due, .. } => [
                due.filter(|_| self.outbox.queued() < WATERMARK),
                self.outbox.stall_deadline(),
            ]
            .into_iter()
            .flatten()
            .min(),
            Phase::Working | Phase::Done => None,
        }
    }

    /// The socket can be read or written: does what it can.
    pub fn ready(&mut self, now: Instant, b: &Bounds) -> Option<Dispatch> {
        self.since = now;
        self.read(now, b);
        self.progress(now, b)
    }

    /// A worker's reply to the request it was given.
    pub fn reply(
        &mut self,
        d: Dispatch,
        reply: Reply,
        now: Instant,
        b: &Bounds,
    ) -> Option<Dispatch> {
        if !matches!(self.phase, Phase::Working) {
            return None;
        }
        let Dispatch {
            req, wake, parked, ..
        } = d;
        // A HEAD's answer is its head alone, its Content-Length included (RFC 9110 §9.3.2):
        // a body would be read as the next answer on the connection.
        let content = req.method != "HEAD";
        match reply {
            Reply::Answer(a) => self.answer(&a, (req.close, content), now, b),
            Reply::Held { answer, holder } => {
                self.owner = Some(holder);
                self.answer(&answer, (req.close, content), now, b);
                self.writing_for = Some((holder, now));
            }
            Reply::Wait { .. } if wake == Wake::Expired => {
                // Its time is up: a handler that would wait on is answered for.
                let late = Answer::text(503, "no answer within the request's wait\n");
                self.answer(&late, (req.close, content), now, b);
            }
            Reply::Wait { until, holder } => {
                let parked = match parked {
                    Some(p) => Parked {
                        at: p.at,
                        until: p.until.min(until),
                    },
                    None => Parked { at: now, until },
                };
                self.owner = Some(holder);
                self.phase = Phase::Parked {
                    req,
                    parked,
                    holder,
                };
            }
            Reply::Stream {
                head,
                stream,
                holder,
            } => {
                self.close |= req.close;
                self.owner = Some(holder);
                self.outbox.queue(Bytes::Own(head.stream_head(self.close)));
                self.deadline = None;
                self.phase = Phase::Streaming {
                    stream,
                    holder,
                    at: now,
                    due: Some(now),
                };
            }
            Reply::Lane(lane) => {
                return Some(Dispatch {
                    req,
                    wake,
                    lane,
                    parked,
                });
            }
        }
        self.progress(now, b)
    }

    /// News (`Handle::notify`): a parked request is asked again, a stream is pulled.
    pub fn notify(&mut self, now: Instant, b: &Bounds) -> Option<Dispatch> {
        match &mut self.phase {
            Phase::Parked { .. } => self.unpark(Wake::Notified),
            Phase::Streaming { due, .. } => {
                *due = Some(now);
                self.progress(now, b)
            }
            _ => None,
        }
    }

    /// Its deadline may have passed.
    pub fn tick(&mut self, now: Instant, b: &Bounds) -> Option<Dispatch> {
        let late = self.deadline.is_some_and(|d| d <= now);
        match &self.phase {
            Phase::Parked { parked, .. } if parked.until <= now => self.unpark(Wake::Expired),
            Phase::Reading { started } if late => {
                if *started && !self.io.handshaking() && self.inbox.has_bytes() {
                    let slow = Answer::text(408, "request too slow\n");
                    self.answer(&slow, (true, true), now, b);
                    let _ = self.outbox.pump(&mut self.io, now);
                }
                self.phase = Phase::Done;
                None
            }
            Phase::Writing | Phase::Lingering { .. } if late => {
                self.phase = Phase::Done;
                None
            }
            Phase::Streaming { .. } if self.outbox.stall_deadline().is_some_and(|d| d <= now) => {
                self.phase = Phase::Done;
                None
            }
            Phase::Streaming { .. } => self.progress(now, b),
            _ => None,
        }
    }

    /// The server lets it go: a parked request is answered now (and the connection
    /// closed after), a stream ends now, anything still reading is dropped, an answer is
    /// written and the connection closed after (`Evict::Politely`), or cut off
    /// (`Evict::Now`: its place or its memory is needed now; so is a stream's that has
    /// bytes queued).
    pub fn evict(&mut self, now: Instant, b: &Bounds, how: Evict) -> Option<Dispatch> {
        self.close = true;
        let now_ = how == Evict::Now;
        match &mut self.phase {
            Phase::Parked { .. } => self.unpark(Wake::Expired),
            Phase::Streaming { .. } if now_ && !self.outbox.is_empty() => {
                self.phase = Phase::Done;
                None
            }
            Phase::Streaming { .. } => {
                self.end_stream(now, b);
                self.progress(now, b)
            }
            Phase::Reading { .. } => {
                self.phase = Phase::Done;
                None
            }
            Phase::Writing if now_ => {
                self.phase = Phase::Done;
                None
            }
            Phase::Lingering { .. } => {
                self.phase = Phase::Done;
                None
            }
            _ => None,
        }
    }

    /// The server drops it (stopping).
    pub fn drop_now(&mut self) {
        self.phase = Phase::Done;
    }

    fn unpark(&mut self, wake: Wake) -> Option<Dispatch> {
        match std::mem::replace(&mut self.phase, Phase::Working) {
            Phase::Parked { req, parked, .. } => Some(Dispatch {
                req,
                wake,
                lane: 0,
                parked: Some(parked),
            }),
            other => {
                self.phase = other;
                None
            }
        }
    }

    /// Moves the connection on as far as it goes now; at most one request comes out.
    fn progress(&mut self, now: Instant, b: &Bounds) -> Option<Dispatch> {
        for _ in 0..64 {
            if self.done() {
                return None;
            }
            if !self.outbox.pump(&mut self.io, now) {
                self.phase = Phase::Done;
                return None;
            }
            let step = match &self.phase {
                Phase::Writing if self.outbox.is_empty() => Step::Written,
                Phase::Lingering { shut: false } => Step::Shut,
                Phase::Streaming { due, .. }
                    if self.outbox.queued() < WATERMARK && due.is_some_and(|d| d <= now) =>
                {
                    Step::Pull
                }
                Phase::Reading { .. } if !self.io.handshaking() => Step::Parse,
                _ => Step::Stop,
            };
            match step {
                Step::Written => {
                    if !self.after_write(now, b) {
                        return None;
                    }
                }
                Step::Shut => match self.io.flush() {
                    Ok(true) => {
                        self.io.shutdown();
                        self.phase = Phase::Lingering { shut: true };
                    }
                    // The rest goes once the socket drains (a writable edge).
                    Ok(false) => break,
                    Err(_) => self.phase = Phase::Done,
                },
                Step::Pull => self.pull(now, b),
                Step::Parse => {
                    if self.inbox.more_waiting() {
                        self.read(now, b);
                    }
                    match self.inbox.parse(b, || self.io.peer_cert().is_some()) {
                        // A body to read, and more of it waits (no edge will say so).
                        None if self.inbox.more_waiting() => {}
                        None => break,
                        Some(Err(a)) => self.answer(&a, (true, true), now, b),
                        Some(Ok(mut req)) => {
                            self.inbox.shrink();
                            req.close |= !b.keep_alive;
                            self.phase = Phase::Working;
                            self.deadline = None;
                            return Some(Dispatch {
                                req,
                                wake: Wake::First,
                                lane: 0,
                                parked: None,
                            });
                        }
                    }
                }
                Step::Stop => break,
            }
        }
        let gone = matches!(
            self.phase,
            Phase::Reading { .. }
                | Phase::Parked { .. }
                | Phase::Streaming { .. }
                | Phase::Lingering { .. }
        );
        if self.inbox.eof() && gone {
            // Nothing to answer: a request cut short, a long poll or a watch given up.
            self.phase = Phase::Done;
        }
        None
    }

    /// Asks the stream for more.
    fn pull(&mut self, now: Instant, b: &Bounds) {
        let Phase::Streaming { stream, due, .. } = &mut self.phase else {
            return;
        };
        let room = WATERMARK - self.outbox.queued();
        let pulled = stream.pull(now, room);
        let next = pulled.next;
        *due = match next {
            Next::End => None,
            Next::At(t) => Some(t),
        };
        let cut = pulled.chunks.iter().map(Body::len).sum::<usize>() >= room;
        for c in pulled.chunks.into_iter().filter(|c| !c.is_empty()) {
            self.outbox.queue(Bytes::Own(http::chunk_head(c.len())));
            self.outbox.queue(Bytes::Shared(c));
            self.outbox.queue(Bytes::Own(http::CHUNK_END.to_vec()));
        }
        if next == Next::End {
            self.end_stream(now, b);
        } else if cut && let Phase::Streaming { due, .. } = &mut self.phase {
            // Cut short by its room: more as soon as this is out.
            *due = Some(now);
        }
    }

    fn end_stream(&mut self, now: Instant, b: &Bounds) {
        if let Phase::Streaming { holder, at, .. } = &self.phase {
            self.writing_for = Some((*holder, *at));
        }
        self.outbox.queue(Bytes::Own(http::LAST_CHUNK.to_vec()));
        self.phase = Phase::Writing;
        self.deadline = Some(now + b.write_deadline);
    }

    /// Queues `a` (closing after it if `close`) and starts writing.
    /// Queues `a`, closing the connection after it (`close`), with its body or without
    /// (`content`: not for a HEAD).
    fn answer(&mut self, a: &Answer, (close, content): (bool, bool), now: Instant, b: &Bounds) {
        self.close |= close;
        self.writing_for = None;
        self.outbox.queue(Bytes::Own(a.head(self.close)));
        if content && !a.body.is_empty() {
            self.outbox.queue(Bytes::Shared(a.body.clone()));
        }
        self.phase = Phase::Writing;
        self.deadline = Some(now + b.write_deadline);
    }

    /// Once an answer is all out: closed, or idle for the next request. `false` when
    /// done.
    fn after_write(&mut self, now: Instant, b: &Bounds) -> bool {
        if self.close || self.inbox.eof() {
            if self.close {
                self.io.close();
                let _ = self.io.flush();
            }
            if (self.inbox.discarding() || self.inbox.has_bytes()) && !self.inbox.eof() {
                // Part of a body not read, or a request pipelined behind one whose answer
                // closes (a report's), may still come: dropped a moment longer (what
                // waits already, too: no edge may say so), so that the answer is read.
                self.phase = Phase::Lingering { shut: false };
                self.deadline = Some(now + LINGER);
                self.drop_incoming();
                return true;
            }
            self.phase = Phase::Done;
            return false;
        }
        self.phase = Phase::Reading { started: false };
        self.writing_for = None;
        self.since = now;
        self.deadline = Some(now + b.idle);
        if self.inbox.has_bytes() {
            // A pipelined request is already here: its deadline runs from now.
            self.phase = Phase::Reading { started: true };
            self.deadline = Some(now + b.request_deadline);
        }
        true
    }

    /// Reads what has arrived (`Inbox::read`); a request that began after an idle
    /// keep-alive has its deadline run from its first byte.
    fn read(&mut self, now: Instant, b: &Bounds) {
        if self.done() {
            return;
        }
        let lingering = matches!(self.phase, Phase::Lingering { .. });
        match self.inbox.read(&mut self.io, lingering) {
            Err(e) => {
                log::debug!("https: {e}");
                self.phase = Phase::Done;
            }
            Ok(true) if matches!(self.phase, Phase::Reading { started: false }) => {
                self.phase = Phase::Reading { started: true };
                self.deadline = Some(now + b.request_deadline);
            }
            Ok(_) => {}
        }
    }

    /// Drops what arrives of a body not read (`Inbox::drop_incoming`).
    fn drop_incoming(&mut self) {
        if let Err(e) = self.inbox.drop_incoming(&mut self.io) {
            log::debug!("https: {e}");
            self.phase = Phase::Done;
        }
    }
}

mod bounds;
mod inbox;
mod outbox;
#[cfg(test)]
mod tests;
