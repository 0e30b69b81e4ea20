//! `Delivery` over made-up sinks and a made-up gate: what each batch delivers, rejects,
//! leaves unwritten and puts back.

use std::sync::{Arc, Mutex};

use super::*;
use crate::batch::Outcome;
use crate::batch::observe::Observers;
use crate::ledger::Ledger;
use crate::ops::health::{Health, InFlight};
use crate::ops::metrics::Metrics;
use crate::source::Resource;

type Heard = Arc<Mutex<Vec<String>>>;

/// A sink that writes down what it hears (`name: type id, …`), failing to write the
/// modules in `fail` (those in `fail_back` only in a batch that rejects them: a
/// `--confirm` put-back) and refusing those in `refuse`.
struct Recorder {
    name: &'static str,
    heard: Heard,
    fail: Vec<&'static str>,
    fail_back: Vec<&'static str>,
    refuse: Vec<&'static str>,
}

impl Sink for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn apply(&mut self, b: &Batch) -> Result<Outcome, Fatal> {
        let seen: Vec<String> = b
            .events
            .iter()
            .map(|e| format!("{} {}", e.change.as_str(), e.id))
            .collect();
        self.heard.lock().unwrap().push(format!(
            "{}: {} | {} modules",
            self.name,
            seen.join(", "),
            b.synced.modules
        ));
        let has = |id: &&&str| b.events.iter().any(|e| e.id == **id && e.is_change());
        let rejects = |id: &&&str| (b.events.iter()).any(|e| e.id == **id && !e.is_change());
        let back = self.fail_back.iter().filter(|id| rejects(id));
        Ok(Outcome {
            unwritten: (self.fail.iter().chain(back))
                .filter(has)
                .map(|s| Unwritten::new(*s, "no room"))
                .collect(),
            rejected: (self.refuse.iter().filter(has))
                .map(|s| Rejection::new(*s, format!("{s} clashes")))
                .collect(),
        })
    }
}

fn sink(name: &'static str, heard: &Heard) -> Recorder {
    Recorder {
        name,
        heard: heard.clone(),
        fail: Vec::new(),
        fail_back: Vec::new(),
        refuse: Vec::new(),
    }
}

/// A delivery and the observers that read its records, committing as the daemon does.
struct Run {
    d: Delivery,
    observers: Observers,
}

impl std::ops::Deref for Run {
    type Target = Delivery;
    fn deref(&self) -> &Delivery {
        &self.d
    }
}

impl std::ops::DerefMut for Run {
    fn deref_mut(&mut self) -> &mut Delivery {
        &mut self.d
    }
}

impl Run {
    /// `Delivery::commit`, the observers reading the record, then the store.
    fn commit(
        &mut self,
        store: &mut Store,
        next: Snapshot,
        number: u64,
        stats: &PollStats,
        took: Duration,
    ) -> Result<Record, Fatal> {
        let c = self.d.commit(store, next, number, stats, took)?;
        (self.observers).committed(&c.record, &store.spool, c.polled(), &store.snapshot);
        Ok(c.into_store(store))
    }
}

fn delivery(gate: Option<Gate>, sinks: Vec<Recorder>) -> Run {
    let sinks: Vec<Box<dyn Sink>> = sinks.into_iter().map(|s| Box::new(s) as _).collect();
    let d = Duration::from_secs(30);
    let health = Health::new(d, d, d, InFlight::default());
    let metrics = Metrics::new();
    let observers = Observers::new(Arc::new(Mutex::new(health)), Arc::new(Mutex::new(metrics)));
    Run {
        d: Delivery::new(gate, sinks),
        observers,
    }
}

/// `d`, recording what its sinks hold in `ledger` (`/status`).
fn recording(mut d: Run, ledger: &Arc<Mutex<Ledger>>) -> Run {
    let o = &d.observers;
    let observers = Observers::new(o.health.clone(), o.metrics.clone());
    let names = Delivery::sink_names(&d.sinks);
    d.observers = observers.recording(Some(ledger.clone()), names);
    d
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap()
}

/// A poll's snapshot: (id, value of key `k`), contents in `store`'s spool.
fn poll(store: &mut Store, modules: &[(&str, &str)]) -> Snapshot {
    let mut snap = Snapshot::default();
    for (id, v) in modules {
        let entry = crate::poll::testing::entry(&mut store.spool, v);
        snap.modules.insert(id, entry);
    }
    snap
}

