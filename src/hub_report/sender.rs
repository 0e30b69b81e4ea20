//! Sending a follower's report to its hub (`hub_protocol::REPORT_PATH`), on a thread of
//! its own, so that a report never delays or fails a poll: the loop hands over the newest
//! state (`HubReports::holds`) and whether it follows a hub (`HubReports::following`), and
//! returns at once. Bounded: one report in flight, one state pending (a newer one replaces
//! it, never a queue of old ones). A state is sent only while following a hub, only when it
//! differs from the last one the hub took, and once each time the follower starts
//! following a hub (again after a failed poll: `batch::Observers`), and a state with
//! exceptions again, unchanged, every `REFRESH` (spread by a fifth): a hub keeps reports
//! in memory, so one that restarted, or the other hub behind a Service that a follower's
//! connections moved to, learns them within that time even when nothing changes. A
//! follower with no exception (it holds what it was served) sends nothing more: every hub
//! reads that off its watch. A failure is counted,
//! logged at warning once per kind until a report is taken again, and retried with backoff
//! (a 429 or 503 after its `Retry-After`; the hub's own 429, its pace, is no failure and
//! is not warned about); a 404 or 405 is a hub that takes no reports: said once at info,
//! nothing more is sent until the follower starts following a hub again.

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backoff::{self, Backoff, Rng};
use crate::hub_protocol::{REPORT_PATH, Report};
use crate::kube;
use crate::locks::Recover;
use crate::ops::metrics::Results;

/// The first wait after a failure; it doubles up to `LONGEST`.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait after failures (and the most a `Retry-After` is followed).
const LONGEST: Duration = Duration::from_secs(300);
/// How long the thread sleeps with nothing to send before it looks again.
const IDLE: Duration = Duration::from_secs(60);
/// A state with exceptions the hub took is sent again, unchanged, after this long (and up
/// to a fifth more): a hub that restarted, or the other hub behind the Service, learns
/// them within it.
pub const REFRESH: Duration = Duration::from_secs(120);
/// After its last exception cleared, the state (none) is refreshed so long still: a hub
/// that heard of the exceptions and not of their end forgets a silent follower after an
/// hour, not one whose watch it still holds.
pub const CLEARED: Duration = Duration::from_secs(3600);

/// Where reports go (a seam: the hub through the follower's client, or a test's fake).
pub trait Hub: Send {
    /// POSTs `body` (a `Report` as JSON) to the hub; `Ok` when taken.
    fn post(&mut self, body: Vec<u8>) -> Result<(), kube::Error>;
}

/// The hub, through a client with the follower's credentials, CA, TLS and proxy, sending
/// its wait as its lists do (`hub_protocol::WAIT_HEADER`).
pub struct KubeHub {
    pub client: kube::Client,
    pub wait: Duration,
}

impl Hub for KubeHub {
    fn post(&mut self, body: Vec<u8>) -> Result<(), kube::Error> {
        (self.client).post_to_hub(REPORT_PATH, body, self.wait, "report to the hub")
    }
}

/// What the loop hands the thread: the newest state, whether it follows a hub now.
#[derive(Default)]
struct Slot {
    newest: Option<Arc<Report>>,
    following: bool,
    /// Counts the times the follower started following a hub.
    period: u64,
    stop: bool,
}

type Shared = Arc<(Mutex<Slot>, Condvar)>;

/// The loop's handle: nothing it does waits for the hub.
pub struct HubReports {
    shared: Shared,
}

impl HubReports {
    /// Starts the sending thread over `hub`, counting into `results` (`ok`, `error`).
    pub fn start(hub: impl Hub + 'static, results: Results) -> Result<HubReports, String> {
        HubReports::refreshing(hub, results, (REFRESH, CLEARED))
    }

    /// `start`, a state the hub took sent again after `refresh` (and up to a fifth more).
    fn refreshing(
        hub: impl Hub + 'static,
        results: Results,
        refresh: (Duration, Duration),
    ) -> Result<HubReports, String> {
        let shared: Shared = Arc::default();
        let theirs = shared.clone();
        std::thread::Builder::new()
            .name("hub-reports".into())
            .spawn(move || send(hub, &theirs, &results, refresh))
            .map_err(|e| format!("cannot start the hub reports' thread: {e}"))?;
        Ok(HubReports { shared })
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.shared.0.lock().recover()
    }

    /// The last poll asked a hub (`hub`), or not: reports go only to a hub, and once more
    /// each time the follower starts following one (with the state of its next commit:
    /// what it held while it followed none is not told).
    pub fn following(&self, hub: bool) {
        let mut s = self.slot();
        if hub && !s.following {
            s.period += 1;
        }
        if !hub {
            s.newest = None;
        }
        s.following = hub;
        drop(s);
        self.shared.1.notify_one();
    }

