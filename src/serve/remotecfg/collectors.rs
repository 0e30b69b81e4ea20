//! What the hub keeps of each collector (`Collectors`, at most `MAX_COLLECTORS`): told apart
//! by who it is (its token's follower name: `NAMESPACE/POD`, else its user name) and the id
//! it gives, since an id is the collector's own word and two identities may give the same
//! one. Kept: its name and attributes (as it last registered or asked), the modules it was
//! last sent (their versions, under the text's hash), those it last confirmed (`APPLIED` for
//! a hash it was sent), and its last status with the hash it was reported for — Alloy sends
//! a status once, when it changes, so the hub must remember `FAILED for H`.
//!
//! A `FAILED` is about the module versions of the text it names that the collector had not
//! confirmed: Alloy loads a text all or nothing and keeps what it ran, so one of those is
//! what it refused — the ones whose lines Alloy's diagnostics point into (the `LINE:COL:`
//! that opens each diagnostic, never one inside a message), all of them when none has a
//! position, none when they point elsewhere. None either for a `FAILED` of the text it
//! runs, or in Connect's words (`unavailable: …`): Alloy's own fetch failing, not a
//! refusal. What the fleet is told of it (`fleet::collected::Word`) is made here too. A status's message is kept `printable` (its control characters escaped, so that
//! neither `/status` nor the log shows a forged line) and cut to `KEPT_MESSAGE`; every word
//! of a collector's in a log line is so too. Only ConfigMaps and the root are ever sent, so
//! the message is kept as a ConfigMap's refusal is (`reason::redacted` hides a Secret's
//! only). `UnregisterCollector` forgets one. A `FAILED` is a line of the log at `info`, at
//! most `LINES_BURST` at once and one a minute per identity (the others at `debug`).
//!
//! What each call says the collector runs, and what the fleet is told of it, is
//! `runs.rs`. The module lists of the texts they hold are kept once each however many hold them,
//! `lists::MAX_LIST_BYTES` together (`lists.rs`). The map is bounded (`shares.rs`): `MAX_COLLECTORS` collectors holding `MAX_KEPT_BYTES`
//! together, each identity at most `IDENTITY_COLLECTORS` of them holding `IDENTITY_BYTES`.
//! An identity over its share forgets its own collector heard from longest ago; a full map
//! makes room from the identity that holds the most, so a token cycling ids evicts its own
//! collectors, not another identity's that holds no more than it does.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use self::lists::Lists;
use self::shares::{Bounds, Shares};
use super::compose::Composition;
use super::messages::{Attributes, Reported, Status};
use crate::locks::Recover;
use crate::serve::fleet::collected::{Change, Word};
use crate::serve::fleet::intake::Holding;
use crate::serve::kept::Budgets;

/// Collectors kept, at most.
pub const MAX_COLLECTORS: usize = 10_000;

/// What the collectors kept hold together, at most (`weight`: their words — id, identity,
/// name, attributes, status, refused modules — and `ENTRY` each).
pub const MAX_KEPT_BYTES: usize = 32 << 20;

/// One identity's share of the collectors and of their bytes: a token shared by a fleet
/// (one without a pod's name) is one identity; a pod's token is one of its own.
pub const IDENTITY_COLLECTORS: usize = 2_500;
pub const IDENTITY_BYTES: usize = MAX_KEPT_BYTES / 4;

/// A collector's fixed part, counted in its weight: the map's entry, its strings' headers.
const ENTRY: usize = 512;

/// An attribute's or a refused module's own part, beside its bytes.
const ITEM: usize = 64;

/// The bounds of the map.
const BOUNDS: Bounds = Bounds {
    entries: MAX_COLLECTORS,
    bytes: MAX_KEPT_BYTES,
    identity_entries: IDENTITY_COLLECTORS,
    identity_bytes: IDENTITY_BYTES,
};

/// Failed collectors `/status` names, at most.
const SHOWN: usize = 20;

/// A status's message, kept at most.
pub const KEPT_MESSAGE: usize = 1024;

