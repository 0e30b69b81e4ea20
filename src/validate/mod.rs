//! `--validate CMD`: the gate between a poll's batch and the sinks. The agent only ever
//! gets the last known good version of each module.
//!
//! For every added or updated module, before any sink hears of it, its new files are staged
//! (`run.rs`) and the validator runs on them; exit 0 lets the version through, anything else
//! rejects it: the sinks keep what they had (the daemon holds the module back as it does an
//! unwritten one) and the batch carries a `rejected` event with the validator's output. A
//! rejected content is remembered by module and hash and never validated again; a later
//! change is validated afresh; removals are never validated. Exit 126/127 (the validator
//! cannot run) rejects too, but is not remembered (the operator may fix the validator) and
//! makes readiness fail until a validation runs again. With `--out-dir`, rejections and the
//! last good version of each rejected module are kept in `DIR/.cmpoll/rejected.json`
//! (`remembered.rs`), so a restart keeps the good version instead of removing it.

mod remembered;
mod run;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use self::remembered::Good;
use self::remembered::Remembered;
pub use self::run::{Options, Stage, Unasked, Verdict, timed_out};
use crate::locks::Recover;
use crate::poll::hash::Hash;
use crate::poll::snapshot::{Entry, Snapshot};
use crate::poll::spool::{ObjectRef, Spool};
use crate::poll::store::Store;
use crate::reason::Rejection;

/// A rejection remembered: the content refused, and why (by the gate, and by the delivery,
/// which announces a rejection once per content).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub hash: Hash,
    pub reason: String,
}

/// What the gate keeps of a rejected module: the content refused, and the last good version.
#[derive(Clone, Debug)]
struct Kept {
    refused: Refused,
    good: Option<Good>,
}

impl Kept {
    fn new(hash: Hash, reason: String, good: Option<Good>) -> Kept {
        Kept {
            refused: Refused { hash, reason },
            good,
        }
    }
}

/// What screening one batch decided.
#[derive(Debug, Default)]
pub struct Screened {
    /// Modules rejected, with why (announced, or not, by the delivery).
    pub rejected: Vec<Rejection>,
    /// Validator runs by result: `pass`, `fail`, `error`.
    pub runs: Vec<&'static str>,
    /// Whether the validator could run, as far as this batch tells.
    pub runnable: Runnable,
}

/// What a batch's validator runs say about the validator itself (for readiness).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Runnable {
    /// Nothing was validated: readiness stays as it was.
    #[default]
    NotRun,
    /// It ran (passed or refused): it can run.
    Ran,
    /// It could not run (exit 126/127): why.
    Cannot(String),
}

impl Runnable {
    /// A run that passed or refused: the validator can run.
    pub fn ran(&mut self) {
        if *self == Runnable::NotRun {
            *self = Runnable::Ran;
        }
    }
}

pub struct Gate {
    opts: Options,
    stage: run::Stage,
    /// The modules rejected, remembered by content.
    rejected: HashMap<String, Kept>,
    /// `rejected.json`, with `--out-dir`.
    remembered: Option<Remembered>,
}

/// What `DIR/.cmpoll/rejected.json` holds (`cmpoll status --out-dir`): each module
/// `--validate` rejected, with the hash refused and why.
pub fn rejections(meta_dir: &std::path::Path) -> Result<Vec<(String, Refused)>, String> {
    let (_, entries) = Remembered::open(meta_dir)?;
    Ok((entries.into_iter())
        .map(|(id, (hash, reason, _))| (id, Refused { hash, reason }))
        .collect())
}

impl Gate {
    /// Prepares the staging folder and reads the record of rejections; errors are start-up
    /// errors naming the folder or file.
    pub fn open(opts: Options) -> Result<Gate, String> {
        let stage = run::Stage::new(opts.meta_dir.as_deref())?;
        let (remembered, rejected) = match &opts.meta_dir {
            Some(dir) => {
                let (file, entries) = Remembered::open(dir)?;
                let rejected = entries
                    .into_iter()
                    .map(|(id, (hash, reason, good))| (id, Kept::new(hash, reason, good)))
                    .collect();
                (Some(file), rejected)
            }
            None => (None, HashMap::new()),
        };
        Ok(Gate {
            opts,
            stage,
            rejected,
            remembered,
        })
    }

    /// At start: the last good version of every module whose cluster content was rejected
    /// goes into the store, so the first batch keeps it instead of removing it (and a new
    /// agent gets it).
    pub fn seed(&self, store: &mut Store) -> std::io::Result<()> {
        for (id, f) in &self.rejected {
            let Some(Good {
                uid,
                resource_version,
                files,
            }) = &f.good
            else {
                continue;
            };
            let object = ObjectRef::new(self.opts.kinds.kind_of(id), uid, resource_version);
            let loc = store.spool.put(&object, files)?;
            let entry = Entry {
                hash: Hash::of(files.iter().map(|f| (f.key.as_str(), f.content.bytes()))),
                loc,
                resource_version: resource_version.as_str().into(),
            };
            store.snapshot.modules.insert(id, entry);
        }
        if !self.rejected.is_empty() {
            log::info!(
                "--validate: {} module(s) rejected before the restart stay at their last good version until they change",
                self.rejected.len()
            );
        }
        Ok(())
    }

