//! The JSON shapes of events (SPEC "Events": one object per line, fields in SPEC's order),
//! and a batch as JSON lines.
//!
//! Every module event carries the object's `kind` (`ConfigMap` or `Secret`).
//! `added`/`updated` carry the module with its files (`files` for `data`, `binaryFiles` as
//! base64 for `binaryData`, present only when there are any; neither for a Secret on
//! stdout), `removed` carries the last hash, `rejected` the content's hash and why it was
//! rejected (a validator's output, a `flat` name clash), `synced` closes a batch. `list
//! --json` prints the same module object without `type`.

use std::io;

use base64::Engine as _;
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::event::{Change, Synced};
use super::sink::Batch;
use crate::poll::hash::Hash;
use crate::poll::snapshot::split_id;
use crate::poll::spool::Meta;
use crate::source::{ModuleFile, Resource};

/// Text files of a module as a JSON object, in key order.
struct TextFiles<'a>(&'a [ModuleFile]);

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
struct BinaryFiles<'a>(&'a [ModuleFile]);

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
    event: Option<&'a str>,
    module: &'a str,
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    resource_version: &'a str,
    hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<TextFiles<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    binary_files: Option<BinaryFiles<'a>>,
    /// `rejected` events only: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

impl<'a> ModuleOut<'a> {
    fn new(
        event: Option<&'a str>,
        id: &'a str,
        (hash, meta): (&Hash, &'a Meta),
        files: Option<&'a [ModuleFile]>,
    ) -> ModuleOut<'a> {
        let (namespace, name) = split_id(id);
        ModuleOut {
            event,
            module: id,
            kind: meta.kind.kind(),
            namespace,
            name,
            uid: &meta.uid,
            resource_version: &meta.resource_version,
            hash: hash.to_string(),
            files: files.map(TextFiles),
            binary_files: files
                .filter(|f| f.iter().any(|f| f.content.is_binary()))
                .map(BinaryFiles),
            reason: None,
        }
    }
}

/// A module object (`type` is `added`/`updated`, or `None` for `list --json`), no newline:
/// its hash, and the kind, uid and resourceVersion its spool record has. `files` is
/// `None` where contents must not be shown (a Secret's, on stdout).
pub fn module(
    event: Option<&str>,
    id: &str,
    about: (&Hash, &Meta),
    files: Option<&[ModuleFile]>,
) -> Vec<u8> {
    serde_json::to_vec(&ModuleOut::new(event, id, about, files))
        .expect("module JSON: files are UTF-8 text or base64")
}

#[derive(Serialize)]
struct RemovedOut<'a> {
    #[serde(rename = "type")]
    event: &'a str,
    module: &'a str,
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
    hash: String,
}

/// A `removed` event (the last hash), no newline.
pub fn removed(id: &str, hash: &Hash, kind: Resource) -> Vec<u8> {
    let (namespace, name) = split_id(id);
    serde_json::to_vec(&RemovedOut {
        event: "removed",
        module: id,
        kind: kind.kind(),
        namespace,
        name,
        hash: hash.to_string(),
    })
    .expect("plain JSON")
}

