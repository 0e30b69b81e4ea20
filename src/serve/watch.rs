//! A watch on the hub (`watch=true`), as the apiserver's watch cache serves one: a stream
//! of JSON events pulled on the server's loop (`https::server::Stream`), so that ten
//! thousand watchers need no thread each, each event's bytes made once for all of them.
//!
//! - From `resourceVersion` R (not 0): the changes of the hub's history after R
//!   (`history.rs`); R older than the history is one `ERROR` event, `410 Expired` (`too old
//!   resource version: R (OLDEST)`), then the end, as the apiserver answers it.
//! - Without one (or R = 0): the state first, as `ADDED` events, then the changes after it.
//! - The streaming list (`sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan`):
//!   the state, at least as new as R (waited for up to 3 s, then the watch cache's 504),
//!   then, with `allowWatchBookmarks`, a `BOOKMARK` annotated `k8s.io/initial-events-end`.
//! - A watcher's selectors (labels, `metadata.name`, `metadata.namespace`, its namespace)
//!   apply to each change: an object that stops matching is `DELETED` (its last state), one
//!   that starts is `ADDED`.
//! - With `allowWatchBookmarks`, a `BOOKMARK` about every minute (the first at a random
//!   moment of it, so that a fleet's do not come together) when the hub's version moved
//!   past the last one the watcher was told, and one before the end (a follower's held
//!   watch below: its commits instead).
//! - It ends at `timeoutSeconds`, or, without, at a random moment between 30 and 60
//!   minutes, as the apiserver's `--min-request-timeout` (1800 s) ends its watches; also
//!   when the history dropped changes the watcher had not read (it was too slow), as the
//!   apiserver closes a watcher that does not keep up. The client watches again from the
//!   last version it was given.
//!
//! The versions a watcher is told never go back: a bookmark is sent only past the last one.
//!
//! A cmpoll follower's watch (`hub_protocol::WAIT_HEADER`, a wait W: 0 commits at once,
//! then every second) is held: each change after R of the hub's polls that has any for it comes as its
//! events, then a `BOOKMARK` at the hub's version (the change is complete: commit it);
//! when W passes with none, the `BOOKMARK` alone (nothing changed: the version it holds,
//! or the hub's if newer), at the last point before it of a grid of the hub's clock
//! (`COMMIT_GRID`: a fleet's idle commits go out together); until the watch ends as any
//! other does. A change costs each
//! follower its events and a bookmark on a stream already open, no request at all.

use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use super::event::{self, Type};
use super::held::{Held, HeldObject};
use super::history::{History, Start};
use super::render;
use super::request::{Ask, Form};
use super::status::StatusError;
use super::views::Views;
use crate::backoff::Rng;
use crate::https::http::Body;
use crate::https::server::{Next, Pull, Stream};
use crate::hub_protocol::BEHIND_WAIT;
use crate::locks::Recover;
use crate::selector::{FieldSelector, LabelSelector};
use crate::source::Resource;

/// How often an idle watcher with bookmarks is told the hub's version.
pub const BOOKMARK_EVERY: Duration = Duration::from_secs(60);
/// A watch without `timeoutSeconds` ends after this, up to twice this (random).
pub const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1800);
/// The longest `timeoutSeconds` taken.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// A held watch's commits fall on a grid of the hub's clock this fine at most (a sixth of
/// its wait; none under 1 s): a fleet's idle commits, however far apart its watches
/// began, go out together, one wake of the hub's loop for many, not one each.
pub const COMMIT_GRID: Duration = Duration::from_secs(5);
/// Objects or changes one pull looks at, at most (then it is cut, and pulled again once
/// the server has served the others).
pub const VISITS: usize = 2048;

/// What the hub serves now, and what changed before: one lock, so that a watch's state
/// and the changes after it are one view.
#[derive(Debug, Default)]
pub struct Timeline {
    /// The top view (`Views::top`): every client's, but during rollouts.
    pub held: Option<Arc<Held>>,
    /// During rollouts, the views below the top (`Views::cuts`).
    pub cuts: Vec<(f64, Arc<Held>)>,
    pub history: History,
}

