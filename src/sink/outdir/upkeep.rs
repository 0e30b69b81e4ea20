//! Keeping the folder and its record in step: a written module installed in the record
//! (and what its previous version no longer uses cleared), a module removed, replaced
//! versions retired and, after `--old-version-ttl`, deleted. Only what the record says
//! cmpoll wrote is ever removed.

use std::fs;
use std::io;

use super::folder::OutDir;
use super::paths::{Found, found, now_secs, part};
use super::record::Retired;
use super::written::Written;
use crate::atomic::{fsync_dir, remove_dir_if_empty, remove_if_exists};
use crate::poll::snapshot::folder_of;

impl OutDir {
    /// Makes `w` the record of `id`, and removes what the previous record had that `w`
    /// no longer uses (another layout's symlink or file; an old version is retired).
    pub(super) fn install(&mut self, id: &str, w: Written) -> io::Result<()> {
        let old = self.record.modules.insert(id, w.clone());
        if let Some(old) = old {
            self.clear(id, old, Some(&w))?;
        }
        Ok(())
    }

    /// Removes what `old` recorded for `id` and `new` (if any) does not reuse, unsynced: the
    /// caller syncs the volume before the record that forgets them is saved.
    pub(super) fn clear(
        &mut self,
        id: &str,
        old: Written,
        new: Option<&Written>,
    ) -> io::Result<()> {
        let (folder, name) = folder_of(id);
        if let Some((version, _)) = old.placed.version()
            && new.is_none_or(|n| n.placed.version().is_none())
        {
            // No longer in the files layout: the module's symlink goes, if it is still
            // the one cmpoll made, and the module's folder if that emptied it.
            match self.folder_dir(folder) {
                Ok(Some(dir)) => {
                    let link = dir.join(part(name)?);
                    match found(&link)? {
                        Found::Link(t) if t == Self::link_target(folder, version) => {
                            fs::remove_file(&link)?;
                        }
                        Found::Nothing => {}
                        _ => log::warn!(
                            "--out-dir: '{}' is no longer the link cmpoll made; leaving it",
                            link.display()
                        ),
                    }
                    self.drop_folder(folder)?;
                }
                Ok(None) => {}
                Err(e) => log::warn!("--out-dir: {e}; not looking inside it"),
            }
        }
        if let Some((file, _)) = old.placed.file()
            && new.is_none_or(|n| n.placed.file().map(|(f, _)| f) != Some(file))
        {
            let path = self.dir().join(part(file)?);
            if found(&path)? == Found::File {
                remove_if_exists(&path)?;
            }
        }
        self.clear_flat(&old, new)?;
        if let Some((version, files)) = old.placed.version()
            && new.is_none_or(|n| n.placed.version().map(|(v, _)| v) != Some(version))
        {
            self.record.retired.push(Retired {
                version: version.into(),
                files: files.clone(),
                since: now_secs(),
            });
        }
        Ok(())
    }

    /// Deletes a version folder: its recorded files, then the folder if that left it empty.
    pub(super) fn delete_version(&self, version: &str, files: &[Box<str>]) -> io::Result<()> {
        let Some(vdir) = self.version_dir(version)? else {
            return Ok(());
        };
        for f in files {
            remove_if_exists(&vdir.join(part(f)?))?;
        }
        if !remove_dir_if_empty(&vdir)? && vdir.exists() {
            log::warn!(
                "--out-dir: '{}' holds files cmpoll did not write; leaving it",
                vdir.display()
            );
        }
        Ok(())
    }

    /// Deletes retired versions older than the TTL, and saves the record if that changed
    /// it (at start the caller saves).
    pub(super) fn expire(&mut self, at_start: bool) -> io::Result<()> {
        let now = now_secs();
        let ttl = self.opts.old_version_ttl.as_secs();
        let (due, keep): (Vec<Retired>, Vec<Retired>) = std::mem::take(&mut self.record.retired)
            .into_iter()
            .partition(|r| now.saturating_sub(r.since) >= ttl);
        self.record.retired = keep;
        let changed = !due.is_empty();
        for r in due {
            if let Err(e) = self.delete_version(&r.version, &r.files) {
                log::warn!("--out-dir: cannot delete old version {}: {e}", r.version);
                self.record.retired.push(r);
            }
        }
        if changed {
            fsync_dir(&self.versions())?;
            if !at_start {
                self.save()?;
            }
        }
        Ok(())
    }

    /// Removes what cmpoll wrote for `id`.
    pub(super) fn remove(&mut self, id: &str) -> io::Result<()> {
        let Some(w) = self.record.modules.remove(id) else {
            return Ok(());
        };
        if let Err(e) = self.clear(id, w.clone(), None) {
            // Still recorded: tried again with the next removal or reconcile.
            self.record.modules.insert(id, w);
            return Err(e);
        }
        Ok(())
    }
}