fn commit(d: &mut Run, store: &mut Store, modules: &[(&str, &str)], n: u64) -> Vec<String> {
    let next = poll(store, modules);
    let stats = PollStats::default();
    (d.commit(store, next, n, &stats, Duration::ZERO)
        .unwrap()
        .unwritten)
        .into_iter()
        .map(|u| u.module)
        .collect()
}

/// A `/status` ledger of ConfigMaps (its sinks named by `recording`).
fn ledger() -> Ledger {
    Ledger::new(
        String::new(),
        String::new(),
        Duration::from_secs(30),
        crate::source::Resources::one(Resource::ConfigMaps),
        Default::default(),
    )
}

fn take(heard: &Heard) -> Vec<String> {
    std::mem::take(&mut *heard.lock().unwrap())
}

fn held_value(store: &Store, id: &str) -> Option<String> {
    let e = store.snapshot.modules.get(id)?;
    let files = store.spool.get(e.loc).unwrap();
    Some(String::from_utf8(files[0].content.bytes().to_vec()).unwrap())
}

/// Sinks hear a batch in SPEC's order; a module one could not write is heard of by no
/// later sink, keeps its previous version in the snapshot, and goes again next poll.
#[test]
fn deliver_in_order_and_a_failed_write_stops_there() {
    let heard = Heard::default();
    let mut first = sink("outdir", &heard);
    first.fail = vec!["ns/b"];
    let mut d = delivery(None, vec![first, sink("stdout", &heard)]);
    let mut store = Store::new(Spool::memory());
    let unwritten = commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/b", "1")], 1);
    assert_eq!(unwritten, ["ns/b"]);
    assert_eq!(
        take(&heard),
        [
            "outdir: added ns/a, added ns/b | 2 modules",
            "stdout: added ns/a | 1 modules"
        ]
    );
    assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
    assert_eq!(held_value(&store, "ns/b"), None, "not written: absent");
    // Fixed by the next poll: tried again, as an addition.
    d.sinks.clear();
    d.sinks.push(Box::new(sink("outdir", &heard)));
    d.sinks.push(Box::new(sink("stdout", &heard)));
    let unwritten = commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/b", "1")], 2);
    assert!(unwritten.is_empty());
    assert_eq!(
        take(&heard),
        [
            "outdir: added ns/b | 2 modules",
            "stdout: added ns/b | 2 modules"
        ]
    );
}

/// An update a sink could not write keeps the version the sinks have.
#[test]
fn settle_keeps_the_previous_version_of_what_was_not_taken() {
    let heard = Heard::default();
    let mut d = delivery(None, vec![sink("outdir", &heard)]);
    let mut store = Store::new(Spool::memory());
    commit(&mut d, &mut store, &[("ns/a", "1")], 1);
    let mut failing = sink("outdir", &heard);
    failing.fail = vec!["ns/a"];
    d.sinks = vec![Box::new(failing)];
    commit(&mut d, &mut store, &[("ns/a", "2")], 2);
    assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
}

/// A sink's refusal (a flat name clash) reaches later sinks as `rejected`, once per
/// content; a poll that brings nothing new reaches no sink; a new content is news.
#[test]
fn a_refusal_is_announced_once_per_content() {
    let heard = Heard::default();
    let mut first = sink("outdir", &heard);
    first.refuse = vec!["ns/c"];
    let mut d = delivery(None, vec![first, sink("stdout", &heard)]);
    let mut store = Store::new(Spool::memory());
    commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/c", "1")], 1);
    assert_eq!(
        take(&heard),
        [
            "outdir: added ns/a, added ns/c | 2 modules",
            "stdout: added ns/a, rejected ns/c | 1 modules"
        ]
    );
    assert_eq!(d.rejected_modules(), 1);
    assert_eq!(held_value(&store, "ns/c"), None);
    // The same content again: the first sink refuses it again (it hears a count that
    // assumes it takes it), unannounced to the later ones.
    commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/c", "1")], 2);
    assert_eq!(take(&heard), ["outdir: added ns/c | 2 modules"]);
    // Another content: announced again.
    commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/c", "2")], 3);
    assert_eq!(
        take(&heard),
        [
            "outdir: added ns/c | 2 modules",
            "stdout: rejected ns/c | 1 modules"
        ]
    );
    // Gone from the cluster: no longer rejected.
    commit(&mut d, &mut store, &[("ns/a", "1")], 4);
    assert_eq!(d.rejected_modules(), 0);
}

