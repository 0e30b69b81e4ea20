//! The object store, modelled on etcd as the apiserver sees it: one global revision that
//! every write bumps (the resourceVersion), a history per key so a list can be read "as of"
//! a revision (what continue tokens and Exact reads need), and compaction, after which
//! reads at older revisions fail with 410 Expired. Keys are `resource/namespace/name`,
//! ordered as etcd orders `/registry/<resource>/<ns>/<name>` (ConfigMaps and Secrets share
//! the revision, as in etcd).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use base64::Engine as _;
use serde_json::{Value, json};

/// What a test gives the store: a ConfigMap's (or a Secret's) user-set fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigMap {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub data: BTreeMap<String, String>,
    pub binary_data: BTreeMap<String, Vec<u8>>,
    pub immutable: Option<bool>,
    /// `Some(type)`: a Secret of that type (`Opaque`…). Its `data` and `binary_data` are
    /// both served as the Secret's `data`, base64-encoded, as the apiserver stores
    /// `stringData` and `data` alike.
    pub secret: Option<String>,
}

impl ConfigMap {
    pub fn new(namespace: &str, name: &str) -> ConfigMap {
        ConfigMap {
            namespace: namespace.to_string(),
            name: name.to_string(),
            ..ConfigMap::default()
        }
    }

    /// An `Opaque` Secret.
    pub fn secret(namespace: &str, name: &str) -> ConfigMap {
        ConfigMap {
            secret: Some("Opaque".into()),
            ..ConfigMap::new(namespace, name)
        }
    }

    /// `configmaps` or `secrets`.
    pub fn resource(&self) -> &'static str {
        if self.secret.is_some() {
            "secrets"
        } else {
            "configmaps"
        }
    }

    /// `ConfigMap` or `Secret`.
    pub fn kind(&self) -> &'static str {
        if self.secret.is_some() {
            "Secret"
        } else {
            "ConfigMap"
        }
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.to_string(), v.to_string());
        self
    }

    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.to_string(), v.to_string());
        self
    }

    pub fn data(mut self, k: &str, v: &str) -> Self {
        self.data.insert(k.to_string(), v.to_string());
        self
    }

    pub fn binary(mut self, k: &str, v: &[u8]) -> Self {
        self.binary_data.insert(k.to_string(), v.to_vec());
        self
    }

    pub fn immutable(mut self, v: bool) -> Self {
        self.immutable = Some(v);
        self
    }

    pub fn key(&self) -> String {
        key(self.resource(), &self.namespace, &self.name)
    }
}

/// The store key of an object: `resource/namespace/name`.
pub fn key(resource: &str, namespace: &str, name: &str) -> String {
    format!("{resource}/{namespace}/{name}")
}

/// One stored version of an object, with its JSON encodings made once at write time.
#[derive(Debug)]
pub struct Object {
    pub spec: ConfigMap,
    pub uid: String,
    pub resource_version: u64,
    pub creation_timestamp: String,
    /// The list item encoding: `{"metadata":…,"immutable":…,"data":…,"binaryData":…}`.
    pub item_json: Vec<u8>,
    /// The `metadata` object alone.
    pub meta_json: Vec<u8>,
}

