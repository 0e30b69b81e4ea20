//! Streaming decode of a `ConfigMapList` (or `PartialObjectMetadataList`) body.
//!
//! The body is read through serde_json's reader deserializer and each item is handed to a
//! callback as soon as it is complete, so a list of any size is held one item at a time.
//! Only what cmpoll uses is kept: name, namespace, uid, resourceVersion, labels, and the
//! contents of the keys `--keys` selects (other values are skipped without being stored;
//! `managedFields` and annotations are never stored). `binaryData` is base64-decoded here;
//! a bad value is recorded as a problem of that item, not of the whole list.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;

use base64::Engine as _;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

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
enum ListField {
    Kind,
    Metadata,
    Items,
    #[serde(other)]
    Other,
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

/// Decodes a list body from `reader`, calling `on_item` for each item in order.
pub fn decode_list<R: Read>(
    reader: R,
    keys: &KeyFilter,
    action: &str,
    on_item: &mut dyn FnMut(Item) -> Result<(), Error>,
) -> Result<ListMeta, ReadFailure> {
    let mut failed = None;
    let mut de =
        serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(64 * 1024, reader));
    let seed = ListSeed {
        keys,
        on_item,
        failed: &mut failed,
    };
    let result = seed
        .deserialize(&mut de)
        .and_then(|meta| de.end().map(|_| meta));
    match result {
        Ok(meta) => Ok(meta),
        Err(_) if failed.is_some() => Err(ReadFailure::Fail(failed.expect("checked"))),
        Err(e) if e.is_io() => Err(ReadFailure::Io(std::io::Error::from(e))),
        Err(e) => Err(ReadFailure::Fail(Error::Decode {
            action: action.to_string(),
            cause: format!("not a valid list: {e}"),
        })),
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
    let item = ItemSeed { keys }.deserialize(&mut de).map_err(bad)?;
    Ok((kind.kind.unwrap_or_default(), item))
}

struct ListSeed<'a> {
    keys: &'a KeyFilter,
    on_item: &'a mut dyn FnMut(Item) -> Result<(), Error>,
    failed: &'a mut Option<Error>,
}

impl<'de> DeserializeSeed<'de> for ListSeed<'_> {
    type Value = ListMeta;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ListMeta, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ListSeed<'_> {
    type Value = ListMeta;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ListMeta, A::Error> {
        let mut meta = ListMeta::default();
        let ListSeed {
            keys,
            on_item,
            failed,
        } = self;
        while let Some(field) = map.next_key::<ListField>()? {
            match field {
                ListField::Kind => {
                    meta.kind = map.next_value::<Option<String>>()?.unwrap_or_default()
                }
                ListField::Metadata => {
                    let m: Option<RawListMeta> = map.next_value()?;
                    let m = m.unwrap_or_default();
                    meta.resource_version = m.resource_version;
                    meta.continue_token = m.continue_token.filter(|c| !c.is_empty());
                    meta.remaining_item_count = m.remaining_item_count;
                }
                ListField::Items => map.next_value_seed(ItemsSeed {
                    keys,
                    on_item: &mut *on_item,
                    failed: &mut *failed,
                })?,
                ListField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(meta)
    }
}

struct ItemsSeed<'a> {
    keys: &'a KeyFilter,
    on_item: &'a mut dyn FnMut(Item) -> Result<(), Error>,
    failed: &'a mut Option<Error>,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // `null` is accepted as an empty list.
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of items")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element_seed(ItemSeed { keys: self.keys })? {
            if let Err(e) = (self.on_item)(item) {
                *self.failed = Some(e);
                return Err(de::Error::custom("stopped by the item handler"));
            }
        }
        Ok(())
    }
}

struct ItemSeed<'a> {
    keys: &'a KeyFilter,
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

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Item, A::Error> {
        let mut item = Item::default();
        while let Some(field) = map.next_key::<ItemField>()? {
            match field {
                ItemField::Kind => {
                    let kind: Option<String> = map.next_value()?;
                    item.partial = kind.as_deref() == Some("PartialObjectMetadata");
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
        let (_, items) = decode(
            br#"{"kind":"ConfigMapList","items":null}"#,
            &KeyFilter::all(),
        )
        .unwrap();
        assert!(items.is_empty());
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
