//! The workers that answer requests, in lanes: each lane has its own threads and its own
//! bounded queue, so what waits in one (the hub's reviews by the apiserver) never holds
//! up another (answers whose decisions are kept). A new request that finds its lane's
//! queue full is given back at once, for the lane's `busy` answer; a parked request asked
//! again is always queued (a thousand followers woken at once are all answered). A
//! handler that panics costs its request the server's `panicked` answer, never the worker.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use super::conn::Dispatch;
use super::handler::{Call, Handler, Peer, Reply, Wake, ask_or_500};
use super::http::Answer;
use crate::locks::Recover;
use crate::ops::metrics::ServerCounts;

/// One lane of workers.
#[derive(Clone, Debug)]
pub struct Lane {
    /// For thread names and logs.
    pub name: &'static str,
    pub workers: usize,
    /// New requests waiting for a worker at most.
    pub queue: usize,
    /// What a new request gets when the queue is full.
    pub busy: Answer,
}

/// A request for a worker.
pub struct Job {
    pub key: u64,
    pub peer: Peer,
    pub dispatch: Dispatch,
}

/// A worker's answer, with the request back (a parked one is asked again).
pub struct Done {
    pub key: u64,
    pub dispatch: Dispatch,
    pub reply: Reply,
}

/// Where workers leave what they did, and how they wake the loop.
pub struct Results {
    done: Mutex<Vec<Done>>,
    wake: OwnedFd,
}

impl Results {
    pub fn new(wake: OwnedFd) -> Results {
        Results {
            done: Mutex::new(Vec::new()),
            wake,
        }
    }

    /// Wakes the loop (an eventfd: any write is enough).
    pub fn poke(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    fn push(&self, d: Done) {
        self.done.lock().recover().push(d);
        self.poke();
    }

    /// Everything done since the last take.
    pub fn take(&self) -> Vec<Done> {
        std::mem::take(&mut *self.done.lock().recover())
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.wake
    }
}

struct Queue {
    spec: Lane,
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

/// The lanes and their threads.
pub struct Lanes {
    queues: Vec<Arc<Queue>>,
    stop: Arc<AtomicBool>,
}

impl Lanes {
    /// Starts every lane's workers.
    pub fn start(
        specs: &[Lane],
        handler: Arc<dyn Handler>,
        results: Arc<Results>,
        panicked: Answer,
        counts: ServerCounts,
    ) -> io::Result<Lanes> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut queues = Vec::new();
        for (lane, spec) in specs.iter().enumerate() {
            let q = Arc::new(Queue {
                spec: spec.clone(),
                jobs: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
            });
            for n in 0..spec.workers.max(1) {
                let worker = Worker {
                    lane,
                    queue: q.clone(),
                    handler: handler.clone(),
                    results: results.clone(),
                    stop: stop.clone(),
                    panicked: panicked.clone(),
                    counts: counts.clone(),
                };
                thread::Builder::new()
                    .name(format!("https-{}-{n}", spec.name))
                    .spawn(move || worker.run())?;
            }
            queues.push(q);
        }
        Ok(Lanes { queues, stop })
    }

    /// Queues `job` on its lane (the first, if there is no such lane); a new request is
    /// given back when the queue is full (for the lane's `busy` answer).
    pub fn give(&self, job: Job) -> Result<(), Box<Job>> {
        let Some(q) = self.queues.get(job.dispatch.lane).or(self.queues.first()) else {
            return Err(Box::new(job));
        };
        let mut jobs = q.jobs.lock().recover();
        if job.dispatch.wake == Wake::First && jobs.len() >= q.spec.queue {
            return Err(Box::new(job));
        }
        jobs.push_back(job);
        drop(jobs);
        q.ready.notify_one();
        Ok(())
    }

    /// What a new request gets when `lane`'s queue is full.
    pub fn busy(&self, lane: usize) -> Answer {
        (self.queues.get(lane).or(self.queues.first())).map_or_else(
            || Answer::text(503, "no workers\n"),
            |q| q.spec.busy.clone(),
        )
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for q in &self.queues {
            q.ready.notify_all();
        }
    }
}

struct Worker {
    lane: usize,
    queue: Arc<Queue>,
    handler: Arc<dyn Handler>,
    results: Arc<Results>,
    stop: Arc<AtomicBool>,
    panicked: Answer,
    counts: ServerCounts,
}

impl Worker {
    fn run(self) {
        while let Some(job) = self.next() {
            let Job {
                key,
                peer,
                dispatch,
            } = job;
            let call = Call {
                wake: dispatch.wake,
                lane: self.lane,
            };
            let ask = (&dispatch.req, &peer, call);
            let reply = ask_or_500(&*self.handler, ask, &self.counts, &self.panicked, "worker");
            self.results.push(Done {
                key,
                dispatch,
                reply,
            });
        }
    }

    fn next(&self) -> Option<Job> {
        let mut jobs = self.queue.jobs.lock().recover();
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return None;
            }
            if let Some(j) = jobs.pop_front() {
                return Some(j);
            }
            jobs = (self.queue.ready.wait(jobs)).recover();
        }
    }
}
