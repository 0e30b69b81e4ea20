//! Liveness and readiness, as rules over plain state and a `now`.
//!
//! Live (`/healthz`): the loop runs, and no apiserver request has hung past `--timeout`
//! (a hung request is exactly what k8s-sidecar's health stayed green through).
//! Ready (`/readyz`): a first batch went out, the last successful poll is younger than
//! 3 × interval plus the backoff cap (min(10 × interval, 5 min)), and the last reload of
//! every reload path (signal delivery, `--on-change` command, each reload URL), if any,
//! succeeded, the validator (`--validate`), if any, can run, and the last batch left no
//! module unwritten (the output folder's reason names the volume, and for want of space
//! the room needed beside what is free). Reload paths set their outcome in a shared
//! `ReloadOutcomes` handle themselves.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::locks::Recover;
use crate::reason::Unwritten;

/// How long past `--timeout` a request may run before the loop counts as stuck.
const REQUEST_SLACK: Duration = Duration::from_secs(30);
/// How long the main loop may go without running (it wakes at least every minute).
const LOOP_STALE: Duration = Duration::from_secs(300);

/// How far the output folder is into writing a batch (modules written, of how many),
/// shared with the `--out-dir` sink; `None` between batches.
#[derive(Clone, Debug, Default)]
pub struct Writing(Arc<Mutex<Option<(usize, usize)>>>);

impl Writing {
    pub fn set(&self, done: usize, of: usize) {
        *self.0.lock().recover() = Some((done, of));
    }

    pub fn clear(&self) {
        *self.0.lock().recover() = None;
    }

    pub fn get(&self) -> Option<(usize, usize)> {
        *self.0.lock().recover()
    }
}

/// `12345` as `12,345`, for progress lines.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// When the apiserver request in flight started (Unix milliseconds, 0: none), shared with
/// the client on the poll thread.
#[derive(Clone, Debug, Default)]
pub struct InFlight(Arc<AtomicU64>);

impl InFlight {
    pub fn start(&self) {
        let ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1);
        self.0.store(ms.max(1), Ordering::Relaxed);
    }

    pub fn stop(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// How long the request in flight has run.
    pub fn running_for(&self, now: SystemTime) -> Option<Duration> {
        let ms = self.0.load(Ordering::Relaxed);
        if ms == 0 {
            return None;
        }
        let started = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        Some(now.duration_since(started).unwrap_or_default())
    }
}

/// The last outcome of each reload path, shared with the paths that report them.
#[derive(Clone, Debug, Default)]
pub struct ReloadOutcomes(Arc<Mutex<BTreeMap<String, Outcome>>>);

/// A reload's result, and when it ended.
type Outcome = (Result<(), String>, SystemTime);

impl ReloadOutcomes {
    /// `path`'s last reload (for example `signal`, or a reload URL as logged).
    pub fn set(&self, path: &str, outcome: Result<(), String>) {
        self.0
            .lock()
            .recover()
            .insert(path.to_string(), (outcome, SystemTime::now()));
    }

    /// Every path's last reload, and when it ended.
    pub fn all(&self) -> Vec<(String, Result<(), String>, SystemTime)> {
        let all = self.0.lock().recover();
        (all.iter())
            .map(|(path, (r, at))| (path.clone(), r.clone(), *at))
            .collect()
    }

    /// The first path whose last reload failed, with why.
    fn failing(&self) -> Option<String> {
        let all = self.0.lock().recover();
        all.iter().find_map(|(path, (r, _))| {
            r.as_ref().err().map(|e| {
                if all.len() > 1 {
                    format!("{path}: {e}")
                } else {
                    e.clone()
                }
            })
        })
    }
}

