//! The answer of `/status` (`GET /status` on `--listen`), the JSON `cmpoll status` reads
//! back: the daemon's version, source and selector; its last poll; each sink's last
//! delivery and reloads; every module with its hash, resourceVersion and state
//! (`delivered`, `rejected` with the reason, `unwritten` with the error). Made from a
//! running daemon's ledger (`answer`) or from an output folder's own record (`mod.rs`);
//! `problems` says what is wrong, one line each.
//!
//! A daemon of 100,000 modules answers some 25 MB in full, so the answer can be asked for
//! less (`Query`, from `/status`'s query string): `?state=rejected,unwritten` (only the
//! modules in those states), `?module=NS/NAME` (only those modules; repeatable, or a comma
//! list), `?summary=true` (no module rows at all). `counts` always counts every module.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::ledger::Ledger;
use crate::ops::health::Health;
use crate::poll::hash::Hash;
use crate::poll::snapshot::Rv;

/// Which modules an answer lists (`/status`'s query string).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// Only modules in these states (empty: every state).
    pub states: Vec<State>,
    /// Only these modules (empty: every module).
    pub modules: Vec<String>,
    /// No module rows: the counts only.
    pub summary: bool,
}

impl Query {
    /// `state=rejected,unwritten&module=ns%2Fname&summary=true`; an unknown parameter or
    /// value is an error naming it.
    pub fn parse(query: &str) -> Result<Query, String> {
        let mut q = Query::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = crate::http::url::form_decoded(value)?;
            match key {
                "state" => {
                    for s in value.split(',').filter(|s| !s.is_empty()) {
                        q.states.push(State::from_word(s).ok_or_else(|| {
                            format!("state '{s}' is not delivered, rejected or unwritten")
                        })?);
                    }
                }
                "module" => (q.modules)
                    .extend((value.split(',').filter(|m| !m.is_empty())).map(str::to_string)),
                "summary" => {
                    q.summary = match value.as_str() {
                        "" | "true" | "1" => true,
                        "false" | "0" => false,
                        other => return Err(format!("summary '{other}' is not true or false")),
                    }
                }
                other => {
                    return Err(format!(
                        "'{other}' is not a parameter of /status (state, module, summary)"
                    ));
                }
            }
        }
        Ok(q)
    }

    /// The query string that asks for this.
    pub fn to_query(&self) -> String {
        let mut parts = Vec::new();
        if !self.states.is_empty() {
            let states: Vec<&str> = self.states.iter().map(|s| s.word()).collect();
            parts.push(format!("state={}", states.join(",")));
        }
        for m in &self.modules {
            parts.push(format!(
                "module={}",
                m.replace('%', "%25").replace('&', "%26")
            ));
        }
        if self.summary {
            parts.push("summary=true".into());
        }
        parts.join("&")
    }

    /// Whether a row of `module` in `state` is listed.
    pub fn lists(&self, module: &str, state: State) -> bool {
        !self.summary
            && (self.states.is_empty() || self.states.contains(&state))
            && (self.modules.is_empty() || self.modules.iter().any(|m| m == module))
    }
}

