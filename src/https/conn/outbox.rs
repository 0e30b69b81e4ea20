//! What a connection has queued for the client (`Outbox`, `Conn`'s send side): pieces
//! of bytes, shared (an answer's body, a watch event) or its own (heads, chunk framing),
//! handed to the transport and the transport's to the wire as far as they go; how long
//! they have waited for a client that does not take them (cut off after
//! `write_deadline`), and what they and the transport hold, as the server counts it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::https::http::Body;
use crate::https::transport::{SEND_BUFFER, Transport};

/// Bytes queued for the transport: shared, or this connection's own.
struct Piece {
    bytes: Bytes,
    at: usize,
}

pub(super) enum Bytes {
    Shared(Body),
    Own(Vec<u8>),
}

impl Piece {
    fn rest(&self) -> &[u8] {
        let all: &[u8] = match &self.bytes {
            Bytes::Shared(b) => b,
            Bytes::Own(v) => v,
        };
        &all[self.at..]
    }
}

/// A connection's queue of bytes for the client.
pub(super) struct Outbox {
    out: VecDeque<Piece>,
    /// Bytes queued, not yet handed to the transport.
    queued: usize,
    /// Bytes are queued and none has gone out since.
    stalled: Option<Instant>,
    /// How long queued bytes may wait for the client (`Bounds::write_deadline`).
    write_deadline: Duration,
    /// Bytes handed to the transport since it last had nothing left for the wire (what it
    /// holds is at most that, and at most `SEND_BUFFER`).
    in_transport: usize,
}

impl Outbox {
    pub fn new(write_deadline: Duration) -> Outbox {
        Outbox {
            out: VecDeque::new(),
            queued: 0,
            stalled: None,
            write_deadline,
            in_transport: 0,
        }
    }

    /// Bytes queued, not yet taken by the transport.
    pub fn queued(&self) -> usize {
        self.queued
    }

    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// When a client that takes none of the bytes queued is cut off.
    pub fn stall_deadline(&self) -> Option<Instant> {
        self.stalled.map(|s| s + self.write_deadline)
    }

    pub fn queue(&mut self, bytes: Bytes) {
        let p = Piece { bytes, at: 0 };
        self.queued += p.rest().len();
        self.out.push_back(p);
    }

    /// What it holds: bytes of its own (its own pieces, a shared body but the largest, and
    /// what the transport holds for the wire), and the largest shared body it keeps alive
    /// (its address and length).
    pub fn footprint(&self) -> (usize, Option<(usize, usize)>) {
        let mut own = self.in_transport.min(SEND_BUFFER);
        let mut body: Option<(usize, usize)> = None;
        for p in &self.out {
            match &p.bytes {
                Bytes::Own(v) => own += v.capacity(),
                Bytes::Shared(b) => match body {
                    Some((_, n)) if n >= b.len() => own += b.len(),
                    _ => {
                        own += body.map_or(0, |(_, n)| n);
                        body = Some((b.addr(), b.len()));
                    }
                },
            }
        }
        (own, body)
    }

    /// Hands queued bytes to `io` and its bytes to the wire, as far as they go; `false`
    /// when the connection broke.
    pub fn pump<T: Transport>(&mut self, io: &mut T, now: Instant) -> bool {
        let mut moved = false;
        // Each round hands the transport what it takes, then moves its bytes to the wire.
        // A round that handed nothing (the transport was full) but emptied it goes again:
        // the socket may take more, and no writable edge would come to say so. Two such
        // rounds in a row: it is the socket that is full.
        let mut empty_rounds = 0;
        for _ in 0..1024 {
            let mut sent = false;
            while let Some(p) = self.out.front_mut() {
                let n = match io.send(p.rest()) {
                    Ok(n) => n,
                    Err(e) => {
                        log::debug!("https: {e}");
                        return false;
                    }
                };
                if n == 0 {
                    break;
                }
                sent = true;
                p.at += n;
                self.queued -= n;
                self.in_transport += n;
                if p.rest().is_empty() {
                    self.out.pop_front();
                }
            }
            let flushed = match io.flush() {
                Ok(f) => f,
                Err(e) => {
                    log::debug!("https: {e}");
                    return false;
                }
            };
            if flushed {
                self.in_transport = 0;
            }
            moved |= sent;
            empty_rounds = if sent { 0 } else { empty_rounds + 1 };
            // Done, or the wire is full (a writable edge comes when it drains).
            if self.out.is_empty() || !flushed || empty_rounds > 1 {
                break;
            }
        }
        if self.out.is_empty() || moved {
            self.stalled = (!self.out.is_empty()).then_some(now);
        } else if self.stalled.is_none() {
            self.stalled = Some(now);
        }
        true
    }
}
