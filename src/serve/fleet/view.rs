//! The fleet's state per served object, read off the followers' scopes and exceptions
//! (`state.rs`) against what the hub serves now (`Held`): for each object some follower
//! follows, its served version, how many followers hold each version, and each
//! follower's state — `current` (its watch has the served version, or it reported
//! holding it), `updating` (not yet, for less than two of its waits since the hub serves
//! this one), `behind` (for longer), `refused` (it reported its `--validate` or its agent
//! refused the served version), `gone` (silent past its wait and a margin:
//! `Fleet::gone`); a follower's reported exception about an object stands in place of
//! what its watch says, in that order of precedence: gone, refused, current, behind,
//! updating. A follower follows the objects its scopes select (its watch's namespace and
//! selectors: one whose own `--keys` select nothing of an object holds that version of
//! it, empty). Names are shown up to `SHOWN`, refusals up to `SHOWN_REFUSALS`, each with
//! a count of the rest. Also each follower's own state (its worst over its objects) for
//! `/metrics`. `Fleet::objects` (`tally.rs`, how it is made, and what it costs) is what
//! an Event per object and version is written from (`Which::Refused`: only what it needs).

use std::time::Instant;

use super::state::Fleet;
use crate::serve::held::Held;

/// Names shown per list (behind, gone) at most.
pub const SHOWN: usize = 5;
/// Refusals shown per object at most.
pub const SHOWN_REFUSALS: usize = 10;

/// Object visits one view makes at most, matching its followers' filters and counting
/// their classes (some 4 million: a fleet of 10,000 objects on a few selectors uses a
/// hundredth of it).
pub const MATCHES: usize = 1 << 22;

/// A follower's state about one object, or its own (its worst).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Current,
    Updating,
    Behind,
    Refused,
    Gone,
}

impl State {
    pub const ALL: [State; 5] = [
        State::Current,
        State::Updating,
        State::Behind,
        State::Refused,
        State::Gone,
    ];

    pub fn word(self) -> &'static str {
        match self {
            State::Current => "current",
            State::Updating => "updating",
            State::Behind => "behind",
            State::Refused => "refused",
            State::Gone => "gone",
        }
    }
}

/// Followers per state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub current: usize,
    pub updating: usize,
    pub behind: usize,
    pub refused: usize,
    pub gone: usize,
}

impl Counts {
    fn slot(&mut self, s: State) -> &mut usize {
        match s {
            State::Current => &mut self.current,
            State::Updating => &mut self.updating,
            State::Behind => &mut self.behind,
            State::Refused => &mut self.refused,
            State::Gone => &mut self.gone,
        }
    }

    pub(super) fn add(&mut self, s: State) {
        self.add_n(s, 1);
    }

    pub(super) fn add_n(&mut self, s: State, n: usize) {
        *self.slot(s) += n;
    }

    pub(super) fn sub(&mut self, s: State) {
        let n = self.slot(s);
        *n = n.saturating_sub(1);
    }

    pub fn get(&self, s: State) -> usize {
        match s {
            State::Current => self.current,
            State::Updating => self.updating,
            State::Behind => self.behind,
            State::Refused => self.refused,
            State::Gone => self.gone,
        }
    }
}

/// One follower's refusal of the served version, as shown.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Refused {
    pub follower: String,
    pub by: &'static str,
    pub reason: String,
}

/// Some names, and how many more there are.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Names {
    pub names: Vec<String>,
    pub more: usize,
}

/// A version and how many followers hold it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Version {
    /// `None`: they hold none (a new module they refused).
    pub hash: Option<String>,
    pub followers: usize,
}

/// The fleet's state of one served object.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Object {
    /// `configmap`, `secret`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// The version the hub serves.
    pub served: String,
    pub counts: Counts,
    /// Each version held, most held first.
    pub versions: Vec<Version>,
    pub refused: Vec<Refused>,
    #[serde(rename = "refusedMore")]
    pub refused_more: usize,
    pub behind: Names,
    pub gone: Names,
}

/// The fleet's state.
#[derive(Debug, Default)]
pub struct View {
    pub objects: Vec<Object>,
    pub totals: Counts,
    /// Followers left out by the view's budget (`MATCHES`).
    pub unread: usize,
}

/// Which objects a view reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// Every object some follower follows.
    All,
    /// Only those whose served version some follower refused (what the Events tell).
    Refused,
}

impl Fleet {
    /// The `fleet` section of the hub's `/status`.
    pub fn status(&self, held: Option<&Held>, now: Instant) -> serde_json::Value {
        let (kept, bytes) = self.size();
        let truncated = (self.read(now).map.values())
            .filter(|f| f.truncated)
            .count();
        let v = match held {
            Some(h) => self.view(h, now, Which::All),
            None => View::default(),
        };
        serde_json::json!({
            "followers": kept,
            "bytes": bytes,
            "truncated": truncated,
            "unread": v.unread,
            "states": v.totals,
            "objects": v.objects,
        })
    }
}

#[cfg(test)]
mod tests;
