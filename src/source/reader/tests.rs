//! Unit tests of the list reader: the fixtures, odd but valid shapes, broken bodies, read
//! boundaries anywhere, bounded buffering, and metadata read without the contents.

use super::*;
use crate::testutil::{Dribble, fixture};

/// Reads a whole list, every item in full.
fn read_with(body: impl Read, keys: &KeyFilter) -> Result<(ListMeta, Vec<Item>), String> {
    let show = |e: ReadError| match e {
        ReadError::Bad(m) => m,
        ReadError::Io(e) => format!("io: {e}"),
    };
    let mut list = ListReader::new(body).map_err(show)?;
    let mut items = Vec::new();
    while let Some(raw) = list.next_item().map_err(show)? {
        let meta = raw.meta(None).map_err(show)?;
        items.push(raw.item(meta, keys, Resource::ConfigMaps).map_err(show)?);
    }
    Ok((list.finish().map_err(show)?, items))
}

fn read(body: &[u8], keys: &KeyFilter) -> Result<(ListMeta, Vec<Item>), String> {
    read_with(body, keys)
}

fn label<'a>(item: &'a Item, key: &str) -> Option<&'a str> {
    item.labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn reads_the_fixture_list() {
    let (meta, items) = read(&fixture("configmaplist.json"), &KeyFilter::all()).unwrap();
    assert_eq!(meta.kind, "ConfigMapList");
    assert_eq!(meta.resource_version.as_deref(), Some("184467302"));
    assert_eq!(items.len(), 2);
    let a = &items[0];
    assert_eq!(a.id(), "team-a/payments-config");
    assert_eq!(a.uid, "6f1c2d3e-8a9b-4c5d-9e0f-1a2b3c4d5e6f");
    assert_eq!(a.resource_version, "184467120");
    assert_eq!(label(a, "config.example.com/watch"), Some("true"));
    assert_eq!(a.files.len(), 2);
    let b = &items[1];
    let bin = b.files.iter().find(|f| f.key == "bundle.bin").unwrap();
    assert_eq!(bin.content, Content::Binary(vec![0, 1, 2, 253, 254, 255]));
}

#[test]
fn pages_and_metadata_lists() {
    let (meta, items) = read(
        &fixture("configmaplist-page1-limit1.json"),
        &KeyFilter::all(),
    )
    .unwrap();
    assert!(meta.continue_token.is_some());
    assert_eq!(meta.remaining_item_count, Some(1));
    assert_eq!(items.len(), 1);
    let body = fixture("partialobjectmetadatalist.json");
    let mut list = ListReader::new(&body[..]).unwrap();
    let mut metas = Vec::new();
    while let Some(raw) = list.next_item().unwrap() {
        metas.push(raw.meta(None).unwrap());
    }
    assert_eq!(list.finish().unwrap().kind, "PartialObjectMetadataList");
    assert_eq!(metas[1].resource_version, "184467290");
    assert!(metas.iter().all(|m| m.partial));
    let (_, items) = read(&fixture("configmaplist-empty.json"), &KeyFilter::all()).unwrap();
    assert!(items.is_empty());
}

#[test]
fn unselected_keys_are_skipped_but_counted() {
    let keys = KeyFilter::new(&["*.properties".into()]).unwrap();
    let (_, items) = read(&fixture("configmaplist.json"), &keys).unwrap();
    assert_eq!(items[0].files.len(), 1);
    assert_eq!(items[0].files[0].key, "application.properties");
    assert_eq!(items[0].keys_seen, 2);
    assert!(items[1].files.is_empty());
}

#[test]
fn odd_but_valid_shapes() {
    let body = br#"{"items":[{"data":null,"metadata":{"name":"a","namespace":"n","labels":null},"binaryData":{"b":"!!"}}],"metadata":{"resourceVersion":"7","continue":""},"kind":"ConfigMapList","extra":[1,{"x":2}]}"#;
    let (meta, items) = read(body, &KeyFilter::all()).unwrap();
    assert_eq!(meta.resource_version.as_deref(), Some("7"));
    assert_eq!(meta.continue_token, None, "an empty token is no token");
    assert_eq!(
        items[0].problems.len(),
        1,
        "bad base64 is the item's problem"
    );
    let body = "{\"items\":[{\"metadata\":{\"name\":\"a\"},\"data\":{\"k\":\"\\u003chtml\\u003e \\u0026\"}}]}";
    let (_, items) = read(body.as_bytes(), &KeyFilter::all()).unwrap();
    assert_eq!(items[0].files[0].content, Content::Text("<html> &".into()));
    // A field name written with an escape is still that field.
    let body = br#"{"items":[{"m\u0065tadata":{"name":"e"}}]}"#;
    assert_eq!(read(body, &KeyFilter::all()).unwrap().1[0].name, "e");
}

