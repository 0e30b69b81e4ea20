//! `cmpoll status --fleet`: a hub's fleet as its `/status` shows it (the `fleet` section:
//! `serve::fleet`), printed as a table a person reads at a glance — one line per object
//! some follower holds: its served version, how many followers hold it, and who is
//! behind, refused it (and why) or is gone — or, `--json`, the section as the hub wrote
//! it. Exit 1 when any follower refused a served version or is behind (what asks for a
//! person), 0 otherwise: followers that are gone or still updating do not fail it (a node
//! drained, a rollout in its first intervals).

use serde::Deserialize;

use super::answer::first_line;
use super::table::columns;

/// Followers per state (`serve::fleet::view::Counts`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Counts {
    pub current: usize,
    pub updating: usize,
    pub behind: usize,
    pub refused: usize,
    pub gone: usize,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Names {
    pub names: Vec<String>,
    pub more: usize,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Refused {
    pub follower: String,
    pub by: String,
    pub reason: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Object {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub served: String,
    pub counts: Counts,
    #[serde(default)]
    pub refused: Vec<Refused>,
    #[serde(default, rename = "refusedMore")]
    pub refused_more: usize,
    #[serde(default)]
    pub behind: Names,
    #[serde(default)]
    pub gone: Names,
}

/// The `fleet` section of a hub's `/status`.
#[derive(Clone, Debug, Deserialize)]
pub struct Fleet {
    pub followers: usize,
    #[serde(default)]
    pub truncated: usize,
    /// Followers the hub's view left out (its budget: many scopes of few followers each).
    #[serde(default)]
    pub unread: usize,
    pub states: Counts,
    pub objects: Vec<Object>,
}

/// The longest refusal reason a table line shows.
const SHOWN_REASON: usize = 60;

impl Fleet {
    /// Read from a hub's `/status` answer (`None`: it has no `fleet` section, it is no
    /// hub or an older one).
    pub fn from_status(status: &serde_json::Value) -> Option<Result<Fleet, String>> {
        let fleet = status.get("fleet")?;
        Some(serde_json::from_value(fleet.clone()).map_err(|e| e.to_string()))
    }

    /// What asks for a person: each object refused or behind.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for o in &self.objects {
            let c = o.counts;
            if c.refused > 0 {
                out.push(format!(
                    "{}: {} followers refused {}",
                    id(o),
                    c.refused,
                    short(&o.served)
                ));
            }
            if c.behind > 0 {
                out.push(format!(
                    "{}: {} followers behind {}",
                    id(o),
                    c.behind,
                    short(&o.served)
                ));
            }
        }
        out
    }

    /// The table.
    pub fn table(&self) -> String {
        let s = self.states;
        let mut out = format!(
            "followers: {} ({} current, {} updating, {} behind, {} refused, {} gone)\n",
            self.followers, s.current, s.updating, s.behind, s.refused, s.gone
        );
        if self.truncated > 0 {
            out += &format!(
                "{} followers hold more modules than a report names: only the first are counted\n",
                self.truncated
            );
        }
        if self.unread > 0 {
            out += &format!(
                "{} followers on many scopes of their own are left out of the counts (the hub's view is bounded)\n",
                self.unread
            );
        }
        if self.objects.is_empty() {
            out += "no follower follows an object this hub serves\n";
            return out;
        }
        out += "\n";
        let mut rows = vec![["OBJECT".to_string(), "SERVED".into(), "FOLLOWERS".into()]];
        for o in &self.objects {
            rows.push([id(o), short(&o.served), line(o)]);
        }
        out += &columns(&rows);
        out
    }
}

/// `namespace/name`, or `secret/namespace/name`.
fn id(o: &Object) -> String {
    match o.kind.as_str() {
        "configmap" => format!("{}/{}", o.namespace, o.name),
        k => format!("{k}/{}/{}", o.namespace, o.name),
    }
}

/// `sha256:` and its first 8 hex digits.
fn short(hash: &str) -> String {
    match hash.get(..15) {
        Some(h) if hash.len() > 15 => format!("{h}…"),
        _ => hash.to_string(),
    }
}

/// `98 hold · 1 behind (node-3) · 1 refused (node-7: validate: …) · 0 gone`.
fn line(o: &Object) -> String {
    let c = o.counts;
    let named = |n: usize, word: &str, names: &Names| {
        let mut s = format!("{n} {word}");
        if !names.names.is_empty() {
            let mut list = names.names.join(", ");
            if names.more > 0 {
                list += &format!(" and {} more", names.more);
            }
            s += &format!(" ({list})");
        }
        s
    };
    let mut parts = vec![format!("{} hold", c.current)];
    if c.updating > 0 {
        parts.push(format!("{} updating", c.updating));
    }
    parts.push(named(c.behind, "behind", &o.behind));
    let mut refused = format!("{} refused", c.refused);
    if !o.refused.is_empty() {
        let mut list: Vec<String> = (o.refused.iter())
            .map(|r| {
                let why = first_line(&r.reason);
                let why = crate::reason::cut(why, SHOWN_REASON);
                // What a follower said reaches a terminal: no control character of it does.
                let plain = |s: &str| -> String {
                    s.chars()
                        .map(|c| if c.is_control() { '?' } else { c })
                        .collect()
                };
                format!("{}: {}: {}", plain(&r.follower), r.by, plain(&why))
            })
            .collect();
        if o.refused_more > 0 {
            list.push(format!("and {} more", o.refused_more));
        }
        refused += &format!(" ({})", list.join("; "));
    }
    parts.push(refused);
    parts.push(named(c.gone, "gone", &o.gone));
    parts.join(" · ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_at_a_glance_and_its_problems() {
        let status = serde_json::json!({"fleet": {"followers": 100, "bytes": 1, "truncated": 0,
            "states": {"current": 98, "updating": 0, "behind": 1, "refused": 1, "gone": 0},
            "objects": [{"kind": "configmap", "namespace": "monitoring", "name": "alloy-mod",
                "served": "sha256:abcd1234ef000000000000000000000000000000000000000000000000000000",
                "counts": {"current": 98, "updating": 0, "behind": 1, "refused": 1, "gone": 0},
                "versions": [],
                "refused": [{"follower": "node-7", "by": "validate", "reason": "line 3: \u{1b}[2Jbad block\nmore"}],
                "refusedMore": 0,
                "behind": {"names": ["node-3"], "more": 0}, "gone": {"names": [], "more": 0}}]}});
        let fleet = Fleet::from_status(&status).unwrap().unwrap();
        let table = fleet.table();
        assert!(
            table.contains("monitoring/alloy-mod   sha256:abcd1234…   98 hold · 1 behind (node-3) · 1 refused (node-7: validate: line 3: ?[2Jbad block) · 0 gone"),
            "{table}"
        );
        assert_eq!(fleet.problems().len(), 2);
        assert!(Fleet::from_status(&serde_json::json!({"ready": true})).is_none());
    }
}
