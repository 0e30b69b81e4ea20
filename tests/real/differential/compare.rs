//! What the differential test compares: both answers read into the same shape (a refusal,
//! one object, a set of objects, or the events of a watch), the apiserver's seen through
//! the hub's selection (what docs/serve.md says its clients see), then the rule: never
//! more than the apiserver, and the same but where docs/serve.md documents a deviation
//! (`DEVIATIONS`, each with the sentence it rests on; a unit test holds every sentence to
//! the file).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

const MODULE: &str = "cmpoll.io/module";

/// An object as compared: where it is, its version; whether it carries the hub's
/// selecting label.
#[derive(Clone, Debug)]
pub struct Obj {
    pub ns: String,
    pub name: String,
    pub rv: String,
    pub module: bool,
}

impl Obj {
    fn of(v: &Value) -> Obj {
        let m = &v["metadata"];
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        Obj {
            ns: s(&m["namespace"]),
            name: s(&m["name"]),
            rv: s(&m["resourceVersion"]),
            module: m["labels"][MODULE] == "true",
        }
    }

    fn key(&self) -> String {
        format!("{}/{}@{}", self.ns, self.name, self.rv)
    }
}

/// One watch event.
#[derive(Clone, Debug)]
pub struct Event {
    pub typ: String,
    pub obj: Obj,
    /// A `BOOKMARK` annotated `k8s.io/initial-events-end`.
    pub end: bool,
    /// An `ERROR`'s code and reason.
    pub error: Option<(u64, String)>,
}

impl Event {
    fn of(v: &Value) -> Option<Event> {
        let typ = v["type"].as_str()?.to_string();
        let o = &v["object"];
        Some(Event {
            end: o["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true",
            error: (typ == "ERROR").then(|| {
                (
                    o["code"].as_u64().unwrap_or(0),
                    o["reason"].as_str().unwrap_or_default().to_string(),
                )
            }),
            obj: Obj::of(o),
            typ,
        })
    }

    /// What is compared: the type and the object, its version but for a `DELETED`; a
    /// bookmark only as the end of the initial events.
    fn key(&self) -> Option<String> {
        match self.typ.as_str() {
            "BOOKMARK" if self.end => Some("BOOKMARK initial-events-end".into()),
            "BOOKMARK" => None,
            "ERROR" => {
                let (code, reason) = self.error.clone().unwrap_or_default();
                Some(format!("ERROR {code} {reason}"))
            }
            "DELETED" => Some(format!("DELETED {}/{}", self.obj.ns, self.obj.name)),
            t => Some(format!("{t} {}", self.obj.key())),
        }
    }
}

#[derive(Clone, Debug)]
pub enum Body {
    Status {
        reason: String,
        message: String,
    },
    Object {
        kind: String,
        obj: Obj,
    },
    List {
        kind: String,
        items: Vec<Obj>,
        pages: usize,
        cont: Option<String>,
    },
    /// Events, the first `prefix` of them read before the script's first write (shown,
    /// not compared: when each server sends them is its own).
    Stream {
        events: Vec<Event>,
        prefix: usize,
    },
    Other(String),
}

#[derive(Clone, Debug)]
pub struct Answer {
    pub code: u16,
    pub body: Body,
}

impl Answer {
    /// An answer's bytes: one JSON document (a `Status`, an object, a list) or JSON lines
    /// of events, of which the first `prefix` lines came before the script (`None`: all).
    pub fn parse(code: u16, bytes: &[u8], prefix: Option<usize>) -> Answer {
        let text = String::from_utf8_lossy(bytes);
        let body = match serde_json::from_str::<Value>(text.trim()) {
            Ok(v) if v.get("type").is_some() && v.get("object").is_some() => stream(&text, prefix),
            Ok(v) if v["kind"] == "Status" => Body::Status {
                reason: v["reason"].as_str().unwrap_or_default().to_string(),
                message: v["message"].as_str().unwrap_or_default().to_string(),
            },
            Ok(v) if v["items"].is_array() || v["items"].is_null() && v.get("items").is_some() => {
                Body::List {
                    kind: v["kind"].as_str().unwrap_or_default().to_string(),
                    items: (v["items"].as_array().into_iter().flatten())
                        .map(Obj::of)
                        .collect(),
                    pages: 1,
                    cont: (v["metadata"]["continue"].as_str())
                        .filter(|c| !c.is_empty())
                        .map(str::to_string),
                }
            }
            Ok(v) if v.get("metadata").is_some() => Body::Object {
                kind: v["kind"].as_str().unwrap_or_default().to_string(),
                obj: Obj::of(&v),
            },
            // A watch that said nothing.
            _ if text.trim().is_empty() && code == 200 => Body::Stream {
                events: Vec::new(),
                prefix: 0,
            },
            _ if text.trim().is_empty() => Body::Other(String::new()),
            _ => stream(&text, prefix),
        };
        Answer { code, body }
    }

