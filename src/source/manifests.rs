//! `--manifests DIR`: the folder is read again on every poll, so editing a file while
//! `cmpoll run` watches the folder produces events (handy for developing modules).

use std::path::PathBuf;

use super::{Selection, Source, Visit};
use crate::kube;
use crate::manifests::load_dir;
use crate::module::{Content, File, Item};

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
    fn list(&mut self, visit: &mut dyn Visit) -> Result<(), kube::Error> {
        let cms =
            load_dir(&self.dir).map_err(|e| kube::Error::Local(format!("--manifests: {e}")))?;
        for cm in cms {
            let keys_seen = cm.data.len() + cm.binary_data.len();
            let keys = &self.selection.keys;
            let files = cm
                .data
                .into_iter()
                .filter(|(k, _)| keys.matches(k))
                .map(|(key, v)| File {
                    key,
                    content: Content::Text(v),
                })
                .chain(
                    cm.binary_data
                        .into_iter()
                        .filter(|(k, _)| keys.matches(k))
                        .map(|(key, v)| File {
                            key,
                            content: Content::Binary(v),
                        }),
                )
                .collect();
            let item = Item {
                namespace: cm.namespace,
                name: cm.name,
                uid: cm.uid,
                resource_version: cm.resource_version,
                labels: cm.labels.into_iter().collect(),
                files,
                keys_seen,
                problems: Vec::new(),
                partial: false,
            };
            if self.selection.admits(&item) {
                visit.item(item)?;
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("manifests in '{}'", self.dir.display())
    }
}
