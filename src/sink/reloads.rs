//! Where a reload path (the agent's signal, `--on-change`, `--reload-url`) reports each
//! outcome: readiness (`/readyz` fails until a reload succeeds) and the reload counter.

use crate::ops::health::ReloadOutcomes;
use crate::ops::metrics::Reloads;

/// Where a reload path reports each outcome: readiness and the reload counter.
#[derive(Clone, Debug, Default)]
pub struct ReloadResults {
    pub outcomes: ReloadOutcomes,
    pub counter: Reloads,
}

impl ReloadResults {
    /// Reload path `path` is done: readiness and the counter hear how.
    pub fn done(&self, path: &str, outcome: Result<(), String>) {
        self.counter.record(outcome.is_ok());
        self.outcomes.set(path, outcome);
    }
}