    /// The next page of a list, added to it; an answer that is not a list ends the list
    /// with itself.
    pub fn and_page(self, next: Answer) -> Answer {
        match (self.body, next.body) {
            (
                Body::List {
                    kind,
                    mut items,
                    pages,
                    ..
                },
                Body::List {
                    items: more, cont, ..
                },
            ) => {
                items.extend(more);
                Answer {
                    code: self.code,
                    body: Body::List {
                        kind,
                        items,
                        pages: pages + 1,
                        cont,
                    },
                }
            }
            (_, body) => Answer {
                code: next.code,
                body,
            },
        }
    }

    pub fn continue_token(&self) -> Option<&str> {
        match &self.body {
            Body::List { cont, .. } => cont.as_deref(),
            _ => None,
        }
    }

    fn ok(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// A short account, for a failure's message.
    pub fn show(&self) -> String {
        let keys = |v: Vec<String>| v.join(", ");
        match (&self.body, shape(self, None)) {
            (Body::Status { reason, message }, _) => {
                format!("{} {reason}: {message}", self.code)
            }
            (Body::List { pages, .. }, Shape::Many(kind, items)) => format!(
                "{} {kind} ({pages} page(s)): [{}]",
                self.code,
                keys(items.into_iter().collect())
            ),
            (_, Shape::One(kind, key)) => format!("{} {kind} {key}", self.code),
            (Body::Stream { events, prefix }, _) => {
                let k = |e: &[Event]| keys(e.iter().filter_map(Event::key).collect());
                format!(
                    "{} stream: before the script [{}]; during it [{}]",
                    self.code,
                    k(&events[..*prefix]),
                    k(&events[*prefix..])
                )
            }
            (_, s) => format!("{} {s:?}", self.code),
        }
    }
}

fn stream(text: &str, prefix: Option<usize>) -> Body {
    let mut events = Vec::new();
    let mut prefix_events = 0;
    // Only whole lines: a stream is cut where the test stopped reading.
    let whole = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => text,
    };
    for (i, line) in whole.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let Some(e) = serde_json::from_str::<Value>(line)
            .ok()
            .as_ref()
            .and_then(Event::of)
        else {
            return Body::Other(text.chars().take(2000).collect());
        };
        events.push(e);
        if prefix.is_none_or(|p| i < p) {
            prefix_events = events.len();
        }
    }
    Body::Stream {
        events,
        prefix: prefix_events,
    }
}

/// What a hub serves: objects carrying its label, in the namespaces it lists (`None`:
/// all of them).
#[derive(Clone, Debug)]
pub struct Selection {
    pub namespaces: Option<Vec<String>>,
}

impl Selection {
    fn holds(&self, o: &Obj) -> bool {
        o.module && self.namespaces.as_ref().is_none_or(|n| n.contains(&o.ns))
    }
}