/// What a commit returns is what happened, for the observers: each sink's take, the
/// rejections announced now (not those announced before), what was published again,
/// what a sink could not write, and every module rejected now.
#[test]
fn a_commit_records_what_happened() {
    let heard = Heard::default();
    let mut first = sink("outdir", &heard);
    first.refuse = vec!["ns/c"];
    first.fail = vec!["ns/b"];
    let mut d = delivery(None, vec![first, sink("stdout", &heard)]);
    let mut store = Store::new(Spool::memory());
    let stats = PollStats::default();
    let poll_n = |d: &mut Run, store: &mut Store, m: &[(&str, &str)], n| {
        let next = poll(store, m);
        d.commit(store, next, n, &stats, Duration::ZERO).unwrap()
    };
    let modules = [("ns/a", "1"), ("ns/b", "1"), ("ns/c", "1")];
    let r = poll_n(&mut d, &mut store, &modules, 1);
    let took: Vec<_> = (r.took.iter())
        .map(|t| (t.sink, t.events, t.unwritten))
        .collect();
    assert_eq!(
        took,
        [(0, 3, 1), (1, 2, 0)],
        "outdir: 3 events, 1 unwritten; stdout: 2"
    );
    assert_eq!(r.announced, [Rejection::new("ns/c", "ns/c clashes")]);
    assert_eq!(r.unwritten, [Unwritten::new("ns/b", "no room")]);
    assert_eq!(r.rejected, [Rejection::new("ns/c", "ns/c clashes")]);
    assert_eq!(
        r.synced.map(|s| (s.modules, s.added, s.rejected)),
        Some((1, 1, 1))
    );
    assert!(r.accepted.is_empty());
    // The same refusal again: not announced again, still rejected; ns/b written now.
    d.sinks[0] = Box::new(Recorder {
        refuse: vec!["ns/c"],
        ..sink("outdir", &heard)
    });
    let r = poll_n(&mut d, &mut store, &modules, 2);
    assert!(r.announced.is_empty(), "{:?}", r.announced);
    assert_eq!(r.rejected.len(), 1);
    assert!(r.unwritten.is_empty());
    // No longer refused: published again.
    d.sinks[0] = Box::new(sink("outdir", &heard));
    let modules = [("ns/a", "1"), ("ns/b", "1"), ("ns/c", "2")];
    let r = poll_n(&mut d, &mut store, &modules, 3);
    assert_eq!(r.accepted, ["ns/c"]);
    assert!(r.rejected.is_empty());
    // Nothing changed: no sink hears of it, and the record says so.
    let r = poll_n(&mut d, &mut store, &modules, 4);
    assert!(r.synced.is_none() && r.took.is_empty());
}

/// The first batch always reaches the sinks, even empty; a later poll without changes
/// reaches none.
#[test]
fn the_first_batch_always_goes_out_and_an_idle_poll_never() {
    let heard = Heard::default();
    let mut d = delivery(None, vec![sink("stdout", &heard)]);
    let mut store = Store::new(Spool::memory());
    commit(&mut d, &mut store, &[], 1);
    assert_eq!(take(&heard), ["stdout:  | 0 modules"]);
    commit(&mut d, &mut store, &[], 2);
    commit(&mut d, &mut store, &[("ns/a", "1")], 3);
    commit(&mut d, &mut store, &[("ns/a", "1")], 4);
    assert_eq!(take(&heard), ["stdout: added ns/a | 1 modules"]);
    // Issue 50.6: what --confirm would ask the agent about is kept only with it (50,000
    // first modules cost 14 MB of it otherwise).
    assert!(d.confirm.is_idle(), "no --confirm, nothing kept to ask");
    commit(&mut d, &mut store, &[], 5);
    assert_eq!(take(&heard), ["stdout: removed ns/a | 0 modules"]);
}

/// A gate running `command`, and `confirm` after delivery.
fn gate(command: &str, confirm: Option<String>) -> Gate {
    Gate::open(crate::validate::Options {
        command: command.into(),
        timeout: Duration::from_secs(10),
        jobs: 1,
        meta_dir: None,
        ext: String::new(),
        template: None,
        kinds: Default::default(),
        confirm,
        out_dir: None,
    })
    .unwrap()
}

