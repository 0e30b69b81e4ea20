//! Unit tests of the protobuf metadata-list reader: bodies recorded from the real
//! kube-apiserver v1.37.2 read as the same apiserver's JSON for the same list reads
//! (the JSON reader is held to the real apiserver already), every cut, one byte at a
//! time, lying lengths, another kind, and fields cmpoll does not know.

use std::io::Read;

use super::*;
use crate::source::reader::ListReader;
use crate::testutil::{Dribble, fixture};

const FOLDER: &str = "k8s-sidecar-target-directory";

fn show(e: ReadError) -> String {
    match e {
        ReadError::Bad(m) => m,
        ReadError::Io(e) => format!("io: {e}"),
    }
}

fn proto(body: impl Read) -> Result<(ListMeta, Vec<Meta>), String> {
    let mut list = MetaListReader::new(body).map_err(show)?;
    let mut items = Vec::new();
    while let Some(m) = list.next_meta(Some(FOLDER)).map_err(show)? {
        items.push(m);
    }
    Ok((list.finish().map_err(show)?, items))
}

fn json(body: &[u8]) -> (ListMeta, Vec<Meta>) {
    let mut list = ListReader::new(body).unwrap();
    let mut items = Vec::new();
    while let Some(raw) = list.next_item().unwrap() {
        items.push(raw.meta(Some(FOLDER)).unwrap());
    }
    (list.finish().unwrap(), items)
}

#[test]
fn reads_what_the_real_apiserver_sent_as_its_json_says() {
    for name in [
        "partialobjectmetadatalist",
        "partialobjectmetadatalist-page1-limit2",
    ] {
        let pb = fixture(&format!("recorded/{name}.pb"));
        let (want_list, want) = json(&fixture(&format!("recorded/{name}.json")));
        let (list, items) = proto(&pb[..]).unwrap();
        assert_eq!(list, want_list, "{name}");
        assert_eq!(items, want, "{name}");
        // The same at every read size.
        for n in [1, 2, 3, 7, 64] {
            assert_eq!(
                proto(Dribble(&pb, n)).unwrap(),
                (list.clone(), items.clone())
            );
        }
    }
}

#[test]
fn the_recorded_lists_hold_what_the_objects_hold() {
    let (list, items) = proto(&fixture("recorded/partialobjectmetadatalist.pb")[..]).unwrap();
    assert_eq!(list.kind, "PartialObjectMetadataList");
    assert!(list.resource_version.is_some());
    assert_eq!(list.continue_token, None);
    let ids: Vec<String> = items.iter().map(Meta::id).collect();
    assert_eq!(
        ids,
        [
            "proto-golden/alloy-modules",
            "proto-golden/plain",
            "proto-golden/third"
        ]
    );
    let a = &items[0];
    assert!(a.partial);
    assert_eq!(a.folder.as_deref(), Some("dashboards/payments"));
    assert_eq!(
        a.labels,
        [
            ("app.kubernetes.io/name".to_string(), "alloy".to_string()),
            ("cmpoll.io/module".into(), "true".into()),
            ("team".into(), "payments".into()),
        ]
    );
    assert_eq!(a.uid.len(), 36);
    assert!(a.resource_version.parse::<u64>().is_ok());
    assert_eq!(items[1].folder, None);
    let (page, items) =
        proto(&fixture("recorded/partialobjectmetadatalist-page1-limit2.pb")[..]).unwrap();
    assert_eq!(items.len(), 2);
    assert!(page.continue_token.is_some_and(|c| !c.is_empty()));
    let (empty, items) =
        proto(&fixture("recorded/partialobjectmetadatalist-empty.pb")[..]).unwrap();
    assert!(items.is_empty());
    assert_eq!(empty.kind, "PartialObjectMetadataList");
    assert!(empty.resource_version.is_some());
}

/// Where the envelope's `raw` field (the list) ends in a recorded body.
fn list_end(pb: &[u8]) -> usize {
    let mut f = Fields::new(&pb[4..]);
    while let Some((n, _)) = f.next().unwrap() {
        if n == 2 {
            return 4 + f.at;
        }
    }
    panic!("no list")
}

#[test]
fn a_body_cut_anywhere_in_the_list_is_an_error_never_a_shorter_list() {
    let pb = fixture("recorded/partialobjectmetadatalist.pb");
    let whole = proto(&pb[..]).unwrap();
    let end = list_end(&pb);
    assert!(end < pb.len(), "the envelope has fields after the list");
    for cut in 0..pb.len() {
        let got = proto(&pb[..cut]);
        if cut < end {
            let e = got.expect_err(&format!("cut at {cut} of {}", pb.len()));
            assert!(
                e.contains("protobuf") || e.contains("cut short"),
                "{cut}: {e}"
            );
        } else if cut == end {
            // Only the (empty) contentEncoding and contentType are left: the list is whole.
            assert_eq!(got.unwrap(), whole, "cut at {cut}");
        } else if let Ok(got) = got {
            // Cut inside those two: an error, or the whole list; never another one.
            assert_eq!(got, whole, "cut at {cut}");
        }
    }
}