/// The apiserver's answer as the hub's clients would see it: objects outside the hub's
/// selection do not exist (a GET of one is a 404, a list leaves it out, a watch sees it
/// `ADDED` when it enters the selection and `DELETED` when it leaves).
pub fn project(a: &Answer, sel: &Selection) -> Answer {
    let body = match &a.body {
        Body::Object { obj, .. } if !sel.holds(obj) => {
            return Answer {
                code: 404,
                body: Body::Status {
                    reason: "NotFound".into(),
                    message: "(outside the hub's selection)".into(),
                },
            };
        }
        Body::List {
            kind,
            items,
            pages,
            cont,
        } => Body::List {
            kind: kind.clone(),
            items: items.iter().filter(|o| sel.holds(o)).cloned().collect(),
            pages: *pages,
            cont: cont.clone(),
        },
        Body::Stream { events, prefix } => {
            // Whether the hub's watcher holds each object, from what it was told.
            let mut seen: HashMap<(String, String), bool> = HashMap::new();
            let mut out = Vec::new();
            let mut new_prefix = 0;
            for (i, e) in events.iter().enumerate() {
                let key = (e.obj.ns.clone(), e.obj.name.clone());
                let now = sel.holds(&e.obj);
                let typ = match e.typ.as_str() {
                    "ADDED" => {
                        seen.insert(key, now);
                        now.then_some("ADDED")
                    }
                    "MODIFIED" => {
                        let before = seen.insert(key, now).unwrap_or(now);
                        match (before, now) {
                            (true, true) => Some("MODIFIED"),
                            (false, true) => Some("ADDED"),
                            (true, false) => Some("DELETED"),
                            (false, false) => None,
                        }
                    }
                    // The apiserver's DELETED carries the last state it held.
                    "DELETED" => seen.remove(&key).unwrap_or(now).then_some("DELETED"),
                    _ => Some(""),
                };
                if let Some(t) = typ {
                    let mut e = e.clone();
                    if !t.is_empty() {
                        e.typ = t.to_string();
                    }
                    out.push(e);
                }
                if i < *prefix {
                    new_prefix = out.len();
                }
            }
            Body::Stream {
                events: out,
                prefix: new_prefix,
            }
        }
        other => other.clone(),
    };
    Answer { code: a.code, body }
}

/// An answer as compared.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Shape {
    Refusal(String),
    One(String, String),
    Many(String, BTreeSet<String>),
    /// In order, but for the state a watch may start with (sorted).
    Events(Vec<String>),
    Other(String),
}

/// An answer as compared; `state`: the watch starts with the state at that version (its
/// `ADDED` events at or before it, and the bookmark that may end them, are in no order).
fn shape(a: &Answer, state: Option<u64>) -> Shape {
    match &a.body {
        Body::Status { reason, .. } => Shape::Refusal(reason.clone()),
        Body::Object { kind, obj } => Shape::One(kind.clone(), obj.key()),
        Body::List { kind, items, .. } => {
            Shape::Many(kind.clone(), items.iter().map(Obj::key).collect())
        }
        Body::Stream { events, .. } => {
            let mut keys: Vec<String> = events.iter().filter_map(Event::key).collect();
            let initial = |e: &Event| {
                e.typ == "ADDED"
                    && state.is_some_and(|s| e.obj.rv.parse().is_ok_and(|v: u64| v <= s))
            };
            let mut n = events
                .iter()
                .filter(|e| e.key().is_some())
                .take_while(|e| initial(e))
                .count();
            if keys.get(n).is_some_and(|k| k.starts_with("BOOKMARK")) {
                n += 1;
            }
            // The state's order is each server's; its end bookmark comes last.
            keys[..n].sort_by_key(|k| (k.starts_with("BOOKMARK"), k.clone()));
            Shape::Events(keys)
        }
        Body::Other(t) => Shape::Other(t.clone()),
    }
}

/// What the deviations need to know of a case.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// A bearer token was sent.
    pub token: bool,
    /// The field selector has a `type` term.
    pub type_field: bool,
    /// The resourceVersion asked, if a number.
    pub rv: Option<u64>,
    /// A list read at exactly its version: `resourceVersionMatch=Exact`, or a `limit` and
    /// a version with no match.
    pub exact: bool,
    /// The hub's version of the collection asked, when the case was made.
    pub hub_rv: u64,
    /// The version of the hub's first poll.
    pub hub_first: u64,
    /// A watch that starts with the state (no version, `0`, or the streaming list): the
    /// apiserver's version when it was opened.
    pub state: Option<u64>,
}

/// A deviation from the apiserver that docs/serve.md documents, and when an answer is it.
pub struct Deviation {
    pub name: &'static str,
    /// The sentence of docs/serve.md it rests on (held to the file by a unit test).
    pub quote: &'static str,
    applies: fn(&Facts, &Answer, &Answer) -> bool,
}

