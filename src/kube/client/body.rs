//! What a successful request hands its caller (`Body`): a reader capped at
//! `--max-response-bytes`, counted, and marked in flight for `/healthz` until it is
//! dropped, whose read errors `Failure` classifies.

use std::io::{self, Read};
use std::time::Duration;

use crate::kube::error::{Error, classify};
use crate::ops::health::InFlight;
use crate::ops::metrics::ApiCounters;

/// The answer body of a successful request: capped, counted, and marked in flight until
/// it is dropped.
pub struct Body {
    pub(super) reader: ureq::BodyReader<'static>,
    /// The answer's `Content-Type`, lowercase, without parameters.
    pub(super) media_type: String,
    /// The answer came from a `cmpoll serve` hub (it said so: `HUB_HEADER`).
    pub(super) hub: bool,
    pub(super) counters: ApiCounters,
    pub(super) failure: Failure,
    pub(super) _mark: Option<InFlightMark>,
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.reader.read(buf)?;
        self.counters.bytes(n as u64);
        Ok(n)
    }
}

impl Body {
    /// The answer's media type (`application/json`, `application/vnd.kubernetes.protobuf`).
    pub fn media_type(&self) -> &str {
        &self.media_type
    }

    /// Whether a `cmpoll serve` hub answered (see `HUB_HEADER`).
    pub fn hub(&self) -> bool {
        self.hub
    }

    /// What turns this body's read errors into typed errors.
    pub fn failure(&self) -> Failure {
        self.failure.clone()
    }
}

/// Marked from the first byte out to the last byte in, whatever the outcome.
pub(super) struct InFlightMark(InFlight);

impl InFlightMark {
    pub(super) fn start(f: &InFlight) -> InFlightMark {
        f.start();
        InFlightMark(f.clone())
    }
}

impl Drop for InFlightMark {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Classifies what goes wrong while a body is read: the cap, a timeout, a cut connection
/// (from the reader), or a body that is not what was asked for.
#[derive(Clone, Debug)]
pub struct Failure {
    pub(super) action: String,
    pub(super) server: String,
    pub(super) timeout: Duration,
    pub(super) limit: u64,
}

impl Failure {
    /// An I/O error met while reading the body.
    pub fn io(&self, e: io::Error) -> Error {
        let ureq_err = if e.get_ref().is_some_and(|r| r.is::<ureq::Error>()) {
            // Wrapped by ureq's body reader: unwrap and classify like a request error.
            ureq::Error::from(e)
        } else {
            ureq::Error::Io(e)
        };
        classify(
            ureq_err,
            &self.action,
            &self.server,
            self.timeout,
            self.limit,
        )
    }

    /// A body that is not what the request asked for.
    pub fn decode(&self, cause: impl std::fmt::Display) -> Error {
        Error::Decode {
            action: self.action.clone(),
            cause: cause.to_string(),
        }
    }

    pub fn action(&self) -> &str {
        &self.action
    }

    /// What a test's body fails with.
    #[cfg(test)]
    pub fn for_test(action: &str) -> Failure {
        Failure {
            action: action.to_string(),
            server: "https://hub.test".into(),
            timeout: Duration::from_secs(10),
            limit: 1 << 20,
        }
    }
}
