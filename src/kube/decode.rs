//! Streaming decode of a `ConfigMapList` (or `PartialObjectMetadataList`) body.
//!
//! The body is split into items as it is read and each item is parsed from its own slice
//! and handed on as soon as it is complete, so a list of any size is held one item at a
//! time. An item whose contents the caller already has (same resourceVersion) is not read
//! past its metadata.
//! Only what cmpoll uses is kept: name, namespace, uid, resourceVersion, labels, and the
//! contents of the keys `--keys` selects (other values are skipped without being stored;
//! `managedFields` and annotations are never stored). `binaryData` is base64-decoded here;
//! a bad value is recorded as a problem of that item, not of the whole list.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;

use base64::Engine as _;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::Error;
use super::client::ReadFailure;
use crate::module::{Content, File, Item, KeyFilter};

/// What a list says about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListMeta {
    pub kind: String,
    pub resource_version: Option<String>,
    pub continue_token: Option<String>,
    pub remaining_item_count: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawListMeta {
    resource_version: Option<String>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    remaining_item_count: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawObjectMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum ItemField {
    Kind,
    Metadata,
    Data,
    BinaryData,
    #[serde(other)]
    Other,
}

/// Receives a list's items as they are decoded.
pub trait Items {
    /// Whether the contents of this ConfigMap at this resourceVersion are needed. `false`:
    /// its `data` and `binaryData` are skipped unread and the item arrives `partial`, as a
    /// metadata-only item would. Asked once per item, after its `metadata`.
    fn wants_contents(&mut self, _namespace: &str, _name: &str, _resource_version: &str) -> bool {
        true
    }
    /// Takes one item; an error stops the decoding and is returned.
    fn item(&mut self, item: Item) -> Result<(), Error>;
}

impl<F: FnMut(Item) -> Result<(), Error>> Items for F {
    fn item(&mut self, item: Item) -> Result<(), Error> {
        self(item)
    }
}

/// Decodes a list body from `reader`, handing each item to `items` in order.
///
/// The body is split, not parsed, as it arrives: a byte scanner finds where each element of
/// `items` begins and ends (strings and nesting only), and that slice alone is parsed, then
/// dropped. Everything around `items` (kind, metadata) is parsed at the end from what is
/// left. So the buffer holds one item plus one read, and parsing runs over slices, which is
/// several times faster than parsing through a reader.
pub fn decode_list<R: Read>(
    reader: R,
    keys: &KeyFilter,
    action: &str,
    items: &mut dyn Items,
) -> Result<ListMeta, ReadFailure> {
    let bad = |cause: String| {
        ReadFailure::Fail(Error::Decode {
            action: action.to_string(),
            cause: format!("not a valid list: {cause}"),
        })
    };
    let mut s = Scanner {
        reader,
        buf: Vec::with_capacity(CHUNK),
        pos: 0,
        eof: false,
    };
    // The list without its items' elements: `"items":[]`.
    let mut rest = Vec::with_capacity(512);
    let mut count = 0usize;
    // Whether an `items` array was there at all: a list without one is not an empty list.
    let mut items_seen = false;
    s.expect(b'{', "expected '{'")
        .map_err(|e| e.into_failure(&bad))?;
    rest.push(b'{');
    let mut first = true;
    loop {
        let next = s.peek().map_err(|e| e.into_failure(&bad))?;
        if first && next == Some(b'}') {
            s.pos += 1;
            break;
        }
        first = false;
        if next != Some(b'"') {
            return Err(bad("expected a field name".into()));
        }
        let name = s.value().map_err(|e| e.into_failure(&bad))?;
        let name_bytes = s.buf[name].to_vec();
        let field: String = serde_json::from_slice(&name_bytes).map_err(|e| bad(e.to_string()))?;
        s.expect(b':', "expected ':'")
            .map_err(|e| e.into_failure(&bad))?;
        rest.extend_from_slice(&name_bytes);
        rest.push(b':');
        if field == "items" && s.peek().map_err(|e| e.into_failure(&bad))? == Some(b'[') {
            items_seen = true;
            s.pos += 1;
            rest.extend_from_slice(b"[]");
            let mut more = s.peek().map_err(|e| e.into_failure(&bad))? != Some(b']');
            if !more {
                s.pos += 1;
            }
            while more {
                s.compact();
                let range = s.value().map_err(|e| e.into_failure(&bad))?;
                let mut de = serde_json::Deserializer::from_slice(&s.buf[range]);
                let seed = ItemSeed {
                    keys,
                    items: Some(&mut *items),
                };
                let item = seed
                    .deserialize(&mut de)
                    .and_then(|item| de.end().map(|_| item))
                    .map_err(|e| bad(format!("item {count}: {e}")))?;
                count += 1;
                items.item(item).map_err(ReadFailure::Fail)?;
                match s.peek().map_err(|e| e.into_failure(&bad))? {
                    Some(b',') => s.pos += 1,
                    Some(b']') => {
                        s.pos += 1;
                        more = false;
                    }
                    _ => return Err(bad(format!("expected ',' or ']' after item {count}"))),
                }
            }
        } else {
            let value = s.value().map_err(|e| e.into_failure(&bad))?;
            rest.extend_from_slice(&s.buf[value]);
        }
        match s.peek().map_err(|e| e.into_failure(&bad))? {
            Some(b',') => {
                s.pos += 1;
                rest.push(b',');
            }
            Some(b'}') => {
                s.pos += 1;
                break;
            }
            _ => return Err(bad("expected ',' or '}' after a field".into())),
        }
    }
    rest.push(b'}');
    if s.peek().map_err(|e| e.into_failure(&bad))?.is_some() {
        return Err(bad("trailing characters after the list".into()));
    }
    let list: RawList = serde_json::from_slice(&rest).map_err(|e| bad(e.to_string()))?;
    if !items_seen {
        // An apiserver always sends `"items":[]` for an empty list; without it, this answer
        // says nothing about what exists, and taking it for "nothing" would remove every
        // module.
        return Err(bad(
            "it has no \"items\" array (an empty list has \"items\":[])".into(),
        ));
    }
    let m = list.metadata.unwrap_or_default();
    Ok(ListMeta {
        kind: list.kind.unwrap_or_default(),
        resource_version: m.resource_version,
        continue_token: m.continue_token.filter(|c| !c.is_empty()),
        remaining_item_count: m.remaining_item_count,
    })
}

/// How much is read at a time.
const CHUNK: usize = 64 * 1024;

/// A growing window on the body: `buf[pos..]` is not yet consumed.
struct Scanner<R> {
    reader: R,
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
}

enum ScanError {
    Io(std::io::Error),
    Bad(String),
}

impl ScanError {
    fn into_failure(self, bad: &impl Fn(String) -> ReadFailure) -> ReadFailure {
        match self {
            ScanError::Io(e) => ReadFailure::Io(e),
            ScanError::Bad(m) => bad(m),
        }
    }
}

impl<R: Read> Scanner<R> {
    /// Reads until `buf[at]` exists; `false` if the body ends first.
    #[inline]
    fn have(&mut self, at: usize) -> Result<bool, ScanError> {
        if at < self.buf.len() {
            return Ok(true);
        }
        self.fill_to(at)
    }

    #[cold]
    fn fill_to(&mut self, at: usize) -> Result<bool, ScanError> {
        while at >= self.buf.len() {
            if self.eof {
                return Ok(false);
            }
            let len = self.buf.len();
            self.buf.resize(len + CHUNK, 0);
            let got = self.reader.read(&mut self.buf[len..]);
            self.buf.truncate(len + *got.as_ref().unwrap_or(&0));
            match got {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ScanError::Io(e)),
            }
        }
        Ok(true)
    }

    /// Drops what was consumed, when that is at least half the buffer (so each byte is
    /// moved at most about once).
    fn compact(&mut self) {
        if self.pos >= CHUNK && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    /// Skips whitespace; the next byte, not consumed, or `None` at the end.
    fn peek(&mut self) -> Result<Option<u8>, ScanError> {
        loop {
            if !self.have(self.pos)? {
                return Ok(None);
            }
            match self.buf[self.pos] {
                b' ' | b'\t' | b'\n' | b'\r' => self.pos += 1,
                b => return Ok(Some(b)),
            }
        }
    }

    fn expect(&mut self, want: u8, why: &str) -> Result<(), ScanError> {
        if self.peek()? != Some(want) {
            return Err(ScanError::Bad(why.to_string()));
        }
        self.pos += 1;
        Ok(())
    }

    /// The extent of the next value, which is consumed. Only strings and nesting are
    /// followed; whether the value is valid JSON is for the parser of that slice to say.
    fn value(&mut self) -> Result<std::ops::Range<usize>, ScanError> {
        let eof = || ScanError::Bad("the body ends inside a value".into());
        let Some(first) = self.peek()? else {
            return Err(eof());
        };
        let start = self.pos;
        let mut i = start;
        match first {
            b'"' => i = self.string_end(i + 1)?,
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    if !self.have(i)? {
                        return Err(eof());
                    }
                    match self.buf[i] {
                        b'"' => {
                            i = self.string_end(i + 1)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            _ => {
                while self.have(i)?
                    && !matches!(
                        self.buf[i],
                        b',' | b']' | b'}' | b':' | b' ' | b'\t' | b'\n' | b'\r'
                    )
                {
                    i += 1;
                }
            }
        }
        self.pos = i;
        Ok(start..i)
    }

    /// From just after an opening quote to just after the closing one.
    fn string_end(&mut self, mut i: usize) -> Result<usize, ScanError> {
        loop {
            if !self.have(i)? {
                return Err(ScanError::Bad("the body ends inside a string".into()));
            }
            match memchr::memchr2(b'"', b'\\', &self.buf[i..]) {
                Some(k) if self.buf[i + k] == b'"' => return Ok(i + k + 1),
                Some(k) => i += k + 2,
                None => i = self.buf.len(),
            }
        }
    }
}

/// Decodes one object (a single GET): its `kind` and the item.
pub fn decode_object<R: Read>(
    reader: R,
    keys: &KeyFilter,
    action: &str,
) -> Result<(String, Item), ReadFailure> {
    #[derive(Deserialize)]
    struct Kind {
        kind: Option<String>,
    }
    let mut bytes = Vec::new();
    std::io::BufReader::new(reader)
        .read_to_end(&mut bytes)
        .map_err(ReadFailure::Io)?;
    let bad = |e: serde_json::Error| {
        ReadFailure::Fail(Error::Decode {
            action: action.to_string(),
            cause: format!("not a valid object: {e}"),
        })
    };
    let kind: Kind = serde_json::from_slice(&bytes).map_err(bad)?;
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    let item = ItemSeed { keys, items: None }
        .deserialize(&mut de)
        .map_err(bad)?;
    Ok((kind.kind.unwrap_or_default(), item))
}

/// What is kept of the list itself.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawList {
    kind: Option<String>,
    metadata: Option<RawListMeta>,
    /// Always `[]` or `null` here (the elements were taken out); anything else is an error.
    #[allow(dead_code)]
    items: Option<Vec<IgnoredAny>>,
}

struct ItemSeed<'a> {
    keys: &'a KeyFilter,
    /// Asked whether contents are needed (lists); `None`: always read them.
    items: Option<&'a mut dyn Items>,
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = Item;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Item, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = Item;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a ConfigMap object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Item, A::Error> {
        let mut item = Item::default();
        // Whether `data`/`binaryData` are read: decided once, after `metadata`.
        let mut read_contents: Option<bool> = None;
        while let Some(field) = map.next_key::<ItemField>()? {
            if matches!(field, ItemField::Data | ItemField::BinaryData) {
                let wanted = *read_contents.get_or_insert_with(|| match self.items.as_mut() {
                    Some(items) if !item.name.is_empty() && !item.resource_version.is_empty() => {
                        items.wants_contents(&item.namespace, &item.name, &item.resource_version)
                    }
                    _ => true,
                });
                if !wanted {
                    item.partial = true;
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            }
            match field {
                ItemField::Kind => {
                    let kind: Option<String> = map.next_value()?;
                    item.partial |= kind.as_deref() == Some("PartialObjectMetadata");
                }
                ItemField::Metadata => {
                    let m: Option<RawObjectMeta> = map.next_value()?;
                    let m = m.unwrap_or_default();
                    item.name = m.name.unwrap_or_default();
                    item.namespace = m.namespace.unwrap_or_default();
                    item.uid = m.uid.unwrap_or_default();
                    item.resource_version = m.resource_version.unwrap_or_default();
                    item.labels = m.labels.unwrap_or_default().into_iter().collect();
                }
                ItemField::Data => map.next_value_seed(DataSeed {
                    keys: self.keys,
                    binary: false,
                    item: &mut item,
                })?,
                ItemField::BinaryData => map.next_value_seed(DataSeed {
                    keys: self.keys,
                    binary: true,
                    item: &mut item,
                })?,
                ItemField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(item)
    }
}

/// `data` or `binaryData`: selected keys are kept, the rest skipped unstored.
struct DataSeed<'a> {
    keys: &'a KeyFilter,
    binary: bool,
    item: &'a mut Item,
}

impl<'de> DeserializeSeed<'de> for DataSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DataSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(KeySeed { keys: self.keys })? {
            self.item.keys_seen += 1;
            let Some(key) = key else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let value: String = map.next_value()?;
            let content = if self.binary {
                match base64::engine::general_purpose::STANDARD.decode(value.as_bytes()) {
                    Ok(bytes) => Content::Binary(bytes),
                    Err(e) => {
                        self.item
                            .problems
                            .push(format!("binaryData[{key}] is not base64: {e}"));
                        continue;
                    }
                }
            } else {
                Content::Text(value)
            };
            self.item.files.push(File { key, content });
        }
        Ok(())
    }
}

/// A data key: `Some(key)` when `--keys` selects it, `None` (unstored) otherwise.
struct KeySeed<'a> {
    keys: &'a KeyFilter,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<String>, E> {
        Ok(self.keys.matches(v).then(|| v.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::fixture;

    fn decode(body: &[u8], keys: &KeyFilter) -> Result<(ListMeta, Vec<Item>), String> {
        let mut items = Vec::new();
        decode_list(body, keys, "list", &mut |i| {
            items.push(i);
            Ok(())
        })
        .map(|m| (m, items))
        .map_err(|e| match e {
            ReadFailure::Fail(e) => e.to_string(),
            ReadFailure::Io(e) => format!("io: {e}"),
        })
    }

    #[test]
    fn decodes_the_fixture_list() {
        let (meta, items) = decode(&fixture("configmaplist.json"), &KeyFilter::all()).unwrap();
        assert_eq!(meta.kind, "ConfigMapList");
        assert_eq!(meta.resource_version.as_deref(), Some("184467302"));
        assert_eq!(items.len(), 2);
        let a = &items[0];
        assert_eq!(a.id(), "team-a/payments-config");
        assert_eq!(a.uid, "6f1c2d3e-8a9b-4c5d-9e0f-1a2b3c4d5e6f");
        assert_eq!(a.resource_version, "184467120");
        assert_eq!(a.label("config.example.com/watch"), Some("true"));
        assert_eq!(a.files.len(), 2);
        let b = &items[1];
        let bin = b.files.iter().find(|f| f.key == "bundle.bin").unwrap();
        assert_eq!(bin.content, Content::Binary(vec![0, 1, 2, 253, 254, 255]));
    }

    #[test]
    fn pages_and_metadata_lists() {
        let (meta, items) = decode(
            &fixture("configmaplist-page1-limit1.json"),
            &KeyFilter::all(),
        )
        .unwrap();
        assert!(meta.continue_token.is_some());
        assert_eq!(meta.remaining_item_count, Some(1));
        assert_eq!(items.len(), 1);
        let (meta, items) = decode(
            &fixture("partialobjectmetadatalist.json"),
            &KeyFilter::all(),
        )
        .unwrap();
        assert_eq!(meta.kind, "PartialObjectMetadataList");
        assert_eq!(items[1].resource_version, "184467290");
        assert!(items[1].files.is_empty());
        let (_, items) = decode(&fixture("configmaplist-empty.json"), &KeyFilter::all()).unwrap();
        assert!(items.is_empty());
    }

    #[test]
    fn unselected_keys_are_skipped_but_counted() {
        let keys = KeyFilter::new(&["*.properties".into()]).unwrap();
        let (_, items) = decode(&fixture("configmaplist.json"), &keys).unwrap();
        assert_eq!(items[0].files.len(), 1);
        assert_eq!(items[0].files[0].key, "application.properties");
        assert_eq!(items[0].keys_seen, 2);
        assert!(items[1].files.is_empty());
    }

    #[test]
    fn odd_but_valid_shapes() {
        let body = br#"{"items":[{"data":null,"metadata":{"name":"a","namespace":"n","labels":null},"binaryData":{"b":"!!"}}],"metadata":{"resourceVersion":"7","continue":""},"kind":"ConfigMapList","extra":[1,{"x":2}]}"#;
        let (meta, items) = decode(body, &KeyFilter::all()).unwrap();
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        assert_eq!(meta.continue_token, None, "an empty token is no token");
        assert_eq!(
            items[0].problems.len(),
            1,
            "bad base64 is the item's problem"
        );
        let body = "{\"items\":[{\"metadata\":{\"name\":\"a\"},\"data\":{\"k\":\"\\u003chtml\\u003e \\u0026\"}}]}";
        let (_, items) = decode(body.as_bytes(), &KeyFilter::all()).unwrap();
        assert_eq!(items[0].files[0].content, Content::Text("<html> &".into()));
    }

    #[test]
    fn broken_bodies_are_decode_errors() {
        for body in [
            &b"<html>502</html>"[..],
            br#"{"items":[{"metadata":{"name":"a"}}"#,
            br#"{"items":[{"data":{"k":1}}]}"#,
            br#"{"items":{}}"#,
            br#"{} trailing"#,
            br#"{"items":[{"metadata":{"name":"a"}},]}"#,
            br#"{"items":[{"metadata":{"name":"a"}} {"metadata":{"name":"b"}}]}"#,
            br#"{"items":[{"metadata":{"name":"a"}}] "kind":"x"}"#,
            br#"{"items":[{"metadata":{"name":"a"}}x]}"#,
            br#"{"items":[{"metadata":{"name":"a\"}}]}"#,
            br#"{"kind":"ConfigMapList","items":[],}"#,
            br#"{"kind" "x"}"#,
            br#"{kind:1}"#,
            br#"{"items":[1 2]}"#,
            b"",
            b"   ",
            // r13: no items is not an empty list.
            br#"{"kind":"ConfigMapList","items":null}"#,
            br#"{"kind":"ConfigMapList","metadata":{"resourceVersion":"5"}}"#,
            br#"{}"#,
        ] {
            let e = decode(body, &KeyFilter::all()).unwrap_err();
            assert!(
                e.starts_with("cannot list: unexpected answer: not a valid list"),
                "{e}"
            );
        }
    }

    #[test]
    fn metadata_items_are_marked_partial_and_single_objects_decode() {
        let (_, items) = decode(
            &fixture("partialobjectmetadatalist.json"),
            &KeyFilter::all(),
        )
        .unwrap();
        assert!(items.iter().all(|i| i.partial));
        let (_, items) = decode(&fixture("configmaplist.json"), &KeyFilter::all()).unwrap();
        assert!(items.iter().all(|i| !i.partial));
        let obj = fixture("upstream/core.v1.ConfigMap.json");
        let (kind, item) = decode_object(&obj[..], &KeyFilter::all(), "get").unwrap();
        assert_eq!(kind, "ConfigMap");
        assert!(!item.partial);
        let body = br#"{"kind":"Status","code":404}"#;
        assert_eq!(
            decode_object(&body[..], &KeyFilter::all(), "get")
                .unwrap()
                .0,
            "Status"
        );
    }

    /// Hands out the body a few bytes at a time, so every boundary falls somewhere odd.
    struct Dribble<'a>(&'a [u8], usize);

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn any_read_boundaries_give_the_same_items() {
        let tricky = br#" { "kind" : "ConfigMapList", "items" : [ {"metadata":{"name":"a\"]}","namespace":"n","resourceVersion":"1"},"data":{"k\\":"v \"[{\\","items":"]"}} , {"metadata":{"name":"b","namespace":"n"},"data":{}} ] , "metadata" : {"resourceVersion":"9"} } "#;
        for body in [&tricky[..], &fixture("configmaplist.json")[..]] {
            let (want_meta, want) = decode(body, &KeyFilter::all()).unwrap();
            for step in [1, 2, 3, 7, 64] {
                let mut got = Vec::new();
                let meta = decode_list(Dribble(body, step), &KeyFilter::all(), "list", &mut |i| {
                    got.push(i);
                    Ok(())
                })
                .unwrap_or_else(|_| panic!("step {step}"));
                assert_eq!(meta, want_meta, "step {step}");
                assert_eq!(got, want, "step {step}");
            }
        }
        let (meta, items) = decode(tricky, &KeyFilter::all()).unwrap();
        assert_eq!(meta.resource_version.as_deref(), Some("9"));
        assert_eq!(items[0].name, "a\"]}");
        assert_eq!(items[0].files[0].key, "k\\");
        assert_eq!(items[0].files[0].content, Content::Text("v \"[{\\".into()));
        assert_eq!(items[0].files[1].content, Content::Text("]".into()));
        assert_eq!(items[1].name, "b");
    }

    #[test]
    fn a_large_list_is_held_one_item_at_a_time() {
        let value = "x".repeat(4096);
        let mut body = String::from(r#"{"kind":"ConfigMapList","items":["#);
        let mut ends = Vec::new();
        for i in 0..2000 {
            if i > 0 {
                body.push(',');
            }
            body += &format!(
                r#"{{"metadata":{{"name":"m{i}","namespace":"n","resourceVersion":"{i}"}},"data":{{"k":"{value}"}}}}"#
            );
            ends.push(body.len());
        }
        body += "]}";
        /// Counts what it has handed out.
        struct Counted<'a>(&'a [u8], &'a std::cell::Cell<usize>);
        impl Read for Counted<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                self.1.set(self.1.get() + n);
                Ok(n)
            }
        }
        let read = std::cell::Cell::new(0);
        let mut n = 0;
        decode_list(
            Counted(body.as_bytes(), &read),
            &KeyFilter::all(),
            "list",
            &mut |_| {
                // Read so far is up to the end of this item plus at most one read ahead.
                assert!(
                    read.get() <= ends[n] + CHUNK,
                    "item {n}: read {}",
                    read.get()
                );
                n += 1;
                Ok(())
            },
        )
        .map_err(|_| "decode")
        .unwrap();
        assert_eq!(n, 2000);
        // And what was consumed is let go: the buffer stays a few chunks long.
        let mut s = Scanner {
            reader: &body.as_bytes()[body.find('[').unwrap() + 1..],
            buf: Vec::new(),
            pos: 0,
            eof: false,
        };
        let mut widest = 0;
        for _ in 0..2000 {
            s.compact();
            s.value().map_err(|_| "scan").unwrap();
            widest = widest.max(s.buf.capacity());
            s.peek().map_err(|_| "scan").unwrap();
            s.pos += 1;
        }
        assert!(widest <= 4 * CHUNK, "buffer grew to {widest}");
    }

    /// Skips the contents of every item at resourceVersion "1".
    struct Knows(Vec<Item>);

    impl Items for Knows {
        fn wants_contents(&mut self, _: &str, _: &str, rv: &str) -> bool {
            rv != "1"
        }
        fn item(&mut self, item: Item) -> Result<(), Error> {
            self.0.push(item);
            Ok(())
        }
    }

    #[test]
    fn known_contents_are_skipped_unread() {
        // The skipped item's data is not even valid for a ConfigMap: it is never looked at.
        let body = br#"{"kind":"ConfigMapList","items":[
            {"metadata":{"name":"a","namespace":"n","resourceVersion":"1"},"data":{"k":1},"binaryData":{"b":"!!"}},
            {"metadata":{"name":"b","namespace":"n","resourceVersion":"2"},"data":{"k":"v"}},
            {"data":{"k":"v"},"metadata":{"name":"c","namespace":"n","resourceVersion":"1"}}]}"#;
        let mut known = Knows(Vec::new());
        decode_list(&body[..], &KeyFilter::all(), "list", &mut known)
            .map_err(|_| "decode")
            .unwrap();
        let [a, b, c] = &known.0[..] else {
            panic!("three items")
        };
        assert!(a.partial && a.files.is_empty() && a.problems.is_empty());
        assert!(!b.partial && b.files.len() == 1);
        assert!(
            !c.partial,
            "data before metadata is read: nothing is known yet"
        );
        assert_eq!(c.files.len(), 1);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = |open: &str, close: &str| {
            let n = 200_000;
            format!("{}{}", open.repeat(n), close.repeat(n))
        };
        for body in [
            format!(r#"{{"items":[{}]}}"#, deep("[", "]")),
            format!(r#"{{"items":[{{"metadata":{}}}]}}"#, deep(r#"{"a":"#, "}")),
            format!(r#"{{"metadata":{},"items":[]}}"#, deep("[", "]")),
        ] {
            let e = decode(body.as_bytes(), &KeyFilter::all()).unwrap_err();
            assert!(e.contains("not a valid list"), "{e}");
        }
        // A field cmpoll does not read is skipped without recursion, however deep.
        let body = format!(r#"{{"items":[], "x": {}}}"#, deep("[", "]"));
        assert!(decode(body.as_bytes(), &KeyFilter::all()).is_ok());
    }

    #[test]
    fn a_handler_error_stops_decoding_and_is_returned() {
        let mut n = 0;
        let r = decode_list(
            &fixture("configmaplist.json")[..],
            &KeyFilter::all(),
            "list",
            &mut |_| {
                n += 1;
                Err(Error::Local("spool full".into()))
            },
        );
        assert_eq!(n, 1);
        match r {
            Err(ReadFailure::Fail(Error::Local(m))) => assert_eq!(m, "spool full"),
            other => panic!("{other:?}"),
        }
    }
}
