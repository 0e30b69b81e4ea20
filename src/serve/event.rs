//! A watch event's words and framing, as the apiserver writes them in JSON: its type,
//! `{"type":TYPE,"object":OBJECT}\n`, and an object's resourceVersion set to another.

use crate::https::http::Body;

/// An event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Added,
    Modified,
    Deleted,
}

impl Type {
    pub fn word(self) -> &'static str {
        match self {
            Type::Added => "ADDED",
            Type::Modified => "MODIFIED",
            Type::Deleted => "DELETED",
        }
    }
}

/// `{"type":TYPE,"object":OBJECT}\n`, as the apiserver frames a watch event in JSON.
pub fn frame(word: &str, object: &[u8]) -> Body {
    let mut out = Vec::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(word.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    out.into()
}

pub fn trim_newline(b: &[u8]) -> &[u8] {
    b.strip_suffix(b"\n").unwrap_or(b)
}

/// `json` (an object as rendered) with its `metadata.resourceVersion` set to `rv`: the
/// first `"resourceVersion":"…"` after `"metadata":{`, where apimachinery writes it.
pub fn with_resource_version(json: &[u8], rv: u64) -> Vec<u8> {
    let key = b"\"resourceVersion\":\"";
    let start = find(json, b"\"metadata\":{").map(|m| m + 12);
    let at = start.and_then(|s| find(&json[s..], key).map(|i| s + i + key.len()));
    let Some(at) = at else {
        return json.to_vec();
    };
    let Some(end) = json[at..].iter().position(|b| *b == b'"').map(|e| at + e) else {
        return json.to_vec();
    };
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(&json[..at]);
    out.extend_from_slice(rv.to_string().as_bytes());
    out.extend_from_slice(&json[end..]);
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}