#[derive(Debug)]
pub struct Health {
    /// How old the last successful poll may be and the daemon be ready: 3 × interval plus
    /// the backoff cap.
    stale_after: Duration,
    /// What liveness looks at besides the first batch.
    alive: Alive,
    first_batch: bool,
    last_success: Option<Instant>,
    last_error: Option<String>,
    /// The last reload of every reload path.
    reloads: ReloadOutcomes,
    modules: usize,
    /// `--validate` could not run (exit 126/127), until a validation runs again.
    validator: Option<String>,
    /// The output folder writing a batch.
    writing: Writing,
    /// What the last batch left unwritten, and why (empty: it wrote everything).
    unwritten: Vec<Unwritten>,
    /// The last poll asked a `cmpoll serve` hub: a failed one fails readiness at once
    /// (the hub is frozen, unreachable or cannot serve; SPEC), not after 3 intervals.
    following_hub: bool,
    /// Stopping (`cmpoll serve` draining after SIGTERM): not ready, whatever else.
    stopping: bool,
}

/// What `/healthz` looks at: no apiserver request running past `--timeout` (with
/// `REQUEST_SLACK`), the main loop turning, and, where asked, a first batch written.
#[derive(Debug)]
struct Alive {
    timeout: Duration,
    in_flight: InFlight,
    /// The main loop's last turn.
    loop_at: Instant,
    /// `/healthz` fails until the first batch is written (`cmpoll sidecar`).
    after_first_batch: bool,
}

impl Alive {
    /// The request and the loop: live, or why not.
    fn check(&self, now: Instant, wall: SystemTime) -> Result<(), String> {
        if let Some(running) = self.in_flight.running_for(wall)
            && running > self.timeout + REQUEST_SLACK
        {
            return Err(format!(
                "an apiserver request has been running for {}s (--timeout is {})",
                running.as_secs(),
                humantime::format_duration(self.timeout)
            ));
        }
        let idle = now.saturating_duration_since(self.loop_at);
        if idle > LOOP_STALE {
            return Err(format!("the main loop has not run for {}s", idle.as_secs()));
        }
        Ok(())
    }
}

impl Health {
    pub fn new(
        interval: Duration,
        backoff_cap: Duration,
        timeout: Duration,
        in_flight: InFlight,
    ) -> Health {
        Health {
            stale_after: interval.saturating_mul(3).saturating_add(backoff_cap),
            alive: Alive {
                timeout,
                in_flight,
                loop_at: Instant::now(),
                after_first_batch: false,
            },
            first_batch: false,
            last_success: None,
            last_error: None,
            reloads: ReloadOutcomes::default(),
            modules: 0,
            validator: None,
            writing: Writing::default(),
            unwritten: Vec::new(),
            following_hub: false,
            stopping: false,
        }
    }

    /// `/healthz` fails until the first batch is written (`cmpoll sidecar`).
    pub fn live_after_first_batch(mut self, on: bool) -> Health {
        self.alive.after_first_batch = on;
        self
    }

    /// The last reload of every reload path (a shared handle: the reload paths set their
    /// outcome in it themselves).
    pub fn reloads(&self) -> &ReloadOutcomes {
        &self.reloads
    }

    /// How far the output folder is into writing a batch (a handle shared with it).
    pub fn writing(&self) -> &Writing {
        &self.writing
    }

    /// A first batch went out (a poll succeeded).
    pub fn first_batch(&self) -> bool {
        self.first_batch
    }

    pub fn last_success(&self) -> Option<Instant> {
        self.last_success
    }

    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// The modules of the last successful poll.
    pub fn modules(&self) -> usize {
        self.modules
    }

    /// Why `--validate` cannot run, until a validation runs again.
    pub fn validator(&self) -> Option<&str> {
        self.validator.as_deref()
    }

    /// A poll succeeded at `at` with `modules`. Whether it was the first.
    pub fn succeeded(&mut self, at: Instant, modules: usize) -> bool {
        let first = !self.first_batch;
        self.first_batch = true;
        self.last_success = Some(at);
        self.last_error = None;
        self.modules = modules;
        first
    }

    /// A poll failed for `why`.
    pub fn failed(&mut self, why: String) {
        self.last_error = Some(why);
    }

    /// `--validate` can run (`None`), or cannot, and why.
    pub fn set_validator(&mut self, cannot: Option<String>) {
        self.validator = cannot;
    }

    /// What the last batch left unwritten, and why.
    pub fn set_unwritten(&mut self, unwritten: Vec<Unwritten>) {
        self.unwritten = unwritten;
    }