    /// Whether the last poll asked a hub (a report is worth making).
    pub fn is_following(&self) -> bool {
        self.slot().following
    }

    /// What the follower holds now: sent when the hub has not taken it yet, replacing any
    /// state not sent yet.
    pub fn holds(&self, report: Report) {
        let mut s = self.slot();
        if s.newest.as_deref() == Some(&report) {
            return;
        }
        s.newest = Some(Arc::new(report));
        drop(s);
        self.shared.1.notify_one();
    }
}

impl Drop for HubReports {
    /// The thread ends after the report in flight, if any; nobody waits for it.
    fn drop(&mut self) {
        self.slot().stop = true;
        self.shared.1.notify_one();
    }
}

/// The thread: waits for a state to send, sends it, and keeps what the hub took.
fn send(mut hub: impl Hub, shared: &Shared, results: &Results, refresh: (Duration, Duration)) {
    let mut state = Sending {
        refresh: refresh.0,
        cleared: refresh.1,
        ..Sending::default()
    };
    while let Some(report) = state.next(shared) {
        let body = match serde_json::to_vec(&*report) {
            Ok(b) => b,
            Err(e) => {
                log::warn!("cannot write the report to the hub: {e}");
                return;
            }
        };
        let answer = hub.post(body);
        results.record(if answer.is_ok() { "ok" } else { "error" });
        state.answered(report, answer);
    }
}

/// What the thread knows of this period of following a hub.
struct Sending {
    period: u64,
    /// The last report the hub took.
    taken: Option<Arc<Report>>,
    /// When it is sent again unchanged, and how long after it was taken (`REFRESH`).
    refresh_at: Instant,
    refresh: Duration,
    /// How long a state without exceptions is refreshed after the last with some
    /// (`CLEARED`), and until when.
    cleared: Duration,
    cleared_until: Option<Instant>,
    rng: Rng,
    /// The hub takes no reports (404, 405).
    refused: bool,
    /// No report before this instant (a backoff, a `Retry-After`).
    not_before: Instant,
    backoff: Backoff,
    /// The kinds of failure warned about since the last report taken.
    warned: HashSet<String>,
}

impl Default for Sending {
    fn default() -> Sending {
        Sending {
            period: 0,
            taken: None,
            refresh_at: Instant::now(),
            refresh: REFRESH,
            cleared: CLEARED,
            cleared_until: None,
            rng: Rng::from_time(),
            refused: false,
            not_before: Instant::now(),
            backoff: Backoff::new(FIRST_RETRY, LONGEST, 0.2, Rng::from_time()),
            warned: HashSet::new(),
        }
    }
}

impl Sending {
    /// The next report to send, when it is due; `None`: stop.
    fn next(&mut self, shared: &Shared) -> Option<Arc<Report>> {
        let (lock, wake) = &**shared;
        let mut s = lock.lock().recover();
        loop {
            if s.stop {
                return None;
            }
            if s.period != self.period {
                // Following a hub again: it hears the state once, whatever it took before.
                self.period = s.period;
                self.taken = None;
                self.refused = false;
                self.backoff.reset();
                self.not_before = Instant::now();
            }
            let now = Instant::now();
            let sendable = (s.newest.as_ref()).filter(|_| s.following && !self.refused);
            let taken = |n: &Arc<Report>| self.taken.as_ref() == Some(n);
            // Only exceptions are refreshed (and their end, for a while): a hub reads
            // "holds what it was served" off the follower's watch, whichever hub it is.
            let lately = self.cleared_until.is_some_and(|until| now < until);
            let refreshed = sendable.filter(|n| !n.modules.is_empty() || lately);
            let due =
                sendable.filter(|n| !taken(n) || (refreshed.is_some() && now >= self.refresh_at));
            let wait = match due {
                Some(n) if now >= self.not_before => return Some(n.clone()),
                Some(_) => self.not_before - now,
                None if refreshed.is_some() => self.refresh_at.saturating_duration_since(now),
                None => IDLE,
            };
            s = wake.wait_timeout(s, wait).recover().0;
        }
    }