#[test]
fn another_kind_in_protobuf_is_refused_by_name() {
    // What the apiserver sends for `Accept: application/vnd.kubernetes.protobuf` alone.
    let e = proto(&fixture("recorded/configmaplist.pb")[..]).unwrap_err();
    assert_eq!(
        e,
        "expected a PartialObjectMetadataList, got kind 'ConfigMapList' in protobuf"
    );
}

#[test]
fn bodies_that_are_not_kubernetes_protobuf() {
    let cases: &[(&[u8], &str)] = &[
        (b"", "protobuf: the body cut short in the magic number"),
        (
            b"{\"kind\":\"PartialObjectMetadataList\"}",
            "protobuf: no 'k8s\\0' magic number: not a Kubernetes protobuf object",
        ),
        (b"k8s\0", "protobuf: no list in the envelope"),
        // raw: a length of 2^62 with nothing behind it.
        (
            b"k8s\0\x12\x80\x80\x80\x80\x80\x80\x80\x80\x40",
            "protobuf: the list cut short",
        ),
        // raw holds an item claiming more bytes than the list has.
        (
            b"k8s\0\x12\x03\x12\x7f\x00",
            "protobuf: an item longer than the list",
        ),
        // an item whose ObjectMeta claims more than the item.
        (
            b"k8s\0\x12\x04\x12\x02\x0a\x05",
            "item 0: protobuf: a field longer than its message",
        ),
        // a varint of eleven bytes.
        (
            b"k8s\0\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
            "protobuf: a varint longer than 10 bytes",
        ),
        // a group (wire type 3).
        (
            b"k8s\0\x12\x04\x12\x02\x0b\x00",
            "item 0: protobuf: wire type 3 (groups are not used by Kubernetes)",
        ),
        (
            b"k8s\0\x1a\x04gzip\x12\x00",
            "protobuf: content encoding 'gzip' is not supported",
        ),
        // two lists.
        (
            b"k8s\0\x12\x00\x12\x00",
            "protobuf: two lists in one envelope",
        ),
        // a name that is not UTF-8.
        (
            b"k8s\0\x12\x07\x12\x05\x0a\x03\x0a\x01\xff",
            "item 0: protobuf: metadata.name is not UTF-8",
        ),
    ];
    for (body, want) in cases {
        assert_eq!(proto(*body).unwrap_err(), *want, "{body:?}");
    }
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

/// A length-delimited field.
fn field(n: u8, bytes: &[u8]) -> Vec<u8> {
    assert!(bytes.len() < 128);
    let mut out = vec![n << 3 | 2, bytes.len() as u8];
    out.extend_from_slice(bytes);
    out
}

#[test]
fn fields_cmpoll_does_not_know_are_skipped_by_their_wire_type() {
    let entry = [field(1, b"app"), field(2, b"web")].concat();
    let object_meta = [
        field(1, b"n"),
        vec![7 << 3, 0x96, 0x01], // generation: a varint
        [varint(99 << 3 | 5), vec![1, 2, 3, 4]].concat(), // an unknown fixed32
        field(3, b"ns"),
        [varint(98 << 3 | 1), vec![1, 2, 3, 4, 5, 6, 7, 8]].concat(), // an unknown fixed64
        field(6, b"42"),
        field(11, &entry),
        field(14, b"example.com/keep"), // finalizers
    ]
    .concat();
    let item = [field(1, &object_meta), field(9, b"future")].concat();
    let list_meta = [field(2, b"7"), vec![4 << 3, 3]].concat();
    let raw = [field(1, &list_meta), vec![5 << 3, 1], field(2, &item)].concat();
    let type_meta = [
        field(1, b"meta.k8s.io/v1"),
        field(2, b"PartialObjectMetadataList"),
    ]
    .concat();
    let body = [
        b"k8s\0".to_vec(),
        field(1, &type_meta),
        field(2, &raw),
        field(4, b""),
    ]
    .concat();
    let (list, items) = proto(&body[..]).unwrap();
    assert_eq!(list.resource_version.as_deref(), Some("7"));
    assert_eq!(list.remaining_item_count, Some(3));
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].id(), "ns/n");
    assert_eq!(items[0].resource_version, "42");
    assert_eq!(items[0].labels, [("app".to_string(), "web".to_string())]);
}
