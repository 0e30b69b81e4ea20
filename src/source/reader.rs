//! Reading a `ConfigMapList` (or `PartialObjectMetadataList`) body, one item at a time.
//!
//! `ListReader` is pulled: `next_item()` hands out the next element of `items` as a raw
//! slice of the body, found by a byte scanner that follows only strings and nesting (memchr
//! for strings) and, in the same pass, notes where the item's top-level fields are. The
//! caller asks for what it needs: `meta()` parses only `kind` and `metadata`; `item()` only
//! `data` and `binaryData`, keeping just the keys `--keys` selects (the rest is skipped
//! without being stored; `managedFields` and annotations never are). So an item whose
//! contents the caller already has is never parsed past its metadata, and the buffer holds
//! one item plus one read. Everything around `items` (kind, metadata) is parsed by
//! `finish()` from what is left. A list without an `items` array is an error: it says
//! nothing about what exists. The one exception is how the real apiserver (v1.37.2,
//! `tests/apiserver/tests/differential.rs`) writes an empty `PartialObjectMetadataList`:
//! `"items":null` (it is encoded from a nil slice, not streamed as typed lists are); a
//! `ConfigMapList` always has `"items":[]`. `binaryData` is base64-decoded; a bad value is
//! a problem of that item, not of the whole list.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::ops::Range;

use base64::Engine as _;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::item::{Content, Item, ModuleFile, RawObject};
use super::selection::{KeyFilter, Resource};

/// Why a body could not be read: the transport (classified by the client: the size cap, a
/// timeout, a cut) or the body itself.
#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    Bad(String),
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

fn bad(cause: impl fmt::Display) -> ReadError {
    ReadError::Bad(cause.to_string())
}

/// What a list says about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListMeta {
    pub kind: String,
    pub resource_version: Option<String>,
    pub continue_token: Option<String>,
    pub remaining_item_count: Option<i64>,
}

/// An item's identity, version and labels: all a source needs to decide about it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: Vec<(String, String)>,
    /// A `PartialObjectMetadata` item: metadata only, contents still to be fetched.
    pub partial: bool,
    /// The value of the annotation `meta` was asked for (`--folder-annotation`).
    pub folder: Option<String>,
}

impl Meta {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
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

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawListMeta {
    resource_version: Option<String>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    remaining_item_count: Option<i64>,
}

/// What is kept of the list itself.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawList {
    kind: Option<String>,
    metadata: Option<RawListMeta>,
    /// Always `[]` here (the elements were taken out).
    #[allow(dead_code)]
    items: Option<Vec<IgnoredAny>>,
}

/// An item's top-level fields that cmpoll reads, as ranges of its slice.
#[derive(Clone, Debug, Default)]
struct Fields {
    kind: Option<Range<usize>>,
    metadata: Option<Range<usize>>,
    data: Option<Range<usize>>,
    binary_data: Option<Range<usize>>,
    /// The `kind` and `apiVersion` members, from a name's quote to just after the `,`
    /// that follows: what a GET's answer has and a list's item does not.
    type_meta: Vec<Range<usize>>,
}

/// One element of `items`, not yet parsed.
pub struct RawItem<'a> {
    bytes: &'a [u8],
    fields: Fields,
    index: usize,
}

