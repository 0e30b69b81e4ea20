//! Recovery after an interrupted run, once, when the folder is opened: a function of the
//! record and its places (`Upkeep`). The record's pending writes are finished or undone,
//! adopting only what can be proved to be cmpoll's (see the parent module): a version's
//! symlink, a concat file, a flat write's files; and namespace folders an interrupted run
//! made but never used are removed.

use std::collections::BTreeSet;
use std::io;

use super::flat::flat_tmp;
use super::folder::Places;
use super::paths::{Found, file_digest, found, part};
use super::record::Pending;
use super::upkeep::Upkeep;
use super::written::Written;
use crate::atomic::{fsync_dir, remove_dir_if_empty, remove_if_exists, sync_volume};
use crate::poll::snapshot::folder_of;

/// Finishes or undoes the writes an interrupted run had recorded as pending, adopting
/// only what it can prove it wrote.
pub(super) fn recover(upkeep: &mut Upkeep) -> io::Result<()> {
    let pending = std::mem::take(upkeep.pending_mut());
    if !pending.is_empty() {
        log::info!(
            "--out-dir: recovering {} interrupted write(s)",
            pending.len()
        );
    }
    for p in pending {
        match (p.written.placed.version(), p.written.placed.file()) {
            (Some((v, _)), _) => recover_version(upkeep, &p, v)?,
            (None, Some(_)) => recover_file(upkeep, &p)?,
            (None, None) => recover_flat(upkeep, &p)?,
        }
    }
    // A folder an interrupted run made but never put a file in (the deepest first:
    // `KIND/NS` before `KIND`).
    let mut used: BTreeSet<String> = BTreeSet::new();
    for (id, w) in upkeep.record().modules.iter() {
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
    let mut unused: Vec<String> = (upkeep.record().namespaces.iter())
        .filter(|f| !used.contains(f.as_str()))
        .cloned()
        .collect();
    // (Sorted deepest first: a folder before the folder it is in.)
    unused.sort_by_key(|f| std::cmp::Reverse(f.matches('/').count()));
    for folder in unused {
        if let Ok(Some(d)) = upkeep.places().folder_dir(&folder)
            && remove_dir_if_empty(&d)?
        {
            upkeep.forget_folder(&folder);
        }
    }
    upkeep.expire(true)?;
    // What recovery removed or adopted, durable before the record says so.
    sync_volume(upkeep.places().dir())?;
    // A record that cannot be saved now (a full volume) is no reason not to start:
    // the journal still holds what was recovered, and the first batch saves it.
    if let Err(e) = upkeep.save_all() {
        log::warn!(
            "--out-dir: cannot save the record after recovering: {e}; the first batch saves it"
        );
    }
    Ok(())
}

fn recover_version(upkeep: &mut Upkeep, p: &Pending, version: &str) -> io::Result<()> {
    let (folder, name) = folder_of(&p.module);
    let dir = match upkeep.places().folder_dir(folder) {
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
            upkeep.adopt_folder(folder.to_string());
            if let (true, Some((kind, _))) = (p.new_kind, folder.split_once('/')) {
                upkeep.adopt_folder(kind.to_string());
            }
        }
        let tmp = upkeep.places().dir().join(&p.tmp);
        if matches!(found(&tmp)?, Found::Link(_)) {
            remove_if_exists(&tmp)?;
        }
        let target = Places::link_target(folder, version);
        switched = found(&dir.join(part(name)?))? == Found::Link(target);
    }
    if switched {
        // The switch happened: the new version is the module now.
        upkeep.install(&p.module, p.written.clone())?;
    } else {
        let files = p.written.placed.version().map(|(_, f)| f.clone());
        upkeep
            .places()
            .delete_version(version, &files.unwrap_or_default())?;
    }
    Ok(())
}

fn recover_file(upkeep: &mut Upkeep, p: &Pending) -> io::Result<()> {
    let tmp = upkeep.places().dir().join(part(&p.tmp)?);
    if found(&tmp)? == Found::File {
        remove_if_exists(&tmp)?;
    }
    let Some((file, digest)) = p.written.placed.file() else {
        return Ok(());
    };
    let path = upkeep.places().dir().join(part(file)?);
    let adopted = digest.is_some() && file_digest(&path)?.as_ref() == digest;
    if adopted {
        // Renamed into place before the crash: byte for byte what cmpoll wrote.
        upkeep.install(&p.module, p.written.clone())?;
    }
    // Otherwise what is there is the old version (still recorded as such) or not
    // cmpoll's at all: either way it is left as it is.
    fsync_dir(upkeep.places().dir())
}

/// After a crash during a flat write: temporary files go; each file is adopted if it
/// has the new bytes; if all do, the new version is the module's, else the module is
/// recorded as the mix it is (no hash), for the next write to finish.
fn recover_flat(upkeep: &mut Upkeep, p: &Pending) -> io::Result<()> {
    for i in 0..p.written.placed.flat().len() {
        let t = upkeep.places().dir().join(part(&flat_tmp(&p.tmp, i))?);
        if found(&t)? == Found::File {
            remove_if_exists(&t)?;
        }
    }
    // Folders the write made (none was there when it was recorded) are cmpoll's.
    for folder in &p.folders {
        if upkeep.places().folder_dir(folder).ok().flatten().is_some() {
            upkeep.adopt_folder(folder.clone());
        }
    }
    let old = upkeep.record().modules.get(&p.module);
    let mut mixed = old
        .as_ref()
        .map(|w| w.placed.flat().clone())
        .unwrap_or_default();
    let mut all_new = true;
    for (key, want) in p.written.placed.flat() {
        let path = match upkeep.places().flat_file(key) {
            Ok(path) => path,
            Err(_) => {
                all_new = false;
                continue;
            }
        };
        if file_digest(&path)?.as_ref() == Some(want) {
            mixed.insert(key.clone(), *want);
        } else {
            all_new = false;
        }
    }
    if all_new {
        upkeep.install(&p.module, p.written.clone())?;
    } else if old
        .as_ref()
        .map_or(!mixed.is_empty(), |w| *w.placed.flat() != mixed)
    {
        // (A new module none of whose files was renamed in is simply not there.)
        // What another layout wrote for it stays recorded, to be cleared later.
        let half = Written::half_flat(old.as_ref(), p.written.mode, mixed);
        upkeep.record_as(&p.module, half);
    }
    fsync_dir(upkeep.places().dir())
}
