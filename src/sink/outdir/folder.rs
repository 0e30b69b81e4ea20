//! The output folder as cmpoll holds it: `OutDir` (its options, its record, the lock) and
//! the ways to its places: a module's folder, the version folders, a module's file mode,
//! the hash the record keeps. Opening it is `open.rs`; writing, `sync.rs` and `write.rs`.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::options::{Layout, Options};
use super::paths::{
    DIR_MODE, Found, VERSIONS, folder_in, found, meta_dir, not_a_folder, part, versions_from,
};
use super::record::Record;
use super::shelf::Proofs;
use super::written::Interner;
use crate::atomic::{create_dir, remove_dir_if_empty};
use crate::ops::health::Writing;
use crate::poll::hash::Hash;
use crate::source::ModuleFile;
use crate::template;

pub struct OutDir {
    pub(super) opts: Options,
    pub(super) record: Record,
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
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// `OutDir::chunk`: a few thousand plans (~0.5 KiB each) at once; a first batch of 100k
/// modules saves the record 26 times instead of twice.
pub(super) const CHUNK: usize = 4096;

impl OutDir {
    /// The modules the record says this folder holds where the shelf reads them (see
    /// `shelf`).
    pub fn proofs(&self) -> Proofs {
        let layout = self.opts.layout;
        Proofs::new(self.record.modules.iter().filter_map(|(id, w)| {
            let placed = match layout {
                Layout::Files => w.placed.version().is_some(),
                Layout::Flat => !w.placed.flat().is_empty(),
                Layout::Concat => false,
            };
            Some((id, w.hash?)).filter(|_| placed)
        }))
    }

    /// Reports how far each batch is into `writing` (readiness reads it).
    pub fn with_progress(mut self, writing: Writing) -> OutDir {
        self.writing = writing;
        self
    }

    pub(super) fn dir(&self) -> &Path {
        &self.opts.dir
    }

    /// The mode of module `id`'s files.
    pub(super) fn mode_of(&self, id: &str) -> u32 {
        self.opts.file_modes.of(self.opts.kinds.kind_of(id))
    }

    pub(super) fn versions(&self) -> PathBuf {
        meta_dir(self.dir()).join(VERSIONS)
    }

    /// The symlink target of a version, relative to the module's folder `DIR/FOLDER/`.
    pub(super) fn link_target(folder: &str, version: &str) -> PathBuf {
        versions_from(folder).join(version)
    }

    /// `DIR/FOLDER` (see `folder_in`).
    pub(super) fn folder_dir(&self, folder: &str) -> io::Result<Option<PathBuf>> {
        folder_in(self.dir(), folder)
    }

    /// Makes `DIR/FOLDER`, part by part, recording each part it made.
    pub(super) fn make_folder(&mut self, folder: &str) -> io::Result<PathBuf> {
        let mut path = self.dir().to_path_buf();
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
            match self.folder_dir(at)? {
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

    /// `DIR/.cmpoll/versions/VERSION` if it is a real folder.
    pub(super) fn version_dir(&self, version: &str) -> io::Result<Option<PathBuf>> {
        let path = self.versions().join(part(version)?);
        match found(&path)? {
            Found::Dir => Ok(Some(path)),
            Found::Nothing => Ok(None),
            _ => Err(io::Error::other(format!(
                "'{}' is not a folder cmpoll made",
                path.display()
            ))),
        }
    }

    /// The hash the record keeps for a module of `hash` (with a template: mixed with it).
    pub(super) fn recorded(&self, hash: &Hash) -> Hash {
        match &self.opts.template {
            Some(t) => t.recorded(hash),
            None => *hash,
        }
    }

    /// The bytes `concat` writes for module `id`: its files joined, or through the
    /// template.
    pub(super) fn concat_content(&self, id: &str, files: &[ModuleFile]) -> Vec<u8> {
        template::concat(self.opts.template.as_deref(), id, files)
    }

    pub(super) fn next_seq(&mut self) -> u64 {
        self.record.seq += 1;
        self.record.seq
    }
}
