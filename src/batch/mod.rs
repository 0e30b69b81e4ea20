//! The batch: what a successful poll turns into and how it is delivered, in one home.
//!
//! - `event.rs`: what changed between what the sinks hold and the poll's snapshot
//!   (`Change`, `Event`, `diff`) and the counts that close a batch (`Synced`);
//! - `lines.rs`: their JSON shapes (SPEC "Events"), and a batch as JSON lines;
//! - `sink.rs`: what a sink is handed (`Batch`, `View`) and answers (`Outcome`, `Fatal`),
//!   and the `Sink` trait; the sinks themselves live in `crate::sink`, above;
//! - `delivery.rs`: `Delivery`, which makes a poll into a batch and delivers it: screen
//!   (`.url` keys fetched, `--validate`), deliver (the sinks in SPEC's order), settle (what
//!   is rejected or unwritten keeps its previous version; the new snapshot is current),
//!   put back (`--confirm`). It returns a `Record` of what happened (`Committed`, which
//!   makes the new snapshot current once the observers read it);
//! - `confirm.rs`: `--confirm`'s state (`Confirm`: what is unconfirmed, whether the agent
//!   is due to be asked, the put-backs owed); asking the agent says what must go back,
//!   which the delivery puts back through its `deliver` loop;
//! - `rejected.rs`: the modules rejected now, as the delivery remembers them;
//! - `observe.rs`: `Observers` (the log, metrics, readiness, Events, `/status`), owned by
//!   the daemon's loop, which hands them the `Record` of each commit and a poll's outcome
//!   (the hub's loop tells them that too).
//!
//! Words: a module kept from the agent is **rejected** (by the validator, a failed `.url`
//! fetch, a sink's refusal such as a `flat` name clash, or the agent's answer to
//! `--confirm`; announced once per content; `reason::Rejection`); a module a sink could not
//! write is **unwritten** (retried every poll; `reason::Unwritten`).

mod confirm;
mod delivery;
pub mod event;
pub mod lines;
mod observe;
mod rejected;
pub mod sink;

pub use self::delivery::Delivery;
pub use self::event::{Change, Event, Synced};
pub use self::observe::Observers;
pub use self::sink::{Batch, Control, Fatal, Outcome, Sink, View};
