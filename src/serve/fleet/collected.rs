//! A collector's word (`--remotecfg`: Alloy's `remotecfg` block) taken into the fleet as a
//! follower's report is: SPEC's "a collector's `FAILED` is a refusal and `APPLIED` a
//! confirmation, as a follower's report".
//!
//! A collector is a follower of the fleet under the name its token gives a follower
//! (`follower_name`: its pod, else its user name), so its cohort is the one its texts were
//! made for. It follows the ConfigMaps of each namespace it is sent modules of (a scope
//! each, without selector: past `COLLECTOR_SCOPES` namespaces, one of all ConfigMaps) —
//! so a caller sent no module follows nothing and holds no step; a module of such a
//! namespace whose `cmpoll.io/collectors` leaves it out counts it all the same, holding
//! what the hub serves — as far as the hub's version of the last text it runs
//! (`Word::at`: the text it was sent, echoed). What it says changes its exceptions:
//! - `Applied(text)`: it runs `text`. Its exceptions go, but a refusal of a module the text
//!   holds stays (it holds the text's version and refuses the one it refused): a follower
//!   keeps saying what it refused while it holds back, and collectors sharing one token
//!   are one follower, so one that runs a version does not take back another's refusal.
//! - `Failed(holdings)`: each module version of the text it did not run (Alloy loads a
//!   text all or nothing and runs on what it ran) is an exception — it holds the version it
//!   ran, or none — and those Alloy refused carry the refusal (`By::Confirm`, Alloy's
//!   words), made by `remotecfg::collectors`.
//!
//! A rollout's gate (`gate.rs`) so counts a collector in a step as it counts a follower:
//! holding the step's version once a text with it runs, refusing it once Alloy fails it.

use std::sync::Arc;
use std::time::Instant;

use super::intake::Holding;
pub use super::intake::{Version, Versions};
use super::state::{Fleet, MAX_SCOPES, Scope};
use crate::hub_protocol::MAX_REPORT_MODULES;
use crate::serve::watch::Filter;
use crate::source::Resource;

/// What a collector's call changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// It runs a text of these versions.
    Applied(Versions),
    /// It did not run the text it was sent: the exceptions it makes (`Holding`s of
    /// ConfigMaps, in key order).
    Failed(Vec<Holding>),
}

/// What the fleet is told of one collector's call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Word {
    /// The hub's version up to which it holds what it is served, when it moved.
    pub at: Option<u64>,
    /// How long it waits between its calls, in seconds, when seen.
    pub wait: Option<u64>,
    /// The namespaces of the modules of the text it is sent, when that text changed (in
    /// order, once each): what it follows.
    pub namespaces: Option<Vec<Box<str>>>,
    pub change: Option<Change>,
}

/// Namespace scopes a collector keeps at most; sent modules of more namespaces, it follows
/// all ConfigMaps.
pub const COLLECTOR_SCOPES: usize = 32;

/// The scopes a collector sent modules of `namespaces` follows: one per namespace, or
/// all ConfigMaps past `COLLECTOR_SCOPES`.
fn wanted(namespaces: &[Box<str>]) -> Vec<Arc<Scope>> {
    let filters: Vec<Filter> = if namespaces.len() > COLLECTOR_SCOPES {
        vec![Filter::namespace(Resource::ConfigMaps, None)]
    } else {
        (namespaces.iter())
            .map(|ns| Filter::namespace(Resource::ConfigMaps, Some(ns)))
            .collect()
    };
    filters
        .into_iter()
        .map(|f| Arc::new(Scope::new(f, 0)))
        .collect()
}

/// Whether `s` is a collector's scope (all ConfigMaps of a namespace, or of all).
fn plain(s: &Scope) -> bool {
    s.filter.kind == Resource::ConfigMaps && s.filter.plain()
}

