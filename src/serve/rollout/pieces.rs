//! What one object is served, cohort by cohort, while the hub tells its clients apart
//! (`views.rs`): `Pieces`, from the lowest cohort up, each the version its cohorts are
//! served until its cut (the last, every cohort above). Each piece keeps what it is made of
//! (its `source`: the object as the apiserver served it, a stable version, a held-back
//! one, or none) and what is served of it: the source itself when it is newer than
//! anything the hub's watchers were told, else the source at the version of the poll
//! that served it (`at`), so that a watcher's versions never go back — a version rolled
//! out to a cohort minutes after its write reaches it as a change newer than what it has.
//!
//! A change of plan (`Pieces::moved_to`) changes only the cohorts whose source changes:
//! the others keep what they were served, byte for byte, and hear of nothing.

use std::sync::Arc;

use crate::serve::event::with_resource_version;
use crate::serve::held::HeldObject;
use crate::source::RawObject;

/// One cohort range's version.
#[derive(Clone, Debug)]
pub struct Piece {
    /// The cohorts below this (and above the piece before).
    pub hi: f64,
    /// What it is made of (`None`: the object does not exist for these cohorts).
    pub source: Option<Arc<HeldObject>>,
    /// What is served.
    pub served: Option<Arc<HeldObject>>,
}

/// An object's pieces, from the lowest cohort up; the last one's `hi` is infinite.
#[derive(Clone, Debug)]
pub struct Pieces(pub Vec<Piece>);

/// What a plan asks: from the lowest cohort up, each range's source.
pub type Plan = Vec<(f64, Option<Arc<HeldObject>>)>;

/// Whether two sources are one version, as served (the same object, or the same bytes).
pub fn same(a: &Option<Arc<HeldObject>>, b: &Option<Arc<HeldObject>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            Arc::ptr_eq(a, b)
                || (a.resource_version == b.resource_version && a.raw.json == b.raw.json)
        }
        _ => false,
    }
}

impl Pieces {
    /// One piece for every cohort: `served` as it is.
    #[cfg(test)]
    pub fn whole(served: Option<Arc<HeldObject>>) -> Pieces {
        Pieces(vec![Piece {
            hi: f64::INFINITY,
            source: served.clone(),
            served,
        }])
    }

    /// What a client of cohort `h` is served.
    pub fn at(&self, h: f64) -> Option<&Arc<HeldObject>> {
        let p = self.0.iter().find(|p| h < p.hi).or(self.0.last())?;
        p.served.as_ref()
    }

    /// What the version a client of cohort `h` is served is made of.
    pub fn source_at(&self, h: f64) -> Option<&Arc<HeldObject>> {
        let p = self.0.iter().find(|p| h < p.hi).or(self.0.last())?;
        p.source.as_ref()
    }

    /// Its cuts (the finite `hi`s).
    pub fn cuts(&self) -> impl Iterator<Item = f64> + '_ {
        self.0.iter().map(|p| p.hi).filter(|h| h.is_finite())
    }

    /// One piece whose served version is `o` itself: nothing to tell apart any more.
    pub fn only(&self, o: &Arc<HeldObject>) -> bool {
        matches!(&self.0[..], [p] if p.served.as_ref().is_some_and(|s| Arc::ptr_eq(s, o)))
    }

    /// The pieces `plan` asks for, each range whose source changed served anew: the source
    /// itself when its version is newer than `told` (the newest version the hub's
    /// watchers may have been told), else the source at `at`. `None` when some range must
    /// be served anew and `at` is not newer than `told` (not yet: the hub must list past
    /// what it told first).
    pub fn moved_to(&self, plan: &Plan, told: u64, at: u64) -> Option<Pieces> {
        let mut cuts: Vec<f64> = (self.0.iter().map(|p| p.hi))
            .chain(plan.iter().map(|(hi, _)| *hi))
            .collect();
        cuts.sort_by(f64::total_cmp);
        cuts.dedup();
        let mut out: Vec<Piece> = Vec::new();
        for hi in cuts {
            let old = self.0.iter().find(|p| p.hi >= hi).or(self.0.last())?;
            let want = &plan.iter().find(|(c, _)| *c >= hi).or(plan.last())?.1;
            let served = match same(&old.source, want) {
                true => old.served.clone(),
                false => match want {
                    None => None,
                    Some(o) if rv(o) > told => Some(o.clone()),
                    Some(_) if at <= told => return None,
                    Some(o) => Some(Arc::new(at_version(o, at))),
                },
            };
            let piece = Piece {
                hi,
                source: want.clone(),
                served,
            };
            match out.last_mut() {
                // Side by side, one version: one piece.
                Some(last)
                    if same(&last.served, &piece.served) && same(&last.source, &piece.source) =>
                {
                    last.hi = hi;
                }
                _ => out.push(piece),
            }
        }
        Some(Pieces(out))
    }
}