pub use crate::serve::fleet::collected::{Version, Versions};

/// A text sent: its hash, its modules and the lines each takes in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    pub hash: String,
    pub modules: Versions,
    pub spans: Arc<[(usize, usize)]>,
}

/// One collector, as kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collector {
    pub name: String,
    pub attributes: Attributes,
    /// The text it was last sent.
    pub sent: Option<Sent>,
    /// The last text it confirmed (`APPLIED`).
    pub applied: Option<Sent>,
    /// Its last status, and the hash it was reported for.
    pub status: Option<(Reported, String)>,
    /// With a `FAILED`: the module versions it refused.
    pub refused: Vec<Version>,
    pub registered: bool,
    /// The hub's version when `sent` was last its answer (sent, or `not_modified`).
    pub answered: u64,
    /// When its last `GetConfig` came.
    pub called: Option<Instant>,
    /// The text its last `FAILED`'s exceptions were made for.
    pub failed_for: Option<String>,
    /// What the fleet was not told yet (past its budget): told with the next word.
    pub untold: Option<Word>,
    /// When the fleet was last told the namespaces it follows.
    pub followed: Option<Instant>,
}

/// `FAILED` lines one identity may have logged at `info`: a burst of `LINES_BURST`, then
/// one a minute; past it they go to `debug` (each is on `/status` all the same), so a
/// token sending a new message at every call does not flood the log.
const LINES_BURST: f64 = 5.0;
const LINES_RATE: f64 = 1.0 / 60.0;

/// Every collector kept, by (identity, id); and what each identity may log.
pub struct Collectors {
    kept: Mutex<(Shares<Collector>, Lists)>,
    lines: Mutex<Budgets<Box<str>>>,
}

impl Default for Collectors {
    fn default() -> Collectors {
        Collectors {
            kept: Mutex::new((Shares::new(BOUNDS), Lists::default())),
            lines: Mutex::new(Budgets::new(LINES_RATE, LINES_BURST, MAX_COLLECTORS)),
        }
    }
}

/// What collector (`who`, `id`) holds, about.
fn weight(who: &str, id: &str, c: &Collector) -> usize {
    let attributes: usize = (c.attributes.iter())
        .map(|(k, v)| ITEM + k.len() + v.len())
        .sum();
    let status = (c.status.as_ref()).map_or(0, |(r, hash)| r.message.len() + hash.len());
    let refused: usize = c.refused.iter().map(|v| ITEM + v.key.len()).sum();
    let untold: usize = (c.untold.iter())
        .map(|w| {
            let namespaces = w.namespaces.iter().flatten().map(|n| ITEM + n.len());
            let holds = match &w.change {
                Some(Change::Failed(h)) => h.iter().map(Holding::bytes).sum(),
                _ => 0,
            };
            namespaces.sum::<usize>() + holds
        })
        .sum();
    ENTRY + 2 * (who.len() + id.len()) + c.name.len() + attributes + status + refused + untold
}

/// What a `GetConfig` said, and what it was answered.
#[derive(Clone, Copy)]
pub struct Asked<'a> {
    pub attributes: &'a Attributes,
    /// The hash it echoed.
    pub hash: &'a str,
    pub status: Option<&'a Reported>,
    /// What it is sent now (`None`: not yet known, or the call is refused: its status is
    /// taken all the same, since Alloy sends one only once).
    pub sent: Option<&'a Composition>,
    /// The hub's version of the view `sent` was made of.
    pub at: u64,
}

impl Collector {
    /// The texts it holds (their module lists kept in `Lists`).
    fn texts(&self) -> impl Iterator<Item = &Sent> {
        self.sent.iter().chain(self.applied.iter())
    }

    /// `status` for `hash` kept; `Some`: it changed.
    fn said(&mut self, status: Reported, hash: &str) -> Option<(Reported, String)> {
        let now = (status, hash.to_string());
        if self.status.as_ref() == Some(&now) {
            return None;
        }
        self.status = Some(now.clone());
        Some(now)
    }
}