#[test]
fn broken_bodies_are_errors() {
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
        br#"{"items":[1]}"#,
        br#"{"items":[{"metadata":{},"metadata":{}}]}"#,
        br#"{"items":[],"items":[]}"#,
        b"",
        b"   ",
        // r13: no items is not an empty list.
        br#"{"kind":"ConfigMapList","items":null}"#,
        br#"{"items":null}"#,
        br#"{"kind":"PartialObjectMetadataList"}"#,
        br#"{"kind":"PartialObjectMetadataList","items":"x"}"#,
        br#"{"kind":"ConfigMapList","metadata":{"resourceVersion":"5"}}"#,
        br#"{}"#,
    ] {
        assert!(
            read(body, &KeyFilter::all()).is_err(),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

/// The real apiserver writes an empty metadata-only list with `"items":null` (recorded
/// from v1.37.2 by `tests/apiserver/tests/differential.rs`): that one is empty.
#[test]
fn an_empty_metadata_list_may_have_null_items() {
    let body = br#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"226"},"items":null}
"#;
    let mut list = ListReader::new(&body[..]).unwrap();
    assert!(list.next_item().unwrap().is_none());
    let meta = list.finish().unwrap();
    assert_eq!(
        (meta.kind.as_str(), meta.resource_version.as_deref()),
        ("PartialObjectMetadataList", Some("226"))
    );
}

/// `--folder-annotation`: the one annotation asked for, and nothing of the others.
#[test]
fn one_annotation_is_read_when_asked_for() {
    let body = br#"{"kind":"ConfigMapList","items":[
        {"metadata":{"name":"a","namespace":"n","annotations":{"big":"xxxxxxxx","k8s-sidecar-target-directory":"team-a/sub"}}},
        {"metadata":{"name":"b","namespace":"n","annotations":null}},
        {"metadata":{"name":"c","namespace":"n"}}]}"#;
    let mut list = ListReader::new(&body[..]).unwrap();
    let mut folders = Vec::new();
    while let Some(raw) = list.next_item().unwrap() {
        assert_eq!(raw.meta(None).unwrap().folder, None);
        folders.push(
            raw.meta(Some("k8s-sidecar-target-directory"))
                .unwrap()
                .folder,
        );
    }
    assert_eq!(folders, [Some("team-a/sub".to_string()), None, None]);
}

#[test]
fn metadata_is_read_without_the_contents() {
    // The contents are not even valid for a ConfigMap: `meta()` never looks at them.
    let body = br#"{"kind":"ConfigMapList","items":[
        {"metadata":{"name":"a","namespace":"n","resourceVersion":"1"},"data":{"k":1},"binaryData":{"b":"!!"}},
        {"data":{"k":"v"},"metadata":{"name":"c","namespace":"n","resourceVersion":"2"}}]}"#;
    let mut list = ListReader::new(&body[..]).unwrap();
    let raw = list.next_item().unwrap().unwrap();
    let a = raw.meta(None).unwrap();
    assert_eq!((a.name.as_str(), a.partial), ("a", false));
    assert!(
        raw.item(a, &KeyFilter::all(), Resource::ConfigMaps)
            .is_err(),
        "its contents are bad"
    );
    let raw = list.next_item().unwrap().unwrap();
    let c = raw.meta(None).unwrap();
    assert_eq!(c.resource_version, "2", "data before metadata is fine");
    assert_eq!(
        raw.item(c, &KeyFilter::all(), Resource::ConfigMaps)
            .unwrap()
            .files
            .len(),
        1
    );
    assert!(list.next_item().unwrap().is_none());
    assert_eq!(list.finish().unwrap().kind, "ConfigMapList");
}

#[test]
fn single_objects() {
    let obj = fixture("upstream/core.v1.ConfigMap.json");
    let (kind, meta, item) = read_object(
        &obj[..],
        &KeyFilter::all(),
        Resource::ConfigMaps,
        None,
        false,
    )
    .unwrap();
    assert_eq!(kind, "ConfigMap");
    assert!(!meta.partial);
    assert_eq!(item.name, meta.name);
    let (kind, _, _) = read_object(
        &br#"{"kind":"Status","code":404}"#[..],
        &KeyFilter::all(),
        Resource::ConfigMaps,
        None,
        false,
    )
    .unwrap();
    assert_eq!(kind, "Status");
}

