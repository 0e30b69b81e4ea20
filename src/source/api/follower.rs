//! A `cmpoll run` that may follow a `cmpoll serve` hub (the hub says so on every answer;
//! until one does, this lists as `Plain` does). Each poll's first list may wait at the hub
//! until it has something newer (`hub_protocol::WAIT_HEADER`: a 304 keeps what is held,
//! `follow.rs`); once a scope's list from the hub is held, the scope is followed by a held
//! watch of the hub (`watching.rs`) and each poll takes what the watch committed since,
//! turned into what a list would have given (`Query::changed`: each id unchanged,
//! delivered or gone), or lists the scope instead where the watch cannot go on (no list
//! of this hub held, it refuses watches, or its history does not reach back: a relist).

use std::time::{Duration, Instant};

use super::query::Query;
use super::upstream::Upstream;
use crate::kube::{self, Client};
use crate::source::follow::Follow;
use crate::source::reader::ListMeta;
use crate::source::scope::Scope;
use crate::source::watching::{self, Commit, Streams, Taken};
use crate::source::{Collect, Error};

/// A follower of a hub: what its answers said, its held watches, and what this poll's
/// watches took (scope, version, ids: held once the poll is complete, `Source::polled`).
pub(super) struct Follower {
    follow: Follow,
    streams: Streams,
    taken: Vec<(String, String, Vec<String>)>,
    rng: crate::backoff::Rng,
}

impl Follower {
    /// A follower whose hub may hold each poll's first list up to `wait`.
    pub fn new(wait: Duration) -> Follower {
        Follower {
            follow: Follow::new(wait),
            streams: Streams::default(),
            taken: Vec::new(),
            rng: crate::backoff::Rng::from_time(),
        }
    }

    /// What the held watch of `scope` committed since the last poll, opened from `from`
    /// where there is none; the poll's first scope (`wait` not zero) waits up to `wait`
    /// for any held watch to say something. `None`: list instead (the hub refuses
    /// watches, or its history does not reach back to `from`).
    fn commits(
        &mut self,
        client: &mut Client,
        query: &Query,
        scope: Scope,
        from: u64,
        wait: Duration,
    ) -> Result<Option<Vec<Commit>>, Error> {
        let key = scope.key();
        if !self.streams.is_open(&key) && !self.open_stream(client, query, scope, from)? {
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
    fn open_stream(
        &mut self,
        client: &mut Client,
        query: &Query,
        scope: Scope,
        from: u64,
    ) -> Result<bool, Error> {
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
        let url = query.url(scope, &params);
        let action = scope.action();
        let body = match client.watch_held(&url, &action, wait, lasts) {
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

impl Upstream for Follower {
    fn start(&mut self, _: &mut Client, _: &Query, _: &[Scope]) -> Result<(), Error> {
        self.follow.poll();
        Ok(())
    }

    /// A scope followed by watching its hub: the change since the list or watch held;
    /// `None` when it must be listed instead.
    fn changes(
        &mut self,
        client: &mut Client,
        query: &mut Query,
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
        let Some(commits) = self.commits(client, query, scope, from, wait)? else {
            return Ok(None);
        };
        let rv = (commits.iter()).fold(from, |rv, c| rv.max(c.rv));
        let events = commits.into_iter().flat_map(|c| c.events);
        let (meta, ids) = query.changed(scope, from, rv, events, ids, out)?;
        if let Some(rv) = &meta.resource_version {
            self.taken.push((scope.key(), rv.clone(), ids));
        }
        Ok(Some(meta))
    }

    fn wait_for(&mut self, scope: Scope, rv: Option<&str>) -> Option<Duration> {
        self.follow.wait_for(&scope.key(), rv)
    }

    fn asking(&mut self) {
        self.follow.listing();
    }

    fn answered(&mut self, hub: bool) {
        self.follow.answered(hub);
    }

    fn keeps_ids(&self) -> bool {
        self.follow.hub()
    }

    /// A list from the hub is held as a watch's take is: once the poll is complete. A
    /// poll that fails after it leaves the snapshot as it was, and a 304 or a watch from
    /// that list would keep as "unchanged" objects the snapshot never had.
    fn listed(&mut self, scope: Scope, rv: &str, ids: Vec<String>) {
        if self.follow.hub() {
            self.taken.push((scope.key(), rv.to_string(), ids));
        }
    }

    fn not_modified(&self, scope: Scope, asked: Option<&str>) -> Option<(String, Vec<String>)> {
        self.follow.not_modified(&scope.key(), asked)
    }

    fn unsettle(&mut self, scope: Scope) {
        self.follow.unsettle(&scope.key());
    }

    fn hub_waits(&self) -> bool {
        self.follow.hub_waits()
    }

    /// A complete poll: what its lists and watches took is held. A failed one: their
    /// watches are given up, so that the next poll watches (or lists) again from what is
    /// held, and the hub sends the changes this poll took again (it keeps them in its
    /// history).
    fn polled(&mut self, complete: bool) {
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
    use crate::source::Resource;

    /// A list the hub answered in a poll that then failed is not what a 304 or a watch
    /// goes on from: only a complete poll's lists are held.
    #[test]
    fn a_list_is_held_only_once_its_poll_is_complete() {
        let scope = Scope(Some("team-a"), Resource::ConfigMaps);
        let mut f = Follower::new(Duration::from_secs(30));
        f.answered(true);
        f.listed(scope, "200", vec!["team-a/x".into()]);
        f.polled(false);
        assert_eq!(
            f.not_modified(scope, Some("200")),
            None,
            "a failed poll's list"
        );
        assert_eq!(f.follow.watchable(&scope.key()), None);
        f.listed(scope, "201", vec!["team-a/x".into()]);
        f.polled(true);
        let held = Some(("201".to_string(), vec!["team-a/x".to_string()]));
        assert_eq!(f.not_modified(scope, Some("201")), held);
        assert_eq!(f.follow.watchable(&scope.key()), held);
    }
}
