//! Who hears what happened, outside the delivery: the log, metrics, readiness, Kubernetes
//! Events (`--report-events`) and `/status` (the ledger). The delivery does its work and
//! writes down what happened in a `Record`; the daemon's loop, which owns the observers,
//! hands it to `Observers::committed` once per commit, before the store takes the poll's
//! snapshot. A poll's own outcome (`poll_succeeded`, `poll_failed`: `/status`'s last
//! poll, readiness, metrics), the loop's turns (liveness), whether it follows a hub and
//! that it is stopping are told here too, by the daemon's loop and by a hub's (`cmpoll
//! serve`, which delivers no batch): neither loop writes readiness or the ledger itself.
//! A follower's hub hears what it holds (`holding`, once the store took the commit).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::event::Synced;
use crate::hub_report::{self, HubReports, Refusal};
use crate::ledger::Ledger;
use crate::locks::Recover;
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;
use crate::poll::snapshot::{Entry, Snapshot, split_id};
use crate::poll::spool::Spool;
use crate::reason::{Rejection, Unwritten};
use crate::report::{self, Occurrence, Reason, Reporter};
use crate::source::{Resource, Resources};
use crate::validate::Runnable;

/// What one commit did, for the observers: written by the delivery as it goes.
#[derive(Debug, Default)]
pub struct Record {
    pub poll: u64,
    /// The run's first batch (it always reaches the sinks).
    pub first: bool,
    /// The counts that closed the batch; `None` when no sink heard of the poll.
    pub synced: Option<Synced>,
    /// Each time a sink took a batch of this commit (a `--confirm` put-back too): which
    /// sink, how many events, how many of them it could not write.
    pub took: Vec<SinkTook>,
    /// Rejections announced now (a `rejected` event went out).
    pub announced: Vec<Rejection>,
    /// Rejected before, published now.
    pub accepted: Vec<String>,
    /// Modules a sink could not write (they keep their previous version), each once, in
    /// order, with the first failing sink's error.
    pub unwritten: Vec<Unwritten>,
    /// Every module rejected now, and why, in module order.
    pub rejected: Vec<Rejection>,
    /// Validator runs (and `--confirm` answers) by result: `pass`, `fail`, `error`.
    pub validations: Vec<&'static str>,
    /// What the runs say about the validator itself.
    pub runnable: Runnable,
    /// `--confirm`: each time the agent was asked, whether it could be (why not, without
    /// the flag's name, as readiness words every reload path's failure).
    pub asked: Vec<Result<(), String>>,
    /// What the poll listed (the batch's log line).
    pub objects: usize,
    pub not_modules: usize,
    /// How long the poll took.
    pub poll_took: Duration,
}

/// Sink `sink` (its index, in SPEC's order) took a batch.
#[derive(Debug, Clone, Copy)]
pub struct SinkTook {
    pub sink: usize,
    pub events: usize,
    pub unwritten: usize,
}

/// The observers of one run.
pub struct Observers {
    pub(super) health: Arc<Mutex<Health>>,
    pub(super) metrics: Arc<Mutex<Metrics>>,
    /// `--report-events`.
    reporter: Option<Reporter>,
    /// `/status`.
    ledger: Option<Arc<Mutex<Ledger>>>,
    /// A follower's reports to its hub, and the kinds it lists.
    hub: Option<(HubReports, Resources)>,
}

impl Observers {
    pub fn new(health: Arc<Mutex<Health>>, metrics: Arc<Mutex<Metrics>>) -> Observers {
        Observers {
            health,
            metrics,
            reporter: None,
            ledger: None,
            hub: None,
        }
    }

    /// Tells a hub, when the source turns out to be one, what the sinks hold (`kinds`:
    /// the kinds listed).
    pub fn telling_hub(mut self, reports: Option<HubReports>, kinds: Resources) -> Observers {
        self.hub = reports.map(|r| (r, kinds));
        self
    }

    /// Tells the objects' authors of rejections, acceptances and write failures.
    pub fn reporting(mut self, reporter: Option<Reporter>) -> Observers {
        self.reporter = reporter;
        self
    }

    /// Records what the sinks (`names`, in order) hold, and why, in `ledger`.
    pub fn recording(
        mut self,
        ledger: Option<Arc<Mutex<Ledger>>>,
        names: Vec<String>,
    ) -> Observers {
        if let Some(l) = &ledger {
            lock(l).sinks(names);
        }
        self.ledger = ledger;
        self
    }