impl Timeline {
    /// The view a client of cohort `h` is served (`views.rs`), and its place (0: the top).
    pub fn view(&self, h: f64) -> Option<(usize, Arc<Held>)> {
        let top = self.held.as_ref()?;
        Some(match self.cuts.iter().position(|(c, _)| h < *c) {
            Some(i) => (i + 1, self.cuts[i].1.clone()),
            None => (0, top.clone()),
        })
    }

    /// What it serves, as views.
    pub fn views(&self) -> Option<Views> {
        Some(Views {
            top: self.held.clone()?,
            cuts: self.cuts.clone(),
        })
    }
}

/// What a watch (or a list) selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    pub kind: Resource,
    pub namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    /// What `ask` selects.
    pub fn of(ask: &Ask) -> Filter {
        Filter {
            kind: ask.target.kind,
            namespace: ask.target.namespace.clone(),
            labels: ask.labels.clone(),
            fields: ask.fields.clone(),
        }
    }

    /// Every object of `kind` in `namespace` (`None`: all), no selector: what a collector
    /// follows (`fleet::collected`).
    pub fn namespace(kind: Resource, namespace: Option<&str>) -> Filter {
        Filter {
            kind,
            namespace: namespace.map(str::to_string),
            labels: LabelSelector::default(),
            fields: FieldSelector::default(),
        }
    }

    /// Whether it has no selector: all of its kind, in its namespace or all.
    pub fn plain(&self) -> bool {
        self.labels == LabelSelector::default() && self.fields == FieldSelector::default()
    }

    /// Whether it selects `o` (an object of its kind).
    pub fn passes(&self, o: &HeldObject) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == o.namespace)
            && self.labels.matches(|k| o.label(k))
            && self.fields.matches(&o.namespace, &o.name)
    }
}

enum Phase {
    /// A streaming list from a version the hub has not reached: waits until `until`.
    Behind {
        rv: u64,
        until: Instant,
    },
    /// Sending the state of `held`, from key `from` on; then the end bookmark if asked,
    /// then the changes from `then`.
    State {
        held: Arc<Held>,
        from: Option<String>,
        end_bookmark: Option<u64>,
        then: u64,
    },
    /// Sending the changes from place `seq`.
    Changes {
        seq: u64,
    },
    /// One event (an `ERROR`), then the end.
    Failed(Body),
    Done,
}

/// One watch.
pub struct Watch {
    timeline: Arc<RwLock<Timeline>>,
    filter: Filter,
    form: Form,
    phase: Phase,
    bookmarks: bool,
    next_bookmark: Instant,
    ends: Instant,
    /// The newest version the watcher was told (never goes back).
    told: u64,
    /// The newest version a `BOOKMARK` told it (or the version it watches from): it has
    /// every change up to it.
    committed: u64,
    /// What the watcher holds already, whose changes it is never sent: those not newer
    /// than the version it watches from (as the apiserver's watch), and those of the poll
    /// its state came from or before (a change still held back when the state was made,
    /// `history.rs`, is in the state).
    holds: (u64, u64),
    /// A follower's held watch: its next commit is due then (a bookmark alone if no
    /// change came), and each after it within its wait, the second (at least a second:
    /// a wait of 0 would be one a pull).
    commit_by: Option<(Instant, Duration)>,
    /// The watcher's cohort (`views.rs`): which view's state, and which changes, are its.
    cohort: f64,
}

impl Watch {
    /// A watch of what `ask` asks, on `timeline`, where every client is served alike.
    #[cfg(test)]
    pub fn start(timeline: Arc<RwLock<Timeline>>, ask: &Ask, rng: &mut Rng) -> Watch {
        Watch::start_for(timeline, ask, 0.0, rng)
    }

