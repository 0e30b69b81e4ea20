//! Telling app teams, at the hub: **one Event per object and version per hub**, on the
//! object (`involvedObject` the ConfigMap or Secret), updated as what there is to tell
//! changes — the hub's `--validate` refused the version, or followers refused it ("refused
//! by 2 of 1,000 followers: node-7: …") — never one per follower.
//!
//! The Events are core `v1` Events (what `kubectl get events` and `kubectl describe` show),
//! because their `message` and `count` may be updated; an `events.k8s.io/v1` Event's note
//! may not (its update validation holds `note` immutable). Each is named from the object,
//! the version's hash, and the hub with the object's kind (`NAME.HASH16.HUB8`), so that a
//! restarted hub updates its
//! own Event instead of making another, and two hubs behind one Service write one each.
//! Written by a thread of its own, never waited for by the poll: each poll hands it what
//! there is to tell now (`tell`, the newest replacing the older); an Event is written when
//! its words change, at most once per `gap` (the hub's interval, at least `MIN_GAP`), a
//! failure logged at warning once per Event and tried again at its next slot. Needs
//! `create` and `patch` on `events` (core group) where the objects are.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::kube;
use crate::kube::client::Method;
use crate::locks::Recover;
use crate::ops::metrics::Results;
use crate::poll::hash::Hash;
use crate::reason::cut;
use crate::report::{MAX_NOTE, Regarding};
use crate::source::Resource;

/// The least time between two writes of one Event.
pub const MIN_GAP: Duration = Duration::from_secs(10);

/// The `source.component` and `reportingComponent` of every Event.
pub const COMPONENT: &str = "cmpoll.io/cmpoll";

/// What there is to tell about one version of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub regarding: Regarding,
    /// The version.
    pub hash: Hash,
    /// `Refused`: a Warning.
    pub reason: &'static str,
    /// Cut to the apiserver's 1 KiB when written.
    pub message: String,
    /// How many refused it (the hub's refusal counts one).
    pub count: u32,
}

impl Notice {
    fn key(&self) -> (Resource, String, String, Hash) {
        let r = &self.regarding;
        (r.kind, r.namespace.clone(), r.name.clone(), self.hash)
    }
}

/// The apiserver calls the writer makes (a seam for tests).
pub trait EventApi {
    /// POSTs `event` into `namespace`; `Ok(false)`: it exists already (409).
    fn create(&mut self, namespace: &str, event: &Value) -> Result<bool, String>;
    /// Merge-patches Event `name`; `Ok(false)`: it is not there (404).
    fn patch(&mut self, namespace: &str, name: &str, patch: &Value) -> Result<bool, String>;
}

/// One Event as written.
#[derive(Debug)]
struct Written {
    name: String,
    /// It was created (or found made): updates patch it first.
    made: bool,
    message: String,
    count: u32,
    first: SystemTime,
    at: Option<Instant>,
    /// A failure was logged since the last success.
    failed: bool,
}

/// The Events of one hub.
pub struct Writer<A: EventApi> {
    api: A,
    instance: String,
    gap: Duration,
    written: HashMap<(Resource, String, String, Hash), Written>,
    results: Results,
}

impl<A: EventApi> Writer<A> {
    pub fn new(api: A, instance: String, gap: Duration, results: Results) -> Writer<A> {
        Writer {
            api,
            instance,
            gap: gap.max(MIN_GAP),
            written: HashMap::new(),
            results,
        }
    }

    /// Writes what `now` lets of `notices` (all there is to tell); when to come back.
    pub fn write(&mut self, notices: &[Notice], now: Instant) -> Option<Instant> {
        let keys: HashSet<_> = notices.iter().map(Notice::key).collect();
        // A version with nothing more to tell (gone, or the object deleted) is forgotten:
        // its Event stays until the apiserver's TTL ends it.
        self.written.retain(|k, _| keys.contains(k));
        let mut next: Option<Instant> = None;
        for n in notices {
            let message = cut(&n.message, MAX_NOTE).into_owned();
            let name = event_name(n, &self.instance);
            let w = self.written.entry(n.key()).or_insert_with(|| Written {
                name,
                made: false,
                message: String::new(),
                count: 0,
                first: SystemTime::now(),
                at: None,
                failed: false,
            });
            if w.message == message && w.count == n.count {
                continue;
            }
            if let Some(due) = w.at.map(|t| t + self.gap).filter(|due| *due > now) {
                next = Some(next.map_or(due, |n: Instant| n.min(due)));
                continue;
            }
            w.at = Some(now);
            let event = body(n, w, &message, &self.instance);
            let done = put(
                &mut self.api,
                &n.regarding.namespace,
                &w.name,
                &event,
                w.made,
            );
            match done {
                Ok(()) => {
                    w.made = true;
                    self.results.record("ok");
                    (w.message, w.count, w.failed) = (message, n.count, false);
                }
                Err(e) => {
                    self.results.record("error");
                    if !w.failed {
                        log::warn!(
                            "cannot record event {} on {} {}/{}: {e}; trying again in {}",
                            n.reason,
                            n.regarding.kind.singular(),
                            n.regarding.namespace,
                            n.regarding.name,
                            humantime::format_duration(self.gap)
                        );
                    }
                    w.failed = true;
                    let due = now + self.gap;
                    next = Some(next.map_or(due, |n: Instant| n.min(due)));
                }
            }
        }
        next
    }
}

