//! What a collector's calls say it runs (`Collector`'s side of `Collectors::asked`): a
//! status taken about the text it names (`take`), the text it is answered with and the
//! hash it echoes read as Alloy means them (`answered_with`, `echoed`: Alloy echoes the
//! last text it received and says a status only when it changes), a `FAILED`'s refused
//! versions and exceptions (`failed`: the versions new to it, those its diagnostics point
//! into), and what the fleet is told of each (`fleet::collected::Word`).

use std::cmp::Ordering;
use std::time::Instant;

use super::{Collector, Sent};
use crate::serve::fleet::collected::{Change, Version, Word};
use crate::serve::fleet::intake::{By, Holding, KEPT_REASON, Refusal};
use crate::serve::remotecfg::compose::Composition;
use crate::serve::remotecfg::messages::{Reported, Status};
use crate::source::Resource;

/// How often the fleet is told again the namespaces a collector follows.
pub(super) const RETELL: std::time::Duration = std::time::Duration::from_secs(300);

/// How far apart two calls must be to tell the collector's wait: Alloy's status comes in
/// a second call right after the poll that brought the text.
const APART: std::time::Duration = std::time::Duration::from_secs(5);

impl Collector {
    /// A `GetConfig` answered with `sent` (made of the hub's view at `at`), the collector
    /// echoing `echoed`, now: the text kept, what it follows told when that changed (and
    /// every `RETELL`), its wait read off the time since its last call, what it runs.
    pub(super) fn answered_with(
        &mut self,
        sent: &Composition,
        (echoed, at): (&str, u64),
        now: Instant,
        word: &mut Word,
    ) {
        if self.sent.as_ref().is_none_or(|s| s.hash != sent.hash) {
            let before = self.sent.as_ref().map(|s| namespaces(&s.modules));
            if before.is_none_or(|b| b != namespaces(&sent.modules)) {
                // What it follows changed: told now, not only every RETELL.
                self.followed = None;
            }
            self.sent = Some(Sent {
                hash: sent.hash.clone(),
                modules: sent.modules.clone(),
                spans: sent.spans.clone(),
            });
        }
        if self
            .followed
            .is_none_or(|t| now.saturating_duration_since(t) >= RETELL)
        {
            // Told again now and then: a fleet that forgot it (silent an hour, or room
            // made) follows it again.
            word.namespaces = Some(namespaces(&sent.modules));
            self.followed = Some(now);
        }
        self.answered = at;
        word.wait = (self.called)
            .map(|t| now.saturating_duration_since(t))
            .filter(|gap| *gap >= APART)
            .map(|gap| gap.as_secs_f64().ceil() as u64);
        self.called = Some(now);
        self.echoed(echoed, at, word);
    }

    /// Takes `status`, reported for the text of `hash`: with what it was sent, what it
    /// confirmed and refused. `Some`: it changed; and what the fleet is told of it.
    pub(super) fn take(
        &mut self,
        status: Reported,
        hash: &str,
    ) -> (Option<(Reported, String)>, Word) {
        let about = self.sent.clone().filter(|s| s.hash == hash);
        let mut word = Word::default();
        match (status.status, about) {
            (Status::Applied, about) => {
                if let Some(s) = about {
                    word.at = Some(self.answered);
                    word.change = Some(Change::Applied(s.modules.clone()));
                    self.applied = Some(s);
                }
                self.refused.clear();
                self.failed_for = None;
            }
            (Status::Failed, None) => self.refused.clear(),
            (Status::Failed, Some(_)) if fetch_failed(&status.message) => self.refused.clear(),
            (Status::Failed, Some(s)) => {
                let (refused, holdings) = self.failed(&s, &status.message);
                self.refused = refused;
                self.failed_for = Some(s.hash.clone());
                word.change = Some(Change::Failed(holdings));
            }
            _ => {}
        }
        let said = self.said(status, hash);
        if said.is_none() {
            // Said before: the fleet has it.
            word.change = None;
        }
        (said, word)
    }

    /// A call that echoes `echoed`, answered with the text `sent` made of the hub's view
    /// at `at`: what it says the collector runs, into `word`. Alloy echoes the last text
    /// it received and says a status only when it changes, so a text whose hash it echoes
    /// is one it runs — when its last status is `APPLIED`, or none was heard (a hub that
    /// restarted, or the other behind a Service) — or one it failed, when its last status
    /// is a `FAILED` of a text (the same words again; or one the hub could not place,
    /// knowing no text then): its exceptions made now if they were not. After its fetch
    /// failed (`unavailable: …`) what it runs is not known until it says `APPLIED`.
    fn echoed(&mut self, echoed: &str, at: u64, word: &mut Word) {
        let Some(sent) = self.sent.clone().filter(|s| s.hash == echoed) else {
            return;
        };
        match self.status.clone() {
            None => self.confirmed(sent, word),
            Some((r, _)) if r.status == Status::Applied => self.confirmed(sent, word),
            Some((r, _)) if r.status == Status::Failed && !fetch_failed(&r.message) => {
                if self.failed_for.as_deref() != Some(&sent.hash) {
                    let (refused, holdings) = self.failed(&sent, &r.message);
                    self.refused = refused;
                    self.failed_for = Some(sent.hash.clone());
                    self.status = Some((r, sent.hash.clone()));
                    word.change = Some(Change::Failed(holdings));
                }
            }
            _ => return,
        }
        word.at = Some(at);
    }