impl RawItem<'_> {
    fn field(&self, r: &Option<Range<usize>>) -> Option<&[u8]> {
        r.as_ref().map(|r| &self.bytes[r.clone()])
    }

    /// Its kind and metadata, with the value of `annotation` if asked for.
    pub fn meta(&self, annotation: Option<&str>) -> Result<Meta, ReadError> {
        let at = |e: serde_json::Error| bad(format!("item {}: {e}", self.index));
        let kind: Option<String> = match self.field(&self.fields.kind) {
            Some(b) => serde_json::from_slice(b).map_err(at)?,
            None => None,
        };
        let m: RawObjectMeta = match self.field(&self.fields.metadata) {
            Some(b) => serde_json::from_slice::<Option<RawObjectMeta>>(b)
                .map_err(at)?
                .unwrap_or_default(),
            None => RawObjectMeta::default(),
        };
        // Annotations are read only when one is asked for (they can be large: kubectl's
        // last-applied-configuration holds the whole object).
        let folder = match (annotation, self.field(&self.fields.metadata)) {
            (Some(name), Some(b)) => {
                #[derive(Deserialize)]
                struct Annotations<'a> {
                    #[serde(borrow, default)]
                    annotations:
                        Option<BTreeMap<std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>>>,
                }
                let a: Option<Annotations> = serde_json::from_slice(b).map_err(at)?;
                a.and_then(|a| a.annotations)
                    .and_then(|mut a| a.remove(name))
                    .map(|v| v.into_owned())
            }
            _ => None,
        };
        Ok(Meta {
            namespace: m.namespace.unwrap_or_default(),
            name: m.name.unwrap_or_default(),
            uid: m.uid.unwrap_or_default(),
            resource_version: m.resource_version.unwrap_or_default(),
            labels: m.labels.unwrap_or_default().into_iter().collect(),
            partial: kind.as_deref() == Some("PartialObjectMetadata"),
            folder,
        })
    }

    /// The item as a list serves it (`RawObject`): its bytes without `kind` and
    /// `apiVersion`.
    pub fn raw(&self) -> RawObject {
        let mut json = Vec::with_capacity(self.bytes.len());
        let mut at = 0;
        for cut in &self.fields.type_meta {
            json.extend_from_slice(&self.bytes[at..cut.start]);
            at = cut.end;
        }
        json.extend_from_slice(&self.bytes[at..]);
        let before = |i: usize| {
            let cut: usize = (self.fields.type_meta.iter())
                .filter(|c| c.end <= i)
                .map(|c| c.len())
                .sum();
            i - cut
        };
        let metadata = match &self.fields.metadata {
            Some(m) => before(m.start)..before(m.end),
            None => 0..0,
        };
        RawObject {
            json: json.into_boxed_slice(),
            metadata,
        }
    }

    /// The whole item, with `meta` (from `meta()`) and the contents of the selected keys: a
    /// ConfigMap's `data` as text and `binaryData` decoded, a Secret's `data` decoded.
    pub fn item(
        &self,
        meta: Meta,
        keys: &KeyFilter,
        resource: Resource,
    ) -> Result<Item, ReadError> {
        let mut item = Item {
            kind: resource,
            folder: meta.folder,
            namespace: meta.namespace,
            name: meta.name,
            uid: meta.uid,
            resource_version: meta.resource_version,
            labels: meta.labels,
            ..Item::default()
        };
        let at = |e: serde_json::Error| bad(format!("item {}: {e}", self.index));
        let fields = match resource {
            Resource::ConfigMaps => [
                (&self.fields.data, Encoding::Text),
                (&self.fields.binary_data, Encoding::Base64("binaryData")),
            ],
            // A Secret has no binaryData; its data is base64.
            Resource::Secrets => [
                (&self.fields.data, Encoding::Base64("data")),
                (&None, Encoding::Text),
            ],
        };
        for (range, encoding) in fields {
            if let Some(b) = self.field(range) {
                let mut de = serde_json::Deserializer::from_slice(b);
                DataSeed {
                    keys,
                    encoding,
                    secret: resource == Resource::Secrets,
                    item: &mut item,
                }
                .deserialize(&mut de)
                .and_then(|()| de.end())
                .map_err(at)?;
            }
        }
        Ok(item)
    }
}

enum State {
    /// Reading the list's own fields, before `items`.
    Fields,
    /// Inside `items`: the next element, or `]`.
    Items { first: bool },
    /// `items` was read; the fields after it are left for `finish`.
    AfterItems,
}

/// A list body, read one item at a time (see the module documentation).
pub struct ListReader<R> {
    s: Scanner<R>,
    /// The list without its items' elements: `{…,"items":[],…}`.
    rest: Vec<u8>,
    state: State,
    items: usize,
    items_seen: bool,
    /// `"items":null` was read.
    items_null: bool,
}

impl<R: Read> ListReader<R> {
    pub fn new(reader: R) -> Result<ListReader<R>, ReadError> {
        let mut s = Scanner {
            reader,
            buf: Vec::with_capacity(CHUNK),
            pos: 0,
            eof: false,
        };
        s.expect(b'{', "expected '{'")?;
        Ok(ListReader {
            s,
            rest: b"{".to_vec(),
            state: State::Fields,
            items: 0,
            items_seen: false,
            items_null: false,
        })
    }

