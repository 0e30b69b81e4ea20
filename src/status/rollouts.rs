//! `cmpoll status --fleet`'s rollouts: what a hub under `--rollout` says of each object
//! rolling out or refused (its `/status` `rollouts`: `serve::rollout::Rollouts::status`),
//! one line each — "step 2 of 4 (10%): 97 of 100 hold sha256:…" summed over the hubs'
//! votes, or who refused the version at which step, and why. A refusal asks for a person
//! (exit 1); a rollout under way does not.

use serde::Deserialize;

use super::answer::first_line;

#[derive(Clone, Debug, Deserialize)]
pub struct Vote {
    pub followers: usize,
    pub holding: usize,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Refused {
    pub step: usize,
    pub follower: String,
    pub by: String,
    pub reason: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Rollout {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub hash: String,
    pub from: Option<String>,
    /// `rolling`, `refused` or `done` (kept a while after).
    #[serde(default)]
    pub state: String,
    pub step: usize,
    pub steps: usize,
    pub fraction: f64,
    #[serde(default)]
    pub votes: std::collections::BTreeMap<String, Vote>,
    pub refused: Option<Refused>,
}

/// The rollouts of a hub's `/status` (empty: none, or no `--rollout`).
pub fn from_status(status: &serde_json::Value) -> Result<Vec<Rollout>, String> {
    match status.get("rollouts") {
        None => Ok(Vec::new()),
        Some(r) => serde_json::from_value(r.clone()).map_err(|e| e.to_string()),
    }
}

/// One line per rollout.
pub fn lines(rollouts: &[Rollout]) -> String {
    let mut out = String::new();
    for r in rollouts {
        out += &format!("{}: {}\n", id(r), line(r));
    }
    out
}

/// What asks for a person: each refused version.
pub fn problems(rollouts: &[Rollout]) -> Vec<String> {
    (rollouts.iter())
        .filter(|r| r.refused.is_some())
        .map(|r| format!("{}: {}", id(r), line(r)))
        .collect()
}

fn id(r: &Rollout) -> String {
    plain(&format!("{} {}/{}", r.kind, r.namespace, r.name))
}

/// What a hub or a follower named reaches a terminal: no control character of it does.
fn plain(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn line(r: &Rollout) -> String {
    let pct = crate::serve::rollout::shown::percent(r.fraction);
    match &r.refused {
        Some(x) => {
            let why = plain(&crate::reason::cut(first_line(&x.reason), 120));
            let instead = match &r.from {
                Some(f) => format!("every client is served {}", short(f)),
                None => "served to no client".into(),
            };
            format!(
                "{} refused at step {} of {} by {} ({}): {why}; {instead}",
                short(&r.hash),
                x.step,
                r.steps,
                plain(&x.follower),
                plain(&x.by)
            )
        }
        None if r.state == "done" => format!("done: every client is served {}", short(&r.hash)),
        None => {
            let followers: usize = r.votes.values().map(|v| v.followers).sum();
            let holding: usize = r.votes.values().map(|v| v.holding).sum();
            format!(
                "step {} of {} ({pct}): {holding} of {followers} hold {}",
                r.step,
                r.steps,
                short(&r.hash)
            )
        }
    }
}

/// `sha256:` and its first 8 hex digits.
fn short(hash: &str) -> String {
    match hash.get(..15) {
        Some(h) if hash.len() > 15 => format!("{h}…"),
        _ => hash.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_per_rollout_and_a_refusal_is_a_problem() {
        let h = |c: &str| format!("sha256:{}", c.repeat(64));
        let status = serde_json::json!({"rollouts": [
            {"kind": "ConfigMap", "namespace": "mon", "name": "a", "hash": h("a"), "from": h("b"),
             "state": "rolling", "step": 2, "steps": 4, "fraction": 0.1, "below": 0.1,
             "votes": {"hub-0": {"step": 2, "followers": 60, "holding": 58, "holds": false},
                       "hub-1": {"step": 2, "followers": 40, "holding": 39, "holds": false}},
             "refused": null},
            {"kind": "ConfigMap", "namespace": "mon", "name": "b", "hash": h("c"), "from": h("d"),
             "state": "refused", "step": 1, "steps": 4, "fraction": 0.01, "votes": {},
             "refused": {"step": 1, "follower": "mon/alloy-x", "by": "confirm",
                         "reason": "\u{1b}[2Jcannot build\nmore"}}]});
        let r = from_status(&status).unwrap();
        let text = lines(&r);
        assert!(
            text.contains("ConfigMap mon/a: step 2 of 4 (10%): 97 of 100 hold sha256:aaaaaaaa…"),
            "{text}"
        );
        assert!(
            text.contains("ConfigMap mon/b: sha256:cccccccc… refused at step 1 of 4 by mon/alloy-x (confirm): ?[2Jcannot build; every client is served sha256:dddddddd…"),
            "{text}"
        );
        assert_eq!(problems(&r).len(), 1);
        assert!(from_status(&serde_json::json!({})).unwrap().is_empty());
    }
}
