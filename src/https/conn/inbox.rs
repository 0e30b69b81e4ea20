//! What a connection has received (`Inbox`, `Conn`'s receive side): plaintext not yet
//! parsed, up to a cap (a head and the next one's start, and a body being read); a
//! request's head, and its body where the server's rule says the request needs one, taken
//! from the server's `Budget` as it arrives (past it, a 503), or, on a path with a budget
//! of its own, counted as the connection's own bytes while it arrives and taken from that
//! budget once whole (a stalled body holds nothing another call needs); a body not read is dropped as
//! it comes, a bounded amount at a time and `MAX_DROPPED` while its request is answered;
//! the receive buffer gives its room back once a request is out of it.

use std::io;

use super::bounds::Bounds;
use crate::https::http::{self, Answer, Budget, Head, Request};
use crate::https::transport::Transport;

/// Bytes buffered for a connection beyond a body at most (a head, and the next request's
/// start).
const MAX_BUFFERED: usize = 2 * http::MAX_HEAD;

/// What a connection's body not read may drop while its request is answered (Go's
/// server's `maxPostHandlerReadBytes`): beyond it the connection is not read until its
/// answer is out, so a client sending without end on a request held open (a watch, a long
/// poll) meets its own TCP window, not the server's loop.
pub(super) const MAX_DROPPED: usize = 256 * 1024;

/// A receive buffer keeps at most this much room once a request is out of it.
pub(super) const KEPT_ROOM: usize = 4 * 1024;

/// The longest TLS record (16 KiB of plaintext and its framing): what rustls may keep of
/// the bytes a request came in until its next read (a connection stalled halfway through a
/// 15 KB head: 33 KiB measured, 8.5 of them at rest).
pub(super) const RECORD: usize = 17 * 1024;

/// A head whose body is being read (what arrived of it taken from the budget).
struct Awaiting {
    req: Request,
    head: usize,
    length: usize,
    /// The connection closes after its answer (`Bodies`).
    close: bool,
    /// The budget of its path's own, if any (else the server's).
    budget: Option<Budget>,
}

/// A connection's receive side.
#[derive(Default)]
pub(super) struct Inbox {
    /// Plaintext received and not yet parsed.
    inbuf: Vec<u8>,
    /// More may be waiting to be read: a read stopped at the buffer's cap.
    unread: bool,
    /// The client closed its side.
    eof: bool,
    /// A head whose body is being read.
    awaiting: Option<Awaiting>,
    /// A body not read is arriving: what comes is dropped (the connection closes after the
    /// answer).
    discard: bool,
    /// Bytes dropped so, while its request is answered (at most `MAX_DROPPED`).
    dropped: usize,
}

impl Inbox {
    /// The client closed its side.
    pub fn eof(&self) -> bool {
        self.eof
    }

    /// A body not read is arriving, dropped as it comes.
    pub fn discarding(&self) -> bool {
        self.discard
    }

    /// Bytes received and not yet parsed are here.
    pub fn has_bytes(&self) -> bool {
        !self.inbuf.is_empty()
    }

    /// A read stopped at the buffer's cap and the buffer has room again: more waits (no
    /// edge will say so).
    pub fn more_waiting(&self) -> bool {
        self.unread && self.inbuf.len() < self.cap()
    }

