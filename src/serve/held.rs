//! What a hub holds: its last complete poll, kept as the apiserver served it, in the
//! apiserver's order, with the resourceVersion of each scope it lists.
//!
//! A poll is gathered by `Gather` (the source's `Collect`: every object with its JSON,
//! objects whose resourceVersion the last poll had are taken over from it unread) and
//! becomes a new `Held` only when it is complete; a failed poll leaves the last one as it
//! was. Each scope (a kind, in one namespace or all of them) has two versions: `listed`,
//! the resourceVersion of its last list, and `changed`, that of the last list that found
//! it different (an object added, removed or at a new version) — a list's resourceVersion
//! moves with every write to the kind anywhere in the cluster, what the scope holds does
//! not, and followers wait for the second.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::https::http::Body;
use crate::poll::hash::Hash;
use crate::source::{self, Collect, Item, Mark, Previous, RawObject, Resource, Resources};

/// One object, as served.
#[derive(Debug)]
pub struct HeldObject {
    pub namespace: String,
    pub name: String,
    pub resource_version: String,
    pub labels: Vec<(String, String)>,
    pub raw: RawObject,
    /// Its module's hash (the keys `--keys` selects, as `cmpoll run` hashes them): the
    /// version a follower holds of it.
    pub hash: Hash,
    /// Its `ADDED` and `MODIFIED` watch events, per form, made once for every watcher
    /// (`render::event`).
    pub events: [OnceLock<Body>; 4],
}

impl HeldObject {
    pub fn new(
        namespace: String,
        name: String,
        resource_version: String,
        labels: Vec<(String, String)>,
        raw: RawObject,
        hash: Hash,
    ) -> HeldObject {
        HeldObject {
            namespace,
            name,
            resource_version,
            labels,
            raw,
            hash,
            events: Default::default(),
        }
    }

    /// The object a source delivered with its JSON (`Item::raw`), its hash made of its
    /// selected keys as `cmpoll run` makes a module's.
    pub fn of_item(item: Item) -> Result<HeldObject, String> {
        let Some(raw) = item.raw else {
            return Err(format!("{} came without its JSON", item.id()));
        };
        let mut files: Vec<_> = (item.files.iter())
            .map(|f| (f.key.as_str(), f.content.bytes()))
            .collect();
        files.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let hash = Hash::of(files);
        Ok(HeldObject::new(
            item.namespace,
            item.name,
            item.resource_version,
            item.labels,
            raw,
            hash,
        ))
    }

    /// Its uid, read from its metadata (empty if it has none).
    pub fn uid(&self) -> String {
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(default)]
            uid: String,
        }
        serde_json::from_slice::<Meta>(self.raw.metadata())
            .map_or_else(|_| String::new(), |m| m.uid)
    }

    /// Its key in the apiserver's order: `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The value of label `k`.
    pub fn label(&self, k: &str) -> Option<&str> {
        (self.labels.iter())
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
}

/// A scope the hub lists, and its versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedScope {
    pub kind: Resource,
    /// `None`: all namespaces.
    pub namespace: Option<String>,
    /// The resourceVersion of its last list.
    pub listed: u64,
    /// The resourceVersion of the last list that found it changed.
    pub changed: u64,
}

impl ListedScope {
    /// Whether it holds objects of `namespace` (`None`: whether it is all of them).
    fn covers(&self, namespace: Option<&str>) -> bool {
        match (&self.namespace, namespace) {
            (None, _) => true,
            (Some(own), Some(ns)) => own == ns,
            (Some(_), None) => false,
        }
    }
}

/// A request's versions over the scopes it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Versions {
    /// The oldest of their lists: what the answer is at least as new as.
    pub listed: u64,
    /// The newest change among them.
    pub changed: u64,
}

/// A complete poll.
#[derive(Debug)]
pub struct Held {
    kinds: Resources,
    /// Each kind's objects by `namespace/name` (the apiserver's order).
    objects: [BTreeMap<String, Arc<HeldObject>>; 2],
    pub scopes: Vec<ListedScope>,
    /// The poll it came from.
    pub poll: u64,
    /// When that poll ended.
    pub at: Instant,
}

impl Held {
    /// Nothing yet (no poll): what the first poll's `Previous` is.
    pub fn empty(kinds: Resources) -> Held {
        Held {
            kinds,
            objects: [BTreeMap::new(), BTreeMap::new()],
            scopes: Vec::new(),
            poll: 0,
            at: Instant::now(),
        }
    }

