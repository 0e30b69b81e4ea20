//! Writing one module in the `files` and `concat` layouts: the plan (names decided and
//! checked to be free or cmpoll's own before the write is recorded), the stage (a version
//! folder, or a temporary file, written unsynced), then, once the batch has synced every
//! staged write at once, the switch (a symlink swap, or a rename into place): methods of
//! `Writer`, which borrows the folder's `Upkeep` (record and places), the run's nonce and
//! the key interner for one step. The flat layout's plan, stage and switch are in
//! `flat.rs`.

use std::io;
use std::path::{Path, PathBuf};

use super::folder::Places;
use super::options::Layout;
use super::paths::{DIR_MODE, Found, digest, found, not_ours, part};
use super::record::{Pending, TMP_PREFIX};
use super::upkeep::Upkeep;
use super::written::{Digest, Interner, Keys, Placed, Written};
use crate::atomic::{self, create_dir};
use crate::poll::snapshot::{Entry, STEM_MAX, folder_of, stem};
use crate::source::ModuleFile;

/// One module's write, given the folder's record and places: its plan, its stage and its
/// switch. The batch (`sync.rs`) records every plan before anything is staged, and syncs
/// every stage before anything is switched.
pub(super) struct Writer<'a> {
    upkeep: &'a mut Upkeep,
    /// Part of every temporary name of this run, so that no name is ever reused.
    nonce: &'a str,
    /// The key lists of modules, shared (see `written::Keys`).
    keys: &'a mut Interner,
}

