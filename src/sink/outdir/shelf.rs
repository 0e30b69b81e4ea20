//! The output folder as the spool's shelf (`poll::spool::Shelf`): a delivered module's
//! files are read back where cmpoll wrote them instead of being kept a second time on the
//! same volume. `files`: through `DIR/NS/NAME`, which must be cmpoll's own symlink into
//! `.cmpoll/versions`; `flat`: `DIR/KEY`. Only regular files are read, never through a
//! symlink cmpoll did not make, never past the length the spool recorded; the spool checks
//! what it read against the module's hash. `concat` joins a module's files into one, so
//! it has no shelf.
//!
//! At a start, the first poll asks whether the folder already holds each module, while it
//! streams the list. Reading every file back to compare made a restart at 100k modules on
//! a disk take 9 s, or fail: the list outlived `--timeout` while it waited. Instead, when
//! no sink reads every module back in the first batch anyway, the folder's record is the
//! proof, in memory: it says cmpoll wrote this very content for this module. The first
//! batch checks the folder as it always did (a module whose files are not where the
//! record puts them is written again); one whose files cannot then be read back (someone
//! removed them) is not written in that batch, its record loses its hash, and it is
//! written from the cluster's copy by the next poll, or the next `--once`. A file changed
//! behind cmpoll's back is caught by the spool's hash check when the module is read.

use std::fs::File;
use std::io::{self, Read as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::options::{Layout, Options};
use super::paths::{Found, VERSIONS, folder_in, found, meta_dir, part, versions_from};
use crate::poll::hash::Hash;
use crate::poll::snapshot::folder_of;
use crate::poll::spool;
use crate::source::ModuleFile;

pub struct Shelf {
    dir: PathBuf,
    layout: Layout,
    /// What the record says the folder holds, until the first batch is done.
    proofs: Option<Proofs>,
}

/// The modules a record says the folder holds: for each, the first 16 bytes of the
/// SHA-256 of its id and hash, sorted (16 bytes a module, for the first poll only).
#[derive(Debug, Default)]
pub struct Proofs(Vec<[u8; 16]>);

impl Proofs {
    fn of(id: &str, hash: &Hash) -> [u8; 16] {
        let mut h = Sha256::new();
        h.update((id.len() as u64).to_be_bytes());
        h.update(id.as_bytes());
        h.update(hash.0);
        h.finalize()[..16].try_into().expect("16 bytes")
    }

    pub fn new<'a>(modules: impl Iterator<Item = (&'a str, Hash)>) -> Proofs {
        let mut v: Vec<[u8; 16]> = modules.map(|(id, h)| Proofs::of(id, &h)).collect();
        v.sort_unstable();
        Proofs(v)
    }

    fn has(&self, id: &str, hash: &Hash) -> bool {
        self.0.binary_search(&Proofs::of(id, hash)).is_ok()
    }
}

/// The shelf of an output folder, if its layout keeps each file as it is; with `proofs`,
/// the record answers the first poll's questions (see above).
pub fn shelf(opts: &Options, proofs: Option<Proofs>) -> Option<Box<dyn spool::Shelf>> {
    match opts.layout {
        Layout::Files | Layout::Flat => Some(Box::new(Shelf {
            dir: opts.dir.clone(),
            layout: opts.layout,
            proofs,
        })),
        Layout::Concat => None,
    }
}

fn missing(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, what)
}

impl Shelf {
    /// Where file `key` of module `id` is.
    fn path(&self, id: &str, key: &str) -> io::Result<PathBuf> {
        match self.layout {
            Layout::Files => {
                let (folder, name) = folder_of(id);
                let Some(dir) = folder_in(&self.dir, folder)? else {
                    return Err(missing(format!("'{folder}' is not a folder")));
                };
                let link = dir.join(part(name)?);
                let Found::Link(target) = found(&link)? else {
                    return Err(missing(format!("'{}' is not a symlink", link.display())));
                };
                let version = target
                    .strip_prefix(versions_from(folder))
                    .ok()
                    .and_then(Path::to_str)
                    .ok_or_else(|| missing(format!("'{}' is not cmpoll's", link.display())))?;
                let key = part(key)?;
                let vdir = meta_dir(&self.dir).join(VERSIONS).join(part(version)?);
                if found(&vdir)? != Found::Dir {
                    return Err(missing(format!("'{}' is not a folder", vdir.display())));
                }
                Ok(vdir.join(key))
            }
            Layout::Flat => {
                // A folder annotation's file: every folder on the way must be a real one.
                super::record::flat_path(key).map_err(io::Error::other)?;
                if let Some((folder, _)) = key.rsplit_once('/')
                    && folder_in(&self.dir, folder)?.is_none()
                {
                    return Err(missing(format!("'{folder}' is not a folder")));
                }
                Ok(self.dir.join(key))
            }
            Layout::Concat => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the concat layout keeps no file as it is",
            )),
        }
    }
}

impl spool::Shelf for Shelf {
    fn holds(&self, id: &str, hash: &Hash, _files: &[ModuleFile]) -> Option<bool> {
        Some(self.proofs.as_ref()?.has(id, hash))
    }

    fn settled(&mut self) {
        self.proofs = None;
    }

    fn read(&self, id: &str, key: &str, limit: u64) -> io::Result<Vec<u8>> {
        let path = self.path(id, key)?;
        let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
        let file = File::options()
            .read(true)
            .custom_flags(flags.bits() as i32)
            .open(&path)?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("'{}' is not the file cmpoll wrote", path.display()),
            ));
        }
        let mut buf = Vec::with_capacity(meta.len() as usize);
        file.take(limit + 1).read_to_end(&mut buf)?;
        if buf.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("'{}' grew past what cmpoll wrote", path.display()),
            ));
        }
        Ok(buf)
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}
