//! Where ConfigMaps come from: an apiserver (`api.rs`, its requests in `scope.rs`, reading
//! lists with `reader.rs` and metadata lists in protobuf with `proto.rs`; what a poll
//! takes besides lists is its upstream, `api/upstream.rs`: following a `cmpoll serve` hub
//! with `follow.rs` and its held watches read by `watching.rs`, or `cmpoll serve`'s short
//! watches) or a manifests folder (`manifests/`);
//! `origin.rs` chooses and opens one. This file is what every source speaks: `Source`,
//! `Collect`, `Previous`, `Error`.
//!
//! A source is told what the last poll had (`Previous`, read-only) and puts what it lists
//! into a `Collect` (the poll), in one direction: a selected ConfigMap at the version the
//! last poll had is `unchanged` (its contents are never read), any other is an `item` with
//! its contents. When part of a list has to start over (a scope after an expired continue
//! token; one request whose metadata list changed too much, or whose GETs are forbidden)
//! the source `rewind`s to a `mark` it took before, and the collector forgets what was
//! delivered since; so a poll never mixes two lists and nothing is buffered.

pub mod api;
pub mod follow;
pub mod item;
pub mod manifests;
pub mod origin;
pub mod proto;
pub mod reader;
pub mod scope;
pub mod selection;
pub mod watching;

use std::fmt;

pub use item::{Content, Item, ModuleFile, RawObject};
pub use selection::{KeyFilter, Named, Resource, Resources, Selection};

use crate::kube;

/// Why a poll failed.
#[derive(Debug)]
pub enum Error {
    /// Talking to the apiserver.
    Api(kube::Error),
    /// Reading the manifests folder.
    Manifests(String),
    /// Keeping what was listed (the poll's spool).
    Spool(std::io::Error),
}

impl Error {
    /// The apiserver's `Retry-After`, if it sent one.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Api(e) => e.retry_after(),
            _ => None,
        }
    }

    /// A hub's 429 with `Retry-After` (`kube::Error::hub_asks_to_wait`).
    pub fn hub_asks_to_wait(&self) -> Option<std::time::Duration> {
        match self {
            Error::Api(e) => e.hub_asks_to_wait(),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api(e) => e.fmt(f),
            Error::Manifests(e) => write!(f, "--manifests: {e}"),
            Error::Spool(e) => write!(f, "spool: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Error {
        Error::Api(e)
    }
}

/// What the last poll had, by `namespace/name`: a module, or a ConfigMap known not to be
/// one (its contents need not be read again until its resourceVersion changes).
pub trait Previous {
    fn has(&self, id: &str, resource_version: &str) -> bool;
}

/// A point in what a source delivered, to go back to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub modules: usize,
    pub others: usize,
    pub spool: u64,
}

/// Where a source puts what it lists.
pub trait Collect {
    /// Where delivery stands (before a scope, or one request of it).
    fn mark(&self) -> Mark;
    /// A selected object with its contents.
    fn item(&mut self, item: Item) -> Result<(), Error>;
    /// A selected object that `Previous::has` at its resourceVersion: it stays as it was.
    fn unchanged(&mut self, id: &str);
    /// Forget everything delivered since `mark`: that part of the list starts over.
    fn rewind(&mut self, mark: Mark) -> Result<(), Error>;
    /// A scope was listed completely: its kind, namespace (`None`: all of them) and the
    /// list's resourceVersion (`cmpoll serve` serves each scope at its own).
    fn listed(&mut self, _kind: Resource, _namespace: Option<&str>, _resource_version: &str) {}
}

/// A source of ConfigMaps.
pub trait Source: Send {
    /// Lists every selected ConfigMap into `out`, or fails; a failure fails the poll.
    fn list(&mut self, prev: &dyn Previous, out: &mut dyn Collect) -> Result<(), Error>;
    /// What the source is, for logs.
    fn describe(&self) -> String;
    /// A `cmpoll serve` hub answers, and holds each poll until it has something newer
    /// (or the wait runs out): the next poll may start at once.
    fn hub_waits(&self) -> bool {
        false
    }
    /// The poll `list` served is complete (its snapshot taken) or not (nothing of it
    /// kept): what a source keeps from one poll to the next (a watch's version) moves on
    /// only with a complete one.
    fn polled(&mut self, _complete: bool) {}
    /// A poll may spend up to this in short watches of the apiserver, which hear of
    /// changes as the wait between polls would: counted as part of the interval.
    fn watches_briefly(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// `cmpoll serve` holds a change of `kind` at `resource_version` back until every
    /// scope of the kind is listed past it: the next poll must take each scope at least
    /// that far (a short-watched one is listed then).
    fn behind(&mut self, _kind: Resource, _resource_version: u64) {}
}

/// How the apiserver is listed (`--list-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ListMode {
    /// Metadata lists after a scope's first full list; full lists where `get` is forbidden.
    #[default]
    Auto,
    /// Always full lists.
    Full,
    /// Metadata lists after a scope's first full list; a forbidden `get` fails the poll.
    Metadata,
}

impl crate::words::Words for ListMode {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("auto", ListMode::Auto),
        ("full", ListMode::Full),
        ("metadata", ListMode::Metadata),
    ];
}