/// The answer of `/status`: what `ledger` holds, with readiness from `health`, its module
/// rows as `query` asks.
pub fn answer(ledger: &Ledger, health: &Health, query: &Query) -> StatusReport {
    let readiness = health.readiness(std::time::Instant::now());
    let mut modules = Vec::new();
    let mut counts = Counts::default();
    let row = |id: &str, hv: Option<(Hash, Rv)>| ModuleRow {
        module: id.to_string(),
        kind: ledger.kind_of(id).to_string(),
        hash: hv.map(|(h, _)| h.to_string()).unwrap_or_default(),
        resource_version: hv.and_then(|(_, rv)| rv.number()).map(|n| n.to_string()),
        state: State::Delivered,
        reason: None,
        error: None,
    };
    for (id, e) in ledger.modules.iter().flat_map(|m| m.iter()) {
        let state = if ledger.rejected.contains_key(id) {
            State::Rejected
        } else if ledger.unwritten.contains_key(id) {
            State::Unwritten
        } else {
            State::Delivered
        };
        counts.add(state);
        if !query.lists(id, state) {
            continue;
        }
        let mut r = row(id, Some((e.hash, e.resource_version)));
        r.state = state;
        match state {
            State::Rejected => r.reason = ledger.rejected.get(id).cloned(),
            State::Unwritten => r.error = ledger.unwritten.get(id).map(|(_, e)| e.clone()),
            State::Delivered => {}
        }
        modules.push(r);
    }
    // A removal that could not be made: the module is gone from the cluster, not yet
    // from the sink.
    for (id, (hv, err)) in &ledger.unwritten {
        if !ledger.modules.as_ref().is_some_and(|m| m.contains_key(id)) {
            counts.add(State::Unwritten);
            if !query.lists(id, State::Unwritten) {
                continue;
            }
            let mut r = row(id, *hv);
            r.state = State::Unwritten;
            r.error = Some(format!("removing: {err}"));
            modules.push(r);
        }
    }
    modules.sort_by(|a, b| a.module.cmp(&b.module));
    let reloads = ledger.reloads.all();
    let names: Vec<&str> = ledger.sinks.iter().map(|s| s.name.as_str()).collect();
    let sinks = (ledger.sinks.iter())
        .map(|s| SinkRow {
            sink: s.name.clone(),
            last_delivery: s
                .delivered
                .map(|(at, poll, changes, unwritten)| LastDelivery {
                    time: rfc3339(at),
                    poll,
                    changes,
                    unwritten,
                }),
            reloads: (reloads.iter())
                .filter(|(path, _, _)| reload_owner(path, &names) == s.name)
                .map(|(path, outcome, at)| Reload {
                    path: path.clone(),
                    time: rfc3339(*at),
                    result: if outcome.is_ok() { "ok" } else { "error" }.into(),
                    error: outcome.clone().err(),
                })
                .collect(),
        })
        .collect();
    StatusReport {
        version: env!("CARGO_PKG_VERSION").into(),
        source: ledger.source.clone(),
        selector: ledger.selector.clone(),
        interval: Some(humantime::format_duration(ledger.interval).to_string()),
        ready: readiness.is_ok(),
        not_ready: readiness.err(),
        last_poll: ledger.last_poll.as_ref().map(|p| LastPoll {
            number: p.number,
            time: rfc3339(p.at),
            result: if p.error.is_none() { "ok" } else { "error" }.into(),
            duration_seconds: p.took.as_secs_f64(),
            error: p.error.clone(),
        }),
        last_success: ledger.last_success.map(rfc3339),
        sinks,
        counts: Some(counts),
        modules,
    }
}

/// The sink a reload path belongs to, among `sinks` (the paths `ReloadResults::done` is
/// given; `--confirm`, asking the agent after every sink, is shown with the output folder
/// the agent reads, else with the last sink).
fn reload_owner<'a>(path: &str, sinks: &[&'a str]) -> &'a str {
    let owner = match path {
        "signal" => "agent",
        "--on-change" => "on-change",
        "--confirm" => "out-dir",
        _ => "reload-url",
    };
    (sinks.iter().find(|s| **s == owner))
        .or(sinks.last().filter(|_| path == "--confirm"))
        .copied()
        .unwrap_or("")
}

/// `2026-12-02T11:41:11Z`.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `/status`: what `cmpoll status` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
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
    /// Every module by state, whatever the query lists (`None`: an older cmpoll's).
    #[serde(default)]
    pub counts: Option<Counts>,
    /// The modules the query asked for (every module, unless it asked for less).
    #[serde(default)]
    pub modules: Vec<ModuleRow>,
}

/// Modules by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub delivered: usize,
    pub rejected: usize,
    pub unwritten: usize,
}

impl Counts {
    fn add(&mut self, state: State) {
        match state {
            State::Delivered => self.delivered += 1,
            State::Rejected => self.rejected += 1,
            State::Unwritten => self.unwritten += 1,
        }
    }

    /// Counted from the rows (an answer made without counts).
    pub fn of(rows: &[ModuleRow]) -> Counts {
        let mut c = Counts::default();
        for r in rows {
            c.add(r.state);
        }
        c
    }

