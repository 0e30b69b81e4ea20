//! How the server holds a connection (`Bounds`): the deadlines of a request, an idle
//! keep-alive and a write, the bounds of a request's head and body, which requests'
//! bodies are read (`Bodies`) and the budget the bodies read share.

use std::time::Duration;

use crate::https::http::{Budget, Request};

/// How a connection is held.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub request_deadline: Duration,
    pub idle: Duration,
    pub write_deadline: Duration,
    pub max_head: usize,
    pub max_body: usize,
    /// Connections stay open between requests (else every answer closes its own).
    pub keep_alive: bool,
    /// Which requests' bodies are read.
    pub bodies: Bodies,
    /// What the bodies read take together, at most.
    pub budget: Budget,
}

/// Which requests' bodies a server reads; the others are answered without theirs (a
/// handler that serves only GETs refuses them with 401 or 405 whatever their body), what
/// arrives of it is dropped, and the connection closes after the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bodies {
    /// Every one's.
    All,
    /// No one's.
    None,
    /// Only a `POST` to this path's, and when `cert`, only from a client that presented a
    /// certificate (the webhook's reviews, from the apiserver); when `close`, the
    /// connection closes after the answer to one (a hub's reports: each client sends one
    /// now and then, and a connection kept for the next would pin its buffers on the
    /// server for the whole idle time, a fleet's worth of them).
    Post {
        path: &'static str,
        cert: bool,
        close: bool,
    },
}

impl Bodies {
    /// Whether `req`'s body is read (`cert`: whether its client presented a certificate).
    pub(super) fn read(&self, req: &Request, cert: impl FnOnce() -> bool) -> bool {
        match self {
            Bodies::All => true,
            Bodies::None => false,
            Bodies::Post {
                path, cert: needed, ..
            } => req.method == "POST" && req.path == *path && (!needed || cert()),
        }
    }

    /// Whether the connection closes after answering a request whose body was read.
    pub(super) fn close_after(&self) -> bool {
        matches!(self, Bodies::Post { close: true, .. })
    }
}
