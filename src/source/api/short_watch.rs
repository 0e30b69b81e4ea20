//! `cmpoll serve`'s poll of the apiserver once a scope was listed: a short watch — a watch
//! from the version the hub holds, `timeoutSeconds=1`, answered from the watch cache's
//! events since then and ended by the apiserver — instead of a list, which visits every
//! stored object of its scope, selected or not (issue 49.1: beside 100,000 unselected
//! ConfigMaps, a metadata list each second costs the apiserver +89 m idle, the short
//! watch +1 m; docs/performance.md, "What a hub's poll costs"). Nothing is held between
//! polls: the apiserver ends the watch within the second, and the hub counts that second
//! as part of its interval (`Source::watches_briefly`). A poll opens the watches of all
//! its scopes before it reads any, so that it takes a second whatever their number.
//!
//! The watch is read to its end or the poll fails (a stream cut mid-way changes nothing,
//! and the next poll asks from the same version; one longer than `--max-response-bytes`
//! is listed instead); its events are taken as a list would
//! have given them (`Query::changed`: each id unchanged, delivered or gone), held once the
//! poll is complete. A scope is listed instead when it was not listed yet, when the cache
//! no longer holds the events since that version (`410 Expired`, or a cache behind it:
//! `504`), and for the rest of the run when the apiserver or the hub's role refuses the
//! watch (403, 405, or 400 from a server that does not watch: one warning; the role needs
//! `watch` besides `list` and `get`), or the server says it is a hub itself. Paged lists
//! are never short-watched (`ApiSource::new` gives them `Plain`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::time::Duration;

use super::query::Query;
use super::upstream::Upstream;
use crate::kube::{self, Client};
use crate::source::reader::ListMeta;
use crate::source::scope::Scope;
use crate::source::watching::{self, Line};
use crate::source::{Collect, Error, Resource};

/// A short watch's `timeoutSeconds`: the apiserver ends it after this.
const SHORT_WATCH: Duration = Duration::from_secs(1);

/// `cmpoll serve`'s upstream: what each listed scope holds, this poll's short watches, and
/// how far each kind must be taken.
pub(super) struct ShortWatch {
    /// Off for the rest of the run: the apiserver or the role refused a watch, or the
    /// server is itself a hub (which is listed).
    off: bool,
    /// Each scope's list or watch held (its resourceVersion and ids): what its next short
    /// watch goes on from.
    held: HashMap<String, (String, Vec<String>)>,
    /// This poll's short watches by scope: opened together at its start, then read.
    opened: HashMap<String, Short>,
    /// How far each kind's scopes must be taken this poll (`Source::behind`).
    floors: HashMap<Resource, u64>,
    /// What this poll took (scope, version, ids): held once the poll is complete.
    taken: Vec<(String, String, Vec<String>)>,
}

/// A scope's short watch in this poll.
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

impl ShortWatch {
    pub fn new() -> ShortWatch {
        ShortWatch {
            off: false,
            held: HashMap::new(),
            opened: HashMap::new(),
            floors: HashMap::new(),
            taken: Vec::new(),
        }
    }

    /// Opens the short watch of each of `scopes` whose version is held, all before any is
    /// read: each ends a second after it opened, so that a poll of many scopes (namespaces,
    /// kinds) takes a second, not a second each. A scope that cannot be watched from its
    /// version is listed; a refused watch turns the short watch off.
    fn open(&mut self, client: &mut Client, query: &Query, scopes: &[Scope]) -> Result<(), Error> {
        for &scope in scopes {
            let Some((held, ids)) = self.held.get(&scope.key()).cloned() else {
                continue;
            };
            let Ok(from) = held.parse::<u64>() else {
                continue;
            };
            let params = [
                ("watch", "true".to_string()),
                ("allowWatchBookmarks", "true".to_string()),
                ("resourceVersion", held),
                ("timeoutSeconds", SHORT_WATCH.as_secs().to_string()),
            ];
            let url = query.url(scope, &params);
            let action = scope.action();
            match client.watch_briefly(&url, &action, SHORT_WATCH) {
                Ok(body) => {
                    let body = Box::new(body);
                    self.opened
                        .insert(scope.key(), Short::Open { from, ids, body });
                }
                Err(e) if matches!(e.code(), Some(400 | 403 | 405)) => {
                    let r = scope.1.plural();
                    let hint = match e.code() {
                        Some(403) => format!(": grant the hub's role watch on {r}"),
                        _ => String::new(),
                    };
                    log::warn!(
                        "{e}; listing from now on (a list visits every stored {r} of its scope{hint})"
                    );
                    self.off = true;
                    self.opened.clear();
                    return Ok(());
                }
                Err(e) if e.is_too_large_resource_version() || e.code() == Some(410) => {
                    log::info!("{e}; listing instead");
                }
                Err(e) => return Err(Error::Api(e)),
            }
        }
        Ok(())
    }

