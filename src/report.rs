//! `--report-events`: Kubernetes Events (`events.k8s.io/v1`) that tell the author of a
//! ConfigMap or Secret, with kubectl alone, why their module was not delivered: `Rejected`
//! and `WriteFailed` (Warning), `Accepted` (Normal, when a rejected module goes out again).
//!
//! Guarantees: reporting never fails or delays a poll (the loop hands occurrences to a
//! thread through a bounded queue and never waits for it; a full queue drops and counts);
//! at most one API call per object per `MIN_GAP` (later occurrences fold into the next
//! call: the latest wins, repeats add to their event's count); the same (object, reason,
//! note) again updates the existing event's `series` instead of creating one, as client-go's
//! `tools/events` recorder does (a first occurrence is created without a series, the
//! second makes it `count: 2`, a 404 on the patch creates the event again, and an event
//! not seen for `FINISH` is forgotten, so a later repeat starts a new one); a failure is
//! logged at warning and counted, and retried at the next slot at most `TRIES` times. A
//! Secret's `Rejected` note never carries validator output: the caller gives only the
//! exit status (`reason::redacted`).

use std::collections::HashMap;
use std::io::Read;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::kube;
use crate::kube::client::Method;
use crate::ops::metrics::Results;
use crate::reason::cut;
use crate::source::selection::Resource;

/// `reportingController` of every event.
pub const CONTROLLER: &str = "cmpoll.io/cmpoll";
/// `action` of every event.
pub const ACTION: &str = "Deliver";
/// At most one API call per object in this time.
pub const MIN_GAP: Duration = Duration::from_secs(60);
/// An event not seen again for this long is forgotten (client-go's `finishTime`).
pub const FINISH: Duration = Duration::from_secs(6 * 60);
/// The apiserver's limit on `note` (`NoteLengthLimit`).
pub const MAX_NOTE: usize = 1024;
/// Attempts per occurrence before it is dropped.
pub const TRIES: u32 = 5;
/// Occurrences waiting for the thread at most; more are dropped (and counted).
const QUEUE: usize = 1000;

/// The object an event is about (`regarding`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Regarding {
    pub kind: Resource,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
}

/// What happened to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Rejected (`--validate`, a flat name clash, a failed `.url` fetch): Warning.
    Rejected,
    /// A previously rejected module went out again: Normal.
    Accepted,
    /// The output directory could not write it: Warning.
    WriteFailed,
}

impl Reason {
    pub fn word(self) -> &'static str {
        match self {
            Reason::Rejected => "Rejected",
            Reason::Accepted => "Accepted",
            Reason::WriteFailed => "WriteFailed",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Reason::Accepted => "Normal",
            Reason::Rejected | Reason::WriteFailed => "Warning",
        }
    }
}

/// One thing to tell the object's author.
#[derive(Clone, Debug)]
pub struct Occurrence {
    pub object: Regarding,
    pub reason: Reason,
    /// Cut to `MAX_NOTE` bytes on a character boundary here.
    pub note: String,
    pub at: SystemTime,
}

/// The apiserver calls the recorder makes (a seam for tests).
pub trait Api {
    /// POSTs `event` into `namespace`.
    fn create(&mut self, namespace: &str, event: &Value) -> Result<(), Failure>;
    /// Patches the series of event `name`.
    fn patch(&mut self, namespace: &str, name: &str, patch: &Value) -> Result<(), Failure>;
}

/// Why an API call failed.
#[derive(Debug)]
pub enum Failure {
    /// 404: the event expired (or was deleted); create it again.
    NotFound,
    /// Anything else, with its message.
    Other(String),
}

/// The events of one object.
#[derive(Debug)]
struct Obj {
    regarding: Regarding,
    last_call: Option<Instant>,
    recorded: HashMap<(Reason, String), Recorded>,
    /// The event due at the next slot.
    pending: Option<(Reason, String)>,
    tries: u32,
}