    /// The next element of `items`; `None` once they are all read.
    pub fn next_item(&mut self) -> Result<Option<RawItem<'_>>, ReadError> {
        loop {
            match self.state {
                State::AfterItems => return Ok(None),
                State::Fields => {
                    if !self.fields_until_items()? {
                        self.state = State::AfterItems;
                        return Ok(None);
                    }
                    self.state = State::Items { first: true };
                }
                State::Items { first } => {
                    match self.s.peek()? {
                        Some(b']') => {
                            self.s.pos += 1;
                            self.state = State::AfterItems;
                            return Ok(None);
                        }
                        Some(b',') if !first => self.s.pos += 1,
                        _ if first => {}
                        _ => {
                            return Err(bad(format!(
                                "expected ',' or ']' after item {}",
                                self.items
                            )));
                        }
                    }
                    self.state = State::Items { first: false };
                    self.s.compact();
                    let (range, fields) = self.s.object_fields()?;
                    self.items += 1;
                    return Ok(Some(RawItem {
                        bytes: &self.s.buf[range],
                        fields,
                        index: self.items - 1,
                    }));
                }
            }
        }
    }

    /// Reads the list's fields up to `items` (`true`), or to its end (`false`).
    fn fields_until_items(&mut self) -> Result<bool, ReadError> {
        if self.rest.len() == 1 && self.s.peek()? == Some(b'}') {
            self.s.pos += 1;
            return Ok(false);
        }
        loop {
            if self.s.peek()? != Some(b'"') {
                return Err(bad("expected a field name"));
            }
            let name = self.s.value()?;
            let name_bytes = self.s.buf[name].to_vec();
            let field: String = serde_json::from_slice(&name_bytes).map_err(bad)?;
            self.s.expect(b':', "expected ':'")?;
            self.rest.extend_from_slice(&name_bytes);
            self.rest.push(b':');
            if field == "items" && self.s.peek()? == Some(b'[') {
                self.s.pos += 1;
                self.rest.extend_from_slice(b"[]");
                self.items_seen = true;
                return Ok(true);
            }
            let value = self.s.value()?;
            self.items_null |= field == "items" && self.s.buf[value.clone()] == *b"null";
            self.rest.extend_from_slice(&self.s.buf[value]);
            if !self.after_field()? {
                return Ok(false);
            }
        }
    }

    /// After a field: `,` (`true`: another follows) or `}` (`false`).
    fn after_field(&mut self) -> Result<bool, ReadError> {
        match self.s.peek()? {
            Some(b',') => {
                self.s.pos += 1;
                self.rest.push(b',');
                Ok(true)
            }
            Some(b'}') => {
                self.s.pos += 1;
                Ok(false)
            }
            _ => Err(bad("expected ',' or '}' after a field")),
        }
    }

    /// Reads what follows the items and returns what the list says about itself.
    pub fn finish(mut self) -> Result<ListMeta, ReadError> {
        while self.next_item()?.is_some() {}
        // After `items`' `]`: more fields, or the end of the list.
        if self.items_seen && self.after_field()? {
            self.state = State::Fields;
            if self.fields_until_items()? {
                return Err(bad("\"items\" appears twice"));
            }
        }
        self.rest.push(b'}');
        if self.s.peek()?.is_some() {
            return Err(bad("trailing characters after the list"));
        }
        let list: RawList = serde_json::from_slice(&self.rest).map_err(bad)?;
        let empty_metadata_list =
            self.items_null && list.kind.as_deref() == Some("PartialObjectMetadataList");
        if !self.items_seen && !empty_metadata_list {
            // An apiserver always sends `"items":[]` for an empty list; without it, this
            // answer says nothing about what exists, and taking it for "nothing" would
            // remove every module.
            return Err(bad(
                "it has no \"items\" array (an empty list has \"items\":[])",
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
}

/// One object (a single GET): its `kind`, metadata and the item with its selected keys
/// (and, with `raw`, the object as a list would serve it).
pub fn read_object(
    reader: impl Read,
    keys: &KeyFilter,
    resource: Resource,
    annotation: Option<&str>,
    raw: bool,
) -> Result<(String, Meta, Item), ReadError> {
    #[derive(Deserialize)]
    struct Kind {
        kind: Option<String>,
    }
    let mut bytes = Vec::new();
    std::io::BufReader::new(reader).read_to_end(&mut bytes)?;
    let kind: Kind = serde_json::from_slice(&bytes).map_err(bad)?;
    let mut s = Scanner {
        reader: &bytes[..],
        buf: Vec::new(),
        pos: 0,
        eof: false,
    };
    let (range, fields) = s.object_fields()?;
    if s.peek()?.is_some() {
        return Err(bad("trailing characters after the object"));
    }
    let object = RawItem {
        bytes: &s.buf[range],
        fields,
        index: 0,
    };
    let meta = object.meta(annotation)?;
    let mut item = object.item(meta.clone(), keys, resource)?;
    if raw {
        item.raw = Some(object.raw());
    }
    Ok((kind.kind.unwrap_or_default(), meta, item))
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

impl<R: Read> Scanner<R> {
    /// Reads until `buf[at]` exists; `false` if the body ends first.
    #[inline]
    fn have(&mut self, at: usize) -> Result<bool, ReadError> {
        if at < self.buf.len() {
            return Ok(true);
        }
        self.fill_to(at)
    }

    #[cold]
    fn fill_to(&mut self, at: usize) -> Result<bool, ReadError> {
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
                Err(e) => return Err(ReadError::Io(e)),
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
    fn peek(&mut self) -> Result<Option<u8>, ReadError> {
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

    fn expect(&mut self, want: u8, why: &str) -> Result<(), ReadError> {
        if self.peek()? != Some(want) {
            return Err(bad(why));
        }
        self.pos += 1;
        Ok(())
    }

    /// The extent of the next value, which is consumed. Only strings and nesting are
    /// followed; whether the value is valid JSON is for the parser of that slice to say.
    fn value(&mut self) -> Result<Range<usize>, ReadError> {
        let eof = || bad("the body ends inside a value");
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

    /// The next value, which must be an object, and where its top-level fields that
    /// cmpoll reads are (relative to the object's start). One pass: each field's value is
    /// scanned once, by `value`.
    fn object_fields(&mut self) -> Result<(Range<usize>, Fields), ReadError> {
        if self.peek()? != Some(b'{') {
            return Err(bad("an item is not an object"));
        }
        let start = self.pos;
        self.pos += 1;
        let mut fields = Fields::default();
        if self.peek()? == Some(b'}') {
            self.pos += 1;
            return Ok((start..self.pos, fields));
        }
        loop {
            if self.peek()? != Some(b'"') {
                return Err(bad("expected a field name in an item"));
            }
            let name = self.value()?;
            self.expect(b':', "expected ':' in an item")?;
            let value = self.value()?;
            let rel = value.start - start..value.end - start;
            let type_meta = matches!(&self.buf[name.clone()], b"\"kind\"" | b"\"apiVersion\"");
            let member = name.start - start;
            let slot = match &self.buf[name.clone()] {
                b"\"kind\"" => Some(&mut fields.kind),
                b"\"metadata\"" => Some(&mut fields.metadata),
                b"\"data\"" => Some(&mut fields.data),
                b"\"binaryData\"" => Some(&mut fields.binary_data),
                other if other.contains(&b'\\') => {
                    // An escaped name: decode it to know which field it is.
                    match serde_json::from_slice::<String>(other).as_deref() {
                        Ok("kind") => Some(&mut fields.kind),
                        Ok("metadata") => Some(&mut fields.metadata),
                        Ok("data") => Some(&mut fields.data),
                        Ok("binaryData") => Some(&mut fields.binary_data),
                        _ => None,
                    }
                }
                _ => None,
            };
            if let Some(slot) = slot {
                if slot.is_some() {
                    return Err(bad("a field appears twice in an item"));
                }
                *slot = Some(rel);
            }
            match self.peek()? {
                Some(b',') => {
                    self.pos += 1;
                    if type_meta {
                        fields.type_meta.push(member..self.pos - start);
                    }
                }
                Some(b'}') => {
                    self.pos += 1;
                    return Ok((start..self.pos, fields));
                }
                _ => return Err(bad("expected ',' or '}' in an item")),
            }
        }
    }

    /// From just after an opening quote to just after the closing one.
    fn string_end(&mut self, mut i: usize) -> Result<usize, ReadError> {
        loop {
            if !self.have(i)? {
                return Err(bad("the body ends inside a string"));
            }
            match memchr::memchr2(b'"', b'\\', &self.buf[i..]) {
                Some(k) if self.buf[i + k] == b'"' => return Ok(i + k + 1),
                Some(k) => i += k + 2,
                None => i = self.buf.len(),
            }
        }
    }
}

/// How a data map's values are written.
#[derive(Clone, Copy)]
enum Encoding {
    Text,
    /// Base64, in the field of this name.
    Base64(&'static str),
}

/// `data` or `binaryData`: selected keys are kept, the rest skipped unstored.
struct DataSeed<'a> {
    keys: &'a KeyFilter,
    encoding: Encoding,
    /// A Secret's: no error message may quote a value.
    secret: bool,
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
            let value: String = if self.secret {
                // serde's type errors quote the value.
                map.next_value::<StringOnly>()?.0
            } else {
                map.next_value()?
            };
            let content = match self.encoding {
                Encoding::Base64(field) => {
                    match base64::engine::general_purpose::STANDARD.decode(value.as_bytes()) {
                        Ok(bytes) => Content::Binary(bytes),
                        Err(_) if self.secret => {
                            let why = format!("{field}[{key}] is not base64");
                            self.item.problems.push(why);
                            continue;
                        }
                        Err(e) => {
                            let why = format!("{field}[{key}] is not base64: {e}");
                            self.item.problems.push(why);
                            continue;
                        }
                    }
                }
                Encoding::Text => Content::Text(value),
            };
            self.item.files.push(ModuleFile { key, content });
        }
        Ok(())
    }
}

/// A string whose type error does not quote what was there instead.
struct StringOnly(String);

impl<'de> Deserialize<'de> for StringOnly {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StringOnly, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StringOnly;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<StringOnly, E> {
                Ok(StringOnly(v.to_string()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<StringOnly, E> {
                Ok(StringOnly(v))
            }
        }
        d.deserialize_any(V)
            .map_err(|_: D::Error| de::Error::custom("a value of a Secret's data is not a string"))
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
mod tests;