/// Where the hub may answer otherwise than the apiserver seen through its selection:
/// each only refuses or leaves out, never shows more.
pub const DEVIATIONS: &[Deviation] = &[
    Deviation {
        name: "no token: 401",
        quote: "A request without a token is a 401 (the apiserver lets it in as `system:anonymous` unless `--anonymous-auth=false`, and refuses it with a 403).",
        applies: |f, api, hub| !f.token && hub.code == 401 && api.code == 403,
    },
    Deviation {
        name: "fieldSelector type is not served",
        quote: "`fieldSelector` takes `metadata.name` and `metadata.namespace` only (the apiserver also takes `type` for Secrets).",
        applies: |f, api, hub| {
            f.type_field && hub.code == 400 && (api.ok() || [400, 422].contains(&api.code))
        },
    },
    Deviation {
        name: "a version newer than the hub's poll: 504",
        quote: "504 for a resourceVersion newer than the hub's poll",
        // (Whatever the apiserver found at that version, the object or its absence.)
        applies: |f, api, hub| {
            f.rv.is_some_and(|r| r > f.hub_rv)
                && (api.ok() || api.code == 404)
                && refused_with(hub, 504)
        },
    },
    Deviation {
        name: "Exact at a version the hub does not hold: 410",
        quote: "a list's `Exact` R is the state at R where the hub holds it (nothing it selects changed between R and its last list: the list at R), else the apiserver's 410 `Expired` for a compacted version",
        applies: |f, api, hub| f.exact && api.ok() && hub.code == 410,
    },
    Deviation {
        name: "a version older than the hub's first poll: 410",
        quote: "A watch from R is one `ERROR` event, `410 Expired` (`too old resource version: R (OLDEST)`), when R is older than the hub's first poll (it never saw what came before)",
        applies: |f, api, hub| {
            f.rv.is_some_and(|r| r > 0 && r < f.hub_first) && api.ok() && refused_with(hub, 410)
        },
    },
];

/// What is compared away rather than allowed: each server's own part of an answer.
pub const COMPARED_AWAY: &[(&str, &str)] = &[
    (
        "objects outside the hub's selection (a GET of one: 404; a watch: ADDED/DELETED as they enter and leave it)",
        "Objects outside the hub's selection do not exist for its clients.",
    ),
    (
        "an object leaving the selection is DELETED",
        "An object that leaves the hub's selection (its selecting label removed) is `DELETED` the same way.",
    ),
    (
        "a DELETED's version",
        "A `DELETED` carries the version of the poll that saw the object gone",
    ),
    (
        "a list's own version and continue token (each server's pages are followed to the end)",
        "the list's `resourceVersion` is that of the hub's poll",
    ),
    (
        "bookmarks but the end of the initial events",
        "a `BOOKMARK` with the hub's version about every minute",
    ),
];

/// A refusal with `code`: its status, or a stream of that one `ERROR`.
fn refused_with(a: &Answer, code: u16) -> bool {
    match &a.body {
        Body::Stream { events, .. } => {
            events.len() == 1 && events[0].error.as_ref().is_some_and(|e| e.0 == code as u64)
        }
        _ => a.code == code,
    }
}

