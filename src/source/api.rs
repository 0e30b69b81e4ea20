//! The apiserver as a source: one LIST per `--namespace` (or one cluster-wide) and kind
//! (`--resource`), each served from the watch cache.
//!
//! Unpaged (the default): the first list of a scope uses `resourceVersion=0`; later ones
//! `resourceVersion=<that scope's last list>&resourceVersionMatch=NotOlderThan`; a 504 "Too
//! large resource version" (this apiserver's cache is behind) falls back to
//! `resourceVersion=0` for that request, and an answer older than what was already seen
//! fails the poll: results never go back in time. `--page-size N` pages with
//! `limit`/`continue` and no resourceVersion, as client-go's pager does, bounded to
//! 10 × `--timeout` and `MAX_PAGES`; a 410 on a later page lists the scope once more,
//! unpaged. `--list-mode auto` (the default) and `metadata` list metadata only
//! (`PartialObjectMetadataList`, same routing; asked in protobuf first, read by
//! `proto.rs`, else JSON) after a scope's first full list, and GET
//! from the cache only the objects whose resourceVersion changed, unless more changed than
//! GETs are worth: then that request is made again for full objects. A 403 on such a GET
//! (a role with `list` but not `get`) fails the poll under `metadata`; under `auto` the
//! request is made again in full and the scope stays on full lists for the rest of the
//! run, with one warning. Only a list removes a module: an object a GET finds deleted or
//! relabelled (a 404 NotFound `Status` about that very object) stays as the last poll had
//! it until the next list, and any other 404 fails the poll. An apiserver that answers a
//! metadata request with a full list
//! is used as is (the response `kind` decides). Every item is checked against the
//! selection: the answer is checked, not trusted.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::follow::Follow;
use super::proto::{self, MetaListReader};
use super::reader::{ListMeta, ListReader, Meta, ReadError};
use super::scope::{ListRequest, Scope, encode};
use super::watching::{self, Streams};
use super::{Collect, Error, Item, ListMode, Previous, Resource, Selection, Source};
use crate::kube::client::{Failure, Waited};
use crate::kube::{self, Client};

mod named;
mod paged;
mod short_watch;
mod watched;

const ACCEPT_JSON: &str = "application/json";
/// Metadata only, in protobuf (half the apiserver's CPU of JSON) or JSON, or the full
/// list from an apiserver that cannot (the kind tells which): client-go's metadata client
/// asks the same (k8s.io/client-go/metadata/metadata.go).
const ACCEPT_METADATA: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
/// A short watch's `timeoutSeconds` (`short_watch.rs`): the apiserver ends it after this.
const SHORT_WATCH: Duration = Duration::from_secs(1);
/// The most pages one paged list may take (with the time bound of 10 × `--timeout`).
const MAX_PAGES: u32 = 10_000;

pub struct ApiSource {
    client: Client,
    selection: Selection,
    page_size: u32,
    mode: ListMode,
    /// The resourceVersion of each scope's last list ("" = all namespaces).
    last_rv: HashMap<String, String>,
    /// Scopes listed completely at least once: metadata lists start after the first.
    listed: HashSet<String>,
    /// Scopes where `get` is forbidden (`auto`): full lists only.
    full_only: HashSet<String>,
    /// Items already warned about, so a daemon does not repeat itself every poll.
    warned: HashSet<String>,
    /// Keep each object's JSON as served (`Item::raw`): `cmpoll serve`.
    raw: bool,
    /// A listed scope's changes from a short watch (`short_watch.rs`): `cmpoll serve`.
    short_watch: bool,
    /// The ids the last list request selected (a short watch goes on from them).
    listed_ids: Vec<String>,
    /// This poll's short watches by scope: opened together at its start, then read
    /// (`short_watch.rs`).
    opened: HashMap<String, Short>,
    /// How far each kind's scopes must be taken this poll (`Source::behind`).
    floors: HashMap<Resource, u64>,
    /// Following a `cmpoll serve` hub (`follow.rs`), by its held watches (`watching.rs`).
    follow: Follow,
    streams: Streams,
    /// What this poll's watches took (scope, version, ids): held once the poll is
    /// complete (`Source::polled`).
    taken: Vec<(String, String, Vec<String>)>,
    rng: crate::backoff::Rng,
}

