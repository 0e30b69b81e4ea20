//! URLs in logs and errors, and credentials in URLs.
//!
//! A URL may carry a password (userinfo) or a token (query string); `redact` makes it fit
//! for a log line or an error, `scrub` takes those parts out of any text (an error message
//! of the HTTP stack), and `split_userinfo` turns userinfo into a basic-auth header so the
//! HTTP stack never sees it.

use base64::Engine as _;

use crate::secret::Secret;

/// A URL fit for a log line or an error: userinfo and the query string replaced by
/// `[REDACTED]`, the fragment dropped.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), url),
    };
    let rest = rest.split('#').next().unwrap_or("");
    let (before_query, query) = match rest.split_once('?') {
        Some((b, _)) => (b, "?[REDACTED]"),
        None => (rest, ""),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("[REDACTED]@{host}"),
        None => authority.to_string(),
    };
    format!("{scheme}{authority}{path}{query}")
}

/// The parts of a URL that must never reach a log line: its userinfo (and each half of
/// it) and its query string, longest first.
pub fn secret_parts(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let mut parts = Vec::new();
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        parts.extend(userinfo.split(':').map(str::to_string));
        parts.push(userinfo.to_string());
    }
    if let Some((_, q)) = rest.split_once('?') {
        parts.push(q.split('#').next().unwrap_or("").to_string());
    }
    parts.retain(|p| !p.is_empty());
    parts.sort_by_key(|p| std::cmp::Reverse(p.len()));
    parts
}

/// `text` with every one of `secrets` replaced by `[REDACTED]`.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets {
        out = out.replace(s.as_str(), "[REDACTED]");
    }
    out
}

/// The URL without its userinfo, and the userinfo as a basic-auth header value (both
/// halves percent-decoded, as curl and browsers read them).
pub fn split_userinfo(url: &str) -> (String, Option<Secret>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return (url.to_string(), None);
    };
    let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let raw = format!("{}:{}", percent_decode(user), percent_decode(pass));
    let header = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    );
    (
        format!("{scheme}://{host}{tail}"),
        Some(Secret::new(header)),
    )
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| char::from(c).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 3 <= b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_urls_keep_no_userinfo_or_query() {
        for (url, want) in [
            (
                "http://admin:secret@h:8080/-/reload",
                "http://[REDACTED]@h:8080/-/reload",
            ),
            ("https://h/x?token=abc#f", "https://h/x?[REDACTED]"),
            ("http://u@h", "http://[REDACTED]@h"),
            ("http://h/a@b", "http://h/a@b"),
            ("http://h:1/p", "http://h:1/p"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    #[test]
    fn userinfo_becomes_basic_auth_and_never_shows() {
        let (bare, auth) = split_userinfo("http://admin:s%40cret@h:9/-/reload?x=1");
        assert_eq!(bare, "http://h:9/-/reload?x=1");
        // printf 'admin:s@cret' | base64
        assert_eq!(auth.unwrap().expose(), "Basic YWRtaW46c0BjcmV0");
        assert_eq!(split_userinfo("http://h/a@b").1, None);
        let parts = secret_parts("http://admin:secret@h/p?token=t0k");
        let scrubbed = scrub("POST http://admin:secret@h/p?token=t0k: refused", &parts);
        assert!(
            !scrubbed.contains("secret") && !scrubbed.contains("t0k"),
            "{scrubbed}"
        );
    }
}
