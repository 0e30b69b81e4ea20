//! A request's query, read as the apiserver reads it: Go's `url.ParseQuery` (pairs split
//! on `&`; a pair with a `;` or a broken `%`-escape is left out, never an error; `+` is a
//! space) and apimachinery's parameter codec (the **first** value of a repeated key is the
//! one taken; a boolean is true unless it is `0` or `false` in any case — `watch=`,
//! `watch=yes` and `watch=1` all watch; a number that does not parse is a decode error).
//! The hub reads every parameter through this, so that a request a client can shape means
//! what it means to the apiserver.

use percent_encoding::percent_decode_str;

/// The decoded pairs of a query, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Reads `raw` (the part of the target after `?`) as Go's `url.ParseQuery` does.
    pub fn parse(raw: &str) -> Query {
        let pairs = (raw.split('&'))
            .filter(|p| !p.is_empty() && !p.contains(';'))
            .filter_map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                Some((unescape(k)?, unescape(v)?))
            })
            .collect();
        Query(pairs)
    }

    /// The first value of `key` (`None`: absent), as the parameter codec takes it.
    pub fn first(&self, key: &str) -> Option<&str> {
        (self.0.iter())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// apimachinery's boolean of `key`: `None` when absent, else true unless `0` or
    /// `false` in any case, as Go's `strings.EqualFold` folds it.
    pub fn flag(&self, key: &str) -> Option<bool> {
        self.first(key)
            .map(|v| !(v == "0" || go_equal_fold(v, "false")))
    }

    /// The number `key` holds, as the codec's `string_to_int64`: `Ok(None)` when absent,
    /// `Err` with the codec's words when it is not a number.
    pub fn int(&self, key: &str) -> Result<Option<i64>, String> {
        match self.first(key) {
            None => Ok(None),
            // Go's strconv.ParseInt: an optional sign, decimal digits, within 64 bits.
            Some(v) => v
                .parse::<i64>()
                .map(Some)
                .map_err(|_| format!("strconv.ParseInt: parsing {}: invalid syntax", go_quote(v))),
        }
    }
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte; `None` for a broken escape.
/// Bytes that are not UTF-8 are kept as replacement characters (Go keeps them as bytes;
/// no selector or version of either side accepts them).
fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let broken = (b.iter().enumerate()).any(|(i, c)| {
        *c == b'%' && !(b.get(i + 1..i + 3)).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if broken {
        return None;
    }
    let spaced = s.replace('+', " ");
    Some(percent_decode_str(&spaced).decode_utf8_lossy().into_owned())
}

/// Go's `strings.EqualFold` of `v` and `lower` (ASCII lowercase letters): the same under
/// Unicode simple case folding. Of the letters such a word may hold, only `k` and `s` fold
/// with more than their upper case: `K` (the Kelvin sign, U+212A) and `ſ` (long s,
/// U+017F) — `fal\u{17f}e` is `false` to the apiserver.
fn go_equal_fold(v: &str, lower: &str) -> bool {
    let mut v = v.chars();
    for want in lower.chars() {
        let Some(c) = v.next() else { return false };
        let same = c.to_ascii_lowercase() == want
            || (want == 'k' && c == '\u{212a}')
            || (want == 's' && c == '\u{17f}');
        if !same {
            return false;
        }
    }
    v.next().is_none()
}

/// Go's `%q` of a short string, for the codec's messages.
fn go_quote(s: &str) -> String {
    crate::names::go_quote(s)
}

/// Whether `name` may be a path segment, as apimachinery's `IsPathSegmentName` says: the
/// apiserver takes a `fieldSelector` `metadata.name` as the request's name (for its
/// authorizer) only then.
pub fn is_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_as_go_reads_them() {
        let q = Query::parse("watch=false&watch=true&a=%zz&b;c=1&labelSelector=x+in+(a%2Cb)&&e");
        // The first of a repeated key; a broken escape or a `;` leaves the pair out.
        assert_eq!(q.first("watch"), Some("false"));
        assert_eq!(q.first("a"), None);
        assert_eq!(q.first("b"), None);
        assert_eq!(q.first("labelSelector"), Some("x in (a,b)"));
        assert_eq!(q.first("e"), Some(""));
    }

    #[test]
    fn booleans_as_apimachinery_reads_them() {
        // runtime.Convert_Slice_string_To_bool: only "0" and "false" (any case) are false.
        for (v, want) in [
            ("true", true),
            ("1", true),
            ("", true),
            ("yes", true),
            ("t", true),
            ("0", false),
            ("false", false),
            ("FALSE", false),
            ("False", false),
        ] {
            let q = Query::parse(&format!("watch={v}"));
            assert_eq!(q.flag("watch"), Some(want), "watch={v}");
        }
        assert_eq!(Query::parse("watchx=1").flag("watch"), None);
        // strings.EqualFold's Unicode folding: the long s is an s (and nothing else is).
        assert_eq!(Query::parse("watch=fal%C5%BFe").flag("watch"), Some(false));
        assert_eq!(Query::parse("watch=FAL%C5%BFE").flag("watch"), Some(false));
        assert_eq!(Query::parse("watch=fals").flag("watch"), Some(true));
        assert_eq!(Query::parse("watch=falsee").flag("watch"), Some(true));
        assert_eq!(Query::parse("watch=f%C3%A4lse").flag("watch"), Some(true));
        // A bare key is an empty value: true.
        assert_eq!(Query::parse("watch").flag("watch"), Some(true));
    }

    #[test]
    fn numbers_as_the_codec_reads_them() {
        let q = Query::parse("limit=5&timeoutSeconds=x&n=-3&big=99999999999999999999");
        assert_eq!(q.int("limit"), Ok(Some(5)));
        assert_eq!(q.int("n"), Ok(Some(-3)));
        assert_eq!(q.int("absent"), Ok(None));
        assert_eq!(
            q.int("timeoutSeconds").unwrap_err(),
            "strconv.ParseInt: parsing \"x\": invalid syntax"
        );
        assert!(q.int("big").is_err());
    }

    #[test]
    fn path_segment_names() {
        assert!(is_path_segment_name("a.b-c"));
        for bad in [".", "..", "a/b", "a%2f"] {
            assert!(!is_path_segment_name(bad), "{bad}");
        }
    }
}
