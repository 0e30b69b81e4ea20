//! The `cmpoll.io/held-back` annotation: how a hub under `--validate` says, in the object
//! it serves, that this is the last good version and not the newest (whose hash the
//! annotation's value is). It is written into the object's JSON where the apiserver would
//! write it — `annotations` after `labels` and before `ownerReferences`, `finalizers` and
//! `managedFields` (ObjectMeta's field order), its keys in byte order (Go's map order) —
//! and every other byte stays as the apiserver sent it, so the object's data, and so its
//! hash, do not change.

use std::ops::Range;

use crate::source::RawObject;

/// The annotation a held-back object carries (SPEC's name).
pub const HELD_BACK: &str = "cmpoll.io/held-back";

/// ObjectMeta's fields that come after `annotations` in the apiserver's JSON.
const AFTER_ANNOTATIONS: [&str; 3] = ["ownerReferences", "finalizers", "managedFields"];

/// `raw` with `HELD_BACK: value` among its annotations (replacing one already there);
/// `None` when its metadata is not the JSON object a served object has.
pub fn held_back(raw: &RawObject, value: &str) -> Option<RawObject> {
    let meta = raw.metadata.clone();
    let outer = members(raw.json.get(meta.clone())?)?;
    let pair = format!("\"{HELD_BACK}\":{}", quoted(value));
    let (at, cut, text) = match outer.iter().find(|m| m.key == "annotations") {
        Some(a) => {
            let within = &raw.json[meta.start + a.value.start..meta.start + a.value.end];
            let inner = members(within)?;
            let base = meta.start + a.value.start;
            match inner.iter().find(|m| m.key.as_str() >= HELD_BACK) {
                Some(m) if m.key == HELD_BACK => {
                    let v = base + m.value.start..base + m.value.end;
                    (v.start, v.end - v.start, quoted(value))
                }
                Some(m) => (base + m.start, 0, format!("{pair},")),
                // After the last one, before the closing brace.
                None => {
                    let close = base + within.len() - 1;
                    let comma = if inner.is_empty() { "" } else { "," };
                    (close, 0, format!("{comma}{pair}"))
                }
            }
        }
        None => {
            let field = format!("\"annotations\":{{{pair}}}");
            match outer
                .iter()
                .find(|m| AFTER_ANNOTATIONS.contains(&m.key.as_str()))
            {
                Some(m) => (meta.start + m.start, 0, format!("{field},")),
                None => {
                    let close = meta.end - 1;
                    let comma = if outer.is_empty() { "" } else { "," };
                    (close, 0, format!("{comma}{field}"))
                }
            }
        }
    };
    let mut json = Vec::with_capacity(raw.json.len() + text.len());
    json.extend_from_slice(&raw.json[..at]);
    json.extend_from_slice(text.as_bytes());
    json.extend_from_slice(&raw.json[at + cut..]);
    let grown = text.len() as isize - cut as isize;
    let end = (meta.end as isize + grown) as usize;
    Some(RawObject {
        json: json.into_boxed_slice(),
        metadata: meta.start..end,
    })
}

/// A JSON string (the value is a hash: nothing in it needs escaping, but it is escaped
/// as JSON would be all the same).
fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// One member of a JSON object: its key (decoded), where the key starts and where its
/// value lies, relative to the object's first byte.
struct Member {
    key: String,
    start: usize,
    value: Range<usize>,
}

