//! What a follower tells its hub (`hub_protocol::Report`): its exceptions — each module it
//! holds otherwise than it was served (rejected by anyone, its own `--validate` or its
//! agent's refusal through `--confirm`, left unwritten), with the version its sinks hold
//! (none: they hold none) and its own latest refusal of the module while the refused
//! version is still the newest it was served. A module it holds as served is not named:
//! the hub reads that off the follower's watch, so a fleet that takes every change
//! reports nothing. Made after each commit from what the store holds (what the sinks
//! hold), the commit's rejections and unwritten modules, and the gate's refusals; it
//! sends nothing (`sender.rs` does). A Secret's refusal carries the validator's exit
//! status only, never its output, which may quote the Secret (`reason::redacted`, as
//! `--report-events` and the log show it).

use std::collections::{BTreeSet, HashMap};

use crate::hub_protocol::{
    MAX_REPORT, MAX_REPORT_MODULES, MAX_REPORT_REASON, Report, Reported, ReportedRefusal,
};
use crate::poll::hash::Hash;
use crate::poll::snapshot::Snapshot;
use crate::reason::{REFUSED, cut, redacted};
use crate::source::Resources;

/// A version of a module its gate refused (`--validate`), or its agent (`--confirm`: the
/// reason begins with `reason::REFUSED`), and why, in the gate's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub module: String,
    pub hash: Hash,
    /// The object's resourceVersion at the version refused, when known.
    pub resource_version: Option<u64>,
    pub reason: String,
}

/// The report of a follower whose sinks hold `held`, whose modules `otherwise` are held
/// otherwise than served (rejected, left unwritten), whose gate refused `refused` (each
/// the newest version it was served), listing `kinds`: each of those modules once, with
/// what the sinks hold of it, in id order, at most `MAX_REPORT_MODULES` of them, and fewer
/// if their JSON would pass `MAX_REPORT` bytes (long names and reasons: `truncated`
/// either way).
pub fn report<'a>(
    held: &Snapshot,
    otherwise: impl IntoIterator<Item = &'a str>,
    refused: &'a [Refusal],
    kinds: Resources,
) -> Report {
    let refusals: HashMap<&str, &Refusal> =
        refused.iter().map(|r| (r.module.as_str(), r)).collect();
    let ids: BTreeSet<&str> = (otherwise.into_iter())
        .chain(refused.iter().map(|r| r.module.as_str()))
        .collect();
    let mut out = Report::default();
    for id in ids {
        if out.modules.len() == MAX_REPORT_MODULES {
            out.truncated = true;
            break;
        }
        let version = (held.modules.get(id)).map(|e| (e.hash, e.resource_version.number()));
        let kind = kinds.kind_of(id);
        out.modules.push(Reported {
            module: id.to_string(),
            kind: kind.kind().to_string(),
            hash: version.map(|(h, _)| h.to_string()),
            resource_version: version.and_then(|(_, rv)| rv).map(|rv| rv.to_string()),
            refused: refusals.get(id).map(|r| refusal(r, kind.shows_contents())),
        });
    }
    fit(out)
}

/// `r`, its last modules left out until its JSON fits in `MAX_REPORT` bytes (a hub reads
/// no more: 413).
fn fit(mut r: Report) -> Report {
    loop {
        let mut size = Count(0);
        if serde_json::to_writer(&mut size, &r).is_err() || size.0 <= MAX_REPORT {
            return r;
        }
        // In proportion, with a tenth to spare; at least one fewer.
        let keep =
            (r.modules.len() as u128 * MAX_REPORT as u128 * 9 / 10 / size.0 as u128) as usize;
        r.modules
            .truncate(keep.min(r.modules.len().saturating_sub(1)));
        r.truncated = true;
    }
}

