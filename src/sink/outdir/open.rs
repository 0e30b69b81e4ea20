//! Opening `--out-dir`: the folder made if missing and checked writable, `.cmpoll` and its
//! version folder made (or refused when something else is there), the lock taken (a second
//! cmpoll is refused), the record and the journal of an interrupted batch read and checked,
//! then what that batch left half-done finished or undone (`recover.rs`). And the record
//! read back without any of that, for `cmpoll status --out-dir`.

use std::fs::{self, File};
use std::io;
use std::path::Path;

use super::folder::Places;
use super::options::Options;
use super::paths::{DIR_MODE, Found, JOURNAL, META, STATE, VERSIONS, found, meta_dir};
use super::record::{self, Record};
use super::recover::recover;
use super::sink::OutDir;
use super::upkeep::Upkeep;
use super::written::Interner;
use crate::atomic::create_dir;
use crate::poll::hash::Hash;

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
        let mut keys = Interner::default();
        record.intern(&mut keys);
        let mut upkeep = Upkeep::new(Places::new(opts), record);
        recover(&mut upkeep).map_err(|e| fail("cannot recover from the last run", &e))?;
        Ok(OutDir::new(upkeep, keys, nonce, lock))
    }
}