#[test]
fn any_read_boundaries_give_the_same_items() {
    let tricky = br#" { "kind" : "ConfigMapList", "items" : [ {"metadata":{"name":"a\"]}","namespace":"n","resourceVersion":"1"},"data":{"k\\":"v \"[{\\","items":"]"}} , {"metadata":{"name":"b","namespace":"n"},"data":{}} ] , "metadata" : {"resourceVersion":"9"} } "#;
    for body in [&tricky[..], &fixture("configmaplist.json")[..]] {
        let want = read(body, &KeyFilter::all()).unwrap();
        for step in [1, 2, 3, 7, 64] {
            let got = read_with(Dribble(body, step), &KeyFilter::all()).unwrap();
            assert_eq!(got, want, "step {step}");
        }
    }
    let (meta, items) = read(tricky, &KeyFilter::all()).unwrap();
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
    let mut list = ListReader::new(Counted(body.as_bytes(), &read)).unwrap();
    let mut n = 0;
    let mut widest = 0;
    while let Some(raw) = list.next_item().unwrap() {
        // Read so far: up to the end of this item plus at most one read ahead.
        assert!(
            read.get() <= ends[n] + CHUNK,
            "item {n}: read {}",
            read.get()
        );
        raw.meta(None).unwrap();
        n += 1;
        widest = widest.max(list.s.buf.capacity());
    }
    assert_eq!(n, 2000);
    // And what was consumed is let go: the buffer stays a few chunks long.
    assert!(widest <= 4 * CHUNK, "buffer grew to {widest}");
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
        assert!(read(body.as_bytes(), &KeyFilter::all()).is_err());
    }
    // A field cmpoll does not read is skipped without recursion, however deep.
    let body = format!(r#"{{"items":[], "x": {}}}"#, deep("[", "]"));
    assert!(read(body.as_bytes(), &KeyFilter::all()).is_ok());
}

#[test]
fn a_secrets_data_is_base64_and_no_error_quotes_a_value() {
    let body = br#"{"kind":"SecretList","metadata":{"resourceVersion":"9"},"items":[
        {"metadata":{"name":"s","namespace":"n","resourceVersion":"1"},"data":{"password":"aHVudGVyMg==","key.der":"AP8="},"type":"Opaque"},
        {"metadata":{"name":"bad","namespace":"n","resourceVersion":"2"},"data":{"k":"hunter2!!"},"type":"Opaque"},
        {"metadata":{"name":"odd","namespace":"n","resourceVersion":"3"},"data":{"k":12345678}}]}"#;
    let mut list = ListReader::new(&body[..]).unwrap();
    let raw = list.next_item().unwrap().unwrap();
    let meta = raw.meta(None).unwrap();
    let item = raw
        .item(meta, &KeyFilter::all(), Resource::Secrets)
        .unwrap();
    let files: Vec<(&str, &[u8])> = (item.files.iter())
        .map(|f| (f.key.as_str(), f.content.bytes()))
        .collect();
    assert_eq!(
        files,
        [("password", &b"hunter2"[..]), ("key.der", &[0, 255][..])]
    );
    assert!(item.files.iter().all(|f| f.content.is_binary()));
    let raw = list.next_item().unwrap().unwrap();
    let item = raw
        .item(
            raw.meta(None).unwrap(),
            &KeyFilter::all(),
            Resource::Secrets,
        )
        .unwrap();
    assert_eq!(
        item.problems,
        ["data[k] is not base64"],
        "no value, no offset"
    );
    let raw = list.next_item().unwrap().unwrap();
    let Err(ReadError::Bad(why)) = raw.item(
        raw.meta(None).unwrap(),
        &KeyFilter::all(),
        Resource::Secrets,
    ) else {
        panic!("a number is not a value")
    };
    assert!(!why.contains("12345678"), "{why}");
    assert_eq!(list.finish().unwrap().kind, "SecretList");
}

/// A GET's object and the same object in a list give the same raw form: the list's item,
/// byte for byte, `kind` and `apiVersion` taken out (with the escapes and spaces as sent).
#[test]
fn raw_objects_are_list_items() {
    let item =
        br#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"7"},"data":{"k":"v \"}{"}}"#;
    let got = br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"n","resourceVersion":"7"},"data":{"k":"v \"}{"}}"#;
    let (_, _, from_get) = read_object(
        &got[..],
        &KeyFilter::all(),
        Resource::ConfigMaps,
        None,
        true,
    )
    .unwrap();
    let raw = from_get.raw.unwrap();
    assert_eq!(
        std::str::from_utf8(&raw.json).unwrap(),
        std::str::from_utf8(item).unwrap()
    );
    assert_eq!(
        raw.metadata(),
        br#"{"name":"a","namespace":"n","resourceVersion":"7"}"#
    );
    let list = [
        &br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":["#[..],
        item,
        b"]}",
    ]
    .concat();
    let mut l = ListReader::new(&list[..]).unwrap();
    let raw_item = l.next_item().unwrap().unwrap();
    let from_list = raw_item.raw();
    assert_eq!(from_list, raw);
    assert!(
        !format!("{from_list:?}").contains("v \\\""),
        "Debug never shows values"
    );
    let (_, _, plain) = read_object(
        &got[..],
        &KeyFilter::all(),
        Resource::ConfigMaps,
        None,
        false,
    )
    .unwrap();
    assert!(plain.raw.is_none());
}