/// A scope's short watch in this poll (`short_watch.rs`).
enum Short {
    /// Opened: the version and ids it goes on from, its body.
    Open {
        from: u64,
        ids: Vec<String>,
        body: Box<kube::client::Body>,
    },
    /// Read to its end: from where, up to which version, with which events.
    Read {
        from: u64,
        ids: Vec<String>,
        rv: u64,
        events: Vec<watching::Event>,
    },
    /// Behind another scope of its kind: listed instead, at least as new as this.
    Behind(u64),
}

/// What one list request gave: the list's own metadata, how many selected items it held,
/// and the metadata-only items whose contents are still to be fetched.
struct Listed {
    meta: ListMeta,
    selected: usize,
    fetch: Vec<Meta>,
    /// Every selected id, when a hub answered.
    ids: Vec<String>,
}

impl ApiSource {
    pub fn new(client: Client, selection: Selection, page_size: u32, mode: ListMode) -> ApiSource {
        ApiSource {
            client,
            selection,
            page_size,
            mode,
            last_rv: HashMap::new(),
            listed: HashSet::new(),
            full_only: HashSet::new(),
            warned: HashSet::new(),
            raw: false,
            short_watch: false,
            listed_ids: Vec::new(),
            opened: HashMap::new(),
            floors: HashMap::new(),
            follow: Follow::new(None),
            streams: Streams::default(),
            taken: Vec::new(),
            rng: crate::backoff::Rng::from_time(),
        }
    }

    /// Keeps each object's JSON as the apiserver served it (`Item::raw`).
    pub fn keeping_raw(mut self, raw: bool) -> ApiSource {
        self.raw = raw;
        self
    }

    /// Asks for a listed scope's changes with a short watch (`short_watch.rs`).
    pub fn short_watching(mut self, on: bool) -> ApiSource {
        self.short_watch = on;
        self
    }

    /// Where a `cmpoll serve` hub answers, asks it to hold each poll's first list up to
    /// `wait` until it has a newer one (see `hub_protocol::WAIT_HEADER`).
    pub fn waiting(mut self, wait: Option<Duration>) -> ApiSource {
        self.follow = Follow::new(wait);
        self
    }

    fn list_scope(
        &mut self,
        scope: Scope,
        prev: &dyn Previous,
        out: &mut dyn Collect,
    ) -> Result<(), Error> {
        // The first list of a scope is a full one: every item would need a GET.
        let metadata = self.mode != ListMode::Full
            && self.listed.contains(&scope.key())
            && !self.full_only.contains(&scope.key());
        let meta = if self.page_size > 0 {
            let mark = out.mark();
            self.list_paged(scope, metadata, prev, out, mark)?
        } else {
            self.list_cached(scope, metadata, prev, out)?
        };
        let rv = meta.resource_version.clone();
        self.advance(scope, meta.resource_version)?;
        self.listed.insert(scope.key());
        if let Some(rv) = rv {
            out.listed(scope.1, scope.0, &rv);
        }
        Ok(())
    }

    /// One unpaged list from the watch cache (with the 504 fallback to `resourceVersion=0`).
    fn list_cached(
        &mut self,
        scope: Scope,
        metadata: bool,
        prev: &dyn Previous,
        out: &mut dyn Collect,
    ) -> Result<ListMeta, Error> {
        // A hub this follower holds a list of is watched instead (`watching.rs`).
        if let Some(meta) = self.watched(scope, out)? {
            return Ok(meta);
        }
        if let Some(meta) = self.short_watched(scope, out)? {
            return Ok(meta);
        }
        let mut rv = self.last_rv.get(&scope.key()).cloned();
        if let Some(Short::Behind(floor)) = self.opened.remove(&scope.key()) {
            // Listed to be at least as new as the other scopes of its kind.
            let held = rv.as_deref().and_then(|v| v.parse::<u64>().ok());
            rv = Some(held.unwrap_or(0).max(floor).to_string());
        }
        loop {
            let params = match &rv {
                Some(v) => vec![
                    ("resourceVersion", v.clone()),
                    ("resourceVersionMatch", "NotOlderThan".to_string()),
                ],
                None => vec![("resourceVersion", "0".to_string())],
            };
            // A hub holds the poll's first list until it has a newer one.
            let wait = self.follow.wait_for(&scope.key(), rv.as_deref());
            let req = ListRequest {
                wait,
                ..ListRequest::new(scope, &params, metadata)
            };
            let listed = self.fetched_list(req, prev, out);
            if let Ok(ListMeta {
                resource_version: Some(v),
                ..
            }) = &listed
            {
                self.follow.listed(&scope.key(), v);
                if self.short_watch && !self.follow.hub() {
                    let ids = std::mem::take(&mut self.listed_ids);
                    self.taken.push((scope.key(), v.clone(), ids));
                }
            }
            match listed {
                Err(Error::Api(e)) if rv.is_some() && e.is_too_large_resource_version() => {
                    log::info!(
                        "{e}; this apiserver's cache is behind, listing with resourceVersion=0 instead"
                    );
                    rv = None;
                }
                other => return other,
            }
        }
    }

