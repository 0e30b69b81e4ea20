//! Following a `cmpoll serve` hub by watching it: each poll's watch of a scope, from the
//! version the follower holds, ends at the hub's first complete change after it (its
//! events, then a `BOOKMARK` that commits them), or after the follower's wait with the
//! bookmark alone (nothing changed) — the hub's follower watch (`serve::watch`, asked with
//! `kube::client::WAIT_HEADER`). The next poll watches again from the bookmark's version,
//! on the same connection. What a change costs each follower is its events and one
//! bookmark, not the scope's whole list.
//!
//! The Never clauses: what comes before the bookmark is applied only when the bookmark
//! comes (a stream cut, or an answer that is not events, fails the poll: nothing changes);
//! an event or bookmark older than the version held is not taken (a hub behind the one
//! before it); a watch the hub cannot serve from that version (`410 Expired`, its history
//! moved on) is a relist, complete or nothing; a hub that does not watch (405, an older
//! hub) or will not for this token (403: a role without `watch`) is followed with lists.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use super::scope::encode;
use crate::kube::client::Waited;
use crate::kube::{self, Client};

/// What a change's watch said.
pub enum Watched {
    /// Every event up to the bookmark's version (none: nothing changed), in order.
    Commit { rv: u64, events: Vec<Event> },
    /// The hub's history does not reach back to that version: list again.
    TooOld,
    /// The hub does not watch, or not for this token (its words): follow it with lists.
    Refused(String),
}

/// One event of a watch.
#[derive(Debug, PartialEq, Eq)]
pub struct Event {
    pub deleted: bool,
    /// The object, as the hub served it.
    pub object: Vec<u8>,
}

/// Watches `path` (a scope's list path with its selectors) from `rv` until the hub's
/// first complete change, or `wait`.
pub fn watch(
    client: &mut Client,
    path_and_query: &str,
    rv: u64,
    wait: Duration,
    action: &str,
) -> Result<Watched, kube::Error> {
    let sep = if path_and_query.contains('?') {
        '&'
    } else {
        '?'
    };
    let url = format!(
        "{path_and_query}{sep}watch=true&allowWatchBookmarks=true&resourceVersion={}",
        encode(&rv.to_string())
    );
    let body = match client.get_waiting(&url, "application/json", action, wait) {
        Ok(Waited::Body(b)) => *b,
        Ok(Waited::NotModified) => {
            return Err(kube::Error::Decode {
                action: action.to_string(),
                cause: "a 304 to a watch".into(),
            });
        }
        Err(e) if e.code() == Some(405) || e.code() == Some(403) => {
            return Ok(Watched::Refused(e.to_string()));
        }
        Err(e) => return Err(e),
    };
    let fail = body.failure();
    let mut lines = BufReader::new(body);
    let mut events = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = lines.read_until(b'\n', &mut line).map_err(|e| fail.io(e))?;
        if n == 0 {
            return Err(fail.decode("the watch ended before its change was complete"));
        }
        let text = trim(&line);
        if text.is_empty() {
            continue;
        }
        match event(text).map_err(|e| fail.decode(e))? {
            Line::Change(e) => events.push(e),
            Line::Bookmark(v) => {
                drain(lines);
                let rv = v.max(rv);
                return Ok(Watched::Commit { rv, events });
            }
            Line::Expired => return Ok(Watched::TooOld),
            Line::Error(why) => return Err(fail.decode(format!("the hub's watch said: {why}"))),
        }
    }
}

/// Reads what follows the committing bookmark (the hub ends the watch there: only the
/// stream's end, in the same write), so that the connection goes back for the next poll
/// rather than a new TLS handshake each time. More than [`DRAIN_MOST`] and it is dropped.
fn drain(rest: impl std::io::Read) {
    let _ = std::io::copy(&mut rest.take(DRAIN_MOST), &mut std::io::sink());
}

/// What a follower reads past its bookmark before it gives the connection up.
const DRAIN_MOST: u64 = 64 * 1024;

fn trim(b: &[u8]) -> &[u8] {
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    b.strip_suffix(b"\r").unwrap_or(b)
}

enum Line {
    Change(Event),
    Bookmark(u64),
    Expired,
    Error(String),
}

/// One line of a watch: `{"type":TYPE,"object":OBJECT}`.
fn event(line: &[u8]) -> Result<Line, String> {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(rename = "type")]
        kind: String,
        object: Object,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Object {
        metadata: Metadata,
        code: Option<u16>,
        reason: String,
        message: String,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct Metadata {
        resource_version: String,
    }
    let head: Head = serde_json::from_slice(line).map_err(|e| format!("not a watch event: {e}"))?;
    let object = || -> Result<Vec<u8>, String> {
        let key = b"\"object\":";
        let at = memchr::memmem::find(line, key).ok_or("no object")? + key.len();
        let end = line.iter().rposition(|b| *b == b'}').ok_or("no object")?;
        Ok(line.get(at..end).ok_or("no object")?.to_vec())
    };
    match head.kind.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" => Ok(Line::Change(Event {
            deleted: head.kind == "DELETED",
            object: object()?,
        })),
        "BOOKMARK" => {
            let rv = &head.object.metadata.resource_version;
            rv.parse()
                .map(Line::Bookmark)
                .map_err(|_| format!("a bookmark at resourceVersion '{rv}'"))
        }
        "ERROR" if head.object.code == Some(410) || head.object.reason == "Expired" => {
            Ok(Line::Expired)
        }
        "ERROR" => Ok(Line::Error(head.object.message)),
        other => Err(format!("an event of type '{other}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_bookmarks_and_errors_as_the_hub_writes_them() {
        let added = br#"{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","resourceVersion":"5"},"data":{"k":"}"}}}"#;
        match event(added).unwrap() {
            Line::Change(e) => {
                assert!(!e.deleted);
                assert_eq!(
                    e.object,
                    br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","resourceVersion":"5"},"data":{"k":"}"}}"#
                );
            }
            _ => panic!(),
        }
        let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"42"}}}"#;
        assert!(matches!(event(bookmark).unwrap(), Line::Bookmark(42)));
        let expired = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (10)","reason":"Expired","code":410}}"#;
        assert!(matches!(event(expired).unwrap(), Line::Expired));
        assert!(event(b"{\"type\":\"WHAT\",\"object\":{}}").is_err());
        assert!(event(b"{\"type\":\"ADDED\",\"obj").is_err());
    }
}
