//! `--manifests DIR`: ConfigMaps (or, with `--resource secrets`, Secrets, or both) from manifest
//! files (`files.rs` reads them) instead of an apiserver. The folder is read again on every poll, so editing a file while `cmpoll run`
//! watches the folder produces events (handy for developing modules). Manifests carry no
//! resourceVersion to compare, so every item is delivered with its contents; the poll's
//! hashes decide what changed.

pub mod files;

use std::path::PathBuf;

use super::{Collect, Content, Error, Item, ModuleFile, Previous, Resource, Selection, Source};

pub struct ManifestSource {
    dir: PathBuf,
    selection: Selection,
}

impl ManifestSource {
    pub fn new(dir: PathBuf, selection: Selection) -> ManifestSource {
        ManifestSource { dir, selection }
    }
}

impl Source for ManifestSource {
    fn list(&mut self, _prev: &dyn Previous, out: &mut dyn Collect) -> Result<(), Error> {
        let cms = files::load_dir(&self.dir).map_err(Error::Manifests)?;
        for cm in cms {
            if let Some(item) = item(cm, &self.selection) {
                out.item(item)?;
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("manifests in '{}'", self.dir.display())
    }
}

/// The item `selection` makes of a manifest's object, as a list from the apiserver would
/// deliver it (`None`: a kind not listed, or not selected). Also what `cmpoll webhook`
/// makes of the object under review.
pub fn item(cm: files::ManifestConfigMap, selection: &Selection) -> Option<Item> {
    let kind = match cm.secret {
        Some(_) => Resource::Secrets,
        None => Resource::ConfigMaps,
    };
    let kinds = selection.resources;
    if !kinds.has(kind) {
        return None;
    }
    let secrets = kind == Resource::Secrets;
    let labels: Vec<(String, String)> = cm.labels.into_iter().collect();
    if !selection.admits(&cm.namespace, &cm.name, &labels) {
        return None;
    }
    let keys_seen = cm.data.len() + cm.binary_data.len();
    let keys = &selection.keys;
    // A Secret's files are bytes, as the apiserver would return them (base64).
    let text = cm.data.into_iter().map(|(key, v)| {
        let content = if secrets {
            Content::Binary(v.into_bytes())
        } else {
            Content::Text(v)
        };
        (key, content)
    });
    let binary = (cm.binary_data.into_iter()).map(|(key, v)| (key, Content::Binary(v)));
    let files = text
        .chain(binary)
        .filter(|(key, _)| keys.matches(key))
        .map(|(key, content)| ModuleFile { key, content })
        .collect();
    Some(Item {
        kind,
        qualified: kinds.qualified(),
        namespace: cm.namespace,
        name: cm.name,
        uid: cm.uid,
        resource_version: cm.resource_version,
        labels,
        files,
        keys_seen,
        problems: Vec::new(),
        folder: (selection.folder_annotation.as_ref()).and_then(|a| cm.annotations.get(a).cloned()),
        raw: None,
    })
}
