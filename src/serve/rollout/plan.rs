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
    /// The hub's steps (`--rollout`), in place of an annotation's whose threshold would
    /// make one view too many (`MAX_CUTS`).
    pub fallback: Vec<f64>,
}

/// Distinct thresholds of the rollouts under way, at most (each is a view of every
/// object the hub serves): an annotation's steps that would pass it give way to the
/// hub's.
pub const MAX_CUTS: usize = 16;

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
    /// Whether this hub has seen a rollout's current step for its wait, by its own clock.
    pub waited: &'a dyn Fn(&str, &Rollout) -> bool,
}

/// A plan: the record to write, and the stable versions it needs that the Secret does not
/// hold yet (by id).
pub struct Planned {
    pub record: Record,
    pub stables: Vec<(String, Arc<HeldObject>)>,
}

/// The record as this hub would write it after seeing `objects` (every object polled that
/// is recorded or whose version is new: any other is left as it is), from `record` (the
/// one last read or written).
pub fn plan(record: &Record, objects: &[Seen], cx: &mut Context) -> Planned {
    let mut next = record.clone();
    let mut stables = Vec::new();
    let present: std::collections::HashSet<&str> = objects.iter().map(|s| s.id.as_str()).collect();
    // Gone objects end their rollouts; done ones are forgotten once every hub had the
    // time to apply them.
    next.rollouts.retain(|id, r| {
        present.contains(id.as_str()) && r.done.is_none_or(|t| cx.now < t.saturating_add(DONE_KEPT))
    });
    for seen in objects {
        let hash = seen.object.hash.to_string();
        let rv: u64 = seen.object.resource_version.parse().unwrap_or(0);
        let cuts: Vec<f64> = (next.rollouts.values())
            .filter(|r| r.rolling())
            .map(|r| r.below)
            .collect();
        let start = |from: Option<String>, lowest: Option<f64>| {
            let fits = |steps: &[f64]| {
                let Some(first) = steps.first() else {
                    return false;
                };
                cuts.len() < MAX_CUTS || cuts.contains(&threshold(*first, lowest))
            };
            // Neither fits: it waits for a rollout to end (its version held, as when the
            // table is full).
            let steps = match (fits(&seen.steps), fits(&seen.fallback)) {
                (true, _) => seen.steps.clone(),
                (false, true) if !seen.fallback.is_empty() => seen.fallback.clone(),
                _ => return None,
            };
            Some(Rollout {
                hash: hash.clone(),
                rv,
                from,
                below: threshold(steps[0], lowest),
                steps,
                step: 0,
                since: cx.now,
                wait: cx.wait,
                refused: None,
                done: None,
            })
        };
        match next.rollouts.get(&seen.id) {
            // This hub has not listed the version recorded yet (its list began before the
            // write, its watch cache is behind, its own --validate has not judged it):
            // it decides nothing about it.
            Some(r) if rv < r.rv => {}
            Some(r) if r.hash == hash => {}
            Some(r) if r.done.is_some() => {
                // A newer write after a rollout done: from the version done.
                next.rollouts.remove(&seen.id);
                if !seen.steps.is_empty() && room(&next, &seen.id) {
                    let lowest = (cx.lowest)(&seen.id);
                    if let Some(r) = start(seen.done.map(|d| d.hash.to_string()), lowest) {
                        next.rollouts.insert(seen.id.clone(), r);
                        if let Some(d) = seen.done {
                            stables.push((seen.id.clone(), d.clone()));
                        }
                    }
                }
            }
            // The stable version written back, or a newer write with no rollout: ends it.
            Some(r) if r.from.as_ref() == Some(&hash) || seen.steps.is_empty() => {
                next.rollouts.remove(&seen.id);
            }
            Some(r) => {
                // A newer write: from the first step again, from the same stable version —
                // the one this hub serves above every cut when it serves one (what the
                // Secret says of it is trusted only by a hub that has none).
                let own = seen
                    .done
                    .filter(|d| r.from.as_ref() != Some(&d.hash.to_string()));
                let from = own.map_or(r.from.clone(), |d| Some(d.hash.to_string()));
                let lowest = (cx.lowest)(&seen.id);
                if let Some(r) = start(from, lowest) {
                    next.rollouts.insert(seen.id.clone(), r);
                    if let Some(d) = own {
                        stables.push((seen.id.clone(), d.clone()));
                    }
                }
            }
            None if seen.done.is_some_and(|d| d.hash == seen.object.hash) => {}
            None if seen.steps.is_empty() || !room(&next, &seen.id) => {}
            None => {
                let lowest = (cx.lowest)(&seen.id);
                let from = seen.done.map(|d| d.hash.to_string());
                if let Some(r) = start(from, lowest) {
                    next.rollouts.insert(seen.id.clone(), r);
                    if let Some(d) = seen.done {
                        stables.push((seen.id.clone(), d.clone()));
                    }
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

/// How long a done rollout stays recorded (seconds).
pub const DONE_KEPT: u64 = 600;

/// Whether `record` has room for one more rollout of `id`: under `MAX_ROLLOUTS`, and its
/// namespace under a fourth of that.
fn room(record: &Record, id: &str) -> bool {
    let ns = |id: &str| id.split('/').nth(1).map(str::to_string);
    let mine = ns(id);
    let in_ns = (record.rollouts.keys()).filter(|k| ns(k) == mine).count();
    record.rollouts.len() < MAX_ROLLOUTS && in_ns < MAX_ROLLOUTS / 4
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
                // Held its wait as this hub's own clock sees it, too: a hub whose clock
                // runs ahead cannot cut another's wait short.
                holds: gate.holds() && (cx.waited)(id, r),
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
            // Done: every client is served it; recorded so for `DONE_KEPT`.
            r.done = Some(cx.now);
            if let Some(h) = next.hubs.get_mut(cx.me) {
                h.votes.remove(&id);
            }
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
    let rolling: std::collections::HashSet<&String> = (next.rollouts.iter())
        .filter(|(_, r)| r.rolling())
        .map(|(id, _)| id)
        .collect();
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
