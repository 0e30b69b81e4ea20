//! `--out-dir DIR`: modules as files, switched atomically, with a record of what was written.
//!
//! `files` layout: `DIR/NS/NAME` is a symlink to `DIR/.cmpoll/versions/NS.NAME.SEQ/` (its
//! `NS.NAME` cut and hashed where the longest valid names would not fit a path element), a
//! complete, fsynced folder of the module's files; an update writes a new version folder and
//! swaps the symlink with `rename(2)` (kubelet's AtomicWriter), so a reader that resolves
//! the module path once reads one consistent version. Replaced versions stay readable for
//! `--old-version-ttl` before they are deleted. `concat` layout: `DIR/NS.NAME{EXT}`, the
//! files concatenated, written to a temporary file, fsynced and renamed. `flat` layout
//! (`flat.rs`): `DIR/KEY` for every file of every module, each replaced by rename; a key
//! belongs to the module that published it first, and a module that wants a key another
//! holds is rejected whole until the holder lets go.
//!
//! Ownership: `DIR/.cmpoll/state.json` (`record.rs`) lists every path cmpoll wrote. Before a
//! batch, the writes it is about to make are added to it (write-ahead), and only after each
//! target was checked to be absent or cmpoll's own; a file or symlink cmpoll did not write
//! blocks that module (it is retried every poll) and is never replaced or removed. After a
//! crash, a restart finishes or undoes what the record says was under way, adopting only
//! what it can prove it wrote: a symlink pointing at its own version folder, a file whose
//! bytes have the recorded SHA-256, a temporary name that did not exist when it was
//! recorded. The first batch after a start reconciles the folder with the cluster: modules
//! removed meanwhile are removed, unchanged ones are not touched (same inode and mtime),
//! and what an earlier run wrote in another layout is cleaned up. Nothing inside `DIR` is
//! reached through a symlink cmpoll did not make. `DIR/.cmpoll/lock` keeps a second cmpoll
//! out.

mod flat;
mod record;
mod recover;
mod shelf;
mod write;

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest as _, Sha256};

use self::record::{Digest, Interner, Pending, Record, Retired, Written, component};
pub use self::shelf::{Proofs, shelf};
use crate::atomic::{self, create_dir, fsync_dir, remove_dir_if_empty, remove_if_exists};
use crate::batch::event::{Change, Event};
use crate::batch::{Batch, Fatal, Outcome, Sink};
use crate::ops::health::{Writing, thousands};
use crate::poll::hash::Hash;
use crate::poll::snapshot::{Entry, folder_of};
use crate::source::{ModuleFile, Resource, Resources};
use crate::template;

/// cmpoll's own folder inside the output folder: the record, the lock, version folders,
/// and the spool and agent feed files.
pub const META: &str = ".cmpoll";
const VERSIONS: &str = "versions";
const STATE: &str = "state.json";
/// The write-ahead journal of the batch under way (see `sync`).
const JOURNAL: &str = "journal.jsonl";
const DIR_MODE: u32 = 0o755;

/// `DIR/.cmpoll`.
pub fn meta_dir(dir: &Path) -> PathBuf {
    dir.join(META)
}

/// Each module and its hash written; the modules of an interrupted batch.
pub type Recorded = (Vec<(String, Option<Hash>)>, Vec<String>);

/// What an output folder's own record says, for `cmpoll status --out-dir` (read only:
/// no lock, nothing written): each module with the hash written (`None`: left between two
/// versions by a failed write), and the modules of a batch a crash interrupted.
pub fn recorded(dir: &Path) -> Result<Recorded, String> {
    let meta = meta_dir(dir);
    let state_path = meta.join(STATE);
    let file = File::open(&state_path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => format!(
            "'{}' has no '{META}/{STATE}': not an output folder cmpoll has written",
            dir.display()
        ),
        _ => format!("cannot read '{}': {e}", state_path.display()),
    })?;
    let record = Record::read(file)
        .map_err(|e| format!("record '{}' is not valid: {e}", state_path.display()))?;
    let mut pending: Vec<String> = (record.pending.iter()).map(|p| p.module.clone()).collect();
    match fs::read(meta.join(JOURNAL)) {
        Ok(bytes) => {
            let journal = record::parse_journal(&bytes)
                .map_err(|e| format!("'{}': {e}", meta.join(JOURNAL).display()))?;
            pending.extend(journal.into_iter().map(|p| p.module));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(format!(
                "cannot read '{}': {e}",
                meta.join(JOURNAL).display()
            ));
        }
    }
    pending.sort();
    pending.dedup();
    let modules = (record.modules.iter())
        .map(|(id, w)| (id.to_string(), w.hash))
        .collect();
    Ok((modules, pending))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Files,
    Concat,
    Flat,
}

