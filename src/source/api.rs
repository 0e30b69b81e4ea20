//! The apiserver as a source: one LIST per `--namespace` (or one cluster-wide), each served
//! from the watch cache.
//!
//! Unpaged (the default): the first list of a scope uses `resourceVersion=0`; later ones
//! `resourceVersion=<that scope's last list>&resourceVersionMatch=NotOlderThan`, so results
//! never go back in time; a 504 "Too large resource version" (this apiserver's cache is
//! behind) falls back to `resourceVersion=0` for that request. `--page-size N` pages with
//! `limit`/`continue` and no resourceVersion, as client-go's pager does; a 410 on a later
//! page discards the pages so far and lists the scope once more, unpaged.
//! `--metadata-first` lists metadata only (`PartialObjectMetadataList`, same routing) and
//! GETs, from the cache too (`resourceVersion=<the item's>`), only the ConfigMaps whose
//! resourceVersion differs from the last poll's; an apiserver that answers with a full
//! list is used as is (the response `kind` decides). Items are checked against the
//! selection before they are used: the answer is checked, not trusted.

use std::collections::{HashMap, HashSet};

use super::{Mark, Selection, Source, Visit};
use crate::kube::decode::{Items, ListMeta, decode_list, decode_object};
use crate::kube::{Client, Error};
use crate::module::Item;

const ACCEPT_JSON: &str = "application/json";
/// The most pages one paged list may take (with the time bound of 10 × `--timeout`).
const MAX_PAGES: u32 = 10_000;
/// Metadata only, or the full list from an apiserver that cannot (the kind tells which).
const ACCEPT_METADATA: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json";

pub struct ApiSource {
    client: Client,
    selection: Selection,
    page_size: u32,
    metadata_first: bool,
    /// The resourceVersion of each scope's last list ("" = all namespaces).
    last_rv: HashMap<String, String>,
    /// Scopes listed completely at least once: metadata-first starts after the first.
    listed: HashSet<String>,
    /// Items already warned about, so a daemon does not repeat itself every poll.
    warned: HashSet<String>,
}