/// `holds` once `text` runs: the refusals of modules the text holds, each now holding
/// the text's version, and what is not a ConfigMap's (a follower's of the same name);
/// nothing else.
fn applied(holds: &[Holding], text: &[Version]) -> Vec<Holding> {
    (holds.iter())
        .filter_map(|h| {
            if h.kind != Resource::ConfigMaps {
                return Some(h.clone());
            }
            h.refused.as_ref()?;
            let i = text.binary_search_by(|v| (*v.key).cmp(&h.key)).ok()?;
            Some(Holding {
                hash: Some(text[i].hash),
                resource_version: Some(text[i].rv),
                ..h.clone()
            })
        })
        .collect()
}

/// The order holds are kept in: kind, then key.
fn order(h: &Holding) -> (usize, &str) {
    (h.kind.index(), &h.key)
}

/// `holds` with `new` in place of those of the same kind and key (both in that order).
fn merged(holds: &[Holding], new: Vec<Holding>) -> Vec<Holding> {
    let mut out: Vec<Holding> = (holds.iter())
        .filter(|h| new.binary_search_by(|n| order(n).cmp(&order(h))).is_err())
        .cloned()
        .collect();
    out.extend(new);
    out.sort_by(|a, b| order(a).cmp(&order(b)));
    out
}

/// `holds` cut to `MAX_REPORT_MODULES`, refusals kept first; and whether it was cut.
fn bounded(mut holds: Vec<Holding>) -> (Vec<Holding>, bool) {
    if holds.len() <= MAX_REPORT_MODULES {
        return (holds, false);
    }
    holds.sort_by_key(|h| h.refused.is_none());
    holds.truncate(MAX_REPORT_MODULES);
    holds.sort_by(|a, b| order(a).cmp(&order(b)));
    (holds, true)
}

impl Fleet {
    /// Collector `name` (its follower name) said `word`, now. A word that changes what it
    /// follows or holds is taken within the follower's report budget (`Fleet::rate`), so
    /// that the followers' lock is written at a bounded rate whatever a token sends;
    /// `false`: it was not taken (its caller tells it again with the next).
    pub fn collected(&self, name: &str, word: Word, now: Instant) -> bool {
        let changes = word.change.is_some() || word.namespaces.is_some();
        if changes && self.rate(name, now).is_err() {
            // Heard from, and nothing else: its position waits with its change (a FAILED
            // told later must not find it holding what it refused meanwhile).
            let heard = Word {
                at: None,
                namespaces: None,
                change: None,
                ..word
            };
            self.collected(name, heard, now);
            return false;
        }
        if !changes {
            let followers = self.read_now();
            let Some(f) = followers.map.get(name) else {
                // Not followed: nothing it holds counts yet (a text of modules adds it).
                return true;
            };
            if let Some(at) = word.at {
                (f.scopes.iter())
                    .filter(|s| plain(s))
                    .for_each(|s| s.advance(at));
            }
            drop(followers);
            self.seen_name(name, word.wait, now);
            return true;
        }
        self.replace(name, word.wait, now, move |before| {
            let (mut scopes, holds, _) = before
                .map(|b| (b.scopes, b.holds, b.truncated))
                .unwrap_or_default();
            if let Some(namespaces) = &word.namespaces {
                let kept = std::mem::take(&mut scopes);
                let (mut theirs, ours): (Vec<_>, Vec<_>) =
                    kept.into_iter().partition(|s| !plain(s));
                // A follower's own (of the same name) keep their own bound.
                while theirs.len() > MAX_SCOPES {
                    theirs.remove(0);
                }
                scopes = theirs;
                for w in wanted(namespaces) {
                    let same = ours.iter().find(|s| s.key == w.key);
                    scopes.push(same.cloned().unwrap_or(w));
                }
            }
            if let Some(at) = word.at {
                (scopes.iter())
                    .filter(|s| plain(s))
                    .for_each(|s| s.advance(at));
            }
            let holds = match word.change {
                None => holds.into_vec(),
                Some(Change::Applied(text)) => applied(&holds, &text),
                Some(Change::Failed(new)) => merged(&holds, new),
            };
            let (holds, truncated) = bounded(holds);
            (scopes, holds.into_boxed_slice(), truncated)
        });
        true
    }
}

#[cfg(test)]
mod tests;
