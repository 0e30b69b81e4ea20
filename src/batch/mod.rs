//! The batch: what a successful poll turns into and how it is delivered, in one home.
//!
//! - `event.rs`: what changed between what the sinks hold and the poll's snapshot
//!   (`Change`, `Event`, `diff`) and the counts that close a batch (`Synced`);
//! - `lines.rs`: their JSON shapes (SPEC "Events"), and a batch as JSON lines;
//! - `sink.rs`: what a sink is handed (`Batch`, `View`) and answers (`Outcome`, `Fatal`),
//!   and the `Sink` trait; the sinks themselves live in `crate::sink`, above;
//! - `delivery.rs`: `Delivery`, which makes a poll into a batch and delivers it: screen
//!   (`.url` keys fetched, `--validate`), deliver (the sinks in SPEC's order), settle (what
//!   is rejected or unwritten keeps its previous version; the new snapshot is current).
//!
//! Words: a module kept from the agent is **rejected** (by the validator, a failed `.url`
//! fetch, or a sink's refusal such as a `flat` name clash; announced once per content); a
//! module a sink could not write is **unwritten** (retried every poll).

mod delivery;
pub mod event;
pub mod lines;
pub mod sink;

pub use self::delivery::{Committed, Delivery};
pub use self::event::{Change, Event, Synced};
pub use self::sink::{Batch, Control, Fatal, Outcome, Sink, View};
