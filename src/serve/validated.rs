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
pub mod workers;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use self::memory::{Memory, Remembered};
use self::workers::{Done, Job, Workers};
use super::held::{Held, HeldObject};
use super::telling::Notice;
use crate::poll::hash::Hash;
use crate::reason;
use crate::report::Regarding;
use crate::source::reader::read_object;
use crate::source::{KeyFilter, Resource};
use crate::validate::{self, Stage, Verdict};

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
    /// Why the validator could not judge its newest version (tried again each poll).
    error: Option<String>,
}

/// What one poll's judging did: for the poll loop's metrics and readiness.
#[derive(Debug, Default)]
pub struct Judgement {
    /// Validator runs by result: `pass`, `fail`, `error`.
    pub runs: Vec<&'static str>,
    /// Why the validator cannot run, while some object's newest version could not be
    /// judged for that (exit 126/127).
    pub cannot: Option<String>,
    /// Objects whose newest version is not served.
    pub held_back: usize,
    /// Versions being judged.
    pub pending: usize,
    /// Objects neither judged at their newest version nor with a good one to serve
    /// meanwhile: a hub publishes its first poll only without any (else its followers
    /// would take them for removed).
    pub unsettled: usize,
}

/// The versions of `served`'s scopes kept below each version `awaited` (kind, namespace,
/// resourceVersion) while it is judged: a watcher told the hub's version past it would
/// take it, published later at its own resourceVersion, for older than what it holds and
/// never apply it (`hub_protocol`'s commit rule). Other changes of those scopes reach
/// watchers once it is judged (the history releases a change only up to the scope's
/// version: `history.rs`). A version the validator cannot judge (it cannot run) holds
/// nothing back: it is published when it can, and a watcher past it misses it until it
/// lists again.
fn awaiting(served: &mut Held, prev: &Held, awaited: &[(crate::source::Resource, String, u64)]) {
    for (kind, namespace, rv) in awaited {
        for s in served.scopes.iter_mut().filter(|s| s.kind == *kind) {
            if s.namespace.as_ref().is_none_or(|ns| ns == namespace) {
                // Never below what was published already (a version older than that
                // is past helping: as one the validator could not judge).
                let published = (prev.scopes.iter())
                    .find(|p| p.kind == s.kind && p.namespace == s.namespace)
                    .map_or(0, |p| p.listed);
                s.listed = s.listed.min(rv.saturating_sub(1).max(published));
                s.changed = s.changed.min(s.listed);
            }
        }
    }
}

/// The hub's judge.
pub struct Validated {
    workers: Workers,
    objects: BTreeMap<String, Judged>,
    memory: Option<Memory>,
}

