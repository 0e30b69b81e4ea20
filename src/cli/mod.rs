//! The command line as typed. `table.rs` is the one table of flags and the commands that
//! take them (argh parses and prints `--help` from it; settings reads values by
//! `flag::NAME`); `entry.rs` is what one entry says and the macros that make the argh
//! fields and the `flag::NAME` constants from it; `hints.rs` is `--help` with variables,
//! typo suggestions and the warning about unknown `CMPOLL_*` variables.
//!
//! Adding a flag is one entry in `table.rs` and the code that reads it (HACKING.md has an
//! example). Values stay raw strings here; `settings` validates them.

#[macro_use]
mod entry;
mod hints;
mod service_link;
mod table;

pub use self::entry::{COMMANDS, Flag, Given, Group, Kind, Needs, Raw};
pub use self::hints::{help_with_variables, unknown_variables, with_suggestion};
pub use self::service_link::is_service_link;
pub use self::table::{
    Command, ListArgs, RunArgs, ServeArgs, SidecarArgs, StatusArgs, TopLevel, WebhookArgs, flag,
};
