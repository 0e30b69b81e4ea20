//! Who is listed, seen from the list mechanics of `ApiSource`: what a poll may take from
//! somewhere other than a list, and what it keeps of a list for that. One per source:
//! - `Plain` — every scope listed every poll (`cmpoll run --once`, paged lists, the
//!   webhook, `cmpoll sidecar`'s lists): nothing kept;
//! - `Follower` (`follower.rs`) — a `cmpoll run` that may be pointed at a `cmpoll serve`
//!   hub (it says so on every answer): a waiting list, then a held watch of the hub;
//! - `ShortWatch` (`short_watch.rs`) — `cmpoll serve`'s own poll of the apiserver: a
//!   listed scope's changes from a watch of one second.
//!
//! Each hook has the plain answer as its default, so that an upstream says only where it
//! differs, and a reader of the plain poll need not read the others.

use std::collections::HashMap;
use std::time::Duration;

use super::query::Query;
use crate::kube::Client;
use crate::source::reader::ListMeta;
use crate::source::scope::Scope;
use crate::source::{Collect, Error, Resource};

/// What a poll of the apiserver takes besides lists (see the module's contract).
pub(super) trait Upstream: Send {
    /// A poll begins; `scopes` are those it lists (not those read by name).
    fn start(
        &mut self,
        _client: &mut Client,
        _query: &Query,
        _scopes: &[Scope],
    ) -> Result<(), Error> {
        Ok(())
    }

    /// Whether `scope` waits until every other scope of the poll is listed, then `level`.
    fn later(&self, _scope: Scope) -> bool {
        false
    }

    /// Every scope but the `later` ones is listed, at the versions in `last_rv`.
    fn level(&mut self, _scopes: &[Scope], _last_rv: &HashMap<String, String>) {}

    /// `scope`'s change since what is held, as a list would have given it; `None`: list
    /// the scope.
    fn changes(
        &mut self,
        _client: &mut Client,
        _query: &mut Query,
        _scope: Scope,
        _out: &mut dyn Collect,
    ) -> Result<Option<ListMeta>, Error> {
        Ok(None)
    }

    /// A version `scope`'s list must be at least as new as, besides the one held.
    fn floor(&mut self, _scope: Scope) -> Option<u64> {
        None
    }

    /// How long the list of `scope`, held at `rv`, may wait at a hub until it has a newer
    /// one. The list is being made now.
    fn wait_for(&mut self, _scope: Scope, _rv: Option<&str>) -> Option<Duration> {
        None
    }

    /// A list request is being made.
    fn asking(&mut self) {}

    /// An answer came, from a `cmpoll serve` hub or not.
    fn answered(&mut self, _hub: bool) {}

    /// Whether a list request keeps the id of every object it selected (for `listed`).
    fn keeps_ids(&self) -> bool {
        false
    }

    /// `scope`'s unpaged list is complete at `rv`, selecting `ids` (when `keeps_ids`).
    fn listed(&mut self, _scope: Scope, _rv: &str, _ids: Vec<String>) {}

    /// A hub's 304 to the list of `scope` asked at `asked`: the version and ids it keeps,
    /// if that is the list held.
    fn not_modified(&self, _scope: Scope, _asked: Option<&str>) -> Option<(String, Vec<String>)> {
        None
    }

    /// A GET in `scope` found an object gone or older than its list said.
    fn unsettle(&mut self, _scope: Scope) {}

    /// `Source::hub_waits`.
    fn hub_waits(&self) -> bool {
        false
    }

    /// `Source::watches_briefly`.
    fn watches_briefly(&self) -> Duration {
        Duration::ZERO
    }

    /// `Source::behind`.
    fn behind(&mut self, _kind: Resource, _resource_version: u64) {}

    /// `Source::polled`.
    fn polled(&mut self, _complete: bool) {}
}

/// Every scope listed every poll.
pub(super) struct Plain;

impl Upstream for Plain {}
