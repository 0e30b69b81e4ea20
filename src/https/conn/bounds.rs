//! How the server holds a connection (`Bounds`): the deadlines of a request, an idle
//! keep-alive and a write, the bounds of a request's head and body, which requests'
//! bodies are read (`Bodies`) and the budget the bodies read share (a path's own, if it has
//! one).

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
    /// Only a `POST` to one of these paths, each with its own rule.
    Post(Vec<Post>),
}

/// A path whose `POST` bodies are read: when `cert`, only from a client that presented a
/// certificate (the webhook's reviews, from the apiserver); at most `max` bytes (a longer
/// one is a 413 from its head); when `close`, the connection closes after the answer to one
/// (a hub's reports: each client sends one now and then, and a connection kept for the next
/// would pin its buffers on the server for the whole idle time, a fleet's worth of them);
/// with a `budget` of its own, its bodies take from it, not from the server's (bodies read
/// before their request is authenticated, which unknown clients could fill, starve none of
/// the other paths'), and only once whole: while one arrives it is its connection's own
/// bytes (`Footprint`), counted in its owner's share or the token-less connections' and let
/// go with the silent for longest, so clients that announce bodies and stall fill no
/// budget another client's call needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Post {
    pub path: &'static str,
    pub cert: bool,
    pub close: bool,
    pub max: usize,
    pub budget: Option<Budget>,
}

impl Bodies {
    /// Whether `req`'s body is read (`cert`: whether its client presented a certificate):
    /// if so, its bound, whether the connection closes after the answer, and the budget of
    /// its own it takes from (`None`: the server's).
    pub(super) fn read(
        &self,
        req: &Request,
        cert: impl FnOnce() -> bool,
    ) -> Option<(usize, bool, Option<Budget>)> {
        match self {
            Bodies::All => Some((usize::MAX, false, None)),
            Bodies::None => None,
            Bodies::Post(posts) => {
                let p = (posts.iter()).find(|p| req.method == "POST" && req.path == p.path)?;
                (!p.cert || cert()).then(|| (p.max, p.close, p.budget.clone()))
            }
        }
    }
}
