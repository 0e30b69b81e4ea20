//! What a turn of the rollouts (`turn.rs`) looks up, and makes of what it finds: the gate
//! of a rollout's step and the lowest cohort among an object's followers (`fleet::gate`),
//! an object's pieces as the views served it, every object of a poll with its key (and
//! the few ids a turn looks at), an annotation, a stable version read back from the
//! Secret, the decisions a write made.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use super::pieces::{self, Pieces};
use super::record::{self, Rollout};
use super::store::Stored;
use crate::serve::fleet::Fleet;
use crate::serve::fleet::gate::{Gate, Step};
use crate::serve::held::{Held, HeldObject};
use crate::serve::validated::memory;
use crate::serve::views::Views;
use crate::source::reader::read_object;
use crate::source::{KeyFilter, Resource};

/// The decisions that make `after` of `before`.
pub fn decisions(before: &record::Record, after: &record::Record) -> Vec<&'static str> {
    let mut out = Vec::new();
    for (id, r) in &after.rollouts {
        match before.rollouts.get(id) {
            None => out.push("started"),
            Some(b) if b.hash != r.hash => out.push("started"),
            Some(b) if b.rolling() && !r.rolling() => out.push("refused"),
            Some(b) if r.step > b.step => out.push("advanced"),
            Some(_) => {}
        }
    }
    for (id, b) in &before.rollouts {
        if !after.rollouts.contains_key(id) {
            let last = b.rolling() && b.step + 1 == b.steps.len();
            out.push(if last { "completed" } else { "ended" });
        }
    }
    out
}

/// The Secret before it exists.
pub fn empty() -> Stored {
    Stored {
        resource_version: String::new(),
        data: BTreeMap::new(),
    }
}

/// The gate of `r` (the rollout of `id`) among `fleet`'s followers.
pub fn gate_of(
    fleet: &Fleet,
    judged: &Held,
    tracked: &BTreeMap<String, Pieces>,
    id: &str,
    r: &Rollout,
    now: Instant,
) -> Gate {
    let Some((kind, ns, name)) = memory::parse_id(id) else {
        return Gate::default();
    };
    let (Some(o), Some(pieces)) = (judged.get(kind, ns, name), tracked.get(id)) else {
        // Not served to any cohort yet: nobody holds it.
        return Gate {
            followers: 1,
            ..Gate::default()
        };
    };
    let hash = o.hash;
    let served_at = |h: f64| {
        let p = pieces.0.iter().find(|p| h < p.hi)?;
        let served = p.served.as_ref().filter(|s| s.hash == hash)?;
        served.resource_version.parse().ok()
    };
    let served: Vec<u64> = (pieces.0.iter())
        .filter_map(|p| p.served.as_ref().filter(|s| s.hash == hash))
        .filter_map(|s| s.resource_version.parse::<u64>().ok())
        .collect();
    let step = Step {
        kind,
        object: o,
        below: r.below,
        served_at: &served_at,
        served: &served,
        lowest: false,
    };
    fleet.gate(&step, now)
}

/// The lowest cohort among the followers of the object `id`.
pub fn lowest_of(fleet: &Fleet, judged: &Held, id: &str, now: Instant) -> Option<f64> {
    let (kind, ns, name) = memory::parse_id(id)?;
    let o = judged.get(kind, ns, name)?;
    let none = |_: f64| None;
    let step = Step {
        kind,
        object: o,
        below: 0.0,
        served_at: &none,
        served: &[],
        lowest: true,
    };
    fleet.gate(&step, now).lowest
}

/// `o`'s pieces as `prev` served it, cohort by cohort.
pub fn from_views(prev: &Views, kind: Resource, o: &HeldObject) -> Pieces {
    let mut out: Vec<pieces::Piece> = Vec::new();
    for (band, held) in prev.bands() {
        let served = held.get(kind, &o.namespace, &o.name).cloned();
        match out.last_mut() {
            Some(last) if pieces::same(&last.served, &served) => last.hi = band.hi,
            _ => out.push(pieces::Piece {
                hi: band.hi,
                source: served.clone(),
                served,
            }),
        }
    }
    Pieces(out)
}

/// Every object of `held`, with its kind and key (`namespace/name`; its id is the kind's
/// singular and that key): for passes over every object at every poll, no id made.
pub fn keyed(held: &Held) -> impl Iterator<Item = (Resource, &str, &Arc<HeldObject>)> {
    [Resource::ConfigMaps, Resource::Secrets]
        .into_iter()
        .filter(|k| held.serves(*k))
        .flat_map(move |k| held.keyed(k).map(move |(key, o)| (k, key, o)))
}

/// A set of ids, asked by kind and key (`namespace/name`): whether an object of a pass
/// over every object is one of the few a turn looks at, without making its id.
pub struct Ids([BTreeSet<String>; 2]);

impl Ids {
    pub fn of<'a>(ids: impl IntoIterator<Item = &'a String>) -> Ids {
        let mut out = Ids(Default::default());
        for id in ids {
            if let Some((kind, ns, name)) = memory::parse_id(id) {
                out.0[kind.index()].insert(format!("{ns}/{name}"));
            }
        }
        out
    }

    pub fn has(&self, kind: Resource, key: &str) -> bool {
        self.0[kind.index()].contains(key)
    }
}

/// The value of annotation `key` of `o` (read from its metadata).
pub fn annotation_of(o: &HeldObject, key: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(default)]
        annotations: Option<BTreeMap<String, String>>,
    }
    let meta: Meta = serde_json::from_slice(o.raw.metadata()).ok()?;
    meta.annotations?.remove(key)
}

/// A stable version read back from the Secret: the object its id names.
pub fn reread(id: &str, json: &[u8]) -> Result<HeldObject, String> {
    let fail = |why: &str| format!("{id}: its stable version {why}");
    let (kind, ns, name) = memory::parse_id(id).ok_or_else(|| fail("has no id"))?;
    let (_, _, item) = read_object(json, &KeyFilter::all(), kind, None, true)
        .map_err(|_| fail("cannot be read"))?;
    if item.namespace != ns || item.name != name {
        return Err(fail("is another object"));
    }
    HeldObject::of_item(item).map_err(|_| fail("cannot be read"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_asked_by_kind_and_key() {
        let ids: Vec<String> = ["configmap/ns/a", "secret/ns/b", "not an id"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let ids = Ids::of(&ids);
        assert!(ids.has(Resource::ConfigMaps, "ns/a"));
        assert!(ids.has(Resource::Secrets, "ns/b"));
        assert!(!ids.has(Resource::Secrets, "ns/a"));
        assert!(!ids.has(Resource::ConfigMaps, "ns/b"));
        assert!(!ids.has(Resource::ConfigMaps, "ns/a/"));
    }
}