/// The gate screens before any sink: a refused version never reaches one (a
/// `rejected` event does), the sinks keep what they had, and readiness hears that the
/// validator ran.
#[test]
fn screen_holds_back_what_the_validator_refuses() {
    let gate = gate("! grep -q bad \"$CMPOLL_MODULE_DIR\"/k", None);
    let heard = Heard::default();
    let mut d = delivery(Some(gate), vec![sink("stdout", &heard)]);
    let mut store = Store::new(Spool::memory());
    commit(&mut d, &mut store, &[("ns/a", "good"), ("ns/b", "good")], 1);
    take(&heard);
    d.observers.health().set_validator(Some("stale".into()));
    commit(
        &mut d,
        &mut store,
        &[("ns/a", "bad"), ("ns/b", "good 2")],
        2,
    );
    assert_eq!(
        take(&heard),
        ["stdout: rejected ns/a, updated ns/b | 2 modules"]
    );
    assert_eq!(held_value(&store, "ns/a").as_deref(), Some("good"));
    assert_eq!(held_value(&store, "ns/b").as_deref(), Some("good 2"));
    assert_eq!(d.observers.health().validator(), None, "it ran");
    commit(
        &mut d,
        &mut store,
        &[("ns/a", "good again"), ("ns/b", "good 2")],
        3,
    );
    assert_eq!(take(&heard), ["stdout: updated ns/a | 2 modules"]);
}

/// What a follower reports as refused (`Delivery::refusals`): the gate's refusal of the
/// version rejected now — also after a poll that has the version the sinks kept (a
/// watching follower's next poll) — and none once a newer version is published.
#[test]
fn the_refusals_reported_are_of_the_versions_rejected_now() {
    let gate = gate("! grep -q bad \"$CMPOLL_MODULE_DIR\"/k", None);
    let heard = Heard::default();
    let mut d = delivery(Some(gate), vec![sink("stdout", &heard)]);
    let mut store = Store::new(Spool::memory());
    commit(&mut d, &mut store, &[("ns/a", "good"), ("ns/b", "good")], 1);
    assert_eq!(d.refusals(), vec![]);
    let bad = poll(&mut store, &[("ns/a", "bad")])
        .modules
        .get("ns/a")
        .unwrap()
        .hash;
    commit(&mut d, &mut store, &[("ns/a", "bad"), ("ns/b", "good")], 2);
    let refused = d.refusals();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!((refused[0].module.as_str(), refused[0].hash), ("ns/a", bad));
    assert!(
        refused[0].reason.contains("validator exited with status 1"),
        "{refused:?}"
    );
    // A poll built on what the sinks kept: still the version rejected now.
    commit(&mut d, &mut store, &[("ns/a", "good"), ("ns/b", "good")], 3);
    assert_eq!(d.refusals(), refused);
    commit(
        &mut d,
        &mut store,
        &[("ns/a", "good 2"), ("ns/b", "good")],
        4,
    );
    assert_eq!(d.refusals(), vec![], "published");
}

