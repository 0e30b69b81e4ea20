//! `--out-dir` as a sink: `OutDir` (the record with its places, the run's temporary-name
//! nonce and interned keys, the batch's progress, the lock) and which of a batch's modules
//! to write and remove (the first batch after a start reconciles the folder with the
//! cluster: unchanged modules are left as they are, modules gone meanwhile are removed),
//! the `flat` layout's key claims (or, in `concat` through an Alloy template, the modules
//! whose text would leave their block: refused), then the write-ahead sync; and the
//! housekeeping of each tick (expiring old versions).

use std::collections::BTreeSet;
use std::fs::File;
use std::time::Duration;

use super::folder::Places;
use super::options::Layout;
use super::paths::{Found, found};
use super::shelf::Proofs;
use super::upkeep::Upkeep;
use super::write::Writer;
use super::written::{Interner, Placed};
use crate::batch::{Batch, Change, Control, Event, Fatal, Outcome, Sink, View};
use crate::ops::health::Writing;
use crate::poll::snapshot::{Entry, folder_of};
use crate::reason::Rejection;

/// The output folder as cmpoll holds it: its record kept with its places (`Upkeep`), where
/// each batch is, and the lock. Opening it is `open.rs`; a batch's writes, `sync.rs`.
pub struct OutDir {
    pub(super) upkeep: Upkeep,
    pub(super) reconciled: bool,
    /// Part of every temporary name of this run, so that no name is ever reused.
    pub(super) nonce: String,
    /// Modules recorded as pending, then written, at a time (see `sync`).
    pub(super) chunk: usize,
    /// How far a batch is, for readiness; and how often a long one logs it.
    pub(super) writing: Writing,
    pub(super) progress_every: Duration,
    /// The key lists of modules, shared (see `written::Keys`).
    pub(super) keys: Interner,
    pub(super) _lock: File,
}

/// How often a batch that writes for long logs how far it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// `OutDir::chunk`: a few thousand plans (~0.5 KiB each) at once; a first batch of 100k
/// modules saves the record 26 times instead of twice.
const CHUNK: usize = 4096;

impl OutDir {
    /// The folder opened (`open.rs`): its record, recovered, with its places; the key
    /// lists the record holds; the run's nonce; the lock, held as long as it is.
    pub(super) fn new(upkeep: Upkeep, keys: Interner, nonce: String, lock: File) -> OutDir {
        OutDir {
            upkeep,
            reconciled: false,
            nonce,
            chunk: CHUNK,
            writing: Writing::default(),
            progress_every: PROGRESS_EVERY,
            keys,
            _lock: lock,
        }
    }

    /// The modules the record says this folder holds where the shelf reads them (see
    /// `shelf`).
    pub fn proofs(&self) -> Proofs {
        self.upkeep.proofs()
    }

    /// Reports how far each batch is into `writing` (readiness reads it).
    pub fn with_progress(mut self, writing: Writing) -> OutDir {
        self.writing = writing;
        self
    }

    /// The writer of one module at a time, into this folder.
    pub(super) fn writer(&mut self) -> Writer<'_> {
        Writer::new(&mut self.upkeep, &self.nonce, &mut self.keys)
    }

    /// Whether `id` is on disk as recorded, with this hash, layout and mode.
    pub(super) fn unchanged(&self, id: &str, entry: &Entry) -> bool {
        let Some(w) = self.upkeep.record().modules.get(id) else {
            return false;
        };
        if w.hash != Some(self.upkeep.places().recorded(&entry.hash))
            || w.mode != self.upkeep.places().mode_of(id)
        {
            return false;
        }
        let (folder, name) = folder_of(id);
        match (self.upkeep.places().opts().layout, &w.placed) {
            (Layout::Files, Placed::Version { version, files }) => {
                let Ok(Some(dir)) = self.upkeep.places().folder_dir(folder) else {
                    return false;
                };
                let Ok(Some(vdir)) = self.upkeep.places().version_dir(version) else {
                    return false;
                };
                let target = Places::link_target(folder, version);
                found(&dir.join(name)).ok() == Some(Found::Link(target))
                    && files.iter().all(|f| vdir.join(&**f).exists())
            }
            (Layout::Concat, Placed::File { file, .. }) => {
                self.upkeep.places().concat_name(id).ok().as_deref() == Some(&**file)
                    && found(&self.upkeep.places().dir().join(&**file)).ok() == Some(Found::File)
            }
            (Layout::Flat, Placed::Flat { files, left: None }) if !files.is_empty() => files
                .keys()
                .all(|k| found(&self.upkeep.places().dir().join(k)).ok() == Some(Found::File)),
            _ => false,
        }
    }
}

impl OutDir {
    /// `concat` through an Alloy template: a module whose text would leave the block the
    /// template puts it in is refused, never written, even without `--validate`.
    fn screen_template<'e>(
        &self,
        batch: &Batch,
        writes: Vec<&'e Event<'e>>,
    ) -> (Vec<&'e Event<'e>>, Vec<Rejection>) {
        let Some(t) = self
            .upkeep
            .places()
            .opts()
            .template
            .as_deref()
            .filter(|t| t.is_alloy())
        else {
            return (writes, Vec::new());
        };
        let mut rejected = Vec::new();
        let writes = (writes.into_iter())
            .filter(|e| {
                // Files that cannot be read are the write's to report.
                let why = batch.files(e).ok().and_then(|files| t.refuses(&files));
                match why {
                    Some(why) => {
                        rejected.push(Rejection::new(e.id, why));
                        false
                    }
                    None => true,
                }
            })
            .collect();
        (writes, rejected)
    }
}

impl Sink for OutDir {
    fn name(&self) -> &'static str {
        "out-dir"
    }

    fn apply(&mut self, batch: &Batch) -> Result<Outcome, Fatal> {
        let (writes, removals): (Vec<&Event>, Vec<String>) = if self.reconciled {
            let writes = batch
                .changes()
                .filter(|e| e.change != Change::Removed)
                .collect();
            let removals = batch
                .events
                .iter()
                .filter(|e| e.change == Change::Removed)
                .map(|e| e.id.to_string())
                .collect();
            (writes, removals)
        } else {
            // The first batch after a start: every module is "added"; the folder may
            // already hold some of them (in this layout or another), and some it holds may
            // be gone from the cluster.
            // A rejected module keeps what the folder has of it.
            let wanted: BTreeSet<&str> = batch.events.iter().map(|e| e.id).collect();
            let removals = self
                .upkeep
                .record()
                .modules
                .keys()
                .filter(|id| !wanted.contains(id))
                .map(|id| id.to_string())
                .collect();
            let writes = batch
                .changes()
                .filter(|e| !self.unchanged(e.id, e.entry))
                .collect();
            (writes, removals)
        };
        let (writes, rejected) = if self.upkeep.places().opts().layout == Layout::Flat {
            self.writer().claim_keys(batch, writes, &removals)
        } else {
            self.screen_template(batch, writes)
        };
        let unwritten = self.sync(batch, writes, removals);
        self.reconciled = true;
        Ok(Outcome {
            unwritten,
            rejected,
        })
    }

    fn tick(&mut self, _view: Option<&View>) -> Result<Control, Fatal> {
        if let Err(e) = self.upkeep.expire(false) {
            log::warn!("--out-dir: cannot delete old versions: {e}");
        }
        Ok(Control::Continue)
    }
}