impl crate::words::Words for Layout {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("files", Layout::Files),
        ("concat", Layout::Concat),
        ("flat", Layout::Flat),
    ];
}

#[derive(Clone, Debug)]
pub struct Options {
    pub dir: PathBuf,
    pub layout: Layout,
    /// File name extension for `concat`.
    pub ext: String,
    pub file_modes: FileModes,
    pub old_version_ttl: Duration,
    /// What is listed: a module's kind follows from its id.
    pub kinds: Resources,
    /// `--folder-annotation` (flat), for messages.
    pub folder_annotation: Option<String>,
    /// `--module-template` and `--offer-arguments` (concat).
    pub template: Option<std::sync::Arc<template::Template>>,
}

/// The mode of written files, per kind (`--file-mode`, else 0644 and 0600 for a Secret's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileModes {
    pub configmaps: u32,
    pub secrets: u32,
}

impl FileModes {
    /// One mode for every kind.
    pub fn all(mode: u32) -> FileModes {
        FileModes {
            configmaps: mode,
            secrets: mode,
        }
    }

    pub fn of(self, kind: Resource) -> u32 {
        match kind {
            Resource::ConfigMaps => self.configmaps,
            Resource::Secrets => self.secrets,
        }
    }
}

impl Default for FileModes {
    /// A Secret's files are for the agent's user only.
    fn default() -> FileModes {
        FileModes {
            configmaps: 0o644,
            secrets: 0o600,
        }
    }
}

pub struct OutDir {
    opts: Options,
    record: Record,
    reconciled: bool,
    /// Part of every temporary name of this run, so that no name is ever reused.
    nonce: String,
    /// Modules recorded as pending, then written, at a time (see `sync`).
    chunk: usize,
    /// How far a batch is, for readiness; and how often a long one logs it.
    writing: Writing,
    progress_every: Duration,
    /// The key lists of modules, shared (see `record::Keys`).
    keys: Interner,
    _lock: File,
}

/// How often a batch that writes for long logs how far it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// `OutDir::chunk`: a few thousand plans (~0.5 KiB each) at once; a first batch of 100k
/// modules saves the record 26 times instead of twice.
const CHUNK: usize = 4096;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// A checked path component (see `record::component`).
fn part(s: &str) -> io::Result<&str> {
    component(s).map_err(invalid)
}

/// What is at a path, without following a symlink there.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Nothing,
    Dir,
    File,
    Link(PathBuf),
    Other,
}

fn found(path: &Path) -> io::Result<Found> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Found::Nothing),
        Err(e) => Err(e),
        Ok(m) if m.is_symlink() => Ok(Found::Link(fs::read_link(path)?)),
        Ok(m) if m.is_dir() => Ok(Found::Dir),
        Ok(m) if m.is_file() => Ok(Found::File),
        Ok(_) => Ok(Found::Other),
    }
}

fn not_a_folder(path: &Path) -> io::Error {
    io::Error::other(format!(
        "'{}' is not a folder cmpoll can write to (a file or a symlink it did not make)",
        path.display()
    ))
}

/// `DIR/FOLDER` (a module's folder in the `files` layout: `NS`, or `KIND/NS` for a
/// kind-qualified id) if every part of it is a real folder; `None` if a part is missing.
/// Anything else (a symlink, a file) is never reached through: an error.
fn folder_in(dir: &Path, folder: &str) -> io::Result<Option<PathBuf>> {
    let mut path = dir.to_path_buf();
    for c in folder.split('/') {
        path.push(part(c)?);
        match found(&path)? {
            Found::Dir => {}
            Found::Nothing => return Ok(None),
            _ => return Err(not_a_folder(&path)),
        }
    }
    Ok(Some(path))
}

/// `.cmpoll/versions` as seen from `DIR/FOLDER/` (`../` once per part of FOLDER).
fn versions_from(folder: &str) -> PathBuf {
    let mut p = PathBuf::new();
    for _ in folder.split('/') {
        p.push("..");
    }
    p.join(META).join(VERSIONS)
}

