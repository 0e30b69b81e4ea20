//! The ways to the output folder's places: `Places` (the options it was opened with) gives
//! a module's folder, the version folders, a module's file mode and concat name, a flat
//! key's path, the hash the record keeps; and deletes a version folder or a staged write's
//! temporary files. It reads the disk (never through a symlink cmpoll did not make) and
//! holds no record: what cmpoll made is `upkeep.rs`'s `Upkeep`.

use std::io;
use std::path::{Path, PathBuf};

use super::options::Options;
use super::paths::{Found, VERSIONS, folder_in, found, meta_dir, part, versions_from};
use super::record;
use crate::atomic::{remove_dir_if_empty, remove_if_exists};
use crate::names::go_quote;
use crate::poll::hash::Hash;
use crate::poll::snapshot::NAME_MAX;
use crate::source::ModuleFile;
use crate::template;

/// The folder's places, from its options.
pub(super) struct Places {
    opts: Options,
}

impl Places {
    pub(super) fn new(opts: Options) -> Places {
        Places { opts }
    }

    /// What the folder was opened with.
    pub(super) fn opts(&self) -> &Options {
        &self.opts
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

    pub(super) fn concat_name(&self, id: &str) -> io::Result<String> {
        for c in id.split('/') {
            part(c)?;
        }
        // `NS.NAME{EXT}`, or `KIND.NS.NAME{EXT}` for a kind-qualified id.
        let file = format!("{}{}", id.replace('/', "."), self.opts.ext);
        if file.len() > NAME_MAX {
            // SPEC's concat name is NS.NAME{EXT}: valid names can make it too long.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "its concat file name '{file}' has {} bytes, more than a file name may have ({NAME_MAX}); the files layout can hold it",
                    file.len()
                ),
            ));
        }
        part(&file).map(str::to_string)
    }

    /// Why a file named `key` cannot be placed in this folder, if it cannot: a name that
    /// is not a path inside it (a folder annotation with `..`, or an absolute one
    /// elsewhere), a name cmpoll keeps for itself, or a folder on the way that is a file or
    /// a symlink cmpoll did not make.
    pub(super) fn unplaceable(&self, key: &str) -> Option<String> {
        let annotation = (self.opts.folder_annotation.as_deref())
            .map(|a| format!("--folder-annotation {a}: "))
            .unwrap_or_default();
        if let Err(e) = record::flat_path(key) {
            return Some(format!(
                "{annotation}file {} is not a path inside the output folder ({e})",
                go_quote(key)
            ));
        }
        let folder = key.rsplit_once('/')?.0;
        match self.folder_dir(folder) {
            Ok(_) => None,
            Err(e) => Some(format!("{annotation}file {}: {e}", go_quote(key))),
        }
    }

    /// `DIR/KEY`, where every folder on the way is a real folder (or not there yet).
    pub(super) fn flat_file(&self, key: &str) -> io::Result<std::path::PathBuf> {
        record::flat_path(key).map_err(io::Error::other)?;
        if let Some((folder, _)) = key.rsplit_once('/') {
            self.folder_dir(folder)?;
        }
        Ok(self.dir().join(key))
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

    /// Removes the temporary files of a staged write that will not be switched.
    pub(super) fn unstage(&self, renames: &[(String, String)]) {
        for (tmp, _) in renames {
            if let Ok(tmp) = part(tmp) {
                let _ = remove_if_exists(&self.dir().join(tmp));
            }
        }
    }
}
