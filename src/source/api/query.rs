//! What every way of listing the apiserver asks and how it takes an answer: the selection
//! turned into a request's query (`url`), each returned object checked against it
//! (`selected`, warned about once per version when it does not match: the answer is
//! checked, not trusted), named as a module (`id`, `qualify`), read with its JSON kept
//! where `cmpoll serve` serves it (`raw`); and a watch's events taken as a list would have
//! given them (`changed`), which both the follower's held watch and the hub's short watch
//! use.

use std::collections::{HashMap, HashSet};

use crate::kube;
use crate::source::reader::{ListMeta, Meta, read_object};
use crate::source::scope::{Scope, encode};
use crate::source::watching::Event;
use crate::source::{Collect, Error, Item, Resource, Selection};

/// The selection, and how answers are read against it.
pub(in crate::source) struct Query {
    selection: Selection,
    /// Keep each object's JSON as served (`Item::raw`): `cmpoll serve`.
    raw: bool,
    /// Items already warned about, so a daemon does not repeat itself every poll.
    warned: HashSet<String>,
}

impl Query {
    pub fn new(selection: Selection) -> Query {
        Query {
            selection,
            raw: false,
            warned: HashSet::new(),
        }
    }

    /// Keeps each object's JSON as served (`Item::raw`), or not.
    pub fn keep_raw(&mut self, raw: bool) {
        self.raw = raw;
    }

    pub fn selection(&self) -> &Selection {
        &self.selection
    }

    /// Whether each object's JSON is kept as served.
    pub fn raw(&self) -> bool {
        self.raw
    }

    /// One object read from `body`: its kind, metadata and item (`reader::read_object`
    /// with this selection's keys, folder annotation and `raw`).
    pub fn read(
        &self,
        body: impl std::io::Read,
        resource: Resource,
    ) -> Result<(String, Meta, Item), crate::source::reader::ReadError> {
        let s = &self.selection;
        read_object(
            body,
            &s.keys,
            resource,
            s.folder_annotation.as_deref(),
            self.raw,
        )
    }

    /// The path of `scope` with the selection's selectors and `params` as its query.
    pub fn url(&self, scope: Scope, params: &[(&str, String)]) -> String {
        let mut query = Vec::new();
        if !self.selection.labels.as_str().is_empty() {
            query.push(("labelSelector", self.selection.labels.as_str().to_string()));
        }
        if !self.selection.fields.as_str().is_empty() {
            query.push(("fieldSelector", self.selection.fields.as_str().to_string()));
        }
        query.extend(params.iter().map(|(k, v)| (*k, v.clone())));
        let query: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        format!("{}?{}", scope.path(), query.join("&"))
    }

    /// Whether an item the apiserver returned is in the scope and the selection; warns once
    /// per version about one that is not.
    pub fn selected(&mut self, scope: Scope, m: &Meta) -> bool {
        let in_scope = scope.0.is_none_or(|n| m.namespace == n);
        if in_scope && self.selection.admits(&m.namespace, &m.name, &m.labels) {
            return true;
        }
        let id = m.id();
        if self.warned.insert(format!(
            "{}/{id}@{}",
            scope.1.singular(),
            m.resource_version
        )) {
            log::warn!(
                "the apiserver returned {} {id}, which the selection does not match; ignored",
                scope.1.singular()
            );
        }
        false
    }

    /// The module id of a listed object (see `Resources::id`).
    pub fn id(&self, kind: Resource, m: &Meta) -> String {
        self.selection.resources.id(kind, &m.namespace, &m.name)
    }

    /// An item as the poll takes it: its id qualified by its kind when both are listed.
    pub fn qualify(&self, mut item: Item) -> Item {
        item.qualified = self.selection.resources.qualified();
        item
    }

    /// The names `scope` is read by (`Selection::names`: k8s-sidecar's `RESOURCE_NAME`),
    /// if any: such a scope is read by a GET of each, not listed.
    pub fn named(&self, scope: Scope) -> Option<Vec<String>> {
        let ns = scope.0?;
        let names: Vec<String> = (self.selection.names.iter())
            .filter(|n| n.namespace.as_deref().is_none_or(|x| x == ns))
            .filter(|n| n.kind.is_none_or(|k| k == scope.1))
            .map(|n| n.name.clone())
            .collect();
        (!names.is_empty()).then_some(names)
    }

    /// What a list would have given for `scope`, held at `from` with `ids`, after
    /// `events` (up to `rv`, or the newest event's version): each id unchanged, delivered
    /// or gone. Returns the list's metadata and the ids selected now, for the caller to
    /// hold once the poll is complete (`Source::polled`).
    pub fn changed(
        &mut self,
        scope: Scope,
        from: u64,
        rv: u64,
        events: impl Iterator<Item = Event>,
        ids: Vec<String>,
        out: &mut dyn Collect,
    ) -> Result<(ListMeta, Vec<String>), Error> {
        let fail = |cause: String| {
            Error::Api(kube::Error::Decode {
                action: scope.action(),
                cause,
            })
        };
        let mut rv = rv;
        let mut changed: HashMap<String, Option<Item>> = HashMap::new();
        for e in events {
            let (kind, meta, item) = (self.read(&e.object[..], scope.1))
                .map_err(|e| fail(format!("a watch event that is not an object: {e:?}")))?;
            if kind != scope.1.kind() {
                return Err(fail(format!("a watch event about a '{kind}'")));
            }
            let id = self.id(scope.1, &meta);
            let version = meta.resource_version.parse::<u64>().ok();
            rv = rv.max(version.unwrap_or(0));
            // Never taken back in time: a change at or before the version held is in it,
            // a deletion too (a hub that held a change back may release it late: issue
            // 56.3, where a deletion older than a re-creation the follower held removed it).
            if version.is_some_and(|v| v <= from) {
                log::debug!(
                    "{}: an event about {id} not newer than what is held; not taken",
                    scope.action()
                );
                continue;
            }
            let keep = !e.deleted && self.selected(scope, &meta);
            changed.insert(id, keep.then(|| self.qualify(item)));
        }
        let mut now_ids = Vec::with_capacity(ids.len());
        for id in ids {
            match changed.remove(&id) {
                None => {
                    out.unchanged(&id);
                    now_ids.push(id);
                }
                Some(None) => {}
                Some(Some(item)) => {
                    out.item(item)?;
                    now_ids.push(id);
                }
            }
        }
        for (id, item) in changed {
            if let Some(item) = item {
                out.item(item)?;
                now_ids.push(id);
            }
        }
        now_ids.sort();
        log::debug!("{}: watched up to resourceVersion {rv}", scope.action());
        let meta = ListMeta {
            kind: format!("{}List", scope.1.kind()),
            resource_version: Some(rv.to_string()),
            continue_token: None,
            remaining_item_count: None,
        };
        Ok((meta, now_ids))
    }
}
