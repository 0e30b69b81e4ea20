//! What a running daemon holds, and why: the last poll, each sink's last delivery and
//! reload, every module of the last complete poll with its state (`delivered`, `rejected`
//! with the reason, `unwritten` with the error). The loop and the batch write it; `/status`
//! renders it as a `Report`, the JSON shape `cmpoll status` reads back (from a daemon, or
//! made from an output folder's own record).
//!
//! It guarantees that a Secret's validator output never appears: a Secret's rejection is
//! recorded with `reason::redacted` already applied. It holds per module only what the
//! snapshot holds (56 bytes and the id), replaced at each poll.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::ops::health::{Health, ReloadOutcomes};
use crate::poll::hash::Hash;
use crate::poll::snapshot::{Modules, Rv};
use crate::source::Resources;

/// What `/status` reads, shared by the loop, the batch and the server.
#[derive(Debug)]
pub struct Ledger {
    source: String,
    selector: String,
    interval: Duration,
    /// What is listed: the kind of a module whose id does not name one.
    resources: Resources,
    last_poll: Option<PollRecord>,
    last_success: Option<SystemTime>,
    sinks: Vec<SinkRecord>,
    /// The last complete poll's modules (the cluster's content), `None` before one.
    modules: Option<Modules>,
    /// Held back: the reason (a Secret's: its exit status only).
    rejected: BTreeMap<String, String>,
    /// A sink could not write them in the last batch: the hash and resourceVersion
    /// attempted (for a removal, the ones removed), and the error.
    unwritten: BTreeMap<String, (Option<(Hash, Rv)>, String)>,
    /// Every reload path's last outcome (readiness reads the same).
    pub reloads: ReloadOutcomes,
}

#[derive(Clone, Debug)]
struct PollRecord {
    number: u64,
    at: SystemTime,
    took: Duration,
    error: Option<String>,
}

#[derive(Clone, Debug)]
struct SinkRecord {
    name: String,
    delivered: Option<(SystemTime, u64, usize, usize)>,
}

impl Ledger {
    pub fn new(
        source: String,
        selector: String,
        interval: Duration,
        resources: Resources,
        reloads: ReloadOutcomes,
    ) -> Ledger {
        Ledger {
            source,
            selector,
            interval,
            resources,
            last_poll: None,
            last_success: None,
            sinks: Vec::new(),
            modules: None,
            rejected: BTreeMap::new(),
            unwritten: BTreeMap::new(),
            reloads,
        }
    }

    /// The sinks, in order, by the names `Sink::name` gives.
    pub fn sinks(&mut self, names: Vec<String>) {
        self.sinks = (names.into_iter())
            .map(|name| SinkRecord {
                name,
                delivered: None,
            })
            .collect();
    }

    /// A poll ended: with an error, or with a snapshot (`modules`).
    pub fn polled(&mut self, number: u64, took: Duration, outcome: Result<(), String>) {
        let at = SystemTime::now();
        if outcome.is_ok() {
            self.last_success = Some(at);
        }
        self.last_poll = Some(PollRecord {
            number,
            at,
            took,
            error: outcome.err(),
        });
    }

    /// Sink `index` took the batch of poll `poll`: `changes` events, `unwritten` of them
    /// not written.
    pub fn delivered(&mut self, index: usize, poll: u64, changes: usize, unwritten: usize) {
        if let Some(s) = self.sinks.get_mut(index) {
            s.delivered = Some((SystemTime::now(), poll, changes, unwritten));
        }
    }

    /// The modules of a complete poll, what is held back and why, and what a sink could
    /// not write (empty when no batch went out: nothing is waiting to be written then).
    pub fn modules(
        &mut self,
        modules: Modules,
        rejected: BTreeMap<String, String>,
        unwritten: BTreeMap<String, (Option<(Hash, Rv)>, String)>,
    ) {
        self.modules = Some(modules);
        self.rejected = (rejected.into_iter())
            .map(|(id, why)| {
                let why = match self.kind_of(&id) {
                    "Secret" => crate::reason::redacted(&why),
                    _ => why,
                };
                (id, why)
            })
            .collect();
        self.unwritten = unwritten;
    }

