//! ConfigMap and Secret manifests from a folder: what `--manifests DIR` reads instead of an
//! apiserver.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file under the folder (recursively, in path order)
//! is read as one or more documents; `ConfigMap` and `Secret` documents are kept, `List`,
//! `ConfigMapList` and `SecretList` documents contribute their items, other kinds are
//! skipped. A Secret's `data` is base64 (decoded into `binary_data`); its `stringData` is
//! text that wins over `data` for the same key, as the apiserver merges them. Parsing is as
//! strict as kubectl's: an unquoted `8080` or `true` under `data:` is an error, because the
//! apiserver would refuse it. Every error names the file, and the line where it has one.
//! Self-contained (serde, serde_json, serde-saphyr, base64) so the test apiserver can
//! include this file by path.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

/// One ConfigMap read from a manifest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ManifestConfigMap {
    /// The file it came from.
    pub file: PathBuf,
    /// `metadata.namespace`, or `default` when the manifest has none (as `kubectl apply`).
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub data: BTreeMap<String, String>,
    /// `binaryData`, decoded.
    pub binary_data: BTreeMap<String, Vec<u8>>,
    pub immutable: Option<bool>,
    /// A Secret of this type (`Opaque` when the manifest gives none); `None`: a ConfigMap.
    pub secret: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Doc {
    kind: Option<String>,
    metadata: Option<Meta>,
    data: Option<BTreeMap<String, String>>,
    binary_data: Option<BTreeMap<String, String>>,
    string_data: Option<BTreeMap<String, String>>,
    #[serde(rename = "type")]
    kind_of_secret: Option<String>,
    immutable: Option<bool>,
    items: Option<Vec<Doc>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

/// Reads every ConfigMap and Secret under `dir`. The error is one line naming the file.
pub fn load_dir(dir: &Path) -> Result<Vec<ManifestConfigMap>, String> {
    let mut files = Vec::new();
    collect(dir, &mut files)?;
    files.sort();
    let mut out = Vec::new();
    for file in files {
        load_file(&file, &mut out)?;
    }
    Ok(out)
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries =
        fs::read_dir(dir).map_err(|e| format!("cannot read folder '{}': {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read folder '{}': {e}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let meta =
            fs::metadata(&path).map_err(|e| format!("cannot read '{}': {e}", path.display()))?;
        if meta.is_dir() {
            collect(&path, files)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            files.push(path);
        }
    }
    Ok(())
}

/// Reads the ConfigMaps and Secrets of one file into `out`.
pub fn load_file(file: &Path, out: &mut Vec<ManifestConfigMap>) -> Result<(), String> {
    let text =
        fs::read_to_string(file).map_err(|e| format!("cannot read '{}': {e}", file.display()))?;
    parse(file, &text, out)
}

/// Parses the text of `file` (JSON if it is named `*.json`, else YAML). Both may hold any
/// number of documents: YAML separated by `---`, JSON concatenated (as `kubectl get -o
/// json` output piped together). YAML's resource limits apply to each document on its
/// own, so a long file is never refused for its length.
pub fn parse(file: &Path, text: &str, out: &mut Vec<ManifestConfigMap>) -> Result<(), String> {
    let name = file.display();
    if file.extension().is_some_and(|e| e == "json") {
        let docs = serde_json::Deserializer::from_str(text).into_iter::<Doc>();
        for (i, doc) in docs.enumerate() {
            let doc = doc.map_err(|e| format!("'{name}': document {}: {e}", i + 1))?;
            flatten(file, i + 1, doc, out)?;
        }
        return Ok(());
    }
    let options = serde_saphyr::options! { no_schema: true, with_snippet: false };
    let mut bytes = text.as_bytes();
    let docs = serde_saphyr::read_with_options::<_, Doc>(&mut bytes, options);
    for (i, doc) in docs.enumerate() {
        let doc = doc.map_err(|e| {
            let msg = e.to_string();
            let msg = msg.trim_start_matches("error: ").trim();
            if msg.contains("budget breached") {
                format!(
                    "'{name}': document {}: larger than a manifest may be ({msg}; limits per document: {})",
                    i + 1,
                    YAML_LIMITS
                )
            } else {
                format!("'{name}': {msg}")
            }
        })?;
        flatten(file, i + 1, doc, out)?;
    }
    Ok(())
}

/// serde-saphyr's default budget, which applies to each YAML document.
const YAML_LIMITS: &str =
    "1,000,000 parser events, 250,000 nodes, nesting depth 64, 64 MiB of scalars";

fn flatten(
    file: &Path,
    index: usize,
    doc: Doc,
    out: &mut Vec<ManifestConfigMap>,
) -> Result<(), String> {
    match doc.kind.as_deref() {
        Some("ConfigMap" | "Secret") => out.push(convert(file, index, doc)?),
        Some("List" | "ConfigMapList" | "SecretList") => {
            for item in doc.items.unwrap_or_default() {
                flatten(file, index, item, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn convert(file: &Path, index: usize, doc: Doc) -> Result<ManifestConfigMap, String> {
    let kind = doc.kind.as_deref().unwrap_or("ConfigMap");
    let is_secret = kind == "Secret";
    let meta = doc.metadata.unwrap_or_default();
    let name = meta.name.filter(|n| !n.is_empty()).ok_or_else(|| {
        format!(
            "'{}': document {index}: a {kind} needs metadata.name",
            file.display()
        )
    })?;
    // A Secret's `data` is base64, as a ConfigMap's `binaryData`.
    let (text, encoded, field) = if is_secret {
        (doc.string_data, doc.data, "data")
    } else {
        (doc.data, doc.binary_data, "binaryData")
    };
    let mut binary_data = BTreeMap::new();
    for (key, b64) in encoded.unwrap_or_default() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| {
                format!(
                    "'{}': {kind} \"{name}\": {field}[{key}] is not base64: {e}",
                    file.display()
                )
            })?;
        binary_data.insert(key, bytes);
    }
    let data = text.unwrap_or_default();
    if is_secret {
        // stringData wins over data for the same key.
        binary_data.retain(|k, _| !data.contains_key(k));
    }
    Ok(ManifestConfigMap {
        file: file.to_path_buf(),
        namespace: meta
            .namespace
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_string()),
        name,
        uid: meta.uid.unwrap_or_default(),
        resource_version: meta.resource_version.unwrap_or_default(),
        labels: meta.labels.unwrap_or_default(),
        annotations: meta.annotations.unwrap_or_default(),
        data,
        binary_data,
        immutable: doc.immutable,
        secret: is_secret.then(|| doc.kind_of_secret.unwrap_or_else(|| "Opaque".into())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(name: &str, text: &str) -> Result<Vec<ManifestConfigMap>, String> {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(name), text).unwrap();
        load_dir(dir.path())
    }

    #[test]
    fn reads_multi_document_yaml_lists_and_json() {
        let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: {x: \"1\"}\ndata:\n  k: v\nbinaryData:\n  b.bin: AAEC\n---\n# a comment-only document\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: skipped\n---\nkind: List\nitems:\n- kind: ConfigMap\n  metadata: {name: b, namespace: ns}\n";
        let cms = load("m.yaml", yaml).unwrap();
        assert_eq!(cms.len(), 2);
        assert_eq!(
            (cms[0].namespace.as_str(), cms[0].name.as_str()),
            ("default", "a")
        );
        assert_eq!(cms[0].binary_data["b.bin"], vec![0, 1, 2]);
        assert_eq!(cms[0].labels["x"], "1");
        assert_eq!(
            (cms[1].namespace.as_str(), cms[1].name.as_str()),
            ("ns", "b")
        );
        let json = r#"{"kind":"ConfigMapList","items":[{"kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"}}]}"#;
        assert_eq!(load("l.json", json).unwrap()[0].name, "c");
    }

    #[test]
    fn many_documents_and_concatenated_json() {
        // r13: more than serde-saphyr's 1,024-document stream budget, and JSON documents
        // one after another (what `kubectl get cm a -o json; kubectl get cm b -o json` gives).
        let yaml: String = (0..3000)
            .map(|i| format!("---\nkind: ConfigMap\nmetadata: {{name: m{i}}}\ndata: {{k: v}}\n"))
            .collect();
        assert_eq!(load("many.yaml", &yaml).unwrap().len(), 3000);
        let json = r#"{"kind":"ConfigMap","metadata":{"name":"a"}}
{"kind":"ConfigMap","metadata":{"name":"b"}} {"kind":"List","items":[{"kind":"ConfigMap","metadata":{"name":"c"}}]}"#;
        let names: Vec<String> = load("x.json", json)
            .unwrap()
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        let err = load(
            "bad.json",
            "{\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"a\"}} {\"kind\":",
        )
        .unwrap_err();
        assert!(
            err.contains("bad.json") && err.contains("document 2"),
            "{err}"
        );
        let huge = format!(
            "kind: ConfigMap\nmetadata: {{name: a}}\nx:\n{}",
            "- 1\n".repeat(260_000)
        );
        let err = load("huge.yaml", &huge).unwrap_err();
        assert!(
            err.contains("huge.yaml") && err.contains("limits per document"),
            "{err}"
        );
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err = load(
            "bad.yaml",
            "kind: ConfigMap\nmetadata: {name: a}\ndata:\n  port: 8080\n",
        )
        .unwrap_err();
        assert!(err.contains("bad.yaml") && err.contains("line 4"), "{err}");
        let err = load("broken.yaml", "kind: ConfigMap\ndata:\n  a: [1\n").unwrap_err();
        assert!(
            err.contains("broken.yaml") && err.contains("line 3"),
            "{err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
        let err = load("x.json", "{\"kind\": ").unwrap_err();
        assert!(err.contains("x.json") && err.contains("line 1"), "{err}");
        let err = load("n.yaml", "kind: ConfigMap\ndata: {a: b}\n").unwrap_err();
        assert!(err.contains("metadata.name"), "{err}");
        let err = load(
            "b.yaml",
            "kind: ConfigMap\nmetadata: {name: a}\nbinaryData: {k: '!!'}\n",
        )
        .unwrap_err();
        assert!(err.contains("binaryData[k]"), "{err}");
    }

    #[test]
    fn walks_folders_in_order_and_skips_hidden_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("sub")).unwrap();
        fs::create_dir_all(dir.path().join(".git")).unwrap();
        let cm = |n: &str| format!("kind: ConfigMap\nmetadata: {{name: {n}}}\n");
        fs::write(dir.path().join("sub/b.yml"), cm("b")).unwrap();
        fs::write(dir.path().join("a.yaml"), cm("a")).unwrap();
        fs::write(dir.path().join(".git/c.yaml"), cm("c")).unwrap();
        fs::write(dir.path().join("README.md"), "not yaml").unwrap();
        let names: Vec<String> = load_dir(dir.path())
            .unwrap()
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert!(
            load_dir(&dir.path().join("missing"))
                .unwrap_err()
                .contains("missing")
        );
    }

    #[test]
    fn secrets_decode_data_and_take_string_data_over_it() {
        let yaml = "kind: Secret\nmetadata: {name: s, namespace: ns}\ndata:\n  password: aHVudGVyMg==\n  both: b2xk\nstringData:\n  both: new\n---\nkind: SecretList\nitems:\n- kind: Secret\n  type: kubernetes.io/tls\n  metadata: {name: t}\n";
        let got = load("s.yaml", yaml).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].secret.as_deref(), Some("Opaque"));
        assert_eq!(got[0].binary_data["password"], b"hunter2");
        assert_eq!(got[0].data["both"], "new");
        assert!(!got[0].binary_data.contains_key("both"), "stringData wins");
        assert_eq!(got[1].secret.as_deref(), Some("kubernetes.io/tls"));
        let err = load(
            "b.yaml",
            "kind: Secret\nmetadata: {name: a}\ndata: {k: '!!'}\n",
        )
        .unwrap_err();
        assert!(err.contains("Secret \"a\": data[k] is not base64"), "{err}");
        let cm = load(
            "c.yaml",
            "kind: ConfigMap\nmetadata: {name: c}\ndata: {k: v}\n",
        )
        .unwrap();
        assert_eq!(cm[0].secret, None);
    }
}
