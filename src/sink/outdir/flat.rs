//! The `flat` layout (k8s-sidecar's default): every file of every module at `DIR/KEY`.
//!
//! A key belongs to the module that published it first. Before a batch is written,
//! `claim_keys` hands out keys: removals free theirs first, then modules that already hold
//! keys are updated, then new ones claim theirs, each group in module-name order, so a key
//! that its holder drops or gives up goes to the waiting module in the same batch. A module
//! that wants a key another module holds is rejected whole, with a reason naming both and
//! the key; it is tried again on every poll. Each file is replaced by rename; a module's
//! files switch one by one, not together (there is no folder to swap). The record keeps
//! the SHA-256 of every file cmpoll wrote: a file is only replaced or removed while it
//! still has those bytes, so one edited or put there by someone else is left alone.
//!
//! Here, `Writer`'s flat half: the key claims, and a flat write's plan, stage and switch.
//! Clearing flat files is the record's upkeep (`upkeep.rs`), finishing an interrupted flat
//! write is recovery's (`recover.rs`), and a key's path is one of the folder's places
//! (`folder.rs`).

use std::collections::{BTreeMap, HashMap};
use std::io;

use super::paths::{Found, digest, file_digest, found, not_ours, part};
use super::record::{self, Pending};
use super::write::{Staged, Writer};
use super::written::{Digest, Written};
use crate::atomic::{self, remove_if_exists};
use crate::batch::Batch;
use crate::batch::event::Event;
use crate::names::go_quote;
use crate::reason::Rejection;
use crate::source::ModuleFile;

