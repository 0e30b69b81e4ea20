//! `--out-dir DIR`: modules as files, switched atomically, with a record of what was written.
//!
//! `files` layout: `DIR/NS/NAME` is a symlink to `DIR/.cmpoll/versions/NS.NAME.SEQ/` (its
//! `NS.NAME` cut and hashed where the longest valid names would not fit a path element), a
//! complete, fsynced folder of the module's files; an update writes a new version folder and
//! swaps the symlink with `rename(2)` (kubelet's AtomicWriter), so a reader that resolves
//! the module path once reads one consistent version. Replaced versions stay readable for
//! `--old-version-ttl` before they are deleted. `concat` layout: `DIR/NS.NAME{EXT}`, the
//! files concatenated, written to a temporary file, fsynced and renamed. `flat` layout
//! (`flat.rs`): `DIR/KEY` for every file of every module, each replaced by rename; a key
//! belongs to the module that published it first, and a module that wants a key another
//! holds is rejected whole until the holder lets go.
//!
//! Ownership: `DIR/.cmpoll/state.json` (`record.rs`) lists every path cmpoll wrote. Before a
//! batch, the writes it is about to make are added to it (write-ahead), and only after each
//! target was checked to be absent or cmpoll's own; a file or symlink cmpoll did not write
//! blocks that module (it is retried every poll) and is never replaced or removed. After a
//! crash, a restart finishes or undoes what the record says was under way, adopting only
//! what it can prove it wrote: a symlink pointing at its own version folder, a file whose
//! bytes have the recorded SHA-256, a temporary name that did not exist when it was
//! recorded. The first batch after a start reconciles the folder with the cluster: modules
//! removed meanwhile are removed, unchanged ones are not touched (same inode and mtime),
//! and what an earlier run wrote in another layout is cleaned up. Nothing inside `DIR` is
//! reached through a symlink cmpoll did not make. `DIR/.cmpoll/lock` keeps a second cmpoll
//! out.
//!
//! The rooms, ground floor first: `options.rs` (what it is opened with), `paths.rs` (its
//! own names; looking at a path without following symlinks), `record.rs` (`state.json` and
//! the journal, checked on load), `folder.rs` (`Places`: the ways to its places, from the
//! options), `upkeep.rs` (`Upkeep`: the record, owned with the places and kept in step with
//! the disk; the journal and the record saved), `write.rs` and `flat.rs` (`Writer`: one
//! module's write: plan, stage, switch), `sync.rs` (the write-ahead sync of a batch),
//! `recover.rs` (after a crash: a function of the record at open), `open.rs` (opening and
//! locking), `sink.rs` (`OutDir`, the `Sink`), `shelf.rs` (the spool's shelf: delivered
//! modules read back).

mod flat;
mod folder;
mod open;
mod options;
mod paths;
mod record;
mod recover;
mod shelf;
mod sink;
mod sync;
mod upkeep;
mod write;
mod written;

pub use self::open::recorded;
pub use self::options::{FileModes, Layout, Options};
pub use self::paths::meta_dir;
pub use self::shelf::shelf;
pub use self::sink::OutDir;

#[cfg(test)]
mod tests;