/// Counts the bytes written to it.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `r` as reported: who refused it, and why (a Secret's `shows` nothing of what its
/// validator or agent said), cut to `MAX_REPORT_REASON` bytes.
fn refusal(r: &Refusal, shows: bool) -> ReportedRefusal {
    let reason = match shows {
        true => r.reason.clone(),
        false => redacted(&r.reason),
    };
    let (by, reason) = match reason.strip_prefix(REFUSED) {
        Some(said) => ("confirm", said),
        None => ("validate", reason.as_str()),
    };
    ReportedRefusal {
        hash: r.hash.to_string(),
        resource_version: r.resource_version.map(|rv| rv.to_string()),
        by: by.to_string(),
        reason: cut(reason, MAX_REPORT_REASON).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::poll::snapshot::Entry;
    use crate::poll::spool::Loc;
    use crate::source::Resource;

    fn h(n: u8) -> Hash {
        Hash([n; 32])
    }

    fn held(ids: &[(&str, u8)]) -> Snapshot {
        let mut s = Snapshot::default();
        for (id, n) in ids {
            let entry = Entry {
                hash: h(*n),
                loc: Loc::default(),
                resource_version: "7".into(),
            };
            s.modules.insert(id, entry);
        }
        s
    }

    fn refusal(module: &str, n: u8, reason: &str) -> Refusal {
        Refusal {
            module: module.into(),
            hash: h(n),
            resource_version: None,
            reason: reason.into(),
        }
    }

    fn configmaps() -> Resources {
        Resources::one(Resource::ConfigMaps)
    }

    /// Only the modules held otherwise than served (refused, rejected, unwritten), each
    /// once, in id order, with what the sinks hold of them; a module held as served is
    /// not named (the hub reads it off the watch); a new module it refused holds none.
    #[test]
    fn only_exceptions_come_in_id_order_each_once() {
        let s = held(&[("a/x", 1), ("c/x", 3), ("e/x", 5)]);
        let refused = [
            refusal(
                "b/new",
                9,
                "validator said no\n(validator exited with status 1)",
            ),
            refusal("c/x", 4, "bad"),
        ];
        let r = report(&s, ["d/unwritten", "c/x", "e/x"], &refused, configmaps());
        let got: Vec<(&str, Option<&str>, Option<&str>)> = (r.modules.iter())
            .map(|m| {
                let refused = m.refused.as_ref().map(|f| f.by.as_str());
                (m.module.as_str(), m.hash.as_deref(), refused)
            })
            .collect();
        let (three, five) = (h(3).to_string(), h(5).to_string());
        assert_eq!(
            got,
            vec![
                ("b/new", None, Some("validate")),
                ("c/x", Some(three.as_str()), Some("validate")),
                ("d/unwritten", None, None),
                ("e/x", Some(five.as_str()), None),
            ]
        );
        assert!(!r.truncated);
        assert!(r.modules.iter().all(|m| m.kind == "ConfigMap"));
        // What is held comes with its resourceVersion (the hub tells the version by it).
        assert_eq!(r.modules[1].resource_version.as_deref(), Some("7"));
        assert_eq!(r.modules[0].resource_version, None);
        let c = r.modules[1].refused.as_ref().unwrap();
        assert_eq!(
            (c.hash.as_str(), c.reason.as_str()),
            (h(4).to_string().as_str(), "bad")
        );
        // Nothing held otherwise: an empty report.
        assert!(report(&s, [], &[], configmaps()).modules.is_empty());
    }

    #[test]
    fn past_the_bound_the_first_modules_are_reported_and_truncated_set() {
        let ids: Vec<String> = (0..MAX_REPORT_MODULES + 2)
            .map(|i| format!("ns/m{i:05}"))
            .collect();
        let mut s = Snapshot::default();
        for id in &ids[1..] {
            let entry = Entry {
                hash: h(1),
                loc: Loc::default(),
                resource_version: "1".into(),
            };
            s.modules.insert(id, entry);
        }
        // The first id is a refused new module: it counts among the first; the others are
        // left unwritten.
        let unwritten = ids[1..].iter().map(String::as_str);
        let r = report(&s, unwritten, &[refusal(&ids[0], 2, "no")], configmaps());
        assert_eq!(r.modules.len(), MAX_REPORT_MODULES);
        assert!(r.truncated);
        assert_eq!(r.modules[0].module, ids[0]);
        assert_eq!(
            r.modules.last().unwrap().module,
            ids[MAX_REPORT_MODULES - 1]
        );
        let exactly = report(&held(&[("a/x", 1)]), ["a/x"], &[], configmaps());
        assert!(!exactly.truncated);
    }

    /// Long ids and reasons: fewer modules, so that the body fits what a hub reads.
    #[test]
    fn a_report_fits_in_what_a_hub_reads() {
        let name = "n".repeat(250);
        let refused: Vec<Refusal> = (0..MAX_REPORT_MODULES)
            .map(|i| refusal(&format!("ns/{name}{i:05}"), 1, &"r".repeat(600)))
            .collect();
        let r = report(&held(&[]), [], &refused, configmaps());
        let size = serde_json::to_vec(&r).unwrap().len();
        assert!(size <= MAX_REPORT, "{size}");
        assert!(size > MAX_REPORT / 2, "{size}");
        assert!(r.truncated);
        assert!(r.modules.len() < MAX_REPORT_MODULES);
    }

    #[test]
    fn a_reason_is_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_REPORT_REASON);
        let r = report(&held(&[]), [], &[refusal("a/x", 1, &long)], configmaps());
        let reason = &r.modules[0].refused.as_ref().unwrap().reason;
        assert!(reason.len() <= MAX_REPORT_REASON, "{}", reason.len());
        assert!(reason.len() > MAX_REPORT_REASON - 8);
        assert!(reason.ends_with('…'));
    }

    /// A Secret's refusal says the validator's exit status, never what it printed; the
    /// agent's refusal (`--confirm`) is `by: confirm`, its words not shown for a Secret.
    #[test]
    fn a_secrets_refusal_carries_no_output() {
        let both = Resources::both();
        let refused = [
            refusal(
                "configmap/a/x",
                1,
                "line 3: password=hunter2\n(validator exited with status 1)",
            ),
            refusal("configmap/a/y", 2, "refused by the agent: bad block"),
            refusal(
                "secret/a/x",
                3,
                "line 3: password=hunter2\n(validator exited with status 1)",
            ),
            refusal("secret/a/y", 4, "refused by the agent: password=hunter2"),
        ];
        let r = report(&held(&[]), [], &refused, both);
        let got: Vec<(&str, &str, &str)> = (r.modules.iter())
            .map(|m| {
                let f = m.refused.as_ref().unwrap();
                (m.kind.as_str(), f.by.as_str(), f.reason.as_str())
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "ConfigMap",
                    "validate",
                    "line 3: password=hunter2\n(validator exited with status 1)"
                ),
                ("ConfigMap", "confirm", "bad block"),
                ("Secret", "validate", "validator exited with status 1"),
                (
                    "Secret",
                    "confirm",
                    "(a Secret's agent output is not shown)"
                ),
            ]
        );
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json.matches("hunter2").count(), 1, "{json}");
    }
}