impl ApiSource {
    pub fn new(
        client: Client,
        selection: Selection,
        page_size: u32,
        metadata_first: bool,
    ) -> ApiSource {
        ApiSource {
            client,
            selection,
            page_size,
            metadata_first,
            last_rv: HashMap::new(),
            listed: HashSet::new(),
            warned: HashSet::new(),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn scopes(&self) -> Vec<Option<String>> {
        if self.selection.namespaces.is_empty() {
            vec![None]
        } else {
            self.selection
                .namespaces
                .iter()
                .cloned()
                .map(Some)
                .collect()
        }
    }

    fn list_scope(&mut self, ns: Option<&str>, visit: &mut dyn Visit) -> Result<(), Error> {
        let start = visit.mark();
        let key = ns.unwrap_or("").to_string();
        // The first list of a scope is a full one: every item would need a GET.
        let metadata = self.metadata_first && self.listed.contains(&key);
        if self.page_size > 0 {
            self.list_paged(ns, metadata, start, visit)?;
            self.listed.insert(key);
            return Ok(());
        }
        let mut rv = self.last_rv.get(&key).cloned();
        loop {
            let mut params = Vec::new();
            match &rv {
                Some(v) => {
                    params.push(("resourceVersion", v.clone()));
                    params.push(("resourceVersionMatch", "NotOlderThan".to_string()));
                }
                None => params.push(("resourceVersion", "0".to_string())),
            }
            match self.request(ns, &params, metadata, visit) {
                Err(e) if rv.is_some() && e.is_too_large_resource_version() => {
                    log::info!(
                        "{e}; this apiserver's cache is behind, listing with resourceVersion=0 instead"
                    );
                    rv = None;
                }
                Err(e) => return Err(e),
                Ok(meta) => {
                    self.advance(&key, ns, meta.resource_version)?;
                    self.listed.insert(key);
                    return Ok(());
                }
            }
        }
    }

    /// Records a scope's new resourceVersion, refusing one older than the last: after the
    /// 504 fallback to `resourceVersion=0` a lagging cache can answer with an older state,
    /// and acting on it would take modules back in time.
    fn advance(&mut self, key: &str, ns: Option<&str>, rv: Option<String>) -> Result<(), Error> {
        let Some(rv) = rv else { return Ok(()) };
        if let Some(last) = self.last_rv.get(key)
            && let (Ok(new), Ok(old)) = (rv.parse::<u64>(), last.parse::<u64>())
            && new < old
        {
            return Err(Error::Stale {
                action: format!("list configmaps {}", scope_name(ns)),
                got: rv,
                had: last.clone(),
            });
        }
        self.last_rv.insert(key.to_string(), rv);
        Ok(())
    }

    fn list_paged(
        &mut self,
        ns: Option<&str>,
        metadata: bool,
        start: Mark,
        visit: &mut dyn Visit,
    ) -> Result<(), Error> {
        let key = ns.unwrap_or("").to_string();
        let mut token: Option<String> = None;
        // A paged list is bounded in time and in pages: a continue token that never ends
        // must not keep a poll running forever.
        let timeout = self.client.timeout();
        let deadline = crate::backoff::after(std::time::Instant::now(), timeout.saturating_mul(10));
        let mut pages = 0u32;
        loop {
            let mut params = vec![("limit", self.page_size.to_string())];
            if let Some(t) = &token {
                params.push(("continue", t.clone()));
            }
            let action = || format!("list configmaps {}", scope_name(ns));
            if pages >= MAX_PAGES {
                return Err(Error::Unbounded {
                    action: action(),
                    cause: format!(
                        "more than {MAX_PAGES} pages of {} (raise --page-size, or 0 for one unpaged list)",
                        self.page_size
                    ),
                });
            }
            if pages > 0 && std::time::Instant::now() >= deadline {
                return Err(Error::Unbounded {
                    action: action(),
                    cause: format!(
                        "{pages} pages took more than 10 × --timeout ({}) in all (raise --page-size or --timeout)",
                        humantime::format_duration(timeout.saturating_mul(10))
                    ),
                });
            }
            pages += 1;
            match self.request(ns, &params, metadata, visit) {
                Ok(meta) => {
                    if token.is_none() {
                        self.advance(&key, ns, meta.resource_version)?;
                    }
                    match meta.continue_token {
                        Some(t) if token.as_ref() == Some(&t) => {
                            return Err(Error::Unbounded {
                                action: action(),
                                cause: "the apiserver returned the same continue token twice"
                                    .into(),
                            });
                        }
                        Some(t) => token = Some(t),
                        None => return Ok(()),
                    }
                }
                Err(e) if token.is_some() && e.is_expired() => {
                    log::warn!(
                        "{e}; listing {} again in one unpaged request",
                        scope_name(ns)
                    );
                    visit.rollback(start)?;
                    // client-go's pager: one full list, no limit, no continue, no RV.
                    let meta = self.request(ns, &[], metadata, visit)?;
                    self.advance(&key, ns, meta.resource_version)?;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One list request (a page, or all of a scope), its items delivered to `visit`.
    /// `metadata`: ask for metadata only and GET what changed — unless more changed than
    /// GETs are worth (over 32 and over an eighth of the list): then the same request is
    /// made again for full objects.
    fn request(
        &mut self,
        ns: Option<&str>,
        params: &[(&str, String)],
        metadata: bool,
        visit: &mut dyn Visit,
    ) -> Result<ListMeta, Error> {
        let path = match ns {
            Some(n) => format!("/api/v1/namespaces/{}/configmaps", encode(n)),
            None => "/api/v1/configmaps".to_string(),
        };
        let mut query = Vec::new();
        if !self.selection.labels.as_str().is_empty() {
            query.push(("labelSelector", self.selection.labels.as_str().to_string()));
        }
        if !self.selection.fields.as_str().is_empty() {
            query.push(("fieldSelector", self.selection.fields.as_str().to_string()));
        }
        query.extend(params.iter().map(|(k, v)| (*k, v.clone())));
        let url = format!(
            "{path}?{}",
            query
                .iter()
                .map(|(k, v)| format!("{k}={}", encode(v)))
                .collect::<Vec<_>>()
                .join("&")
        );
        let action = format!("list configmaps {}", scope_name(ns));
        let selection = &self.selection;
        let warned = &mut self.warned;
        let accept = if metadata {
            ACCEPT_METADATA
        } else {
            ACCEPT_JSON
        };
        let here = visit.mark();
        // Metadata items whose contents are needed: fetched once the list is read.
        let mut fetch: Vec<(String, String, String)> = Vec::new();
        let mut seen = 0;
        let meta = self.client.get(&url, accept, &action, |body| {
            fetch.clear();
            let mut items = Received {
                ns,
                selection,
                warned: &mut *warned,
                visit: &mut *visit,
                fetch: &mut fetch,
                seen: 0,
            };
            let meta = decode_list(body, &selection.keys, &action, &mut items);
            seen = items.seen;
            meta
        })?;
        let kinds: &[&str] = if metadata {
            &["ConfigMapList", "PartialObjectMetadataList"]
        } else {
            &["ConfigMapList"]
        };
        if !kinds.contains(&meta.kind.as_str()) {
            return Err(Error::Decode {
                action,
                cause: format!(
                    "expected a {}, got kind '{}'",
                    kinds.join(" or a "),
                    meta.kind
                ),
            });
        }
        if metadata && fetch.len() > 32.max(seen / 8) {
            log::debug!(
                "{} of {seen} configmaps changed: listing them in full rather than one GET each",
                fetch.len()
            );
            visit.rollback(here)?;
            return self.request(ns, params, false, visit);
        }
        for (namespace, name, rv) in fetch {
            if let Some(item) = self.get_one(&namespace, &name, &rv)? {
                visit.item(item)?;
            }
        }
        Ok(meta)
    }

    /// GETs one ConfigMap from the cache, not older than `rv`; `None` if it was deleted
    /// since the list (it is then simply gone from this poll).
    fn get_one(&mut self, namespace: &str, name: &str, rv: &str) -> Result<Option<Item>, Error> {
        let action = format!("get configmap {namespace}/{name}");
        let path = format!(
            "/api/v1/namespaces/{}/configmaps/{}",
            encode(namespace),
            encode(name)
        );
        let keys = &self.selection.keys;
        let mut url = format!("{path}?resourceVersion={}", encode(rv));
        loop {
            let got = self.client.get(&url, ACCEPT_JSON, &action, |body| {
                decode_object(body, keys, &action)
            });
            match got {
                Ok((kind, item)) if kind == "ConfigMap" => {
                    if item.namespace != namespace || item.name != name {
                        // Not a deletion: an answer about another object says nothing about
                        // this one.
                        return Err(Error::Decode {
                            action,
                            cause: format!(
                                "asked for {namespace}/{name}, got {}/{}",
                                item.namespace, item.name
                            ),
                        });
                    }
                    if !self.selection.admits(&item) {
                        // Relabelled since the list: not selected any more.
                        return Ok(None);
                    }
                    return Ok(Some(item));
                }
                Ok((kind, _)) => {
                    return Err(Error::Decode {
                        action,
                        cause: format!("expected a ConfigMap, got kind '{kind}'"),
                    });
                }
                Err(e) if e.code() == Some(404) => return Ok(None),
                Err(e) if e.is_too_large_resource_version() && url != path => {
                    log::info!("{e}; reading it from the apiserver's storage instead");
                    url = path.clone();
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// One list's items on their way to the poll: out-of-selection items are dropped (with a
/// warning once per version), complete items are visited, and metadata-only items are
/// either reused from the last poll or queued for a GET.
struct Received<'a> {
    ns: Option<&'a str>,
    selection: &'a Selection,
    warned: &'a mut HashSet<String>,
    visit: &'a mut dyn Visit,
    fetch: &'a mut Vec<(String, String, String)>,
    /// Items in the selection, so far.
    seen: usize,
}

impl Items for Received<'_> {
    fn wants_contents(&mut self, namespace: &str, name: &str, resource_version: &str) -> bool {
        !self
            .visit
            .known(&format!("{namespace}/{name}"), resource_version)
    }

    fn item(&mut self, item: Item) -> Result<(), Error> {
        let in_scope = self.ns.is_none_or(|n| item.namespace == n);
        if !(in_scope && self.selection.admits(&item)) {
            let id = item.id();
            if self
                .warned
                .insert(format!("{id}@{}", item.resource_version))
            {
                log::warn!(
                    "the apiserver returned configmap {id}, which the selection does not match; ignored"
                );
            }
            return Ok(());
        }
        self.seen += 1;
        if !item.partial {
            return self.visit.item(item);
        }
        if !self.visit.reuse(&item.id(), &item.resource_version) {
            self.fetch
                .push((item.namespace, item.name, item.resource_version));
        }
        Ok(())
    }
}

impl Source for ApiSource {
    fn list(&mut self, visit: &mut dyn Visit) -> Result<(), Error> {
        self.client.refresh_credentials();
        for ns in self.scopes() {
            self.list_scope(ns.as_deref(), visit)?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("apiserver {}", self.client.server())
    }

    fn counters(&self) -> (std::collections::BTreeMap<String, u64>, u64) {
        let stats = &self.client.stats;
        (stats.requests.clone(), stats.response_bytes)
    }
}

fn scope_name(ns: Option<&str>) -> String {
    match ns {
        Some(n) => format!("in namespace \"{n}\""),
        None => "in all namespaces".to_string(),
    }
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
pub fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("a in (x,y),!b+c"), "a%20in%20%28x%2Cy%29%2C%21b%2Bc");
        assert_eq!(encode("cmpoll.io/module=true"), "cmpoll.io%2Fmodule%3Dtrue");
    }
}