    /// Reads each of `scopes`' short watches to its end, keeping what it said for
    /// `changes`; a scope whose watch says it must be listed is listed instead.
    fn read(&mut self, scopes: &[Scope]) -> Result<(), Error> {
        for &scope in scopes {
            let Some(Short::Open { from, ids, body }) = self.opened.remove(&scope.key()) else {
                continue;
            };
            if let Some((rv, events)) = read_to_end(scope, from, *body)? {
                let read = Short::Read {
                    from,
                    ids,
                    rv,
                    events,
                };
                self.opened.insert(scope.key(), read);
            }
        }
        Ok(())
    }
}

impl Upstream for ShortWatch {
    fn start(&mut self, client: &mut Client, query: &Query, scopes: &[Scope]) -> Result<(), Error> {
        self.opened.clear();
        if self.off {
            return Ok(());
        }
        self.open(client, query, scopes)?;
        self.read(scopes)
    }

    /// A short-watched scope is taken once every other scope is listed.
    fn later(&self, scope: Scope) -> bool {
        self.opened.contains_key(&scope.key())
    }

    /// Levels the scopes of each kind: a short-watched scope older than the newest
    /// version a scope of its kind reached in this poll — by a change its short watch
    /// saw, or by a list — is listed instead, at least as new as that version. A hub
    /// releases a change to its watchers only once every scope of the kind is past it
    /// (`serve::history`), and a quiet scope's short watch does not move (the apiserver
    /// sends no bookmark on a watch of one second): without this, a change in one
    /// namespace would wait for a write in every other. A poll that finds no change lists
    /// nothing more; one that finds one lists each other scope of its kind once
    /// (a metadata list, as any list after the first).
    fn level(&mut self, scopes: &[Scope], last_rv: &HashMap<String, String>) {
        let reached: Vec<Reached> = (scopes.iter())
            .map(|scope| match self.opened.get(&scope.key()) {
                Some(Short::Read { rv, events, .. }) => Reached::Watched {
                    kind: scope.1,
                    rv: *rv,
                    changed: !events.is_empty(),
                },
                Some(_) => Reached::Other,
                None => match (last_rv.get(&scope.key())).and_then(|v| v.parse().ok()) {
                    Some(rv) => Reached::Listed { kind: scope.1, rv },
                    None => Reached::Other,
                },
            })
            .collect();
        for (i, target) in behind(&reached, &self.floors) {
            let scope = scopes[i];
            log::debug!(
                "{}: behind resourceVersion {target} of another scope; listed instead",
                scope.action()
            );
            self.opened.insert(scope.key(), Short::Behind(target));
        }
    }

    /// `scope`'s change since the version held, from its short watch read to its end;
    /// `None` when it must be listed instead.
    fn changes(
        &mut self,
        _: &mut Client,
        query: &mut Query,
        scope: Scope,
        out: &mut dyn Collect,
    ) -> Result<Option<ListMeta>, Error> {
        // Only a watch read to its end is taken here: a scope behind the others stays for
        // its list (`floor`), at least as new as they are.
        if !matches!(self.opened.get(&scope.key()), Some(Short::Read { .. })) {
            return Ok(None);
        }
        let Some(Short::Read {
            from,
            ids,
            rv,
            events,
        }) = self.opened.remove(&scope.key())
        else {
            return Ok(None);
        };
        log::debug!(
            "{}: {} events since resourceVersion {from}",
            scope.action(),
            events.len()
        );
        let (meta, ids) = query.changed(scope, from, rv, events.into_iter(), ids, out)?;
        if let Some(rv) = &meta.resource_version {
            self.taken.push((scope.key(), rv.clone(), ids));
        }
        Ok(Some(meta))
    }

    /// A scope behind another of its kind: listed to be at least as new.
    fn floor(&mut self, scope: Scope) -> Option<u64> {
        match self.opened.remove(&scope.key()) {
            Some(Short::Behind(floor)) => Some(floor),
            _ => None,
        }
    }

    /// A server that says it is a hub is listed, never short-watched.
    fn answered(&mut self, hub: bool) {
        if hub {
            self.off = true;
        }
    }

    fn keeps_ids(&self) -> bool {
        !self.off
    }

    fn listed(&mut self, scope: Scope, rv: &str, ids: Vec<String>) {
        if !self.off {
            self.taken.push((scope.key(), rv.to_string(), ids));
        }
    }

    fn watches_briefly(&self) -> Duration {
        match self.off {
            true => Duration::ZERO,
            false => SHORT_WATCH,
        }
    }

    fn behind(&mut self, kind: Resource, resource_version: u64) {
        let floor = self.floors.entry(kind).or_insert(0);
        *floor = (*floor).max(resource_version);
    }

    /// A complete poll: what it took is held, and the floors are met.
    fn polled(&mut self, complete: bool) {
        self.opened.clear();
        if complete {
            self.floors.clear();
            for (scope, rv, ids) in std::mem::take(&mut self.taken) {
                self.held.insert(scope, (rv, ids));
            }
        }
        self.taken.clear();
    }
}

