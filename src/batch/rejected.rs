//! The modules rejected now, as the delivery remembers them: each with the content refused
//! and why (`Refused`), so that a rejection is announced and logged once per content, not
//! once per poll. A module is no longer rejected once its cluster content is published or it
//! is gone from the cluster. Who rejects (the gate, a failed `.url` fetch, a sink, the
//! agent's answer to `--confirm`) hands a `Rejection` (`crate::reason`); what the gate
//! remembers across restarts is its own (`validate/`).

use std::borrow::Cow;
use std::collections::HashMap;

use super::event::{Change, Event};
use crate::poll::hash::Hash;
use crate::poll::snapshot::{Rv, Snapshot};
use crate::poll::spool::Spool;
use crate::reason::Rejection;
use crate::validate::Refused;

/// The modules rejected now.
#[derive(Debug, Default)]
pub struct Rejected {
    by_module: HashMap<String, Refused>,
    /// The resourceVersion each rejected content came with (what a follower tells its hub).
    versions: HashMap<String, Rv>,
}

impl Rejected {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_module.len()
    }

    /// The version of `id` rejected now, if it is.
    pub fn hash(&self, id: &str) -> Option<Hash> {
        self.by_module.get(id).map(|r| r.hash)
    }

    /// The resourceVersion the content of `id` rejected now came with, if it is a number.
    pub fn resource_version(&self, id: &str) -> Option<u64> {
        self.versions.get(id).and_then(|rv| rv.number())
    }

    /// Each module rejected now, and why (`/status`), in module order.
    pub fn all(&self) -> Vec<Rejection> {
        let mut all: Vec<Rejection> = (self.by_module.iter())
            .map(|(id, r)| Rejection::new(id.as_str(), r.reason.as_str()))
            .collect();
        all.sort_by(|a, b| a.module.cmp(&b.module));
        all
    }

    /// `rejection`'s module's event becomes `rejected` (announced and logged once per
    /// content), or goes if this content was announced already. Whether it was announced
    /// now.
    pub fn reject(&mut self, spool: &Spool, events: &mut Vec<Event>, rejection: Rejection) -> bool {
        let Rejection { module, reason } = rejection;
        let Some(i) = events.iter().position(|e| e.id == module) else {
            return false;
        };
        let hash = events[i].entry.hash;
        if self.by_module.get(&module).map(|r| r.hash) == Some(hash) {
            // The same content again, perhaps at a new resourceVersion (a label edited):
            // the version refused is that one now (what a follower tells its hub).
            self.versions
                .insert(module, events[i].entry.resource_version);
            events.remove(i);
            return false;
        }
        let shows = spool
            .meta(events[i].entry.loc)
            .is_ok_and(|m| m.kind.shows_contents());
        let rv = events[i].entry.resource_version;
        self.remember(&module, (hash, rv), &reason, shows, "");
        events[i].reject(reason);
        true
    }

    /// `module` is rejected at `hash` for `reason` (logged: `shows`, whether its kind may
    /// show what the validator or agent said; `then`, what follows in the log line).
    pub fn remember(
        &mut self,
        module: &str,
        (hash, rv): (Hash, Rv),
        reason: &str,
        shows: bool,
        then: &str,
    ) {
        // A Secret's validator (or agent) output may quote it: the log shows its exit
        // status only.
        let shown = match shows {
            true => Cow::Borrowed(reason),
            false => Cow::Owned(crate::reason::redacted(reason)),
        };
        log::warn!("module {module} rejected: {shown}{then}");
        let refused = Refused {
            hash,
            reason: reason.to_string(),
        };
        self.by_module.insert(module.to_string(), refused);
        self.versions.insert(module.to_string(), rv);
    }

    /// Modules gone from the cluster (`next`) are no longer rejected.
    pub fn forget_gone(&mut self, next: &Snapshot) {
        self.by_module.retain(|id, _| next.modules.contains_key(id));
        let kept = &self.by_module;
        self.versions.retain(|id, _| kept.contains_key(id));
    }

    /// After the sinks took `applied`: a module whose cluster content (`next`) was
    /// published, or that is gone, is no longer rejected (a last good version announced
    /// at start is not its cluster content). The modules published again (`Accepted`).
    pub fn settle(&mut self, applied: &[Event], next: &Snapshot) -> Vec<String> {
        let published = |id: &String| {
            applied.iter().any(|e| {
                e.id == id
                    && e.is_change()
                    && next.modules.get(id).map(|n| n.hash) == Some(e.entry.hash)
            })
        };
        let accepted = (self.by_module.keys())
            .filter(|id| next.modules.contains_key(id) && published(id))
            .cloned()
            .collect();
        self.by_module
            .retain(|id, _| next.modules.contains_key(id) && !published(id));
        let kept = &self.by_module;
        self.versions.retain(|id, _| kept.contains_key(id));
        accepted
    }
}

/// A restart seeded the last good version of rejected `id`: that is what the sinks hold,
/// so a run's first batch announces it, before the rejection.
pub fn announce_last_good<'a>(events: &mut Vec<Event<'a>>, current: &'a Snapshot, id: &str) {
    if let Some(good) = current.modules.get(id)
        && let Some(at) = events.iter().position(|e| e.id == id)
    {
        let id = events[at].id;
        events.insert(at, Event::new(Change::Added, id, good));
    }
}