/// A verdict on one case.
pub enum Verdict {
    Same,
    Allowed(&'static str),
    /// The apiserver failed (5xx) and the hub refused: nothing to compare with.
    NoOracle,
    /// A class of difference.
    Differs(&'static str),
}

pub const REFUSED_SERVED: &str = "the hub answers 2xx where the apiserver refuses";
pub const OUTSIDE: &str = "the hub serves an object outside its selection";
pub const STREAMS: &str = "the hub streams where the apiserver answers at once";
pub const ANSWERS: &str = "the hub answers at once where the apiserver streams";
pub const MORE_OBJECTS: &str = "the hub shows objects the apiserver does not";
pub const MORE_EVENTS: &str = "the hub sends events the apiserver does not";
pub const VERSIONS: &str = "the hub's objects are at other versions than the apiserver's";
pub const FEWER_OBJECTS: &str = "the hub shows fewer objects than the apiserver";
pub const FEWER_EVENTS: &str = "the hub's events are fewer or in another order";
pub const LATER: &str = "the hub sends the apiserver's events in another order";
pub const END_BOOKMARK: &str =
    "the initial-events-end bookmark: one server sends it, the other does not";
pub const ERROR_EVENT: &str = "the hub ends a watch with an ERROR the apiserver does not send";
pub const REFUSES: &str = "the hub refuses what the apiserver serves";
pub const VALIDATES_FIRST: &str =
    "the hub refuses a request's options (400, 422) where the apiserver refuses its access (403)";
pub const OTHER_REFUSAL: &str = "both refuse, with another code or reason";
pub const OTHER: &str = "the answers differ otherwise";

/// Whether a hub answer is a leak: more than the apiserver shows, which no deviation
/// excuses.
pub fn is_leak(class: &str) -> bool {
    [REFUSED_SERVED, OUTSIDE, STREAMS, MORE_OBJECTS, MORE_EVENTS].contains(&class)
}

/// The hub's answer against the apiserver's: the verdict and what the hub should have
/// answered (the apiserver's, through the selection).
pub fn judge(f: &Facts, api: &Answer, hub: &Answer, sel: &Selection) -> (Verdict, Answer) {
    let want = project(api, sel);
    let (w, h) = (shape(&want, f.state), shape(hub, f.state));
    if want.code == hub.code && w == h {
        return (Verdict::Same, want);
    }
    if let Some(class) = more(api, &want, hub, &w, &h) {
        return (Verdict::Differs(class), want);
    }
    if api.code >= 500 && !hub.ok() {
        return (Verdict::NoOracle, want);
    }
    if let Some(d) = DEVIATIONS.iter().find(|d| (d.applies)(f, api, hub)) {
        return (Verdict::Allowed(d.name), want);
    }
    (Verdict::Differs(fewer(&want, hub, &w, &h)), want)
}

/// The class of a hub answer that shows more than the apiserver's, if it does.
fn more(api: &Answer, want: &Answer, hub: &Answer, w: &Shape, h: &Shape) -> Option<&'static str> {
    if !hub.ok() {
        return None;
    }
    if !api.ok() {
        return Some(REFUSED_SERVED);
    }
    if !want.ok() {
        return Some(OUTSIDE);
    }
    let names = |s: &BTreeSet<String>| -> BTreeSet<String> {
        s.iter()
            .map(|k| k.split('@').next().unwrap_or("").to_string())
            .collect()
    };
    match (w, h) {
        (Shape::Events(wk), Shape::Events(hk)) => {
            let mut left: BTreeMap<&String, usize> = BTreeMap::new();
            for k in wk {
                *left.entry(k).or_default() += 1;
            }
            // An ERROR is a refusal and a bookmark no object: neither is more (`fewer`
            // names them).
            let data = |k: &&String| !k.starts_with("ERROR") && !k.starts_with("BOOKMARK");
            for k in hk.iter().filter(data) {
                match left.get_mut(k) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => return Some(MORE_EVENTS),
                }
            }
            None
        }
        (_, Shape::Events(..)) => Some(STREAMS),
        (Shape::Many(_, ws), Shape::Many(_, hs)) => {
            (!names(hs).is_subset(&names(ws))).then_some(MORE_OBJECTS)
        }
        (Shape::One(_, wk), Shape::One(_, hk)) => {
            let name = |k: &str| k.split('@').next().unwrap_or("").to_string();
            (name(wk) != name(hk)).then_some(MORE_OBJECTS)
        }
        (Shape::One(..), Shape::Many(..)) => Some(MORE_OBJECTS),
        _ => None,
    }
}

fn without_end(k: &[String]) -> Vec<&String> {
    k.iter().filter(|k| !k.starts_with("BOOKMARK")).collect()
}

