//! What a handler of the server sees and says: who asked (`Peer`), why it is asked
//! (`Call`: the request just came, was notified, or its wait is up; on which lane), and
//! its `Reply` — an answer, a wait (a long poll), a streamed body (a watch), or another
//! lane. The bottom room of `https/`: the connection, the lanes and the server use it.

use std::net::SocketAddr;
use std::time::Instant;

use rustls::pki_types::CertificateDer;

use super::http::{Answer, Body, Request};
use crate::ops::metrics::ServerCounts;

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

/// Who holds a connection (parked, streaming, or writing an answer) and what it pins: a
/// key for the identity behind it (the hub: its bearer token's digest, `Holder::bearer`;
/// a client certificate's, `Holder::certificate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder(pub u64);

impl Holder {
    /// The holder of a bearer token: the first 8 bytes of its SHA-256, as the hub's
    /// `auth` names who parks and watches.
    pub fn token(token: &str) -> Holder {
        Holder::digest(token.as_bytes())
    }

    /// The holder of the bearer token an `Authorization` header carries, if any.
    pub fn bearer(authorization: Option<&str>) -> Option<Holder> {
        let (scheme, rest) = authorization?.trim().split_once(' ')?;
        let token = rest.trim();
        (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| Holder::token(token))
    }

    /// The holder of a client certificate the TLS layer verified.
    pub fn certificate(der: &[u8]) -> Holder {
        Holder::digest(der)
    }

    fn digest(bytes: &[u8]) -> Holder {
        use sha2::{Digest, Sha256};
        let d: [u8; 32] = Sha256::digest(bytes).into();
        Holder(u64::from_be_bytes([
            d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
        ]))
    }
}

/// A handler's reply.
pub enum Reply {
    /// An answer no identity holds (a probe's, a refusal's): what it pins while it is
    /// written counts toward the connections that have no holder.
    Answer(Answer),
    /// An answer written for `holder` (the hub's, to a request it authenticated): what it
    /// pins while it is written counts toward the holder's share, and the connection is the
    /// holder's from then on.
    Held { answer: Answer, holder: Holder },
    /// Ask again when notified, or at this deadline at the latest (a long poll).
    Wait { until: Instant, holder: Holder },
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
            Reply::Held { answer, holder } => write!(f, "Held({}, {holder:?})", answer.status),
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

/// Asks `handler` (on the loop or a lane's worker: `on` says which, for the log). A panic is
/// one answer's bug: counted, logged, answered with `panicked` (a 500), and the thread goes
/// on (`locks.rs`: why the locks it held are taken as left).
pub fn ask_or_500(
    handler: &dyn Handler,
    (req, peer, call): (&Request, &Peer, Call),
    counts: &ServerCounts,
    panicked: &Answer,
    on: &str,
) -> Reply {
    let asked = std::panic::AssertUnwindSafe(|| handler.handle(req, peer, call));
    std::panic::catch_unwind(asked).unwrap_or_else(|_| {
        counts.panicked();
        log::error!(
            "https: the answer to {} {} panicked; the {on} goes on",
            req.method,
            req.path
        );
        Reply::Answer(panicked.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bearer token's holder is its digest's, as `serve::auth` keys who parks and
    /// watches; anything else in the header holds nothing.
    #[test]
    fn a_bearer_tokens_holder() {
        let h = Holder::token("abc");
        // SHA-256("abc") = ba7816bf8f01cfea…
        assert_eq!(h, Holder(0xba78_16bf_8f01_cfea));
        assert_eq!(Holder::bearer(Some("Bearer abc")), Some(h));
        assert_eq!(Holder::bearer(Some(" bearer   abc ")), Some(h));
        for other in [
            None,
            Some("Basic abc"),
            Some("Bearer "),
            Some("Bearer"),
            Some(""),
        ] {
            assert_eq!(Holder::bearer(other), None, "{other:?}");
        }
    }
}