impl Object {
    fn new(spec: ConfigMap, uid: String, rv: u64, created: String, managed_time: &str) -> Object {
        let secret = spec.secret.is_some();
        let mut fields = serde_json::Map::new();
        for k in spec.data.keys() {
            fields.insert(format!("f:{k}"), json!({}));
        }
        if secret {
            // A Secret has one `data` map for both.
            for k in spec.binary_data.keys() {
                fields.insert(format!("f:{k}"), json!({}));
            }
        }
        let mut f_meta = serde_json::Map::new();
        if !spec.labels.is_empty() {
            let mut l = serde_json::Map::from_iter([(".".to_string(), json!({}))]);
            for k in spec.labels.keys() {
                l.insert(format!("f:{k}"), json!({}));
            }
            f_meta.insert("f:labels".into(), Value::Object(l));
        }
        let mut fields_v1 = serde_json::Map::new();
        if !secret && !spec.binary_data.is_empty() {
            let mut b = serde_json::Map::from_iter([(".".to_string(), json!({}))]);
            for k in spec.binary_data.keys() {
                b.insert(format!("f:{k}"), json!({}));
            }
            fields_v1.insert("f:binaryData".into(), Value::Object(b));
        }
        if !fields.is_empty() {
            fields.insert(".".into(), json!({}));
            fields_v1.insert("f:data".into(), Value::Object(fields));
        }
        if spec.immutable.is_some() {
            fields_v1.insert("f:immutable".into(), json!({}));
        }
        fields_v1.insert("f:metadata".into(), Value::Object(f_meta));
        if secret {
            fields_v1.insert("f:type".into(), json!({}));
        }

        let meta = MetaOut {
            name: &spec.name,
            namespace: &spec.namespace,
            uid: &uid,
            resource_version: rv.to_string(),
            creation_timestamp: &created,
            labels: &spec.labels,
            annotations: &spec.annotations,
            managed_fields: [ManagedField {
                manager: "kubectl-client-side-apply",
                operation: "Update",
                api_version: "v1",
                time: managed_time,
                fields_type: "FieldsV1",
                fields_v1: Value::Object(fields_v1),
            }],
        };
        let meta_json = serde_json::to_vec(&meta).expect("JSON of plain maps");

        let mut item = Vec::with_capacity(meta_json.len() + 64);
        item.extend_from_slice(b"{\"metadata\":");
        item.extend_from_slice(&meta_json);
        if let Some(immutable) = spec.immutable {
            write!(ByteWriter(&mut item), ",\"immutable\":{immutable}").expect("vec write");
        }
        let b64 = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
        if let Some(kind) = &spec.secret {
            // Go's Secret: immutable, data (base64, keys sorted), type.
            let data: BTreeMap<&String, String> = (spec.data.iter())
                .map(|(k, v)| (k, b64(v.as_bytes())))
                .chain(spec.binary_data.iter().map(|(k, v)| (k, b64(v))))
                .collect();
            if !data.is_empty() {
                item.extend_from_slice(b",\"data\":");
                serde_json::to_writer(&mut item, &data).expect("vec write");
            }
            item.extend_from_slice(b",\"type\":");
            serde_json::to_writer(&mut item, kind).expect("vec write");
        }
        if !secret && !spec.data.is_empty() {
            item.extend_from_slice(b",\"data\":");
            serde_json::to_writer(&mut item, &spec.data).expect("vec write");
        }
        if !secret && !spec.binary_data.is_empty() {
            let b64: BTreeMap<&String, String> =
                spec.binary_data.iter().map(|(k, v)| (k, b64(v))).collect();
            item.extend_from_slice(b",\"binaryData\":");
            serde_json::to_writer(&mut item, &b64).expect("vec write");
        }
        item.push(b'}');
        Object {
            spec,
            uid,
            resource_version: rv,
            creation_timestamp: created,
            item_json: go_json(item),
            meta_json: go_json(meta_json),
        }
    }

    pub fn key(&self) -> String {
        self.spec.key()
    }

    /// The object as a single GET returns it.
    pub fn get_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.item_json.len() + 40);
        out.extend_from_slice(b"{\"kind\":\"");
        out.extend_from_slice(self.spec.kind().as_bytes());
        out.extend_from_slice(b"\",\"apiVersion\":\"v1\",");
        out.extend_from_slice(&self.item_json[1..]);
        out
    }

    /// The object as a `PartialObjectMetadata`.
    pub fn partial_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.meta_json.len() + 80);
        out.extend_from_slice(
            b"{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":",
        );
        out.extend_from_slice(&self.meta_json);
        out.push(b'}');
        out
    }
}