fn not_ours(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "'{}' exists and cmpoll did not write it; leaving it alone",
            path.display()
        ),
    )
}

impl OutDir {
    /// The hash the record keeps for a module of `hash` (with a template: mixed with it).
    fn recorded(&self, hash: &crate::poll::hash::Hash) -> crate::poll::hash::Hash {
        match &self.opts.template {
            Some(t) => t.recorded(hash),
            None => *hash,
        }
    }

    /// The bytes `concat` writes for module `id`: its files joined, or through the
    /// template.
    fn concat_content(&self, id: &str, files: &[ModuleFile]) -> Vec<u8> {
        template::concat(self.opts.template.as_deref(), id, files)
    }
}

fn digest(bytes: &[u8]) -> Digest {
    Digest(Sha256::digest(bytes).into())
}

/// The SHA-256 of a regular file (not through a symlink); `None` if it is not one.
fn file_digest(path: &Path) -> io::Result<Option<Digest>> {
    if found(path)? != Found::File {
        return Ok(None);
    }
    Ok(Some(digest(&fs::read(path)?)))
}

impl OutDir {
    /// Opens (creating if needed) and locks the folder, checks the record, then recovers
    /// from an interrupted run. Errors are start-up errors naming the folder.
    pub fn open(opts: Options) -> Result<OutDir, String> {
        let dir = opts.dir.clone();
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!("--out-dir '{}': {what}: {e}", dir.display())
        };
        fs::create_dir_all(&dir).map_err(|e| fail("cannot create it", &e))?;
        if !dir.is_dir() {
            return Err(fail("not a folder", &"it is a file"));
        }
        let meta = meta_dir(&dir);
        for d in [meta.clone(), meta.join(VERSIONS)] {
            match found(&d).map_err(|e| fail("cannot inspect it", &e))? {
                Found::Dir => {}
                Found::Nothing => {
                    create_dir(&d, DIR_MODE).map_err(|e| fail("cannot write to it", &e))?
                }
                _ => {
                    return Err(fail(
                        &format!("'{}' is not a folder cmpoll made", d.display()),
                        &"refusing to use it",
                    ));
                }
            }
        }
        // Writable where modules go, not only in .cmpoll.
        tempfile::tempfile_in(&dir).map_err(|e| fail("cannot write to it", &e))?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(meta.join("lock"))
            .map_err(|e| fail("cannot write to it", &e))?;
        lock.try_lock()
            .map_err(|_| fail("locked", &"another cmpoll is writing to this folder"))?;
        let state_path = meta.join(STATE);
        let record = match File::open(&state_path) {
            Ok(file) => Record::read(file).map_err(|e| {
                fail(
                    &format!(
                        "record '{}' is not valid (remove it to start afresh; cmpoll will then leave what it wrote before alone)",
                        state_path.display()
                    ),
                    &e,
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Record::new(),
            Err(e) => {
                return Err(fail(
                    &format!("cannot read '{}'", state_path.display()),
                    &e,
                ));
            }
        };
        let mut record = record;
        let journal_path = meta.join(JOURNAL);
        match fs::read(&journal_path) {
            Ok(bytes) => {
                let pending = record::parse_journal(&bytes).map_err(|e| {
                    fail(
                        &format!(
                            "journal '{}' is not valid (remove it and state.json to start afresh)",
                            journal_path.display()
                        ),
                        &e,
                    )
                })?;
                // Names made after the record was last saved are not made again.
                let seq = pending.iter().filter_map(|p| record::seq_of(&p.tmp)).max();
                record.seq = record.seq.max(seq.unwrap_or(0));
                record.pending.extend(pending);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(fail(
                    &format!("cannot read '{}'", journal_path.display()),
                    &e,
                ));
            }
        }
        let nonce = format!("{:08x}", crate::backoff::Rng::from_time().next_u64() as u32);
        let mut out = OutDir {
            opts,
            record,
            reconciled: false,
            nonce,
            chunk: CHUNK,
            writing: Writing::default(),
            progress_every: PROGRESS_EVERY,
            keys: Interner::default(),
            _lock: lock,
        };
        out.record.intern(&mut out.keys);
        out.recover()
            .map_err(|e| fail("cannot recover from the last run", &e))?;
        Ok(out)
    }

    /// The modules the record says this folder holds where the shelf reads them (see
    /// `shelf`).
    pub fn proofs(&self) -> Proofs {
        let layout = self.opts.layout;
        Proofs::new(self.record.modules.iter().filter_map(|(id, w)| {
            let placed = match layout {
                Layout::Files => w.version.is_some(),
                Layout::Flat => !w.flat.is_empty(),
                Layout::Concat => false,
            };
            Some((id, w.hash?)).filter(|_| placed)
        }))
    }

    /// Reports how far each batch is into `writing` (readiness reads it).
    pub fn reporting(mut self, writing: Writing) -> OutDir {
        self.writing = writing;
        self
    }

    fn dir(&self) -> &Path {
        &self.opts.dir
    }

    /// The mode of module `id`'s files.
    fn mode_of(&self, id: &str) -> u32 {
        self.opts.file_modes.of(self.opts.kinds.kind_of(id))
    }

    fn versions(&self) -> PathBuf {
        meta_dir(self.dir()).join(VERSIONS)
    }

    /// The symlink target of a version, relative to the module's folder `DIR/FOLDER/`.
    fn link_target(folder: &str, version: &str) -> PathBuf {
        versions_from(folder).join(version)
    }

    /// `DIR/FOLDER` (see `folder_in`).
    fn folder_dir(&self, folder: &str) -> io::Result<Option<PathBuf>> {
        folder_in(self.dir(), folder)
    }

    /// Makes `DIR/FOLDER`, part by part, recording each part it made.
    fn make_folder(&mut self, folder: &str) -> io::Result<PathBuf> {
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
    fn drop_folder(&mut self, folder: &str) -> io::Result<()> {
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
    fn version_dir(&self, version: &str) -> io::Result<Option<PathBuf>> {
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

    /// Writes the record, streamed: at 100k modules it is tens of MB of JSON, which a
    /// buffer would add to the peak RSS of every batch.
    fn save(&mut self) -> io::Result<()> {
        let meta = meta_dir(self.dir());
        remove_if_exists(&meta.join(".state.json.tmp"))?;
        atomic::replace_file_with(&meta, STATE, ".state.json.tmp", 0o644, |w| {
            serde_json::to_writer(w, &self.record).map_err(io::Error::other)
        })
    }

    /// Appends the chunk's pending writes (`record.pending`) to the journal and syncs it:
    /// the write-ahead of a chunk, one append however large the record has grown.
    fn journal(&mut self) -> io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let meta = meta_dir(self.dir());
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
    fn save_all(&mut self) -> io::Result<()> {
        self.save()?;
        let meta = meta_dir(self.dir());
        match fs::remove_file(meta.join(JOURNAL)) {
            Ok(()) => fsync_dir(&meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.record.seq += 1;
        self.record.seq
    }

    /// Makes `w` the record of `id`, and removes what the previous record had that `w`
    /// no longer uses (another layout's symlink or file; an old version is retired).
    fn install(&mut self, id: &str, w: Written) -> io::Result<()> {
        let old = self.record.modules.insert(id, w.clone());
        if let Some(old) = old {
            self.clear(id, old, Some(&w))?;
        }
        Ok(())
    }

    /// Removes what `old` recorded for `id` and `new` (if any) does not reuse, unsynced: the
    /// caller syncs the volume before the record that forgets them is saved.
    fn clear(&mut self, id: &str, old: Written, new: Option<&Written>) -> io::Result<()> {
        let (folder, name) = folder_of(id);
        if let Some(version) = &old.version
            && new.is_none_or(|n| n.version.is_none())
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
        if let Some(file) = &old.file
            && new.is_none_or(|n| n.file.as_ref() != Some(file))
        {
            let path = self.dir().join(part(file)?);
            if found(&path)? == Found::File {
                remove_if_exists(&path)?;
            }
        }
        self.clear_flat(&old, new)?;
        if let Some(version) = old.version
            && new.is_none_or(|n| n.version.as_ref() != Some(&version))
        {
            self.record.retired.push(Retired {
                version,
                files: old.files,
                since: now_secs(),
            });
        }
        Ok(())
    }

    /// Deletes a version folder: its recorded files, then the folder if that left it empty.
    fn delete_version(&self, version: &str, files: &[Box<str>]) -> io::Result<()> {
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
    fn expire(&mut self, at_start: bool) -> io::Result<()> {
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
    fn remove(&mut self, id: &str) -> io::Result<()> {
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

    /// Whether `id` is on disk as recorded, with this hash, layout and mode.
    fn unchanged(&self, id: &str, entry: &Entry) -> bool {
        let Some(w) = self.record.modules.get(id) else {
            return false;
        };
        if w.hash != Some(self.recorded(&entry.hash)) || w.mode != self.mode_of(id) {
            return false;
        }
        let (folder, name) = folder_of(id);
        match (self.opts.layout, &w.version, &w.file) {
            (Layout::Files, Some(v), _) => {
                let Ok(Some(dir)) = self.folder_dir(folder) else {
                    return false;
                };
                let Ok(Some(vdir)) = self.version_dir(v) else {
                    return false;
                };
                found(&dir.join(name)).ok() == Some(Found::Link(Self::link_target(folder, v)))
                    && w.files.iter().all(|f| vdir.join(&**f).exists())
            }
            (Layout::Concat, _, Some(f)) => {
                self.concat_name(id).ok().as_deref() == Some(f)
                    && found(&self.dir().join(&**f)).ok() == Some(Found::File)
            }
            (Layout::Flat, None, None) if !w.flat.is_empty() => w
                .flat
                .keys()
                .all(|k| found(&self.dir().join(k)).ok() == Some(Found::File)),
            _ => false,
        }
    }

    /// A module's contents, from the spool. If they cannot be read (a module the spool
    /// left in this folder at a start, whose files someone removed since), its record no
    /// longer vouches for what the folder holds: it loses its hash, so that neither the
    /// next poll nor the next run takes the folder for proof (see `shelf`), and the
    /// module is written again from the cluster's copy.
    fn contents(&mut self, batch: &Batch, e: &Event) -> io::Result<Vec<ModuleFile>> {
        batch.files(e).inspect_err(|_| {
            self.record.modules.update(e.id, |w| w.hash = None);
        })
    }

    /// Counts a module whose write failed (and, for want of space, its bytes).
    fn not_written(
        &self,
        failed: &mut Vec<(String, String)>,
        no_room: &mut Vec<u64>,
        (batch, e): (&Batch, &Event),
        err: &io::Error,
    ) {
        if err.kind() == io::ErrorKind::StorageFull {
            no_room.push(batch.spool.meta(e.entry.loc).map_or(0, |m| m.bytes));
        }
        log::warn!(
            "--out-dir: cannot write {}: {err}; keeping the previous version, retrying next poll",
            e.id
        );
        failed.push((e.id.to_string(), err.to_string()));
    }

    /// Removes a staged write that will not be switched in.
    fn discard(&self, p: &Pending, staged: &write::Staged) {
        match staged {
            write::Staged::Link { .. } => {
                if let Some(v) = &p.written.version {
                    let _ = self.delete_version(v, &p.written.files);
                }
            }
            write::Staged::Renames(renames) => self.unstage(renames),
        }
    }

    /// Applies the writes and removals (in this order); returns the modules that failed.
    ///
    /// Writes go in chunks of `chunk` modules, each decided and checked, then recorded as
    /// pending (the record saved), then made: contents are read from the spool again when
    /// written, and only one chunk's plans are held at once, so a batch of 100k modules
    /// (a first start) costs the memory of a few thousand. The removals come after the
    /// first chunk is recorded, before any write.
    fn sync(
        &mut self,
        batch: &Batch,
        writes: Vec<&Event>,
        removals: Vec<String>,
    ) -> Result<Vec<(String, String)>, Fatal> {
        let mut failed = Vec::new();
        // Bytes of the modules that found no room on the volume.
        let mut no_room: Vec<u64> = Vec::new();
        let (total, mut done) = (writes.len(), 0);
        let mut told = Instant::now();
        let mut removals = Some(removals);
        let mut chunks: Vec<&[&Event]> = writes.chunks(self.chunk).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        for (n, chunk) in chunks.iter().enumerate() {
            let mut planned: Vec<&Event> = Vec::with_capacity(chunk.len());
            self.record.pending.clear();
            for &e in *chunk {
                let plan = self
                    .contents(batch, e)
                    .and_then(|files| self.plan(e.id, e.entry, &files));
                match plan {
                    Ok(p) => {
                        self.record.pending.push(p);
                        planned.push(e);
                    }
                    Err(err) => {
                        log::warn!(
                            "--out-dir: cannot write {}: {err}; keeping the previous version, retrying next poll",
                            e.id
                        );
                        failed.push((e.id.to_string(), err.to_string()));
                    }
                }
            }
            if let Err(e) = self.journal() {
                // Without the record nothing may be written: the rest of the batch waits.
                log::warn!("--out-dir: cannot record the writes to come: {e}");
                self.writing.clear();
                let why = format!("cannot record the writes to come: {e}");
                failed.extend((self.record.pending.drain(..)).map(|p| (p.module, why.clone())));
                // What earlier chunks wrote is in the journal; the record takes it now.
                if let Err(e) = self.save_all() {
                    log::warn!("--out-dir: cannot save the record: {e}");
                }
                failed.extend((removals.into_iter().flatten()).map(|id| (id, why.clone())));
                failed.extend(
                    chunks[n + 1..]
                        .iter()
                        .flat_map(|c| c.iter().map(|e| (e.id.to_string(), why.clone()))),
                );
                return Ok(failed);
            }
            for id in removals.take().into_iter().flatten() {
                if let Err(e) = self.remove(&id) {
                    log::warn!("--out-dir: cannot remove {id}: {e}");
                    failed.push((id, format!("cannot remove it: {e}")));
                }
            }
            // Stage every write of the chunk, sync them all at once, then switch them.
            let mut staged = Vec::with_capacity(planned.len());
            for (i, e) in planned.into_iter().enumerate() {
                let p = self.record.pending[i].clone();
                match self
                    .contents(batch, e)
                    .and_then(|files| self.stage(&p, &files))
                {
                    Ok(s) => staged.push((p, s)),
                    Err(err) => self.not_written(&mut failed, &mut no_room, (batch, e), &err),
                }
                done += 1;
                self.writing.set(done, total);
                if told.elapsed() >= self.progress_every {
                    log::info!(
                        "--out-dir: writing modules: {} of {}",
                        thousands(done),
                        thousands(total)
                    );
                    told = Instant::now();
                }
            }
            if let Err(err) = atomic::sync_volume(self.dir()) {
                // Not durable: nothing staged may be switched in.
                log::warn!("--out-dir: cannot sync the written files: {err}");
                for (p, s) in staged.drain(..) {
                    self.discard(&p, &s);
                    failed.push((p.module, format!("cannot sync the written files: {err}")));
                }
            }
            for (p, s) in staged {
                let result = self.switch(&p, s).and_then(|w| self.install(&p.module, w));
                if let Err(err) = result {
                    log::warn!(
                        "--out-dir: cannot write {}: {err}; keeping the previous version, retrying next poll",
                        p.module
                    );
                    failed.push((p.module.clone(), err.to_string()));
                }
            }
            // The switches (and removals) durable before the record says they happened.
            if let Err(err) = atomic::sync_volume(self.dir()) {
                log::warn!("--out-dir: cannot sync the switched modules: {err}");
            }
        }
        self.record.pending.clear();
        self.writing.clear();
        if let Err(e) = self.expire(true) {
            log::warn!("--out-dir: cannot delete old versions: {e}");
        }
        if !no_room.is_empty() {
            let volume = crate::ops::volume::Volume::of(self.dir())
                .map(|v| v.describe())
                .unwrap_or_else(|| "its volume".into());
            log::warn!(
                "--out-dir '{}': {} module(s) not written for want of space: they need about {} and {volume}; retrying next poll",
                self.dir().display(),
                no_room.len(),
                crate::ops::volume::size(no_room.iter().sum()),
            );
        }
        self.save_all().map_err(|e| {
            Fatal(format!(
                "--out-dir: cannot save '{}': {e}",
                meta_dir(self.dir()).join(STATE).display()
            ))
        })?;
        Ok(failed)
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
            // A module held back (rejected) keeps what the folder has of it.
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
            (writes, Vec::new())
        };
        let failed = self.sync(batch, writes, removals)?;
        self.reconciled = true;
        Ok(Outcome {
            unwritten: failed,
            rejected,
        })
    }

    fn tick(&mut self, _view: Option<&crate::batch::View>) -> Result<crate::batch::Control, Fatal> {
        if let Err(e) = self.expire(false) {
            log::warn!("--out-dir: cannot delete old versions: {e}");
        }
        Ok(crate::batch::Control::Continue)
    }
}

#[cfg(test)]
mod tests;
