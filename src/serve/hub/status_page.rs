//! The hub's `/status` page: its readiness, its last poll and each scope's versions, what
//! its history keeps and its renders hold, and its fleet's state — made of what the hub hands it, no state of its
//! own.

use super::super::held::Held;
use super::super::history::History;
use super::super::renders::Renders;
use crate::source::Resources;

/// What the page shows, as the hub sees it now.
pub struct Seen<'a> {
    pub ready: Result<(), String>,
    pub last_error: Option<String>,
    /// The last complete poll, if any.
    pub held: Option<&'a Held>,
    pub history: &'a History,
    pub kinds: Resources,
    pub renders: &'a Renders,
    /// The fleet's state (`fleet::Fleet::status`).
    pub fleet: serde_json::Value,
    /// `--validate`: what the hub holds back (`validated::Validated::status`); null without.
    pub validation: serde_json::Value,
    /// `--rollout`: its members (`rollouts`, `rolloutState`: `rollout::Rollouts::status`)
    /// join the page's; null without.
    pub rollouts: serde_json::Value,
    /// `--remotecfg`: its collectors (`remotecfg::collectors::Collectors::status`); null
    /// without, and then not on the page.
    pub collectors: serde_json::Value,
}

/// The page's JSON.
pub fn body(seen: &Seen) -> Vec<u8> {
    let held = seen.held;
    let scopes: Vec<serde_json::Value> = (held.iter())
        .flat_map(|h| h.scopes.iter())
        .map(|s| {
            serde_json::json!({
                "resource": s.kind.plural(),
                "namespace": s.namespace,
                "listed": s.listed.to_string(),
                "changed": s.changed.to_string(),
            })
        })
        .collect();
    let history: Vec<serde_json::Value> = (seen.kinds.iter())
        .map(|k| {
            let kept = seen.history.kind(k);
            serde_json::json!({"resource": k.plural(), "changes": kept.count(),
                "bytes": kept.bytes(), "oldest": kept.oldest.to_string()})
        })
        .collect();
    let (renders, render_bytes) = seen.renders.size();
    let mut json = serde_json::json!({
        "history": history,
        "renders": {"kept": renders, "bytes": render_bytes, "made": seen.renders.made()},
        "ready": seen.ready.is_ok(),
        "notReady": seen.ready.as_ref().err(),
        "poll": held.map(|h| h.poll),
        "pollAgeSeconds": held.map(|h| h.at.elapsed().as_secs()),
        "objects": held.map_or(0, |h| h.len()),
        "scopes": scopes,
        "lastError": seen.last_error,
        "fleet": seen.fleet,
        "validation": seen.validation,
    });
    if let (Some(page), serde_json::Value::Object(more)) = (json.as_object_mut(), &seen.rollouts) {
        page.extend(more.clone());
    }
    if let (Some(page), false) = (json.as_object_mut(), seen.collectors.is_null()) {
        page.insert("remotecfg".into(), seen.collectors.clone());
    }
    serde_json::to_vec_pretty(&json).unwrap_or_default()
}
