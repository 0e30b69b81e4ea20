//! Keeping the folder and its record in step: `Upkeep` owns the record (`state.json` and the
//! journal) with the places it speaks of. A folder made (and recorded) or dropped when
//! empty and cmpoll's, a written module installed in the record (and what its previous
//! version no longer uses cleared), a module removed, replaced versions retired and, after
//! `--old-version-ttl`, deleted; the journal appended and synced, the record saved. Only
//! what the record says cmpoll wrote is ever removed.

use std::fs::{self, File};
use std::io;
use std::path::PathBuf;

use super::folder::Places;
use super::options::Layout;
use super::paths::{
    DIR_MODE, Found, JOURNAL, STATE, file_digest, found, meta_dir, not_a_folder, now_secs, part,
};
use super::record::{Pending, Record, Retired};
use super::shelf::Proofs;
use super::written::{Digest, Written};
use crate::atomic::{self, create_dir, fsync_dir, remove_dir_if_empty, remove_if_exists};
use crate::poll::snapshot::folder_of;

/// The record, kept in step with the folder it speaks of.
pub(super) struct Upkeep {
    places: Places,
    record: Record,
}

impl Upkeep {
    pub(super) fn new(places: Places, record: Record) -> Upkeep {
        Upkeep { places, record }
    }

    pub(super) fn places(&self) -> &Places {
        &self.places
    }

    pub(super) fn record(&self) -> &Record {
        &self.record
    }

    /// The record, for a test to set what it says.
    #[cfg(test)]
    pub(super) fn record_mut(&mut self) -> &mut Record {
        &mut self.record
    }

    /// The writes of a chunk, recorded ahead (`journal` appends them); at open, the
    /// interrupted batch's, for recovery.
    pub(super) fn pending_mut(&mut self) -> &mut Vec<Pending> {
        &mut self.record.pending
    }

    /// Records `w` as what the folder holds of `id` without clearing anything: a write
    /// found half done (a flat write whose files are part old, part new).
    pub(super) fn record_as(&mut self, id: &str, w: Written) {
        self.record.modules.insert(id, w);
    }

    /// Records one more flat file as written for `id`, with the bytes' `digest`.
    pub(super) fn add_flat(&mut self, id: &str, key: String, digest: Digest) {
        self.record.modules.update(id, |w| w.add_flat(key, digest));
    }

    /// Forgets the hash of `id`'s record: the folder no longer vouches for its contents.
    pub(super) fn forget_hash(&mut self, id: &str) {
        self.record.modules.update(id, |w| w.hash = None);
    }

    /// Records `DIR/FOLDER` as made by cmpoll (a write recovery found it made).
    pub(super) fn adopt_folder(&mut self, folder: String) {
        self.record.namespaces.insert(folder);
    }

    /// Forgets `DIR/FOLDER`, which cmpoll made and removed.
    pub(super) fn forget_folder(&mut self, folder: &str) {
        self.record.namespaces.remove(folder);
    }

    /// The modules the record says this folder holds where the shelf reads them (see
    /// `shelf`).
    pub(super) fn proofs(&self) -> Proofs {
        let layout = self.places.opts().layout;
        Proofs::new(self.record.modules.iter().filter_map(|(id, w)| {
            let placed = match layout {
                Layout::Files => w.placed.version().is_some(),
                Layout::Flat => !w.placed.flat().is_empty(),
                Layout::Concat => false,
            };
            Some((id, w.hash?)).filter(|_| placed)
        }))
    }

    /// The next sequence number of this folder: names made from it are never reused.
    pub(super) fn next_seq(&mut self) -> u64 {
        self.record.seq += 1;
        self.record.seq
    }

    /// Makes `DIR/FOLDER`, part by part, recording each part it made.
    pub(super) fn make_folder(&mut self, folder: &str) -> io::Result<PathBuf> {
        let mut path = self.places.dir().to_path_buf();
        let mut made = String::new();
        for c in folder.split('/') {
            path.push(part(c)?);
            if !made.is_empty() {
                made.push('/');
            }
            made.push_str(c);
            match found(&path)? {
                Found::Dir => {}
                Found::Nothing => {
                    create_dir(&path, DIR_MODE)?;
                    self.record.namespaces.insert(made.clone());
                }
                _ => return Err(not_a_folder(&path)),
            }
        }
        Ok(path)
    }

