//! The hub's validator runs, off its poll thread: `--validate-jobs` threads take the object
//! versions to judge, stage and validate each as `cmpoll run` stages a module, and hand the
//! verdicts back; the poll thread takes what is done at its next turn and never waits for a
//! validator (a slow one, or a backlog after a start, holds back only the versions it has
//! not judged yet). A version that passed is written to the state folder (`memory.rs`)
//! before its verdict is handed back, so that the verdict is never remembered without its
//! good version.

use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

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
}

/// The validator's threads, and what they are judging.
pub struct Workers {
    jobs: Sender<Job>,
    done: Receiver<Done>,
    in_flight: HashSet<(String, Hash)>,
}

impl Workers {
    /// Starts `opts.jobs` threads staging under `stage`, keeping good versions in `memory`.
    pub fn start(
        opts: validate::Options,
        stage: Stage,
        memory: Option<Memory>,
    ) -> Result<Workers, String> {
        let (jobs, taken) = mpsc::channel::<Job>();
        let (tell, done) = mpsc::channel::<Done>();
        let taken = Arc::new(Mutex::new(taken));
        let shared = Arc::new((opts, stage, memory));
        for n in 0..shared.0.jobs.max(1) {
            let (taken, tell, shared) = (taken.clone(), tell.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("validate-{n}"))
                .spawn(move || {
                    let (opts, stage, memory) = &*shared;
                    loop {
                        let job = taken.lock().recover().recv();
                        let Ok(job) = job else { return };
                        let verdict = judge(opts, stage, &job);
                        if let (Verdict::Pass, Some(m)) = (&verdict, memory)
                            && let Err(e) = m.keep(&job.id, &job.object.raw.json)
                        {
                            log::warn!("--state-dir: {e}; kept until the hub stops");
                        }
                        let done = Done {
                            id: job.id,
                            object: job.object,
                            verdict,
                        };
                        if tell.send(done).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| format!("--validate: cannot start its threads: {e}"))?;
        }
        Ok(Workers {
            jobs,
            done,
            in_flight: HashSet::new(),
        })
    }

    /// Judges `job`'s version, unless it is being judged already.
    pub fn submit(&mut self, job: Job) {
        let key = (job.id.clone(), job.object.hash);
        if self.in_flight.insert(key) && self.jobs.send(job).is_err() {
            log::warn!("--validate: its threads are gone");
        }
    }

    /// The verdicts handed back since the last call.
    pub fn done(&mut self) -> Vec<Done> {
        let done: Vec<Done> = self.done.try_iter().collect();
        for d in &done {
            self.in_flight.remove(&(d.id.clone(), d.object.hash));
        }
        done
    }

    /// How many versions are being judged.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
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