    /// The main loop turned at `at`.
    pub fn loop_turned(&mut self, at: Instant) {
        self.alive.loop_at = at;
    }

    /// The last poll asked a `cmpoll serve` hub (`hub`), or not.
    pub fn set_following_hub(&mut self, hub: bool) {
        self.following_hub = hub;
    }

    /// Stopping: not ready from now on.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// `/healthz`.
    pub fn liveness(&self, now: Instant, wall: SystemTime) -> Result<(), String> {
        if self.alive.after_first_batch && !self.first_batch {
            return Err("not ready: the first batch is not written yet".into());
        }
        self.alive.check(now, wall)
    }

    /// `/readyz`.
    pub fn readiness(&self, now: Instant) -> Result<(), String> {
        if self.stopping {
            return Err("stopping: letting the followers go to another hub".into());
        }
        self.serving(now)
    }

    /// `readiness` for anyone to read (a hub's open `/readyz`): why only when it says
    /// nothing of the hub's account or apiserver (stopping); `None` for a reason withheld.
    pub fn withheld_readiness(&self, now: Instant) -> Result<(), Option<String>> {
        match self.readiness(now) {
            Ok(()) => Ok(()),
            Err(why) if self.stopping => Err(Some(why)),
            Err(_) => Err(None),
        }
    }

    /// `serving` for a hub's clients, who are told why it cannot serve but not the poll's
    /// error (it names the hub's account and the apiserver's address; `/status` and the
    /// log have it).
    pub fn serving_withheld(&self, now: Instant) -> Result<(), String> {
        self.serving(now).map_err(|_| match self.last_success {
            None => "no complete poll yet".to_string(),
            Some(last) => format!(
                "the last successful poll was {}s ago",
                now.saturating_duration_since(last).as_secs()
            ),
        })
    }

