//! A watch over made-up polls: where it starts, what its selector sees, its bookmarks,
//! what a slow watcher gets, how it ends.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use super::*;
use crate::serve::request::{self, Route};
use crate::serve::testing::{item, kinds, poll};

/// A timeline that has seen `polls` (each: listed version, objects).
fn timeline(polls: Vec<(u64, Vec<crate::source::Item>)>) -> Arc<RwLock<Timeline>> {
    let t = Arc::new(RwLock::new(Timeline::default()));
    let mut prev = Arc::new(Held::empty(kinds()));
    for (n, (rv, items)) in polls.into_iter().enumerate() {
        let next = Arc::new(poll(&prev, n as u64 + 1, &[(None, rv)], items));
        let mut w = t.write().unwrap();
        w.history.record(&prev, &next);
        w.held = Some(next.clone());
        prev = next;
    }
    t
}

/// Another poll on `t`.
fn then(t: &Arc<RwLock<Timeline>>, rv: u64, items: Vec<crate::source::Item>) {
    let mut w = t.write().unwrap();
    let prev = w.held.clone().unwrap();
    let next = poll(&prev, prev.poll + 1, &[(None, rv)], items);
    w.history.record(&prev, &next);
    w.held = Some(Arc::new(next));
}

fn ask(query: &str) -> Ask {
    let Route::Read(target) = request::route("/api/v1/namespaces/a/configmaps") else {
        panic!()
    };
    request::ask(target, &request::Query::parse(query), &|_| None).unwrap()
}

/// Pulls everything there is now: the events as (type, name, rv) and what comes next.
fn pull_all(w: &mut Watch, now: Instant) -> (Vec<(String, String, String)>, Next) {
    let mut got = Vec::new();
    loop {
        let p = w.pull(now, 1 << 20);
        for c in &p.chunks {
            let v: serde_json::Value = serde_json::from_slice(c).unwrap();
            let m = &v["object"]["metadata"];
            got.push((
                v["type"].as_str().unwrap().to_string(),
                m["name"].as_str().unwrap_or("").to_string(),
                m["resourceVersion"].as_str().unwrap_or("").to_string(),
            ));
            if v["type"] == "ERROR" {
                got.push((
                    "status".into(),
                    v["object"]["message"].as_str().unwrap().into(),
                    v["object"]["code"].to_string(),
                ));
            }
        }
        if p.next != Next::At(now) || p.chunks.is_empty() {
            return (got, p.next);
        }
    }
}

fn ev(t: &str, name: &str, rv: u64) -> (String, String, String) {
    (t.into(), name.into(), rv.to_string())
}

#[test]
fn from_a_version_the_changes_after_it_and_from_none_the_state_first() {
    let t = timeline(vec![
        (10, vec![item("a", "x", 5, &[])]),
        (20, vec![item("a", "x", 15, &[]), item("a", "y", 18, &[])]),
    ]);
    let mut rng = Rng::new(1);
    let now = Instant::now();
    let mut w = Watch::start(t.clone(), &ask("watch=1&resourceVersion=10"), &mut rng);
    let (got, next) = pull_all(&mut w, now);
    assert_eq!(got, vec![ev("MODIFIED", "x", 15), ev("ADDED", "y", 18)]);
    assert!(matches!(next, Next::At(_)));
    let mut w = Watch::start(t.clone(), &ask("watch=1&resourceVersion=16"), &mut rng);
    assert_eq!(pull_all(&mut w, now).0, vec![ev("ADDED", "y", 18)]);
    let mut w = Watch::start(t.clone(), &ask("watch=1"), &mut rng);
    assert_eq!(
        pull_all(&mut w, now).0,
        vec![ev("ADDED", "x", 15), ev("ADDED", "y", 18)]
    );
    // A change later reaches the ones watching.
    then(&t, 30, vec![item("a", "y", 25, &[])]);
    assert_eq!(
        pull_all(&mut w, now).0,
        vec![ev("MODIFIED", "y", 25), ev("DELETED", "x", 30)]
    );
}