/// `metadata` in Go's field order (serde_json's maps would sort the keys).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct MetaOut<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    resource_version: String,
    creation_timestamp: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: &'a BTreeMap<String, String>,
    managed_fields: [ManagedField<'a>; 1],
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ManagedField<'a> {
    manager: &'a str,
    operation: &'a str,
    api_version: &'a str,
    time: &'a str,
    fields_type: &'a str,
    #[serde(rename = "fieldsV1")]
    fields_v1: Value,
}

/// Go's `encoding/json` escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings; serde_json
/// does not. Those characters can only occur inside JSON strings, so a byte-level pass over
/// serde_json's output gives Go's bytes.
pub fn go_json(v: Vec<u8>) -> Vec<u8> {
    let special = |w: &[u8]| matches!(w, [b'<' | b'>' | b'&', ..] | [0xe2, 0x80, 0xa8 | 0xa9, ..]);
    if !(0..v.len()).any(|i| special(&v[i..])) {
        return v;
    }
    let mut out = Vec::with_capacity(v.len() + 16);
    let mut i = 0;
    while i < v.len() {
        match &v[i..] {
            [b'<', ..] => out.extend_from_slice(b"\\u003c"),
            [b'>', ..] => out.extend_from_slice(b"\\u003e"),
            [b'&', ..] => out.extend_from_slice(b"\\u0026"),
            [0xe2, 0x80, 0xa8, ..] => {
                out.extend_from_slice(b"\\u2028");
                i += 2;
            }
            [0xe2, 0x80, 0xa9, ..] => {
                out.extend_from_slice(b"\\u2029");
                i += 2;
            }
            [b, ..] => out.push(*b),
            [] => unreachable!("i < len"),
        }
        i += 1;
    }
    out
}

struct ByteWriter<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for ByteWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Why a write was refused (the apiserver would answer 422 or 404).
#[derive(Debug, PartialEq)]
pub enum WriteError {
    Immutable(String),
    NotFound(String),
}

/// Why a read at a revision cannot be served.
#[derive(Debug, PartialEq)]
pub enum ReadError {
    /// The revision was compacted away (410 Expired).
    Compacted,
    /// The revision is newer than the store (504 "Too large resource version").
    Future,
}

struct Version {
    rev: u64,
    obj: Option<Arc<Object>>,
}

pub struct Store {
    rev: u64,
    compacted: u64,
    keys: BTreeMap<String, Vec<Version>>,
    seed: u64,
}

impl Store {
    pub fn new(start_rev: u64) -> Store {
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Store {
            rev: start_rev,
            compacted: 0,
            keys: BTreeMap::new(),
            seed,
        }
    }

    pub fn revision(&self) -> u64 {
        self.rev
    }

    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    fn current(&self, key: &str) -> Option<&Arc<Object>> {
        self.keys.get(key)?.last()?.obj.as_ref()
    }