    /// Whether it lists `kind` at all.
    pub fn serves(&self, kind: Resource) -> bool {
        self.kinds.has(kind)
    }

    /// The objects of `kind` in `namespace` (`None`: all), in the apiserver's order.
    pub fn objects(
        &self,
        kind: Resource,
        namespace: Option<&str>,
    ) -> impl Iterator<Item = &Arc<HeldObject>> {
        let all = &self.objects[kind.index()];
        let range = match namespace {
            // `/` sorts after every byte a namespace may hold but `-`, `.` and
            // alphanumerics, so `ns/` up to `ns0` is exactly namespace `ns`.
            Some(ns) => all.range(format!("{ns}/")..format!("{ns}0")),
            None => all.range::<String, _>(..),
        };
        range.map(|(_, o)| o)
    }

    /// `objects`, from the one keyed `from` (`namespace/name`) on.
    pub fn objects_from(
        &self,
        kind: Resource,
        namespace: Option<&str>,
        from: Option<&str>,
    ) -> impl Iterator<Item = &Arc<HeldObject>> {
        let all = &self.objects[kind.index()];
        let (lo, hi) = match namespace {
            Some(ns) => (format!("{ns}/"), Some(format!("{ns}0"))),
            None => (String::new(), None),
        };
        let lo = match from {
            Some(f) if *f > *lo => f.to_string(),
            _ => lo,
        };
        let lo = std::ops::Bound::Included(lo);
        let hi = hi.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        all.range((lo, hi)).map(|(_, o)| o)
    }

    /// One object.
    pub fn get(&self, kind: Resource, namespace: &str, name: &str) -> Option<&Arc<HeldObject>> {
        self.objects[kind.index()].get(&format!("{namespace}/{name}"))
    }

    /// Every object of `kind` with its key (`namespace/name`), in key order: for passes
    /// over every object that look each up elsewhere (`by_key`) without making its key.
    pub fn keyed(&self, kind: Resource) -> impl Iterator<Item = (&str, &Arc<HeldObject>)> {
        self.objects[kind.index()]
            .iter()
            .map(|(k, o)| (k.as_str(), o))
    }

    /// One object, by its key (`namespace/name`).
    pub fn by_key(&self, kind: Resource, key: &str) -> Option<&Arc<HeldObject>> {
        self.objects[kind.index()].get(key)
    }

    /// Objects held, of every kind.
    pub fn len(&self) -> usize {
        self.objects.iter().map(BTreeMap::len).sum()
    }

    /// The versions of what a request for `kind` in `namespace` (`None`: all) reads:
    /// every scope of that kind that holds some of it. `None` before any list of it.
    pub fn versions(&self, kind: Resource, namespace: Option<&str>) -> Option<Versions> {
        let scopes = self.scopes.iter().filter(|s| s.kind == kind);
        let touched: Vec<&ListedScope> = match namespace {
            Some(ns) => scopes.filter(|s| s.covers(Some(ns))).collect(),
            None => scopes.collect(),
        };
        // A namespace no scope lists holds nothing, as of every list of the kind.
        let touched = if touched.is_empty() {
            self.scopes.iter().filter(|s| s.kind == kind).collect()
        } else {
            touched
        };
        Some(Versions {
            listed: touched.iter().map(|s| s.listed).min()?,
            changed: touched.iter().map(|s| s.changed).max()?,
        })
    }

    /// The object a module id names (`NS/NAME`, or `KIND/NS/NAME` with both kinds).
    fn by_id(&self, id: &str) -> Option<&Arc<HeldObject>> {
        let (kind, key) = match Resource::named_in(id).filter(|_| self.kinds.qualified()) {
            Some(kind) => (kind, id.split_once('/').map_or(id, |(_, k)| k)),
            None => (self.kinds.kind_of(id), id),
        };
        self.objects[kind.index()].get(key)
    }
}

impl Previous for Held {
    fn has(&self, id: &str, resource_version: &str) -> bool {
        self.by_id(id)
            .is_some_and(|o| o.resource_version == resource_version)
    }
}

/// A poll being gathered, against the last complete one.
pub struct Gather<'a> {
    prev: &'a Held,
    got: Vec<(Resource, Arc<HeldObject>)>,
    listed: Vec<(Resource, Option<String>, String)>,
}

