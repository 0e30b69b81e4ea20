//! Events: what changed between two snapshots (`diff`), and their JSON shapes (SPEC
//! "Events": one object per line, fields in SPEC's order).
//!
//! `diff` orders a batch as SPEC does: removals first, then additions and updates together,
//! each in module-name order. Only the hash decides: a label edit, or a delete and
//! re-create with the same content, changes nothing.
//!
//! Every module event carries the object's `kind` (`ConfigMap` or `Secret`).
//! `added`/`updated` carry the module with its files (`files` for `data`, `binaryFiles` as
//! base64 for `binaryData`, present only when there are any; neither for a Secret on
//! stdout), `removed` carries the last hash, `rejected` the content's hash and why it was
//! held back (a validator's output, a `flat` name clash), `synced` closes a batch. `list
//! --json` prints the same module object without `type`.

use std::borrow::Cow;

use base64::Engine as _;
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::hash::Hash;
use super::snapshot::{Entry, Snapshot, split_id};
use super::spool::Meta;
use crate::source::ModuleFile;
use crate::source::Resource;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Added,
    Updated,
    Removed,
    /// Not published: the sinks keep the previous version (`Event::reason` says why).
    Rejected,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Updated => "updated",
            Change::Removed => "removed",
            Change::Rejected => "rejected",
        }
    }
}

/// One change: for `Removed` the entry is the last one seen, otherwise the new one (for
/// `Rejected`, the one held back). It borrows the module's id and entry from the snapshot
/// they are in: a first batch has an event per module of the cluster, which would
/// otherwise hold a second copy of the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event<'a> {
    pub change: Change,
    pub id: &'a str,
    pub entry: &'a Entry,
    /// Why a `Rejected` module was held back.
    pub reason: Option<Box<str>>,
}

impl<'a> Event<'a> {
    pub fn new(change: Change, id: &'a str, entry: &'a Entry) -> Event<'a> {
        Event {
            change,
            id,
            entry,
            reason: None,
        }
    }

    /// This (added or updated) module, rejected for `reason` (cut to `MAX_REASON`).
    pub fn reject(&mut self, reason: String) {
        self.change = Change::Rejected;
        self.reason = Some(match cut(&reason, MAX_REASON) {
            Cow::Borrowed(_) => reason.into(),
            Cow::Owned(cut) => cut.into(),
        });
    }

    /// Whether a sink that delivers contents acts on it (`rejected` is news, not a change).
    pub fn is_change(&self) -> bool {
        self.change != Change::Rejected
    }
}

/// The most bytes of a `rejected` event's reason (SPEC: "at most 4 KiB in all").
pub const MAX_REASON: usize = 4096;

/// The cut that marks where text was left out.
const ELLIPSIS: &str = "…";

/// `text` in at most `max` bytes: as it is when it fits, else cut on a character boundary
/// and ended with `…` (the mark counted in `max`).
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mark = if max >= ELLIPSIS.len() { ELLIPSIS } else { "" };
    let mut end = max - mark.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{mark}", &text[..end]))
}

/// The events that turn `prev` into `next`.
pub fn diff<'a>(prev: &'a Snapshot, next: &'a Snapshot) -> Vec<Event<'a>> {
    // A first batch holds every module: allocated once at its size, not grown by doubling
    // (up to twice that). Later batches are small and pay nothing for counting.
    let mut events: Vec<Event<'a>> = if prev.is_empty() {
        Vec::with_capacity(next.len())
    } else {
        Vec::new()
    };
    events.extend(
        prev.modules
            .iter()
            .filter(|(id, _)| !next.modules.contains_key(id))
            .map(|(id, e)| Event::new(Change::Removed, id, e)),
    );
    for (id, e) in next.modules.iter() {
        let change = match prev.modules.get(id) {
            None => Change::Added,
            Some(old) if old.hash != e.hash => Change::Updated,
            Some(_) => continue,
        };
        events.push(Event::new(change, id, e));
    }
    events
}

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

/// The counts that close a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Synced {
    pub modules: usize,
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
    pub rejected: usize,
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
    use crate::poll::spool::Loc;
    use crate::source::Content;

    #[test]
    fn cut_keeps_what_fits_and_cuts_on_a_character_boundary() {
        for (text, max, want) in [
            ("short", 10, "short"),
            ("exactly", 7, "exactly"),
            ("abcdefgh", 7, "abcd…"),
            ("aééé", 6, "aé…"),
            ("aéééé", 8, "aéé…"),
            ("aéééé", 7, "aé…"),
            ("éé", 2, "é"),
            ("éé", 1, ""),
        ] {
            let got = cut(text, max);
            assert_eq!(got, want, "{text:?} in {max}");
            assert!(got.len() <= max);
        }
    }

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

    /// An entry whose contents are at a place named after `uid` (the uid itself is in the
    /// spool record, which these tests do not need).
    fn entry_of(hash: u8, uid: &str) -> Entry {
        Entry {
            hash: Hash([hash; 32]),
            loc: Loc {
                off: uid.len() as u64,
                len: 0,
            },
            resource_version: "1".into(),
        }
    }

    fn snap(mods: &[(&str, u8, &str)]) -> Snapshot {
        Snapshot {
            modules: mods
                .iter()
                .map(|(id, h, uid)| (id.to_string(), entry_of(*h, uid)))
                .collect(),
        }
    }

    fn changes<'a>(events: &[Event<'a>]) -> Vec<(Change, &'a str)> {
        events.iter().map(|e| (e.change, e.id)).collect()
    }

    #[test]
    fn removals_first_then_additions_and_updates_in_module_order() {
        let prev = snap(&[
            ("a/x", 1, "u"),
            ("b/y", 1, "u"),
            ("c/z", 1, "u"),
            ("d/w", 1, "u"),
        ]);
        let next = snap(&[
            ("a/a", 1, "u"),
            ("b/y", 2, "u"),
            ("d/w", 1, "u"),
            ("e/v", 1, "u"),
        ]);
        assert_eq!(
            changes(&diff(&prev, &next)),
            [
                (Change::Removed, "a/x"),
                (Change::Removed, "c/z"),
                (Change::Added, "a/a"),
                (Change::Updated, "b/y"),
                (Change::Added, "e/v"),
            ]
        );
        let removed = &diff(&prev, &next)[0];
        assert_eq!(
            removed.entry.hash,
            Hash([1; 32]),
            "a removal carries the last hash"
        );
    }

    #[test]
    fn only_content_counts() {
        let prev = snap(&[("a/x", 1, "uid-1")]);
        let relabelled = Snapshot {
            modules: [(
                "a/x".to_string(),
                Entry {
                    resource_version: "9".into(),
                    ..entry_of(1, "uid-1")
                },
            )]
            .into_iter()
            .collect(),
        };
        assert!(diff(&prev, &relabelled).is_empty(), "metadata-only edit");
        let recreated = snap(&[("a/x", 1, "uid-2")]);
        assert!(
            diff(&prev, &recreated).is_empty(),
            "deleted and re-created, same content"
        );
        assert!(diff(&Snapshot::default(), &Snapshot::default()).is_empty());
    }

    #[test]
    fn module_order_is_byte_order() {
        let next = snap(&[("a-b/x", 1, "u"), ("a/x", 1, "u"), ("B/x", 1, "u")]);
        assert_eq!(
            changes(&diff(&Snapshot::default(), &next)),
            [
                (Change::Added, "B/x"),
                (Change::Added, "a-b/x"),
                (Change::Added, "a/x")
            ]
        );
        assert_eq!(split_id("ns/name"), ("ns", "name"));
    }
}