    /// Validates `wanted`, the modules a batch adds or updates, each with its new entry
    /// (`current`: what the sinks hold, `next`: the poll's snapshot).
    pub fn screen(
        &mut self,
        wanted: &[(&str, &Entry)],
        spool: &Spool,
        current: &Snapshot,
        next: &Snapshot,
    ) -> Screened {
        let mut out = Screened::default();
        let before = self.rejected.len();
        // Gone from the cluster: forgotten.
        self.rejected.retain(|id, _| next.modules.contains_key(id));
        let mut changed = self.rejected.len() != before;
        let mut todo = Vec::new();
        for &(id, entry) in wanted {
            match self.rejected.get(id) {
                Some(f) if f.refused.hash == entry.hash => {
                    out.rejected
                        .push(Rejection::new(id, f.refused.reason.as_str()));
                }
                _ => todo.push((id, entry)),
            }
        }
        let verdicts = self.run_all(&todo, spool);
        for ((id, entry), verdict) in todo.into_iter().zip(verdicts) {
            match verdict {
                Verdict::Pass => {
                    out.runs.push("pass");
                    out.runnable.ran();
                    changed |= self.rejected.remove(id).is_some();
                }
                Verdict::Fail(reason) => {
                    out.runs.push("fail");
                    out.runnable.ran();
                    let good = current.modules.get(id).and_then(|old| {
                        let (meta, files) = spool.read(old.loc).ok()?;
                        Some(Good {
                            uid: meta.uid,
                            resource_version: meta.resource_version,
                            files,
                        })
                    });
                    // The good version is the one the sinks hold now, or the one kept.
                    let good = good.or_else(|| self.rejected.get(id).and_then(|f| f.good.clone()));
                    let kept = Kept::new(entry.hash, reason.clone(), good);
                    self.rejected.insert(id.to_string(), kept);
                    changed = true;
                    out.rejected.push(Rejection::new(id, reason));
                }
                Verdict::Error(reason) => {
                    out.runs.push("error");
                    out.runnable = Runnable::Cannot(reason.clone());
                    out.rejected.push(Rejection::new(id, reason));
                }
            }
        }
        if changed {
            self.save();
        }
        out
    }

    fn save(&self) {
        if let Some(file) = &self.remembered {
            let entries = self.rejected.iter().map(|(id, f)| {
                (
                    id.as_str(),
                    &f.refused.hash,
                    f.refused.reason.as_str(),
                    f.good.as_ref(),
                )
            });
            if let Err(e) = file.save(entries) {
                log::warn!("--validate: {e}; rejections are remembered until cmpoll stops");
            }
        }
    }

    /// Whether `--confirm` asks the agent after delivery.
    pub fn confirms(&self) -> bool {
        self.opts.confirm.is_some()
    }

    /// `--confirm`: which of `modules` (just delivered) the agent refused, and why; `Err`:
    /// it could not be asked. `Ok(empty)` without `--confirm`.
    pub fn confirm(&self, modules: &[&str]) -> Result<Vec<Rejection>, Unasked> {
        match &self.opts.confirm {
            Some(cmd) => run::confirm(&self.opts, cmd, modules),
            None => Ok(Vec::new()),
        }
    }

    /// Every version refused and remembered (by the validator, or by the agent through
    /// `--confirm`: the reason begins with `reason::REFUSED`), by module.
    pub fn refused(&self) -> impl Iterator<Item = (&str, &Refused)> {
        (self.rejected.iter()).map(|(id, kept)| (id.as_str(), &kept.refused))
    }

    /// The last good version kept for rejected `id`, if any.
    pub fn good(&self, id: &str) -> Option<&Good> {
        self.rejected.get(id).and_then(|f| f.good.as_ref())
    }

    /// The agent refused `id` at `hash` after delivery: remembered as a validator's
    /// refusal is (never delivered again until it changes; across restarts with
    /// `--out-dir`), `good` being what the sinks go back to.
    pub fn refuse(&mut self, id: &str, hash: Hash, reason: &str, good: Option<Good>) {
        let good = good.or_else(|| self.rejected.get(id).and_then(|f| f.good.clone()));
        let kept = Kept::new(hash, reason.to_string(), good);
        self.rejected.insert(id.to_string(), kept);
        self.save();
    }

    /// Runs the validator for each module, up to `--validate-jobs` at once.
    fn run_all(&self, todo: &[(&str, &Entry)], spool: &Spool) -> Vec<Verdict> {
        let results: Vec<Mutex<Option<Verdict>>> = todo.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let work = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(id, entry)) = todo.get(i) else {
                    return;
                };
                let verdict = match spool.get(entry.loc) {
                    Ok(files) => self.stage.validate(&self.opts, id, &entry.hash, &files),
                    Err(err) => Verdict::Error(format!("cannot read its files back: {err}")),
                };
                *results[i].lock().recover() = Some(verdict);
            }
        };
        let workers = self.opts.jobs.clamp(1, todo.len().max(1));
        if workers == 1 {
            work();
        } else {
            std::thread::scope(|s| {
                for _ in 0..workers {
                    s.spawn(work);
                }
            });
        }
        results
            .into_iter()
            .map(|m| {
                (m.into_inner().recover()).unwrap_or_else(|| Verdict::Error("not validated".into()))
            })
            .collect()
    }
}