/// One event: created once, its series counted.
#[derive(Debug)]
struct Recorded {
    /// `None` until created.
    name: Option<String>,
    first: SystemTime,
    last: SystemTime,
    count: u32,
    /// `count` when last recorded.
    sent: u32,
    /// When this event was last seen (for `FINISH`).
    seen: Instant,
}

/// The series logic, with its API and clock given.
pub struct Recorder<A: Api> {
    api: A,
    instance: String,
    objects: HashMap<(Resource, String, String), Obj>,
    results: Results,
}

impl<A: Api> Recorder<A> {
    pub fn new(api: A, instance: String, results: Results) -> Recorder<A> {
        Recorder {
            api,
            instance,
            objects: HashMap::new(),
            results,
        }
    }

    /// Takes `o` in; it is sent at once when its object's slot is free.
    pub fn occur(&mut self, o: Occurrence, now: Instant) {
        let key = (
            o.object.kind,
            o.object.namespace.clone(),
            o.object.name.clone(),
        );
        let obj = self.objects.entry(key).or_insert_with(|| Obj {
            regarding: o.object.clone(),
            last_call: None,
            recorded: HashMap::new(),
            pending: None,
            tries: 0,
        });
        // A new object of the same name (deleted and made again) starts afresh.
        if obj.regarding.uid != o.object.uid {
            obj.recorded.clear();
        }
        obj.regarding = o.object;
        let note = cut(&o.note, MAX_NOTE).into_owned();
        let k = (o.reason, note);
        let r = obj.recorded.entry(k.clone()).or_insert(Recorded {
            name: None,
            first: o.at,
            last: o.at,
            count: 0,
            sent: 0,
            seen: now,
        });
        r.count += 1;
        r.last = o.at;
        r.seen = now;
        obj.pending = Some(k);
        obj.tries = 0;
    }

    /// Sends what is due at `now` (everything pending, with `all`: a last flush); when the
    /// next thing falls due.
    pub fn send_due(&mut self, now: Instant, all: bool) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let keys: Vec<_> = self.objects.keys().cloned().collect();
        for key in keys {
            let Some(obj) = self.objects.get_mut(&key) else {
                continue;
            };
            if obj.pending.is_some() {
                let due = obj.last_call.map_or(now, |t| t + MIN_GAP);
                if due <= now || all {
                    self.send(&key, now);
                } else {
                    next = Some(next.map_or(due, |n: Instant| n.min(due)));
                    continue;
                }
            }
            // Forget what was not seen for FINISH (client-go's finishSeries).
            if let Some(obj) = self.objects.get_mut(&key) {
                if obj.pending.is_some() {
                    let due = obj.last_call.map_or(now, |t| t + MIN_GAP);
                    next = Some(next.map_or(due, |n: Instant| n.min(due)));
                    continue;
                }
                obj.recorded
                    .retain(|_, r| now.saturating_duration_since(r.seen) < FINISH);
                let idle = obj
                    .last_call
                    .is_none_or(|t| now.saturating_duration_since(t) >= MIN_GAP);
                if obj.recorded.is_empty() && idle {
                    self.objects.remove(&key);
                }
            }
        }
        next
    }

    fn send(&mut self, key: &(Resource, String, String), now: Instant) {
        let instance = self.instance.clone();
        let Some(obj) = self.objects.get_mut(key) else {
            return;
        };
        let Some(k) = obj.pending.clone() else {
            return;
        };
        let regarding = obj.regarding.clone();
        let Some(r) = obj.recorded.get_mut(&k) else {
            obj.pending = None;
            return;
        };
        obj.last_call = Some(now);
        let ns = regarding.namespace.clone();
        let series = (r.count >= 2)
            .then(|| json!({"count": r.count, "lastObservedTime": micro_time(r.last)}));
        let result = match (&r.name, &series) {
            (Some(name), Some(series)) => {
                match self.api.patch(&ns, name, &json!({ "series": series })) {
                    Err(Failure::NotFound) => {
                        let (name, event) =
                            event(&regarding, &k, r, Some(series.clone()), &instance);
                        self.api.create(&ns, &event).map(|()| name)
                    }
                    other => other.map(|()| name.to_string()),
                }
            }
            _ => {
                let (name, event) = event(&regarding, &k, r, series, &instance);
                self.api.create(&ns, &event).map(|()| name)
            }
        };
        let what = format!(
            "event {} for {} {}/{}",
            k.0.word(),
            regarding.kind.singular(),
            regarding.namespace,
            regarding.name
        );
        match result {
            Ok(name) => {
                log::debug!("recorded {what} ({name}, count {})", r.count);
                r.name = Some(name);
                r.sent = r.count;
                obj.pending = None;
                self.results.record("ok");
            }
            Err(e) => {
                self.results.record("error");
                obj.tries += 1;
                let why = match e {
                    Failure::NotFound => "404 Not Found".to_string(),
                    Failure::Other(m) => m,
                };
                if obj.tries >= TRIES {
                    log::warn!("--report-events: cannot record {what}: {why}; giving up on it");
                    obj.pending = None;
                } else {
                    log::warn!(
                        "--report-events: cannot record {what}: {why}; trying again in {}",
                        humantime::format_duration(MIN_GAP)
                    );
                }
            }
        }
    }
}