impl Validated {
    /// The staging folder, and what `state_dir` remembers; errors name the folder or file.
    pub fn open(opts: validate::Options, state_dir: Option<&Path>) -> Result<Validated, String> {
        let stage = Stage::new(None)?;
        if let Some(dir) = state_dir.filter(|d| d.is_dir()) {
            // Its own: nobody else in the pod (an emptyDir is 0777) moves its files.
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
                format!("--state-dir: cannot make '{}' private: {e}", dir.display())
            })?;
        }
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
            let mut known = known;
            let good = match (&known.served, known.good) {
                (Some(json), Some(hash)) => match reread(&id, json) {
                    Ok(o) => {
                        if o.hash != hash {
                            // Only a version that passed is written there; one that passed
                            // after the record was saved (the hub stopped in between).
                            log::info!(
                                "--state-dir: {id}: its good version there ({}) is newer than the record's: taken",
                                o.hash.short(12)
                            );
                            known.good = Some(o.hash);
                        }
                        Some(Arc::new(o))
                    }
                    Err(why) => {
                        log::warn!(
                            "{why}: not used; until a version of it passes again, it is not served while its newest is one the hub refuses"
                        );
                        None
                    }
                },
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
                error: None,
            };
            objects.insert(id, judged);
        }
        Ok(Validated {
            workers: Workers::start(opts, stage, memory.clone())?,
            objects,
            memory,
        })
    }

    /// `upstream`, a complete poll, as the hub serves it: each object at its newest good
    /// version (`prev`: what it served before, for the scopes' versions). Versions not
    /// judged yet go to the validator's threads; their verdicts are taken at a later turn.
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
        for d in self.workers.done() {
            changed |= self.take(d, upstream, &mut out);
        }
        for (kind, id, o) in all(upstream) {
            let j = self.objects.entry(id.clone()).or_default();
            if j.known.good == Some(o.hash) {
                // The version that passed, perhaps at a newer resourceVersion (a label
                // changed): served as it is now.
                changed |= j.known.refused.is_some();
                j.known.refused = None;
                j.error = None;
                j.good = Some(o.clone());
                j.shown = None;
            } else if (j.known.refused.as_ref()).is_none_or(|(h, _)| *h != o.hash) {
                let object = o.clone();
                self.workers.submit(Job { id, kind, object });
            }
        }
        out.pending = self.workers.in_flight();
        out.cannot = self.objects.values().find_map(|j| j.error.clone());
        let mut awaited: Vec<(crate::source::Resource, String, u64)> = Vec::new();
        let mut served = upstream.picked(prev, |kind, _, o| {
            let id = memory::id(kind, &o.namespace, &o.name);
            let j = self.objects.get_mut(&id)?;
            if j.known.good == Some(o.hash) {
                return Some(o.clone());
            }
            out.held_back += 1;
            let judged = (j.known.refused.as_ref()).is_some_and(|(h, _)| *h == o.hash);
            if j.good.is_none() && !judged {
                out.unsettled += 1;
            }
            if !judged && j.error.is_none() {
                // Being judged (a first version too): its scopes wait below it.
                let rv = o.resource_version.parse().unwrap_or(0);
                awaited.push((kind, o.namespace.clone(), rv));
            }
            let good = j.good.as_ref()?;
            // Refused: said so; not judged yet: the good version as it was.
            let refused = (j.known.refused.as_ref()).map(|(h, _)| *h);
            let Some(refused) = refused.filter(|h| *h == o.hash) else {
                return Some(good.clone());
            };
            match &j.shown {
                Some((h, shown)) if *h == refused => Some(shown.clone()),
                _ => {
                    let shown = Arc::new(with_annotation(good, &refused));
                    j.shown = Some((refused, shown.clone()));
                    Some(shown)
                }
            }
        });
        awaiting(&mut served, prev, &awaited);
        if changed {
            self.save();
        }
        (served, out)
    }

    /// What `/status` says of it (`validation`): the objects held back — the version
    /// served, the one refused and why (a Secret's, its exit status only), or that it is
    /// being judged or could not be — at most `SHOWN` of them, how many more, and whether
    /// the validator can run.
    pub fn status(&self, upstream: &Held, judged: &Judgement) -> serde_json::Value {
        let mut shown = Vec::new();
        let mut more = 0;
        for (kind, id, o) in all(upstream) {
            let Some(j) = self
                .objects
                .get(&id)
                .filter(|j| j.known.good != Some(o.hash))
            else {
                continue;
            };
            if shown.len() == SHOWN {
                more += 1;
                continue;
            }
            let refused = (j.known.refused.as_ref()).filter(|(h, _)| *h == o.hash);
            let state = match (refused, &j.error) {
                (Some(_), _) => "refused",
                (None, Some(_)) => "cannot-judge",
                (None, None) => "judging",
            };
            let why = refused.map(|(_, why)| match kind {
                Resource::Secrets => reason::redacted(why),
                Resource::ConfigMaps => reason::cut(why, telling_cut()).into_owned(),
            });
            shown.push(serde_json::json!({
                "kind": kind.singular(),
                "namespace": o.namespace,
                "name": o.name,
                "state": state,
                "newest": o.hash.to_string(),
                "served": j.good.as_ref().map(|g| g.hash.to_string()),
                "servedResourceVersion": j.good.as_ref().map(|g| g.resource_version.clone()),
                "reason": why,
            }));
        }
        serde_json::json!({
            "heldBack": shown,
            "heldBackMore": more,
            "judging": judged.pending,
            "cannotRun": judged.cannot,
        })
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

    /// Takes one verdict (of the newest version, or of one the cluster has moved past);
    /// whether what is remembered changed.
    fn take(&mut self, d: Done, upstream: &Held, out: &mut Judgement) -> bool {
        let (kind, ns, name) = memory::parse_id(&d.id).unwrap_or((Resource::ConfigMaps, "", ""));
        let now = upstream.get(kind, ns, name);
        // The object as the cluster has it now: one deleted and made again (another uid)
        // takes nothing judged of its earlier self.
        let same = now.is_some_and(|o| o.uid() == d.object.uid());
        let newest = now.is_some_and(|o| o.hash == d.object.hash);
        let Some(j) = self.objects.get_mut(&d.id).filter(|_| same) else {
            if d.kept {
                // Its file, written for an object gone or another: the good one's again.
                self.store(|m| m.forget(&d.id));
                if let Some(j) = self.objects.get_mut(&d.id) {
                    j.kept = None;
                }
            }
            return false;
        };
        let hash = d.object.hash;
        match d.verdict {
            Verdict::Pass => {
                out.runs.push("pass");
                // A version older than the good one (two judged at once, the newer first)
                // never replaces it: what is served never goes back.
                if j.good.as_ref().is_some_and(|g| !newer(&d.object, g)) {
                    // Its file was written over the good one's: written again.
                    j.kept = None;
                    return false;
                }
                j.known.good = Some(hash);
                if j.known.refused.as_ref().is_some_and(|(h, _)| *h == hash) {
                    j.known.refused = None;
                }
                j.error = None;
                j.kept = d.kept.then(|| d.object.resource_version.clone());
                j.good = Some(d.object);
                j.shown = None;
                true
            }
            Verdict::Fail(why) => {
                out.runs.push("fail");
                j.error = None;
                let shown = match kind {
                    Resource::Secrets => reason::redacted(&why),
                    Resource::ConfigMaps => why.clone(),
                };
                let first = shown.lines().next().unwrap_or("");
                match &j.good {
                    Some(g) => log::warn!(
                        "{} {ns}/{name}: version {} refused by --validate: {first}; its clients are served its last good version ({}, resourceVersion {})",
                        kind.singular(),
                        hash.short(12),
                        g.hash.short(12),
                        g.resource_version
                    ),
                    None => log::warn!(
                        "{} {ns}/{name}: version {} refused by --validate: {first}; not served: no version of it passed",
                        kind.singular(),
                        hash.short(12),
                    ),
                }
                j.known.refused = Some((hash, why));
                true
            }
            Verdict::Error(why) => {
                out.runs.push("error");
                // Only the newest version's: an older one's says nothing now.
                if newest {
                    j.error = Some(why);
                }
                false
            }
        }
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
            let written = self.memory.as_ref().map(|m| m.keep(&id, &g.raw.json));
            if let Some(Err(e)) = written {
                log::warn!("--state-dir: {e}; tried again after the next poll");
                if let Some(j) = self.objects.get_mut(&id) {
                    j.kept = None;
                }
            }
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

/// The objects held back `/status` names at most.
const SHOWN: usize = 100;

/// A refusal's reason on `/status`: as an Event's note.
fn telling_cut() -> usize {
    crate::report::MAX_NOTE
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

/// Whether `a` is a newer version of its object than `b` (their resourceVersions, as
/// numbers: the hub compares them, as followers do).
fn newer(a: &HeldObject, b: &HeldObject) -> bool {
    let n = |o: &HeldObject| o.resource_version.parse::<u64>().unwrap_or(0);
    n(a) > n(b)
}

/// A held-back object's good version, read back from the state folder: it must be the
/// object its id names, at the hash remembered.
fn reread(id: &str, json: &[u8]) -> Result<HeldObject, String> {
    let fail = |why: String| format!("--state-dir: {id}: {why}");
    let (kind, ns, name) = memory::parse_id(id).ok_or_else(|| fail("not an id".into()))?;
    let (_, _, item) = read_object(json, &KeyFilter::all(), kind, None, true).map_err(|e| {
        fail(format!(
            "its good version cannot be read: {}",
            workers::unread(e)
        ))
    })?;
    if item.namespace != ns || item.name != name {
        return Err(fail("its good version is another object".into()));
    }
    HeldObject::of_item(item).map_err(fail)
}

/// `good` as served while `held` is held back: with the annotation saying so.
pub fn with_annotation(good: &HeldObject, held: &Hash) -> HeldObject {
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
