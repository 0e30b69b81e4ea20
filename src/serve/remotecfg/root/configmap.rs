//! `--remotecfg configmap:NAMESPACE/NAME`: the root read from a ConfigMap (SPEC), as the
//! hub's own credential GETs it (`get` on that ConfigMap: the shipped ClusterRole has it).
//! Its key `root.alloy` is the root; its key `arguments`, when there, the offered
//! arguments' `NAME = VALUE` lines (`--remotecfg-arguments FILE`, when given, in their
//! place). The answer is read bounded and checked to be that ConfigMap; an answer that is
//! not, or lacks `root.alloy`, is an error naming the flag's value, and the hub keeps the
//! last root it read (`root.rs`).

use std::collections::BTreeMap;

use serde::Deserialize;

/// The key of the root's text.
pub const ROOT_KEY: &str = "root.alloy";

/// The key of the offered arguments.
pub const ARGUMENTS_KEY: &str = "arguments";

/// What is read of the answer at most: a ConfigMap holds at most 1 MiB, with its
/// metadata (managedFields included) within this.
pub const MAX_ANSWER: u64 = 3 << 20;

/// A ConfigMap named by `--remotecfg configmap:NS/NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub namespace: String,
    pub name: String,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Deserialize)]
struct ConfigMap {
    #[serde(default)]
    kind: String,
    metadata: Meta,
    #[serde(default)]
    data: Option<BTreeMap<String, String>>,
}

impl Named {
    /// `configmap:NS/NAME`'s ConfigMap, or why it names none (apimachinery's rules for a
    /// namespace and a ConfigMap's name); `None`: not a `configmap:` value.
    pub fn parse(value: &str) -> Option<Result<Named, String>> {
        let rest = value.strip_prefix("configmap:")?;
        let Some((namespace, name)) = rest.split_once('/') else {
            return Some(Err(format!("'{value}': give configmap:NAMESPACE/NAME")));
        };
        let wrong = (crate::names::dns1123_label(namespace).into_iter())
            .map(|e| format!("namespace '{namespace}': {e}"))
            .chain(
                (crate::names::dns1123_subdomain(name).into_iter())
                    .map(|e| format!("name '{name}': {e}")),
            )
            .next();
        Some(match wrong {
            Some(e) => Err(format!("'{value}': {e}")),
            None => Ok(Named {
                namespace: namespace.into(),
                name: name.into(),
            }),
        })
    }

    /// Its path in the apiserver's API.
    pub fn path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/configmaps/{}",
            self.namespace, self.name
        )
    }

    /// The flag's value, for messages.
    pub fn shown(&self) -> String {
        format!("--remotecfg configmap:{}/{}", self.namespace, self.name)
    }

    /// The root and, when there, the arguments of `answer` (the GET's body).
    pub fn read(&self, answer: &[u8]) -> Result<(String, Option<String>), String> {
        let cm: ConfigMap = serde_json::from_slice(answer).map_err(|e| {
            format!(
                "{}: not a ConfigMap: {}",
                self.shown(),
                crate::reason::cut(&e.to_string(), 200)
            )
        })?;
        if cm.kind != "ConfigMap"
            || cm.metadata.name != self.name
            || cm.metadata.namespace != self.namespace
        {
            return Err(format!(
                "{}: the apiserver answered another object",
                self.shown()
            ));
        }
        let mut data = cm.data.unwrap_or_default();
        let root = data
            .remove(ROOT_KEY)
            .ok_or_else(|| format!("{}: no key {ROOT_KEY}", self.shown()))?;
        Ok((root, data.remove(ARGUMENTS_KEY)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_configmap_is_named_as_the_apiserver_names_one() {
        assert_eq!(Named::parse("/etc/root.alloy"), None);
        let n = Named::parse("configmap:monitoring/alloy-root")
            .unwrap()
            .unwrap();
        assert_eq!(
            n.path(),
            "/api/v1/namespaces/monitoring/configmaps/alloy-root"
        );
        for bad in [
            "configmap:monitoring",
            "configmap:Mon/x",
            "configmap:ns/",
            "configmap:ns/a/b",
        ] {
            let e = Named::parse(bad).unwrap().unwrap_err();
            assert!(e.starts_with(&format!("'{bad}': ")), "{e}");
        }
    }

    #[test]
    fn its_keys_are_read_from_that_configmap_alone() {
        let n = Named::parse("configmap:ns/root").unwrap().unwrap();
        let cm = |name: &str, data: &str| {
            format!(
                r#"{{"kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"ns"}},"data":{data}}}"#
            )
        };
        let both = cm(
            "root",
            r#"{"root.alloy":"// r\n","arguments":"a = b\n","x":"y"}"#,
        );
        assert_eq!(
            n.read(both.as_bytes()).unwrap(),
            ("// r\n".into(), Some("a = b\n".into()))
        );
        assert_eq!(
            n.read(cm("root", r#"{"root.alloy":""}"#).as_bytes())
                .unwrap(),
            (String::new(), None)
        );
        let e = n.read(cm("root", "null").as_bytes()).unwrap_err();
        assert_eq!(e, "--remotecfg configmap:ns/root: no key root.alloy");
        let e = n
            .read(cm("other", r#"{"root.alloy":""}"#).as_bytes())
            .unwrap_err();
        assert!(e.ends_with("another object"), "{e}");
        assert!(n.read(b"[]").unwrap_err().contains("not a ConfigMap"));
    }
}
