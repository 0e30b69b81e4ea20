//! Answers written as the apiserver writes them (JSON, a `\n` after each): a
//! `ConfigMapList`/`SecretList` whose items are the objects as the apiserver served them,
//! a `PartialObjectMetadataList` (metadata only; `"items":null` when empty, as the real
//! apiserver writes it), one object (the list's item with `kind` and `apiVersion` in
//! front) or its `PartialObjectMetadata`; continue tokens in the apiserver's format
//! (base64url of `{"v":"meta.k8s.io/v1","rv":RV,"start":"KEY\u0000"}`), and gzip.

use std::io::Write as _;
use std::sync::Arc;

use base64::Engine as _;

use super::event::{Type, frame, trim_newline};
use super::held::HeldObject;
use super::request::Form;
use super::status::json_string;
use crate::https::http::Body;
use crate::source::Resource;

/// A page's list metadata beyond its resourceVersion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct More {
    pub continue_token: Option<String>,
    /// Set only for an unfiltered list, as the apiserver does.
    pub remaining: Option<usize>,
}

/// A list of `items` at resourceVersion `rv`.
pub fn list(
    kind: Resource,
    form: Form,
    rv: u64,
    items: &[&Arc<HeldObject>],
    more: &More,
) -> Vec<u8> {
    let size: usize = items.iter().map(|o| o.raw.json.len() + 64).sum();
    let mut out = Vec::with_capacity(size + 256);
    let (list_kind, api_version) = match form {
        Form::Full => (format!("{}List", kind.kind()), "v1"),
        Form::Metadata => ("PartialObjectMetadataList".to_string(), "meta.k8s.io/v1"),
    };
    out.extend_from_slice(
        format!(
            "{{\"kind\":\"{list_kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{{\"resourceVersion\":\"{rv}\""
        )
        .as_bytes(),
    );
    if let Some(t) = &more.continue_token {
        out.extend_from_slice(format!(",\"continue\":{}", json_string(t)).as_bytes());
    }
    if let Some(n) = more.remaining {
        out.extend_from_slice(format!(",\"remainingItemCount\":{n}").as_bytes());
    }
    out.extend_from_slice(b"},\"items\":");
    if items.is_empty() && form == Form::Metadata {
        out.extend_from_slice(b"null}\n");
        return out;
    }
    out.push(b'[');
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match form {
            Form::Full => out.extend_from_slice(&o.raw.json),
            Form::Metadata => metadata_object(&mut out, o),
        }
    }
    out.extend_from_slice(b"]}\n");
    out
}

/// One object.
pub fn object(kind: Resource, form: Form, o: &HeldObject) -> Vec<u8> {
    let mut out = Vec::with_capacity(o.raw.json.len() + 64);
    match form {
        Form::Full => {
            out.extend_from_slice(
                format!("{{\"kind\":\"{}\",\"apiVersion\":\"v1\"", kind.kind()).as_bytes(),
            );
            let rest = o.raw.json.get(1..).unwrap_or_default();
            if rest.first().is_some_and(|b| *b != b'}') {
                out.push(b',');
            }
            out.extend_from_slice(rest);
        }
        Form::Metadata => metadata_object(&mut out, o),
    }
    out.push(b'\n');
    out
}

/// `o`'s watch event of type `t` (`ADDED` or `MODIFIED`), made once for every watcher.
pub fn event(kind: Resource, form: Form, t: Type, o: &HeldObject) -> Body {
    let at = match (form, t) {
        (Form::Full, Type::Added) => 0,
        (Form::Full, _) => 1,
        (Form::Metadata, Type::Added) => 2,
        (Form::Metadata, _) => 3,
    };
    o.events[at]
        .get_or_init(|| frame(t.word(), trim_newline(&object(kind, form, o))))
        .clone()
}

fn metadata_object(out: &mut Vec<u8>, o: &HeldObject) {
    out.extend_from_slice(
        b"{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":",
    );
    let m = o.raw.metadata();
    out.extend_from_slice(if m.is_empty() { b"{}" } else { m });
    out.push(b'}');
}