    /// It runs `sent`: confirmed, if it was not.
    fn confirmed(&mut self, sent: Sent, word: &mut Word) {
        if self.applied.as_ref().is_some_and(|a| a.hash == sent.hash) {
            return;
        }
        word.change = Some(Change::Applied(sent.modules.clone()));
        self.refused.clear();
        self.failed_for = None;
        let applied = Reported {
            status: Status::Applied,
            message: String::new(),
        };
        self.status = Some((applied, sent.hash.clone()));
        self.applied = Some(sent);
    }

    /// A `FAILED` of `s` with Alloy's `message`: the module versions it refused — of those
    /// new to it, the ones Alloy's diagnostics point into; all of them when no diagnostic
    /// names a line (an error of no position), none when they point elsewhere (the root,
    /// a module it runs) — and the exceptions the fleet is told: each new one, holding
    /// what the collector runs of it, the refused with Alloy's words.
    fn failed(&self, s: &Sent, message: &str) -> (Vec<Version>, Vec<Holding>) {
        let held = self.applied.as_ref().map_or(&[][..], |a| &a.modules[..]);
        let new = new_in(&s.modules, held, |a, b| a.cmp(b));
        let lines = positions(message);
        let refuses = |i: usize| {
            let (first, last) = s.spans.get(i).copied().unwrap_or((1, 0));
            lines.is_empty() || lines.iter().any(|l| (first..=last).contains(l))
        };
        let reason: Box<str> = crate::reason::cut(message, KEPT_REASON).into();
        let mut refused = Vec::new();
        let holdings = (new.iter().copied())
            .map(|i| {
                let v = &s.modules[i];
                let runs = (held.binary_search_by(|h| (*h.key).cmp(&v.key)).ok()).map(|j| &held[j]);
                let refusal = refuses(i).then(|| {
                    refused.push(v.clone());
                    Box::new(Refusal {
                        hash: v.hash,
                        resource_version: Some(v.rv),
                        by: By::Confirm,
                        reason: reason.clone(),
                    })
                });
                Holding {
                    kind: Resource::ConfigMaps,
                    key: v.key.clone(),
                    hash: runs.map(|r| r.hash),
                    resource_version: runs.map(|r| r.rv),
                    refused: refusal,
                }
            })
            .collect();
        (refused, holdings)
    }
}

/// The namespaces of `modules` (in key order), once each.
fn namespaces(modules: &[Version]) -> Vec<Box<str>> {
    let mut out: Vec<Box<str>> = Vec::new();
    for v in modules {
        let ns = v.key.split_once('/').map_or(&*v.key, |(ns, _)| ns);
        if out.last().is_none_or(|l| **l != *ns) {
            out.push(ns.into());
        }
    }
    out
}

/// The indexes of `sent`'s module versions not in `held`. Both are in key order (a
/// composition's modules are in its view's), so they are walked together: `compare` (of a
/// key of `held` with one of `sent`) is called at most once per module of either, not once
/// per pair — a failure of a text of 10,000 modules costs 20,000 comparisons under the
/// collectors' lock, not 10^8.
pub(super) fn new_in(
    sent: &[Version],
    held: &[Version],
    mut compare: impl FnMut(&str, &str) -> Ordering,
) -> Vec<usize> {
    let mut j = 0;
    let mut new = Vec::new();
    for (i, v) in sent.iter().enumerate() {
        let mut order = Ordering::Greater;
        while let Some(h) = held.get(j) {
            order = compare(&h.key, &v.key);
            if order != Ordering::Less {
                break;
            }
            j += 1;
        }
        let same = order == Ordering::Equal && held.get(j).is_some_and(|h| h.hash == v.hash);
        if !same {
            new.push(i);
        }
    }
    new
}

/// Whether a `FAILED`'s message is Alloy's own fetch failing, not a text it refused: a
/// Connect error's words (`unavailable: 503 Service Unavailable`, `unauthenticated: …`),
/// where a text's failure opens with a position or Alloy's loader's words.
fn fetch_failed(message: &str) -> bool {
    const CODES: [&str; 16] = [
        "canceled",
        "unknown",
        "invalid_argument",
        "deadline_exceeded",
        "not_found",
        "already_exists",
        "permission_denied",
        "resource_exhausted",
        "failed_precondition",
        "aborted",
        "out_of_range",
        "unimplemented",
        "internal",
        "unavailable",
        "data_loss",
        "unauthenticated",
    ];
    (message.split_once(": ")).is_some_and(|(code, _)| CODES.contains(&code))
}

/// The lines Alloy's diagnostics name. Alloy v1.19.2 sends `diag.AllMessages()`: each
/// diagnostic's `Position.String()`, `": "` and its message, joined by `"; "` — the file
/// has no name in remote content, so a position is `LINE:COL` (`LINE` when the column is
/// 0). Only the position that opens each diagnostic is read: a `N:M:` inside a message
/// (a module quoting one in its own text) points nowhere.
pub(super) fn positions(message: &str) -> Vec<usize> {
    let digits = |s: &str| !s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit());
    (message.split("; "))
        .filter_map(|d| {
            let (position, _) = d.split_once(": ")?;
            let line = match position.split_once(':') {
                Some((line, col)) => digits(col).then_some(line)?,
                None => position,
            };
            digits(line).then(|| line.parse().ok())?
        })
        .collect()
}
