//! Writing one module in the `files` and `concat` layouts: the plan (names decided and
//! checked to be free or cmpoll's own before the write is recorded), then the write (a
//! version folder and a symlink swap, or a file renamed into place). The flat layout's
//! plan and write are in `flat.rs`.

use std::io;
use std::path::Path;

use super::record::{Pending, TMP_PREFIX, Written};
use super::{
    DIR_MODE, Found, Layout, NAME_MAX, OutDir, VERSION_STEM, concat_bytes, digest, found, not_ours,
    part, stem,
};
use crate::poll::snapshot::{Entry, split_id};
use crate::sink::atomic::{self, create_dir, fsync_dir};
use crate::source::ModuleFile;

impl OutDir {
    pub(super) fn concat_name(&self, id: &str) -> io::Result<String> {
        let (ns, name) = split_id(id);
        let file = format!("{}.{}{}", part(ns)?, part(name)?, self.opts.ext);
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

    /// A temporary name of this run: new, never reused.
    pub(super) fn tmp_name(&self, seq: u64) -> String {
        format!("{TMP_PREFIX}{seq:x}.{}", self.nonce)
    }

    /// Refuses a module path that is there but not what the record says cmpoll made.
    pub(super) fn check_ours(&self, id: &str, path: &Path) -> io::Result<()> {
        let w = self.record.modules.get(id);
        let ours = match found(path)? {
            Found::Nothing => true,
            Found::Link(t) => w
                .and_then(|w| w.version.as_deref())
                .is_some_and(|v| t == Self::link_target(v)),
            Found::File => w
                .and_then(|w| w.file.as_deref())
                .is_some_and(|f| path.file_name().and_then(|n| n.to_str()) == Some(f)),
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
        let seq = self.next_seq();
        let (ns, name) = split_id(id);
        let tmp = self.tmp_name(seq);
        let mut written = Written {
            hash: entry.hash.to_string(),
            mode: self.opts.file_mode,
            ..Written::default()
        };
        let mut new_namespace = false;
        let tmp = match self.opts.layout {
            Layout::Files => {
                match self.ns_dir(ns)? {
                    Some(ns_dir) => {
                        self.check_ours(id, &ns_dir.join(part(name)?))?;
                        if found(&ns_dir.join(&tmp))? != Found::Nothing {
                            return Err(not_ours(&ns_dir.join(&tmp)));
                        }
                    }
                    None => new_namespace = true,
                }
                let version = format!("{}.{seq:x}", stem(id, VERSION_STEM));
                if found(&self.versions().join(&version))? != Found::Nothing {
                    return Err(not_ours(&self.versions().join(&version)));
                }
                written.version = Some(version);
                written.files = files.iter().map(|f| f.key.clone()).collect();
                format!("{ns}/{tmp}")
            }
            Layout::Concat => {
                let file = self.concat_name(id)?;
                self.check_ours(id, &self.dir().join(&file))?;
                if found(&self.dir().join(&tmp))? != Found::Nothing {
                    return Err(not_ours(&self.dir().join(&tmp)));
                }
                written.digest = Some(digest(&concat_bytes(files)));
                written.file = Some(file);
                tmp
            }
            Layout::Flat => {
                written.flat = self.plan_flat(files, &tmp)?;
                tmp
            }
        };
        Ok(Pending {
            module: id.to_string(),
            written,
            tmp,
            new_namespace,
        })
    }

    pub(super) fn write(&mut self, p: &Pending, files: &[ModuleFile]) -> io::Result<Written> {
        match &p.written.version {
            Some(version) => self.write_version(p, version, files),
            None if p.written.file.is_some() => self.write_concat(p, files),
            None => self.write_flat(p, files),
        }
    }

    pub(super) fn write_version(
        &mut self,
        p: &Pending,
        version: &str,
        files: &[ModuleFile],
    ) -> io::Result<Written> {
        let (ns, name) = split_id(&p.module);
        let ns_dir = match self.ns_dir(ns)? {
            Some(d) => d,
            None => {
                let d = self.dir().join(part(ns)?);
                create_dir(&d, DIR_MODE)?;
                fsync_dir(self.dir())?;
                self.record.namespaces.insert(ns.to_string());
                d
            }
        };
        self.check_ours(&p.module, &ns_dir.join(part(name)?))?;
        let vdir = self.versions().join(part(version)?);
        create_dir(&vdir, DIR_MODE)?;
        let written = (|| {
            for f in files {
                atomic::write_new(
                    &vdir.join(part(&f.key)?),
                    f.content.bytes(),
                    self.opts.file_mode,
                )?;
            }
            fsync_dir(&vdir)?;
            fsync_dir(&self.versions())?;
            let tmp = p.tmp.rsplit('/').next().unwrap_or(&p.tmp);
            atomic::swap_symlink(&ns_dir, name, tmp, &Self::link_target(version))
        })();
        if let Err(e) = written {
            let _ = self.delete_version(version, &p.written.files);
            return Err(e);
        }
        Ok(p.written.clone())
    }

    pub(super) fn write_concat(
        &mut self,
        p: &Pending,
        files: &[ModuleFile],
    ) -> io::Result<Written> {
        let name = p.written.file.clone().unwrap_or_default();
        self.check_ours(&p.module, &self.dir().join(part(&name)?))?;
        let content = concat_bytes(files);
        if Some(digest(&content)) != p.written.digest {
            return Err(io::Error::other("its contents changed while being written"));
        }
        atomic::replace_file(self.dir(), &name, &p.tmp, &content, self.opts.file_mode)?;
        Ok(p.written.clone())
    }
}
