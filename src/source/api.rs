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
//! selection: the answer is checked, not trusted (`api/query.rs`).
//!
//! What a poll takes besides these lists — a hub's waiting list and held watch for a
//! follower, a short watch for `cmpoll serve` — is its upstream's (`api/upstream.rs`),
//! which the list loop asks at fixed points and which never reaches the lists' state.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::proto::{self, MetaListReader};
use super::reader::{ListMeta, ListReader, Meta, ReadError};
use super::scope::{ListRequest, Scope};
use super::{Collect, Error, ListMode, Previous, Resource, Selection, Source};
use crate::kube::client::{Failure, Waited};
use crate::kube::{self, Client};

mod follower;
mod named;
mod paged;
mod query;
mod short_watch;
mod upstream;

use follower::Follower;
use query::Query;
use short_watch::ShortWatch;
use upstream::{Plain, Upstream};

const ACCEPT_JSON: &str = "application/json";
/// Metadata only, in protobuf (half the apiserver's CPU of JSON) or JSON, or the full
/// list from an apiserver that cannot (the kind tells which): client-go's metadata client
/// asks the same (k8s.io/client-go/metadata/metadata.go).
const ACCEPT_METADATA: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
/// The most pages one paged list may take (with the time bound of 10 × `--timeout`).
const MAX_PAGES: u32 = 10_000;

pub struct ApiSource {
    client: Client,
    query: Query,
    page_size: u32,
    mode: ListMode,
    /// The resourceVersion of each scope's last list ("" = all namespaces).
    last_rv: HashMap<String, String>,
    /// Scopes listed completely at least once: metadata lists start after the first.
    listed: HashSet<String>,
    /// Scopes where `get` is forbidden (`auto`): full lists only.
    full_only: HashSet<String>,
    /// What a poll takes besides lists (`upstream.rs`).
    upstream: Box<dyn Upstream>,
}

/// What one list request gave: the list's own metadata, how many selected items it held,
/// and the metadata-only items whose contents are still to be fetched.
struct Listed {
    meta: ListMeta,
    selected: usize,
    fetch: Vec<Meta>,
    /// Every selected id, where the upstream keeps them (`Upstream::keeps_ids`).
    ids: Vec<String>,
}

impl ApiSource {
    /// A source listing every scope every poll (`Plain`), until told otherwise.
    pub fn new(client: Client, selection: Selection, page_size: u32, mode: ListMode) -> ApiSource {
        ApiSource {
            client,
            query: Query::new(selection),
            page_size,
            mode,
            last_rv: HashMap::new(),
            listed: HashSet::new(),
            full_only: HashSet::new(),
            upstream: Box::new(Plain),
        }
    }

    /// Keeps each object's JSON as the apiserver served it (`Item::raw`).
    pub fn keeping_raw(mut self, raw: bool) -> ApiSource {
        self.query.keep_raw(raw);
        self
    }

    /// `cmpoll serve`: asks for a listed scope's changes with a short watch
    /// (`short_watch.rs`); unpaged lists only.
    pub fn short_watching(mut self, on: bool) -> ApiSource {
        if on && self.page_size == 0 {
            self.upstream = Box::new(ShortWatch::new());
        }
        self
    }

