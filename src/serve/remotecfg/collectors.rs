//! What the hub keeps of each collector (`Collectors`, at most `MAX_COLLECTORS`): told apart
//! by who it is (its token's follower name: `NAMESPACE/POD`, else its user name) and the id
//! it gives, since an id is the collector's own word and two identities may give the same
//! one. Kept: its name and attributes (as it last registered or asked), the hash it was last
//! sent, and the last status it reported with the hash it reported it for — Alloy sends a
//! status once, when it changes, so the hub must remember `FAILED for H`. A status's message
//! is cut to `KEPT_MESSAGE`. When the map is full, the collector heard from longest ago
//! makes room. `UnregisterCollector` forgets one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use super::messages::{Attributes, Reported, Status};
use crate::locks::Recover;

/// Collectors kept, at most.
pub const MAX_COLLECTORS: usize = 10_000;

/// Failed collectors `/status` names, at most.
const SHOWN: usize = 20;

/// A status's message, kept at most.
pub const KEPT_MESSAGE: usize = 1024;

/// One collector, as kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collector {
    pub name: String,
    pub attributes: Attributes,
    /// The hash it was last sent.
    pub sent: Option<String>,
    /// Its last status, and the hash it was reported for.
    pub status: Option<(Reported, String)>,
    pub registered: bool,
    pub seen: Instant,
}

/// Every collector kept, by (identity, id).
#[derive(Default)]
pub struct Collectors {
    kept: Mutex<HashMap<(String, String), Collector>>,
}

impl Collectors {
    /// `RegisterCollector`.
    pub fn register(&self, who: &str, id: &str, name: &str, attributes: &Attributes, now: Instant) {
        self.with(who, id, now, |c| {
            c.name = name.to_string();
            c.attributes = attributes.clone();
            c.registered = true;
        });
    }

    /// A `GetConfig` of `hash` that is answered with `sent`; its status, if it carried one.
    pub fn asked(&self, who: &str, id: &str, asked: Asked<'_>, now: Instant) {
        let status = asked.status.filter(|s| s.status != Status::Unset).map(|s| {
            let message = crate::reason::cut(&s.message, KEPT_MESSAGE).into_owned();
            let changed = s.status;
            (
                Reported {
                    status: changed,
                    message,
                },
                asked.hash.to_string(),
            )
        });
        let mut said = None;
        self.with(who, id, now, |c| {
            if c.attributes != *asked.attributes {
                c.attributes = asked.attributes.clone();
            }
            c.sent = Some(asked.sent.to_string());
            if let Some(s) = status {
                if c.status.as_ref() != Some(&s) {
                    said = Some(s.clone());
                }
                c.status = Some(s);
            }
        });
        if let Some((r, hash)) = said {
            let id = crate::reason::cut(id, 64);
            match r.status {
                Status::Failed => log::info!(
                    "--remotecfg: collector {id} of {who} failed to apply {}: {}",
                    crate::reason::cut(&hash, 16),
                    crate::reason::cut(&r.message, 256)
                ),
                s => log::debug!(
                    "--remotecfg: collector {id} of {who}: {} {}",
                    s.word(),
                    crate::reason::cut(&hash, 16)
                ),
            }
        }
    }

    /// `UnregisterCollector`.
    pub fn forget(&self, who: &str, id: &str) {
        self.kept
            .lock()
            .recover()
            .remove(&(who.to_string(), id.to_string()));
    }

    /// One collector, as kept.
    #[cfg(test)]
    pub fn get(&self, who: &str, id: &str) -> Option<Collector> {
        (self.kept.lock().recover())
            .get(&(who.to_string(), id.to_string()))
            .cloned()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept.lock().recover().len()
    }

    /// What `/status` says of them: how many, how many run what they were last sent
    /// (`applied` for it), and the first `SHOWN` whose last status is `failed`, with its
    /// words.
    pub fn status(&self) -> serde_json::Value {
        let kept = self.kept.lock().recover();
        let mut applied = 0;
        let mut failed = Vec::new();
        for ((who, id), c) in kept.iter() {
            match &c.status {
                Some((r, hash)) if r.status == Status::Applied && c.sent.as_ref() == Some(hash) => {
                    applied += 1
                }
                Some((r, hash)) if r.status == Status::Failed => failed.push(serde_json::json!({
                    "collector": who, "id": id, "hash": hash, "message": r.message,
                })),
                _ => {}
            }
        }
        let count = failed.len();
        failed.sort_by_key(|f| f.to_string());
        failed.truncate(SHOWN);
        serde_json::json!({
            "collectors": kept.len(), "applied": applied, "failedCount": count, "failed": failed,
        })
    }

