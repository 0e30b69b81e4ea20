//! `cmpoll serve --validate CMD`: the hub judges each new version of a selected object
//! once, and every client is served the newest version that passed.
//!
//! After each complete poll, every object whose version the hub has not judged (its hash:
//! the module `cmpoll run` would make of it, all its keys) is staged and validated as
//! `cmpoll run --validate` stages a module (`crate::validate`: the same command, variables,
//! timeout, `--validate-jobs` at once). What the hub then serves is the poll with each
//! object at its newest good version: the object itself when it passed; when it was
//! refused, the version that passed before it, as the apiserver served it then, with the
//! annotation `cmpoll.io/held-back` naming the refused hash (`annotation.rs`); nothing
//! when no version of it ever passed. A held-back object keeps its good version's
//! resourceVersion, so no watcher hears of a refused version, and a later version that
//! passes is a `MODIFIED`. A validator that cannot run (exit 126/127) judges nothing: the
//! object is held back until it can, and readiness says why.
//!
//! Verdicts are kept by object and hash (a refused content is never validated again, a
//! change is validated afresh, an object gone is forgotten), and with `--state-dir` they
//! and every object's good version outlive the hub (`memory.rs`): a hub restarted after
//! a bad write, or started while one waits, serves the good version it served before.

pub mod annotation;
pub mod memory;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use self::memory::{Memory, Remembered};
use super::held::{Held, HeldObject};
use super::telling::Notice;
use crate::locks::Recover;
use crate::poll::hash::Hash;
use crate::poll::module::{Module, Naming, NotAModule};
use crate::reason;
use crate::report::Regarding;
use crate::source::reader::read_object;
use crate::source::{KeyFilter, Resource};
use crate::validate::{self, Runnable, Stage, Verdict};

/// What the hub knows of one object's versions.
#[derive(Default)]
struct Judged {
    /// Its verdicts (what `--state-dir` keeps).
    known: Remembered,
    /// The good version as served (the object when it passed, or read back from the
    /// state folder), while the newest is held back or until a newer one passes.
    good: Option<Arc<HeldObject>>,
    /// `good` with the annotation naming the hash held back, made once.
    shown: Option<(Hash, Arc<HeldObject>)>,
    /// The resourceVersion of the good version kept in the state folder.
    kept: Option<String>,
}

/// What one poll's judging did: for the poll loop's metrics and readiness.
#[derive(Debug, Default)]
pub struct Judgement {
    /// Validator runs by result: `pass`, `fail`, `error`.
    pub runs: Vec<&'static str>,
    /// Whether the validator could run, as far as this poll tells.
    pub runnable: Runnable,
    /// Objects whose newest version is not served.
    pub held_back: usize,
}

/// The hub's judge.
pub struct Validated {
    opts: validate::Options,
    stage: Stage,
    objects: BTreeMap<String, Judged>,
    memory: Option<Memory>,
}

/// One object to validate: its id, hash and, read from its JSON, its files.
struct Todo {
    id: String,
    hash: Hash,
    module: Result<Module, NotAModule>,
}

impl Validated {
    /// The staging folder, and what `state_dir` remembers; errors name the folder or file.
    pub fn open(opts: validate::Options, state_dir: Option<&Path>) -> Result<Validated, String> {
        let stage = Stage::new(None)?;
        let (memory, remembered) = match state_dir {
            Some(dir) => {
                crate::atomic::create_dir(dir, 0o700).or_else(|e| match dir.is_dir() {
                    true => Ok(()),
                    false => Err(format!(
                        "--state-dir: cannot create '{}': {e}",
                        dir.display()
                    )),
                })?;
                let (m, r) = Memory::open(dir)?;
                (Some(m), r)
            }
            None => (None, BTreeMap::new()),
        };
        let mut objects = BTreeMap::new();
        for (id, known) in remembered {
            let good = match (&known.served, known.good) {
                (Some(json), Some(hash)) => Some(Arc::new(reread(&id, json, hash)?)),
                _ => None,
            };
            let judged = Judged {
                kept: good.as_ref().map(|g| g.resource_version.clone()),
                known: Remembered {
                    served: None,
                    ..known
                },
                good,
                shown: None,
            };
            objects.insert(id, judged);
        }
        Ok(Validated {
            opts,
            stage,
            objects,
            memory,
        })
    }