impl Writer<'_> {
    /// Who holds which key, as recorded.
    fn holders(&self) -> HashMap<String, String> {
        let mut holders = HashMap::new();
        for (id, w) in self.upkeep().record().modules.iter() {
            for key in w.placed.flat().keys() {
                holders.insert(key.clone(), id.to_string());
            }
        }
        holders
    }

    /// Decides which of `writes` may go out: the writes to make, in the order they must be
    /// made (so that a key changes hands after its holder let it go), and the modules
    /// rejected for a key another holds.
    pub(super) fn claim_keys<'a, 'b>(
        &self,
        batch: &Batch,
        writes: Vec<&'a Event<'b>>,
        removals: &[String],
    ) -> (Vec<&'a Event<'b>>, Vec<Rejection>) {
        let mut holders = self.holders();
        holders.retain(|_, id| !removals.contains(id));
        let holds = |id: &str| {
            (self.upkeep().record().modules.get(id)).is_some_and(|w| !w.placed.flat().is_empty())
        };
        let (mut first, mut then): (Vec<&Event>, Vec<&Event>) =
            writes.into_iter().partition(|e| holds(e.id));
        first.sort_by(|a, b| a.id.cmp(b.id));
        then.sort_by(|a, b| a.id.cmp(b.id));
        let mut ordered = Vec::new();
        let mut rejected = Vec::new();
        for e in first.into_iter().chain(then) {
            let keys: Vec<String> = match batch.files(e) {
                Ok(files) => files.into_iter().map(|f| f.key).collect(),
                // Not readable now: `sync` reads it again and reports the failure.
                Err(_) => {
                    ordered.push(e);
                    continue;
                }
            };
            if let Some(why) = keys
                .iter()
                .find_map(|k| self.upkeep().places().unplaceable(k))
            {
                rejected.push(Rejection::new(e.id, why));
                continue;
            }
            let clash = keys
                .iter()
                .find_map(|k| holders.get(k).filter(|h| **h != e.id).map(|h| (k, h)));
            if let Some((key, holder)) = clash {
                let why = format!(
                    "--layout flat: key {} is already published by module {holder}; {} waits until {holder} no longer has it",
                    go_quote(key),
                    e.id
                );
                rejected.push(Rejection::new(e.id, why));
                continue;
            }
            holders.retain(|_, id| *id != e.id);
            for k in keys {
                holders.insert(k, e.id.to_string());
            }
            ordered.push(e);
        }
        (ordered, rejected)
    }

    /// What writing `files` flat will create: each file (a path relative to DIR) with its
    /// digest, and the folders on the way that are not there yet. Checked before it is
    /// recorded: every file is a path inside DIR and not a temporary name, and the
    /// temporary names are free.
    pub(super) fn plan_flat(
        &self,
        files: &[ModuleFile],
        tmp: &str,
    ) -> io::Result<(BTreeMap<String, Digest>, Vec<String>)> {
        let mut flat = BTreeMap::new();
        let mut folders = Vec::new();
        for (i, f) in files.iter().enumerate() {
            record::flat_path(&f.key).map_err(io::Error::other)?;
            if let Some((folder, _)) = f.key.rsplit_once('/') {
                let mut at = String::new();
                for c in folder.split('/') {
                    if !at.is_empty() {
                        at.push('/');
                    }
                    at.push_str(c);
                    if !folders.contains(&at) && self.upkeep().places().folder_dir(&at)?.is_none() {
                        folders.push(at.clone());
                    }
                }
            }
            let t = self.upkeep().places().dir().join(flat_tmp(tmp, i));
            if found(&t)? != Found::Nothing {
                return Err(not_ours(&t));
            }
            flat.insert(f.key.clone(), digest(f.content.bytes()));
        }
        Ok((flat, folders))
    }

    /// Whether `DIR/KEY` may be written for `id`: nothing there, or the file cmpoll wrote
    /// for `id`, still with the bytes it wrote; never through a folder that is a symlink.
    fn flat_target_ok(&self, id: &str, key: &str) -> io::Result<()> {
        let path = self.upkeep().places().flat_file(key)?;
        let recorded = (self.upkeep().record().modules)
            .get(id)
            .and_then(|w| w.placed.flat().get(key).copied());
        match found(&path)? {
            Found::Nothing => Ok(()),
            Found::File if recorded.is_some() && file_digest(&path)? == recorded => Ok(()),
            _ => Err(not_ours(&path)),
        }
    }

    /// Stages each file under its temporary name, unsynced, and makes the folders the
    /// files go into (recorded as cmpoll's).
    pub(super) fn stage_flat(&mut self, p: &Pending, files: &[ModuleFile]) -> io::Result<Staged> {
        let mut renames = Vec::with_capacity(files.len());
        for f in files {
            if let Some((folder, _)) = f.key.rsplit_once('/') {
                self.upkeep_mut().make_folder(folder)?;
            }
        }
        for (i, f) in files.iter().enumerate() {
            // The target is checked at the switch: a key handed over in this batch is
            // still its old holder's until that module's switch.
            let tmp = flat_tmp(&p.tmp, i);
            let path = self.upkeep().places().dir().join(part(&tmp)?);
            if let Err(e) = atomic::create_new(&path, f.content.bytes(), p.written.mode) {
                // A name that was there already is not cmpoll's to remove.
                if e.kind() != io::ErrorKind::AlreadyExists {
                    let _ = remove_if_exists(&path);
                }
                self.upkeep().places().unstage(&renames);
                return Err(e);
            }
            renames.push((tmp, f.key.clone()));
        }
        Ok(Staged::Renames(renames))
    }

    /// Renames each staged file into place. If one fails, what was renamed so far is
    /// recorded (it is cmpoll's, and the next attempt replaces it), with no hash: the
    /// module is neither its old version nor its new one.
    pub(super) fn switch_flat(
        &mut self,
        p: &Pending,
        renames: &[(String, String)],
    ) -> io::Result<Written> {
        let old = self.upkeep().record().modules.get(&p.module);
        let mut done = old
            .as_ref()
            .map(|w| w.placed.flat().clone())
            .unwrap_or_default();
        let dir = self.upkeep().places().dir().to_path_buf();
        for (i, (tmp, key)) in renames.iter().enumerate() {
            let want = p
                .written
                .placed
                .flat()
                .get(key)
                .cloned()
                .unwrap_or_default();
            let result = self
                .flat_target_ok(&p.module, key)
                .and_then(|()| atomic::place_file(&dir, key, tmp));
            if let Err(e) = result {
                self.upkeep().places().unstage(&renames[i..]);
                if i > 0 {
                    // What another layout wrote for it stays recorded, to be cleared later.
                    let half = Written::half_flat(old.as_ref(), p.written.mode, done);
                    self.upkeep_mut().record_as(&p.module, half);
                }
                return Err(e);
            }
            done.insert(key.clone(), want);
            // Recorded as it goes, so `flat_target_ok` accepts this file on a retry.
            self.upkeep_mut().add_flat(&p.module, key.clone(), want);
        }
        Ok(p.written.clone())
    }
}

/// The temporary name of a flat write's `i`th file.
pub(super) fn flat_tmp(tmp: &str, i: usize) -> String {
    format!("{tmp}.{i}")
}
