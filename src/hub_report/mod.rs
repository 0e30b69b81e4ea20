//! A follower (`cmpoll run` whose server is a `cmpoll serve` hub) tells its hub what it
//! holds (issue 59; `hub_protocol::Report` is the wire contract): `held.rs` makes the
//! report from what the sinks hold after a commit and the gate's refusals, `sender.rs`
//! sends it in the background, only when it changed, only to a hub. The observers of the
//! daemon's loop (`batch::Observers`) hand each commit's state over; nothing here delays
//! or fails a poll. docs/serve.md ("Followers report what they hold") is the user's
//! account.

mod held;
mod sender;

pub use self::held::{Refusal, report};
pub use self::sender::{HubReports, KubeHub};
