//! The wire contract between a follower (`cmpoll run` whose server is a hub) and a
//! `cmpoll serve` hub, beyond the apiserver's read API that every client gets: two
//! headers, the rule by which a follower takes a change, and how long a hub waits for a
//! version it has not reached. `kube::client` sends the headers, `source` (the follower:
//! `follow.rs`, `watching.rs`) takes what comes by the rule, `serve` (the hub:
//! `request.rs`, `watch.rs`, `hub.rs`) answers them. docs/serve.md ("How a follower
//! learns of a change") is the user's account.
//!
//! Two protocols, both asked with `WAIT_HEADER`:
//! - **The held watch** (a follower's role has `watch`): `watch=true` from the version R
//!   the follower holds, `allowWatchBookmarks=true`, `timeoutSeconds` a random 1,800 to
//!   3,600 s. The hub sends each change after R as its events followed by a `BOOKMARK` at
//!   its own version (which commits them), and a `BOOKMARK` alone when the wait passes
//!   with none, until the watch ends as any other does.
//! - **The waiting list** (a hub that answers a watch 405 or 403: a role without
//!   `watch`): a list with `resourceVersion=R&resourceVersionMatch=NotOlderThan`, held by
//!   the hub until it has a list newer than R (then the list) or the wait passes (then
//!   `304 Not Modified`, no body).
//!
//! **The commit rule**: a follower takes events only with the `BOOKMARK` after them (a
//! stream cut before it gives nothing of that change), never an event or a bookmark not
//! newer than what it holds, and a watch the hub says nothing on for the wait plus
//! `SILENCE` is given up.

use std::time::Duration;

/// Sent by a hub with every answer: it understands `WAIT_HEADER`. A follower learns from
/// it that it follows a hub.
pub const HUB_HEADER: &str = "x-cmpoll-hub";

/// A follower's wait, in whole seconds (its `--interval`, at least 1): on a watch, the
/// longest between two bookmarks (the watch is held); on a list with
/// `resourceVersionMatch=NotOlderThan`, the longest the hub holds it. A client that
/// does not send it gets the apiserver's own answers.
pub const WAIT_HEADER: &str = "x-cmpoll-wait";

/// The longest wait a hub takes; a longer one is cut to it.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// How long past its wait a held watch may say nothing before the follower gives it up.
pub const SILENCE: Duration = Duration::from_secs(10);

/// How long a list or watch from a version newer than the hub's waits for it (the watch
/// cache's own wait for a resourceVersion it has not seen), then 504 as the apiserver's.
pub const BEHIND_WAIT: Duration = Duration::from_secs(3);

/// Where a follower tells its hub what it holds (`Report`, JSON, with its token and
/// `WAIT_HEADER`): `POST`, answered `204 No Content` when taken. The hub authorizes a
/// report as it authorizes a list: the reporter must be allowed to `list` each reported
/// module's kind in its namespace (SubjectAccessReview, decisions kept as for lists), else
/// 403 for the whole report in the apiserver's words. 429 with `Retry-After`: too many
/// reports from this follower (the next one carries the newest state); 404: a hub that
/// takes no reports (an older one; the follower stops sending them).
pub const REPORT_PATH: &str = "/cmpoll/v1/report";

/// The largest report body a hub reads (a longer one is 413).
pub const MAX_REPORT: usize = 1 << 20;

/// The most modules one report names (a follower holding more reports the first ones in
/// id order and sets `truncated`).
pub const MAX_REPORT_MODULES: usize = 4096;

/// A reported refusal's reason is cut to this many bytes, on a character boundary.
pub const MAX_REPORT_REASON: usize = 512;

/// What a follower holds, whole (not a change: a lost report is mended by the next one).
/// Sent when it changes, and not more often than the hub's rate allows.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Each module it was served, in id order.
    pub modules: Vec<Reported>,
    /// It holds more than `MAX_REPORT_MODULES`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// One module as a follower holds it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reported {
    /// `NAMESPACE/NAME` (with both kinds listed, `KIND/NAMESPACE/NAME`), as in its events.
    pub module: String,
    /// `ConfigMap` or `Secret`.
    pub kind: String,
    /// The version its agent holds (`sha256:…`); none when it holds none (a new module it
    /// refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// The object's resourceVersion at that version: a follower's hash covers only the
    /// keys it selects (`--keys`) under its own names, so a hub tells "the version it
    /// serves" by this first.
    #[serde(
        default,
        rename = "resourceVersion",
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_version: Option<String>,
    /// Its own latest refusal of this module, when the refused version is still the
    /// newest it was served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<ReportedRefusal>,
}

/// A follower's refusal of one version.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportedRefusal {
    /// The version refused (`sha256:…`).
    pub hash: String,
    /// The object's resourceVersion at that version.
    #[serde(
        default,
        rename = "resourceVersion",
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_version: Option<String>,
    /// Who refused it: `validate` (its `--validate`) or `confirm` (its agent, asked by
    /// `--confirm`).
    pub by: String,
    /// Why, cut to `MAX_REPORT_REASON` bytes (for a Secret, only the exit status).
    pub reason: String,
}
