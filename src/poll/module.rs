//! Modules: a selected ConfigMap's files, validated and hashed.
//!
//! A source delivers an `Item` per ConfigMap with only the keys the `--keys` globs select.
//! `Module::from_item` checks what the apiserver's validation guarantees (a DNS-1123 label
//! namespace, a DNS-1123 subdomain name, config-key file names, no key in both `data` and
//! `binaryData`), so a hostile or broken answer can never name a path outside the output
//! folder; such a ConfigMap is rejected with a reason and the others go on.

use std::fmt;

use super::hash::Hash;
use crate::names;
use crate::source::{Item, ModuleFile, Resource, Resources};

/// A validated, hashed module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    pub kind: Resource,
    /// Listed with the other kind: its id starts with its kind.
    pub qualified: bool,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// In byte order of the key.
    pub files: Vec<ModuleFile>,
    pub hash: Hash,
}

impl Module {
    /// `namespace/name`, or `kind/namespace/name` (see `Resources::id`).
    pub fn id(&self) -> String {
        Resources::listed_with(self.kind, self.qualified).id(self.kind, &self.namespace, &self.name)
    }

    pub fn bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|f| f.content.bytes().len() as u64)
            .sum()
    }
}

/// Why a ConfigMap is not a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotAModule {
    /// None of its keys matches `--keys` (not an error; logged once).
    NoMatchingKey,
    /// Something the apiserver would never have accepted.
    Invalid(String),
}

impl fmt::Display for NotAModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotAModule::NoMatchingKey => f.write_str("no key matches --keys"),
            NotAModule::Invalid(why) => f.write_str(why),
        }
    }
}

/// How a module's files are named in a `flat` output folder, decided here because the
/// names are what is hashed (SPEC: a file's key, for the hash and the clash rule, is its
/// path relative to the folder, so moving the annotation is an update that moves it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Naming {
    /// `--unique-filenames`: `namespace_<NS>.<configmap|secret>_<NAME>.<KEY>`.
    pub unique: bool,
    /// `--folder-annotation`: the output folder (absolute), which an absolute annotation
    /// value must lie inside.
    pub folder_root: Option<std::path::PathBuf>,
}

impl Naming {
    /// What a file of `item` is named. A folder value that is not a path inside the output
    /// folder (`..`, an absolute path elsewhere) is kept as it is: the `flat` layout
    /// refuses the module, naming the file and why, with a `rejected` event.
    fn name(&self, item: &Item, key: &str) -> String {
        let file = if self.unique {
            format!(
                "namespace_{}.{}_{}.{key}",
                item.namespace,
                item.kind.singular(),
                item.name
            )
        } else {
            key.to_string()
        };
        match (&self.folder_root, &item.folder) {
            (Some(root), Some(value)) => match folder_inside(root, value) {
                Some(rel) if rel.is_empty() => file,
                Some(rel) => format!("{rel}/{file}"),
                None => format!("{}/{file}", value.trim_end_matches('/')),
            },
            _ => file,
        }
    }
}

/// A folder annotation's value as a path relative to `root`: a relative value with its
/// `.` and empty parts dropped, or an absolute one inside `root` with `root` taken off;
/// `None` for a value with `..` or an absolute path elsewhere (compared as written: no
/// symlink is followed).
pub fn folder_inside(root: &std::path::Path, value: &str) -> Option<String> {
    let parts = |s: &str| -> Option<Vec<String>> {
        let mut out = Vec::new();
        for c in s.split('/') {
            match c {
                "" | "." => {}
                ".." => return None,
                c => out.push(c.to_string()),
            }
        }
        Some(out)
    };
    let rel = match value.strip_prefix('/') {
        None => parts(value)?,
        Some(_) => {
            let root = parts(root.to_str()?)?;
            let abs = parts(value)?;
            abs.strip_prefix(&root[..])?.to_vec()
        }
    };
    Some(rel.join("/"))
}