/// A new event: its name (client-go's `GenerateEventName`: the object's name and the time
/// in hex nanoseconds) and body.
fn event(
    regarding: &Regarding,
    (reason, note): &(Reason, String),
    r: &Recorded,
    series: Option<Value>,
    instance: &str,
) -> (String, Value) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let suffix = format!(".{nanos:x}");
    // A name is at most 253 characters.
    let stem = cut_plain(&regarding.name, 253 - suffix.len());
    let name = format!("{stem}{suffix}");
    let mut event = json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": regarding.namespace},
        "eventTime": micro_time(r.first),
        "reportingController": CONTROLLER,
        "reportingInstance": instance,
        "action": ACTION,
        "reason": reason.word(),
        "type": reason.kind(),
        "regarding": {
            "apiVersion": "v1",
            "kind": regarding.kind.kind(),
            "namespace": regarding.namespace,
            "name": regarding.name,
            "uid": regarding.uid,
            "resourceVersion": regarding.resource_version,
        },
        "note": note,
    });
    if let Some(s) = series {
        event["series"] = s;
    }
    (name, event)
}

/// `text`'s first `max` bytes (names are ASCII).
fn cut_plain(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A `MicroTime`: RFC 3339 with microseconds, UTC.
pub fn micro_time(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

/// The apiserver, through cmpoll's client.
pub struct KubeApi(pub kube::Client);

impl KubeApi {
    fn call(&mut self, method: Method, path: &str, action: &str) -> Result<(), Failure> {
        match self.0.request(method, path, "application/json", action) {
            Ok(mut body) => {
                // Drained so the connection is reused; the answer is the event itself.
                let _ = std::io::copy(&mut (&mut body).take(1 << 20), &mut std::io::sink());
                Ok(())
            }
            Err(kube::Error::Api { code: 404, .. }) => Err(Failure::NotFound),
            Err(e) => Err(Failure::Other(e.to_string())),
        }
    }
}

impl Api for KubeApi {
    fn create(&mut self, namespace: &str, event: &Value) -> Result<(), Failure> {
        let path = format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events");
        let body = Method::Post {
            content_type: "application/json",
            body: event.to_string().into_bytes(),
        };
        self.call(body, &path, "record an event")
    }

    fn patch(&mut self, namespace: &str, name: &str, patch: &Value) -> Result<(), Failure> {
        let path = format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}");
        let body = Method::Patch {
            content_type: "application/strategic-merge-patch+json",
            body: patch.to_string().into_bytes(),
        };
        self.call(body, &path, "update an event's series")
    }
}

enum Msg {
    Occurrence(Box<Occurrence>),
    /// Send everything pending before this instant, then stop.
    Finish(Instant),
}

/// The handle the loop holds: occurrences go to the recording thread, never waited for.
pub struct Reporter {
    tx: SyncSender<Msg>,
    thread: Option<JoinHandle<()>>,
    results: Results,
}

impl Reporter {
    /// Starts the recording thread over `api`.
    pub fn start<A: Api + Send + 'static>(
        api: A,
        instance: String,
        results: Results,
    ) -> Result<Reporter, String> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let recorder = Recorder::new(api, instance, results.clone());
        let thread = std::thread::Builder::new()
            .name("events".into())
            .spawn(move || record(recorder, rx))
            .map_err(|e| format!("--report-events: cannot start its thread: {e}"))?;
        Ok(Reporter {
            tx,
            thread: Some(thread),
            results,
        })
    }

    /// Hands `o` to the thread; a full queue drops it (logged and counted).
    pub fn report(&self, o: Occurrence) {
        match self.tx.try_send(Msg::Occurrence(Box::new(o))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.results.record("error");
                log::warn!("--report-events: {QUEUE} events waiting; dropping one");
            }
            Err(TrySendError::Disconnected(_)) => self.results.record("error"),
        }
    }

    /// At a stop: what is pending is sent (rate limit or not) for at most `within`.
    pub fn finish(&mut self, within: Duration) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + within;
        if self.tx.send(Msg::Finish(deadline)).is_err() {
            return;
        }
        // The thread stops at the deadline, but a call in flight has its own timeout:
        // not waited for past the deadline.
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.finish(Duration::from_secs(2));
    }
}

