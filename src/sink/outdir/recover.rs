//! Recovery after an interrupted run: the record's pending writes are finished or undone,
//! adopting only what can be proved to be cmpoll's (see the parent module), and namespace
//! folders an interrupted run made but never used are removed.

use std::collections::BTreeSet;
use std::io;

use super::folder::OutDir;
use super::paths::{Found, file_digest, found, part};
use super::record::Pending;
use crate::atomic::{fsync_dir, remove_dir_if_empty, remove_if_exists, sync_volume};
use crate::poll::snapshot::folder_of;

impl OutDir {
    /// Finishes or undoes the writes an interrupted run had recorded as pending, adopting
    /// only what it can prove it wrote.
    pub(super) fn recover(&mut self) -> io::Result<()> {
        let pending = std::mem::take(&mut self.record.pending);
        if !pending.is_empty() {
            log::info!(
                "--out-dir: recovering {} interrupted write(s)",
                pending.len()
            );
        }
        for p in pending {
            match (p.written.placed.version(), p.written.placed.file()) {
                (Some((v, _)), _) => self.recover_version(&p, v)?,
                (None, Some(_)) => self.recover_file(&p)?,
                (None, None) => self.recover_flat(&p)?,
            }
        }
        // A folder an interrupted run made but never put a file in (the deepest first:
        // `KIND/NS` before `KIND`).
        let mut used: BTreeSet<String> = BTreeSet::new();
        for (id, w) in self.record.modules.iter() {
            let folders = std::iter::once(folder_of(id).0)
                .filter(|_| w.placed.version().is_some())
                .chain((w.placed.flat().keys()).filter_map(|k| k.rsplit_once('/').map(|(f, _)| f)));
            for folder in folders {
                // The folder and every folder above it.
                let mut at = folder;
                loop {
                    used.insert(at.to_string());
                    match at.rsplit_once('/') {
                        Some((parent, _)) => at = parent,
                        None => break,
                    }
                }
            }
        }
        let mut unused: Vec<String> = (self.record.namespaces.iter())
            .filter(|f| !used.contains(f.as_str()))
            .cloned()
            .collect();
        // (Sorted deepest first: a folder before the folder it is in.)
        unused.sort_by_key(|f| std::cmp::Reverse(f.matches('/').count()));
        for folder in unused {
            if let Ok(Some(d)) = self.folder_dir(&folder)
                && remove_dir_if_empty(&d)?
            {
                self.record.namespaces.remove(&folder);
            }
        }
        self.expire(true)?;
        // What recovery removed or adopted, durable before the record says so.
        sync_volume(self.dir())?;
        // A record that cannot be saved now (a full volume) is no reason not to start:
        // the journal still holds what was recovered, and the first batch saves it.
        if let Err(e) = self.save_all() {
            log::warn!(
                "--out-dir: cannot save the record after recovering: {e}; the first batch saves it"
            );
        }
        Ok(())
    }

    fn recover_version(&mut self, p: &Pending, version: &str) -> io::Result<()> {
        let (folder, name) = folder_of(&p.module);
        let dir = match self.folder_dir(folder) {
            Ok(d) => d,
            Err(e) => {
                log::warn!("--out-dir: {e}; not looking inside it");
                None
            }
        };
        let mut switched = false;
        if let Some(dir) = dir {
            if p.new_namespace {
                // It did not exist when the write was recorded (nor, with `new_kind`, the
                // kind's folder above it): this run made it.
                self.record.namespaces.insert(folder.to_string());
                if let (true, Some((kind, _))) = (p.new_kind, folder.split_once('/')) {
                    self.record.namespaces.insert(kind.to_string());
                }
            }
            let tmp = self.dir().join(&p.tmp);
            if matches!(found(&tmp)?, Found::Link(_)) {
                remove_if_exists(&tmp)?;
            }
            let target = Self::link_target(folder, version);
            switched = found(&dir.join(part(name)?))? == Found::Link(target);
        }
        if switched {
            // The switch happened: the new version is the module now.
            self.install(&p.module, p.written.clone())?;
        } else {
            let files = p.written.placed.version().map(|(_, f)| f.clone());
            self.delete_version(version, &files.unwrap_or_default())?;
        }
        Ok(())
    }

    fn recover_file(&mut self, p: &Pending) -> io::Result<()> {
        let tmp = self.dir().join(part(&p.tmp)?);
        if found(&tmp)? == Found::File {
            remove_if_exists(&tmp)?;
        }
        let Some((file, digest)) = p.written.placed.file() else {
            return Ok(());
        };
        let path = self.dir().join(part(file)?);
        let adopted = digest.is_some() && file_digest(&path)?.as_ref() == digest;
        if adopted {
            // Renamed into place before the crash: byte for byte what cmpoll wrote.
            self.install(&p.module, p.written.clone())?;
        }
        // Otherwise what is there is the old version (still recorded as such) or not
        // cmpoll's at all: either way it is left as it is.
        fsync_dir(self.dir())
    }
}