    /// A watch of what `ask` asks, on `timeline`, for a watcher of cohort `cohort`
    /// (`views.rs`).
    pub fn start_for(
        timeline: Arc<RwLock<Timeline>>,
        ask: &Ask,
        cohort: f64,
        rng: &mut Rng,
    ) -> Watch {
        let now = Instant::now();
        let filter = Filter::of(ask);
        let rv = (ask.resource_version.as_deref())
            .and_then(|r| r.parse::<u64>().ok())
            .unwrap_or(0);
        let initial = ask.watching.send_initial_events == Some(true);
        let ends = match ask.watching.timeout {
            Some(t) => now + t.min(MAX_TIMEOUT),
            None => now + MIN_REQUEST_TIMEOUT.mul_f64(1.0 + rng.unit()),
        };
        let mut w = Watch {
            timeline,
            filter,
            form: ask.form,
            phase: Phase::Done,
            bookmarks: ask.watching.bookmarks,
            next_bookmark: now + BOOKMARK_EVERY.mul_f64(0.5 + 0.5 * rng.unit()),
            ends,
            told: rv,
            committed: rv,
            holds: (rv, 0),
            commit_by: (ask.wait).map(|w| (next_commit(now, w), w.max(Duration::from_secs(1)))),
            cohort,
        };
        // The state first from no version or `0` (a streaming list's, which the
        // apiserver makes of a `watch=true` from there that says nothing of
        // `sendInitialEvents`: `request::ask`; or the legacy `/watch/` path's, ended by no
        // bookmark), or from any version for a streaming list; `sendInitialEvents=false`
        // from no version starts now.
        w.phase = match (ask.watching.send_initial_events, rv) {
            (Some(false), 0) => w.changes_now(),
            (_, 0) => w.state_now(initial),
            (Some(true), rv) => Phase::Behind {
                rv,
                until: now + BEHIND_WAIT,
            },
            (Some(false) | None, rv) => w.changes_from(rv),
        };
        // A version ahead of the hub's (the other hub behind a Service, or made up) is
        // not what the watcher has from this hub.
        let watermark = w.read().history.kind(w.filter.kind).watermark;
        w.committed = w.committed.min(watermark);
        w
    }

    /// What it selects.
    pub fn filter(&self) -> &Filter {
        &self.filter
    }

