//! What a connection reads (`Conn`'s receive side): a request's head, and its body where
//! the server's rule (`Bodies`) says the request needs one, taken from the server's
//! `Budget` as it arrives (past it, a 503); a body not read is dropped as it comes, a bounded amount at a
//! time and `MAX_DROPPED` while its request is answered; the receive buffer gives its room back once a request is out of it.

use std::time::Instant;

use super::{Awaiting, Bodies, Bounds, Conn, KEPT_ROOM, MAX_BUFFERED, MAX_DROPPED, Phase};
use crate::https::http::{self, Answer, Head, Request};
use crate::https::transport::Transport;

impl Bodies {
    /// Whether `req`'s body is read (`cert`: whether its client presented a certificate).
    pub(super) fn read(&self, req: &Request, cert: impl FnOnce() -> bool) -> bool {
        match self {
            Bodies::All => true,
            Bodies::None => false,
            Bodies::Post { path, cert: needed } => {
                req.method == "POST" && req.path == *path && (!needed || cert())
            }
        }
    }
}

impl<T: Transport> Conn<T> {
    /// A body not read is arriving: what comes is dropped, a bounded amount at a time (the
    /// connection closes once answered).
    pub(super) fn drop_incoming(&mut self) {
        for _ in 0..32 {
            match self.io.receive(&mut self.inbuf, MAX_BUFFERED) {
                Ok(eof) => self.eof |= eof,
                Err(e) => {
                    log::debug!("https: {e}");
                    self.phase = Phase::Done;
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
    }

    /// What the receive buffer may hold now: a head and the next one's start, and a body
    /// being read.
    pub(super) fn cap(&self) -> usize {
        MAX_BUFFERED + self.awaiting.as_ref().map_or(0, |a| a.head + a.length)
    }

    /// Reads what has arrived, up to the buffer's cap.
    pub(super) fn read(&mut self, now: Instant, b: &Bounds) {
        if self.done() {
            return;
        }
        if self.discard {
            if self.dropped < MAX_DROPPED || matches!(self.phase, Phase::Lingering { .. }) {
                self.drop_incoming();
            }
            return;
        }
        let cap = self.cap();
        let before = self.inbuf.len();
        match self.io.receive(&mut self.inbuf, cap) {
            Ok(eof) => self.eof |= eof,
            Err(e) => {
                log::debug!("https: {e}");
                self.phase = Phase::Done;
                return;
            }
        }
        self.unread = self.inbuf.len() >= cap;
        if self.inbuf.len() > before
            && let Phase::Reading { started: false } = self.phase
        {
            // A request began after an idle keep-alive: its deadline runs from its first
            // byte.
            self.phase = Phase::Reading { started: true };
            self.deadline = Some(now + b.request_deadline);
        }
    }

    /// The next request, if it is all here (its body too, when it is read), taken out of
    /// the buffer; or what answers one that breaks a rule.
    pub(super) fn parse(&mut self, b: &Bounds) -> Option<Result<Request, Answer>> {
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
            if !b.bodies.read(&req, || self.io.peer_cert().is_some()) {
                // Answered without it: nothing of it is kept, and the connection closes
                // after the answer.
                self.inbuf.clear();
                self.discard = true;
                req.close = true;
                return Some(Ok(req));
            }
            self.awaiting = Some(Awaiting { req, head, length });
        }
        let a = self.awaiting.as_mut()?;
        let end = a.head + a.length;
        // The body is taken from the budget as it arrives: a head that announces one and
        // stalls holds none of it.
        let arrived = self.inbuf.len().min(end).saturating_sub(a.head);
        if !a.req.taken.grow(&b.budget, arrived) {
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
        Some(Ok(req))
    }

    /// A receive buffer gives back the room a request took once it is out of it.
    pub(super) fn shrink(&mut self) {
        if self.inbuf.is_empty() {
            self.inbuf = Vec::new();
        } else if self.inbuf.capacity() > KEPT_ROOM.max(2 * self.inbuf.len()) {
            self.inbuf.shrink_to(KEPT_ROOM.max(self.inbuf.len()));
        }
    }
}