    /// `ConfigMap` or `Secret`: from the id when one cmpoll lists both kinds.
    fn kind_of(&self, id: &str) -> &'static str {
        self.resources.kind_of(id).kind()
    }

    /// The report, with readiness from `health`.
    pub fn report(&self, health: &Health) -> Report {
        let readiness = health.readiness(std::time::Instant::now());
        let mut modules = Vec::new();
        let row = |id: &str, hv: Option<(Hash, Rv)>| ModuleRow {
            module: id.to_string(),
            kind: self.kind_of(id).to_string(),
            hash: hv.map(|(h, _)| h.to_string()).unwrap_or_default(),
            resource_version: hv.and_then(|(_, rv)| rv.number()).map(|n| n.to_string()),
            state: State::Delivered,
            reason: None,
            error: None,
        };
        for (id, e) in self.modules.iter().flat_map(|m| m.iter()) {
            let mut r = row(id, Some((e.hash, e.resource_version)));
            if let Some(why) = self.rejected.get(id) {
                r.state = State::Rejected;
                r.reason = Some(why.clone());
            } else if let Some((_, err)) = self.unwritten.get(id) {
                r.state = State::Unwritten;
                r.error = Some(err.clone());
            }
            modules.push(r);
        }
        // A removal that could not be made: the module is gone from the cluster, not yet
        // from the sink.
        for (id, (hv, err)) in &self.unwritten {
            if !self.modules.as_ref().is_some_and(|m| m.contains_key(id)) {
                let mut r = row(id, *hv);
                r.state = State::Unwritten;
                r.error = Some(format!("removing: {err}"));
                modules.push(r);
            }
        }
        modules.sort_by(|a, b| a.module.cmp(&b.module));
        let reloads = self.reloads.all();
        let sinks = (self.sinks.iter())
            .map(|s| SinkRow {
                sink: s.name.clone(),
                last_delivery: s.delivered.map(|(at, poll, changes, unwritten)| Delivery {
                    time: rfc3339(at),
                    poll,
                    changes,
                    unwritten,
                }),
                reloads: (reloads.iter())
                    .filter(|(path, _, _)| reload_owner(path) == s.name)
                    .map(|(path, outcome, at)| Reload {
                        path: path.clone(),
                        time: rfc3339(*at),
                        result: if outcome.is_ok() { "ok" } else { "error" }.into(),
                        error: outcome.clone().err(),
                    })
                    .collect(),
            })
            .collect();
        Report {
            version: env!("CARGO_PKG_VERSION").into(),
            source: self.source.clone(),
            selector: self.selector.clone(),
            interval: Some(humantime::format_duration(self.interval).to_string()),
            ready: readiness.is_ok(),
            not_ready: readiness.err(),
            last_poll: self.last_poll.as_ref().map(|p| LastPoll {
                number: p.number,
                time: rfc3339(p.at),
                result: if p.error.is_none() { "ok" } else { "error" }.into(),
                duration_seconds: p.took.as_secs_f64(),
                error: p.error.clone(),
            }),
            last_success: self.last_success.map(rfc3339),
            sinks,
            modules,
        }
    }
}

/// The sink a reload path belongs to (the paths `ReloadReport::report` is given).
fn reload_owner(path: &str) -> &'static str {
    match path {
        "signal" => "agent",
        "--on-change" => "on-change",
        _ => "reload-url",
    }
}

