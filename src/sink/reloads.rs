//! Where a reload path (the agent's signal, `--on-change`, `--reload-url`) reports each
//! outcome: readiness (`/readyz` fails until a reload succeeds) and the reload counter.

use crate::ops::health::ReloadOutcomes;
use crate::ops::metrics::Reloads;

/// Where a reload path reports each outcome: readiness and the reload counter.
#[derive(Clone, Debug, Default)]
pub struct ReloadReport {
    pub outcomes: ReloadOutcomes,
    pub counter: Reloads,
}

impl ReloadReport {
    pub fn report(&self, path: &str, outcome: Result<(), String>) {
        self.counter.record(outcome.is_ok());
        self.outcomes.report(path, outcome);
    }
}
