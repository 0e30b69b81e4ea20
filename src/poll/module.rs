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
        let kinds = if self.qualified {
            Resources::both()
        } else {
            Resources::one(self.kind)
        };
        kinds.id(self.kind, &self.namespace, &self.name)
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

impl Module {
    /// Validates `item` and hashes its files.
    pub fn from_item(item: Item) -> Result<Module, NotAModule> {
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
        let mut files = item.files;
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
        let m = Module::from_item(item("ns", "m", &[("b", "2"), ("B", "1"), ("a", "3")])).unwrap();
        let keys: Vec<&str> = m.files.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, ["B", "a", "b"]);
        let reordered =
            Module::from_item(item("ns", "m", &[("a", "3"), ("b", "2"), ("B", "1")])).unwrap();
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
            match Module::from_item(it) {
                Err(NotAModule::Invalid(why)) => assert!(why.contains(want), "{id}: {why}"),
                other => panic!("{id}: {other:?}"),
            }
        }
        let mut bad = item("ns", "m", &[("k", "")]);
        bad.problems.push("binaryData[k] is not base64".into());
        assert!(matches!(
            Module::from_item(bad),
            Err(NotAModule::Invalid(_))
        ));
    }

    #[test]
    fn no_selected_key_is_not_a_module() {
        assert_eq!(
            Module::from_item(item("ns", "m", &[])),
            Err(NotAModule::NoMatchingKey)
        );
    }
}
