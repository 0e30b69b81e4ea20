//! URLs in logs and errors, and credentials in URLs.
//!
//! A URL may carry a password (userinfo) or a token (query string); `redact` makes it fit
//! for a log line or an error, `scrub` takes those parts out of any text (an error message
//! of the HTTP stack), and `split_userinfo` turns userinfo into a basic-auth header so the
//! HTTP stack never sees it.

use base64::Engine as _;
use percent_encoding::percent_decode_str;

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

/// A URL without its userinfo, query string and fragment: how a fetched URL is named in
/// an event or a log line.
pub fn bare(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), url),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{scheme}{host}{path}")
}

/// A URL's origin, `scheme://host:port` (the scheme and host lowercase, the port given or
/// the scheme's own): where credentials meant for one server may go. `None` for a URL
/// that is not http or https.
pub fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match host_port.rsplit_once(':') {
        // `[::1]:8080`, `h:8080`; not the colons inside `[::1]`.
        Some((h, p)) if !p.contains(']') => (h, p.parse().ok()?),
        _ => (host_port, default),
    };
    if host.is_empty() {
        return None;
    }
    Some(format!("{scheme}://{}:{port}", host.to_ascii_lowercase()))
}

/// Where a redirect's `Location` leads from `url`: absolute, scheme-relative, absolute
/// path, or relative to `url`'s folder.
pub fn join(url: &str, location: &str) -> Option<String> {
    let location = location.trim();
    if location.starts_with("http://") || location.starts_with("https://") {
        return Some(location.to_string());
    }
    let (scheme, rest) = url.split_once("://")?;
    if let Some(rest) = location.strip_prefix("//") {
        return Some(format!("{scheme}://{rest}"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if location.starts_with('/') {
        return Some(format!("{scheme}://{authority}{location}"));
    }
    let path = rest[authority.len()..]
        .split(['?', '#'])
        .next()
        .unwrap_or("");
    let folder = path.rsplit_once('/').map_or("", |(f, _)| f);
    Some(format!("{scheme}://{authority}{folder}/{location}"))
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

/// A query string's value: `%2F` → `/`; `+` is a space, as in a form (Go's
/// `url.ParseQuery`). An invalid escape is an error.
pub fn form_decoded(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let broken = (b.iter().enumerate()).any(|(i, c)| {
        *c == b'%' && !(b.get(i + 1..i + 3)).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if broken {
        return Err(format!("'{s}' has a broken %-escape"));
    }
    let spaced = s.replace('+', " ");
    (percent_decode_str(&spaced).decode_utf8())
        .map(|v| v.into_owned())
        .map_err(|_| format!("'{s}' is not UTF-8"))
}

fn percent_decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
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
    fn bare_urls_origins_and_redirects() {
        assert_eq!(bare("https://u:p@h:8/a/b?token=t#f"), "https://h:8/a/b");
        assert_eq!(bare("http://h"), "http://h");
        for (url, want) in [
            ("http://H.example/x", Some("http://h.example:80")),
            ("https://u:p@h/x", Some("https://h:443")),
            ("https://h:8443", Some("https://h:8443")),
            ("http://[::1]:9/x", Some("http://[::1]:9")),
            ("http://[::1]/x", Some("http://[::1]:80")),
            ("ftp://h/x", None),
            ("http:///x", None),
        ] {
            assert_eq!(origin(url).as_deref(), want, "{url}");
        }
        for (loc, want) in [
            ("https://o/y", "https://o/y"),
            ("//o/y", "http://o/y"),
            ("/y?z", "http://h:1/y?z"),
            ("y", "http://h:1/a/y"),
        ] {
            assert_eq!(
                join("http://h:1/a/b?q", loc).as_deref(),
                Some(want),
                "{loc}"
            );
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
