//! Who works for the server's thread (`Workers`): the handler, asked on lanes of workers
//! (`Lanes`) or, on the first lane when `Limits::inline` says so, on the server's thread
//! itself (a panic costs the request a 500, as on a worker); and the TLS handshakes'
//! workers (`Handshakes`; none for plain HTTP).

use std::io;
use std::sync::Arc;

use super::limits::Limits;
use crate::https::conn::Dispatch;
use crate::https::handler::{Call, Handler, Peer, Reply, ask_or_500};
use crate::https::handshakes::{Handshakes, Step, Stepped};
use crate::https::http::Answer;
use crate::https::lanes::{Job, Lanes, Results};

/// The server's workers.
pub(super) struct Workers {
    lanes: Lanes,
    handler: Arc<dyn Handler>,
    /// The TLS handshakes' workers (none for plain HTTP).
    handshakes: Option<Handshakes>,
}

impl Workers {
    /// Starts the lanes' workers, and the handshakes' when `tls`; what they do wakes the
    /// loop through `results`.
    pub fn start(
        limits: &Limits,
        handler: Arc<dyn Handler>,
        results: &Arc<Results>,
        tls: bool,
    ) -> io::Result<Workers> {
        let lanes = Lanes::start(
            &limits.lanes,
            handler.clone(),
            results.clone(),
            limits.panicked.clone(),
            limits.counts.clone(),
        )?;
        let handshakes = match tls {
            true => Some(Handshakes::start(limits.handshakes, results.clone())?),
            false => None,
        };
        Ok(Workers {
            lanes,
            handler,
            handshakes,
        })
    }

    /// Queues `job` on its lane (`Lanes::give`): given back when the lane is full.
    pub fn give(&self, job: Job) -> Result<(), Box<Job>> {
        self.lanes.give(job)
    }

    /// What a new request gets when `lane`'s queue is full.
    pub fn busy(&self, lane: usize) -> Answer {
        self.lanes.busy(lane)
    }

    /// Asks the handler on this thread (`Limits::inline`); a panic costs the request a
    /// 500, as on a worker.
    pub fn inline(&self, d: &Dispatch, peer: &Peer, limits: &Limits) -> Reply {
        let call = Call {
            wake: d.wake,
            lane: 0,
        };
        let (counts, panicked) = (&limits.counts, &limits.panicked);
        ask_or_500(
            &*self.handler,
            (&d.req, peer, call),
            counts,
            panicked,
            "server",
        )
    }

    /// Handshakes are worked out by workers (TLS).
    pub fn handshaking(&self) -> bool {
        self.handshakes.is_some()
    }

    /// Queues a handshake's step; the step given up to make room, if any.
    pub fn handshake(&self, step: Step) -> Option<Step> {
        (self.handshakes.as_ref()).and_then(|h| h.give(step))
    }

    /// The handshake steps worked out since the last look.
    pub fn stepped(&self) -> Vec<Stepped> {
        (self.handshakes.as_ref())
            .map(Handshakes::take)
            .unwrap_or_default()
    }
}