    /// The newest version a `BOOKMARK` gave the watcher (or the version it watched from):
    /// what a follower's held watch has committed.
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Whether it waits for the hub to reach its version (the hub's next poll should
    /// wake it).
    pub fn behind(&self) -> bool {
        matches!(self.phase, Phase::Behind { .. })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Timeline> {
        self.timeline.read().recover()
    }

    /// The state now, to be sent first (then, for a streaming list, `initial`, its
    /// bookmark).
    fn state_now(&mut self, initial: bool) -> Phase {
        let timeline = self.timeline.clone();
        let t = timeline.read().recover();
        let kept = t.history.kind(self.filter.kind);
        let Some((_, held)) = t.view(self.cohort) else {
            return Phase::Failed(not_ready());
        };
        self.holds.1 = held.poll;
        Phase::State {
            held,
            from: None,
            end_bookmark: (initial && self.bookmarks).then_some(kept.watermark),
            then: kept.end(),
        }
    }

    /// The changes from now on.
    fn changes_now(&self) -> Phase {
        let t = self.read();
        if t.held.is_none() {
            return Phase::Failed(not_ready());
        }
        Phase::Changes {
            seq: t.history.kind(self.filter.kind).end(),
        }
    }

    fn changes_from(&self, rv: u64) -> Phase {
        let t = self.read();
        match t.history.kind(self.filter.kind).from(rv) {
            Start::Seq(seq) => Phase::Changes { seq },
            Start::TooOld(oldest) => Phase::Failed(
                StatusError::expired(format!("too old resource version: {rv} ({oldest})")).event(),
            ),
        }
    }

    /// A `BOOKMARK` at `rv` (annotated as the end of the initial events, if `end`).
    fn bookmark(&self, rv: u64, end: bool) -> Body {
        let (kind, api) = match self.form {
            Form::Full => (self.filter.kind.kind(), "v1"),
            Form::Metadata => ("PartialObjectMetadata", "meta.k8s.io/v1"),
        };
        let annotations = if end {
            ",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}"
        } else {
            ""
        };
        let object = format!(
            "{{\"kind\":\"{kind}\",\"apiVersion\":\"{api}\",\"metadata\":{{\"resourceVersion\":\"{rv}\"{annotations}}}}}"
        );
        event::frame("BOOKMARK", object.as_bytes())
    }

    /// The state's `ADDED` events, as far as `room` goes.
    fn pull_state(&mut self, out: &mut Chunks, room: usize) -> bool {
        let Phase::State {
            held,
            from,
            end_bookmark,
            then,
        } = &mut self.phase
        else {
            return true;
        };
        let f = &self.filter;
        let mut stopped = None;
        let objects: Box<dyn Iterator<Item = &Arc<HeldObject>>> =
            match (f.namespace.as_deref(), f.fields.exact_name()) {
                // A watch of one object (a name in a namespace) looks at that one.
                (Some(ns), Some(name)) => Box::new(held.get(f.kind, ns, name).into_iter()),
                (ns, _) => Box::new(held.objects_from(f.kind, ns, from.as_deref())),
            };
        for (visited, o) in objects.enumerate() {
            // A pull's work is bounded by what it looks at, not only what it sends: a
            // selector that matches nothing must not scan every object in one go.
            if out.size >= room || visited >= VISITS {
                stopped = Some(o.key());
                break;
            }
            if f.passes(o) {
                out.push(render::event(f.kind, self.form, Type::Added, o));
                self.told = self.told.max(o.resource_version.parse().unwrap_or(0));
            }
        }
        if let Some(key) = stopped {
            // Next time from this one on.
            *from = Some(key);
            return false;
        }
        let (end, then) = (*end_bookmark, *then);
        if let Some(rv) = end {
            out.push(self.bookmark(rv, true));
            self.told = self.told.max(rv);
            self.committed = self.committed.max(rv);
        }
        self.phase = Phase::Changes { seq: then };
        true
    }

    /// The changes from its place, as far as `room` goes; `None` when it fell behind the
    /// history.
    fn pull_changes(&mut self, out: &mut Chunks, room: usize, now: Instant) -> Option<bool> {
        let Phase::Changes { seq } = &mut self.phase else {
            return Some(true);
        };
        let t = self.timeline.read().recover();
        let kept = t.history.kind(self.filter.kind);
        let f = &self.filter;
        for (visited, c) in kept.after(*seq)?.enumerate() {
            if out.size >= room || visited >= VISITS {
                return Some(false);
            }
            *seq = c.seq + 1;
            if c.rv <= self.holds.0 || c.poll <= self.holds.1 || !c.band.has(self.cohort) {
                continue;
            }
            if let Some(e) = c.event(f.kind, self.form, |o| f.passes(o)) {
                out.push(e);
                self.told = self.told.max(c.rv);
            }
        }
        // Everything up to the watermark is here: a bookmark may say so.
        let watermark = kept.watermark;
        drop(t);
        if let Some((by, hold)) = self.commit_by
            && (!out.chunks.is_empty() || now >= by)
        {
            // A follower's change is complete (or its wait is over): the bookmark commits
            // it, and the watch waits for the next.
            let rv = self.told.max(watermark);
            out.push(self.bookmark(rv, false));
            self.told = rv;
            // What it has of this hub: up to its version (a version it was told past it,
            // its own, is not had from here).
            self.committed = self.committed.max(watermark);
            self.commit_by = Some((next_commit(now, hold), hold));
            return Some(true);
        }
        Some(self.maybe_bookmark(out, watermark, now))
    }

    fn maybe_bookmark(&mut self, out: &mut Chunks, watermark: u64, now: Instant) -> bool {
        // A follower's held watch is told the hub's version at each commit, its wait
        // apart at most: a minute's bookmark between would be one write more per follower
        // whenever changes not its own moved the hub on (a rollout's steps: each
        // follower outside a step, once a minute, alone).
        let due = (now >= self.next_bookmark && self.commit_by.is_none()) || now >= self.ends;
        if self.bookmarks && due && watermark > self.told {
            out.push(self.bookmark(watermark, false));
            self.told = watermark;
            self.committed = self.committed.max(watermark);
        }
        if now >= self.next_bookmark {
            self.next_bookmark = now + BOOKMARK_EVERY;
        }
        true
    }
}

/// What one pull gives.
#[derive(Default)]
struct Chunks {
    chunks: Vec<Body>,
    size: usize,
}

impl Chunks {
    fn push(&mut self, b: Body) {
        self.size += b.len();
        self.chunks.push(b);
    }
}

fn not_ready() -> Body {
    StatusError::unavailable("cmpoll serve is not ready: no complete poll yet", 1).event()
}

impl Stream for Watch {
    fn pull(&mut self, now: Instant, room: usize) -> Pull {
        let mut out = Chunks::default();
        for _ in 0..4 {
            match &self.phase {
                Phase::Failed(e) => {
                    out.push(e.clone());
                    self.phase = Phase::Done;
                }
                Phase::Done => {
                    return Pull {
                        chunks: out.chunks,
                        next: Next::End,
                    };
                }
                Phase::Behind { rv, until } => {
                    let (rv, until) = (*rv, *until);
                    let watermark = self.read().history.kind(self.filter.kind).watermark;
                    if watermark >= rv {
                        self.phase = self.state_now(true);
                    } else if now >= until {
                        let current = watermark;
                        self.phase = Phase::Failed(
                            StatusError::too_large_resource_version(rv, current).event(),
                        );
                    } else {
                        return Pull {
                            chunks: out.chunks,
                            next: Next::At(until),
                        };
                    }
                }
                Phase::State { .. } => {
                    if !self.pull_state(&mut out, room) {
                        return cut(out, now);
                    }
                }
                Phase::Changes { .. } => {
                    match self.pull_changes(&mut out, room, now) {
                        // Too slow: the history went on without it.
                        None => self.phase = Phase::Done,
                        Some(false) => return cut(out, now),
                        Some(true) if now >= self.ends => self.phase = Phase::Done,
                        Some(true) => {
                            // A held watch wakes for no minute's bookmark, but one whose
                            // wait is longer is still pulled every minute: each pull is a
                            // sighting of its follower (`fleet::state`, which may drop one
                            // when busy), and a follower silent past its wait is gone.
                            let minute = match self.commit_by {
                                None => self.bookmarks,
                                Some((_, hold)) => hold > BOOKMARK_EVERY,
                            };
                            let next = if minute {
                                self.next_bookmark.min(self.ends)
                            } else {
                                self.ends
                            };
                            let next = self.commit_by.map_or(next, |(by, _)| by.min(next));
                            return Pull {
                                chunks: out.chunks,
                                next: Next::At(next),
                            };
                        }
                    }
                }
            }
        }
        cut(out, now)
    }
}

/// When a held watch of wait `hold` next commits, from `now`: `now + hold`, brought back
/// to the last point of `COMMIT_GRID`'s grid (never later: the wait is the longest between
/// two bookmarks, `hub_protocol::WAIT_HEADER`).
fn next_commit(now: Instant, hold: Duration) -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let at = now + hold;
    let grid = (hold / 6).min(COMMIT_GRID).as_nanos();
    if grid < Duration::from_secs(1).as_nanos() {
        return at;
    }
    let epoch = *EPOCH.get_or_init(Instant::now);
    let past = at.saturating_duration_since(epoch).as_nanos() % grid;
    at - Duration::from_nanos(past as u64)
}

/// A pull cut short by its room: more as soon as this is out.
fn cut(out: Chunks, now: Instant) -> Pull {
    Pull {
        chunks: out.chunks,
        next: Next::At(now),
    }
}

#[cfg(test)]
mod tests;