/// `2026-12-02T11:41:11Z`.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `/status`: what `cmpoll status` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub version: String,
    pub source: String,
    pub selector: String,
    /// `None` where no daemon answered (read from a folder).
    pub interval: Option<String>,
    /// `/readyz`'s verdict (a folder's record: whether nothing is wrong in it).
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready: Option<String>,
    pub last_poll: Option<LastPoll>,
    pub last_success: Option<String>,
    pub sinks: Vec<SinkRow>,
    pub modules: Vec<ModuleRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastPoll {
    pub number: u64,
    pub time: String,
    /// `ok` or `error`.
    pub result: String,
    pub duration_seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SinkRow {
    /// `out-dir`, `agent`, `on-change`, `reload-url` or `stdout`.
    pub sink: String,
    pub last_delivery: Option<Delivery>,
    pub reloads: Vec<Reload>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    pub time: String,
    pub poll: u64,
    /// Events in the batch (added, updated, removed, rejected).
    pub changes: usize,
    /// Modules of the batch this sink could not write.
    pub unwritten: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reload {
    /// `signal`, `--on-change`, or the reload URL (credentials removed).
    pub path: String,
    pub time: String,
    /// `ok` or `error`.
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Delivered,
    Rejected,
    Unwritten,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModuleRow {
    pub module: String,
    /// `ConfigMap` or `Secret`.
    pub kind: String,
    pub hash: String,
    /// `None` where the object had none cmpoll can show (a made-up one in a manifest).
    pub resource_version: Option<String>,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Report {
    /// What is wrong, one line each; empty: healthy (exit 0).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(why) = &self.not_ready {
            out.push(format!("not ready: {why}"));
        }
        match &self.last_poll {
            Some(p) if p.result != "ok" => out.push(format!(
                "poll {} failed: {}",
                p.number,
                p.error.as_deref().unwrap_or("no error recorded")
            )),
            None if self.interval.is_some() => out.push("no poll has finished yet".into()),
            _ => {}
        }
        for s in &self.sinks {
            for r in s.reloads.iter().filter(|r| r.result != "ok") {
                out.push(format!(
                    "reload {} failed: {}",
                    r.path,
                    r.error.as_deref().unwrap_or("no error recorded")
                ));
            }
        }
        for m in &self.modules {
            match m.state {
                State::Delivered => {}
                State::Rejected => out.push(format!(
                    "{} rejected: {}",
                    m.module,
                    first_line(m.reason.as_deref().unwrap_or(""))
                )),
                State::Unwritten => out.push(format!(
                    "{} not written: {}",
                    m.module,
                    first_line(m.error.as_deref().unwrap_or(""))
                )),
            }
        }
        out
    }

    /// The kubectl-like table `cmpoll status` prints.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out += &format!("cmpoll {}: {}\n", self.version, self.source);
        out += &format!("selector: {}", self.selector);
        if let Some(i) = &self.interval {
            out += &format!(", every {i}");
        }
        out += "\n";
        match &self.last_poll {
            Some(p) => {
                out += &format!(
                    "last poll: #{} at {}, {} in {:.3}s",
                    p.number, p.time, p.result, p.duration_seconds
                );
                if let Some(e) = &p.error {
                    out += &format!(": {e}");
                }
                out += "\n";
            }
            None if self.interval.is_some() => out += "last poll: none finished yet\n",
            None => {}
        }
        if let Some(t) = &self.last_success {
            out += &format!("last successful poll: {t}\n");
        }
        out += &format!(
            "ready: {}\n",
            match &self.not_ready {
                None if self.ready => "yes".to_string(),
                None => "no".to_string(),
                Some(why) => format!("no ({why})"),
            }
        );
        if !self.sinks.is_empty() {
            out += "\n";
            let mut rows = vec![[
                "SINK".to_string(),
                "LAST DELIVERY".into(),
                "POLL".into(),
                "CHANGES".into(),
                "RELOAD".into(),
            ]];
            for s in &self.sinks {
                let (time, poll, changes) = match &s.last_delivery {
                    Some(d) => (
                        d.time.clone(),
                        d.poll.to_string(),
                        match d.unwritten {
                            0 => d.changes.to_string(),
                            n => format!("{} ({n} not written)", d.changes),
                        },
                    ),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                let reload = match s.reloads.as_slice() {
                    [] => "-".to_string(),
                    all => (all.iter())
                        .map(|r| match &r.error {
                            None => format!("{} ok", r.path),
                            Some(e) => format!("{} failed: {}", r.path, first_line(e)),
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                };
                rows.push([s.sink.clone(), time, poll, changes, reload]);
            }
            out += &columns(&rows);
        }
        out += "\n";
        let mut rows = vec![[
            "MODULE".to_string(),
            "KIND".into(),
            "STATE".into(),
            "HASH".into(),
            "RESOURCEVERSION".into(),
            "WHY".into(),
        ]];
        for m in &self.modules {
            let state = match m.state {
                State::Delivered => "delivered",
                State::Rejected => "rejected",
                State::Unwritten => "unwritten",
            };
            let why = m.reason.as_deref().or(m.error.as_deref()).unwrap_or("");
            let hash = match m.hash.get(..19) {
                Some(h) => h.to_string(),
                None => m.hash.clone(),
            };
            rows.push([
                m.module.clone(),
                match m.kind.as_str() {
                    "" => "-".to_string(),
                    k => k.to_string(),
                },
                state.into(),
                hash,
                m.resource_version.clone().unwrap_or_else(|| "-".into()),
                first_line(why).to_string(),
            ]);
        }
        if self.modules.is_empty() {
            out += "no modules\n";
        } else {
            out += &columns(&rows);
        }
        out
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// Left-aligned columns three spaces apart, as kubectl prints them.
fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut width = [0usize; N];
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 < N {
                line += &format!("{c:<w$}   ", w = width[i]);
            } else {
                line += c;
            }
        }
        out += line.trim_end();
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::health::InFlight;
    use crate::poll::snapshot::Entry;
    use crate::poll::spool::Loc;
    use crate::source::Resource;

    fn ledger() -> (Ledger, Health) {
        let health = Health::new(
            Duration::from_secs(30),
            Duration::from_secs(300),
            Duration::from_secs(10),
            InFlight::default(),
        );
        let l = Ledger::new(
            "apiserver https://k:6443".into(),
            "cmpoll.io/module=true".into(),
            Duration::from_secs(30),
            Resources::one(Resource::ConfigMaps),
            health.reloads.clone(),
        );
        (l, health)
    }

    fn entry(n: u8, rv: &str) -> Entry {
        Entry {
            hash: Hash([n; 32]),
            loc: Loc::default(),
            resource_version: Rv::new(rv),
        }
    }

    #[test]
    fn every_module_with_its_state_and_what_is_wrong() {
        let (mut l, mut health) = ledger();
        let r = l.report(&health);
        assert_eq!(
            r.problems()[..2],
            [
                "not ready: no complete poll yet".to_string(),
                "no poll has finished yet".into()
            ]
        );
        l.sinks(vec!["out-dir".into(), "reload-url".into()]);
        let mut m = Modules::default();
        m.push_unsorted("ns/a", entry(1, "10"));
        m.push_unsorted("ns/b", entry(2, "11"));
        m.push_unsorted("ns/c", entry(3, "made-up"));
        m.sort();
        let rejected = BTreeMap::from([("ns/b".to_string(), "bad\nmore".to_string())]);
        let unwritten = BTreeMap::from([
            ("ns/c".to_string(), (None, "ENOSPC".to_string())),
            (
                "ns/gone".to_string(),
                (Some((Hash([9; 32]), Rv::new("7"))), "EACCES".to_string()),
            ),
        ]);
        l.modules(m, rejected, unwritten);
        l.polled(3, Duration::from_millis(20), Ok(()));
        l.delivered(0, 3, 4, 1);
        health.first_batch = true;
        health.last_success = Some(std::time::Instant::now());
        health.reloads.report(
            "http://agent/-/reload",
            Err("503 Service Unavailable".into()),
        );
        let r = l.report(&health);
        let states: Vec<(&str, State, Option<&str>)> = (r.modules.iter())
            .map(|m| (m.module.as_str(), m.state, m.resource_version.as_deref()))
            .collect();
        assert_eq!(
            states,
            [
                ("ns/a", State::Delivered, Some("10")),
                ("ns/b", State::Rejected, Some("11")),
                ("ns/c", State::Unwritten, None),
                ("ns/gone", State::Unwritten, Some("7")),
            ]
        );
        assert_eq!(r.sinks[1].reloads[0].result, "error");
        assert_eq!(r.sinks[0].last_delivery.as_ref().unwrap().unwritten, 1);
        assert_eq!(
            r.problems(),
            [
                "not ready: the last reload failed: 503 Service Unavailable",
                "reload http://agent/-/reload failed: 503 Service Unavailable",
                "ns/b rejected: bad",
                "ns/c not written: ENOSPC",
                "ns/gone not written: removing: EACCES",
            ]
        );
        let table = r.table();
        assert!(table.contains("reload-url   -"), "{table}");
        assert!(
            table.contains(
                "ns/b      ConfigMap   rejected    sha256:020202020202   11                bad"
            ),
            "{table}"
        );
        // The JSON reads back as it was written.
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&json).unwrap(), r);
        assert!(json.contains(r#""state":"unwritten""#), "{json}");
    }

    #[test]
    fn kinds_come_from_the_id_when_both_are_listed() {
        let (mut l, health) = ledger();
        let mut m = Modules::default();
        m.push_unsorted("secret/ns/a", entry(1, "1"));
        m.push_unsorted("configmap/ns/a", entry(1, "2"));
        m.push_unsorted("ns/b", entry(1, "3"));
        m.sort();
        l.modules(m, BTreeMap::new(), BTreeMap::new());
        let kinds: Vec<String> = l
            .report(&health)
            .modules
            .into_iter()
            .map(|m| m.kind)
            .collect();
        assert_eq!(kinds, ["ConfigMap", "ConfigMap", "Secret"]);
    }

    /// A Secret's validator output never reaches `/status`: only the exit status.
    #[test]
    fn a_secrets_rejection_shows_the_exit_status_only() {
        let (mut l, health) = ledger();
        let mut m = Modules::default();
        m.push_unsorted("secret/ns/a", entry(1, "1"));
        m.push_unsorted("configmap/ns/a", entry(1, "2"));
        m.sort();
        let output = "password=hunter2 is too short\n(validator exited with status 1)";
        let rejected = BTreeMap::from([
            ("secret/ns/a".to_string(), output.to_string()),
            ("configmap/ns/a".to_string(), output.to_string()),
        ]);
        l.modules(m, rejected, BTreeMap::new());
        let r = l.report(&health);
        assert_eq!(r.modules[0].reason.as_deref(), Some(output));
        assert_eq!(
            r.modules[1].reason.as_deref(),
            Some("validator exited with status 1")
        );
        assert!(
            !serde_json::to_string(&r.modules[1])
                .unwrap()
                .contains("hunter2")
        );
    }
}