    /// `upstream`, a complete poll, as the hub serves it: each object at its newest good
    /// version (`prev`: what it served before, for the scopes' versions).
    pub fn judge(&mut self, upstream: &Held, prev: &Held) -> (Held, Judgement) {
        let mut out = Judgement::default();
        let mut changed = false;
        // Gone from the cluster (or from the selection): forgotten.
        let present: HashSet<String> = all(upstream).map(|(_, id, _)| id).collect();
        let gone: Vec<String> = (self.objects.keys())
            .filter(|id| !present.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            changed = true;
            if self.objects.remove(&id).and_then(|j| j.kept).is_some() {
                self.store(|m| m.forget(&id));
            }
        }
        let mut todo = Vec::new();
        let qualified = self.opts.kinds.qualified();
        for (kind, id, o) in all(upstream) {
            let j = self.objects.entry(id.clone()).or_default();
            if j.known.good == Some(o.hash) {
                // The version that passed, perhaps at a newer resourceVersion (a label
                // changed): served as it is now.
                changed |= j.known.refused.is_some();
                j.known.refused = None;
                j.good = Some(o.clone());
                j.shown = None;
            } else if (j.known.refused.as_ref()).is_none_or(|(h, _)| *h != o.hash) {
                todo.push(Todo {
                    id,
                    hash: o.hash,
                    module: module_of(kind, qualified, o),
                });
            }
        }
        let verdicts = self.run_all(&todo);
        for (t, verdict) in todo.into_iter().zip(verdicts) {
            changed |= self.take(t, verdict, upstream, &mut out);
        }
        let served = upstream.picked(prev, |kind, o| {
            let id = memory::id(kind, &o.namespace, &o.name);
            let j = self.objects.get_mut(&id)?;
            if j.known.good == Some(o.hash) {
                return Some(o.clone());
            }
            out.held_back += 1;
            let held = (j.known.refused.as_ref()).map_or(o.hash, |(h, _)| *h);
            let good = j.good.as_ref()?;
            match &j.shown {
                Some((h, shown)) if *h == held => Some(shown.clone()),
                _ => {
                    let shown = Arc::new(with_annotation(good, &held));
                    j.shown = Some((held, shown.clone()));
                    Some(shown)
                }
            }
        });
        if changed {
            self.save();
        }
        (served, out)
    }

    /// What the hub tells the authors (`telling.rs`): each object whose newest version in
    /// `upstream` it refused, once per version.
    pub fn notices(&self, upstream: &Held) -> Vec<Notice> {
        let mut out = Vec::new();
        for (kind, id, o) in all(upstream) {
            let Some(j) = self.objects.get(&id) else {
                continue;
            };
            let Some((hash, why)) = j.known.refused.as_ref().filter(|(h, _)| *h == o.hash) else {
                continue;
            };
            let why = match kind {
                Resource::Secrets => reason::redacted(why),
                Resource::ConfigMaps => why.clone(),
            };
            let served = match &j.good {
                Some(g) => format!(
                    "its clients are served its last good version {} (resourceVersion {})",
                    g.hash.short(12),
                    g.resource_version
                ),
                None => "not served: no version of it passed".into(),
            };
            out.push(Notice {
                regarding: Regarding {
                    kind,
                    namespace: o.namespace.clone(),
                    name: o.name.clone(),
                    uid: o.uid(),
                    resource_version: o.resource_version.clone(),
                },
                hash: *hash,
                reason: "Refused",
                // The words first, then what is served: the note is cut at 1 KiB.
                message: format!(
                    "version {} refused by the hub's --validate; {served}: {why}",
                    hash.short(12)
                ),
                count: 1,
            });
        }
        out
    }

    /// Takes one verdict; whether what is remembered changed.
    fn take(&mut self, t: Todo, verdict: Verdict, upstream: &Held, out: &mut Judgement) -> bool {
        let Some(j) = self.objects.get_mut(&t.id) else {
            return false;
        };
        let (kind, ns, name) = memory::parse_id(&t.id).unwrap_or((Resource::ConfigMaps, "", ""));
        let now = upstream.get(kind, ns, name);
        match verdict {
            Verdict::Pass => {
                out.runs.push("pass");
                out.runnable.ran();
                j.known = Remembered {
                    good: Some(t.hash),
                    ..Remembered::default()
                };
                j.good = now.cloned();
                j.shown = None;
                true
            }
            Verdict::Fail(why) => {
                out.runs.push("fail");
                out.runnable.ran();
                let shown = if kind == Resource::Secrets {
                    reason::redacted(&why)
                } else {
                    why.clone()
                };
                let first = shown.lines().next().unwrap_or("");
                match &j.good {
                    Some(g) => log::warn!(
                        "{} {ns}/{name}: version {} refused by --validate: {first}; its clients are served its last good version ({}, resourceVersion {})",
                        kind.singular(),
                        t.hash.short(12),
                        g.hash.short(12),
                        g.resource_version
                    ),
                    None => log::warn!(
                        "{} {ns}/{name}: version {} refused by --validate: {first}; not served: no version of it passed",
                        kind.singular(),
                        t.hash.short(12),
                    ),
                }
                j.known.refused = Some((t.hash, why));
                true
            }
            Verdict::Error(why) => {
                out.runs.push("error");
                out.runnable = Runnable::Cannot(why);
                false
            }
        }
    }