/// The log line of a status a collector of `who` with `id` reported (`refused`: module
/// versions it refused): every word of the collector's own (its id, the hash it echoed,
/// Alloy's message) and of its token's (`who`) made `printable` and cut, so that none
/// forges a line or colours a terminal.
fn told(
    (who, id): (&str, &str),
    (r, hash): &(Reported, String),
    refused: usize,
) -> (log::Level, String) {
    let who = crate::reason::shown(who, 256);
    let id = crate::reason::shown(id, 64);
    let hash = crate::reason::shown(hash, 16);
    match r.status {
        Status::Failed => (
            log::Level::Info,
            format!(
                "--remotecfg: collector {id} of {who} failed to apply {hash} ({refused} module versions new to it): {}",
                crate::reason::shown(&r.message, 256)
            ),
        ),
        s => (
            log::Level::Debug,
            format!("--remotecfg: collector {id} of {who}: {} {hash}", s.word()),
        ),
    }
}

impl Collectors {
    /// `RegisterCollector`.
    pub fn register(&self, who: &str, id: &str, name: &str, attributes: &Attributes, now: Instant) {
        self.with(who, id, now, |c| {
            c.name = name.to_string();
            c.attributes = attributes.clone();
            c.registered = true;
        });
    }

    /// A `GetConfig` (`asked`), its status taken about the text it echoes the hash of;
    /// the level of the line that said it changed, if it did, and what the fleet is told.
    ///
    /// A call that echoes the hash of the text it is answered now says the collector runs
    /// that text (`Word::at`, `Change::Applied` the first time) unless its last status is
    /// a `FAILED`: Alloy sends a status only when it changes, so after a first `APPLIED`
    /// each text it runs is told by its hash alone, and a hub that never heard its status
    /// (restarted, or the other hub behind a Service) takes the hash it echoes.
    pub fn asked(
        &self,
        who: &str,
        id: &str,
        asked: Asked<'_>,
        now: Instant,
    ) -> (Option<log::Level>, Word) {
        let status = asked
            .status
            .filter(|s| s.status != Status::Unset)
            .map(|s| Reported {
                status: s.status,
                message: crate::reason::shown(&s.message, KEPT_MESSAGE),
            });
        let mut said = None;
        let mut word = Word::default();
        self.with(who, id, now, |c| {
            if c.attributes != *asked.attributes {
                c.attributes = asked.attributes.clone();
            }
            // What the fleet was not told: told now, unless this call says newer.
            let untold = c.untold.take().unwrap_or_default();
            if let Some(s) = status {
                let (changed, w) = c.take(s, asked.hash);
                said = changed.map(|s| (s, c.refused.len()));
                word = w;
            }
            if let Some(sent) = asked.sent {
                c.answered_with(sent, (asked.hash, asked.at), now, &mut word);
            }
            word.namespaces = word.namespaces.take().or(untold.namespaces);
            word.change = word.change.take().or(untold.change);
        });
        let Some((said, refused)) = said else {
            return (None, word);
        };
        let (mut level, line) = told((who, id), &said, refused);
        if level == log::Level::Info
            && (self.lines.lock().recover().take(&Box::from(who), now)).is_err()
        {
            level = log::Level::Debug;
        }
        log::log!(level, "{line}");
        (Some(level), word)
    }

    /// What the fleet did not take of `word` (past its budget), told with the next word of
    /// collector (`who`, `id`), if it is still kept.
    pub fn untold(&self, who: &str, id: &str, word: Word, now: Instant) {
        self.with(who, id, now, |c| {
            c.untold = Some(Word {
                at: None,
                wait: None,
                ..word
            });
        });
    }

    /// `UnregisterCollector`.
    pub fn forget(&self, who: &str, id: &str) {
        let (shares, lists) = &mut *self.kept.lock().recover();
        if let Some(c) = shares.remove(&(who.to_string(), id.to_string())) {
            c.texts().for_each(|s| lists.give_back(&s.modules));
        }
    }

