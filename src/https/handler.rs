//! What a handler of the server sees and says: who asked (`Peer`), why it is asked
//! (`Call`: the request just came, was notified, or its wait is up; on which lane), and
//! its `Reply` — an answer, a wait (a long poll), a streamed body (a watch), or another
//! lane. The bottom room of `https/`: the connection, the lanes and the server use it.

use std::net::SocketAddr;
use std::time::Instant;

use rustls::pki_types::CertificateDer;

use super::http::{Answer, Body, Request};

/// Who sent a request.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The client certificate it presented (its leaf), if any.
    pub cert: Option<CertificateDer<'static>>,
}

/// Why, and where, a handler is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub wake: Wake,
    /// The lane of workers it runs on (0: where new requests go).
    pub lane: usize,
}

/// What answers requests. Called on a worker thread.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: &Request, peer: &Peer, call: Call) -> Reply;
}

/// Why a handler is asked (again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The request just arrived (or was moved to another lane).
    First,
    /// It waited (`Reply::Wait`) and `Handle::notify` was called.
    Notified,
    /// It waited until its deadline, or the server needs its place: answer it now.
    Expired,
}

/// Who holds a parked or streaming connection: a key the handler chose for the identity
/// behind it (the hub: its bearer token's digest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder(pub u64);

/// A handler's reply.
pub enum Reply {
    Answer(Answer),
    /// Ask again when notified, or at this deadline at the latest (a long poll).
    Wait {
        until: Instant,
        holder: Holder,
    },
    /// An answer whose body is streamed (`Transfer-Encoding: chunked`): `head`'s status
    /// and headers, then what `stream` gives, pulled on the server's loop.
    Stream {
        head: Answer,
        stream: Box<dyn Stream>,
        holder: Holder,
    },
    /// Ask again on this lane of workers (the hub: a request whose review is not kept
    /// goes where waiting for the apiserver holds no one else up).
    Lane(usize),
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Answer(a) => write!(f, "Answer({})", a.status),
            Reply::Wait { until, holder } => write!(f, "Wait({until:?}, {holder:?})"),
            Reply::Stream { head, holder, .. } => write!(f, "Stream({}, {holder:?})", head.status),
            Reply::Lane(l) => write!(f, "Lane({l})"),
        }
    }
}

/// A streamed body. `pull` runs on the server's loop: it must not block.
pub trait Stream: Send {
    /// What to send now, at most about `room` bytes (a chunk each; an empty one is
    /// skipped), and when to be asked again.
    fn pull(&mut self, now: Instant, room: usize) -> Pull;
}

/// A stream's answer to `pull`.
pub struct Pull {
    pub chunks: Vec<Body>,
    pub next: Next,
}

/// When a stream wants to be asked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// At the next notify or at this moment, whichever comes first.
    At(Instant),
    /// Never: the stream is over.
    End,
}
