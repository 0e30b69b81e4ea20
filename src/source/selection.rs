//! What to select, the same for every source: label and field selectors, namespaces, and
//! the `--keys` globs. Sources check every item against it rather than trust an apiserver
//! to have applied it.

use crate::selector::{FieldSelector, LabelSelector};

/// What one cmpoll lists (`--resource`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Resource {
    #[default]
    ConfigMaps,
    Secrets,
}

impl crate::words::Words for Resource {
    // k8s-sidecar's RESOURCE and kubectl take the singular too.
    const WORDS: &'static [(&'static str, Self)] = &[
        ("configmaps", Resource::ConfigMaps),
        ("secrets", Resource::Secrets),
        ("configmap", Resource::ConfigMaps),
        ("secret", Resource::Secrets),
    ];
}

impl Resource {
    /// Its place in an array of one entry per kind (`[T; 2]`).
    pub fn index(self) -> usize {
        match self {
            Resource::ConfigMaps => 0,
            Resource::Secrets => 1,
        }
    }

    /// The resource's name in paths and RBAC: `configmaps`, `secrets`.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::ConfigMaps => "configmaps",
            Resource::Secrets => "secrets",
        }
    }

    /// For messages: `configmap`, `secret`.
    pub fn singular(self) -> &'static str {
        match self {
            Resource::ConfigMaps => "configmap",
            Resource::Secrets => "secret",
        }
    }

    /// The object's kind: `ConfigMap`, `Secret`.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::ConfigMaps => "ConfigMap",
            Resource::Secrets => "Secret",
        }
    }

    /// Whether contents may be shown (events on stdout, `list --json`): not a Secret's.
    pub fn shows_contents(self) -> bool {
        self == Resource::ConfigMaps
    }

    /// The kind named at the start of a module id when one cmpoll lists both kinds
    /// (kubectl's `-o name` words): `configmap`, `secret`.
    pub fn from_singular(word: &str) -> Option<Resource> {
        [Resource::ConfigMaps, Resource::Secrets]
            .into_iter()
            .find(|r| r.singular() == word)
    }

    /// The kind a kind-qualified module id (`KIND/NAMESPACE/NAME`) starts with.
    pub fn named_in(id: &str) -> Option<Resource> {
        let word = id
            .split('/')
            .next()
            .filter(|_| id.matches('/').count() == 2);
        word.and_then(Resource::from_singular)
    }
}

/// What one cmpoll lists (`--resource`): one kind, or both (`configmaps,secrets`: one
/// snapshot of both, each module's id then starting with its kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    configmaps: bool,
    secrets: bool,
}

impl Default for Resources {
    fn default() -> Resources {
        Resources::one(Resource::ConfigMaps)
    }
}

impl Resources {
    pub fn one(r: Resource) -> Resources {
        Resources {
            configmaps: r == Resource::ConfigMaps,
            secrets: r == Resource::Secrets,
        }
    }

    pub fn both() -> Resources {
        Resources {
            configmaps: true,
            secrets: true,
        }
    }

    /// A comma list of `configmaps`, `secrets` (or the singular words); the error says
    /// what is accepted.
    pub fn parse(s: &str) -> Result<Resources, String> {
        let mut out = Resources {
            configmaps: false,
            secrets: false,
        };
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match <Resource as crate::words::Words>::from_word(word) {
                Some(Resource::ConfigMaps) => out.configmaps = true,
                Some(Resource::Secrets) => out.secrets = true,
                None => {
                    return Err(format!(
                        "'{word}' is not configmaps or secrets (both: configmaps,secrets)"
                    ));
                }
            }
        }
        if !out.configmaps && !out.secrets {
            return Err("empty: give configmaps, secrets, or both (configmaps,secrets)".into());
        }
        Ok(out)
    }

    /// Each kind listed, ConfigMaps first.
    pub fn iter(self) -> impl Iterator<Item = Resource> {
        [
            (self.configmaps, Resource::ConfigMaps),
            (self.secrets, Resource::Secrets),
        ]
        .into_iter()
        .filter_map(|(on, r)| on.then_some(r))
    }

    pub fn has(self, r: Resource) -> bool {
        self.iter().any(|x| x == r)
    }

    /// Both kinds: every module id starts with its kind.
    pub fn qualified(self) -> bool {
        self.configmaps && self.secrets
    }

    /// The kinds an object of `kind` was listed with: its own, or (`qualified`) both.
    pub fn listed_with(kind: Resource, qualified: bool) -> Resources {
        match qualified {
            true => Resources::both(),
            false => Resources::one(kind),
        }
    }

    /// A module's id: `NAMESPACE/NAME`, or `KIND/NAMESPACE/NAME` with both kinds.
    pub fn id(self, kind: Resource, namespace: &str, name: &str) -> String {
        if self.qualified() {
            format!("{}/{namespace}/{name}", kind.singular())
        } else {
            format!("{namespace}/{name}")
        }
    }

    /// The kind of the module with `id` (see `id`).
    pub fn kind_of(self, id: &str) -> Resource {
        match Resource::named_in(id) {
            Some(r) => r,
            None if self.configmaps => Resource::ConfigMaps,
            None => Resource::Secrets,
        }
    }

    /// `configmaps`, `secrets`, or `configmaps,secrets`.
    pub fn describe(self) -> String {
        let words: Vec<&str> = self.iter().map(Resource::plural).collect();
        words.join(",")
    }
}

