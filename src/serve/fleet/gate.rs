//! A rollout's gate, as one hub sees it (`serve::rollout`): of the followers this hub
//! knows that follow an object (a scope of theirs selects it), those of the current step
//! (their cohort below its threshold) — how many hold the version the step serves them
//! (their watch, or their waiting list, has come to the version at which the hub served it
//! to their cohort), whether one refused it (its report names the object with a refusal of
//! a version the hub served as this one), and how many are gone (silent past their wait
//! and a margin: they hold nothing). Also the lowest cohort among all the object's
//! followers, so that a step's threshold can take in at least one.

use std::time::{Duration, Instant};

use super::intake::By;
use super::state::Fleet;
use crate::serve::held::HeldObject;
use crate::source::Resource;

/// A step, as the gate is asked about it.
pub struct Step<'a> {
    pub kind: Resource,
    /// The version the step serves (its labels are what the followers' selectors see).
    pub object: &'a HeldObject,
    /// The step's threshold: followers of a lower cohort are in it.
    pub below: f64,
    /// The version at which the hub serves the step's version to a cohort (`None`: not to
    /// that one yet).
    pub served_at: &'a dyn Fn(f64) -> Option<u64>,
    /// The versions at which the hub served the step's version (to any cohort): a
    /// refusal of the object at one of these, exactly, is a refusal of it (a report cannot
    /// refuse a version before it exists).
    pub served: &'a [u64],
    /// Whether the lowest cohort among the object's followers is asked (a pass over
    /// every follower; else only those of the step are looked at past their cohort).
    pub lowest: bool,
}

/// A follower gone for longer than this no longer counts in a step (its pod deleted, or
/// its watch moved to the other hub behind the Service): until then it holds the step.
pub const GONE_COUNTS: Duration = Duration::from_secs(300);

/// What the gate found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gate {
    /// Followers of the step.
    pub followers: u32,
    /// Of them, those that hold its version.
    pub holding: u32,
    /// Of them, those gone.
    pub gone: u32,
    /// The first refusal found: the follower, by what, why.
    pub refused: Option<(String, By, String)>,
    /// The lowest cohort among the object's followers (any step), when asked.
    pub lowest: Option<f64>,
}

impl Gate {
    /// Whether every follower of the step holds its version, and none refused it.
    pub fn holds(&self) -> bool {
        self.refused.is_none() && self.holding == self.followers
    }
}

impl Fleet {
    /// The gate of `step` now.
    pub fn gate(&self, step: &Step, now: Instant) -> Gate {
        let followers = self.read(now);
        let key = step.object.key();
        let mut out = Gate::default();
        for (name, f) in &followers.map {
            let h = f.cohort;
            if h >= step.below && !step.lowest {
                continue;
            }
            let matching = f
                .scopes
                .iter()
                .filter(|s| s.filter.kind == step.kind && s.filter.passes(step.object));
            let Some(position) = matching.map(|s| s.position()).max() else {
                continue;
            };
            if step.lowest {
                out.lowest = Some(out.lowest.map_or(h, |l: f64| l.min(h)));
            }
            if h >= step.below {
                continue;
            }
            out.followers += 1;
            let told = (f.holds.iter()).find(|x| x.kind == step.kind && *x.key == *key);
            let refused = told.and_then(|x| x.refused.as_ref()).filter(|r| {
                r.resource_version
                    .is_some_and(|rv| step.served.contains(&rv))
            });
            if let Some(r) = refused {
                if out.refused.is_none() {
                    out.refused = Some((name.to_string(), r.by, r.reason.to_string()));
                }
                continue;
            }
            if self.gone(f, now) {
                if now.saturating_duration_since(self.seen_at(f)) > GONE_COUNTS {
                    out.followers -= 1;
                } else {
                    out.gone += 1;
                }
                continue;
            }
            // A follower that reported holding otherwise (unwritten, an older version)
            // holds what it said.
            let otherwise = told.is_some_and(|x| {
                x.resource_version
                    .is_none_or(|rv| !step.served.contains(&rv))
            });
            let reached = (step.served_at)(h).is_some_and(|at| position >= at);
            if reached && !otherwise {
                out.holding += 1;
            }
        }
        out
    }
}