impl Module {
    /// Validates `item` and hashes its files, named as `naming` says.
    pub fn from_item(mut item: Item, naming: &Naming) -> Result<Module, NotAModule> {
        let reject = |what: String| Err(NotAModule::Invalid(what));
        let errs = names::dns1123_label(&item.namespace);
        if !errs.is_empty() {
            return reject(format!(
                "invalid namespace {}: {}",
                names::go_quote(&item.namespace),
                errs.join("; ")
            ));
        }
        let errs = names::dns1123_subdomain(&item.name);
        if !errs.is_empty() {
            return reject(format!(
                "invalid name {}: {}",
                names::go_quote(&item.name),
                errs.join("; ")
            ));
        }
        if let Some(p) = item.problems.first() {
            return reject(p.clone());
        }
        let mut files = std::mem::take(&mut item.files);
        files.sort_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
        for pair in files.windows(2) {
            if pair[0].key == pair[1].key {
                return reject(format!(
                    "key {} is in both data and binaryData",
                    names::go_quote(&pair[0].key)
                ));
            }
        }
        for f in &files {
            let errs = names::config_map_key(&f.key);
            if !errs.is_empty() {
                return reject(format!(
                    "invalid key {}: {}",
                    names::go_quote(&f.key),
                    errs.join("; ")
                ));
            }
        }
        if files.is_empty() {
            return Err(NotAModule::NoMatchingKey);
        }
        if *naming != Naming::default() {
            for f in &mut files {
                f.key = naming.name(&item, &f.key);
            }
            files.sort_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
        }
        let hash = Hash::of(files.iter().map(|f| (f.key.as_str(), f.content.bytes())));
        Ok(Module {
            kind: item.kind,
            qualified: item.qualified,
            namespace: item.namespace,
            name: item.name,
            uid: item.uid,
            resource_version: item.resource_version,
            files,
            hash,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::source::Content;

    fn item(ns: &str, name: &str, files: &[(&str, &str)]) -> Item {
        Item {
            namespace: ns.into(),
            name: name.into(),
            files: files
                .iter()
                .map(|(k, v)| ModuleFile {
                    key: k.to_string(),
                    content: Content::Text(v.to_string()),
                })
                .collect(),
            ..Item::default()
        }
    }

    #[test]
    fn files_are_sorted_by_key_bytes_and_hashed() {
        let m = Module::from_item_plain(item("ns", "m", &[("b", "2"), ("B", "1"), ("a", "3")]))
            .unwrap();
        let keys: Vec<&str> = m.files.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, ["B", "a", "b"]);
        let reordered =
            Module::from_item_plain(item("ns", "m", &[("a", "3"), ("b", "2"), ("B", "1")]))
                .unwrap();
        assert_eq!(m.hash, reordered.hash, "order of arrival does not matter");
        assert_eq!(m.id(), "ns/m");
        assert_eq!(m.bytes(), 3);
    }

    #[test]
    fn rejects_what_the_apiserver_never_accepts() {
        let cases = [
            (
                item("ns", "m", &[("../../x", "")]),
                "invalid key \"../../x\"",
            ),
            (item("ns", "m", &[("..", "")]), "must not be '..'"),
            (item("ns", "m", &[(".", "")]), "must not be '.'"),
            (item("ns", "m", &[("a/b", "")]), "invalid key \"a/b\""),
            (item("ns", "m", &[("a\0b", "")]), "invalid key \"a\\x00b\""),
            (
                item("ns", "m", &[(&"k".repeat(254), "")]),
                "no more than 253",
            ),
            (item("../ns", "m", &[("k", "")]), "invalid namespace"),
            (item("ns", "..", &[("k", "")]), "invalid name \"..\""),
            (item("ns", "a/b", &[("k", "")]), "invalid name"),
            (item("", "m", &[("k", "")]), "invalid namespace"),
            (item("ns", &"n".repeat(254), &[("k", "")]), "invalid name"),
            (
                item("ns", "m", &[("k", "1"), ("k", "2")]),
                "in both data and binaryData",
            ),
        ];
        for (it, want) in cases {
            let id = it.id();
            match Module::from_item_plain(it) {
                Err(NotAModule::Invalid(why)) => assert!(why.contains(want), "{id}: {why}"),
                other => panic!("{id}: {other:?}"),
            }
        }
        let mut bad = item("ns", "m", &[("k", "")]);
        bad.problems.push("binaryData[k] is not base64".into());
        assert!(matches!(
            Module::from_item_plain(bad),
            Err(NotAModule::Invalid(_))
        ));
    }

    impl Module {
        fn from_item_plain(item: Item) -> Result<Module, NotAModule> {
            Module::from_item(item, &Naming::default())
        }
    }

    /// Issue 26: k8s-sidecar's names. `UNIQUE_FILENAMES` as its `unique_filename` writes
    /// them (helpers.py), the folder annotation relative to the output folder (hashed as
    /// such: a moved folder is an update), an absolute value inside it taken as relative,
    /// and one that leaves it kept as written for the `flat` layout to refuse.
    #[test]
    fn flat_names_from_unique_filenames_and_the_folder_annotation() {
        let root = std::path::Path::new("/tmp/dashboards");
        let unique = Naming {
            unique: true,
            folder_root: None,
        };
        let mut it = item("monitoring", "node", &[("a.json", "{}")]);
        it.kind = Resource::Secrets;
        let m = Module::from_item(it.clone(), &unique).unwrap();
        assert_eq!(m.files[0].key, "namespace_monitoring.secret_node.a.json");
        let folders = Naming {
            unique: false,
            folder_root: Some(root.into()),
        };
        for (value, key) in [
            (None, "a.json"),
            (Some("team-a"), "team-a/a.json"),
            (Some("./team-a//sub/"), "team-a/sub/a.json"),
            (Some("/tmp/dashboards/team-b"), "team-b/a.json"),
            (Some("/tmp/dashboards"), "a.json"),
            (Some(""), "a.json"),
            (Some("../elsewhere"), "../elsewhere/a.json"),
            (Some("/etc/grafana"), "/etc/grafana/a.json"),
            (Some("/tmp/dashboards-x"), "/tmp/dashboards-x/a.json"),
        ] {
            it.folder = value.map(String::from);
            let m = Module::from_item(it.clone(), &folders).unwrap();
            assert_eq!(m.files[0].key, key, "{value:?}");
        }
        it.folder = Some("a".into());
        let a = Module::from_item(it.clone(), &folders).unwrap();
        it.folder = Some("b".into());
        let b = Module::from_item(it.clone(), &folders).unwrap();
        assert_ne!(a.hash, b.hash, "the folder is part of the module");
        let both = Naming {
            unique: true,
            folder_root: Some(root.into()),
        };
        let m = Module::from_item(it, &both).unwrap();
        assert_eq!(m.files[0].key, "b/namespace_monitoring.secret_node.a.json");
    }

    #[test]
    fn no_selected_key_is_not_a_module() {
        assert_eq!(
            Module::from_item_plain(item("ns", "m", &[])),
            Err(NotAModule::NoMatchingKey)
        );
    }
}