#[derive(Clone, Debug)]
pub struct Selection {
    pub resources: Resources,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// Empty: all namespaces (one cluster-wide list).
    pub namespaces: Vec<String>,
    pub keys: KeyFilter,
    /// `--folder-annotation`: the annotation whose value each item carries (`Item::folder`).
    pub folder_annotation: Option<String>,
    /// Objects read by name instead of by label (`cmpoll sidecar`'s `RESOURCE_NAME`).
    pub names: Vec<Named>,
}

/// An object read by name (GET) instead of by label: in every listed namespace, or one;
/// of every listed kind, or one. A namespace and kind that no entry names are listed by
/// label as usual; an object that is not there is absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub namespace: Option<String>,
    pub kind: Option<Resource>,
    pub name: String,
}

impl Selection {
    /// For the start-up line: selector, field selector, namespaces, keys.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "{}, selector '{}'",
            self.resources.describe(),
            self.labels.as_str()
        );
        if !self.fields.as_str().is_empty() {
            out += &format!(", field selector '{}'", self.fields.as_str());
        }
        out += &if self.namespaces.is_empty() {
            ", all namespaces".to_string()
        } else {
            format!(", namespaces {}", self.namespaces.join(","))
        };
        let keys: Vec<&str> = self
            .keys
            .patterns
            .iter()
            .map(glob::Pattern::as_str)
            .collect();
        out + &format!(", keys {}", keys.join(","))
    }

    /// Whether an object with this namespace, name and labels is selected.
    pub fn admits(&self, namespace: &str, name: &str, labels: &[(String, String)]) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && self.labels.matches(|k| {
                labels
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.as_str())
            })
            && self.fields.matches(namespace, name)
    }
}

/// The `--keys` globs.
#[derive(Clone, Debug)]
pub struct KeyFilter {
    patterns: Vec<glob::Pattern>,
}

impl KeyFilter {
    /// Compiles the globs; the error names the bad one.
    pub fn new(globs: &[String]) -> Result<KeyFilter, String> {
        let patterns = globs
            .iter()
            .map(|g| glob::Pattern::new(g).map_err(|e| format!("invalid glob '{g}': {e}")))
            .collect::<Result<_, _>>()?;
        Ok(KeyFilter { patterns })
    }

    /// Every key.
    pub fn all() -> KeyFilter {
        KeyFilter::new(&["*".to_string()]).expect("'*' is a valid glob")
    }

    pub fn matches(&self, key: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_globs() {
        let f =
            KeyFilter::new(&["*.alloy".into(), "rules-?.yaml".into(), "[a-c]*".into()]).unwrap();
        for (key, want) in [
            ("x.alloy", true),
            (".alloy", true),
            ("x.alloy.bak", false),
            ("rules-1.yaml", true),
            ("rules-10.yaml", false),
            ("banana", true),
            ("Banana", false),
        ] {
            assert_eq!(f.matches(key), want, "{key}");
        }
        assert!(
            KeyFilter::new(&["[".into()])
                .unwrap_err()
                .contains("invalid glob '['")
        );
        assert!(KeyFilter::all().matches(".hidden"));
    }

    #[test]
    fn one_kind_or_both_and_the_ids_that_go_with_them() {
        use Resource::*;
        for (text, want) in [
            ("configmaps", Ok(Resources::one(ConfigMaps))),
            ("secret", Ok(Resources::one(Secrets))),
            ("configmaps,secrets", Ok(Resources::both())),
            ("secrets, configmap", Ok(Resources::both())),
            ("secrets,secrets", Ok(Resources::one(Secrets))),
            ("both", Err("'both' is not configmaps or secrets")),
            ("", Err("empty")),
            (" , ", Err("empty")),
        ] {
            match (Resources::parse(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text:?}"),
                (Err(got), Err(want)) => assert!(got.starts_with(want), "{text:?}: {got}"),
                (got, want) => panic!("{text:?}: {got:?}, want {want:?}"),
            }
        }
        let both = Resources::both();
        assert_eq!(both.iter().collect::<Vec<_>>(), [ConfigMaps, Secrets]);
        assert_eq!(both.id(Secrets, "ns", "n"), "secret/ns/n");
        assert_eq!(both.kind_of("secret/ns/n"), Secrets);
        assert_eq!(both.kind_of("configmap/ns/n"), ConfigMaps);
        let one = Resources::one(Secrets);
        assert_eq!(one.id(Secrets, "ns", "n"), "ns/n");
        assert_eq!(one.kind_of("ns/n"), Secrets);
        assert_eq!(
            Resources::default().kind_of("secret/n"),
            ConfigMaps,
            "a namespace named secret"
        );
        assert_eq!(both.describe(), "configmaps,secrets");
    }
}