/// The class of a difference that is not a leak.
fn fewer(want: &Answer, hub: &Answer, w: &Shape, h: &Shape) -> &'static str {
    match (want.ok(), hub.ok()) {
        (true, false) => return REFUSES,
        (false, false) if want.code == 403 && [400, 422].contains(&hub.code) => {
            return VALIDATES_FIRST;
        }
        (false, false) => return OTHER_REFUSAL,
        (false, true) => return OTHER,
        (true, true) => {}
    }
    let sorted = |k: &[String]| -> Vec<String> {
        let mut k = k.to_vec();
        k.sort();
        k
    };
    match (w, h) {
        (Shape::Events(_), Shape::Events(hk)) if hk.iter().any(|k| k.starts_with("ERROR")) => {
            ERROR_EVENT
        }
        (Shape::Events(wk), Shape::Events(hk)) if sorted(wk) == sorted(hk) => LATER,
        (Shape::Events(wk), Shape::Events(hk)) if without_end(wk) == without_end(hk) => {
            END_BOOKMARK
        }
        (Shape::Events(..), Shape::Events(..)) => FEWER_EVENTS,
        (Shape::Events(..), _) => ANSWERS,
        (Shape::Many(_, ws), Shape::Many(_, hs)) if hs.len() < ws.len() => FEWER_OBJECTS,
        (Shape::Many(..), Shape::Many(..)) | (Shape::One(..), Shape::One(..)) => VERSIONS,
        _ => OTHER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(ns: &str, name: &str, rv: &str, module: bool) -> Value {
        let labels = if module {
            serde_json::json!({MODULE: "true"})
        } else {
            serde_json::json!({"team": "a"})
        };
        serde_json::json!({"kind": "ConfigMap", "metadata": {"namespace": ns, "name": name, "resourceVersion": rv, "labels": labels}})
    }

    fn list(items: &[Value]) -> Answer {
        let v = serde_json::json!({"kind": "ConfigMapList", "metadata": {"resourceVersion": "9"}, "items": items});
        Answer::parse(200, v.to_string().as_bytes(), None)
    }

    fn events(lines: &[(&str, Value)], prefix: usize) -> Answer {
        let text: String = (lines.iter())
            .map(|(t, o)| format!("{}\n", serde_json::json!({"type": t, "object": o})))
            .collect();
        Answer::parse(200, text.as_bytes(), Some(prefix))
    }

    fn status(code: u16, reason: &str) -> Answer {
        let v =
            serde_json::json!({"kind": "Status", "code": code, "reason": reason, "message": "m"});
        Answer::parse(code, v.to_string().as_bytes(), None)
    }

    fn verdict(api: &Answer, hub: &Answer, f: &Facts) -> Option<&'static str> {
        let all = Selection { namespaces: None };
        match judge(f, api, hub, &all).0 {
            Verdict::Same | Verdict::Allowed(_) | Verdict::NoOracle => None,
            Verdict::Differs(class) => Some(class),
        }
    }

    #[test]
    fn the_apiserver_through_the_selection_is_the_same() {
        let f = Facts::default();
        let api = list(&[obj("n", "a", "5", true), obj("n", "u", "6", false)]);
        let hub = list(&[obj("n", "a", "5", true)]);
        assert_eq!(verdict(&api, &hub, &f), None);
        // A GET of an unselected object: the hub's 404.
        let api = Answer::parse(200, obj("n", "u", "6", false).to_string().as_bytes(), None);
        assert_eq!(verdict(&api, &status(404, "NotFound"), &f), None);
        // A watch: the relabel out of the selection is the hub's DELETED, at its version.
        let api = events(
            &[
                ("ADDED", obj("n", "a", "5", true)),
                ("MODIFIED", obj("n", "a", "7", false)),
                ("MODIFIED", obj("n", "a", "8", true)),
            ],
            0,
        );
        let hub = events(
            &[
                ("ADDED", obj("n", "a", "5", true)),
                ("DELETED", obj("n", "a", "7", true)),
                ("ADDED", obj("n", "a", "8", true)),
            ],
            0,
        );
        assert_eq!(verdict(&api, &hub, &f), None);
    }

    #[test]
    fn more_than_the_apiserver_fails_whatever_is_documented() {
        let f = Facts::default();
        // A 2xx where the apiserver refuses.
        assert_eq!(
            verdict(&status(403, "Forbidden"), &list(&[]), &f),
            Some(REFUSED_SERVED)
        );
        // One object more.
        let api = list(&[obj("n", "a", "5", true)]);
        let hub = list(&[obj("n", "a", "5", true), obj("n", "b", "6", true)]);
        assert_eq!(verdict(&api, &hub, &f), Some(MORE_OBJECTS));
        // An object outside the selection.
        let api = Answer::parse(200, obj("n", "u", "6", false).to_string().as_bytes(), None);
        let hub = Answer::parse(200, obj("n", "u", "6", false).to_string().as_bytes(), None);
        assert_eq!(verdict(&api, &hub, &f), Some(OUTSIDE));
        // An event more, and a stream where the apiserver answers a GET.
        let api = events(&[("MODIFIED", obj("n", "a", "7", true))], 0);
        let hub = events(
            &[
                ("MODIFIED", obj("n", "a", "7", true)),
                ("MODIFIED", obj("n", "b", "8", true)),
            ],
            0,
        );
        assert_eq!(verdict(&api, &hub, &f), Some(MORE_EVENTS));
        let api = Answer::parse(200, obj("n", "a", "5", true).to_string().as_bytes(), None);
        let hub = events(&[("ADDED", obj("n", "a", "5", true))], 0);
        assert_eq!(verdict(&api, &hub, &f), Some(STREAMS));
    }

    #[test]
    fn fewer_fails_unless_documented() {
        let f = Facts::default();
        let api = events(&[("MODIFIED", obj("n", "a", "7", true))], 0);
        assert_eq!(verdict(&api, &events(&[], 0), &f), Some(FEWER_EVENTS));
        assert_eq!(
            verdict(&status(403, "Forbidden"), &status(400, "BadRequest"), &f),
            Some(VALIDATES_FIRST)
        );
        assert_eq!(
            verdict(&status(404, "NotFound"), &status(403, "Forbidden"), &f),
            Some(OTHER_REFUSAL)
        );
        // A 401 without a token is documented; with one it is not.
        let anonymous = Facts {
            token: false,
            ..f.clone()
        };
        let with_token = Facts { token: true, ..f };
        let (api, hub) = (status(403, "Forbidden"), status(401, "Unauthorized"));
        assert_eq!(verdict(&api, &hub, &anonymous), None);
        assert_eq!(verdict(&api, &hub, &with_token), Some(OTHER_REFUSAL));
        // A 504 only for a version newer than the hub's.
        let newer = Facts {
            token: true,
            rv: Some(20),
            hub_rv: 10,
            ..Facts::default()
        };
        let older = Facts {
            rv: Some(5),
            ..newer.clone()
        };
        let hub = status(504, "Timeout");
        assert_eq!(verdict(&list(&[]), &hub, &newer), None);
        assert_eq!(verdict(&list(&[]), &hub, &older), Some(REFUSES));
    }

    #[test]
    fn a_watchs_state_is_in_no_order_and_when_events_come_is_not_compared() {
        let f = Facts {
            state: Some(6),
            ..Facts::default()
        };
        let (a5, b6, a7) = (
            obj("n", "a", "5", true),
            obj("n", "b", "6", true),
            obj("n", "a", "7", true),
        );
        let api = events(
            &[
                ("ADDED", a5.clone()),
                ("ADDED", b6.clone()),
                ("MODIFIED", a7.clone()),
            ],
            2,
        );
        let hub = events(
            &[
                ("ADDED", b6.clone()),
                ("ADDED", a5.clone()),
                ("MODIFIED", a7.clone()),
            ],
            0,
        );
        assert_eq!(verdict(&api, &hub, &f), None);
        // What came after the state keeps its order.
        let hub = events(&[("ADDED", a5), ("MODIFIED", a7), ("ADDED", b6)], 3);
        assert_eq!(verdict(&api, &hub, &f), Some(LATER));
    }

    #[test]
    fn the_allowed_deviations_are_documented() {
        let docs = std::fs::read_to_string(crate::util::root().join("docs/serve.md")).unwrap();
        let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let docs = flat(&docs);
        let quotes =
            (DEVIATIONS.iter().map(|d| d.quote)).chain(COMPARED_AWAY.iter().map(|(_, q)| *q));
        for q in quotes {
            assert!(
                docs.contains(&flat(q)),
                "docs/serve.md no longer says: {q}\n(update the comparator's deviations with it)"
            );
        }
    }
}