#[test]
fn a_version_older_than_the_history_is_410_expired_in_the_apiservers_words() {
    let t = timeline(vec![(10, vec![item("a", "x", 5, &[])])]);
    let mut w = Watch::start(t, &ask("watch=1&resourceVersion=3"), &mut Rng::new(1));
    let (got, next) = pull_all(&mut w, Instant::now());
    assert_eq!(got[0].0, "ERROR");
    assert_eq!(
        got[1],
        (
            "status".into(),
            "too old resource version: 3 (10)".into(),
            "410".into()
        )
    );
    assert_eq!(next, Next::End);
}

#[test]
fn the_streaming_list_sends_the_state_then_its_bookmark() {
    let t = timeline(vec![(
        10,
        vec![item("a", "x", 5, &[]), item("b", "z", 6, &[])],
    )]);
    let q =
        "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let mut w = Watch::start(t.clone(), &ask(q), &mut Rng::new(1));
    let now = Instant::now();
    let p = w.pull(now, 1 << 20);
    let last: serde_json::Value = serde_json::from_slice(p.chunks.last().unwrap()).unwrap();
    assert_eq!(
        last,
        serde_json::json!({"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"resourceVersion": "10", "annotations": {"k8s.io/initial-events-end": "true"}}}})
    );
    assert_eq!(p.chunks.len(), 2, "x in namespace a, then the bookmark");
    // From a version the hub has not reached: it waits for it, then the watch cache's 504.
    let q = format!("{q}&resourceVersion=50");
    let mut w = Watch::start(t.clone(), &ask(&q), &mut Rng::new(1));
    assert!(w.behind());
    let (got, next) = pull_all(&mut w, now);
    assert!(got.is_empty() && matches!(next, Next::At(_)), "{got:?}");
    then(&t, 60, vec![item("a", "x", 55, &[])]);
    let (got, _) = pull_all(&mut w, now);
    assert_eq!(
        got[0],
        ev("ADDED", "x", 55),
        "the state at least as new as asked"
    );
    let mut late = Watch::start(t, &ask(&q.replace("=50", "=500")), &mut Rng::new(1));
    let (got, next) = pull_all(&mut late, Instant::now() + BEHIND_WAIT);
    assert_eq!(got[1].2, "504");
    assert_eq!(next, Next::End);
}

#[test]
fn bookmarks_move_an_idle_watcher_on_and_never_back() {
    let t = timeline(vec![(10, vec![item("a", "x", 5, &[])])]);
    let mut w = Watch::start(
        t.clone(),
        &ask("watch=1&resourceVersion=10&allowWatchBookmarks=true"),
        &mut Rng::new(1),
    );
    let now = Instant::now();
    assert!(pull_all(&mut w, now).0.is_empty());
    then(&t, 40, vec![item("a", "x", 5, &[])]);
    let later = Instant::now() + BOOKMARK_EVERY;
    assert_eq!(pull_all(&mut w, later).0, vec![ev("BOOKMARK", "", 40)]);
    // Nothing newer: no bookmark again.
    assert!(pull_all(&mut w, later + BOOKMARK_EVERY).0.is_empty());
    // A watch from a version newer than the hub's is never told an older one.
    let mut ahead = Watch::start(
        t,
        &ask("watch=1&resourceVersion=99&allowWatchBookmarks=true"),
        &mut Rng::new(1),
    );
    assert!(pull_all(&mut ahead, later + BOOKMARK_EVERY).0.is_empty());
}

#[test]
fn a_watch_ends_at_its_timeout_or_when_it_fell_behind_the_history() {
    let t = timeline(vec![(10, vec![])]);
    let mut w = Watch::start(
        t.clone(),
        &ask("watch=1&resourceVersion=10&timeoutSeconds=5"),
        &mut Rng::new(1),
    );
    let now = Instant::now();
    assert!(matches!(pull_all(&mut w, now).1, Next::At(at) if at <= now + Duration::from_secs(5)));
    assert_eq!(pull_all(&mut w, now + Duration::from_secs(5)).1, Next::End);
    // Without a timeout: between 30 and 60 minutes.
    let w = Watch::start(
        t.clone(),
        &ask("watch=1&resourceVersion=10"),
        &mut Rng::new(7),
    );
    let left = w.ends.saturating_duration_since(now);
    assert!(
        left >= MIN_REQUEST_TIMEOUT - Duration::from_secs(1) && left <= 2 * MIN_REQUEST_TIMEOUT
    );
    // A watcher that read nothing while the history moved past it ends.
    let mut slow = Watch::start(
        t.clone(),
        &ask("watch=1&resourceVersion=10"),
        &mut Rng::new(1),
    );
    for n in 0..(crate::serve::history::MAX_CHANGES as u64 + 5) {
        then(&t, 20 + 10 * n, vec![item("a", "x", 15 + 10 * n, &[])]);
    }
    assert_eq!(pull_all(&mut slow, now).1, Next::End);
}

#[test]
fn a_pull_gives_no_more_than_its_room() {
    let items: Vec<_> = (0..100)
        .map(|i| item("a", &format!("m{i:03}"), 5 + i, &[]))
        .collect();
    let t = timeline(vec![(200, items)]);
    let mut w = Watch::start(t, &ask("watch=1"), &mut Rng::new(1));
    let now = Instant::now();
    let first = w.pull(now, 1000);
    let size: usize = first.chunks.iter().map(|c| c.len()).sum();
    assert!((1000..1400).contains(&size), "{size}");
    assert_eq!(first.next, Next::At(now), "more as soon as this is out");
    let (rest, _) = pull_all(&mut w, now);
    assert_eq!(first.chunks.len() + rest.len(), 100, "none lost or twice");
}

#[test]
fn a_followers_watch_of_no_wait_commits_at_once_and_never_goes_back() {
    let t = timeline(vec![(10, vec![item("a", "x", 5, &[])])]);
    let mut rng = Rng::new(1);
    // A wait of 0 answers at once, then every second; a version the hub has not reached
    // is never gone back on.
    let mut a = ask("watch=1&resourceVersion=99");
    a.wait = Some(Duration::ZERO);
    let mut w = Watch::start(t.clone(), &a, &mut rng);
    let now = Instant::now();
    let (got, next) = pull_all(&mut w, now);
    assert_eq!(got, vec![ev("BOOKMARK", "", 99)]);
    assert_eq!(next, Next::At(now + Duration::from_secs(1)), "held");
}

#[test]
fn a_held_followers_watch_commits_each_change_and_goes_on() {
    let t = timeline(vec![(10, vec![item("a", "x", 5, &[])])]);
    let mut rng = Rng::new(1);
    let mut a = ask("watch=1&resourceVersion=10");
    a.wait = Some(Duration::from_secs(30));
    let mut w = Watch::start(t.clone(), &a, &mut rng);
    let now = Instant::now();
    // Nothing: a bookmark alone once the wait is over, and the watch goes on.
    let (got, next) = pull_all(&mut w, now);
    assert!(got.is_empty(), "{got:?}");
    let later = now + Duration::from_secs(31);
    let (got, next2) = pull_all(&mut w, later);
    assert_eq!(got, vec![ev("BOOKMARK", "", 10)], "{next:?}");
    assert!(
        matches!(next2, Next::At(at) if at > later && at <= later + Duration::from_secs(30)),
        "the next commit is due within the wait: {next2:?}"
    );
    // A change: its events and the bookmark that commits them, on the same stream.
    then(
        &t,
        20,
        vec![item("a", "x", 15, &[]), item("a", "y", 17, &[])],
    );
    let (got, next) = pull_all(&mut w, later);
    assert_eq!(
        got,
        vec![
            ev("MODIFIED", "x", 15),
            ev("ADDED", "y", 17),
            ev("BOOKMARK", "", 20)
        ]
    );
    assert_ne!(next, Next::End);
    // And the next one.
    then(&t, 30, vec![item("a", "y", 25, &[])]);
    let (got, _) = pull_all(&mut w, later);
    assert_eq!(
        got,
        vec![
            ev("MODIFIED", "y", 25),
            ev("DELETED", "x", 30),
            ev("BOOKMARK", "", 30)
        ],
        "a DELETED carries the version of the poll that saw it gone"
    );
}

/// Idle commits fall on the hub's grid: watches begun anywhere in a wait commit at a few
/// moments, never later than their wait, and a short wait is kept to the second.
#[test]
fn held_watches_commit_together_on_the_grid_within_their_wait() {
    let now = Instant::now();
    let wait = Duration::from_secs(30);
    let mut moments = std::collections::BTreeSet::new();
    for ms in (0..30_000).step_by(7) {
        let began = now + Duration::from_millis(ms);
        let at = next_commit(began, wait);
        assert!(
            at <= began + wait && at > began + wait - COMMIT_GRID,
            "{ms}"
        );
        moments.insert(at);
    }
    assert!(moments.len() <= 7, "{} moments", moments.len());
    for w in [0, 1, 5] {
        let w = Duration::from_secs(w);
        assert_eq!(next_commit(now, w), now + w, "under the grid: as asked");
    }
    let long = next_commit(now, Duration::from_secs(300));
    assert!(long <= now + Duration::from_secs(300));
    assert!(long > now + Duration::from_secs(300) - COMMIT_GRID);
}

/// A follower's held watch is told the hub's version at its commits only: changes that
/// are not its own (another namespace here; a rollout step's band elsewhere) move the hub
/// on without a minute's bookmark to each follower between its commits.
#[test]
fn a_held_followers_watch_has_no_minute_bookmarks_between_its_commits() {
    let t = timeline(vec![(10, vec![item("a", "x", 5, &[])])]);
    let mut a = ask("watch=1&resourceVersion=10&allowWatchBookmarks=true");
    a.wait = Some(Duration::from_secs(300));
    let mut w = Watch::start(t.clone(), &a, &mut Rng::new(1));
    let now = Instant::now();
    assert!(pull_all(&mut w, now).0.is_empty());
    then(
        &t,
        40,
        vec![item("a", "x", 5, &[]), item("b", "other", 35, &[])],
    );
    // Past the minute: nothing written; a wait this long is still pulled every minute
    // (each pull a sighting of its follower).
    let minute = now + BOOKMARK_EVERY + Duration::from_secs(1);
    let (got, next) = pull_all(&mut w, minute);
    assert!(got.is_empty(), "{got:?}");
    assert!(
        matches!(next, Next::At(at) if at <= minute + BOOKMARK_EVERY),
        "pulled again within the minute: {next:?}"
    );
    // A wait within the minute: no wake but its commits.
    let mut a30 = ask("watch=1&resourceVersion=10&allowWatchBookmarks=true");
    a30.wait = Some(Duration::from_secs(30));
    let mut w30 = Watch::start(t.clone(), &a30, &mut Rng::new(1));
    let (got, next) = pull_all(&mut w30, now);
    assert!(got.is_empty(), "{got:?}");
    assert!(
        matches!(next, Next::At(at) if at <= now + Duration::from_secs(30)),
        "the next wake is the commit: {next:?}"
    );
    // The commit tells it the hub's version.
    let commit = now + Duration::from_secs(301);
    assert_eq!(pull_all(&mut w, commit).0, vec![ev("BOOKMARK", "", 40)]);
    // The same watch without the wait has its minute's bookmark.
    let mut plain = Watch::start(
        t,
        &ask("watch=1&resourceVersion=10&allowWatchBookmarks=true"),
        &mut Rng::new(1),
    );
    assert_eq!(pull_all(&mut plain, minute).0, vec![ev("BOOKMARK", "", 40)]);
}

/// Issue 56.3: a change a hub of two namespaces held back (the other namespace not yet
/// listed past it) is never sent to a watcher that already holds it, when it is released:
/// not to one watching from a version past it (a list of its namespace at that version
/// showed it), nor to a streaming list whose state came from the poll that found it.
#[test]
fn a_change_held_back_reaches_no_one_who_holds_it_already() {
    let t = Arc::new(RwLock::new(Timeline::default()));
    type Scopes<'a> = &'a [(Option<&'a str>, u64)];
    let polls: [(Scopes, Vec<crate::source::Item>); 3] = [
        (
            &[(Some("a"), 10), (Some("b"), 10)],
            vec![item("a", "x", 5, &[])],
        ),
        // x deleted: seen at a's 30, held back while b is at 20.
        (&[(Some("a"), 30), (Some("b"), 20)], vec![]),
        // x made again at 35: held back too.
        (
            &[(Some("a"), 40), (Some("b"), 20)],
            vec![item("a", "x", 35, &[])],
        ),
    ];
    let mut prev = Arc::new(Held::empty(kinds()));
    for (n, (scopes, items)) in polls.into_iter().enumerate() {
        let next = Arc::new(poll(&prev, n as u64 + 1, scopes, items));
        let mut w = t.write().unwrap();
        w.history.record(&prev, &next);
        w.held = Some(next.clone());
        prev = next;
    }
    let mut rng = Rng::new(1);
    let now = Instant::now();
    // A client that listed namespace a (at 40: x at 35) and watches from there; another
    // whose streaming list shows x at 35.
    let mut from = Watch::start(t.clone(), &ask("watch=1&resourceVersion=40"), &mut rng);
    let mut streamed = Watch::start(t.clone(), &ask("watch=1"), &mut rng);
    assert_eq!(pull_all(&mut from, now).0, vec![]);
    assert_eq!(pull_all(&mut streamed, now).0, vec![ev("ADDED", "x", 35)]);
    // b is listed past both: the changes are released, to watchers that do not hold them.
    {
        let mut w = t.write().unwrap();
        let prev = w.held.clone().unwrap();
        let next = poll(
            &prev,
            4,
            &[(Some("a"), 40), (Some("b"), 50)],
            vec![item("a", "x", 35, &[])],
        );
        w.history.record(&prev, &next);
        w.held = Some(Arc::new(next));
    }
    let mut older = Watch::start(t.clone(), &ask("watch=1&resourceVersion=10"), &mut rng);
    assert_eq!(
        pull_all(&mut older, now).0,
        vec![ev("DELETED", "x", 30), ev("ADDED", "x", 35)],
        "a watcher from before them gets both"
    );
    assert_eq!(pull_all(&mut from, now).0, vec![], "from 40");
    assert_eq!(pull_all(&mut streamed, now).0, vec![], "after its state");
}

/// Issue 56.6: one pull looks at no more than `VISITS` objects or changes, whatever it
/// sends: a watch whose selector matches nothing of a large namespace (or a long history)
/// is cut and pulled again, rather than holding the server's one thread for all of it.
#[test]
fn a_pull_looks_at_a_bounded_number_of_objects() {
    let n = VISITS * 2 + 100;
    let many: Vec<crate::source::Item> = (0..n)
        .map(|i| item("a", &format!("o{i:05}"), 5, &[]))
        .collect();
    let t = timeline(vec![(10, many)]);
    let mut w = Watch::start(
        t.clone(),
        &ask("watch=1&labelSelector=x%3Dy"),
        &mut Rng::new(1),
    );
    let now = Instant::now();
    let mut cuts = 0;
    loop {
        let p = w.pull(now, 1 << 20);
        assert!(p.chunks.is_empty(), "nothing matches");
        if p.next != Next::At(now) {
            break;
        }
        cuts += 1;
        assert!(cuts < 10, "it ends");
    }
    assert_eq!(cuts, n.div_ceil(VISITS) - 1, "cut after each {VISITS}");
    // The same for the changes: all of them touched, none of them selected.
    let changed: Vec<crate::source::Item> = (0..n)
        .map(|i| item("a", &format!("o{i:05}"), 15, &[]))
        .collect();
    then(&t, 20, changed);
    let mut cuts = 0;
    loop {
        let p = w.pull(now, 1 << 20);
        assert!(p.chunks.is_empty());
        if p.next != Next::At(now) {
            break;
        }
        cuts += 1;
        assert!(cuts < 10, "it ends");
    }
    assert_eq!(cuts, n.div_ceil(VISITS) - 1);
    // A watch of one name looks at that object alone.
    let mut one = Watch::start(
        t,
        &ask("watch=1&fieldSelector=metadata.name%3Do00007"),
        &mut Rng::new(1),
    );
    let (got, _) = pull_all(&mut one, now);
    assert_eq!(got, vec![ev("ADDED", "o00007", 15)]);
}
