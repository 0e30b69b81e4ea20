//! The JSON shapes of SPEC "Events": one object per line, fields in SPEC's order.
//!
//! `added`/`updated` carry the module with its files (`files` for `data`, `binaryFiles` as
//! base64 for `binaryData`, present only when there are any), `removed` carries the last
//! hash, `synced` closes a batch. `list --json` prints the same module object without
//! `type`.

use base64::Engine as _;
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use crate::module::File;
use crate::snapshot::{Entry, split_id};

/// Text files of a module as a JSON object, in key order.
struct TextFiles<'a>(&'a [File]);

impl Serialize for TextFiles<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for f in self.0.iter().filter(|f| !f.content.is_binary()) {
            let text = std::str::from_utf8(f.content.bytes()).map_err(serde::ser::Error::custom)?;
            map.serialize_entry(&f.key, text)?;
        }
        map.end()
    }
}

/// Binary files of a module as a JSON object of base64 strings, in key order.
struct BinaryFiles<'a>(&'a [File]);

impl Serialize for BinaryFiles<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for f in self.0.iter().filter(|f| f.content.is_binary()) {
            let b64 = base64::engine::general_purpose::STANDARD.encode(f.content.bytes());
            map.serialize_entry(&f.key, &b64)?;
        }
        map.end()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ModuleOut<'a> {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'a str>,
    module: &'a str,
    namespace: &'a str,
    name: &'a str,
    uid: String,
    resource_version: String,
    hash: String,
    files: TextFiles<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    binary_files: Option<BinaryFiles<'a>>,
}

/// A module object (`type` is `added`/`updated`, or `None` for `list --json`), no newline.
pub fn module(kind: Option<&str>, id: &str, entry: &Entry, files: &[File]) -> Vec<u8> {
    let (namespace, name) = split_id(id);
    let out = ModuleOut {
        kind,
        module: id,
        namespace,
        name,
        uid: entry.uid.to_string(),
        resource_version: entry.resource_version.to_string(),
        hash: entry.hash.to_string(),
        files: TextFiles(files),
        binary_files: files
            .iter()
            .any(|f| f.content.is_binary())
            .then_some(BinaryFiles(files)),
    };
    serde_json::to_vec(&out).expect("module JSON: files are UTF-8 text or base64")
}

#[derive(Serialize)]
struct RemovedOut<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    module: &'a str,
    namespace: &'a str,
    name: &'a str,
    hash: String,
}

/// A `removed` event, no newline.
pub fn removed(id: &str, entry: &Entry) -> Vec<u8> {
    let (namespace, name) = split_id(id);
    serde_json::to_vec(&RemovedOut {
        kind: "removed",
        module: id,
        namespace,
        name,
        hash: entry.hash.to_string(),
    })
    .expect("plain JSON")
}

/// The counts that close a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Synced {
    pub modules: usize,
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
    pub poll: u64,
}

/// A `synced` event, no newline.
pub fn synced(s: &Synced) -> Vec<u8> {
    #[derive(Serialize)]
    struct Out<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        #[serde(flatten)]
        counts: &'a Synced,
    }
    serde_json::to_vec(&Out {
        kind: "synced",
        counts: s,
    })
    .expect("plain JSON")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::Hash;
    use crate::module::Content;
    use crate::spool::Loc;

    fn entry() -> Entry {
        Entry {
            uid: "u-1".into(),
            resource_version: "42".into(),
            hash: Hash([0xab; 32]),
            loc: Loc::default(),
            files: 2,
            bytes: 3,
        }
    }

    #[test]
    fn added_matches_spec_field_order() {
        let files = vec![
            File {
                key: "logo.png".into(),
                content: Content::Binary(vec![0, 1, 2]),
            },
            File {
                key: "scrape.river".into(),
                content: Content::Text("a \"q\"\n".into()),
            },
        ];
        let line = String::from_utf8(module(
            Some("added"),
            "monitoring/test-module",
            &entry(),
            &files,
        ))
        .unwrap();
        let h = "ab".repeat(32);
        assert_eq!(
            line,
            format!(
                r#"{{"type":"added","module":"monitoring/test-module","namespace":"monitoring","name":"test-module","uid":"u-1","resourceVersion":"42","hash":"sha256:{h}","files":{{"scrape.river":"a \"q\"\n"}},"binaryFiles":{{"logo.png":"AAEC"}}}}"#
            )
        );
        let text_only = &files[1..];
        let line = String::from_utf8(module(None, "a/b", &entry(), text_only)).unwrap();
        assert!(line.starts_with(r#"{"module":"a/b""#), "{line}");
        assert!(!line.contains("binaryFiles"), "only when present: {line}");
    }

    #[test]
    fn removed_and_synced() {
        let h = "ab".repeat(32);
        assert_eq!(
            String::from_utf8(removed("a/b", &entry())).unwrap(),
            format!(
                r#"{{"type":"removed","module":"a/b","namespace":"a","name":"b","hash":"sha256:{h}"}}"#
            )
        );
        let s = Synced {
            modules: 12,
            added: 1,
            updated: 0,
            removed: 0,
            poll: 7,
        };
        assert_eq!(
            String::from_utf8(synced(&s)).unwrap(),
            r#"{"type":"synced","modules":12,"added":1,"updated":0,"removed":0,"poll":7}"#
        );
    }
}