/// A short watch of `scope` from `from`, read to its end: the version it reached and its
/// events; `None` when the scope must be listed instead.
fn read_to_end(
    scope: Scope,
    from: u64,
    body: kube::client::Body,
) -> Result<Option<(u64, Vec<watching::Event>)>, Error> {
    let action = scope.action();
    let fail = body.failure();
    let (mut lines, mut line) = (BufReader::new(body), Vec::new());
    let (mut events, mut rv) = (Vec::new(), from);
    loop {
        line.clear();
        let n = match lines.read_until(b'\n', &mut line) {
            Ok(n) => n,
            Err(e) => match fail.io(e) {
                // More changed since than a list holds: listed instead (else every
                // poll would ask again from the same version and fail again).
                e @ kube::Error::TooLarge { .. } => {
                    log::info!("{e}; listing instead");
                    return Ok(None);
                }
                e => return Err(Error::Api(e)),
            },
        };
        if n == 0 {
            return Ok(Some((rv, events)));
        }
        let text = watching::trim(&line);
        if text.is_empty() {
            continue;
        }
        match watching::event(text).map_err(|e| Error::Api(fail.decode(e)))? {
            Line::Change(e) => {
                rv = rv.max(version_of(&e.object));
                events.push(e);
            }
            Line::Bookmark(v) => rv = rv.max(v),
            Line::Expired => {
                log::info!(
                    "{action}: the apiserver's watch cache no longer holds the events since resourceVersion {from}; listing again"
                );
                return Ok(None);
            }
            Line::Error(why) => {
                return Err(Error::Api(kube::Error::Decode {
                    action,
                    cause: format!("the apiserver's watch said: {why}"),
                }));
            }
        }
    }
}

/// An event's object's `resourceVersion` (0 where it has none that is a number: the
/// event is read in full, and refused if it must be, by `changed`).
fn version_of(object: &[u8]) -> u64 {
    #[derive(serde::Deserialize)]
    struct Object {
        metadata: Meta,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion")]
        resource_version: String,
    }
    (serde_json::from_slice::<Object>(object).ok())
        .and_then(|o| o.metadata.resource_version.parse().ok())
        .unwrap_or(0)
}

/// Where a scope of this poll got to, for `behind`.
#[derive(Clone, Copy, Debug)]
enum Reached {
    /// Its short watch, read to its end: the version it reached, and whether it saw a
    /// change.
    Watched {
        kind: Resource,
        rv: u64,
        changed: bool,
    },
    /// Listed in this poll, at this version.
    Listed { kind: Resource, rv: u64 },
    /// Neither (read by name, or already behind).
    Other,
}

/// The short-watched scopes (by index in `reached`) that must be listed instead, and how
/// new that list must be: those older than the newest version a scope of their kind
/// reached by a change its short watch saw, by a list, or by what the hub still holds
/// back (`floors`, `Source::behind`). A poll where nothing changed and nothing is held
/// back lists nothing.
fn behind(reached: &[Reached], floors: &HashMap<Resource, u64>) -> Vec<(usize, u64)> {
    let mut newest = floors.clone();
    for r in reached {
        let (kind, rv) = match *r {
            Reached::Watched {
                kind,
                rv,
                changed: true,
            }
            | Reached::Listed { kind, rv } => (kind, rv),
            _ => continue,
        };
        let n = newest.entry(kind).or_insert(rv);
        *n = (*n).max(rv);
    }
    (reached.iter().enumerate())
        .filter_map(|(i, r)| match *r {
            Reached::Watched { kind, rv, .. } => {
                let target = *newest.get(&kind)?;
                (rv < target).then_some((i, target))
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CM: Resource = Resource::ConfigMaps;

    fn watched(rv: u64, changed: bool) -> Reached {
        Reached::Watched {
            kind: CM,
            rv,
            changed,
        }
    }

    #[test]
    fn a_scope_is_listed_when_another_of_its_kind_moved_past_it() {
        let none = HashMap::new();
        // Idle: quiet scopes at versions of their own stay where they are.
        assert_eq!(
            behind(&[watched(500, false), watched(600, false)], &none),
            vec![]
        );
        // A change in one: the quiet ones behind it are listed, at least as new.
        assert_eq!(
            behind(
                &[watched(650, true), watched(600, false), watched(700, false)],
                &none
            ),
            vec![(1, 650)]
        );
        // Two changes: the older one is behind the newer.
        assert_eq!(
            behind(&[watched(650, true), watched(660, true)], &none),
            vec![(0, 660)]
        );
        // A scope listed in this poll (its first, or after a 410) moved too.
        let listed = Reached::Listed { kind: CM, rv: 800 };
        assert_eq!(
            behind(&[watched(700, false), listed, Reached::Other], &none),
            vec![(0, 800)]
        );
        // Another kind is no one's measure.
        let secret = Reached::Watched {
            kind: Resource::Secrets,
            rv: 900,
            changed: true,
        };
        assert_eq!(behind(&[watched(700, false), secret], &none), vec![]);
    }

    #[test]
    fn what_the_hub_holds_back_takes_every_scope_past_it() {
        // A write another scope's list saw after this one's short watch ended: held back
        // until the next poll takes this one past it, though that poll is quiet.
        let floors = HashMap::from([(CM, 107)]);
        assert_eq!(
            behind(&[watched(105, false), watched(107, false)], &floors),
            vec![(0, 107)]
        );
        assert_eq!(behind(&[watched(108, false)], &floors), vec![]);
    }
}