fn record<A: Api>(mut recorder: Recorder<A>, rx: Receiver<Msg>) {
    let mut next: Option<Instant> = None;
    loop {
        let wait = next.map_or(MIN_GAP, |n| n.saturating_duration_since(Instant::now()));
        match rx.recv_timeout(wait) {
            Ok(Msg::Occurrence(o)) => recorder.occur(*o, Instant::now()),
            Ok(Msg::Finish(deadline)) => {
                while let Ok(Msg::Occurrence(o)) = rx.try_recv() {
                    recorder.occur(*o, Instant::now());
                }
                if Instant::now() < deadline {
                    recorder.send_due(Instant::now(), true);
                }
                return;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        next = recorder.send_due(Instant::now(), false);
    }
}

/// `reportingInstance`: `POD_NAME`, else the host name (at most 128 characters).
pub fn instance(env: &dyn Fn(&str) -> Option<String>) -> String {
    let name = env("POD_NAME")
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .or_else(|| env("HOSTNAME"))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "cmpoll".into());
    cut_plain(&name, 128).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Records the calls; fails the ones it is told to.
    #[derive(Clone, Default)]
    struct Fake {
        calls: Arc<Mutex<Vec<(String, Value)>>>,
        fail: Arc<Mutex<Vec<&'static str>>>,
    }

    impl Fake {
        fn next_result(&self) -> Result<(), Failure> {
            let mut f = self.fail.lock().unwrap();
            if f.is_empty() {
                return Ok(());
            }
            match f.remove(0) {
                "404" => Err(Failure::NotFound),
                "ok" => Ok(()),
                m => Err(Failure::Other(m.into())),
            }
        }
        fn calls(&self) -> Vec<(String, Value)> {
            std::mem::take(&mut self.calls.lock().unwrap())
        }
    }

    impl Api for Fake {
        fn create(&mut self, ns: &str, event: &Value) -> Result<(), Failure> {
            self.calls
                .lock()
                .unwrap()
                .push((format!("create {ns}"), event.clone()));
            self.next_result()
        }
        fn patch(&mut self, ns: &str, name: &str, patch: &Value) -> Result<(), Failure> {
            self.calls
                .lock()
                .unwrap()
                .push((format!("patch {ns}/{name}"), patch.clone()));
            self.next_result()
        }
    }

    fn web(uid: &str) -> Regarding {
        Regarding {
            kind: Resource::ConfigMaps,
            namespace: "team".into(),
            name: "web".into(),
            uid: uid.into(),
            resource_version: "7".into(),
        }
    }

    fn occ(reason: Reason, note: &str) -> Occurrence {
        Occurrence {
            object: web("u1"),
            reason,
            note: note.into(),
            at: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        }
    }

    #[test]
    fn a_first_occurrence_is_created_as_client_go_creates_it() {
        let fake = Fake::default();
        let mut r = Recorder::new(fake.clone(), "pod-1".into(), Results::default());
        let t0 = Instant::now();
        r.occur(
            occ(
                Reason::Rejected,
                "bad rule\n(validator exited with status 1)",
            ),
            t0,
        );
        assert_eq!(r.send_due(t0, false), None);
        let calls = fake.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].0, "create team");
        let e = &calls[0].1;
        let name = e["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("web.") && name.len() > 10, "{name}");
        let mut e = e.clone();
        e["metadata"]["name"] = "NAME".into();
        assert_eq!(
            e,
            json!({
                "apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "NAME", "namespace": "team"},
                "eventTime": "2027-01-15T08:00:00.000000Z",
                "reportingController": "cmpoll.io/cmpoll", "reportingInstance": "pod-1",
                "action": "Deliver", "reason": "Rejected", "type": "Warning",
                "regarding": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "team",
                              "name": "web", "uid": "u1", "resourceVersion": "7"},
                "note": "bad rule\n(validator exited with status 1)"
            })
        );
    }

    #[test]
    fn repeats_count_in_the_series_at_most_one_call_a_minute() {
        let fake = Fake::default();
        let mut r = Recorder::new(fake.clone(), "i".into(), Results::default());
        let t0 = Instant::now();
        r.occur(occ(Reason::Rejected, "bad"), t0);
        r.send_due(t0, false);
        let name = fake.calls()[0].1["metadata"]["name"].clone();
        // Two repeats within the minute: nothing sent, one call due at the minute.
        r.occur(occ(Reason::Rejected, "bad"), t0 + Duration::from_secs(5));
        assert_eq!(
            r.send_due(t0 + Duration::from_secs(5), false),
            Some(t0 + MIN_GAP)
        );
        r.occur(occ(Reason::Rejected, "bad"), t0 + Duration::from_secs(9));
        r.send_due(t0 + Duration::from_secs(9), false);
        assert!(fake.calls().is_empty(), "the minute has not passed");
        r.send_due(t0 + MIN_GAP, false);
        let calls = fake.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].0, format!("patch team/{}", name.as_str().unwrap()));
        assert_eq!(
            calls[0].1,
            json!({"series": {"count": 3, "lastObservedTime": "2027-01-15T08:00:00.000000Z"}})
        );
        // Nothing pending: nothing more.
        assert_eq!(r.send_due(t0 + MIN_GAP * 3, false), None);
        assert!(fake.calls().is_empty());
    }

    #[test]
    fn another_note_is_another_event_and_the_latest_wins_the_slot() {
        let fake = Fake::default();
        let mut r = Recorder::new(fake.clone(), "i".into(), Results::default());
        let t0 = Instant::now();
        r.occur(occ(Reason::Rejected, "bad 1"), t0);
        r.send_due(t0, false);
        fake.calls();
        let t1 = t0 + Duration::from_secs(10);
        r.occur(occ(Reason::Rejected, "bad 2"), t1);
        r.occur(occ(Reason::Accepted, "delivered"), t1);
        r.send_due(t1, false);
        r.send_due(t0 + MIN_GAP, false);
        let calls = fake.calls();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].1["reason"], "Accepted");
        assert_eq!(calls[0].1["type"], "Normal");
        assert!(calls[0].1.get("series").is_none());
    }

    #[test]
    fn an_expired_event_is_created_again_with_its_series() {
        let fake = Fake::default();
        let mut r = Recorder::new(fake.clone(), "i".into(), Results::default());
        let t0 = Instant::now();
        r.occur(occ(Reason::Rejected, "bad"), t0);
        r.send_due(t0, false);
        fake.calls();
        r.occur(occ(Reason::Rejected, "bad"), t0 + MIN_GAP);
        fake.fail.lock().unwrap().extend(["404", "ok"]);
        r.send_due(t0 + MIN_GAP, false);
        let calls = fake.calls();
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert!(calls[0].0.starts_with("patch team/web."));
        assert_eq!(calls[1].0, "create team");
        assert_eq!(calls[1].1["series"]["count"], 2);
    }

    #[test]
    fn failures_are_counted_retried_at_the_next_slot_then_dropped() {
        let fake = Fake::default();
        let results = Results::default();
        let mut r = Recorder::new(fake.clone(), "i".into(), results.clone());
        let t0 = Instant::now();
        fake.fail
            .lock()
            .unwrap()
            .extend(["forbidden"; TRIES as usize]);
        r.occur(occ(Reason::WriteFailed, "no room"), t0);
        let mut t = t0;
        for _ in 0..TRIES {
            r.send_due(t, false);
            t += MIN_GAP;
        }
        assert_eq!(fake.calls().len(), TRIES as usize);
        assert_eq!(r.send_due(t, false), None, "given up");
        assert!(fake.calls().is_empty());
        assert_eq!(results.get("error"), TRIES as u64);
        assert_eq!(results.get("ok"), 0);
    }

    #[test]
    fn an_event_not_seen_for_six_minutes_is_forgotten() {
        let fake = Fake::default();
        let mut r = Recorder::new(fake.clone(), "i".into(), Results::default());
        let t0 = Instant::now();
        r.occur(occ(Reason::Rejected, "bad"), t0);
        r.send_due(t0, false);
        r.send_due(t0 + FINISH, false);
        assert!(r.objects.is_empty());
        r.occur(occ(Reason::Rejected, "bad"), t0 + FINISH);
        r.send_due(t0 + FINISH, false);
        let calls = fake.calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].0, "create team", "a new event, no series");
        assert!(calls[1].1.get("series").is_none());
    }

    #[test]
    fn a_note_is_cut_to_the_apiservers_limit_on_a_character_boundary() {
        let fake = Fake::default();
        let mut r = Recorder::new(fake.clone(), "i".into(), Results::default());
        let t0 = Instant::now();
        r.occur(occ(Reason::Rejected, &"é".repeat(1000)), t0);
        r.send_due(t0, false);
        let note = fake.calls()[0].1["note"].as_str().unwrap().to_string();
        assert!(
            note.len() <= MAX_NOTE && note.len() > 1000,
            "{}",
            note.len()
        );
    }

    #[test]
    fn a_secrets_note_keeps_only_the_exit_status() {
        for (reason, want) in [
            (
                "password=hunter2 is wrong\n(validator exited with status 1)",
                "validator exited with status 1",
            ),
            (
                "line\n(validator killed after --validate-timeout 8s)",
                "validator killed after --validate-timeout 8s",
            ),
            (
                "validator exited with status 3",
                "validator exited with status 3",
            ),
            (
                "key 'a.json' is already published by team/other",
                "key 'a.json' is already published by team/other",
            ),
            (
                "validator cannot run: it exited with status 127: sh: x: not found",
                "validator cannot run: it exited with status 127",
            ),
            (
                "secret stuff\nmore",
                "rejected by --validate (a Secret's validator output is not shown)",
            ),
        ] {
            assert_eq!(crate::reason::redacted(reason), want, "{reason}");
        }
    }
}
