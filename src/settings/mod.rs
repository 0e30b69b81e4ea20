//! What we decided: the command line plus `CMPOLL_*` variables plus defaults, validated,
//! assembled into each layer's own options (`source::origin::Options`, `daemon::Options`,
//! every sink's `Options`). Settings own no option type of their own.
//!
//! One entry per command, each taking that command's own arguments, so a command wired to
//! another's settings does not compile: `list`, `run`, `sidecar` (k8s-sidecar's variables
//! made into `run`'s settings), `webhook`, `status`. Every usage error is born here, as one
//! line naming the flag (or the variable it came from) and what is wrong with it
//! (`lookup::Error`). The environment is a parameter, so tests need no global state.
//! Nothing here reads files or talks to the network: `source::origin::open` does that next.

mod lookup;
mod run;
mod serve;
mod sidecar;
mod source;
mod status;
#[cfg(test)]
mod testing;
mod webhook;

pub use self::run::{HealthRules, RunSettings, run};
pub use self::serve::serve;
pub use self::sidecar::sidecar;
pub use self::source::list;
pub use self::status::status;
pub use self::webhook::webhook;