impl<'a> Gather<'a> {
    pub fn new(prev: &'a Held) -> Gather<'a> {
        Gather {
            prev,
            got: Vec::new(),
            listed: Vec::new(),
        }
    }

    /// The complete poll, numbered `poll`; an error if a resourceVersion is not a
    /// number (the hub compares them, as followers do).
    pub fn finish(self, poll: u64) -> Result<Held, String> {
        let mut objects = [BTreeMap::new(), BTreeMap::new()];
        for (kind, o) in self.got {
            // A later delivery of one object (a list made again) wins.
            objects[kind.index()].insert(o.key(), o);
        }
        let mut listed = Vec::new();
        for (kind, namespace, rv) in self.listed {
            let n: u64 = rv.parse().map_err(|_| {
                format!(
                    "the list of {} has resourceVersion '{rv}', not a number: cmpoll serve compares them",
                    kind.plural()
                )
            })?;
            listed.push((kind, namespace, n));
        }
        Ok(Held::scoped(self.prev, objects, poll, listed))
    }
}

impl Held {
    /// `objects`, listed at `listed` (each scope's resourceVersion), as poll `poll`: a scope
    /// whose objects are those `prev` held, at the same versions, keeps its `changed`.
    fn scoped(
        prev: &Held,
        objects: [BTreeMap<String, Arc<HeldObject>>; 2],
        poll: u64,
        listed: Vec<(Resource, Option<String>, u64)>,
    ) -> Held {
        let mut held = Held {
            kinds: prev.kinds,
            objects,
            scopes: Vec::new(),
            poll,
            at: Instant::now(),
        };
        for (kind, namespace, listed) in listed {
            let before = (prev.scopes.iter()).find(|s| s.kind == kind && s.namespace == namespace);
            let same = |s: &ListedScope| {
                let ns = s.namespace.as_deref();
                // The same objects at the same versions (no key made per object).
                let (mut now, mut then) = (held.objects(kind, ns), prev.objects(kind, ns));
                loop {
                    match (now.next(), then.next()) {
                        (None, None) => break true,
                        (Some(a), Some(b))
                            if Arc::ptr_eq(a, b)
                                || (a.namespace == b.namespace
                                    && a.name == b.name
                                    && a.resource_version == b.resource_version) => {}
                        _ => break false,
                    }
                }
            };
            let changed = match before {
                Some(s) if same(s) => s.changed,
                _ => listed,
            };
            held.scopes.push(ListedScope {
                kind,
                namespace,
                listed,
                changed,
            });
        }
        held
    }

    /// This poll as served under `--validate` (`validated.rs`): each object as `pick`
    /// says from its kind, key and self (itself, another version of it, or none), each scope's `changed` against
    /// `prev`, what was served before.
    pub fn picked(
        &self,
        prev: &Held,
        mut pick: impl FnMut(Resource, &str, &Arc<HeldObject>) -> Option<Arc<HeldObject>>,
    ) -> Held {
        let mut picked = |kind: Resource| -> BTreeMap<String, Arc<HeldObject>> {
            (self.objects[kind.index()].iter())
                .filter_map(|(key, o)| Some((key.clone(), pick(kind, key, o)?)))
                .collect()
        };
        let objects = [picked(Resource::ConfigMaps), picked(Resource::Secrets)];
        let listed = (self.scopes.iter())
            .map(|s| (s.kind, s.namespace.clone(), s.listed))
            .collect();
        Held::scoped(prev, objects, self.poll, listed)
    }
}

impl Collect for Gather<'_> {
    fn mark(&self) -> Mark {
        Mark {
            modules: self.got.len(),
            others: 0,
            spool: 0,
        }
    }

    fn item(&mut self, item: Item) -> Result<(), source::Error> {
        let kind = item.kind;
        let o = HeldObject::of_item(item).map_err(|cause| {
            source::Error::Api(crate::kube::Error::Decode {
                action: format!("list {}", kind.plural()),
                cause,
            })
        })?;
        self.got.push((kind, Arc::new(o)));
        Ok(())
    }

    fn unchanged(&mut self, id: &str) {
        if let Some(o) = self.prev.by_id(id) {
            self.got.push((self.prev.kinds.kind_of(id), o.clone()));
        }
    }

    fn rewind(&mut self, mark: Mark) -> Result<(), source::Error> {
        self.got.truncate(mark.modules);
        Ok(())
    }

    fn listed(&mut self, kind: Resource, namespace: Option<&str>, resource_version: &str) {
        self.listed.push((
            kind,
            namespace.map(str::to_string),
            resource_version.to_string(),
        ));
    }
}
