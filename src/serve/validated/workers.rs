//! The hub's validator runs, off its poll thread: `--validate-jobs` threads take the object
//! versions to judge, stage and validate each as `cmpoll run` stages a module, and hand the
//! verdicts back; the poll thread takes what is done at its next turn and never waits for a
//! validator (a slow one, or a backlog after a start, holds back only the versions it has
//! not judged yet). A version that passed is written to the state folder (`memory.rs`)
//! before its verdict is handed back, so that the verdict is never remembered without its
//! good version.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};

use super::memory::Memory;
use crate::locks::Recover;
use crate::poll::hash::Hash;
use crate::poll::module::{Module, Naming, NotAModule};
use crate::serve::held::HeldObject;
use crate::source::reader::{ReadError, read_object};
use crate::source::{KeyFilter, Resource};
use crate::validate::{self, Stage, Verdict};

/// One object version to judge.
pub struct Job {
    pub id: String,
    pub kind: Resource,
    pub object: Arc<HeldObject>,
}

/// A verdict, for the version it judged.
pub struct Done {
    pub id: String,
    pub object: Arc<HeldObject>,
    pub verdict: Verdict,
    /// A version that passed was written to the state folder.
    pub kept: bool,
}

/// What waits for the threads: one version per object at most (a newer one replaces one
/// not started: a ConfigMap rewritten faster than it is judged queues nothing), in the
/// order the objects came.
#[derive(Default)]
struct Waiting {
    order: VecDeque<String>,
    jobs: HashMap<String, Job>,
    stop: bool,
}

type Shared = Arc<(Mutex<Waiting>, Condvar)>;

/// The validator's threads, and what they are judging.
pub struct Workers {
    waiting: Shared,
    done: Receiver<Done>,
    /// The version of each object sent last, until its verdict comes back.
    in_flight: HashMap<String, Hash>,
}

impl Workers {
    /// Starts `opts.jobs` threads staging under `stage`, keeping good versions in `memory`.
    pub fn start(
        opts: validate::Options,
        stage: Stage,
        memory: Option<Memory>,
    ) -> Result<Workers, String> {
        let waiting: Shared = Arc::default();
        let (tell, done) = mpsc::channel::<Done>();
        let shared = Arc::new((opts, stage, memory));
        for n in 0..shared.0.jobs.max(1) {
            let (waiting, tell, shared) = (waiting.clone(), tell.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("validate-{n}"))
                .spawn(move || {
                    let (opts, stage, memory) = &*shared;
                    while let Some(job) = next(&waiting) {
                        let verdict = judge(opts, stage, &job);
                        let kept = match (&verdict, memory) {
                            (Verdict::Pass, Some(m)) => match m.keep(&job.id, &job.object.raw.json)
                            {
                                Ok(()) => true,
                                Err(e) => {
                                    log::warn!("--state-dir: {e}; tried again after the next poll");
                                    false
                                }
                            },
                            _ => false,
                        };
                        let done = Done {
                            id: job.id,
                            object: job.object,
                            verdict,
                            kept,
                        };
                        if tell.send(done).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| format!("--validate: cannot start its threads: {e}"))?;
        }
        Ok(Workers {
            waiting,
            done,
            in_flight: HashMap::new(),
        })
    }

    /// Judges `job`'s version, unless it is being judged already; it replaces a version
    /// of the same object still waiting.
    pub fn submit(&mut self, job: Job) {
        if self.in_flight.get(&job.id) == Some(&job.object.hash) {
            return;
        }
        self.in_flight.insert(job.id.clone(), job.object.hash);
        let (lock, wake) = &*self.waiting;
        let mut w = lock.lock().recover();
        let id = job.id.clone();
        if w.jobs.insert(id.clone(), job).is_none() {
            w.order.push_back(id);
        }
        drop(w);
        wake.notify_one();
    }

    /// The verdicts handed back since the last call.
    pub fn done(&mut self) -> Vec<Done> {
        let done: Vec<Done> = self.done.try_iter().collect();
        for d in &done {
            if self.in_flight.get(&d.id) == Some(&d.object.hash) {
                self.in_flight.remove(&d.id);
            }
        }
        done
    }

    /// How many objects have a version being judged.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.waiting.0.lock().recover().stop = true;
        self.waiting.1.notify_all();
    }
}

/// The next version to judge, waited for; `None`: stop.
fn next(waiting: &Shared) -> Option<Job> {
    let (lock, wake) = &**waiting;
    let mut w = lock.lock().recover();
    loop {
        if w.stop {
            return None;
        }
        while let Some(id) = w.order.pop_front() {
            if let Some(job) = w.jobs.remove(&id) {
                return Some(job);
            }
        }
        w = wake.wait(w).recover();
    }
}

/// The verdict on `job`'s version: staged as the module `cmpoll run` would make of it (its
/// files read again from its JSON, checked as the apiserver's validation allows).
fn judge(opts: &validate::Options, stage: &Stage, job: &Job) -> Verdict {
    match module_of(job.kind, opts.kinds.qualified(), &job.object) {
        Ok(m) => stage.validate(opts, &m.id(), &job.object.hash, &m.files),
        // Nothing to validate: not a module (no file), as `cmpoll run` has it.
        Err(NotAModule::NoMatchingKey) => Verdict::Pass,
        Err(NotAModule::Invalid(why)) => Verdict::Fail(why),
    }
}

fn module_of(kind: Resource, qualified: bool, o: &HeldObject) -> Result<Module, NotAModule> {
    let (_, _, mut item) = read_object(&o.raw.json[..], &KeyFilter::all(), kind, None, false)
        .map_err(|e| {
            NotAModule::Invalid(format!("its JSON cannot be read again: {}", unread(e)))
        })?;
    item.qualified = qualified;
    Module::from_item(item, &Naming::default())
}

/// What a read of an object's JSON says went wrong.
pub fn unread(e: ReadError) -> String {
    match e {
        ReadError::Io(e) => e.to_string(),
        ReadError::Bad(why) => why,
    }
}
