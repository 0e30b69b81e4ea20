//! The rollouts' state as the hubs keep it in the cluster (`store.rs`: a Secret): the
//! `Record` — each object rolling out (or refused) and each hub's votes — in
//! `data["rollouts.json"]`, and each such object's stable version (the one that last
//! completed, as the apiserver served it) in `data["stable.<16 hex>"]`.
//!
//! Only hubs write it, but it is read as hostile all the same: an id the apiserver would
//! not allow, a hash that is not one, steps that do not parse, a step past the last, a
//! reason past `MAX_REASON`, more than `MAX_ROLLOUTS` rollouts or `MAX_HUBS` hubs — each
//! such entry is dropped (and said once by the caller), never trusted. What a record
//! may hold in all is bounded by `MAX_BYTES` (the apiserver takes a Secret of 1 MiB).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::poll::hash::Hash;
use crate::serve::validated::memory;

/// The record's key in the Secret's data.
pub const RECORD_KEY: &str = "rollouts.json";
/// A stable version's key's prefix (`stable_key`).
pub const STABLE_PREFIX: &str = "stable.";
/// What the Secret's data may hold in all (the apiserver takes 1 MiB).
pub const MAX_BYTES: usize = 900 << 10;
/// Objects rolling out, refused or just done at once, at most (and a fourth of that in
/// one namespace: one team's writes cannot fill the table for the others).
pub const MAX_ROLLOUTS: usize = 500;
/// Hubs voting, at most.
pub const MAX_HUBS: usize = 64;
/// A refusal's reason kept, at most (bytes).
pub const MAX_REASON: usize = 512;
/// Steps of one rollout, at most.
pub const MAX_STEPS: usize = 10;

/// The rollouts and the hubs' votes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// By object id (`configmap/NS/NAME`, `secret/NS/NAME`).
    #[serde(default)]
    pub rollouts: BTreeMap<String, Rollout>,
    /// By hub name (its pod's name).
    #[serde(default)]
    pub hubs: BTreeMap<String, Hub>,
}

/// One object's version rolling out, or refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// The version rolling out (`sha256:…`).
    pub hash: String,
    /// The object's own resourceVersion at that version: a hub whose poll holds an older
    /// one has not seen it yet, and decides nothing about it.
    #[serde(default)]
    pub rv: u64,
    /// The version that last completed (its JSON under `stable_key`); none: the object is
    /// new, and the others do not see it yet.
    #[serde(default)]
    pub from: Option<String>,
    /// Each step's fraction, ascending, the last 1.
    pub steps: Vec<f64>,
    /// The current step (0: the first).
    pub step: usize,
    /// The current step's threshold: a client whose cohort is below it is in the step
    /// (at least the step's fraction; above one follower's cohort, so that each step has
    /// one).
    pub below: f64,
    /// When the step began (Unix seconds).
    pub since: u64,
    /// The least time a step is held (seconds), as the hub that began it was told.
    pub wait: u64,
    /// The refusal that stopped it.
    #[serde(default)]
    pub refused: Option<Refused>,
    /// Done (Unix seconds): every client is served it; kept a while, so that a hub that
    /// has not applied the last step yet serves it to everyone rather than taking a
    /// missing entry for a rollout never begun.
    #[serde(default)]
    pub done: Option<u64>,
}

/// Who refused a version, at which step, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    pub step: usize,
    pub follower: String,
    /// `validate` or `confirm`.
    pub by: String,
    pub reason: String,
}

/// One hub's votes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Hub {
    /// Bumped at each of its writes: a hub whose beat stops moving is gone.
    pub beat: u64,
    /// By object id: what its followers of the step hold.
    #[serde(default)]
    pub votes: BTreeMap<String, Vote>,
}

/// What one hub's followers of a step hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Vote {
    pub hash: String,
    pub step: usize,
    /// Every follower of the step it knows holds the version.
    pub holds: bool,
    pub followers: u32,
    pub holding: u32,
}

