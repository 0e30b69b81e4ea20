//! What a follower (`api/follower.rs`) keeps of a `cmpoll serve` hub's answers, to follow it: whether the server
//! is a hub (it says so on every answer), how long each poll's first list may wait there
//! (`hub_protocol::WAIT_HEADER`), and each scope's last list from the hub — its
//! resourceVersion and the ids it selected — so that a 304 Not Modified keeps them all.
//! A scope where a GET found an object gone or older than its list said is unsettled: its
//! next list does not wait, so that it is looked at again at once.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// A follower's state.
#[derive(Debug, Default)]
pub struct Follow {
    /// How long a hub may hold a poll's first list.
    wait: Duration,
    /// The last answer came from a hub.
    hub: bool,
    /// No list request of this poll was made yet.
    first_of_poll: bool,
    /// Each scope's last list from a hub: its resourceVersion and the ids it selected.
    held: HashMap<String, (String, Vec<String>)>,
    unsettled: HashSet<String>,
    /// Why the hub will not be watched (it refused): followed with waiting lists.
    refused: Option<String>,
}

impl Follow {
    pub fn new(wait: Duration) -> Follow {
        Follow {
            wait,
            first_of_poll: true,
            ..Follow::default()
        }
    }

    /// A poll begins.
    pub fn poll(&mut self) {
        self.first_of_poll = true;
    }

    /// Whether the server answering is a hub.
    pub fn hub(&self) -> bool {
        self.hub
    }

    /// An answer came, from a hub or not.
    pub fn answered(&mut self, hub: bool) {
        self.hub = hub;
    }

    /// How long the list of `scope` held at resourceVersion `rv` may wait at the hub: only
    /// the poll's first list, only from a hub, only with a version to compare, only where
    /// the scope is settled. The list is being made now.
    pub fn wait_for(&mut self, scope: &str, rv: Option<&str>) -> Option<Duration> {
        let settled = !self.unsettled.remove(scope);
        let wait =
            Some(self.wait).filter(|_| self.hub && self.first_of_poll && rv.is_some() && settled);
        self.first_of_poll = false;
        wait
    }

    /// A list request was made (the poll's first, if it was).
    pub fn listing(&mut self) {
        self.first_of_poll = false;
    }

    /// The list of `scope` a watch may go on from (`watching.rs`): only from a hub that
    /// watches, only where a list from it is held and the scope is settled.
    pub fn watchable(&self, scope: &str) -> Option<(String, Vec<String>)> {
        let ok = self.hub && self.refused.is_none();
        let held = self
            .held
            .get(scope)
            .filter(|_| ok && !self.unsettled.contains(scope))?;
        Some(held.clone())
    }

    /// How long a watch of a scope may wait at the hub: the poll's first, its wait; the
    /// others none (they answer with what there is). The watch is being made now.
    pub fn watch_wait(&mut self) -> Duration {
        let wait = match self.first_of_poll {
            true => self.wait,
            false => Duration::ZERO,
        };
        self.first_of_poll = false;
        wait
    }

    /// The wait a held watch is opened with: the hub commits at least this often.
    pub fn hold_wait(&self) -> Duration {
        self.wait.max(Duration::from_secs(1))
    }

    /// `scope` is held at `rv` with `ids`: a list or watch of a complete poll.
    pub fn hold(&mut self, scope: &str, rv: &str, ids: Vec<String>) {
        self.held.insert(scope.to_string(), (rv.to_string(), ids));
    }

    /// The hub will not be watched (`why`): lists from now on.
    pub fn refuse_watch(&mut self, why: String) {
        if self.refused.is_none() {
            log::warn!(
                "the hub does not answer a watch ({why}); following it with waiting lists (a follower's role needs `watch` as well as `list`)"
            );
        }
        self.refused = Some(why);
    }

    /// The ids a 304 about `scope` at `asked` keeps, if that is the list held.
    pub fn not_modified(&self, scope: &str, asked: Option<&str>) -> Option<(String, Vec<String>)> {
        let (rv, ids) = self
            .held
            .get(scope)
            .filter(|(rv, _)| Some(rv.as_str()) == asked)?;
        Some((rv.clone(), ids.clone()))
    }

    /// A GET in `scope` found an object gone or older than its list said.
    pub fn unsettle(&mut self, scope: &str) {
        self.unsettled.insert(scope.to_string());
    }

    /// The next poll may start at once: a hub holds it.
    pub fn hub_waits(&self) -> bool {
        self.hub
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_hubs_first_settled_list_with_a_version_waits() {
        let mut f = Follow::new(Duration::from_secs(30));
        f.poll();
        assert_eq!(f.wait_for("cm/", Some("5")), None, "not a hub yet");
        f.answered(true);
        f.poll();
        assert_eq!(f.wait_for("cm/", None), None, "no version to compare");
        f.poll();
        assert_eq!(f.wait_for("cm/", Some("5")), Some(Duration::from_secs(30)));
        assert_eq!(
            f.wait_for("cm/b", Some("5")),
            None,
            "not the poll's first list"
        );
        f.poll();
        f.unsettle("cm/");
        assert_eq!(
            f.wait_for("cm/", Some("5")),
            None,
            "unsettled: looked at again at once"
        );
        f.poll();
        assert_eq!(f.wait_for("cm/", Some("5")), Some(Duration::from_secs(30)));
        f.hold("cm/", "7", vec!["a/x".into()]);
        assert_eq!(f.not_modified("cm/", Some("6")), None, "another list");
        assert_eq!(
            f.not_modified("cm/", Some("7")),
            Some(("7".to_string(), vec!["a/x".to_string()]))
        );
        assert!(f.hub_waits());
    }
}