    /// `readiness`, but for a hub that is stopping, which is not ready (no newcomers) and
    /// still serves those that come before it is gone.
    pub fn serving(&self, now: Instant) -> Result<(), String> {
        let Some(last) = self.last_success.filter(|_| self.first_batch) else {
            if let Some((done, of)) = self.writing.get() {
                return Err(format!(
                    "no complete poll yet: the first batch is being written to the output folder ({} of {} modules)",
                    thousands(done),
                    thousands(of)
                ));
            }
            return Err(match &self.last_error {
                Some(e) => format!("no complete poll yet: {e}"),
                None => "no complete poll yet".to_string(),
            });
        };
        let limit = self.stale_after;
        let age = now.saturating_duration_since(last);
        if age > limit {
            return Err(format!(
                "the last successful poll was {}s ago (more than {}s): {}",
                age.as_secs(),
                limit.as_secs(),
                self.last_error.as_deref().unwrap_or("no error recorded")
            ));
        }
        if let Some(e) = self.last_error.as_ref().filter(|_| self.following_hub) {
            return Err(format!(
                "the last poll of the hub failed (the modules stay as they are): {e}"
            ));
        }
        if let Some(e) = self.reloads.failing() {
            return Err(format!("the last reload failed: {e}"));
        }
        if let Some(e) = &self.validator {
            return Err(e.clone());
        }
        if let Some(Unwritten {
            module: id,
            error: why,
        }) = self.unwritten.first()
        {
            let others = match self.unwritten.len() - 1 {
                0 => String::new(),
                1 => " (and 1 other module)".to_string(),
                n => format!(" (and {} other modules)", thousands(n)),
            };
            return Err(format!("the last batch left {id} unwritten{others}: {why}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Health {
        Health::new(
            Duration::from_secs(30),
            Duration::from_secs(300),
            Duration::from_secs(10),
            InFlight::default(),
        )
    }

    /// Issue 42.1: a batch that left a module unwritten makes readiness fail, naming it
    /// and why (the output folder's reason names the volume and the room); the next batch
    /// that writes everything makes it ready again.
    #[test]
    fn a_module_left_unwritten_is_not_ready_until_it_is_written() {
        let mut h = health();
        h.first_batch = true;
        h.last_success = Some(Instant::now());
        assert_eq!(h.readiness(Instant::now()), Ok(()));
        let why = "No space left on device (os error 28): it needs about 1.5 MiB and the volume mounted at '/out' has 900.0 KiB free";
        h.unwritten = vec![
            Unwritten::new("apps/m0", why),
            Unwritten::new("apps/m1", why),
        ];
        assert_eq!(
            h.readiness(Instant::now()),
            Err(format!(
                "the last batch left apps/m0 unwritten (and 1 other module): {why}"
            ))
        );
        h.unwritten.clear();
        assert_eq!(h.readiness(Instant::now()), Ok(()));
    }

    /// A follower of a hub says at once that its last poll of the hub failed (a hub that
    /// froze, or cannot be reached), not three intervals later; a direct poller does not.
    #[test]
    fn a_follower_is_not_ready_while_its_hub_cannot_be_polled() {
        let mut h = health();
        h.first_batch = true;
        h.last_success = Some(Instant::now());
        h.last_error = Some("the hub said nothing on its watch for 41 s".into());
        assert_eq!(h.readiness(Instant::now()), Ok(()), "not a follower");
        h.following_hub = true;
        assert_eq!(
            h.readiness(Instant::now()).unwrap_err(),
            "the last poll of the hub failed (the modules stay as they are): the hub said nothing on its watch for 41 s"
        );
        h.last_error = None;
        assert_eq!(h.readiness(Instant::now()), Ok(()));
    }

    /// Issue 29.3: a long first batch says so in readiness.
    #[test]
    fn a_first_batch_being_written_says_how_far_it_is() {
        let t0 = Instant::now();
        let h = health();
        h.writing.set(40_000, 100_000);
        assert_eq!(
            h.readiness(t0).unwrap_err(),
            "no complete poll yet: the first batch is being written to the output folder (40,000 of 100,000 modules)"
        );
        h.writing.clear();
        assert_eq!(h.readiness(t0).unwrap_err(), "no complete poll yet");
        for (n, want) in [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (1234567, "1,234,567"),
        ] {
            assert_eq!(thousands(n), want);
        }
    }

    #[test]
    fn readiness_across_start_success_failure_and_reloads() {
        let t0 = Instant::now();
        let mut h = health();
        assert_eq!(h.readiness(t0).unwrap_err(), "no complete poll yet");
        h.last_error = Some("401 Unauthorized".into());
        assert_eq!(
            h.readiness(t0).unwrap_err(),
            "no complete poll yet: 401 Unauthorized"
        );
        h.first_batch = true;
        h.last_success = Some(t0);
        h.last_error = None;
        assert_eq!(h.readiness(t0 + Duration::from_secs(389)), Ok(()));
        h.last_error = Some("500".into());
        let stale = h.readiness(t0 + Duration::from_secs(391)).unwrap_err();
        assert!(stale.contains("391s ago (more than 390s): 500"), "{stale}");
        h.reloads.set("url", Err("503 Service Unavailable".into()));
        assert_eq!(
            h.readiness(t0).unwrap_err(),
            "the last reload failed: 503 Service Unavailable"
        );
        h.reloads.set("url", Ok(()));
        assert_eq!(h.readiness(t0), Ok(()));
        // Every path must have succeeded last.
        h.reloads.set("signal", Err("ESRCH".into()));
        assert_eq!(
            h.readiness(t0).unwrap_err(),
            "the last reload failed: signal: ESRCH"
        );
    }

    #[test]
    fn liveness_fails_for_a_hung_request_or_a_stalled_loop() {
        let h = health();
        let now = SystemTime::now();
        assert_eq!(h.liveness(Instant::now(), now), Ok(()));
        h.alive.in_flight.start();
        assert_eq!(
            h.liveness(Instant::now(), now + Duration::from_secs(39)),
            Ok(())
        );
        let e = h
            .liveness(Instant::now(), now + Duration::from_secs(41))
            .unwrap_err();
        assert!(
            e.starts_with("an apiserver request has been running for 4"),
            "{e}"
        );
        h.alive.in_flight.stop();
        let e = h
            .liveness(h.alive.loop_at + Duration::from_secs(301), now)
            .unwrap_err();
        assert_eq!(e, "the main loop has not run for 301s");
    }
}
