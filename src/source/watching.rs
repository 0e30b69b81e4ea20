//! Following a `cmpoll serve` hub by watching it (`hub_protocol`'s held watch): one held
//! watch of each scope, opened from the version the follower holds and read by a
//! thread of its own, on which the hub commits each change with a `BOOKMARK` (its events,
//! then the bookmark) and, when nothing changed for the follower's wait, sends the
//! bookmark alone. A poll takes what was committed since the last (`Streams::take`); the
//! poll's first scope waits up to the follower's wait for any scope to hear something.
//! So a change costs each follower its events and one bookmark on a stream already open —
//! no request, no review — and a fleet's followers never come back to the hub at once.
//!
//! The Never clauses: what comes before a bookmark is taken only when the bookmark comes
//! (a stream cut mid-change gives nothing of it; the next stream starts from the last
//! commit taken); an event or bookmark older than the version held is not taken (a hub
//! behind the one before it); a watch the hub cannot serve from that version (`410
//! Expired`, its history moved on) is a relist, complete or nothing; a hub that does not
//! watch (405, an older hub) or will not for this token (403: a role without `watch`) is
//! followed with lists. A stream the hub says nothing on for its wait plus `SILENCE`
//! (frozen, or its connection blackholed) fails the poll and is given up. A watch that
//! ends (its `timeoutSeconds`) is opened again by the next poll, from the last commit.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use crate::hub_protocol::SILENCE;
use crate::kube::client::Failure;

/// A held watch lasts this, up to twice this (its `timeoutSeconds`, random).
pub const LASTS: Duration = Duration::from_secs(1800);

/// What a held watch committed: every event up to the bookmark's version, in order.
#[derive(Debug, PartialEq, Eq)]
pub struct Commit {
    pub rv: u64,
    pub events: Vec<Event>,
}

/// One event of a watch.
#[derive(Debug, PartialEq, Eq)]
pub struct Event {
    pub deleted: bool,
    /// The object, as the hub served it.
    pub object: Vec<u8>,
}

/// What a scope's held watch gave since it was last taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// What it committed, in order (none: nothing changed yet).
    Commits(Vec<Commit>),
    /// The hub's history does not reach back to the version it started from: list again.
    TooOld,
    /// It ended after committing at least once (these last): watch again from them.
    Ended(Vec<Commit>),
    /// It ended before its first commit, or said nothing past its wait: why.
    Failed(String),
}

/// What a reader thread tells.
enum Said {
    Commit(Commit),
    TooOld,
    Ended(Option<String>),
}

struct Message {
    id: u64,
    said: Said,
}

/// One scope's held watch.
struct Open {
    id: u64,
    commits: Vec<Commit>,
    /// How it ended, once it did.
    end: Option<Said>,
    heard: Instant,
    wait: Duration,
    /// It committed at least once.
    committed: bool,
    stop: Arc<AtomicBool>,
}

/// A follower's held watches, by scope.
pub struct Streams {
    tx: Sender<Message>,
    rx: Receiver<Message>,
    open: HashMap<String, Open>,
    next_id: u64,
}

impl Default for Streams {
    fn default() -> Streams {
        let (tx, rx) = channel();
        Streams {
            tx,
            rx,
            open: HashMap::new(),
            next_id: 0,
        }
    }
}

impl Streams {
    /// Whether `scope` has a held watch.
    pub fn is_open(&self, scope: &str) -> bool {
        self.open.contains_key(scope)
    }