/// `--confirm`: the agent is asked after every batch with changes; what it refuses
/// goes back to its last good version in every sink (an update) or away (a new
/// module), is announced as `rejected`, stays held back while its content does not
/// change, and the agent is asked again (so it takes the folder back). An agent that
/// cannot be asked gets back what it had before the batch (it may be down because of
/// it), and the batch comes again with the next poll.
#[test]
fn what_the_agent_refuses_goes_back_to_its_last_good_version() {
    let dir = tempfile::tempdir().unwrap();
    let asked = dir.path().join("asked");
    let down = dir.path().join("down");
    // Refuses the modules the file `refuse` names; cannot be asked while `down` is.
    let confirm = format!(
        "test -e {down} && exit 3; printf '%s' \"$CMPOLL_MODULES\" | tr '\\n' ' ' >> {asked}; echo >> {asked}; for m in $CMPOLL_MODULES; do grep -qx \"$m\" {dir}/refuse 2>/dev/null && echo \"$m it failed to build\"; done; true",
        down = down.display(),
        asked = asked.display(),
        dir = dir.path().display(),
    );
    let gate = gate("true", Some(confirm));
    let heard = Heard::default();
    let mut d = delivery(
        Some(gate),
        vec![sink("outdir", &heard), sink("stdout", &heard)],
    );
    let ledger = Arc::new(Mutex::new(ledger()));
    d = recording(d, &ledger);
    // What /status says each sink was last given (poll, events), and how asking went.
    let last_given = || {
        (lock(&ledger).sinks.iter())
            .map(|s| s.delivered.map(|(_, poll, changes, _)| (poll, changes)))
            .collect::<Vec<_>>()
    };
    let asking = |d: &Run| {
        (lock(&d.observers.health).reloads().all().into_iter())
            .map(|(path, r, _)| (path, r.is_ok()))
            .collect::<Vec<_>>()
    };
    let mut store = Store::new(Spool::memory());
    let asked_lines = || {
        let s = std::fs::read_to_string(&asked).unwrap_or_default();
        std::fs::remove_file(&asked).ok();
        s.lines().map(str::to_string).collect::<Vec<_>>()
    };
    commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/b", "1")], 1);
    take(&heard);
    assert_eq!(asked_lines(), ["ns/a ns/b "]);
    std::fs::write(dir.path().join("refuse"), "ns/a\nns/c\n").unwrap();
    commit(
        &mut d,
        &mut store,
        &[("ns/a", "2"), ("ns/b", "1"), ("ns/c", "1")],
        2,
    );
    assert_eq!(
        take(&heard),
        [
            "outdir: updated ns/a, added ns/c | 3 modules",
            "stdout: updated ns/a, added ns/c | 3 modules",
            "outdir: removed ns/c, updated ns/a, rejected ns/a, rejected ns/c | 2 modules",
            "stdout: removed ns/c, updated ns/a, rejected ns/a, rejected ns/c | 2 modules",
        ]
    );
    // Asked about the batch, then about what went back (to take the folder again).
    assert_eq!(asked_lines(), ["ns/a ns/c ", "ns/a "]);
    // The sinks were last given the put-back (two events went back, two rejected).
    assert_eq!(last_given(), [Some((2, 4)), Some((2, 4))]);
    assert_eq!(asking(&d), [("--confirm".to_string(), true)]);
    assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
    assert_eq!(held_value(&store, "ns/c"), None);
    assert_eq!(d.rejected_modules(), 2);
    // The refused contents stay held back, unannounced, and nobody is asked.
    commit(
        &mut d,
        &mut store,
        &[("ns/a", "2"), ("ns/b", "1"), ("ns/c", "1")],
        3,
    );
    assert_eq!(take(&heard), Vec::<String>::new());
    assert_eq!(asked_lines(), Vec::<String>::new());
    // An agent that cannot be asked: delivered, then put back.
    std::fs::write(&down, "").unwrap();
    commit(
        &mut d,
        &mut store,
        &[("ns/a", "3"), ("ns/b", "1"), ("ns/c", "1")],
        4,
    );
    assert_eq!(
        take(&heard),
        [
            "outdir: updated ns/a | 2 modules",
            "stdout: updated ns/a | 2 modules",
            "outdir: updated ns/a | 2 modules",
            "stdout: updated ns/a | 2 modules",
        ]
    );
    assert_eq!(asked_lines(), Vec::<String>::new(), "down");
    assert_eq!(asking(&d), [("--confirm".to_string(), false)], "not ready");
    assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
    assert_eq!(d.rejected_modules(), 1, "not rejected: withdrawn");
    // Up again: "3" comes again, is refused, and goes back to "1".
    std::fs::remove_file(&down).unwrap();
    commit(
        &mut d,
        &mut store,
        &[("ns/a", "3"), ("ns/b", "1"), ("ns/c", "1")],
        5,
    );
    assert_eq!(asked_lines(), ["ns/a ", "ns/a "]);
    assert_eq!(
        take(&heard),
        [
            "outdir: updated ns/a | 2 modules",
            "stdout: updated ns/a | 2 modules",
            "outdir: updated ns/a, rejected ns/a | 2 modules",
            "stdout: updated ns/a, rejected ns/a | 2 modules",
        ]
    );
    assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
    // Accepted at last: "4" stays.
    std::fs::write(dir.path().join("refuse"), "").unwrap();
    commit(
        &mut d,
        &mut store,
        &[("ns/a", "4"), ("ns/b", "1"), ("ns/c", "1")],
        6,
    );
    assert_eq!(asked_lines(), ["ns/a "]);
    assert_eq!(held_value(&store, "ns/a").as_deref(), Some("4"));
    assert_eq!(d.rejected_modules(), 1, "ns/c only");
    assert_eq!(asking(&d), [("--confirm".to_string(), true)], "ready again");
}

