//! How the server holds its clients (`Limits`): how many connections, the deadlines of a
//! request, an idle keep-alive and a write, the bounds of a request's head and body and
//! which bodies are read, the lanes of workers and the handshakes', what one identity and
//! what the token-less connections may hold; and the defaults.

use std::time::Duration;

use crate::https::conn::{Bodies, Bounds};
use crate::https::handshakes::Sizes;
use crate::https::http::{Answer, Budget};
use crate::https::lanes::Lane;
use crate::ops::metrics::ServerCounts;

/// How the server holds its clients.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections open at once (never more than the open-file limit less `FILES_KEPT`).
    pub max_connections: usize,
    /// From accept (TLS handshake included), or from a request's first byte after an idle
    /// keep-alive, to its last byte.
    pub request_deadline: Duration,
    /// Between two requests of one keep-alive connection.
    pub idle: Duration,
    /// From a complete answer to its last byte on the wire; what a stream queued may
    /// wait this long for the client.
    pub write_deadline: Duration,
    /// A request head at most (`http::MAX_HEAD` at most).
    pub max_head: usize,
    /// A request body at most.
    pub max_body: usize,
    /// Which requests' bodies are read (the others are answered without theirs).
    pub bodies: Bodies,
    /// What the bodies read take together at most, from their head until their request
    /// is answered (one that does not fit: 503).
    pub max_bodies: usize,
    /// Connections stay open between requests (else every answer closes its own).
    pub keep_alive: bool,
    /// The lanes of workers; new requests go to the first.
    pub lanes: Vec<Lane>,
    /// Held requests (parked, streaming, written for it) one identity may hold.
    pub max_held: usize,
    /// What one identity's connections may hold together, in bytes, beyond its largest
    /// (`Footprint`; a shared body once).
    pub max_pinned: usize,
    /// What the connections no identity holds (token-less) may hold together, in bytes.
    pub max_loose: usize,
    /// The TLS handshakes' workers and the steps that may wait for them.
    pub handshakes: Sizes,
    /// The handler answers its first lane on the server's own thread, without a worker
    /// (it promises not to block there: what might, it sends to another lane). Saves two
    /// thread hand-offs a request, most of what an idle fleet's requests cost.
    pub inline: bool,
    /// What a request gets when its handler panics (the worker goes on).
    pub panicked: Answer,
    /// What the server did itself.
    pub counts: ServerCounts,
}

impl Limits {
    /// One lane of `workers`, `queue` waiting at most, `busy` beyond.
    pub fn one_lane(workers: usize, queue: usize, busy: Answer) -> Vec<Lane> {
        vec![Lane {
            name: "w",
            workers,
            queue,
            busy,
        }]
    }

    pub(super) fn bounds(&self) -> Bounds {
        Bounds {
            request_deadline: self.request_deadline,
            idle: self.idle,
            write_deadline: self.write_deadline,
            max_head: self.max_head,
            max_body: self.max_body,
            keep_alive: self.keep_alive,
            bodies: self.bodies.clone(),
            budget: Budget::new(self.max_bodies),
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 1024,
            request_deadline: Duration::from_secs(5),
            idle: Duration::from_secs(90),
            write_deadline: Duration::from_secs(10),
            max_head: crate::https::http::MAX_HEAD,
            max_body: 1 << 20,
            bodies: Bodies::All,
            max_bodies: 64 << 20,
            keep_alive: true,
            lanes: Limits::one_lane(
                4,
                256,
                Answer::text(503, "too many requests at once; try again\n"),
            ),
            max_held: usize::MAX,
            max_pinned: 64 << 20,
            max_loose: 256 << 20,
            handshakes: Sizes {
                workers: 1,
                queue: 64,
            },
            inline: false,
            panicked: Answer::text(500, "internal error\n"),
            counts: ServerCounts::default(),
        }
    }
}