impl<'a> Writer<'a> {
    pub(super) fn new(
        upkeep: &'a mut Upkeep,
        nonce: &'a str,
        keys: &'a mut Interner,
    ) -> Writer<'a> {
        Writer {
            upkeep,
            nonce,
            keys,
        }
    }

    /// The record and places written to (`flat.rs` writes through them too).
    pub(super) fn upkeep(&self) -> &Upkeep {
        self.upkeep
    }

    pub(super) fn upkeep_mut(&mut self) -> &mut Upkeep {
        self.upkeep
    }

    /// A temporary name of this run: new, never reused.
    pub(super) fn tmp_name(&self, seq: u64) -> String {
        format!("{TMP_PREFIX}{seq:x}.{}", self.nonce)
    }

    /// Refuses a module path that is there but not what the record says cmpoll made.
    pub(super) fn check_ours(&self, id: &str, path: &Path) -> io::Result<()> {
        let w = self.upkeep.record().modules.get(id);
        let ours = match found(path)? {
            Found::Nothing => true,
            Found::Link(t) => (w.as_ref())
                .and_then(|w| w.placed.version())
                .is_some_and(|(v, _)| t == Places::link_target(folder_of(id).0, v)),
            Found::File => (w.as_ref())
                .and_then(|w| w.placed.file())
                .is_some_and(|(f, _)| path.file_name().and_then(|n| n.to_str()) == Some(f)),
            Found::Dir | Found::Other => false,
        };
        if ours { Ok(()) } else { Err(not_ours(path)) }
    }

    /// What writing `id` will create, decided and checked before it is recorded.
    pub(super) fn plan(
        &mut self,
        id: &str,
        entry: &Entry,
        files: &[ModuleFile],
    ) -> io::Result<Pending> {
        let seq = self.upkeep.next_seq();
        let (folder, name) = folder_of(id);
        let tmp = self.tmp_name(seq);
        let (mut new_namespace, mut new_kind) = (false, false);
        let mut folders = Vec::new();
        let (placed, tmp) = match self.upkeep.places().opts().layout {
            Layout::Files => {
                match self.upkeep.places().folder_dir(folder)? {
                    Some(dir) => {
                        self.check_ours(id, &dir.join(part(name)?))?;
                        if found(&dir.join(&tmp))? != Found::Nothing {
                            return Err(not_ours(&dir.join(&tmp)));
                        }
                    }
                    None => {
                        new_namespace = true;
                        new_kind = (folder.split_once('/')).is_some_and(|(kind, _)| {
                            found(&self.upkeep.places().dir().join(kind)).ok()
                                == Some(Found::Nothing)
                        });
                    }
                }
                let version = format!("{}.{seq:x}", stem(id, STEM_MAX));
                if found(&self.upkeep.places().versions().join(&version))? != Found::Nothing {
                    return Err(not_ours(&self.upkeep.places().versions().join(&version)));
                }
                let files = self.keys.keys(files.iter().map(|f| f.key.as_str()));
                let placed = Placed::Version {
                    version: version.into(),
                    files,
                };
                (placed, format!("{folder}/{tmp}"))
            }
            Layout::Concat => {
                let file = self.upkeep.places().concat_name(id)?;
                self.check_ours(id, &self.upkeep.places().dir().join(&file))?;
                if found(&self.upkeep.places().dir().join(&tmp))? != Found::Nothing {
                    return Err(not_ours(&self.upkeep.places().dir().join(&tmp)));
                }
                let placed = Placed::File {
                    file: file.into(),
                    digest: Some(digest(&self.upkeep.places().concat_content(id, files))),
                };
                (placed, tmp)
            }
            Layout::Flat => {
                let flat;
                (flat, folders) = self.plan_flat(files, &tmp)?;
                let placed = Placed::Flat {
                    files: flat,
                    left: None,
                };
                (placed, tmp)
            }
        };
        let written = Written {
            hash: Some(self.upkeep.places().recorded(&entry.hash)),
            mode: self.upkeep.places().mode_of(id),
            placed,
        };
        Ok(Pending {
            module: id.to_string(),
            written,
            tmp,
            new_namespace,
            new_kind,
            folders,
        })
    }

    /// Stages what `p` writes, unsynced: the files layout's version folder (and the
    /// namespace folder), or the temporary files to be renamed. Nothing a reader sees
    /// changes; the batch makes every staged write durable at once, then switches them.
    pub(super) fn stage(&mut self, p: &Pending, files: &[ModuleFile]) -> io::Result<Staged> {
        match &p.written.placed {
            Placed::Version {
                version,
                files: keys,
            } => self.stage_version(p, (version, keys), files),
            Placed::File { file, digest } => self.stage_concat(p, (file, digest.as_ref()), files),
            Placed::Flat { .. } => self.stage_flat(p, files),
        }
    }

    /// Puts a staged write in place (renames, unsynced); on failure, what was staged goes.
    pub(super) fn switch(&mut self, p: &Pending, staged: Staged) -> io::Result<Written> {
        match staged {
            Staged::Link { dir, tmp } => {
                let Some((version, keys)) = p.written.placed.version() else {
                    return Err(io::Error::other("a staged version folder without its name"));
                };
                let (folder, name) = folder_of(&p.module);
                let target = Places::link_target(folder, version);
                let placed = self
                    .check_ours(&p.module, &dir.join(part(name)?))
                    .and_then(|()| atomic::place_symlink(&dir, name, &tmp, &target));
                if let Err(e) = placed {
                    let _ = self.upkeep.places().delete_version(version, keys);
                    return Err(e);
                }
                Ok(p.written.clone())
            }
            Staged::Renames(renames) if matches!(p.written.placed, Placed::File { .. }) => {
                let placed = renames.iter().try_for_each(|(tmp, name)| {
                    self.check_ours(&p.module, &self.upkeep.places().dir().join(part(name)?))?;
                    atomic::place_file(self.upkeep.places().dir(), name, tmp)
                });
                if let Err(e) = placed {
                    self.upkeep.places().unstage(&renames);
                    return Err(e);
                }
                Ok(p.written.clone())
            }
            Staged::Renames(renames) => self.switch_flat(p, &renames),
        }
    }

    fn stage_version(
        &mut self,
        p: &Pending,
        (version, keys): (&str, &Keys),
        files: &[ModuleFile],
    ) -> io::Result<Staged> {
        let (folder, name) = folder_of(&p.module);
        let dir = self.upkeep.make_folder(folder)?;
        self.check_ours(&p.module, &dir.join(part(name)?))?;
        let vdir = self.upkeep.places().versions().join(part(version)?);
        create_dir(&vdir, DIR_MODE)?;
        let written = files.iter().try_for_each(|f| {
            atomic::create_new(&vdir.join(part(&f.key)?), f.content.bytes(), p.written.mode)
        });
        if let Err(e) = written {
            let _ = self.upkeep.places().delete_version(version, keys);
            return Err(e);
        }
        let tmp = p.tmp.rsplit('/').next().unwrap_or(&p.tmp).to_string();
        Ok(Staged::Link { dir, tmp })
    }

    fn stage_concat(
        &mut self,
        p: &Pending,
        (name, want): (&str, Option<&Digest>),
        files: &[ModuleFile],
    ) -> io::Result<Staged> {
        self.check_ours(&p.module, &self.upkeep.places().dir().join(part(name)?))?;
        let content = self.upkeep.places().concat_content(&p.module, files);
        if Some(&digest(&content)) != want {
            return Err(io::Error::other("its contents changed while being written"));
        }
        let tmp = self.upkeep.places().dir().join(part(&p.tmp)?);
        if let Err(e) = atomic::create_new(&tmp, &content, p.written.mode) {
            if e.kind() != io::ErrorKind::AlreadyExists {
                let _ = atomic::remove_if_exists(&tmp);
            }
            return Err(e);
        }
        Ok(Staged::Renames(vec![(p.tmp.clone(), name.into())]))
    }
}

/// A write staged by `Writer::stage`, switched into place by `Writer::switch`.
pub(super) enum Staged {
    /// The files layout: `DIR/FOLDER/NAME` (`dir`/NAME) becomes a symlink to the version
    /// folder, through a symlink at `dir/TMP`.
    Link { dir: PathBuf, tmp: String },
    /// The concat and flat layouts: `DIR/TMP` renamed over `DIR/NAME`, for each pair.
    Renames(Vec<(String, String)>),
}
