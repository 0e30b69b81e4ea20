//! The hub's own endpoints: the probes (`/healthz`, `/livez`, `/readyz`, open as the
//! apiserver's), `/metrics` and `/status` (for who may `get` them, rendered on their lane),
//! and what the poll loop hands the hub for them or takes from it: its `--validate`
//! verdicts for `/status`, the fleet's gauges and what the fleet tells authors.

use std::time::{Instant, SystemTime};

use super::{Hub, status_page};
use crate::https::http::{Answer, Request};
use crate::locks::Recover;
use crate::serve::auth::{Attributes, Halt, HubLane};
use crate::serve::fleet::view::Which;
use crate::serve::request::{Query, Route};

impl Hub {
    /// `/healthz`, `/livez`, `/readyz` (open, as the apiserver's), `/metrics` and
    /// `/status` (for who may `get` them).
    pub(super) fn ops(
        &self,
        req: &Request,
        path: &'static str,
        route: &Route,
        query: &Query,
        lane: HubLane,
    ) -> Result<Answer, Halt> {
        let health = || self.health.lock().recover();
        match path {
            "/healthz" | "/livez" => {
                Ok(match health().liveness(Instant::now(), SystemTime::now()) {
                    Ok(()) => Answer::text(200, "ok\n"),
                    Err(why) => Answer::text(503, format!("{why}\n")),
                })
            }
            // Open to anyone, as the apiserver's: the reason is withheld (a poll's error
            // names the hub's account and the apiserver's address), as the apiserver
            // withholds its checks' reasons; `/status` and the log have it.
            "/readyz" => Ok(match health().withheld_readiness(Instant::now()) {
                Ok(()) => Answer::text(200, "ready\n"),
                Err(Some(why)) => Answer::text(503, format!("{why}\n")),
                Err(None) => Answer::text(
                    503,
                    "not ready: reason withheld (the hub's /status and log say why)\n",
                ),
            }),
            _ => {
                let (who, _) = self.who(req, route, query, lane)?;
                self.auth.authorize(
                    &who.user,
                    &Attributes::Path {
                        verb: "get",
                        path: path.to_string(),
                    },
                    lane,
                )?;
                if !lane.may_wait() {
                    // Rendered where it may take its time.
                    return Err(Halt::Lane(HubLane::Render));
                }
                Ok(match path {
                    "/metrics" => {
                        self.fleet_gauges();
                        Answer::metrics((self.metrics.lock().recover()).render())
                    }
                    _ => Answer::json(200, self.status()),
                })
            }
        }
    }

    /// `--validate`: what `/status` says of the hub's own verdicts (`Validated::status`).
    pub fn validation(&self, v: serde_json::Value) {
        self.said.lock().recover().validation = v;
    }

    /// `--rollout`: what `/status` says of the rollouts (`Rollouts::status`).
    pub fn rollouts(&self, v: serde_json::Value) {
        self.said.lock().recover().rollouts = v;
    }

    /// `cmpoll_rollouts{state}` and `cmpoll_rollout_steps_total{what}`: objects (rolling,
    /// refused) now, and the decisions this hub wrote.
    pub fn rollout_metrics(&self, (rolling, refused): (usize, usize), wrote: &[&str]) {
        self.served.rollouts("rolling", rolling);
        self.served.rollouts("refused", refused);
        for w in wrote {
            self.served.rollout_step(w);
        }
    }

    /// What the fleet's reports tell the authors of the objects served now (`fleet/told.rs`).
    pub fn fleet_notices(&self) -> Vec<crate::serve::telling::Notice> {
        match self.current() {
            Some(h) => {
                let now = Instant::now();
                let (objects, _) = (self.fleet).objects(&h, now, Which::Refused);
                crate::serve::fleet::told::notices(&objects, &h)
            }
            None => Vec::new(),
        }
    }

    /// `cmpoll_fleet_followers{state}`, as the fleet is now.
    pub(super) fn fleet_gauges(&self) {
        let held = self.current();
        let (_, totals) = match &held {
            Some(h) => self.fleet.objects(h, Instant::now(), Which::All),
            None => Default::default(),
        };
        for s in crate::serve::fleet::view::State::ALL {
            self.served.fleet_followers(s.word(), totals.get(s));
        }
    }

    /// `/status` (`status_page.rs`).
    pub(super) fn status(&self) -> Vec<u8> {
        let h = self.health.lock().recover();
        let (ready, last_error) = (
            h.readiness(Instant::now()),
            h.last_error().map(str::to_string),
        );
        drop(h);
        let held = self.current();
        // The fleet's view before the timeline is held: a publish waiting to write it
        // would hold the server's thread's reads behind this view.
        let fleet = self.fleet.status(held.as_deref(), Instant::now());
        let said = self.said.lock().recover();
        let (validation, rollouts) = (said.validation.clone(), said.rollouts.clone());
        drop(said);
        let timeline = self.timeline.read().recover();
        let seen = status_page::Seen {
            ready,
            last_error,
            held: held.as_deref(),
            history: &timeline.history,
            kinds: self.kinds,
            renders: &self.renders,
            fleet,
            validation,
            rollouts,
            collectors: (self.remotecfg.as_ref())
                .map_or(serde_json::Value::Null, |r| r.collectors.status()),
        };
        status_page::body(&seen)
    }
}
