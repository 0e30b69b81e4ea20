//! The write-ahead sync of a batch. Writes go in chunks of `OutDir::chunk` modules: each
//! chunk's writes are decided and checked (`write.rs`), appended to the journal and synced
//! (nothing is written that the journal does not name), staged, synced to the volume all at
//! once, switched into place, and synced again before the record says they happened. The
//! record is saved, and the journal dropped, once the batch is done. A module that cannot
//! be written keeps its previous version and is retried next poll; a journal that cannot
//! be written stops the batch there (the rest waits for the next poll); a record that
//! cannot be saved (a full volume) leaves every module of the batch unwritten: what was
//! switched in is on disk and in the journal, which a restart finishes from, and the next
//! poll writes them again and saves the record. Nothing here stops the daemon.

use std::cell::OnceCell;
use std::collections::HashSet;
use std::io;
use std::time::Instant;

use super::paths::{STATE, meta_dir};
use super::record::Pending;
use super::sink::OutDir;
use super::write::Staged;
use crate::atomic;
use crate::batch::{Batch, Event};
use crate::ops::health::thousands;
use crate::ops::volume::{Volume, size};
use crate::reason::Unwritten;
use crate::source::ModuleFile;

/// How a batch's writes are going: what could not be written and why, the bytes of the
/// modules that found no room on the volume, and how far it is.
struct Progress {
    unwritten: Vec<Unwritten>,
    no_room: Vec<u64>,
    /// The folder's volume (`None`: unknown), asked once, when a write first failed.
    volume: OnceCell<Option<Volume>>,
    total: usize,
    done: usize,
    told: Instant,
}

impl Progress {
    fn new(total: usize) -> Progress {
        Progress {
            unwritten: Vec::new(),
            no_room: Vec::new(),
            volume: OnceCell::new(),
            total,
            done: 0,
            told: Instant::now(),
        }
    }

    /// `id` was not written, for `why`: logged, kept for the outcome.
    fn unwritten(&mut self, id: &str, why: &dyn std::fmt::Display) {
        log::warn!(
            "--out-dir: cannot write {id}: {why}; keeping the previous version, retrying next poll"
        );
        self.unwritten.push(Unwritten::new(id, why));
    }
}

impl OutDir {
    /// Applies the writes and removals (in this order); returns the modules left
    /// unwritten, and why.
    ///
    /// Writes go in chunks of `chunk` modules, each decided and checked, then recorded as
    /// pending (the journal synced), then made: contents are read from the spool again
    /// when written, and only one chunk's plans are held at once, so a batch of 100k
    /// modules (a first start) costs the memory of a few thousand. The removals come after
    /// the first chunk is recorded, before any write.
    pub(super) fn sync(
        &mut self,
        batch: &Batch,
        writes: Vec<&Event>,
        removals: Vec<String>,
    ) -> Vec<Unwritten> {
        let mut progress = Progress::new(writes.len());
        let mut chunks: Vec<&[&Event]> = writes.chunks(self.chunk).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        for (n, chunk) in chunks.iter().enumerate() {
            let planned = self.plan_chunk(batch, chunk, &mut progress);
            if let Err(e) = self.upkeep.journal() {
                let later = chunks[n + 1..].iter().flat_map(|c| c.iter().map(|e| e.id));
                let waiting = (n == 0).then_some(&removals).into_iter().flatten();
                let waiting = waiting.map(String::as_str).chain(later);
                self.unjournaled(&e, waiting, &mut progress);
                return progress.unwritten;
            }
            if n == 0 {
                for id in &removals {
                    if let Err(e) = self.upkeep.remove(id) {
                        log::warn!("--out-dir: cannot remove {id}: {e}");
                        let why = format!("cannot remove it: {e}");
                        progress.unwritten.push(Unwritten::new(id.as_str(), why));
                    }
                }
            }
            self.write_chunk(batch, planned, &mut progress);
        }
        let made = writes
            .iter()
            .map(|e| e.id)
            .chain(removals.iter().map(String::as_str));
        self.finish(progress, made)
    }

