//! Where ConfigMaps come from: an apiserver (`api.rs`) or a manifests folder
//! (`manifests.rs`). A source streams items to a `Visit`; `mark`/`rollback` let it discard
//! what it already delivered when a paged list has to start over, so a poll never mixes
//! pages of two lists and nothing has to be buffered.

pub mod api;
pub mod manifests;

use crate::kube;
use crate::module::{Item, KeyFilter};
use crate::selector::{FieldSelector, LabelSelector};

/// What to select: the same for every source.
#[derive(Clone, Debug)]
pub struct Selection {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// Empty: all namespaces (one cluster-wide list).
    pub namespaces: Vec<String>,
    pub keys: KeyFilter,
}

impl Selection {
    /// Whether an item matches, checked locally (for manifests, and to check what an
    /// apiserver returned rather than trust it).
    pub fn admits(&self, item: &Item) -> bool {
        (self.namespaces.is_empty() || self.namespaces.contains(&item.namespace))
            && self.labels.matches(|k| item.label(k))
            && self.fields.matches(&item.namespace, &item.name)
    }
}

/// A position in a poll, from `Visit::mark`: opaque to sources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    pub(crate) entries: usize,
    pub(crate) spool: u64,
    pub(crate) not_modules: usize,
    pub(crate) stats: crate::poll::PollStats,
}

/// Receives a poll's items.
pub trait Visit {
    fn item(&mut self, item: Item) -> Result<(), kube::Error>;
    /// The current position, to come back to.
    fn mark(&mut self) -> Mark;
    /// Forgets every item since `mark` was taken.
    fn rollback(&mut self, to: Mark) -> Result<(), kube::Error>;
    /// Whether `reuse(id, resource_version)` would succeed; asked before an item's contents
    /// are read, so that contents the last poll already has are skipped unread.
    fn known(&self, _id: &str, _resource_version: &str) -> bool {
        false
    }
    /// Metadata-first (and items whose contents were skipped): keeps what the last poll had for `id` if it was at this
    /// resourceVersion (a module, or known not to be one). `false`: its contents are needed.
    fn reuse(&mut self, _id: &str, _resource_version: &str) -> bool {
        false
    }
}

/// A source of ConfigMaps.
pub trait Source: Send {
    /// Delivers every selected ConfigMap, or fails; a failure means the poll failed.
    fn list(&mut self, visit: &mut dyn Visit) -> Result<(), kube::Error>;
    /// What the source is, for logs.
    fn describe(&self) -> String;
    /// Running totals of requests by status code and of response bytes (apiservers only).
    fn counters(&self) -> (std::collections::BTreeMap<String, u64>, u64) {
        Default::default()
    }
}
