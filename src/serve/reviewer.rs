//! What the hub asks about a request and who answers (the `Reviewer` seam between
//! `authn.rs`/`authz.rs` and the apiserver's reviews in `reviews.rs`, or a test's fake):
//! what a request does as an authorizer sees it (`Attributes`), the answer (`Decision`),
//! a service account as its token names it (`Account`), and why a request does not go on
//! where it is (`Halt`: refused, or sent to the lane where reviews may wait). Also the
//! hub's lanes, and `Quiet`, a warning about reviews said once however many see it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::status::StatusError;
use super::user::User;
use crate::locks::Recover;
use crate::secret::Secret;
use crate::source::Resource;

/// The hub's lanes (`serve::limits` builds the server's list from `HubLane::ALL`, so a
/// lane's number is its place there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HubLane {
    /// Where requests are answered, on the server's own thread: nothing there may wait.
    Answer,
    /// Where token reviews are waited for (tokens nobody knows).
    Authenticate,
    /// Where access reviews are waited for (accesses not kept, of known users).
    Authorize,
    /// Where what takes time is made: a list rendered for a poll, a page, a gzipped
    /// object, `/metrics`.
    Render,
}

impl HubLane {
    pub const ALL: [HubLane; 4] = [
        HubLane::Answer,
        HubLane::Authenticate,
        HubLane::Authorize,
        HubLane::Render,
    ];

    /// Its number on the server (`https::server::Call::lane`): its place in `ALL`.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The lane numbered `index` on the server (`Answer` for any other number).
    pub fn of(index: usize) -> HubLane {
        (HubLane::ALL.get(index).copied()).unwrap_or(HubLane::Answer)
    }

    /// Whether a request on this lane may wait for what takes time (a review, a render):
    /// anywhere but the answer lane, which sends such a request to the lane of its wait.
    pub fn may_wait(self) -> bool {
        self != HubLane::Answer
    }

    /// Its name in the server's metrics and log.
    pub fn name(self) -> &'static str {
        match self {
            HubLane::Answer => "answer",
            HubLane::Authenticate => "authn",
            HubLane::Authorize => "authz",
            HubLane::Render => "render",
        }
    }
}

/// What a request does, as an authorizer sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Attributes {
    Resource {
        verb: &'static str,
        kind: Resource,
        namespace: Option<String>,
        name: Option<String>,
    },
    Path {
        verb: &'static str,
        path: String,
    },
}

/// An authorizer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Not allowed, with the authorizer's reason (often empty).
    Denied(String),
}

/// A service account as the apiserver holds it, for the check its service-account
/// authenticator makes of every token (`pkg/serviceaccount/claims.go`): it exists, with
/// the uid the token claims, and is not being deleted.
#[derive(Clone, Debug, PartialEq)]
pub enum Account {
    /// Its uid, and when its deletion began (Unix seconds), if it did.
    Exists { uid: String, deleted: Option<f64> },
    /// `404`: no such service account.
    Gone,
    /// `403`: the hub may not read service accounts (a role without `get
    /// serviceaccounts`).
    Unreadable,
}

/// Makes the reviews (the apiserver, or a test's stand-in). An `Err` is a review that
/// could not be made.
pub trait Reviewer: Send + Sync {
    /// The user a token is, or `None` when it is not authenticated; for `audience` when
    /// given (a TokenReview's `spec.audiences`), else for the apiserver's own.
    fn token(&self, token: &Secret, audience: Option<&str>) -> Result<Option<User>, String>;
    /// Whether `user` may do `what`.
    fn access(&self, user: &User, what: &Attributes) -> Result<Decision, String>;
    /// Service account `namespace/name`, as the apiserver holds it.
    fn account(&self, namespace: &str, name: &str) -> Result<Account, String>;
}

/// Why a request does not go on here.
#[derive(Debug)]
pub enum Halt {
    /// Refused, in the apiserver's words.
    Refused(StatusError),
    /// It needs work that may wait (a review, a render): ask again on this lane.
    Lane(HubLane),
}

impl From<StatusError> for Halt {
    fn from(r: StatusError) -> Halt {
        Halt::Refused(r)
    }
}

/// The 429 a request over a review budget gets: come back after `wait` (whole seconds,
/// at least one, as `Retry-After` counts them).
pub fn over_budget(wait: Duration) -> Halt {
    let mut r = StatusError::too_many_requests();
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    r.retry_after = Some(secs.max(1));
    r.into()
}

/// A warning said at most every 10 seconds, with how many were left unsaid: an outage
/// seen by ten thousand followers is a line, not ten thousand.
#[derive(Default)]
pub struct Quiet(Mutex<(Option<Instant>, u64)>);

impl Quiet {
    pub fn warn(&self, say: impl FnOnce(&str)) {
        let mut q = self.0.lock().recover();
        let now = Instant::now();
        if q.0
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(10))
        {
            q.1 += 1;
            return;
        }
        let more = match q.1 {
            0 => String::new(),
            n => format!(" (and {n} more since the last such line)"),
        };
        *q = (Some(now), 0);
        say(&more);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        let secs = |w: Duration| match over_budget(w) {
            Halt::Refused(r) => (r.code, r.retry_after),
            Halt::Lane(_) => (0, None),
        };
        assert_eq!(secs(Duration::ZERO), (429, Some(1)));
        assert_eq!(secs(Duration::from_millis(10)), (429, Some(1)));
        assert_eq!(secs(Duration::from_millis(1500)), (429, Some(2)));
        assert_eq!(secs(Duration::from_secs(7)), (429, Some(7)));
    }

    /// A lane's number is its place in the server's list, built from `ALL`.
    #[test]
    fn each_lane_is_numbered_by_its_place() {
        for (i, lane) in HubLane::ALL.iter().enumerate() {
            assert_eq!(lane.index(), i, "{lane:?}");
        }
        let names: Vec<&str> = HubLane::ALL.iter().map(|l| l.name()).collect();
        assert_eq!(names, ["answer", "authn", "authz", "render"]);
    }
}
