//! A collector's word (`--remotecfg`: Alloy's `remotecfg` block) taken into the fleet as a
//! follower's report is: SPEC's "a collector's `FAILED` is a refusal and `APPLIED` a
//! confirmation, as a follower's report".
//!
//! A collector is a follower of the fleet under the name its token gives a follower
//! (`follower_name`: its pod, else its user name), so its cohort is the one its texts were
//! made for. It follows every ConfigMap the hub serves (one scope of all ConfigMaps: the
//! hub does not keep which modules each collector's namespaces and attributes let in, so
//! it counts on `/status` as following those it is not sent too, holding what the hub
//! serves), as far as the hub's version of the last text it runs (`Word::at`: a text sent
//! at that version, or answered `not_modified` then). What it says changes its exceptions:
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
use super::state::{Fleet, Scope};
use crate::hub_protocol::MAX_REPORT_MODULES;
use crate::poll::hash::Hash;
use crate::serve::watch::Filter;
use crate::source::Resource;

/// One module's version in a text sent to a collector: `namespace/name`, its hash, its
/// resourceVersion (what a refusal is matched by: `gate.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub key: Box<str>,
    pub hash: Hash,
    pub rv: u64,
}

/// The module versions of a text, in key order.
pub type Versions = Arc<[Version]>;

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
    pub change: Option<Change>,
}

/// The scope every collector follows.
fn everything() -> Arc<Scope> {
    Arc::new(Scope::new(Filter::everything(Resource::ConfigMaps), 0))
}

/// `holds` once `text` runs: the refusals of modules the text holds, each now holding
/// the text's version; nothing else.
fn applied(holds: &[Holding], text: &[Version]) -> Vec<Holding> {
    (holds.iter())
        .filter(|h| h.refused.is_some())
        .filter_map(|h| {
            let i = text.binary_search_by(|v| (*v.key).cmp(&h.key)).ok()?;
            Some(Holding {
                hash: Some(text[i].hash),
                resource_version: Some(text[i].rv),
                ..h.clone()
            })
        })
        .collect()
}

/// `holds` with `new` in place of those of the same keys (both in key order).
fn merged(holds: &[Holding], new: Vec<Holding>) -> Vec<Holding> {
    let mut out: Vec<Holding> = (holds.iter())
        .filter(|h| new.binary_search_by(|n| n.key.cmp(&h.key)).is_err())
        .cloned()
        .collect();
    out.extend(new);
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

impl Fleet {
    /// Collector `name` (its follower name) said `word`, now.
    pub fn collected(&self, name: &str, word: Word, now: Instant) {
        let all = everything();
        if word.change.is_none() {
            let followers = self.read_now();
            if let Some(f) = followers.map.get(name)
                && let Some(s) = f.scopes.iter().find(|s| s.key == all.key)
            {
                s.advance(word.at.unwrap_or(0));
                drop(followers);
                self.seen_name(name, word.wait, now);
                return;
            }
        }
        self.replace(name, word.wait, now, move |before| {
            let (mut scopes, holds, _) = before
                .map(|b| (b.scopes, b.holds, b.truncated))
                .unwrap_or_default();
            match scopes.iter().find(|s| s.key == all.key) {
                Some(s) => s.advance(word.at.unwrap_or(0)),
                None => {
                    all.advance(word.at.unwrap_or(0));
                    scopes.push(all);
                    if scopes.len() > super::state::MAX_SCOPES {
                        scopes.remove(0);
                    }
                }
            }
            let mut holds = match word.change {
                None => holds.into_vec(),
                Some(Change::Applied(text)) => applied(&holds, &text),
                Some(Change::Failed(new)) => merged(&holds, new),
            };
            let truncated = holds.len() > MAX_REPORT_MODULES;
            holds.truncate(MAX_REPORT_MODULES);
            (scopes, holds.into_boxed_slice(), truncated)
        });
    }
}

#[cfg(test)]
mod tests;
