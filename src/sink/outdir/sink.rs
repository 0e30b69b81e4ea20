//! `--out-dir` as a sink: which of a batch's modules to write and remove (the first batch
//! after a start reconciles the folder with the cluster: unchanged modules are left as
//! they are, modules gone meanwhile are removed), the `flat` layout's key claims (or, in
//! `concat` through an Alloy template, the modules whose text would leave their block:
//! refused), then the write-ahead sync; and the housekeeping of each tick (expiring old versions).

use std::collections::BTreeSet;

use super::folder::OutDir;
use super::options::Layout;
use super::paths::{Found, found};
use super::written::Placed;
use crate::batch::{Batch, Change, Control, Event, Fatal, Outcome, Sink, View};
use crate::poll::snapshot::{Entry, folder_of};
use crate::reason::Rejection;

impl OutDir {
    /// Whether `id` is on disk as recorded, with this hash, layout and mode.
    pub(super) fn unchanged(&self, id: &str, entry: &Entry) -> bool {
        let Some(w) = self.record.modules.get(id) else {
            return false;
        };
        if w.hash != Some(self.recorded(&entry.hash)) || w.mode != self.mode_of(id) {
            return false;
        }
        let (folder, name) = folder_of(id);
        match (self.opts.layout, &w.placed) {
            (Layout::Files, Placed::Version { version, files }) => {
                let Ok(Some(dir)) = self.folder_dir(folder) else {
                    return false;
                };
                let Ok(Some(vdir)) = self.version_dir(version) else {
                    return false;
                };
                let target = Self::link_target(folder, version);
                found(&dir.join(name)).ok() == Some(Found::Link(target))
                    && files.iter().all(|f| vdir.join(&**f).exists())
            }
            (Layout::Concat, Placed::File { file, .. }) => {
                self.concat_name(id).ok().as_deref() == Some(&**file)
                    && found(&self.dir().join(&**file)).ok() == Some(Found::File)
            }
            (Layout::Flat, Placed::Flat { files, left: None }) if !files.is_empty() => files
                .keys()
                .all(|k| found(&self.dir().join(k)).ok() == Some(Found::File)),
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
        let Some(t) = self.opts.template.as_deref().filter(|t| t.is_alloy()) else {
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
                .record
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
        let (writes, rejected) = if self.opts.layout == Layout::Flat {
            self.claim_keys(batch, writes, &removals)
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
        if let Err(e) = self.expire(false) {
            log::warn!("--out-dir: cannot delete old versions: {e}");
        }
        Ok(Control::Continue)
    }
}