impl Rollout {
    /// Whether it still rolls out (neither refused nor done).
    pub fn rolling(&self) -> bool {
        self.refused.is_none() && self.done.is_none()
    }
}

/// The key of an object's stable version in the Secret's data.
pub fn stable_key(id: &str) -> String {
    let d = Sha256::digest(id.as_bytes());
    let hex: String = d[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{STABLE_PREFIX}{hex}")
}

/// The record in `json`, each entry checked; the entries dropped, with why.
pub fn read(json: &[u8]) -> (Record, Vec<String>) {
    let mut dropped = Vec::new();
    let mut record: Record = match serde_json::from_slice(json) {
        Ok(r) => r,
        Err(e) => {
            dropped.push(format!("{RECORD_KEY} is not a record ({e}): read as empty"));
            return (Record::default(), dropped);
        }
    };
    record.rollouts.retain(|id, r| match check(id, r) {
        Ok(()) => true,
        Err(why) => {
            dropped.push(format!("rollout of {}: {why}", cut(id, 300)));
            false
        }
    });
    while record.rollouts.len() > MAX_ROLLOUTS {
        record.rollouts.pop_last();
        dropped.push(format!("more than {MAX_ROLLOUTS} rollouts"));
    }
    record.hubs.retain(|name, h| {
        h.votes.retain(|id, v| {
            memory::parse_id(id).is_some() && Hash::parse(&v.hash).is_some() && v.step < MAX_STEPS
        });
        let ok = !name.is_empty() && name.len() <= 253 && h.votes.len() <= MAX_ROLLOUTS;
        if !ok {
            dropped.push(format!("votes of hub {}", cut(name, 100)));
        }
        ok
    });
    while record.hubs.len() > MAX_HUBS {
        record.hubs.pop_last();
        dropped.push(format!("more than {MAX_HUBS} hubs"));
    }
    (record, dropped)
}

/// Why `r` (the rollout of `id`) is not one a hub may have written.
fn check(id: &str, r: &Rollout) -> Result<(), String> {
    memory::parse_id(id).ok_or("not an object id")?;
    Hash::parse(&r.hash).ok_or("its hash is not one")?;
    if let Some(from) = &r.from {
        Hash::parse(from).ok_or("its stable hash is not one")?;
    }
    let s = &r.steps;
    let ascending = s.windows(2).all(|w| w[0] < w[1]);
    let within = s.iter().all(|f| f.is_finite() && *f > 0.0 && *f <= 1.0);
    if s.is_empty() || s.len() > MAX_STEPS || !ascending || !within || s.last() != Some(&1.0) {
        return Err("its steps are not a rollout's".into());
    }
    if r.step >= s.len() {
        return Err("its step is past the last".into());
    }
    if !(r.below.is_finite() && r.below >= s[r.step] && r.below <= 2.0) {
        return Err("its threshold is not its step's".into());
    }
    if let Some(x) = &r.refused {
        let ok = x.step < s.len()
            && x.reason.len() <= MAX_REASON
            && x.follower.len() <= 300
            && (x.by == "validate" || x.by == "confirm");
        if !ok {
            return Err("its refusal is not one".into());
        }
    }
    Ok(())
}

/// An id's kind (`ConfigMap`, `Secret`), namespace and name, for people.
pub fn parse(id: &str) -> (&'static str, &str, &str) {
    match memory::parse_id(id) {
        Some((kind, ns, name)) => (kind.kind(), ns, name),
        None => ("", "", id),
    }
}

/// At most `n` bytes of `s`, cut on a character.
pub fn cut(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn rollout() -> Rollout {
        Rollout {
            hash: hash('a'),
            rv: 12,
            done: None,
            from: Some(hash('b')),
            steps: vec![0.01, 0.5, 1.0],
            step: 1,
            below: 0.5,
            since: 1_700_000_000,
            wait: 60,
            refused: None,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let mut r = Record::default();
        r.rollouts.insert("configmap/ns/a".into(), rollout());
        r.hubs.insert(
            "hub-0".into(),
            Hub {
                beat: 3,
                votes: [(
                    "configmap/ns/a".into(),
                    Vote {
                        hash: hash('a'),
                        step: 1,
                        holds: true,
                        followers: 2,
                        holding: 2,
                    },
                )]
                .into(),
            },
        );
        let json = serde_json::to_vec(&r).unwrap();
        let (back, dropped) = read(&json);
        assert_eq!(back, r);
        assert!(dropped.is_empty(), "{dropped:?}");
    }

    #[test]
    fn entries_no_hub_would_write_are_dropped() {
        let bad = |f: &dyn Fn(&mut Rollout)| {
            let mut r = rollout();
            f(&mut r);
            r
        };
        let mut rec = Record::default();
        rec.rollouts.insert("configmap/ns/good".into(), rollout());
        rec.rollouts.insert("configmap/../x".into(), rollout());
        rec.rollouts.insert("deployment/ns/x".into(), rollout());
        type Break = Box<dyn Fn(&mut Rollout)>;
        let cases: Vec<Break> = vec![
            Box::new(|r| r.hash = "md5:x".into()),
            Box::new(|r| r.steps = vec![0.5, 0.1, 1.0]),
            Box::new(|r| r.steps = vec![0.5]),
            Box::new(|r| r.steps = vec![0.0, 1.0]),
            Box::new(|r| r.step = 3),
            Box::new(|r| r.below = 0.1),
            Box::new(|r| {
                r.refused = Some(Refused {
                    step: 0,
                    follower: "f".into(),
                    by: "someone".into(),
                    reason: String::new(),
                })
            }),
            Box::new(|r| {
                r.refused = Some(Refused {
                    step: 0,
                    follower: "f".into(),
                    by: "confirm".into(),
                    reason: "x".repeat(MAX_REASON + 1),
                })
            }),
        ];
        for (i, f) in cases.iter().enumerate() {
            rec.rollouts.insert(format!("configmap/ns/bad{i}"), bad(f));
        }
        let (back, dropped) = read(&serde_json::to_vec(&rec).unwrap());
        assert_eq!(
            back.rollouts.keys().collect::<Vec<_>>(),
            ["configmap/ns/good"]
        );
        assert_eq!(dropped.len(), cases.len() + 2, "{dropped:?}");
        let (empty, dropped) = read(b"{not json");
        assert_eq!(empty, Record::default());
        assert_eq!(dropped.len(), 1);
    }

    /// A step's threshold raised just above a follower's cohort reads back exactly: read
    /// one float lower, that follower was in no step (serde_json's default float parser is
    /// not exact; the crate reads with `float_roundtrip`).
    #[test]
    fn a_threshold_reads_back_bit_for_bit() {
        let lowest = 0.010635610924791927_f64;
        let mut r = Record::default();
        let mut x = rollout();
        x.step = 0;
        x.below = f64::from_bits(lowest.to_bits() + 1);
        r.rollouts.insert("configmap/ns/a".into(), x.clone());
        let (back, dropped) = read(&serde_json::to_vec(&r).unwrap());
        assert!(dropped.is_empty(), "{dropped:?}");
        let below = back.rollouts["configmap/ns/a"].below;
        assert_eq!(below.to_bits(), x.below.to_bits());
        assert!(lowest < below);
        // And over many cohorts: each raised threshold stays above its cohort.
        for i in 0..2000 {
            let h = crate::serve::views::cohort(&format!("fleet-agents/agent-{i}"));
            let raised = f64::from_bits(h.to_bits() + 1);
            let json = serde_json::to_vec(&raised).unwrap();
            let back: f64 = serde_json::from_slice(&json).unwrap();
            assert!(h < back, "{i}: {raised} read back as {back}, not above {h}");
        }
    }

    #[test]
    fn a_stable_key_is_the_ids_digest() {
        // printf %s configmap/ns/a | sha256sum
        let k = stable_key("configmap/ns/a");
        assert!(
            k.starts_with(STABLE_PREFIX) && k.len() == STABLE_PREFIX.len() + 16,
            "{k}"
        );
        assert_ne!(k, stable_key("configmap/ns/b"));
    }
}