/// A continue token: go on after `key` (`namespace/name`, or `name` in a namespaced list)
/// of the list at `rv`.
pub fn continue_token(rv: u64, key: &str) -> String {
    let json = format!(
        "{{\"v\":\"meta.k8s.io/v1\",\"rv\":{rv},\"start\":{}}}",
        json_string(&format!("/{key}\u{0}"))
    );
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// A continue token's list version and the key to go on after; the error is the
/// apiserver's words after "invalid continue token: ".
pub fn read_continue(token: &str) -> Result<(u64, String), String> {
    #[derive(serde::Deserialize)]
    struct Token {
        v: String,
        rv: i64,
        start: String,
    }
    let bytes = (base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('=')))
    .map_err(|e| format!("continue key is not valid: {e}"))?;
    let t: Token =
        serde_json::from_slice(&bytes).map_err(|e| format!("continue key is not valid: {e}"))?;
    if t.v != "meta.k8s.io/v1" {
        return Err("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into());
    }
    let rv = u64::try_from(t.rv)
        .ok()
        .filter(|rv| *rv > 0)
        .ok_or_else(|| "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)".to_string())?;
    let key = t
        .start
        .strip_prefix('/')
        .and_then(|k| k.strip_suffix('\u{0}'))
        .filter(|k| !k.is_empty() && !k.split('/').any(|s| s == ".." || s == "."))
        .ok_or_else(|| "continue key is not valid: invalid start".to_string())?;
    Ok((rv, key.to_string()))
}

/// `body`, gzipped.
pub fn gzip(body: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::RawObject;

    fn object_of(json: &str, ns: &str, name: &str) -> Arc<HeldObject> {
        let m = json.find("\"metadata\":").unwrap() + "\"metadata\":".len();
        let end = json[m..].find('}').unwrap() + m + 1;
        Arc::new(HeldObject::new(
            ns.into(),
            name.into(),
            "1".into(),
            Vec::new(),
            RawObject {
                json: json.as_bytes().into(),
                metadata: m..end,
            },
            crate::poll::hash::Hash::of([]),
        ))
    }

    #[test]
    fn lists_and_objects_as_the_apiserver_writes_them() {
        let a = object_of(
            r#"{"metadata":{"name":"m2","namespace":"a-b"},"data":{"x":"y"}}"#,
            "a-b",
            "m2",
        );
        let body = list(
            Resource::ConfigMaps,
            Form::Full,
            218,
            &[&a],
            &More::default(),
        );
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "{\"kind\":\"ConfigMapList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"218\"},\"items\":[{\"metadata\":{\"name\":\"m2\",\"namespace\":\"a-b\"},\"data\":{\"x\":\"y\"}}]}\n"
        );
        let body = list(
            Resource::ConfigMaps,
            Form::Metadata,
            218,
            &[],
            &More::default(),
        );
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "{\"kind\":\"PartialObjectMetadataList\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":{\"resourceVersion\":\"218\"},\"items\":null}\n"
        );
        let body = list(Resource::Secrets, Form::Full, 9, &[], &More::default());
        assert!(
            String::from_utf8(body)
                .unwrap()
                .ends_with("\"items\":[]}\n")
        );
        assert_eq!(
            String::from_utf8(object(Resource::ConfigMaps, Form::Full, &a)).unwrap(),
            "{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"m2\",\"namespace\":\"a-b\"},\"data\":{\"x\":\"y\"}}\n"
        );
        assert_eq!(
            String::from_utf8(object(Resource::ConfigMaps, Form::Metadata, &a)).unwrap(),
            "{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":{\"name\":\"m2\",\"namespace\":\"a-b\"}}\n"
        );
    }

    #[test]
    fn continue_tokens_in_the_apiservers_format() {
        // What the real apiserver sent for `?limit=1` (cluster-wide, then namespaced).
        assert_eq!(
            continue_token(222, "a-b/m2"),
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjIyLCJzdGFydCI6Ii9hLWIvbTJcdTAwMDAifQ"
        );
        assert_eq!(
            continue_token(267, "m1"),
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjY3LCJzdGFydCI6Ii9tMVx1MDAwMCJ9"
        );
        assert_eq!(
            read_continue(
                "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjIyLCJzdGFydCI6Ii9hLWIvbTJcdTAwMDAifQ"
            )
            .unwrap(),
            (222, "a-b/m2".to_string())
        );
        assert!(read_continue("garbage").is_err());
        assert!(read_continue(&continue_token(5, "../x")).is_err());
    }
}