    /// What the buffer holds, as the server counts it (less a body the `Budget` counts): its
    /// room, and the record what it holds came in.
    pub fn held(&self) -> usize {
        let awaited = self.awaiting.as_ref().map_or(0, |a| a.req.taken.len());
        // A request received is counted twice: in its buffer, and in the record it came in.
        self.inbuf.capacity().saturating_sub(awaited)
            + self.inbuf.len().saturating_sub(awaited).min(RECORD)
    }

    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.inbuf.capacity()
    }

    #[cfg(test)]
    pub fn dropped(&self) -> usize {
        self.dropped
    }

    /// A body not read is arriving: what comes is dropped, a bounded amount at a time (the
    /// connection closes once answered).
    pub fn drop_incoming<T: Transport>(&mut self, io: &mut T) -> io::Result<()> {
        let mut result = Ok(());
        for _ in 0..32 {
            match io.receive(&mut self.inbuf, MAX_BUFFERED) {
                Ok(eof) => self.eof |= eof,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            let got = !self.inbuf.is_empty();
            self.dropped = self.dropped.saturating_add(self.inbuf.len());
            self.inbuf.clear();
            if !got || self.eof {
                break;
            }
        }
        self.inbuf = Vec::new();
        self.unread = false;
        result
    }

    /// What the receive buffer may hold now: a head and the next one's start, and a body
    /// being read.
    fn cap(&self) -> usize {
        MAX_BUFFERED + self.awaiting.as_ref().map_or(0, |a| a.head + a.length)
    }

    /// Reads what has arrived, up to the buffer's cap (a body not read: dropped, until
    /// `MAX_DROPPED` unless `lingering`); whether bytes came.
    pub fn read<T: Transport>(&mut self, io: &mut T, lingering: bool) -> io::Result<bool> {
        if self.discard {
            if self.dropped < MAX_DROPPED || lingering {
                self.drop_incoming(io)?;
            }
            return Ok(false);
        }
        let cap = self.cap();
        let before = self.inbuf.len();
        self.eof |= io.receive(&mut self.inbuf, cap)?;
        self.unread = self.inbuf.len() >= cap;
        Ok(self.inbuf.len() > before)
    }

    /// The next request, if it is all here (its body too, when `b.bodies` says it is
    /// read; `cert`: whether its client presented a certificate), taken out of the
    /// buffer; or what answers one that breaks a rule.
    pub fn parse(
        &mut self,
        b: &Bounds,
        cert: impl FnOnce() -> bool,
    ) -> Option<Result<Request, Answer>> {
        if self.awaiting.is_none() {
            let (mut req, head, length) =
                match http::parse_head(&self.inbuf, b.max_head, b.max_body) {
                    Head::Partial => return None,
                    Head::Bad(a) => {
                        // Answered, then closed: what may follow is dropped meanwhile,
                        // so that the client reads its answer (a 413's too).
                        self.inbuf.clear();
                        self.discard = true;
                        return Some(Err(a));
                    }
                    Head::Complete { req, head, body } => (req, head, body),
                };
            if length == 0 {
                self.inbuf.drain(..head);
                return Some(Ok(req));
            }
            let Some((max, close, budget)) = b.bodies.read(&req, cert) else {
                // Answered without it: nothing of it is kept, and the connection closes
                // after the answer.
                self.inbuf.clear();
                self.discard = true;
                req.close = true;
                return Some(Ok(req));
            };
            if length > max {
                // As `parse_head` refuses a body over the server's bound.
                self.inbuf.clear();
                self.discard = true;
                let too_large = format!("a body of at most {max} bytes\n");
                return Some(Err(Answer::text(413, too_large)));
            }
            self.awaiting = Some(Awaiting {
                req,
                head,
                length,
                close,
                budget,
            });
        }
        let a = self.awaiting.as_mut()?;
        let end = a.head + a.length;
        // The body is taken from the server's budget as it arrives: a head that announces
        // one and stalls holds none of it. A path's own budget is taken from only once the
        // body is whole: while it arrives, it is the connection's own bytes (`held`), in its
        // owner's share or the token-less connections', where a stalled one is let go as
        // the silent for longest is, and no client's stall refuses another's call.
        let arrived = self.inbuf.len().min(end).saturating_sub(a.head);
        let taken = match &a.budget {
            None => a.req.taken.grow(&b.budget, arrived),
            Some(own) => arrived < a.length || a.req.taken.grow(own, arrived),
        };
        if !taken {
            self.awaiting = None;
            self.inbuf.clear();
            self.discard = true;
            let busy = Answer::text(503, "too many request bodies at once; try again\n");
            return Some(Err(busy.with("Retry-After", "1")));
        }
        if self.inbuf.len() < end {
            return None;
        }
        let a = self.awaiting.take()?;
        let mut req = a.req;
        // The buffer becomes the body (no copy of it): what follows it stays.
        let rest = self.inbuf.split_off(end);
        req.body = std::mem::replace(&mut self.inbuf, rest);
        req.body.drain(..a.head);
        req.close |= a.close;
        Some(Ok(req))
    }

    /// A receive buffer gives back the room a request took once it is out of it.
    pub fn shrink(&mut self) {
        if self.inbuf.is_empty() {
            self.inbuf = Vec::new();
        } else if self.inbuf.capacity() > KEPT_ROOM.max(2 * self.inbuf.len()) {
            self.inbuf.shrink_to(KEPT_ROOM.max(self.inbuf.len()));
        }
    }
}
