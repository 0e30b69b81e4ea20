//! The fleet as the hub sees it (issue 59): its followers' reports taken in
//! (`report.rs`, the endpoint; `intake.rs`, a report read and checked), what is kept of
//! each follower and when it was last heard from (`state.rs`: `Fleet`, bounded), and the
//! fleet's state per served object read off them (`view.rs`, made by `tally.rs`: for `/status`, `/metrics`,
//! and, `told.rs`, the Events that tell the objects' authors). docs/serve.md ("The fleet's state") is the user's account.

pub mod collected;
pub mod gate;
pub mod intake;
pub mod report;
pub mod state;
pub mod tally;
pub mod told;
pub mod view;

pub use self::state::Fleet;