    /// The hub's `answer` to `report`.
    fn answered(&mut self, report: Arc<Report>, answer: Result<(), kube::Error>) {
        let e = match answer {
            Ok(()) => {
                if !report.modules.is_empty() {
                    self.cleared_until = Some(backoff::after(Instant::now(), self.cleared));
                }
                self.taken = Some(report);
                let spread = self.refresh.mul_f64(1.0 + 0.2 * self.rng.unit());
                self.refresh_at = backoff::after(Instant::now(), spread);
                self.backoff.reset();
                self.warned.clear();
                return;
            }
            Err(e) => e,
        };
        // The hub's own pace (its rate per follower): as told, not a failure.
        if let Some(after) = e.hub_asks_to_wait() {
            log::debug!("the hub asks for the next report in {after:?}: {e}");
            self.not_before = backoff::after(Instant::now(), self.backoff.told(after));
            return;
        }
        match e.code() {
            Some(404 | 405) => {
                log::info!(
                    "the hub takes no reports of what this follower holds ({e}); none is sent until it is followed again"
                );
                self.refused = true;
            }
            code => {
                let told = e.retry_after().filter(|_| matches!(code, Some(429 | 503)));
                let wait = match told {
                    Some(after) => self.backoff.told(after),
                    None => self.backoff.after_failure(None),
                };
                let kind = code.map_or_else(|| failure_kind(&e).to_string(), |c| c.to_string());
                if self.warned.insert(kind) {
                    log::warn!(
                        "cannot report to the hub what this follower holds: {e}; trying again in {} with the newest state (said once until a report is taken)",
                        humantime::format_duration(Duration::from_secs(wait.as_secs().max(1)))
                    );
                }
                self.not_before = backoff::after(Instant::now(), wait);
            }
        }
    }
}