/// The members of the JSON object `b` (nothing but the object, whitespace around it
/// allowed), or `None` if it is not one.
fn members(b: &[u8]) -> Option<Vec<Member>> {
    let mut i = skip_space(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_space(b, i + 1);
    let mut out = Vec::new();
    if b.get(i) == Some(&b'}') {
        return (skip_space(b, i + 1) == b.len()).then_some(out);
    }
    loop {
        let start = i;
        let key_end = string_end(b, i)?;
        let key: String = serde_json::from_slice(&b[start..key_end]).ok()?;
        i = skip_space(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let v = skip_space(b, i + 1);
        let v_end = value_end(b, v)?;
        out.push(Member {
            key,
            start,
            value: v..v_end,
        });
        i = skip_space(b, v_end);
        match b.get(i) {
            Some(b',') => i = skip_space(b, i + 1),
            Some(b'}') => return (skip_space(b, i + 1) == b.len()).then_some(out),
            _ => return None,
        }
    }
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while b
        .get(i)
        .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
    {
        i += 1;
    }
    i
}

/// Where the string starting at `b[i]` (a `"`) ends, past its closing quote.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        match *b.get(j)? {
            b'"' => return Some(j + 1),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
}

/// Where the JSON value starting at `b[i]` ends.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match *b.get(j)? {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while b
                .get(j)
                .is_some_and(|c| !matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "sha256:00ff";

    fn raw(json: &str) -> RawObject {
        let m = json.find("\"metadata\":").unwrap() + "\"metadata\":".len();
        let end = value_end(json.as_bytes(), m).unwrap();
        RawObject {
            json: json.as_bytes().into(),
            metadata: m..end,
        }
    }

    fn annotated(json: &str) -> String {
        let r = held_back(&raw(json), H).unwrap();
        let s = String::from_utf8(r.json.to_vec()).unwrap();
        // The range still is the metadata, and the whole still is JSON.
        let meta: serde_json::Value = serde_json::from_slice(r.metadata()).unwrap();
        assert_eq!(meta["annotations"][HELD_BACK], H, "{s}");
        let _: serde_json::Value = serde_json::from_str(&s).unwrap();
        s
    }

    #[test]
    fn the_annotation_goes_where_the_apiserver_writes_it() {
        // After labels, before managedFields; the data untouched.
        assert_eq!(
            annotated(
                r#"{"metadata":{"name":"a","labels":{"x":"1"},"managedFields":[{"m":"k"}]},"data":{"k":"v"}}"#
            ),
            r#"{"metadata":{"name":"a","labels":{"x":"1"},"annotations":{"cmpoll.io/held-back":"sha256:00ff"},"managedFields":[{"m":"k"}]},"data":{"k":"v"}}"#
        );
        // Without labels or later fields: last.
        assert_eq!(
            annotated(r#"{"metadata":{"name":"a","uid":"u"},"data":{}}"#),
            r#"{"metadata":{"name":"a","uid":"u","annotations":{"cmpoll.io/held-back":"sha256:00ff"}},"data":{}}"#
        );
        // Among others, in byte order; escapes in the others kept as they came.
        assert_eq!(
            annotated(
                r#"{"metadata":{"annotations":{"a":"x\u0026y","cmpoll.io/rollout":"none","z":"}"}}}"#
            ),
            r#"{"metadata":{"annotations":{"a":"x\u0026y","cmpoll.io/held-back":"sha256:00ff","cmpoll.io/rollout":"none","z":"}"}}}"#
        );
        assert_eq!(
            annotated(r#"{"metadata":{"annotations":{"a":"1"}}}"#),
            r#"{"metadata":{"annotations":{"a":"1","cmpoll.io/held-back":"sha256:00ff"}}}"#
        );
        assert_eq!(
            annotated(r#"{"metadata":{"annotations":{}}}"#),
            r#"{"metadata":{"annotations":{"cmpoll.io/held-back":"sha256:00ff"}}}"#
        );
        // One already there (a hub behind a hub, or a copy of a served object) replaced.
        assert_eq!(
            annotated(r#"{"metadata":{"annotations":{"cmpoll.io/held-back":"sha256:aa"}}}"#),
            r#"{"metadata":{"annotations":{"cmpoll.io/held-back":"sha256:00ff"}}}"#
        );
        assert_eq!(
            annotated(r#"{"metadata":{}}"#),
            r#"{"metadata":{"annotations":{"cmpoll.io/held-back":"sha256:00ff"}}}"#
        );
    }

    #[test]
    fn metadata_that_is_not_an_object_is_refused() {
        for bad in [
            r#"{"metadata":null}"#,
            r#"{"metadata":{"annotations":[1]}}"#,
            r#"{"metadata":{"a" 1}}"#,
            r#"{"metadata":{"a":1,}}"#,
        ] {
            let m = bad.find("\"metadata\":").unwrap() + "\"metadata\":".len();
            let r = RawObject {
                json: bad.as_bytes().into(),
                metadata: m..bad.len() - 1,
            };
            assert!(held_back(&r, H).is_none(), "{bad}");
        }
    }
}