/// A refused module a sink could not take back is what that sink holds: unwritten
/// (`/readyz`, `/status`), held at the refused version, and put back after the next
/// poll; later sinks hear only of the rejection until then.
#[test]
fn a_put_back_a_sink_cannot_take_is_unwritten_and_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let asked = dir.path().join("asked");
    let confirm = format!(
        "echo \"$CMPOLL_MODULES\" >> {asked}; for m in $CMPOLL_MODULES; do grep -qx \"$m\" {dir}/refuse 2>/dev/null && echo \"$m it failed to build\"; done; true",
        asked = asked.display(),
        dir = dir.path().display(),
    );
    let heard = Heard::default();
    let mut outdir = sink("outdir", &heard);
    outdir.fail_back = vec!["ns/a"];
    let mut d = delivery(
        Some(gate("true", Some(confirm))),
        vec![outdir, sink("stdout", &heard)],
    );
    let ledger = Arc::new(Mutex::new(ledger()));
    d = recording(d, &ledger);
    let mut store = Store::new(Spool::memory());
    let asked_lines = || {
        let s = std::fs::read_to_string(&asked).unwrap_or_default();
        std::fs::remove_file(&asked).ok();
        s.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    commit(&mut d, &mut store, &[("ns/a", "1"), ("ns/b", "1")], 1);
    take(&heard);
    asked_lines();
    std::fs::write(dir.path().join("refuse"), "ns/a\n").unwrap();
    let unwritten = commit(&mut d, &mut store, &[("ns/a", "2"), ("ns/b", "1")], 2);
    assert_eq!(unwritten, ["ns/a"], "readiness hears of it");
    assert_eq!(
        take(&heard),
        [
            "outdir: updated ns/a | 2 modules",
            "stdout: updated ns/a | 2 modules",
            "outdir: updated ns/a, rejected ns/a | 2 modules",
            "stdout: rejected ns/a | 2 modules",
        ]
    );
    assert_eq!(
        held_value(&store, "ns/a").as_deref(),
        Some("2"),
        "as the sink"
    );
    assert_eq!(
        (lock(&ledger).unwritten.keys()).collect::<Vec<_>>(),
        ["ns/a"],
        "/status"
    );
    assert_eq!(d.rejected_modules(), 1);
    assert_eq!(
        asked_lines(),
        ["ns/a"],
        "not asked again: nothing went back"
    );
    // The next poll (nothing changed in the cluster) puts it back, and asks again.
    let unwritten = commit(&mut d, &mut store, &[("ns/a", "2"), ("ns/b", "1")], 3);
    assert!(unwritten.is_empty(), "{unwritten:?}");
    assert_eq!(
        take(&heard),
        [
            "outdir: updated ns/a | 2 modules",
            "stdout: updated ns/a | 2 modules",
        ]
    );
    assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
    assert!(lock(&ledger).unwritten.is_empty());
    assert_eq!(asked_lines(), ["ns/a"]);
    assert_eq!(d.rejected_modules(), 1, "still rejected");
    // Once back, nothing more goes out.
    commit(&mut d, &mut store, &[("ns/a", "2"), ("ns/b", "1")], 4);
    assert_eq!(take(&heard), Vec::<String>::new());
    assert_eq!(asked_lines(), Vec::<String>::new());
}

/// A run's first batch is not put back when the agent cannot be asked (the folder
/// held most of it before the start; an agent slow to start must not lose it): it is
/// asked about again after the next poll.
#[test]
fn a_first_batch_stays_when_the_agent_cannot_be_asked() {
    let dir = tempfile::tempdir().unwrap();
    let down = dir.path().join("down");
    std::fs::write(&down, "").unwrap();
    let confirm = format!(
        "test -e {down} && exit 3; echo \"$CMPOLL_MODULES\" > {dir}/asked",
        down = down.display(),
        dir = dir.path().display()
    );
    let heard = Heard::default();
    let mut d = delivery(
        Some(gate("true", Some(confirm))),
        vec![sink("outdir", &heard)],
    );
    let mut store = Store::new(Spool::memory());
    commit(&mut d, &mut store, &[("ns/a", "1")], 1);
    assert_eq!(take(&heard), ["outdir: added ns/a | 1 modules"]);
    assert_eq!(held_value(&store, "ns/a").as_deref(), Some("1"));
    std::fs::remove_file(&down).unwrap();
    commit(&mut d, &mut store, &[("ns/a", "1")], 2);
    assert_eq!(take(&heard), Vec::<String>::new());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("asked")).unwrap(),
        "ns/a\n\n"
    );
}
