//! The hub's side of `POST hub_protocol::REPORT_PATH`: a follower's report, in this order —
//! its token authenticated by the hub's handler as every request's (401), then here: any
//! method but POST is a 405; the report is sent to a lane where reviews may wait (it is
//! always authorized, and its body is read there, off the server's thread); the
//! follower's report budget (`Fleet::rate`: 429 with `Retry-After`, before its body is
//! read, so a follower that floods costs a bounded rate of parses and reviews); the body
//! read and checked (`intake::read`: 400); `list` of each reported module's kind in its
//! namespace authorized as a list is (SubjectAccessReview, decisions kept: the first
//! refused is the 403 for the whole report, in the apiserver's words); then taken, 204.
//! A body over `MAX_REPORT` never gets here: the server answers 413 from its head.
//! Nothing of a report goes to the log at info.

use std::sync::Arc;
use std::time::Instant;

use super::intake;
use super::state::{Fleet, follower_name};
use crate::https::http::{Answer, Request};
use crate::hub_protocol::WAIT_HEADER;
use crate::ops::metrics::Served;
use crate::serve::auth::{Attributes, Auth, Halt, HubLane, User};
use crate::serve::status::StatusError;

/// What a report's answer needs of the hub.
pub struct Intake<'a> {
    pub fleet: &'a Fleet,
    pub auth: &'a Auth,
    pub served: &'a Served,
}

impl Intake<'_> {
    /// The answer to `req`, a request to `REPORT_PATH` from `user` (authenticated), on
    /// `lane`.
    pub fn answer(&self, req: &Request, user: &Arc<User>, lane: HubLane) -> Result<Answer, Halt> {
        if req.method != "POST" {
            return Err(StatusError::method_not_allowed().into());
        }
        if !lane.may_wait() {
            return Err(Halt::Lane(HubLane::Authorize));
        }
        let name = follower_name(user);
        let name = name.as_ref();
        let now = Instant::now();
        if let Err(wait) = self.fleet.rate(name, now) {
            self.served.fleet_report("limited");
            let mut r = StatusError::too_many_requests();
            r.retry_after = Some(wait.as_secs_f64().ceil().max(1.0) as u64);
            return Err(r.into());
        }
        let checked = intake::read(&req.body).inspect_err(|_| {
            self.served.fleet_report("invalid");
        })?;
        for (kind, ns) in checked.scopes() {
            let what = Attributes::Resource {
                verb: "list",
                kind,
                namespace: Some(ns.to_string()),
                name: None,
            };
            if let Err(e) = self.auth.authorize(user, &what, lane) {
                if matches!(&e, Halt::Refused(r) if r.code == 403) {
                    self.served.fleet_report("forbidden");
                }
                return Err(e);
            }
        }
        let wait = req
            .header(WAIT_HEADER)
            .and_then(|w| w.trim().parse::<u64>().ok());
        log::debug!(
            "report from {}: {} modules",
            crate::reason::cut(name, 64),
            checked.holds.len()
        );
        self.fleet.take(name, wait, checked, now);
        self.served.fleet_report("accepted");
        Ok(Answer {
            status: 204,
            content_type: "application/json",
            headers: Vec::new(),
            body: Default::default(),
        })
    }
}
