//! How the server holds its clients (`Limits`): how many connections, the deadlines of a
//! request, an idle keep-alive and a write, the bounds of a request's head and body, the
//! lanes of workers, what one identity may hold; and the defaults.

use std::time::Duration;

use crate::https::conn::Bounds;
use crate::https::http::Answer;
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
    /// Connections stay open between requests (else every answer closes its own).
    pub keep_alive: bool,
    /// The lanes of workers; new requests go to the first.
    pub lanes: Vec<Lane>,
    /// Parked or streaming requests one identity may hold.
    pub max_held: usize,
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
            keep_alive: true,
            lanes: Limits::one_lane(
                4,
                256,
                Answer::text(503, "too many requests at once; try again\n"),
            ),
            max_held: usize::MAX,
            inline: false,
            panicked: Answer::text(500, "internal error\n"),
            counts: ServerCounts::default(),
        }
    }
}
