//! Where ConfigMaps come from: an apiserver (`api.rs`, reading lists with `reader.rs`, and
//! metadata lists in protobuf with `proto.rs`) or a manifests folder (`manifests/`).
//!
//! A source is told what the last poll had (`Previous`, read-only) and puts what it lists
//! into a `Collect` (the poll), in one direction: a selected ConfigMap at the version the
//! last poll had is `unchanged` (its contents are never read), any other is an `item` with
//! its contents. When part of a list has to start over (a scope after an expired continue
//! token; one request whose metadata list changed too much, or whose GETs are forbidden)
//! the source `rewind`s to a `mark` it took before, and the collector forgets what was
//! delivered since; so a poll never mixes two lists and nothing is buffered.

pub mod api;
pub mod item;
pub mod manifests;
pub mod proto;
pub mod reader;
pub mod selection;

use std::fmt;

pub use item::{Content, Item, ModuleFile};
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
}

/// A source of ConfigMaps.
pub trait Source: Send {
    /// Lists every selected ConfigMap into `out`, or fails; a failure fails the poll.
    fn list(&mut self, prev: &dyn Previous, out: &mut dyn Collect) -> Result<(), Error>;
    /// What the source is, for logs.
    fn describe(&self) -> String;
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

/// The options a source is opened with.
#[derive(Clone, Debug)]
pub struct Options {
    pub origin: Origin,
    pub selection: Selection,
    pub page_size: u32,
    pub list_mode: ListMode,
    pub namespace_from_context: bool,
    pub client: kube::client::Options,
}

/// Where ConfigMaps come from.
#[derive(Clone, Debug)]
pub enum Origin {
    Manifests(std::path::PathBuf),
    Api(kube::config::Flags),
}

/// Opens the source `opts` describe: reads credentials, builds the client. Problems are
/// configuration errors, reported before any poll.
pub fn open(
    opts: &Options,
    handles: kube::client::Handles,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Box<dyn Source>, String> {
    let mut selection = opts.selection.clone();
    match &opts.origin {
        Origin::Manifests(dir) => {
            if opts.namespace_from_context {
                return Err(
                    "--namespace-from-context: not used with --manifests (use --namespace)".into(),
                );
            }
            if opts.list_mode == ListMode::Metadata {
                log::info!("--list-mode metadata: not used with --manifests");
            }
            Ok(Box::new(manifests::ManifestSource::new(
                dir.clone(),
                selection,
            )))
        }
        Origin::Api(flags) => {
            let config = kube::Config::resolve(flags, env)?;
            if opts.namespace_from_context && selection.namespaces.is_empty() {
                let ns = config.namespace.clone().ok_or_else(|| {
                    format!(
                        "--namespace-from-context: {} has no namespace",
                        config.origin
                    )
                })?;
                log::info!("listing namespace \"{ns}\" (from {})", config.origin);
                selection.namespaces = vec![ns];
            }
            let client = kube::Client::new(&config, opts.client.clone(), handles, env)?;
            log::debug!("apiserver {} ({})", config.server, config.origin);
            Ok(Box::new(api::ApiSource::new(
                client,
                selection,
                opts.page_size,
                opts.list_mode,
            )))
        }
    }
}