    /// `cmpoll run`: where a `cmpoll serve` hub answers, follows it (`follower.rs`),
    /// asking it to hold each poll's first list up to `wait` until it has a newer one
    /// (`hub_protocol::WAIT_HEADER`); unpaged lists only (a page has no version to compare).
    pub fn waiting(mut self, wait: Option<Duration>) -> ApiSource {
        if let Some(wait) = wait
            && self.page_size == 0
        {
            self.upstream = Box::new(Follower::new(wait));
        }
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
        // What the upstream took since the list held (a watch), if it can.
        let (client, query) = (&mut self.client, &mut self.query);
        if let Some(meta) = self.upstream.changes(client, query, scope, out)? {
            return Ok(meta);
        }
        let mut rv = self.last_rv.get(&scope.key()).cloned();
        if let Some(floor) = self.upstream.floor(scope) {
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
            let wait = self.upstream.wait_for(scope, rv.as_deref());
            let req = ListRequest {
                wait,
                ..ListRequest::new(scope, &params, metadata)
            };
            match self.fetched_list(req, prev, out) {
                Ok((meta, ids)) => {
                    if let Some(v) = &meta.resource_version {
                        self.upstream.listed(scope, v, ids);
                    }
                    return Ok(meta);
                }
                Err(Error::Api(e)) if rv.is_some() && e.is_too_large_resource_version() => {
                    log::info!(
                        "{e}; this apiserver's cache is behind, listing with resourceVersion=0 instead"
                    );
                    rv = None;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One list request, and the GETs it calls for. With `metadata`, when more changed than
    /// GETs are worth (`worth_a_full_list`), or a GET is forbidden under
    /// `auto`, what this request delivered is forgotten and the same request made again
    /// for full objects (only this request's: earlier pages stay). Returns the list's
    /// metadata and the ids it selected (where the upstream keeps them).
    fn fetched_list(
        &mut self,
        req: ListRequest,
        prev: &dyn Previous,
        out: &mut dyn Collect,
    ) -> Result<(ListMeta, Vec<String>), Error> {
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
            let listed = me.list(full, prev, out)?;
            Ok((listed.meta, listed.ids))
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
                    out.unchanged(&self.query.id(resource, &meta));
                    self.upstream.unsettle(scope);
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
        Ok((listed.meta, listed.ids))
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
        let url = self.query.url(scope, params);
        let accept = if metadata {
            ACCEPT_METADATA
        } else {
            ACCEPT_JSON
        };
        self.upstream.asking();
        let mut body = match wait {
            Some(w) => match self.client.get_waiting(&url, accept, &scope.action(), w)? {
                Waited::Body(body) => *body,
                Waited::NotModified => return self.not_modified(scope, params, out),
            },
            None => self.client.get(&url, accept, &scope.action())?,
        };
        self.upstream.answered(body.hub());
        let fail = body.failure();
        let read = |e: ReadError| read_error(&fail, "not a valid list", e);
        let annotation = self.query.selection().folder_annotation.clone();
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
                        .item(meta, &self.query.selection().keys, scope.1)
                        .map_err(read)?;
                    if self.query.raw() {
                        item.raw = Some(raw.raw());
                    }
                    out.item(self.query.qualify(item))?;
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
        Ok(listed)
    }

    /// A hub's 304 to a held list: nothing newer than the list this scope had, whose
    /// objects all stay as they were.
    fn not_modified(
        &self,
        scope: Scope,
        params: &[(&str, String)],
        out: &mut dyn Collect,
    ) -> Result<Listed, Error> {
        let asked = (params.iter())
            .find(|(k, _)| *k == "resourceVersion")
            .map(|(_, v)| v.as_str());
        let Some((rv, ids)) = self.upstream.not_modified(scope, asked) else {
            return Err(Error::Api(kube::Error::Decode {
                action: scope.action(),
                cause: "the hub answered 304 Not Modified about a list this cmpoll does not hold"
                    .into(),
            }));
        };
        for id in &ids {
            out.unchanged(id);
        }
        let selected = ids.len();
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
            selected,
            fetch: Vec::new(),
            ids,
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
        if !self.query.selected(scope, &meta) {
            return None;
        }
        listed.selected += 1;
        let id = self.query.id(scope.1, &meta);
        if self.upstream.keeps_ids() {
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
        let selection = self.query.selection();
        let namespaces: Vec<Option<String>> = match selection.namespaces.is_empty() {
            true => vec![None],
            false => selection.namespaces.iter().cloned().map(Some).collect(),
        };
        let all: Vec<Scope> = (selection.resources.iter())
            .flat_map(|r| namespaces.iter().map(move |ns| Scope(ns.as_deref(), r)))
            .collect();
        let named: Vec<Option<Vec<String>>> = all.iter().map(|s| self.query.named(*s)).collect();
        let lists: Vec<Scope> = (all.iter().zip(&named))
            .filter(|(_, names)| names.is_none())
            .map(|(s, _)| *s)
            .collect();
        // Each kind from its own endpoint, with its own list mode and RBAC; a failure of
        // either fails the poll. The upstream's `later` scopes are taken last, once every
        // other scope is listed (`Upstream::level`).
        self.upstream.start(&mut self.client, &self.query, &lists)?;
        let mut later = Vec::new();
        for (&scope, names) in all.iter().zip(&named) {
            match names {
                Some(names) => self.get_named(scope, names, out)?,
                None if self.upstream.later(scope) => later.push(scope),
                None => self.list_scope(scope, prev, out)?,
            }
        }
        self.upstream.level(&lists, &self.last_rv);
        for scope in later {
            self.list_scope(scope, prev, out)?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("apiserver {}", self.client.server())
    }

    fn hub_waits(&self) -> bool {
        self.upstream.hub_waits()
    }

    fn watches_briefly(&self) -> Duration {
        self.upstream.watches_briefly()
    }

    fn behind(&mut self, kind: Resource, resource_version: u64) {
        self.upstream.behind(kind, resource_version);
    }

    fn polled(&mut self, complete: bool) {
        self.upstream.polled(complete);
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