    /// Runs the validator on each of `todo`, `--validate-jobs` at once.
    fn run_all(&self, todo: &[Todo]) -> Vec<Verdict> {
        let results: Vec<Mutex<Option<Verdict>>> = todo.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let work = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(t) = todo.get(i) else {
                    return;
                };
                let verdict = match &t.module {
                    Ok(m) => self.stage.validate(&self.opts, &m.id(), &t.hash, &m.files),
                    // Nothing to validate: not a module (no file), as `cmpoll run` has it.
                    Err(NotAModule::NoMatchingKey) => Verdict::Pass,
                    Err(NotAModule::Invalid(why)) => Verdict::Fail(why.clone()),
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
        (results.into_iter())
            .map(|m| {
                (m.into_inner().recover()).unwrap_or_else(|| Verdict::Error("not validated".into()))
            })
            .collect()
    }

    /// Each good version not yet in the state folder (new, or at a new resourceVersion)
    /// goes there: called once the poll is served (a first poll writes every object's).
    pub fn keep_good(&mut self) {
        let mut keep = Vec::new();
        for (id, j) in &mut self.objects {
            if let Some(g) = &j.good
                && j.kept.as_deref() != Some(g.resource_version.as_str())
            {
                j.kept = Some(g.resource_version.clone());
                keep.push((id.clone(), g.clone()));
            }
        }
        for (id, g) in keep {
            self.store(|m| m.keep(&id, &g.raw.json));
        }
    }

    /// One write to the state folder; a failure is a warning (kept in memory meanwhile).
    fn store(&self, write: impl FnOnce(&Memory) -> Result<(), String>) {
        if let Some(m) = &self.memory
            && let Err(e) = write(m)
        {
            log::warn!("--state-dir: {e}; kept until the hub stops");
        }
    }

    fn save(&self) {
        if let Some(m) = &self.memory {
            let objects = self.objects.iter().map(|(id, j)| (id.as_str(), &j.known));
            if let Err(e) = m.save(objects) {
                log::warn!("--state-dir: {e}; verdicts are remembered until the hub stops");
            }
        }
    }
}

/// Every object of `held`, with its kind and its id here.
fn all(held: &Held) -> impl Iterator<Item = (Resource, String, &Arc<HeldObject>)> {
    [Resource::ConfigMaps, Resource::Secrets]
        .into_iter()
        .filter(|k| held.serves(*k))
        .flat_map(move |k| {
            held.objects(k, None)
                .map(move |o| (k, memory::id(k, &o.namespace, &o.name), o))
        })
}

/// What a read of an object's JSON says went wrong.
fn unread(e: crate::source::reader::ReadError) -> String {
    match e {
        crate::source::reader::ReadError::Io(e) => e.to_string(),
        crate::source::reader::ReadError::Bad(why) => why,
    }
}

/// The module `cmpoll run` would make of `o` (its files, checked as the apiserver's
/// validation allows), read again from its JSON.
fn module_of(kind: Resource, qualified: bool, o: &HeldObject) -> Result<Module, NotAModule> {
    let (_, _, mut item) = read_object(&o.raw.json[..], &KeyFilter::all(), kind, None, false)
        .map_err(|e| {
            NotAModule::Invalid(format!("its JSON cannot be read again: {}", unread(e)))
        })?;
    item.qualified = qualified;
    Module::from_item(item, &Naming::default())
}

/// A held-back object's good version, read back from the state folder: it must be the
/// object its id names, at the hash remembered.
fn reread(id: &str, json: &[u8], hash: Hash) -> Result<HeldObject, String> {
    let fail =
        |why: String| format!("--state-dir: {id}: {why}; remove validated.json to start afresh");
    let (kind, ns, name) = memory::parse_id(id).ok_or_else(|| fail("not an id".into()))?;
    let (_, _, item) = read_object(json, &KeyFilter::all(), kind, None, true)
        .map_err(|e| fail(format!("its good version cannot be read: {}", unread(e))))?;
    if item.namespace != ns || item.name != name {
        return Err(fail("its good version is another object".into()));
    }
    let o = HeldObject::of_item(item).map_err(fail)?;
    if o.hash != hash {
        return Err(fail(
            "its good version is not the content remembered".into(),
        ));
    }
    Ok(o)
}

/// `good` as served while `held` is held back: with the annotation saying so.
fn with_annotation(good: &HeldObject, held: &Hash) -> HeldObject {
    let raw = annotation::held_back(&good.raw, &held.to_string()).unwrap_or_else(|| {
        log::warn!(
            "{}/{}: cannot annotate its last good version (its metadata is not an object): served without {}",
            good.namespace,
            good.name,
            annotation::HELD_BACK
        );
        good.raw.clone()
    });
    HeldObject::new(
        good.namespace.clone(),
        good.name.clone(),
        good.resource_version.clone(),
        good.labels.clone(),
        raw,
        good.hash,
    )
}

#[cfg(test)]
mod tests;