    /// Holds `body` (a held watch of `scope`, whose hub commits at least every `wait`;
    /// its read errors told by `fail`), read by a thread of its own.
    pub fn open(
        &mut self,
        scope: &str,
        body: impl Read + Send + 'static,
        fail: Failure,
        wait: Duration,
    ) -> std::io::Result<()> {
        self.close(scope);
        self.next_id += 1;
        let id = self.next_id;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, halt) = (self.tx.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("watch {scope}"))
            .spawn(move || read(body, &fail, id, &tx, &halt))?;
        let open = Open {
            id,
            commits: Vec::new(),
            end: None,
            heard: Instant::now(),
            wait,
            committed: false,
            stop,
        };
        self.open.insert(scope.to_string(), open);
        Ok(())
    }

    /// Gives up `scope`'s held watch (its thread stops at its next line).
    pub fn close(&mut self, scope: &str) {
        if let Some(o) = self.open.remove(scope) {
            o.stop.store(true, Ordering::Relaxed);
        }
    }

    /// Waits until any held watch commits, ends or has been silent too long, or `until`.
    pub fn wait_any(&mut self, until: Instant) {
        loop {
            self.receive_ready();
            let now = Instant::now();
            let heard = self
                .open
                .values()
                .any(|o| !o.commits.is_empty() || o.end.is_some());
            let quiet = (self.open.values())
                .map(|o| o.heard + o.wait + SILENCE)
                .min();
            let by = quiet.map_or(until, |q| q.min(until));
            if heard || now >= by {
                return;
            }
            match self.rx.recv_timeout(by - now) {
                Ok(m) => self.file(m, Instant::now()),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// What `scope`'s held watch gave since it was last taken; an ended or silent one is
    /// given up. `None`: no held watch.
    pub fn take(&mut self, scope: &str) -> Option<Taken> {
        self.receive_ready();
        let now = Instant::now();
        let o = self.open.get_mut(scope)?;
        let commits = std::mem::take(&mut o.commits);
        let taken = match o.end.take() {
            Some(Said::TooOld) => Taken::TooOld,
            Some(Said::Ended(_)) if o.committed => Taken::Ended(commits),
            Some(Said::Ended(why)) => Taken::Failed(match why {
                Some(why) => why,
                None => "the hub's watch ended before its first bookmark".into(),
            }),
            Some(Said::Commit(_)) | None => {
                let quiet = now.saturating_duration_since(o.heard);
                if commits.is_empty() && quiet > o.wait + SILENCE {
                    Taken::Failed(format!(
                        "the hub said nothing on its watch for {} s (a bookmark was due every {} s); given up",
                        quiet.as_secs(),
                        o.wait.as_secs()
                    ))
                } else {
                    return Some(Taken::Commits(commits));
                }
            }
        };
        self.close(scope);
        Some(taken)
    }

    fn receive_ready(&mut self) {
        while let Ok(m) = self.rx.try_recv() {
            self.file(m, Instant::now());
        }
    }

    /// Files a reader's message with its watch (a given-up watch's are dropped).
    fn file(&mut self, m: Message, now: Instant) {
        let Some(o) = self.open.values_mut().find(|o| o.id == m.id) else {
            return;
        };
        o.heard = now;
        match m.said {
            Said::Commit(c) => {
                o.committed = true;
                o.commits.push(c);
            }
            end => o.end = Some(end),
        }
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        for o in self.open.values() {
            o.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// A reader thread: each change's events up to the bookmark that commits them, until the
/// stream ends or the watch is given up.
fn read(body: impl Read, fail: &Failure, id: u64, tx: &Sender<Message>, stop: &AtomicBool) {
    let mut lines = BufReader::new(body);
    let mut events = Vec::new();
    let mut line = Vec::new();
    let said = loop {
        line.clear();
        let n = match lines.read_until(b'\n', &mut line) {
            Ok(n) => n,
            Err(e) => break Said::Ended(Some(fail.io(e).to_string())),
        };
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if n == 0 {
            break Said::Ended(None);
        }
        let text = trim(&line);
        if text.is_empty() {
            continue;
        }
        let said = match event(text) {
            Err(e) => Said::Ended(Some(fail.decode(e).to_string())),
            Ok(Line::Change(e)) => {
                events.push(e);
                continue;
            }
            Ok(Line::Bookmark(rv)) => Said::Commit(Commit {
                rv,
                events: std::mem::take(&mut events),
            }),
            Ok(Line::Expired) => Said::TooOld,
            Ok(Line::Error(why)) => Said::Ended(Some(format!("the hub's watch said: {why}"))),
        };
        let end = !matches!(said, Said::Commit(_));
        if tx.send(Message { id, said }).is_err() || end {
            return;
        }
    };
    let _ = tx.send(Message { id, said });
}

pub fn trim(b: &[u8]) -> &[u8] {
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    b.strip_suffix(b"\r").unwrap_or(b)
}

/// One line of a watch, read.
pub enum Line {
    Change(Event),
    Bookmark(u64),
    Expired,
    Error(String),
}

/// One line of a watch: `{"type":TYPE,"object":OBJECT}`.
pub fn event(line: &[u8]) -> Result<Line, String> {
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

    const CHANGE: &str = r#"{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","resourceVersion":"7"}}}"#;

    fn bookmark(rv: u64) -> String {
        format!(
            r#"{{"type":"BOOKMARK","object":{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}}}}}}"#
        )
    }

    /// A held watch of `scope` whose hub is the pipe's other end.
    fn held(streams: &mut Streams, scope: &str) -> std::io::PipeWriter {
        let (r, w) = std::io::pipe().unwrap();
        (streams.open(
            scope,
            r,
            Failure::for_test("watch"),
            Duration::from_secs(30),
        ))
        .unwrap();
        w
    }

    fn say(w: &mut std::io::PipeWriter, line: &str) {
        use std::io::Write;
        w.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    #[test]
    fn a_held_watch_gives_what_each_bookmark_committed_and_never_half_a_change() {
        let mut s = Streams::default();
        let mut w = held(&mut s, "cm/a");
        assert_eq!(s.take("cm/a"), Some(Taken::Commits(vec![])), "nothing yet");
        say(&mut w, CHANGE);
        say(&mut w, &bookmark(9));
        say(&mut w, &bookmark(12));
        // The two commits, taken by as many polls as it takes them to arrive.
        let mut got = Vec::new();
        let by = Instant::now() + Duration::from_secs(10);
        while got.len() < 2 && Instant::now() < by {
            s.wait_any(by);
            match s.take("cm/a") {
                Some(Taken::Commits(c)) => got.extend(c),
                other => panic!("{other:?}"),
            }
        }
        let change = Event {
            deleted: false,
            object: CHANGE.as_bytes()[28..CHANGE.len() - 1].to_vec(),
        };
        assert_eq!(
            Some(Taken::Commits(got)),
            Some(Taken::Commits(vec![
                Commit {
                    rv: 9,
                    events: vec![change]
                },
                Commit {
                    rv: 12,
                    events: vec![]
                }
            ]))
        );
        // Cut in the middle of a change: none of it is taken, and the watch is over.
        say(&mut w, CHANGE);
        drop(w);
        s.wait_any(Instant::now() + Duration::from_secs(5));
        assert_eq!(s.take("cm/a"), Some(Taken::Ended(vec![])));
        assert!(!s.is_open("cm/a"));
        assert_eq!(s.take("cm/a"), None);
    }

    #[test]
    fn a_held_watch_that_fails_before_committing_or_goes_quiet_fails_the_poll() {
        let mut s = Streams::default();
        let mut w = held(&mut s, "cm/a");
        say(
            &mut w,
            r#"{"type":"ERROR","object":{"kind":"Status","code":503,"message":"not ready"}}"#,
        );
        s.wait_any(Instant::now() + Duration::from_secs(5));
        assert_eq!(
            s.take("cm/a"),
            Some(Taken::Failed("the hub's watch said: not ready".into()))
        );
        let mut w = held(&mut s, "cm/a");
        say(
            &mut w,
            r#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old"}}"#,
        );
        s.wait_any(Instant::now() + Duration::from_secs(5));
        assert_eq!(s.take("cm/a"), Some(Taken::TooOld), "a relist");
        // A hub that says nothing past the wait and SILENCE: given up.
        let _w = held(&mut s, "cm/a");
        let o = s.open.get_mut("cm/a").unwrap();
        o.heard -= o.wait + SILENCE + Duration::from_secs(1);
        match s.take("cm/a") {
            Some(Taken::Failed(why)) => assert!(why.contains("said nothing"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(!s.is_open("cm/a"));
    }

    #[test]
    fn the_polls_wait_ends_when_any_scope_hears_something() {
        let mut s = Streams::default();
        let _a = held(&mut s, "cm/a");
        let mut b = held(&mut s, "cm/b");
        let started = Instant::now();
        s.wait_any(started + Duration::from_millis(300));
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "nothing: the whole wait"
        );
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            say(&mut b, &bookmark(5));
            b
        });
        let started = Instant::now();
        s.wait_any(started + Duration::from_secs(20));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "b's commit ended it"
        );
        let _b = writer.join().unwrap();
        assert_eq!(s.take("cm/a"), Some(Taken::Commits(vec![])));
        assert_eq!(
            s.take("cm/b"),
            Some(Taken::Commits(vec![Commit {
                rv: 5,
                events: vec![]
            }]))
        );
    }
}
