//! What a hub would write in the record at a turn (`Record`, `record.rs`), from what it
//! polled and what its followers hold — the decisions of a rollout, made the same way by
//! every hub, so that whichever writes first writes what the other would have:
//!
//! - a version that is new (its object's hash is not the one its clients above every cut
//!   are served) starts a rollout at its first step, from that version (kept as the
//!   stable one), unless its steps are `none`: then there is nothing to record;
//! - a version that is neither the rollout's nor its stable one (a newer write) starts
//!   again at the first step, from the same stable version; the stable version written
//!   back ends the rollout;
//! - an object gone ends its rollout (a deletion reaches every client at once);
//! - this hub's vote: what its followers of the step hold (`fleet::gate`); a refusal
//!   stops the rollout for the whole fleet (`Refused`);
//! - a step advances when it was held its wait, no one refused, and every live hub voted
//!   that its followers of the step hold the version; the last step done ends the rollout.

use std::sync::Arc;

use super::record::{Hub, MAX_REASON, MAX_ROLLOUTS, Record, Refused, Rollout, Vote, cut};
use crate::serve::fleet::gate::Gate;
use crate::serve::held::HeldObject;

/// One object as polled, for the plan.
pub struct Seen<'a> {
    pub id: String,
    /// Its newest good version (after the hub's `--validate`).
    pub object: &'a Arc<HeldObject>,
    /// What the clients above every cut are served of it now (none: nothing, or not yet
    /// known to them).
    pub done: Option<&'a Arc<HeldObject>>,
    /// Its rollout's steps (its annotation's, else the hub's): empty for none.
    pub steps: Vec<f64>,
}

/// What a plan needs besides the objects.
pub struct Context<'a> {
    /// This hub's name in the record.
    pub me: &'a str,
    /// Now, in Unix seconds.
    pub now: u64,
    /// `--rollout-wait`, in seconds.
    pub wait: u64,
    /// Whether a hub of the record is alive (this one always is).
    pub live: &'a dyn Fn(&str) -> bool,
    /// The gate of a rollout's current step for this hub's followers.
    pub gate: &'a mut dyn FnMut(&str, &Rollout) -> Gate,
    /// The lowest cohort among an object's followers (for a step's threshold).
    pub lowest: &'a mut dyn FnMut(&str) -> Option<f64>,
}

/// A plan: the record to write, and the stable versions it needs that the Secret does not
/// hold yet (by id).
pub struct Planned {
    pub record: Record,
    pub stables: Vec<(String, Arc<HeldObject>)>,
}

/// The record as this hub would write it after seeing `objects` (every object polled),
/// from `record` (the one last read or written).
pub fn plan(record: &Record, objects: &[Seen], cx: &mut Context) -> Planned {
    let mut next = record.clone();
    let mut stables = Vec::new();
    let present: std::collections::HashSet<&str> = objects.iter().map(|s| s.id.as_str()).collect();
    next.rollouts.retain(|id, _| present.contains(id.as_str()));
    for seen in objects {
        let hash = seen.object.hash.to_string();
        let done = seen.done.map(|d| d.hash.to_string());
        let start = |from: Option<String>, lowest: Option<f64>| Rollout {
            hash: hash.clone(),
            from,
            steps: seen.steps.clone(),
            step: 0,
            below: threshold(seen.steps[0], lowest),
            since: cx.now,
            wait: cx.wait,
            refused: None,
        };
        match next.rollouts.get(&seen.id) {
            Some(r) if r.hash == hash => {}
            Some(r) if r.from.as_ref() == Some(&hash) => {
                // The stable version written back: nothing rolls out.
                next.rollouts.remove(&seen.id);
            }
            Some(r) if seen.steps.is_empty() => {
                let _ = r;
                next.rollouts.remove(&seen.id);
            }
            Some(r) => {
                // A newer write: from the first step again, from the same stable version.
                let from = r.from.clone();
                let lowest = (cx.lowest)(&seen.id);
                next.rollouts.insert(seen.id.clone(), start(from, lowest));
            }
            None if done.as_ref() == Some(&hash) || seen.steps.is_empty() => {}
            None if next.rollouts.len() >= MAX_ROLLOUTS => {}
            None => {
                let lowest = (cx.lowest)(&seen.id);
                next.rollouts
                    .insert(seen.id.clone(), start(done.clone(), lowest));
                if let Some(d) = seen.done {
                    stables.push((seen.id.clone(), d.clone()));
                }
            }
        }
    }
    vote_and_advance(&mut next, cx);
    Planned {
        record: next,
        stables,
    }
}

/// This hub's votes on every rollout, refusals taken, and the steps every live hub holds
/// advanced.
fn vote_and_advance(next: &mut Record, cx: &mut Context) {
    let mut votes = std::collections::BTreeMap::new();
    for (id, r) in next.rollouts.iter_mut().filter(|(_, r)| r.rolling()) {
        let gate = (cx.gate)(id, r);
        if let Some((follower, by, reason)) = &gate.refused {
            r.refused = Some(Refused {
                step: r.step,
                follower: cut(follower, 300).to_string(),
                by: by.word().to_string(),
                reason: cut(reason, MAX_REASON).to_string(),
            });
            continue;
        }
        votes.insert(
            id.clone(),
            Vote {
                hash: r.hash.clone(),
                step: r.step,
                holds: gate.holds(),
                followers: gate.followers,
                holding: gate.holding,
            },
        );
    }
    let beat = next.hubs.get(cx.me).map_or(0, |h| h.beat);
    // The beat moves only when the hub writes (`Rollouts`): the same here.
    next.hubs.insert(cx.me.to_string(), Hub { beat, votes });
    let live: Vec<&Hub> = (next.hubs.iter())
        .filter(|(name, _)| (cx.live)(name))
        .map(|(_, h)| h)
        .collect();
    let mut advanced = Vec::new();
    for (id, r) in next.rollouts.iter().filter(|(_, r)| r.rolling()) {
        let waited = cx.now >= r.since.saturating_add(r.wait);
        let every = live.iter().all(|h| {
            (h.votes.get(id)).is_some_and(|v| v.hash == r.hash && v.step == r.step && v.holds)
        });
        if waited && every {
            advanced.push(id.clone());
        }
    }
    for id in advanced {
        let Some(r) = next.rollouts.get_mut(&id) else {
            continue;
        };
        if r.step + 1 >= r.steps.len() {
            // Done: every client is served it, nothing more to record.
            next.rollouts.remove(&id);
            continue;
        }
        r.step += 1;
        r.since = cx.now;
        r.below = threshold(r.steps[r.step], (cx.lowest)(&id));
        // A vote was for the step before.
        if let Some(h) = next.hubs.get_mut(cx.me) {
            h.votes.remove(&id);
        }
    }
    let rolling: std::collections::HashSet<&String> = next.rollouts.keys().collect();
    for h in next.hubs.values_mut() {
        h.votes.retain(|id, _| rolling.contains(id));
    }
}

/// A step's threshold: its fraction, or just above the lowest follower's cohort when
/// that is higher (each step has at least one follower); the last step takes in every
/// client (2: above every cohort).
pub fn threshold(fraction: f64, lowest: Option<f64>) -> f64 {
    if fraction >= 1.0 {
        return 2.0;
    }
    match lowest {
        Some(l) if l >= fraction => next_up(l).min(1.0),
        _ => fraction,
    }
}

/// The least number above `x` (for `x` in [0, 1)).
fn next_up(x: f64) -> f64 {
    f64::from_bits(x.to_bits() + 1)
}

#[cfg(test)]
mod tests;
