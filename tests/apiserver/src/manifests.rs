//! Manifest folders for the standalone server: cmpoll's own parser (so both read a folder
//! identically), turned into store objects.

#[path = "../../../src/source/manifests/files.rs"]
mod parser;

use std::path::Path;

use crate::store::ConfigMap;

/// Every ConfigMap and Secret under `dir`.
pub fn load_dir(dir: &Path) -> Result<Vec<ConfigMap>, String> {
    Ok(parser::load_dir(dir)?
        .into_iter()
        .map(|m| ConfigMap {
            namespace: m.namespace,
            name: m.name,
            labels: m.labels,
            annotations: m.annotations,
            data: m.data,
            binary_data: m.binary_data,
            immutable: m.immutable,
            secret: m.secret,
        })
        .collect())
}