/// Creates the Event, or updates it when it exists (`made`: this writer made it; else a
/// restarted hub's, or one made before this writer knew it): one call when it can.
fn put<A: EventApi>(
    api: &mut A,
    ns: &str,
    name: &str,
    event: &Value,
    made: bool,
) -> Result<(), String> {
    let patch = json!({
        "message": event["message"],
        "count": event["count"],
        "lastTimestamp": event["lastTimestamp"],
        "involvedObject": event["involvedObject"],
    });
    let done = match made {
        true => api.patch(ns, name, &patch)? || api.create(ns, event)?,
        false => api.create(ns, event)? || api.patch(ns, name, &patch)?,
    };
    if done {
        return Ok(());
    }
    // Deleted between the two: made again.
    match api.create(ns, event)? {
        true => Ok(()),
        false => Err("it exists and cannot be found".into()),
    }
}

/// `OBJECT.HASH16.HUB8`: the object's name (cut so that the whole fits 253 characters),
/// the version's first 16 hex digits, the hub's instance hashed.
fn event_name(n: &Notice, instance: &str) -> String {
    let hash = n.hash.to_string();
    // The hub and the object's kind (a ConfigMap and a Secret of one name and content
    // are two Events).
    let who = format!("{}/{instance}", n.regarding.kind.singular());
    let hub: String = Sha256::digest(who.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let suffix = format!(".{}.{hub}", &hash["sha256:".len()..][..16]);
    let mut end = n.regarding.name.len().min(253 - suffix.len());
    while !n.regarding.name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", n.regarding.name[..end].trim_end_matches('.'))
}

fn body(n: &Notice, w: &Written, message: &str, instance: &str) -> Value {
    let r = &n.regarding;
    let time = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": w.name, "namespace": r.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": r.kind.kind(),
            "namespace": r.namespace,
            "name": r.name,
            "uid": r.uid,
            "resourceVersion": r.resource_version,
        },
        "reason": n.reason,
        "message": message,
        "type": "Warning",
        "source": {"component": COMPONENT, "host": instance},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": time(w.first),
        "lastTimestamp": time(SystemTime::now()),
        "count": n.count.max(1),
    })
}

/// The apiserver, through cmpoll's client.
pub struct KubeEvents(pub kube::Client);

impl KubeEvents {
    fn call(&mut self, method: Method, path: &str, action: &str) -> Result<bool, String> {
        use std::io::Read as _;
        match self.0.request(method, path, "application/json", action) {
            Ok(mut body) => {
                let _ = std::io::copy(&mut (&mut body).take(1 << 20), &mut std::io::sink());
                Ok(true)
            }
            Err(kube::Error::Api {
                code: 404 | 409, ..
            }) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl EventApi for KubeEvents {
    fn create(&mut self, namespace: &str, event: &Value) -> Result<bool, String> {
        let body = Method::Post {
            content_type: "application/json",
            body: event.to_string().into_bytes(),
        };
        let path = format!("/api/v1/namespaces/{namespace}/events");
        self.call(body, &path, "record an event")
    }

    fn patch(&mut self, namespace: &str, name: &str, patch: &Value) -> Result<bool, String> {
        let body = Method::Patch {
            content_type: "application/merge-patch+json",
            body: patch.to_string().into_bytes(),
        };
        let path = format!("/api/v1/namespaces/{namespace}/events/{name}");
        self.call(body, &path, "update an event")
    }
}

/// The writer's thread, and what the poll hands it.
pub struct Teller {
    wanted: Arc<(Mutex<Option<Vec<Notice>>>, Condvar)>,
    /// When it was last told.
    told: Mutex<Option<Instant>>,
}

impl Teller {
    /// Starts the thread over `writer`.
    pub fn start<A: EventApi + Send + 'static>(mut writer: Writer<A>) -> Result<Teller, String> {
        let wanted: Arc<(Mutex<Option<Vec<Notice>>>, Condvar)> = Arc::default();
        let shared = wanted.clone();
        std::thread::Builder::new()
            .name("events".into())
            .spawn(move || {
                let mut notices = Vec::new();
                let mut next: Option<Instant> = None;
                loop {
                    let (lock, ready) = &*shared;
                    let mut got = lock.lock().recover();
                    let wait = next.map_or(Duration::from_secs(3600), |n| {
                        n.saturating_duration_since(Instant::now())
                    });
                    if got.is_none() {
                        got = ready.wait_timeout(got, wait).recover().0;
                    }
                    if let Some(n) = got.take() {
                        notices = n;
                    }
                    drop(got);
                    next = writer.write(&notices, Instant::now());
                }
            })
            .map_err(|e| format!("cannot start the events thread: {e}"))?;
        Ok(Teller {
            wanted,
            told: Mutex::new(None),
        })
    }

    /// Whether `every` passed since it was last told (what there is to tell is made at
    /// most that often: the fleet's view costs a read of every follower).
    pub fn due(&self, every: Duration) -> bool {
        self.told
            .lock()
            .recover()
            .is_none_or(|t| t.elapsed() >= every)
    }

    /// What there is to tell now (all of it), for the thread.
    pub fn tell(&self, notices: Vec<Notice>) {
        *self.told.lock().recover() = Some(Instant::now());
        let (lock, ready) = &*self.wanted;
        *lock.lock().recover() = Some(notices);
        ready.notify_one();
    }
}

#[cfg(test)]
mod tests;