    /// A random (v4-shaped) UID.
    fn uid(&mut self) -> String {
        let mut next = || {
            // SplitMix64: plenty for unique test UIDs.
            self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let (a, b) = (next(), next());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    /// Creates or updates: a new object gets a new uid; an update keeps uid and creation
    /// time. Every write bumps the revision.
    pub fn put(&mut self, spec: ConfigMap) -> Result<Arc<Object>, WriteError> {
        let key = spec.key();
        let now = now_rfc3339();
        let (uid, created) = match self.current(&key) {
            Some(old) => {
                if old.spec.immutable == Some(true)
                    && (old.spec.data != spec.data
                        || old.spec.binary_data != spec.binary_data
                        || spec.immutable != Some(true))
                {
                    return Err(WriteError::Immutable(format!(
                        "{} \"{}\" is invalid: data: Forbidden: field is immutable when `immutable` is set",
                        spec.kind(),
                        spec.name
                    )));
                }
                (old.uid.clone(), old.creation_timestamp.clone())
            }
            None => (self.uid(), now.clone()),
        };
        self.rev += 1;
        let obj = Arc::new(Object::new(spec, uid, self.rev, created, &now));
        self.keys.entry(key).or_default().push(Version {
            rev: self.rev,
            obj: Some(obj.clone()),
        });
        Ok(obj)
    }

    /// Deletes the object at `key` (see `key()`).
    pub fn delete(&mut self, key: &str) -> Result<(), WriteError> {
        let name = key.rsplit('/').next().unwrap_or(key);
        if self.current(key).is_none() {
            return Err(WriteError::NotFound(name.to_string()));
        }
        self.rev += 1;
        self.keys.entry(key.to_string()).or_default().push(Version {
            rev: self.rev,
            obj: None,
        });
        Ok(())
    }

    /// A write to some other resource: the revision moves, nothing here changes.
    pub fn bump(&mut self) {
        self.rev += 1;
    }

    /// Forgets history older than `rev`, as etcd compaction does.
    pub fn compact(&mut self, rev: u64) {
        let rev = rev.min(self.rev);
        self.keys.retain(|_, versions| {
            let keep_from = versions.iter().rposition(|v| v.rev <= rev).unwrap_or(0);
            versions.drain(..keep_from);
            !(versions.len() == 1 && versions[0].obj.is_none())
        });
        self.compacted = self.compacted.max(rev);
    }

    fn check_rev(&self, rev: u64) -> Result<(), ReadError> {
        if rev < self.compacted {
            Err(ReadError::Compacted)
        } else if rev > self.rev {
            Err(ReadError::Future)
        } else {
            Ok(())
        }
    }

    /// The object at `key` as of `rev`.
    pub fn get_at(&self, key: &str, rev: u64) -> Result<Option<Arc<Object>>, ReadError> {
        self.check_rev(rev)?;
        Ok(self.keys.get(key).and_then(|vs| at(vs, rev)))
    }

    /// Objects whose key starts with `prefix`, from `start` (inclusive) on, as of `rev`, in
    /// key order.
    pub fn range_at(
        &self,
        prefix: &str,
        start: &str,
        rev: u64,
    ) -> Result<Vec<Arc<Object>>, ReadError> {
        self.check_rev(rev)?;
        let from = if start.is_empty() { prefix } else { start };
        Ok(self
            .keys
            .range(from.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter_map(|(_, vs)| at(vs, rev))
            .collect())
    }

    /// Every current object (for tests).
    pub fn all(&self) -> Vec<Arc<Object>> {
        self.keys
            .values()
            .filter_map(|vs| vs.last()?.obj.clone())
            .collect()
    }
}

fn at(versions: &[Version], rev: u64) -> Option<Arc<Object>> {
    versions
        .iter()
        .rev()
        .find(|v| v.rev <= rev)
        .and_then(|v| v.obj.clone())
}

/// The current time as the apiserver writes it (RFC 3339, seconds, UTC).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(ns: &str, name: &str, v: &str) -> ConfigMap {
        ConfigMap::new(ns, name).data("k", v)
    }

    #[test]
    fn reads_as_of_a_revision_and_expires_on_compaction() {
        let mut s = Store::new(100);
        let a1 = s.put(cm("a", "x", "1")).unwrap();
        let r1 = s.revision();
        let a2 = s.put(cm("a", "x", "2")).unwrap();
        assert_eq!(a1.uid, a2.uid, "an update keeps the uid");
        s.delete("configmaps/a/x").unwrap();
        let a3 = s.put(cm("a", "x", "3")).unwrap();
        assert_ne!(a1.uid, a3.uid, "a re-create gets a new uid");
        let old = s.range_at("", "", r1).unwrap();
        assert_eq!(old[0].spec.data["k"], "1");
        assert_eq!(
            s.range_at("", "", s.revision() + 1).err(),
            Some(ReadError::Future)
        );
        s.compact(s.revision());
        assert_eq!(s.range_at("", "", r1).err(), Some(ReadError::Compacted));
        assert_eq!(s.range_at("", "", s.revision()).unwrap().len(), 1);
    }

    #[test]
    fn keys_sort_like_etcd() {
        let mut s = Store::new(1);
        s.put(cm("a", "x", "1")).unwrap();
        s.put(cm("a-b", "y", "1")).unwrap();
        let keys: Vec<String> = s.all().iter().map(|o| o.key()).collect();
        assert_eq!(
            keys,
            ["configmaps/a-b/y", "configmaps/a/x"],
            "'-' sorts before '/'"
        );
        let ns_a = s.range_at("configmaps/a/", "", s.revision()).unwrap();
        assert_eq!(ns_a.len(), 1);
    }

    #[test]
    fn immutable_data_cannot_change() {
        let mut s = Store::new(1);
        s.put(cm("a", "x", "1").immutable(true)).unwrap();
        assert!(matches!(
            s.put(cm("a", "x", "2").immutable(true)),
            Err(WriteError::Immutable(_))
        ));
        s.put(cm("a", "x", "1").immutable(true).label("l", "v"))
            .unwrap();
    }

    #[test]
    fn escapes_like_go() {
        assert_eq!(
            go_json("{\"a\":\"<b>&\u{2028}x\"}".as_bytes().to_vec()),
            br#"{"a":"\u003cb\u003e\u0026\u2028x"}"#.to_vec()
        );
        let plain = br#"{"a":"b"}"#.to_vec();
        assert_eq!(go_json(plain.clone()), plain);
    }

    #[test]
    fn encodes_like_the_apiserver() {
        let mut s = Store::new(1);
        let o = s
            .put(
                ConfigMap::new("team-b", "edge")
                    .label("w", "true")
                    .data("README", "hi\n")
                    .binary("b.bin", &[0, 1, 2, 253, 254, 255])
                    .immutable(true),
            )
            .unwrap();
        let v: Value = serde_json::from_slice(&o.item_json).unwrap();
        assert_eq!(v["binaryData"]["b.bin"], "AAEC/f7/");
        assert_eq!(v["immutable"], true);
        assert_eq!(v["metadata"]["resourceVersion"], "2");
        assert!(v.get("kind").is_none(), "list items carry no kind");
        let text = String::from_utf8(o.item_json.clone()).unwrap();
        let order: Vec<usize> = [
            "\"metadata\"",
            "\"immutable\"",
            "\"data\"",
            "\"binaryData\"",
        ]
        .iter()
        .map(|f| text.find(f).unwrap())
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "Go field order");
        let get: Value = serde_json::from_slice(&o.get_json()).unwrap();
        assert_eq!(get["kind"], "ConfigMap");
        let partial: Value = serde_json::from_slice(&o.partial_json()).unwrap();
        assert!(partial.get("data").is_none());
        assert!(partial["metadata"]["managedFields"].is_array());
    }