/// A failure without an answer, by kind (one warning each).
fn failure_kind(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api { .. } => "answer",
        kube::Error::Transport { .. } => "transport",
        kube::Error::Timeout { .. } => "timeout",
        kube::Error::Credentials(_) => "credentials",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::hub_protocol::Reported;
    use std::sync::mpsc;

    /// Records each body, answers as told (one answer per post, then 204s).
    struct Fake {
        sent: mpsc::Sender<Report>,
        answers: Arc<Mutex<Vec<Result<(), kube::Error>>>>,
    }

    impl Hub for Fake {
        fn post(&mut self, body: Vec<u8>) -> Result<(), kube::Error> {
            self.sent
                .send(serde_json::from_slice(&body).unwrap())
                .unwrap();
            let mut a = self.answers.lock().unwrap();
            if a.is_empty() { Ok(()) } else { a.remove(0) }
        }
    }

    fn api(code: u16, retry_after: Option<Duration>) -> kube::Error {
        kube::Error::Api {
            action: "report to the hub".into(),
            code,
            reason: String::new(),
            message: String::new(),
            retry_after,
            causes: Box::new([]),
            about: None,
            hub: true,
        }
    }

    fn holding(n: usize) -> Report {
        Report {
            modules: (0..n)
                .map(|i| Reported {
                    module: format!("ns/m{i}"),
                    kind: "ConfigMap".into(),
                    hash: None,
                    resource_version: None,
                    refused: None,
                })
                .collect(),
            truncated: false,
        }
    }

    fn start(
        answers: Vec<Result<(), kube::Error>>,
    ) -> (HubReports, mpsc::Receiver<Report>, Results) {
        let (tx, rx) = mpsc::channel();
        let results = Results::default();
        let fake = Fake {
            sent: tx,
            answers: Arc::new(Mutex::new(answers)),
        };
        (
            HubReports::start(fake, results.clone()).unwrap(),
            rx,
            results,
        )
    }

    const SOON: Duration = Duration::from_millis(300);

    /// A state with exceptions the hub took is sent again, unchanged, after the refresh (a
    /// hub that restarted, or the other hub behind the Service, learns it), not before;
    /// one without is not.
    #[test]
    fn a_taken_state_is_sent_again_after_the_refresh() {
        let (tx, rx) = mpsc::channel();
        let fake = Fake {
            sent: tx,
            answers: Arc::new(Mutex::new(vec![])),
        };
        let refresh = Duration::from_millis(600);
        let cleared = Duration::from_millis(2500);
        let r = HubReports::refreshing(fake, Results::default(), (refresh, cleared)).unwrap();
        r.following(true);
        r.holds(holding(1));
        assert_eq!(rx.recv_timeout(SOON).unwrap(), holding(1));
        let taken = Instant::now();
        assert!(
            rx.recv_timeout(Duration::from_millis(400)).is_err(),
            "not yet"
        );
        assert_eq!(rx.recv_timeout(Duration::from_secs(2)).unwrap(), holding(1));
        let after = taken.elapsed();
        assert!(after >= refresh && after < refresh * 2, "{after:?}");
        // No exception any more: sent once, and refreshed while `cleared` lasts (a hub that
        // heard of them hears of their end), then not (every hub reads it off the watch).
        r.holds(holding(0));
        let cleared_at = Instant::now();
        assert_eq!(rx.recv_timeout(SOON).unwrap(), holding(0));
        assert_eq!(rx.recv_timeout(refresh * 2).unwrap(), holding(0));
        while rx.recv_timeout(refresh * 2).is_ok() {
            assert!(cleared_at.elapsed() < cleared + refresh * 2, "past cleared");
        }
        assert!(
            cleared_at.elapsed() >= cleared,
            "{:?}",
            cleared_at.elapsed()
        );
    }

    /// A follower that never had an exception refreshes nothing.
    #[test]
    fn no_exception_ever_is_never_refreshed() {
        let (tx, rx) = mpsc::channel();
        let fake = Fake {
            sent: tx,
            answers: Arc::new(Mutex::new(vec![])),
        };
        let refresh = Duration::from_millis(300);
        let r = HubReports::refreshing(fake, Results::default(), (refresh, refresh * 10)).unwrap();
        r.following(true);
        r.holds(holding(0));
        assert_eq!(rx.recv_timeout(SOON).unwrap(), holding(0));
        assert!(rx.recv_timeout(refresh * 4).is_err(), "not refreshed");
    }

    /// Nothing before following a hub; then the state once; the same state again is not
    /// sent; a new one is; following again sends the state once more.
    #[test]
    fn a_state_is_sent_once_while_following_and_again_when_it_changes() {
        let (r, rx, results) = start(vec![]);
        r.holds(holding(1));
        assert!(rx.recv_timeout(SOON).is_err(), "not following a hub");
        r.following(true);
        assert_eq!(rx.recv_timeout(SOON).unwrap(), holding(1));
        r.holds(holding(1));
        r.following(true);
        assert!(rx.recv_timeout(SOON).is_err(), "unchanged: not sent again");
        r.holds(holding(2));
        assert_eq!(rx.recv_timeout(SOON).unwrap(), holding(2));
        r.following(false);
        r.holds(holding(3));
        assert!(rx.recv_timeout(SOON).is_err(), "not following: kept");
        r.following(true);
        assert_eq!(rx.recv_timeout(SOON).unwrap(), holding(3));
        r.following(false);
        r.following(true);
        assert!(rx.recv_timeout(SOON).is_err(), "no state yet since");
        r.holds(holding(3));
        assert_eq!(
            rx.recv_timeout(SOON).unwrap(),
            holding(3),
            "once per following"
        );
        assert!(rx.recv_timeout(SOON).is_err(), "nothing more");
        assert_eq!((results.get("ok"), results.get("error")), (4, 0));
    }

    /// A failure is retried with the newest state, after its backoff.
    #[test]
    fn a_failure_is_retried_with_the_newest_state() {
        let (r, rx, results) = start(vec![Err(api(500, None))]);
        r.following(true);
        r.holds(holding(1));
        assert_eq!(rx.recv_timeout(SOON).unwrap(), holding(1));
        // Before the retry (a second at least), a newer state replaces the one refused.
        r.holds(holding(2));
        let retried = rx.recv_timeout(Duration::from_secs(3)).unwrap();
        assert_eq!(retried, holding(2));
        assert!(rx.recv_timeout(SOON).is_err(), "taken: nothing more");
        assert_eq!((results.get("ok"), results.get("error")), (1, 1));
    }

    /// A 429 is retried after its `Retry-After`, not before.
    #[test]
    fn a_429_waits_its_retry_after() {
        let (r, rx, _) = start(vec![Err(api(429, Some(Duration::from_secs(2))))]);
        r.following(true);
        r.holds(holding(1));
        rx.recv_timeout(SOON).unwrap();
        let asked = Instant::now();
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(
            asked.elapsed() >= Duration::from_millis(1900),
            "{:?}",
            asked.elapsed()
        );
    }

    /// A 404 (a hub that takes no reports): nothing more is sent, changed or not, until
    /// the follower starts following a hub again.
    #[test]
    fn a_404_stops_the_reports_until_the_next_following() {
        let (r, rx, _) = start(vec![Err(api(404, None))]);
        r.following(true);
        r.holds(holding(1));
        rx.recv_timeout(SOON).unwrap();
        r.holds(holding(2));
        assert!(rx.recv_timeout(Duration::from_secs(2)).is_err(), "stopped");
        r.following(false);
        r.following(true);
        r.holds(holding(2));
        assert_eq!(rx.recv_timeout(SOON).unwrap(), holding(2));
    }
}
