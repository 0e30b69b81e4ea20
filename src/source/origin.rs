//! Which source a command lists from, and opening it: the options `settings` assembles
//! (`Origin`: an apiserver's credentials, or a manifests folder) and `open`, which reads
//! credentials and builds the client before any poll.

use super::api::ApiSource;
use super::manifests::ManifestSource;
use super::selection::Selection;
use super::{ListMode, Source};
use crate::kube;

/// The options a source is opened with.
#[derive(Clone, Debug)]
pub struct Options {
    pub origin: Origin,
    pub selection: Selection,
    pub page_size: u32,
    pub list_mode: ListMode,
    pub namespace_from_context: bool,
    pub client: kube::client::Options,
    /// Keep each object's JSON as served (`cmpoll serve`).
    pub raw: bool,
    /// Ask for a listed scope's changes with a short watch (`cmpoll serve`:
    /// `api/short_watch.rs`).
    pub short_watch: bool,
    /// How long a `cmpoll serve` hub may hold a poll until it has something newer
    /// (`cmpoll run`: its interval; `None`: never asked).
    pub wait: Option<std::time::Duration>,
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
            Ok(Box::new(ManifestSource::new(dir.clone(), selection)))
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
            Ok(Box::new(
                ApiSource::new(client, selection, opts.page_size, opts.list_mode)
                    .keeping_raw(opts.raw)
                    .short_watching(opts.short_watch)
                    .waiting(opts.wait),
            ))
        }
    }
}
