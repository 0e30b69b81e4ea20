//! What the rollouts' record shows (`Rollouts::status`, `Rollouts::notices`): `/status`'s
//! `rollouts` and `rolloutState`, and the Event each version refused during its rollout is
//! told by (`telling.rs` writes it).

use std::time::Duration;

use super::record::{self, Record};

/// What `/status` says of the Secret (`rolloutState`).
pub struct State {
    pub secret: String,
    pub read: bool,
    pub error: Option<String>,
    pub hub: String,
    pub wait: Duration,
}

/// What `/status` says: `rollouts` (each object rolling out or refused: its step of
/// how many, the threshold, since when, every hub's vote, the refusal) and
/// `rolloutState` (the Secret, and why it cannot be read or written, if so).
pub fn status(rec: &Record, state: &State) -> serde_json::Value {
    let rollouts: Vec<serde_json::Value> = (rec.rollouts.iter())
        .map(|(id, r)| {
            let (kind, ns, name) = record::parse(id);
            let votes: serde_json::Map<String, serde_json::Value> = (rec.hubs.iter())
                .filter_map(|(hub, h)| {
                    let v = h.votes.get(id)?;
                    Some((
                        hub.clone(),
                        serde_json::json!({"step": v.step + 1,
                        "followers": v.followers, "holding": v.holding, "holds": v.holds}),
                    ))
                })
                .collect();
            serde_json::json!({
                "kind": kind, "namespace": ns, "name": name,
                "hash": r.hash, "from": r.from,
                "state": match (&r.refused, r.done) {
                    (Some(_), _) => "refused",
                    (None, Some(_)) => "done",
                    (None, None) => "rolling",
                },
                "step": r.step + 1, "steps": r.steps.len(),
                "fraction": r.steps[r.step.min(r.steps.len() - 1)],
                "below": r.below, "since": r.since, "waitSeconds": r.wait,
                "votes": votes,
                "refused": r.refused.as_ref().map(|x| serde_json::json!({
                    "step": x.step + 1, "follower": x.follower, "by": x.by, "reason": x.reason})),
            })
        })
        .collect();
    serde_json::json!({
        "rollouts": rollouts,
        "rolloutState": {
            "secret": state.secret,
            "read": state.read,
            "error": state.error,
            "hub": state.hub,
            "waitSeconds": state.wait.as_secs(),
        },
    })
}

/// What the hub tells the authors (`telling.rs`): each version a follower refused
/// during its rollout, once, with the step, who and why (a follower's words, cut, and
/// for a Secret its validator's exit status only: `fleet::intake`), and what every
/// client is served instead; `served` what the clients above every cut are served.
pub fn notices(
    record: &Record,
    served: &crate::serve::held::Held,
) -> Vec<crate::serve::telling::Notice> {
    let mut out = Vec::new();
    for (id, r) in &record.rollouts {
        let (Some(x), Some((kind, ns, name))) =
            (&r.refused, crate::serve::validated::memory::parse_id(id))
        else {
            continue;
        };
        let (Some(o), Some(hash)) = (
            served.get(kind, ns, name),
            crate::poll::hash::Hash::parse(&r.hash),
        ) else {
            continue;
        };
        let instead = match &r.from {
            Some(from) => format!(
                "every client is served its last good version {}",
                short(from)
            ),
            None => "it is served to no client: no version of it completed a rollout".into(),
        };
        out.push(crate::serve::telling::Notice {
            regarding: crate::report::Regarding {
                kind,
                namespace: ns.to_string(),
                name: name.to_string(),
                uid: o.uid(),
                resource_version: o.resource_version.clone(),
            },
            hash,
            reason: "Refused",
            // The words last: the note is cut at 1 KiB.
            message: format!(
                "version {} refused at step {} of {} ({}) of its rollout by {} ({}); {instead}: {}",
                short(&r.hash),
                x.step + 1,
                r.steps.len(),
                percent(r.steps[x.step.min(r.steps.len() - 1)]),
                x.follower,
                x.by,
                x.reason,
            ),
            count: 1,
        });
    }
    out
}

/// `sha256:` and the first 12 hex digits.
fn short(hash: &str) -> &str {
    record::cut(hash, 7 + 12)
}

/// A fraction as a percentage, as `--rollout` writes it.
pub fn percent(f: f64) -> String {
    let p = format!("{:.3}", f * 100.0);
    let p = p.trim_end_matches('0').trim_end_matches('.');
    format!("{p}%")
}