    pub fn total(&self) -> usize {
        self.delivered + self.rejected + self.unwritten
    }
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
    pub last_delivery: Option<LastDelivery>,
    pub reloads: Vec<Reload>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastDelivery {
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

impl State {
    pub fn word(self) -> &'static str {
        match self {
            State::Delivered => "delivered",
            State::Rejected => "rejected",
            State::Unwritten => "unwritten",
        }
    }

    fn from_word(w: &str) -> Option<State> {
        [State::Delivered, State::Rejected, State::Unwritten]
            .into_iter()
            .find(|s| s.word() == w)
    }
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

impl StatusReport {
    /// Only the rows `query` asks for, with the counts of every module (counted from the
    /// rows where the answer had none: an older daemon's, or a folder's).
    pub fn narrowed(mut self, query: &Query) -> StatusReport {
        if self.counts.is_none() {
            self.counts = Some(Counts::of(&self.modules));
        }
        self.modules.retain(|m| query.lists(&m.module, m.state));
        self
    }

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
        // What the rows leave out (a summary, or other modules than those asked for).
        if let Some(all) = self.counts {
            let listed = Counts::of(&self.modules);
            for (n, what) in [
                (all.rejected - listed.rejected.min(all.rejected), "rejected"),
                (
                    all.unwritten - listed.unwritten.min(all.unwritten),
                    "not written",
                ),
            ] {
                if n > 0 {
                    let others = if listed.total() > 0 { " other" } else { "" };
                    out.push(format!("{n}{others} module(s) {what}"));
                }
            }
        }
        out
    }
}

/// The first line of a reason or an error.
pub fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::health::InFlight;
    use crate::poll::snapshot::Entry;
    use crate::poll::snapshot::Modules;
    use crate::poll::spool::Loc;
    use crate::source::Resource;
    use crate::source::Resources;
    use std::collections::BTreeMap;
    use std::time::Duration;

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
            health.reloads().clone(),
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
    fn asking_the_agent_is_shown_with_the_folder_else_with_the_last_sink() {
        let (mut l, mut health) = ledger();
        l.sinks(vec!["out-dir".into(), "stdout".into()]);
        health.succeeded(std::time::Instant::now(), 0);
        l.polled(1, Duration::from_millis(5), Ok(()));
        let why = "the agent could not be asked: it exited with status 1";
        health.reloads().set("--confirm", Err(why.into()));
        let r = answer(&l, &health, &Query::default());
        assert_eq!(r.sinks[0].reloads.len(), 1);
        assert_eq!(r.sinks[0].reloads[0].path, "--confirm");
        assert!(r.sinks[1].reloads.is_empty());
        assert_eq!(
            r.problems()[..2],
            [
                format!("not ready: the last reload failed: {why}"),
                format!("reload --confirm failed: {why}"),
            ]
        );
        l.sinks(vec!["stdout".into()]);
        let r = answer(&l, &health, &Query::default());
        assert_eq!(r.sinks[0].reloads[0].path, "--confirm");
    }

    #[test]
    fn every_module_with_its_state_and_what_is_wrong() {
        let (mut l, mut health) = ledger();
        let r = answer(&l, &health, &Query::default());
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
        health.succeeded(std::time::Instant::now(), 0);
        health.reloads().set(
            "http://agent/-/reload",
            Err("503 Service Unavailable".into()),
        );
        let r = answer(&l, &health, &Query::default());
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
        assert_eq!(serde_json::from_str::<StatusReport>(&json).unwrap(), r);
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
        let kinds: Vec<String> = answer(&l, &health, &Query::default())
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
        let r = answer(&l, &health, &Query::default());
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

    /// A big daemon is asked for less: by state, by module, or counts only; the counts
    /// always cover every module, and what the rows leave out is still a problem.
    #[test]
    fn the_answer_lists_what_the_query_asks_for() {
        let (mut l, health) = ledger();
        let mut m = Modules::default();
        for (id, n) in [("ns/a", 1), ("ns/b", 2), ("ns/c", 3), ("ns/d", 4)] {
            m.push_unsorted(id, entry(n, "1"));
        }
        m.sort();
        let rejected = BTreeMap::from([("ns/b".to_string(), "bad".to_string())]);
        let unwritten = BTreeMap::from([("ns/c".to_string(), (None, "ENOSPC".to_string()))]);
        l.modules(m, rejected, unwritten);
        let ids = |q: &str| {
            let a = answer(&l, &health, &Query::parse(q).unwrap());
            let ids: Vec<String> = a.modules.iter().map(|m| m.module.clone()).collect();
            (ids, a.counts.unwrap())
        };
        let all = Counts {
            delivered: 2,
            rejected: 1,
            unwritten: 1,
        };
        assert_eq!(
            ids(""),
            (
                vec!["ns/a".into(), "ns/b".into(), "ns/c".into(), "ns/d".into()],
                all
            )
        );
        assert_eq!(
            ids("state=rejected,unwritten"),
            (vec!["ns/b".into(), "ns/c".into()], all)
        );
        assert_eq!(ids("module=ns%2Fd"), (vec!["ns/d".into()], all));
        assert_eq!(
            ids("module=ns/a,ns/c&state=unwritten"),
            (vec!["ns/c".into()], all)
        );
        assert_eq!(ids("summary=true"), (vec![], all));
        let summary = answer(&l, &health, &Query::parse("summary").unwrap());
        let problems = summary.problems();
        assert!(
            problems.contains(&"1 module(s) rejected".to_string()),
            "{problems:?}"
        );
        assert!(
            problems.contains(&"1 module(s) not written".to_string()),
            "{problems:?}"
        );
        for bad in ["state=gone", "modul=x", "summary=maybe", "module=%zz"] {
            assert!(Query::parse(bad).is_err(), "{bad}");
        }
        // An older daemon's full answer, narrowed here, counts from its rows.
        let mut old = answer(&l, &health, &Query::default());
        old.counts = None;
        let q = Query::parse("state=rejected").unwrap();
        let narrowed = old.narrowed(&q);
        assert_eq!(narrowed.counts, Some(all));
        assert_eq!(narrowed.modules.len(), 1);
        assert_eq!(Query::parse(&q.to_query()).unwrap(), q);
    }
}