    #[test]
    fn secrets_are_base64_data_with_a_type_beside_configmaps() {
        let mut s = Store::new(1);
        s.put(cm("a", "x", "1")).unwrap();
        let o = s
            .put(
                ConfigMap::secret("a", "x")
                    .data("password", "hunter2")
                    .binary("key.der", &[0, 255]),
            )
            .unwrap();
        assert_eq!(o.key(), "secrets/a/x");
        assert_eq!(
            s.all().len(),
            2,
            "a Secret and a ConfigMap may share a name"
        );
        let v: Value = serde_json::from_slice(&o.item_json).unwrap();
        assert_eq!(v["data"]["password"], "aHVudGVyMg==");
        assert_eq!(v["data"]["key.der"], "AP8=");
        assert_eq!(v["type"], "Opaque");
        assert!(v.get("binaryData").is_none());
        let text = String::from_utf8(o.item_json.clone()).unwrap();
        assert!(text.find("\"data\"").unwrap() < text.find("\"type\"").unwrap());
        let get: Value = serde_json::from_slice(&o.get_json()).unwrap();
        assert_eq!(get["kind"], "Secret");
        let partial = String::from_utf8(o.partial_json()).unwrap();
        assert!(!partial.contains("aHVudGVyMg=="), "{partial}");
    }
}