    /// One list request, and the GETs it calls for. With `metadata`, when more changed than
    /// GETs are worth (`worth_a_full_list`), or a GET is forbidden under
    /// `auto`, what this request delivered is forgotten and the same request made again
    /// for full objects (only this request's: earlier pages stay).
    fn fetched_list(
        &mut self,
        req: ListRequest,
        prev: &dyn Previous,
        out: &mut dyn Collect,
    ) -> Result<ListMeta, Error> {
        let scope = req.scope;
        // A later page of a scope that has just turned to full lists.
        let metadata = req.metadata && !self.full_only.contains(&scope.key());
        let mark = out.mark();
        let listed = self.list(ListRequest { metadata, ..req }, prev, out)?;
        let again_in_full = |me: &mut Self, out: &mut dyn Collect| {
            out.rewind(mark)?;
            let full = ListRequest {
                metadata: false,
                wait: None,
                ..req
            };
            Ok(me.list(full, prev, out)?.meta)
        };
        let resource = scope.1;
        if worth_a_full_list(listed.fetch.len(), listed.selected) {
            log::debug!(
                "{} of {} {} changed: listing them in full rather than one GET each",
                listed.fetch.len(),
                listed.selected,
                resource.plural()
            );
            return again_in_full(self, out);
        }
        for meta in listed.fetch {
            match self.get_one(resource, &meta) {
                Ok(Some(item)) => out.item(item)?,
                Ok(None) => {
                    // Deleted or relabelled since the list: only a list removes a module,
                    // so it stays as the last poll had it until the next list says.
                    log::debug!(
                        "{} {}: gone since the list; kept until a list confirms it",
                        resource.singular(),
                        meta.id()
                    );
                    out.unchanged(&self.id(resource, &meta));
                    self.follow.unsettle(&scope.key());
                }
                Err(Error::Api(e)) if e.code() == Some(403) && self.mode == ListMode::Auto => {
                    log::warn!(
                        "{e}; the role has list but not get on {r}: {} in full from now on (grant get on {r} to have only changed objects fetched, or set --list-mode full)",
                        scope.action(),
                        r = resource.plural(),
                    );
                    self.full_only.insert(scope.key());
                    return again_in_full(self, out);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(listed.meta)
    }

    /// One list request; each selected item is unchanged, delivered, or queued for a GET.
    fn list(
        &mut self,
        req: ListRequest,
        prev: &dyn Previous,
        out: &mut dyn Collect,
    ) -> Result<Listed, Error> {
        let ListRequest {
            scope,
            params,
            metadata,
            wait,
        } = req;
        let url = self.url(scope, params);
        let accept = if metadata {
            ACCEPT_METADATA
        } else {
            ACCEPT_JSON
        };
        self.follow.listing();
        let mut body = match wait {
            Some(w) => match self.client.get_waiting(&url, accept, &scope.action(), w)? {
                Waited::Body(body) => *body,
                Waited::NotModified => return self.not_modified(scope, params, out),
            },
            None => self.client.get(&url, accept, &scope.action())?,
        };
        self.follow.answered(body.hub());
        let fail = body.failure();
        let read = |e: ReadError| read_error(&fail, "not a valid list", e);
        let annotation = self.selection.folder_annotation.clone();
        let annotation = annotation.as_deref();
        let mut listed = Listed {
            meta: ListMeta::default(),
            selected: 0,
            fetch: Vec::new(),
            ids: Vec::new(),
        };
        if metadata && body.media_type() == proto::MEDIA_TYPE {
            let mut list = MetaListReader::new(&mut body).map_err(read)?;
            while let Some(meta) = list.next_meta(annotation).map_err(read)? {
                self.take(scope, meta, prev, out, &mut listed);
            }
            listed.meta = list.finish().map_err(read)?;
            log::debug!("{}: {} in protobuf", scope.action(), listed.meta.kind);
        } else {
            let mut list = ListReader::new(&mut body).map_err(read)?;
            while let Some(raw) = list.next_item().map_err(read)? {
                let meta = raw.meta(annotation).map_err(read)?;
                if let Some(meta) = self.take(scope, meta, prev, out, &mut listed) {
                    let mut item = raw
                        .item(meta, &self.selection.keys, scope.1)
                        .map_err(read)?;
                    if self.raw {
                        item.raw = Some(raw.raw());
                    }
                    out.item(self.qualify(item))?;
                }
            }
            listed.meta = list.finish().map_err(read)?;
            log::debug!("{}: {} in JSON", scope.action(), listed.meta.kind);
        }
        let list_kind = format!("{}List", scope.1.kind());
        let kinds: &[&str] = if metadata {
            &[&list_kind, "PartialObjectMetadataList"]
        } else {
            &[&list_kind]
        };
        if !kinds.contains(&listed.meta.kind.as_str()) {
            return Err(fail
                .decode(format!(
                    "expected a {}, got kind '{}'",
                    kinds.join(" or a "),
                    listed.meta.kind
                ))
                .into());
        }
        if self.follow.hub() {
            self.follow.selected(std::mem::take(&mut listed.ids));
        } else if self.short_watch {
            self.listed_ids = std::mem::take(&mut listed.ids);
        }
        Ok(listed)
    }

    /// A hub's 304 to a held list: nothing newer than the list this scope had, whose
    /// objects all stay as they were.
    fn not_modified(
        &mut self,
        scope: Scope,
        params: &[(&str, String)],
        out: &mut dyn Collect,
    ) -> Result<Listed, Error> {
        let asked = (params.iter())
            .find(|(k, _)| *k == "resourceVersion")
            .map(|(_, v)| v.as_str());
        let Some((rv, ids)) = self.follow.not_modified(&scope.key(), asked) else {
            return Err(Error::Api(kube::Error::Decode {
                action: scope.action(),
                cause: "the hub answered 304 Not Modified about a list this cmpoll does not hold"
                    .into(),
            }));
        };
        for id in &ids {
            out.unchanged(id);
        }
        log::debug!(
            "{}: not modified since resourceVersion {rv}",
            scope.action()
        );
        Ok(Listed {
            meta: ListMeta {
                kind: format!("{}List", scope.1.kind()),
                resource_version: Some(rv),
                continue_token: None,
                remaining_item_count: None,
            },
            selected: ids.len(),
            fetch: Vec::new(),
            ids: Vec::new(),
        })
    }

    /// One listed item's metadata: not selected, unchanged, or queued for a GET (a
    /// metadata-only item) go where they belong; a full item whose contents are wanted is
    /// handed back to be read.
    fn take(
        &mut self,
        scope: Scope,
        meta: Meta,
        prev: &dyn Previous,
        out: &mut dyn Collect,
        listed: &mut Listed,
    ) -> Option<Meta> {
        if !self.selected(scope, &meta) {
            return None;
        }
        listed.selected += 1;
        let id = self.id(scope.1, &meta);
        if self.follow.hub() || self.short_watch {
            listed.ids.push(id.clone());
        }
        if prev.has(&id, &meta.resource_version) {
            out.unchanged(&id);
        } else if meta.partial {
            listed.fetch.push(meta);
        } else {
            return Some(meta);
        }
        None
    }

    /// Whether an item the apiserver returned is in the scope and the selection; warns once
    /// per version about one that is not.
    fn selected(&mut self, scope: Scope, m: &Meta) -> bool {
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
    fn id(&self, kind: Resource, m: &Meta) -> String {
        self.selection.resources.id(kind, &m.namespace, &m.name)
    }

    /// An item as the poll takes it: its id qualified by its kind when both are listed.
    fn qualify(&self, mut item: Item) -> Item {
        item.qualified = self.selection.resources.qualified();
        item
    }

    fn url(&self, scope: Scope, params: &[(&str, String)]) -> String {
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

    /// Records a scope's new resourceVersion, refusing one older than the last: after the
    /// 504 fallback to `resourceVersion=0` a lagging cache can answer with an older state,
    /// and acting on it would take modules back in time.
    fn advance(&mut self, scope: Scope, rv: Option<String>) -> Result<(), Error> {
        let Some(rv) = rv else { return Ok(()) };
        if let Some(last) = self.last_rv.get(&scope.key())
            && let (Ok(new), Ok(old)) = (rv.parse::<u64>(), last.parse::<u64>())
            && new < old
        {
            return Err(Error::Api(kube::Error::Stale {
                action: scope.action(),
                got: rv,
                had: last.clone(),
            }));
        }
        self.last_rv.insert(scope.key(), rv);
        Ok(())
    }
}

/// Whether `changed` GETs cost more than listing all `selected` objects in full: over 32
/// and over 4% of the list. Measured (`bench -- --only crossover`, README "Performance"):
/// one full list costs as many bytes as a metadata list plus a GET per change at 2.2% of
/// 128-byte objects, 6.6% of 2 KiB and 8.1% of 64 KiB ones (GETs are not gzipped, lists
/// are), and as much cmpoll CPU at 0.1%, 3.7% and 46%. 4% keeps the worst choice within
/// about 1.5× of the better one over that range; an eighth (the guess before) cost up to
/// 2.4× at 2 KiB.
fn worth_a_full_list(changed: usize, selected: usize) -> bool {
    changed > 32.max(selected / 25)
}

/// A reader error as the typed error: transport problems classified, bad bodies named.
fn read_error(fail: &Failure, what: &str, e: ReadError) -> kube::Error {
    match e {
        ReadError::Io(e) => fail.io(e),
        ReadError::Bad(cause) => fail.decode(format!("{what}: {cause}")),
    }
}

impl Source for ApiSource {
    fn list(&mut self, prev: &dyn Previous, out: &mut dyn Collect) -> Result<(), Error> {
        self.client.refresh_credentials();
        self.follow.poll();
        let scopes: Vec<Option<String>> = if self.selection.namespaces.is_empty() {
            vec![None]
        } else {
            self.selection
                .namespaces
                .iter()
                .cloned()
                .map(Some)
                .collect()
        };
        let all: Vec<Scope> = (self.selection.resources.iter())
            .flat_map(|r| scopes.iter().map(move |ns| Scope(ns.as_deref(), r)))
            .collect();
        // Each kind from its own endpoint, with its own list mode and RBAC; a failure of
        // either fails the poll.
        // A short watch's scopes are taken last, once every other scope is listed: a
        // scope the others moved past is listed too (`short_watch.rs`, `level`).
        let listed = self.open_short_watches(&all).and_then(|()| {
            self.read_short_watches(&all)?;
            let mut watched = Vec::new();
            for &scope in &all {
                match self.named(scope) {
                    Some(names) => self.get_named(scope, &names, out)?,
                    None if self.opened.contains_key(&scope.key()) => watched.push(scope),
                    None => self.list_scope(scope, prev, out)?,
                }
            }
            self.level(&all);
            for scope in watched {
                self.list_scope(scope, prev, out)?;
            }
            Ok(())
        });
        self.opened.clear();
        listed
    }

    fn describe(&self) -> String {
        format!("apiserver {}", self.client.server())
    }

    fn hub_waits(&self) -> bool {
        self.follow.hub_waits(self.page_size > 0)
    }

    /// A complete poll: what its watches took is held. A failed one: their watches are
    /// given up, so that the next poll watches again from what is held, and the hub
    /// sends the changes this poll took again (it keeps them in its history).
    fn watches_briefly(&self) -> Duration {
        match self.short_watch && !self.follow.hub() && self.page_size == 0 {
            true => SHORT_WATCH,
            false => Duration::ZERO,
        }
    }

    fn behind(&mut self, kind: Resource, resource_version: u64) {
        let floor = self.floors.entry(kind).or_insert(0);
        *floor = (*floor).max(resource_version);
    }

    fn polled(&mut self, complete: bool) {
        if complete {
            self.floors.clear();
        }
        for (scope, rv, ids) in std::mem::take(&mut self.taken) {
            match complete {
                true => self.follow.hold(&scope, &rv, ids),
                false => self.streams.close(&scope),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_list_over_32_and_4_percent_changed() {
        for (changed, selected, full) in [
            (32, 100, false),
            (33, 100, true),
            (400, 10_000, false),
            (401, 10_000, true),
            (33, 0, true),
        ] {
            assert_eq!(
                worth_a_full_list(changed, selected),
                full,
                "{changed}/{selected}"
            );
        }
    }
}
