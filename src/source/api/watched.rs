//! A scope of a `cmpoll serve` hub followed by its held watch (`watching.rs`): what the
//! watch committed since the last poll, turned into what a list would have given (each
//! id unchanged, delivered or gone), or `None` where the scope must be listed instead.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::ApiSource;
use crate::kube;
use crate::source::reader::{ListMeta, read_object};
use crate::source::scope::Scope;
use crate::source::watching::{self, Commit, Event, Taken};
use crate::source::{Collect, Error, Item};

impl ApiSource {
    /// A scope followed by watching its hub: the change since the list or watch held, as a
    /// list would have given it (each id unchanged, delivered or gone); `None` when it must
    /// be listed instead (no list of this hub held, it does not watch, or its history
    /// does not reach back: a relist).
    pub(super) fn watched(
        &mut self,
        scope: Scope,
        out: &mut dyn Collect,
    ) -> Result<Option<ListMeta>, Error> {
        let Some((held, ids)) = self.follow.watchable(&scope.key()) else {
            self.streams.close(&scope.key());
            return Ok(None);
        };
        let Ok(from) = held.parse::<u64>() else {
            return Ok(None);
        };
        let wait = self.follow.watch_wait();
        let Some(commits) = self.commits(scope, from, wait)? else {
            return Ok(None);
        };
        let rv = (commits.iter()).fold(from, |rv, c| rv.max(c.rv));
        let events = commits.into_iter().flat_map(|c| c.events);
        self.changed(scope, from, rv, events, ids, out).map(Some)
    }

    /// What a list would have given for `scope`, held at `from` with `ids`, after
    /// `events` (up to `rv`, or the newest event's version): each id unchanged, delivered
    /// or gone. Held once the poll is complete (`Source::polled`).
    pub(super) fn changed(
        &mut self,
        scope: Scope,
        from: u64,
        rv: u64,
        events: impl Iterator<Item = Event>,
        ids: Vec<String>,
        out: &mut dyn Collect,
    ) -> Result<ListMeta, Error> {
        let fail = |cause: String| {
            Error::Api(kube::Error::Decode {
                action: scope.action(),
                cause,
            })
        };
        let annotation = self.selection.folder_annotation.clone();
        let mut rv = rv;
        let mut changed: HashMap<String, Option<Item>> = HashMap::new();
        for e in events {
            let (kind, meta, item) = read_object(
                &e.object[..],
                &self.selection.keys,
                scope.1,
                annotation.as_deref(),
                self.raw,
            )
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
        let rv = rv.to_string();
        // Held once the poll is complete (`Source::polled`).
        self.taken.push((scope.key(), rv.clone(), now_ids));
        log::debug!("{}: watched up to resourceVersion {rv}", scope.action());
        Ok(ListMeta {
            kind: format!("{}List", scope.1.kind()),
            resource_version: Some(rv),
            continue_token: None,
            remaining_item_count: None,
        })
    }

    /// What the held watch of `scope` committed since the last poll, opened from `from`
    /// where there is none; the poll's first scope (`wait` not zero) waits up to `wait`
    /// for any held watch to say something. `None`: list instead (the hub refuses
    /// watches, or its history does not reach back to `from`).
    fn commits(
        &mut self,
        scope: Scope,
        from: u64,
        wait: Duration,
    ) -> Result<Option<Vec<Commit>>, Error> {
        let key = scope.key();
        if !self.streams.is_open(&key) && !self.open_stream(scope, from)? {
            return Ok(None);
        }
        if !wait.is_zero() {
            self.streams.wait_any(Instant::now() + wait);
        }
        match self.streams.take(&key) {
            None => Ok(Some(Vec::new())),
            Some(Taken::Commits(c) | Taken::Ended(c)) => Ok(Some(c)),
            Some(Taken::TooOld) => {
                log::info!(
                    "{}: the hub's history does not reach back to resourceVersion {from}; listing again",
                    scope.action()
                );
                Ok(None)
            }
            Some(Taken::Failed(why)) => Err(Error::Api(kube::Error::Decode {
                action: scope.action(),
                cause: why,
            })),
        }
    }

    /// Opens the held watch of `scope` from `from`; `false` when the hub refuses watches.
    fn open_stream(&mut self, scope: Scope, from: u64) -> Result<bool, Error> {
        let wait = self.follow.hold_wait();
        // Ended by the hub at a random moment of 30 to 60 minutes, as the apiserver's
        // `--min-request-timeout` ends watches: a fleet's do not end together.
        let lasts = watching::LASTS.mul_f64(1.0 + self.rng.unit());
        let params = [
            ("watch", "true".to_string()),
            ("allowWatchBookmarks", "true".to_string()),
            ("resourceVersion", from.to_string()),
            ("timeoutSeconds", lasts.as_secs().to_string()),
        ];
        let url = self.url(scope, &params);
        let action = scope.action();
        let body = match self.client.watch_held(&url, &action, wait, lasts) {
            Ok(b) => b,
            Err(e) if e.code() == Some(405) || e.code() == Some(403) => {
                self.follow.refuse_watch(e.to_string());
                return Ok(false);
            }
            Err(e) => return Err(Error::Api(e)),
        };
        let fail = body.failure();
        self.streams
            .open(&scope.key(), body, fail, wait)
            .map_err(|e| {
                Error::Api(kube::Error::Decode {
                    action,
                    cause: format!("cannot start the watch's reader: {e}"),
                })
            })?;
        Ok(true)
    }
}
