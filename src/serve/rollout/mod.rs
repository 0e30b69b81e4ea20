//! `cmpoll serve --rollout STEPS` (issue 60): a new version of a selected object reaches
//! the clients of a first step (a cohort: `views::cohort` of their names below the step's
//! threshold), the next step once every follower of this one holds it and the step's wait
//! has passed, and so on to every client; any follower's refusal refuses it for the whole
//! fleet, which is then served the last good version, held back (`cmpoll.io/held-back`),
//! as a refusal by the hub's own `--validate`. docs/serve.md ("Rolling out a change") is
//! the user's account.
//!
//! The state of every rollout lives in the cluster, in a Secret the hubs write with the
//! apiserver's optimistic concurrency (`store.rs`; what it holds: `record.rs`), so that two
//! hubs behind one Service, and a hub restarted, serve the same step: each hub reads it at
//! its turns, makes the same decisions (`plan.rs`) and writes them with its votes (what
//! its own followers of each step hold: `fleet::gate`); a step advances once every live
//! hub voted that its followers hold it. What a hub serves is what the record says: a
//! version is served to a cohort only once the record that puts it there was read or
//! written; when the Secret cannot be read or written, nothing advances and nothing new
//! is served (the rollout holds where it is), and a hub that never read it serves nothing.
//!
//! Each object's version per cohort is `pieces.rs`; a cohort whose version changes is
//! served it at the version of the poll that applies the change, which must be newer than
//! anything the hub told its watchers: a hub that learns of a change writes the Secret
//! (its beat) and applies it at a poll that lists past that write.

mod lookups;
pub mod pieces;
pub mod plan;
pub mod record;
pub mod shown;
pub mod steps;
pub mod store;
mod turn;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::pieces::Pieces;
use self::record::Record;
use self::steps::Settings;
use self::store::{Store, Stored};
use super::held::HeldObject;

/// How often a hub writes its beat while a rollout runs, at least.
pub const BEAT: Duration = Duration::from_secs(10);
/// A hub whose beat has not moved for this long is gone: its votes no longer count.
pub const HUB_GONE: Duration = Duration::from_secs(30);
/// A gone hub's entry is removed from the record after this long.
pub const HUB_FORGOTTEN: Duration = Duration::from_secs(600);
/// How long an object deleted is remembered (a recreation with the same content is the
/// version every client was served, not a new one).
pub const DELETED_KEPT: Duration = Duration::from_secs(600);
/// How often a hub asks its rollouts' gates when nothing else moved.
pub const DECIDE_EVERY: Duration = Duration::from_secs(2);
/// How often a hub with nothing rolling reads the record (to learn of another hub's
/// rollouts).
pub const READ_IDLE: Duration = Duration::from_secs(5);

/// The rollouts as one hub runs them.
pub struct Rollouts {
    settings: Settings,
    /// This hub's name in the record.
    me: String,
    store: Box<dyn Store>,
    /// The Secret as last read or written.
    state: State,
    /// What each object told apart is served, per cohort, by id.
    tracked: BTreeMap<String, Pieces>,
    clock: Clock,
    /// Whether a turn has published views (before: every object is as it is).
    published: bool,
    /// The resourceVersion of this hub's last write.
    fence: u64,
    /// What was said once (dropped entries, bad annotations).
    said: HashSet<String>,
    /// Why the Secret could not be read or written, last time.
    error: Option<String>,
    /// The decisions written since the last turn ended (`turn::Turn::wrote`).
    wrote: Vec<&'static str>,
}

/// The Secret as last read or written.
#[derive(Default)]
struct State {
    /// As the apiserver answered (`None`: never read).
    stored: Option<Stored>,
    /// Its record.
    record: Record,
    /// Each rolling or refused object's stable version, read from it: (its hash, the
    /// object).
    stables: HashMap<String, (String, Arc<HeldObject>)>,
}

/// What this hub saw, by its own clock: when it read and wrote, when it saw each other
/// hub's beat move and each rollout's current step begin, and what was deleted a moment
/// ago.
struct Clock {
    beats: HashMap<String, (u64, Instant)>,
    started: Instant,
    last_write: Option<Instant>,
    last_read: Option<Instant>,
    last_decide: Option<Instant>,
    /// `DECIDE_EVERY` (tests turn faster).
    decide_every: Duration,
    /// By id: the rollout's version and step, and when this hub first saw that step.
    steps_seen: HashMap<String, (String, usize, Instant)>,
    /// By id: an object served and then gone, and when (a recreation with the same
    /// content is not new).
    deleted: HashMap<String, (Arc<HeldObject>, Instant)>,
}

impl Rollouts {
    /// Rollouts with `settings`, for the hub named `me`, kept in `store`.
    pub fn new(settings: Settings, me: String, store: Box<dyn Store>) -> Rollouts {
        Rollouts {
            settings,
            me,
            store,
            state: State::default(),
            tracked: BTreeMap::new(),
            clock: Clock {
                beats: HashMap::new(),
                started: Instant::now(),
                last_write: None,
                last_read: None,
                last_decide: None,
                decide_every: DECIDE_EVERY,
                steps_seen: HashMap::new(),
                deleted: HashMap::new(),
            },
            published: false,
            fence: 0,
            said: HashSet::new(),
            error: None,
            wrote: Vec::new(),
        }
    }

    /// Why the state cannot be read or written now (for readiness while it was never
    /// read, and for `/status`).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// What `/status` says of the rollouts (`shown::status`).
    pub fn status(&self) -> serde_json::Value {
        let state = shown::State {
            secret: self.store.describe(),
            read: self.state.stored.is_some(),
            error: self.error.clone(),
            hub: self.me.clone(),
            wait: self.settings.wait,
        };
        shown::status(&self.state.record, &state)
    }

    /// What the hub tells the authors of refused versions (`shown::notices`).
    pub fn notices(&self, served: &super::held::Held) -> Vec<super::telling::Notice> {
        shown::notices(&self.state.record, served)
    }

    /// Says `what` once at warning.
    fn say_once(&mut self, what: String) {
        if self.said.len() < 1024 && self.said.insert(what.clone()) {
            log::warn!("--rollout: {what}");
        }
    }
}

#[cfg(test)]
mod tests;