fn rv(o: &HeldObject) -> u64 {
    o.resource_version.parse().unwrap_or(0)
}

/// `o` served at resourceVersion `at` (its JSON's `metadata.resourceVersion` too).
pub fn at_version(o: &HeldObject, at: u64) -> HeldObject {
    let json = with_resource_version(&o.raw.json, at);
    let grown = json.len() as isize - o.raw.json.len() as isize;
    let meta = &o.raw.metadata;
    let raw = RawObject {
        json: json.into_boxed_slice(),
        metadata: meta.start..(meta.end as isize + grown) as usize,
    };
    HeldObject::new(
        o.namespace.clone(),
        o.name.clone(),
        at.to_string(),
        o.labels.clone(),
        raw,
        o.hash,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::hash::Hash;

    fn obj(rv: u64, data: &str) -> Arc<HeldObject> {
        let meta = format!(r#"{{"name":"a","namespace":"ns","resourceVersion":"{rv}"}}"#);
        let json = format!(
            r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{meta},"data":{{"k":"{data}"}}}}"#
        );
        let start = json.find("\"metadata\":").unwrap() + 11;
        Arc::new(HeldObject::new(
            "ns".into(),
            "a".into(),
            rv.to_string(),
            Vec::new(),
            RawObject {
                json: json.into_bytes().into_boxed_slice(),
                metadata: start..start + meta.len(),
            },
            Hash::of([("k", data.as_bytes())]),
        ))
    }

    #[test]
    fn a_cohort_whose_source_changes_is_served_it_at_the_polls_version() {
        let (stable, new) = (obj(10, "old"), obj(12, "new"));
        let p = Pieces::whole(Some(stable.clone()));
        // Told up to 20: the new version (12) reaches the first cohort at 21.
        let plan: Plan = vec![
            (0.1, Some(new.clone())),
            (f64::INFINITY, Some(stable.clone())),
        ];
        assert!(
            p.moved_to(&plan, 20, 20).is_none(),
            "not past what was told"
        );
        let q = p.moved_to(&plan, 20, 21).unwrap();
        assert_eq!(q.0.len(), 2);
        let first = q.at(0.05).unwrap();
        assert_eq!(first.resource_version, "21");
        assert_eq!(first.hash, new.hash);
        assert!(String::from_utf8_lossy(&first.raw.json).contains(r#""resourceVersion":"21""#));
        assert_eq!(
            first.raw.metadata(),
            br#"{"name":"a","namespace":"ns","resourceVersion":"21"}"#
        );
        // The others keep what they had, the very object.
        assert!(Arc::ptr_eq(q.at(0.5).unwrap(), &stable));
        assert_eq!(q.cuts().collect::<Vec<_>>(), vec![0.1]);
        // The next step: the second cohort moves, the first keeps its version.
        let plan: Plan = vec![
            (0.5, Some(new.clone())),
            (f64::INFINITY, Some(stable.clone())),
        ];
        let r = q.moved_to(&plan, 21, 25).unwrap();
        assert_eq!(r.at(0.05).unwrap().resource_version, "21");
        assert_eq!(r.at(0.3).unwrap().resource_version, "25");
        assert!(Arc::ptr_eq(r.at(0.7).unwrap(), &stable));
        assert_eq!(r.cuts().collect::<Vec<_>>(), vec![0.1, 0.5]);
        // Nothing moves: the same pieces, and no version needed.
        let same = r.moved_to(&plan, 25, 25).unwrap();
        assert_eq!(same.at(0.3).unwrap().resource_version, "25");
    }

    #[test]
    fn a_version_newer_than_what_was_told_is_served_as_it_is() {
        let (stable, newer) = (obj(10, "old"), obj(30, "newer"));
        let p = Pieces::whole(Some(stable));
        let plan: Plan = vec![(f64::INFINITY, Some(newer.clone()))];
        let q = p.moved_to(&plan, 20, 20).unwrap();
        assert!(q.only(&newer));
        // A new object for the first cohort only: the others do not see it.
        let none = Pieces::whole(None);
        let plan: Plan = vec![(0.1, Some(newer.clone())), (f64::INFINITY, None)];
        let q = none.moved_to(&plan, 20, 20).unwrap();
        assert!(Arc::ptr_eq(q.at(0.0).unwrap(), &newer));
        assert!(q.at(0.2).is_none());
    }
}