    pub fn health(&self) -> MutexGuard<'_, Health> {
        lock(&self.health)
    }

    pub fn metrics(&self) -> MutexGuard<'_, Metrics> {
        lock(&self.metrics)
    }

    /// Poll `number` succeeded with `modules` (`invalid` objects were not modules):
    /// `/status`, readiness and metrics. Whether it was the first.
    pub fn poll_succeeded(
        &self,
        number: u64,
        took: Duration,
        modules: usize,
        invalid: usize,
    ) -> bool {
        self.ledger(|l| l.polled(number, took, Ok(())));
        self.metrics().poll_succeeded(took, modules, invalid);
        self.health().succeeded(Instant::now(), modules)
    }

    /// Poll `number` failed for `why`: `/status`, readiness and metrics.
    pub fn poll_failed(&self, number: u64, took: Duration, why: String) {
        // A hub that failed a poll may have restarted (its fleet's reports gone with it),
        // or be another one behind its Service: the next commit's state is told again.
        if let Some((reports, _)) = &self.hub {
            reports.following(false);
        }
        self.ledger(|l| l.polled(number, took, Err(why.clone())));
        self.metrics().poll_failed(took);
        self.health().failed(why);
    }

    /// The loop that polls turned (liveness).
    pub fn loop_turned(&self) {
        self.health().loop_turned(Instant::now());
    }

    /// The last poll asked a `cmpoll serve` hub, or not (readiness).
    pub fn following_hub(&self, hub: bool) {
        self.health().set_following_hub(hub);
        if let Some((reports, _)) = &self.hub {
            reports.following(hub);
        }
    }

    /// After a commit (`record`), the store took it: the sinks hold `held`; the gate's
    /// `refused` versions are the newest served. A hub followed hears of it (in the
    /// background, when it changed).
    pub fn holding(&self, held: &Snapshot, record: &Record, refused: Vec<Refusal>) {
        let Some((reports, kinds)) = &self.hub else {
            return;
        };
        if !reports.is_following() {
            return;
        }
        // Held otherwise than served: rejected (by anyone) or left unwritten.
        let otherwise = (record.rejected.iter().map(|r| r.module.as_str()))
            .chain(record.unwritten.iter().map(|u| u.module.as_str()));
        reports.holds(hub_report::report(held, otherwise, &refused, *kinds));
    }

    /// Stopping (`cmpoll serve` draining): not ready from now on.
    pub fn stopping(&self) {
        self.health().stop();
    }

    fn ledger(&self, f: impl FnOnce(&mut Ledger)) {
        if let Some(l) = &self.ledger {
            f(&mut lock(l));
        }
    }

    /// A commit's `record`: `polled` is the poll's snapshot (the cluster's content) and
    /// `held` what the store held before the commit; `spool` has both's contents.
    pub fn committed(&self, record: &Record, spool: &Spool, polled: &Snapshot, held: &Snapshot) {
        self.log(record, polled.len());
        {
            let m = self.metrics();
            for r in &record.validations {
                m.validation(r);
            }
            if let Some(s) = &record.synced {
                m.events(&[
                    ("added", s.added),
                    ("updated", s.updated),
                    ("removed", s.removed),
                    ("rejected", s.rejected),
                ]);
            }
            m.rejected_modules(record.rejected.len());
            m.unwritten(record.unwritten.len());
        }
        {
            let mut h = self.health();
            match &record.runnable {
                Runnable::NotRun => {}
                Runnable::Ran => h.set_validator(None),
                Runnable::Cannot(why) => h.set_validator(Some(why.clone())),
            }
            for answer in &record.asked {
                h.reloads().set("--confirm", answer.clone());
            }
            h.set_unwritten(record.unwritten.clone());
        }
        self.report(record, spool, polled);
        self.ledger_modules(record, polled, held);
    }

    /// The batch's log line (`debug` when no sink heard of the poll).
    fn log(&self, r: &Record, modules: usize) {
        let Some(s) = &r.synced else {
            log::debug!(
                "poll {}: no changes ({} modules, {:?})",
                r.poll,
                modules,
                r.poll_took
            );
            return;
        };
        let line = format!(
            "poll {}: {} modules, {} added, {} updated, {} removed, {} rejected ({} objects, {} not modules, {:?})",
            r.poll,
            s.modules,
            s.added,
            s.updated,
            s.removed,
            s.rejected,
            r.objects,
            r.not_modules,
            r.poll_took,
        );
        let changes = s.added + s.updated + s.removed + s.rejected;
        if changes == 0 && !r.first {
            log::debug!("{line}");
        } else {
            log::info!("{line}");
        }
    }

    /// `--report-events`: what the objects' authors hear of this commit (handed to the
    /// reporter's thread, never waited for).
    fn report(&self, record: &Record, spool: &Spool, polled: &Snapshot) {
        let Some(reporter) = &self.reporter else {
            return;
        };
        let at = std::time::SystemTime::now();
        let occur = |id: &str, entry: &Entry, reason: Reason, note: &str| {
            let Ok(meta) = spool.meta(entry.loc) else {
                return;
            };
            let (namespace, name) = split_id(id);
            let note = match (meta.kind, reason) {
                (Resource::Secrets, Reason::Rejected) => crate::reason::redacted(note),
                _ => note.to_string(),
            };
            reporter.report(Occurrence {
                object: report::Regarding {
                    kind: meta.kind,
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    uid: meta.uid,
                    resource_version: meta.resource_version,
                },
                reason,
                note,
                at,
            });
        };
        for r in &record.announced {
            if let Some(entry) = polled.modules.get(&r.module) {
                occur(&r.module, entry, Reason::Rejected, &r.reason);
            }
        }
        for id in &record.accepted {
            if let Some(entry) = polled.modules.get(id) {
                let note = format!("delivered again: {}", entry.hash);
                occur(id, entry, Reason::Accepted, &note);
            }
        }
        for u in &record.unwritten {
            if let Some(entry) = polled.modules.get(&u.module) {
                occur(&u.module, entry, Reason::WriteFailed, &u.error);
            }
        }
    }

    /// `/status`: the sinks' deliveries, the poll's modules (the cluster's content), what is
    /// rejected and why, what a sink could not write and why (`held` has what a failed
    /// removal kept).
    fn ledger_modules(&self, record: &Record, polled: &Snapshot, held: &Snapshot) {
        let Some(ledger) = &self.ledger else {
            return;
        };
        let mut l = lock(ledger);
        for t in &record.took {
            l.delivered(t.sink, record.poll, t.events, t.unwritten);
        }
        let rejected = (record.rejected.iter())
            .map(|r| (r.module.clone(), r.reason.clone()))
            .collect();
        let mut unwritten = BTreeMap::new();
        for u in &record.unwritten {
            let at = (polled.modules.get(&u.module))
                .or_else(|| held.modules.get(&u.module))
                .map(|e| (e.hash, e.resource_version));
            unwritten.insert(u.module.clone(), (at, u.error.clone()));
        }
        l.modules(polled.modules.clone(), rejected, unwritten);
    }

    /// Sends what `--report-events` still holds, for at most `within` (at a stop).
    pub fn finish_reports(&mut self, within: Duration) {
        if let Some(r) = &mut self.reporter {
            r.finish(within);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().recover()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::health::{InFlight, ReloadOutcomes};
    use crate::source::Resources;

    /// A poll's outcome, told by the loop, reaches `/status` (the ledger's last poll),
    /// readiness and liveness: nobody else writes them.
    #[test]
    fn a_polls_outcome_reaches_status_and_readiness() {
        let d = Duration::from_secs(30);
        let health = Arc::new(Mutex::new(Health::new(d, d, d, InFlight::default())));
        let metrics = Arc::new(Mutex::new(Metrics::new()));
        let ledger = Ledger::new(
            "apiserver".into(),
            String::new(),
            d,
            Resources::one(Resource::ConfigMaps),
            ReloadOutcomes::default(),
        );
        let ledger = Arc::new(Mutex::new(ledger));
        let o = Observers::new(health.clone(), metrics).recording(Some(ledger.clone()), vec![]);
        let last_poll = || {
            let l = lock(&ledger);
            let p = l.last_poll.as_ref().map(|p| (p.number, p.error.clone()));
            (p, l.last_success.is_some())
        };
        o.poll_failed(1, d, "refused".into());
        assert_eq!(last_poll(), (Some((1, Some("refused".into()))), false));
        assert_eq!(lock(&health).last_error(), Some("refused"));
        assert!(lock(&health).readiness(Instant::now()).is_err());
        assert!(o.poll_succeeded(2, d, 3, 0), "the first");
        assert_eq!(last_poll(), (Some((2, None)), true));
        let h = lock(&health);
        assert_eq!((h.last_error(), h.modules()), (None, 3));
        drop(h);
        assert!(!o.poll_succeeded(3, d, 3, 0), "not the first");
        assert_eq!(lock(&health).readiness(Instant::now()), Ok(()));
        o.stopping();
        assert!(lock(&health).readiness(Instant::now()).is_err(), "stopping");
    }
}
