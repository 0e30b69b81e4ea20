//! What to select, the same for every source: label and field selectors, namespaces, and
//! the `--keys` globs. Sources check every item against it rather than trust an apiserver
//! to have applied it.

use crate::selector::{FieldSelector, LabelSelector};

/// What one cmpoll lists (`--resource`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
}

#[derive(Clone, Debug)]
pub struct Selection {
    pub resource: Resource,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// Empty: all namespaces (one cluster-wide list).
    pub namespaces: Vec<String>,
    pub keys: KeyFilter,
}

impl Selection {
    /// For the start-up line: selector, field selector, namespaces, keys.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "{}, selector '{}'",
            self.resource.plural(),
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
}