    /// One collector, as kept.
    #[cfg(test)]
    pub fn get(&self, who: &str, id: &str) -> Option<Collector> {
        (self.kept.lock().recover().0)
            .get(&(who.to_string(), id.to_string()))
            .cloned()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept.lock().recover().0.len()
    }

    /// The bytes of the module lists kept.
    #[cfg(test)]
    pub fn list_bytes(&self) -> usize {
        self.kept.lock().recover().1.bytes()
    }

    /// What `/status` says of them: how many, how many run what they were last sent
    /// (`applied`), and the first `SHOWN` by (identity, id) whose last status is `failed`:
    /// the collector, its id, the hash, the modules it refused (none: Alloy's own fetch
    /// failed) and Alloy's words. Under the lock only a walk and a partial sort by the key
    /// the map already holds, and `SHOWN` of them copied; the page is made after it.
    pub fn status(&self) -> serde_json::Value {
        type Shown = (String, String, String, Vec<Box<str>>, String);
        let (collectors, applied, count, shown) = {
            let guard = self.kept.lock().recover();
            let kept = &guard.0;
            let mut applied = 0;
            let mut failed: Vec<(&(String, String), &Collector)> = Vec::new();
            for (key, c) in kept.iter() {
                let Some((r, hash)) = &c.status else { continue };
                match r.status {
                    Status::Applied if c.sent.as_ref().is_some_and(|s| s.hash == *hash) => {
                        applied += 1
                    }
                    Status::Failed => failed.push((key, c)),
                    _ => {}
                }
            }
            let count = failed.len();
            if failed.len() > SHOWN {
                failed.select_nth_unstable_by(SHOWN, |a, b| a.0.cmp(b.0));
                failed.truncate(SHOWN);
            }
            failed.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let shown: Vec<Shown> = (failed.into_iter())
                .filter_map(|((who, id), c)| {
                    let (r, hash) = c.status.as_ref()?;
                    let modules = c.refused.iter().map(|v| v.key.clone()).collect();
                    Some((
                        who.clone(),
                        id.clone(),
                        hash.clone(),
                        modules,
                        r.message.clone(),
                    ))
                })
                .collect();
            (kept.len(), applied, count, shown)
        };
        let failed: Vec<serde_json::Value> = (shown.into_iter())
            .map(|(who, id, hash, modules, message)| {
                serde_json::json!({
                    "collector": who, "id": id, "hash": hash, "modules": modules,
                    "message": message,
                })
            })
            .collect();
        serde_json::json!({
            "collectors": collectors, "applied": applied, "failedCount": count, "failed": failed,
        })
    }

    /// Changes collector (`who`, `id`), made if new (room made as `Shares` makes it).
    fn with(&self, who: &str, id: &str, now: Instant, change: impl FnOnce(&mut Collector)) {
        let new = || Collector {
            name: String::new(),
            attributes: Attributes::new(),
            sent: None,
            applied: None,
            status: None,
            refused: Vec::new(),
            registered: false,
            answered: 0,
            called: None,
            failed_for: None,
            untold: None,
            followed: None,
        };
        let key = (who.to_string(), id.to_string());
        let (shares, lists) = &mut *self.kept.lock().recover();
        let change = |c: &mut Collector| {
            let before: Vec<Sent> = c.texts().cloned().collect();
            change(c);
            // The texts held now taken (a list already held is found), then the former
            // given back.
            for s in [&mut c.sent, &mut c.applied].into_iter().flatten() {
                if !lists.take(&s.modules) {
                    (s.modules, s.spans) = (Arc::new([]), Arc::new([]));
                }
            }
            before
        };
        let (before, gone) = shares.change(key, now, new, change, |c| weight(who, id, c));
        let given = (before.iter()).chain(gone.iter().flat_map(Collector::texts));
        given.for_each(|s| lists.give_back(&s.modules));
    }
}

mod lists;
mod runs;
mod shares;
#[cfg(test)]
mod tests;