    /// Removes `DIR/FOLDER`, then its parent, while each is empty and cmpoll made it.
    pub(super) fn drop_folder(&mut self, folder: &str) -> io::Result<()> {
        let mut at = folder;
        while self.record.namespaces.contains(at) {
            match self.places.folder_dir(at)? {
                Some(d) if !remove_dir_if_empty(&d)? => return Ok(()),
                _ => self.record.namespaces.remove(at),
            };
            match at.rsplit_once('/') {
                Some((parent, _)) => at = parent,
                None => break,
            }
        }
        Ok(())
    }

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
            match self.places.folder_dir(folder) {
                Ok(Some(dir)) => {
                    let link = dir.join(part(name)?);
                    match found(&link)? {
                        Found::Link(t) if t == Places::link_target(folder, version) => {
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
            let path = self.places.dir().join(part(file)?);
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

    /// Deletes retired versions older than the TTL, and saves the record if that changed
    /// it (at start the caller saves).
    pub(super) fn expire(&mut self, at_start: bool) -> io::Result<()> {
        let now = now_secs();
        let ttl = self.places.opts().old_version_ttl.as_secs();
        let (due, keep): (Vec<Retired>, Vec<Retired>) = std::mem::take(&mut self.record.retired)
            .into_iter()
            .partition(|r| now.saturating_sub(r.since) >= ttl);
        self.record.retired = keep;
        let changed = !due.is_empty();
        for r in due {
            if let Err(e) = self.places.delete_version(&r.version, &r.files) {
                log::warn!("--out-dir: cannot delete old version {}: {e}", r.version);
                self.record.retired.push(r);
            }
        }
        if changed {
            fsync_dir(&self.places.versions())?;
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

    /// Removes the flat files `old` has and `new` (if any) does not, each only while it
    /// still has the bytes cmpoll wrote; unsynced, as `clear`.
    pub(super) fn clear_flat(&mut self, old: &Written, new: Option<&Written>) -> io::Result<()> {
        for (key, want) in old.placed.flat() {
            if new.is_some_and(|n| n.placed.flat().contains_key(key)) {
                continue;
            }
            let path = match self.places.flat_file(key) {
                Ok(p) => p,
                Err(e) => {
                    log::warn!("--out-dir: {e}; not looking inside it");
                    continue;
                }
            };
            match file_digest(&path)? {
                Some(d) if &d == want => remove_if_exists(&path)?,
                None if found(&path)? == Found::Nothing => {}
                _ => log::warn!(
                    "--out-dir: '{}' changed since cmpoll wrote it; leaving it",
                    path.display()
                ),
            }
            // The folder it was in goes with its last file, if cmpoll made it.
            if let Some((folder, _)) = key.rsplit_once('/') {
                self.drop_folder(folder)?;
            }
        }
        Ok(())
    }

    /// Writes the record, streamed: at 100k modules it is tens of MB of JSON, which a
    /// buffer would add to the peak RSS of every batch.
    pub(super) fn save(&mut self) -> io::Result<()> {
        let meta = meta_dir(self.places.dir());
        remove_if_exists(&meta.join(".state.json.tmp"))?;
        atomic::replace_file_with(&meta, STATE, ".state.json.tmp", 0o644, |w| {
            serde_json::to_writer(w, &self.record).map_err(io::Error::other)
        })
    }

    /// Appends the chunk's pending writes (`record.pending`) to the journal and syncs it:
    /// the write-ahead of a chunk, one append however large the record has grown.
    pub(super) fn journal(&mut self) -> io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let meta = meta_dir(self.places.dir());
        let path = meta.join(JOURNAL);
        let new = !path.exists();
        let file = File::options()
            .create(true)
            .append(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&path)?;
        let mut w = io::BufWriter::with_capacity(64 * 1024, &file);
        for p in &self.record.pending {
            serde_json::to_writer(&mut w, p).map_err(io::Error::other)?;
            w.write_all(b"\n")?;
        }
        w.flush()?;
        drop(w);
        file.sync_data()?;
        if new {
            fsync_dir(&meta)?;
        }
        Ok(())
    }

    /// Saves the record, then drops the journal it now contains.
    pub(super) fn save_all(&mut self) -> io::Result<()> {
        self.save()?;
        let meta = meta_dir(self.places.dir());
        match fs::remove_file(meta.join(JOURNAL)) {
            Ok(()) => fsync_dir(&meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}