    /// Decides each write of a chunk into `record.pending`; what cannot be written is
    /// left out (and counted), the rest returned in order.
    fn plan_chunk<'a, 'e>(
        &mut self,
        batch: &Batch,
        chunk: &[&'a Event<'e>],
        progress: &mut Progress,
    ) -> Vec<&'a Event<'e>> {
        let mut planned = Vec::with_capacity(chunk.len());
        self.upkeep.pending_mut().clear();
        for &e in chunk {
            let plan = self
                .contents(batch, e)
                .and_then(|files| self.writer().plan(e.id, e.entry, &files));
            match plan {
                Ok(p) => {
                    self.upkeep.pending_mut().push(p);
                    planned.push(e);
                }
                Err(err) => progress.unwritten(e.id, &err),
            }
        }
        planned
    }

    /// The journal could not be written: without it nothing may be written, so this
    /// chunk and everything `waiting` (removals, later chunks) is left for the next poll;
    /// what earlier chunks wrote is in the journal, and the record takes it now.
    fn unjournaled<'a>(
        &mut self,
        e: &io::Error,
        waiting: impl Iterator<Item = &'a str>,
        progress: &mut Progress,
    ) {
        log::warn!("--out-dir: cannot record the writes to come: {e}");
        self.writing.clear();
        let why = format!("cannot record the writes to come: {e}");
        let pending = self.upkeep.pending_mut().drain(..).map(|p| p.module);
        let waiting = waiting.map(str::to_string);
        (progress.unwritten).extend(pending.chain(waiting).map(|id| Unwritten::new(id, &why)));
        if let Err(e) = self.upkeep.save_all() {
            log::warn!("--out-dir: cannot save the record: {e}");
        }
    }

    /// Stages every planned write of the chunk, syncs them all at once, then switches
    /// them into place and syncs again.
    fn write_chunk(&mut self, batch: &Batch, planned: Vec<&Event>, progress: &mut Progress) {
        let mut staged = Vec::with_capacity(planned.len());
        for (i, e) in planned.into_iter().enumerate() {
            let p = self.upkeep.record().pending[i].clone();
            match self
                .contents(batch, e)
                .and_then(|files| self.writer().stage(&p, &files))
            {
                Ok(s) => staged.push((p, s)),
                Err(err) => {
                    let bytes = batch.spool.meta(e.entry.loc).map_or(0, |m| m.bytes);
                    if err.kind() == io::ErrorKind::StorageFull {
                        progress.no_room.push(bytes);
                    }
                    let why = self.why_unwritten(&err, bytes, &progress.volume);
                    progress.unwritten(e.id, &why);
                }
            }
            self.count(progress);
        }
        if let Err(err) = atomic::sync_volume(self.upkeep.places().dir()) {
            // Not durable: nothing staged may be switched in.
            log::warn!("--out-dir: cannot sync the written files: {err}");
            for (p, s) in staged.drain(..) {
                self.discard(&p, &s);
                let why = format!("cannot sync the written files: {err}");
                progress.unwritten.push(Unwritten::new(p.module, why));
            }
        }
        for (p, s) in staged {
            let result = self
                .writer()
                .switch(&p, s)
                .and_then(|w| self.upkeep.install(&p.module, w));
            match result {
                Ok(()) => {}
                Err(err) => {
                    let why = self.why_unwritten(&err, 0, &progress.volume);
                    progress.unwritten(&p.module, &why);
                }
            }
        }
        // The switches (and removals) durable before the record says they happened.
        if let Err(err) = atomic::sync_volume(self.upkeep.places().dir()) {
            log::warn!("--out-dir: cannot sync the switched modules: {err}");
        }
    }

    /// Why a write failed, as readiness, `/status` and the log say it: the error and the
    /// volume's mount point, and for want of space, the room the module needs beside
    /// what is free (`bytes`: its files' size, or 0 where that is not known).
    fn why_unwritten(
        &self,
        err: &io::Error,
        bytes: u64,
        volume: &OnceCell<Option<Volume>>,
    ) -> String {
        let Some(v) = volume.get_or_init(|| Volume::of(self.upkeep.places().dir())) else {
            return err.to_string();
        };
        let at = match &v.mount {
            Some(m) => format!("the volume mounted at '{}'", m.display()),
            None => "its volume".to_string(),
        };
        match err.kind() {
            io::ErrorKind::StorageFull if bytes > 0 => format!(
                "{err}: it needs about {} and {at} has {} free",
                size(bytes),
                size(v.free)
            ),
            io::ErrorKind::StorageFull => format!("{err}: {at} has {} free", size(v.free)),
            _ => format!("{err} (on {at})"),
        }
    }

    /// One more module staged: readiness hears of it, and a long batch logs how far it is.
    fn count(&mut self, progress: &mut Progress) {
        progress.done += 1;
        self.writing.set(progress.done, progress.total);
        if progress.told.elapsed() >= self.progress_every {
            log::info!(
                "--out-dir: writing modules: {} of {}",
                thousands(progress.done),
                thousands(progress.total)
            );
            progress.told = Instant::now();
        }
    }

    /// The batch is done: old versions expired, the want of space told, the record saved
    /// and the journal dropped. A record that cannot be saved leaves the batch's modules
    /// (`made`: every write and removal it set out to make) unwritten (see the top of
    /// this file).
    fn finish<'a>(
        &mut self,
        mut progress: Progress,
        made: impl Iterator<Item = &'a str>,
    ) -> Vec<Unwritten> {
        self.upkeep.pending_mut().clear();
        self.writing.clear();
        if let Err(e) = self.upkeep.expire(true) {
            log::warn!("--out-dir: cannot delete old versions: {e}");
        }
        if !progress.no_room.is_empty() {
            let volume = crate::ops::volume::Volume::of(self.upkeep.places().dir())
                .map(|v| v.describe())
                .unwrap_or_else(|| "its volume".into());
            log::warn!(
                "--out-dir '{}': {} module(s) not written for want of space: they need about {} and {volume}; retrying next poll",
                self.upkeep.places().dir().display(),
                progress.no_room.len(),
                crate::ops::volume::size(progress.no_room.iter().sum()),
            );
        }
        if let Err(e) = self.upkeep.save_all() {
            let path = meta_dir(self.upkeep.places().dir()).join(STATE);
            let why = format!("cannot save the record '{}': {e}", path.display());
            log::warn!("--out-dir: {why}; writing the batch again next poll");
            let failed: HashSet<String> = (progress.unwritten.iter())
                .map(|u| u.module.clone())
                .collect();
            let done: Vec<&str> = made.filter(|id| !failed.contains(*id)).collect();
            (progress.unwritten).extend(done.into_iter().map(|id| Unwritten::new(id, &why)));
        }
        progress.unwritten
    }

    /// A module's contents, from the spool. If they cannot be read (a module the spool
    /// left in this folder at a start, whose files someone removed since), its record no
    /// longer vouches for what the folder holds: it loses its hash, so that neither the
    /// next poll nor the next run takes the folder for proof (see `shelf`), and the
    /// module is written again from the cluster's copy.
    pub(super) fn contents(&mut self, batch: &Batch, e: &Event) -> io::Result<Vec<ModuleFile>> {
        batch.files(e).inspect_err(|_| {
            self.upkeep.forget_hash(e.id);
        })
    }

    /// Removes a staged write that will not be switched in.
    fn discard(&self, p: &Pending, staged: &Staged) {
        match staged {
            Staged::Link { .. } => {
                if let Some((version, keys)) = p.written.placed.version() {
                    let _ = self.upkeep.places().delete_version(version, keys);
                }
            }
            Staged::Renames(renames) => self.upkeep.places().unstage(renames),
        }
    }
}