    /// Changes collector (`who`, `id`), made if new (the one heard from longest ago
    /// forgotten if the map is full).
    fn with(&self, who: &str, id: &str, now: Instant, change: impl FnOnce(&mut Collector)) {
        let mut kept = self.kept.lock().recover();
        let key = (who.to_string(), id.to_string());
        if !kept.contains_key(&key) && kept.len() >= MAX_COLLECTORS {
            let oldest = (kept.iter())
                .min_by_key(|(_, c)| c.seen)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                kept.remove(&k);
            }
        }
        let c = kept.entry(key).or_insert_with(|| Collector {
            name: String::new(),
            attributes: Attributes::new(),
            sent: None,
            status: None,
            registered: false,
            seen: now,
        });
        c.seen = now;
        change(c);
    }
}

/// What a `GetConfig` said, and what it was answered.
pub struct Asked<'a> {
    pub attributes: &'a Attributes,
    /// The hash it echoed.
    pub hash: &'a str,
    pub status: Option<&'a Reported>,
    /// The hash it is sent now.
    pub sent: &'a str,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn failed(message: &str) -> Reported {
        Reported {
            status: Status::Failed,
            message: message.into(),
        }
    }

    /// A status is kept with the hash it was reported for, until another comes; requests
    /// without one keep it (Alloy sends it once).
    #[test]
    fn a_status_is_kept_for_its_hash() {
        let c = Collectors::default();
        let t = Instant::now();
        let a = Attributes::from([("team".to_string(), "a".to_string())]);
        c.register("ns/pod", "x", "alloy", &a, t);
        let ask = |hash, status, sent| Asked {
            attributes: &a,
            hash,
            status,
            sent,
        };
        let unset = Reported {
            status: Status::Unset,
            message: String::new(),
        };
        c.asked("ns/pod", "x", ask("", Some(&unset), "h1"), t);
        assert_eq!(
            c.get("ns/pod", "x").unwrap().status,
            None,
            "UNSET is no status"
        );
        let long = "e".repeat(5000);
        let refusal = failed(&long);
        c.asked("ns/pod", "x", ask("h1", Some(&refusal), "h1"), t);
        c.asked("ns/pod", "x", ask("h1", None, "h1"), t);
        let kept = c.get("ns/pod", "x").unwrap();
        let (r, hash) = kept.status.unwrap();
        assert_eq!((r.status, hash.as_str()), (Status::Failed, "h1"));
        assert!(r.message.len() <= KEPT_MESSAGE, "{}", r.message.len());
        assert_eq!(kept.sent.as_deref(), Some("h1"));
        assert_eq!((kept.name.as_str(), kept.registered), ("alloy", true));
        // Another identity's "x" is another collector.
        assert!(c.get("ns/other", "x").is_none());
        let page = c.status();
        assert_eq!(
            (page["collectors"].as_u64(), page["failedCount"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(page["failed"][0]["collector"], "ns/pod");
        let applied = Reported {
            status: Status::Applied,
            message: String::new(),
        };
        c.asked("ns/pod", "x", ask("h1", Some(&applied), "h1"), t);
        assert_eq!(c.status()["applied"], 1);
        c.forget("ns/pod", "x");
        assert!(c.get("ns/pod", "x").is_none());
    }

    /// Full: the collector heard from longest ago makes room.
    #[test]
    fn the_map_is_bounded() {
        let c = Collectors::default();
        let t = Instant::now();
        let a = Attributes::new();
        for i in 0..MAX_COLLECTORS {
            c.register(
                "who",
                &i.to_string(),
                "",
                &a,
                t + Duration::from_millis(i as u64),
            );
        }
        // The first one, heard from again, is not the oldest any more.
        c.register("who", "0", "", &a, t + Duration::from_secs(3600));
        c.register("who", "new", "", &a, t + Duration::from_secs(3601));
        assert_eq!(c.len(), MAX_COLLECTORS);
        assert!(c.get("who", "0").is_some() && c.get("who", "new").is_some());
        assert!(c.get("who", "1").is_none(), "the oldest went");
    }
}