/// A `rejected` event (a module's fields without its files, and why), no newline.
pub fn rejected(id: &str, about: (&Hash, &Meta), reason: &str) -> Vec<u8> {
    let out = ModuleOut {
        reason: Some(reason),
        ..ModuleOut::new(Some("rejected"), id, about, None)
    };
    serde_json::to_vec(&out).expect("plain JSON")
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

/// `batch` as JSON lines (events then `synced`), each `\n`-terminated, one module's
/// contents at a time; without `secrets`, a Secret's events carry its hash only (stdout
/// ends up in logs; an agent's stdin does not).
pub fn write(batch: &Batch, out: &mut dyn io::Write, secrets: bool) -> io::Result<()> {
    for e in &batch.events {
        let hash = &e.entry.hash;
        let mut line = match e.change {
            Change::Removed => {
                let meta = batch.spool.meta(e.entry.loc)?;
                removed(e.id, hash, meta.kind)
            }
            Change::Rejected => {
                let meta = batch.spool.meta(e.entry.loc)?;
                let reason = e.reason.as_deref().unwrap_or("");
                // A Secret's validator output may quote it: stdout ends up in logs.
                if secrets || meta.kind.shows_contents() {
                    rejected(e.id, (hash, &meta), reason)
                } else {
                    rejected(e.id, (hash, &meta), &crate::reason::redacted(reason))
                }
            }
            Change::Added | Change::Updated => {
                let event = Some(e.change.as_str());
                let meta = batch.spool.meta(e.entry.loc)?;
                if secrets || meta.kind.shows_contents() {
                    let files = batch.spool.get(e.entry.loc)?;
                    module(event, e.id, (hash, &meta), Some(&files))
                } else {
                    module(event, e.id, (hash, &meta), None)
                }
            }
        };
        line.push(b'\n');
        out.write_all(&line)?;
    }
    let mut line = synced(&batch.synced);
    line.push(b'\n');
    out.write_all(&line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::snapshot::Entry;
    use crate::poll::spool::Loc;
    use crate::source::Content;

    fn entry() -> Entry {
        Entry {
            hash: Hash([0xab; 32]),
            loc: Loc::default(),
            resource_version: "42".into(),
        }
    }

    fn meta() -> Meta {
        Meta {
            kind: Resource::ConfigMaps,
            uid: "u-1".into(),
            resource_version: "42".into(),
            files: 2,
            bytes: 3,
        }
    }

    fn about() -> (&'static Hash, &'static Meta) {
        static H: Hash = Hash([0xab; 32]);
        static M: std::sync::OnceLock<Meta> = std::sync::OnceLock::new();
        (&H, M.get_or_init(meta))
    }

    #[test]
    fn added_matches_spec_field_order() {
        let files = vec![
            ModuleFile {
                key: "logo.png".into(),
                content: Content::Binary(vec![0, 1, 2]),
            },
            ModuleFile {
                key: "scrape.river".into(),
                content: Content::Text("a \"q\"\n".into()),
            },
        ];
        let line = String::from_utf8(module(
            Some("added"),
            "monitoring/test-module",
            about(),
            Some(&files),
        ))
        .unwrap();
        let h = "ab".repeat(32);
        assert_eq!(
            line,
            format!(
                r#"{{"type":"added","module":"monitoring/test-module","kind":"ConfigMap","namespace":"monitoring","name":"test-module","uid":"u-1","resourceVersion":"42","hash":"sha256:{h}","files":{{"scrape.river":"a \"q\"\n"}},"binaryFiles":{{"logo.png":"AAEC"}}}}"#
            )
        );
        let text_only = &files[1..];
        let line = String::from_utf8(module(None, "a/b", about(), Some(text_only))).unwrap();
        assert!(
            line.starts_with(r#"{"module":"a/b","kind":"ConfigMap""#),
            "{line}"
        );
        assert!(!line.contains("binaryFiles"), "only when present: {line}");
        let hidden = String::from_utf8(module(Some("added"), "a/b", about(), None)).unwrap();
        assert_eq!(
            hidden,
            format!(
                r#"{{"type":"added","module":"a/b","kind":"ConfigMap","namespace":"a","name":"b","uid":"u-1","resourceVersion":"42","hash":"sha256:{h}"}}"#
            ),
            "a Secret's event: the hash, no contents"
        );
    }

    #[test]
    fn rejected_matches_spec_field_order() {
        let h = "ab".repeat(32);
        assert_eq!(
            String::from_utf8(rejected("a/b", about(), "key \"x\" is taken")).unwrap(),
            format!(
                r#"{{"type":"rejected","module":"a/b","kind":"ConfigMap","namespace":"a","name":"b","uid":"u-1","resourceVersion":"42","hash":"sha256:{h}","reason":"key \"x\" is taken"}}"#
            )
        );
    }

    #[test]
    fn removed_and_synced() {
        let h = "ab".repeat(32);
        assert_eq!(
            String::from_utf8(removed("a/b", &entry().hash, Resource::Secrets)).unwrap(),
            format!(
                r#"{{"type":"removed","module":"a/b","kind":"Secret","namespace":"a","name":"b","hash":"sha256:{h}"}}"#
            )
        );
        let s = Synced {
            modules: 12,
            added: 1,
            updated: 0,
            removed: 0,
            rejected: 2,
            poll: 7,
        };
        assert_eq!(
            String::from_utf8(synced(&s)).unwrap(),
            r#"{"type":"synced","modules":12,"added":1,"updated":0,"removed":0,"rejected":2,"poll":7}"#
        );
    }
}
