//! What the fleet's state tells an object's author (`telling.rs` writes it): for each
//! served version some followers refused, one notice — "version sha256:… refused by 2 of
//! 1,000 followers: node-7 (confirm): …; node-9 (validate): …; 998 hold it" — whose count
//! is the number that refused. The words are the followers' own, already cut (and, for a
//! Secret, only the exit status: `intake.rs`); the whole is cut to the apiserver's 1 KiB
//! when written.

use super::view::{Object, State};
use crate::poll::hash::Hash;
use crate::report::Regarding;
use crate::serve::held::Held;
use crate::serve::telling::Notice;
use crate::source::Resource;

/// The notices of `objects` (the fleet's view of what `held` serves).
pub fn notices(objects: &[Object], held: &Held) -> Vec<Notice> {
    let mut out = Vec::new();
    for o in objects.iter().filter(|o| o.counts.refused > 0) {
        let kind = match o.kind {
            "secret" => Resource::Secrets,
            _ => Resource::ConfigMaps,
        };
        let (Some(served), Some(hash)) = (
            held.get(kind, &o.namespace, &o.name),
            Hash::parse(&o.served),
        ) else {
            continue;
        };
        let all: usize = State::ALL.iter().map(|s| o.counts.get(*s)).sum();
        let mut words: Vec<String> = (o.refused.iter())
            .map(|r| format!("{} ({}): {}", r.follower, r.by, r.reason))
            .collect();
        if o.refused_more > 0 {
            words.push(format!("and {} more", o.refused_more));
        }
        out.push(Notice {
            regarding: Regarding {
                kind,
                namespace: o.namespace.clone(),
                name: o.name.clone(),
                uid: served.uid(),
                resource_version: served.resource_version.clone(),
            },
            hash,
            reason: "Refused",
            message: format!(
                "version {} refused by {} of {} followers: {}; {} hold it",
                hash.short(12),
                thousands(o.counts.refused),
                thousands(all),
                words.join("; "),
                thousands(o.counts.current),
            ),
            count: u32::try_from(o.counts.refused).unwrap_or(u32::MAX),
        });
    }
    out
}

fn thousands(n: usize) -> String {
    crate::ops::health::thousands(n)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::Fleet;
    use super::super::intake::{By, Checked, Holding, Refusal};
    use super::super::state::Scope;
    use super::super::view::Which;
    use super::*;
    use crate::serve::testing::{item, kinds, poll};
    use crate::source::{Content, ModuleFile};
    use std::sync::Arc;

    fn holds(hash: Hash, refused: Option<(Hash, &str)>) -> Checked {
        Checked {
            holds: vec![Holding {
                kind: Resource::ConfigMaps,
                key: "team-a/x".to_string().into(),
                hash: Some(hash),
                resource_version: None,
                refused: refused.map(|(h, why)| {
                    Box::new(Refusal {
                        hash: h,
                        resource_version: None,
                        by: By::Confirm,
                        reason: why.into(),
                    })
                }),
            }],
            truncated: false,
        }
    }

    /// One notice per served version some followers refused, with how many of how many,
    /// their names and words, and the count; none while no one refuses.
    #[test]
    fn one_notice_per_refused_version_with_the_fleets_counts() {
        let t0 = Instant::now();
        let mut i = item("team-a", "x", 5, &[]);
        i.files = vec![ModuleFile {
            key: "k".into(),
            content: Content::Text("v".into()),
        }];
        let held = poll(
            &crate::serve::held::Held::empty(kinds()),
            1,
            &[(None, 10)],
            vec![i],
        );
        let served = held.get(Resource::ConfigMaps, "team-a", "x").unwrap().hash;
        let fleet = Fleet::new(t0);
        fleet.served(&held, t0);
        let scope = crate::serve::testing::filter("/api/v1/namespaces/team-a/configmaps", "");
        for n in 0..4 {
            fleet
                .following(
                    &format!("node-{n}"),
                    Arc::new(Scope::new(scope.clone(), 10)),
                    Some(10),
                    t0,
                )
                .unwrap();
        }
        let refused = |f: &Fleet| notices(&f.objects(&held, t0, Which::Refused).0, &held);
        assert!(refused(&fleet).is_empty());
        fleet.take(
            "node-2",
            None,
            holds(served, Some((served, "alloy: bad"))),
            t0,
        );
        fleet.take("node-3", None, holds(served, Some((served, "worse"))), t0);
        let n = refused(&fleet);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].hash, served);
        assert_eq!(n[0].count, 2);
        assert_eq!(n[0].regarding.name, "x");
        assert_eq!(n[0].regarding.resource_version, "5");
        assert_eq!(
            n[0].message,
            format!(
                "version {} refused by 2 of 4 followers: node-2 (confirm): alloy: bad; node-3 (confirm): worse; 2 hold it",
                served.short(12)
            )
        );
    }
}
