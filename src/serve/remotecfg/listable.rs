//! Which namespaces a collector's user may list ConfigMaps in (`Listable`), kept per
//! (user name, groups) for `LISTED_TTL`: a `GetConfig` asks one access review per
//! namespace that holds a module (when the user may not list them all), at every poll.
//! Without this, a user that may not list cluster-wide asks again at every poll each
//! namespace refused (the hub's own cache keeps a refusal under a minute, less than Alloy's
//! poll), so beyond its review budget (200 at once) its calls were refused for ever, and a
//! DaemonSet whose pods each have a token of their own (one user, told apart only by the
//! pod's name in `extra`) asked it once per pod. Kept per (name, groups), not per token:
//! RBAC decides by them alone (a webhook authorizer that reads `extra` is asked for the
//! first pod's). A decision made is kept even when a later review of the same call fails,
//! so a call refused for its budget (429) resumes where it stopped. `MAX_LISTED` decisions
//! kept at most, the user's asked longest ago forgotten first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use crate::locks::Recover;
use crate::serve::user::User;

/// How long a decision is kept: longer than Alloy's poll (a minute by default).
pub const LISTED_TTL: Duration = Duration::from_secs(300);

/// Decisions kept, all users together.
pub const MAX_LISTED: usize = 65_536;

/// A user's decisions: by namespace (`None`: all namespaces), each with when it was made;
/// and when the user last asked.
#[derive(Default)]
struct Decisions {
    by_namespace: HashMap<Option<Box<str>>, (bool, Instant)>,
    asked: Option<Instant>,
}

/// The decisions kept, per (user name, groups).
#[derive(Default)]
pub struct Listable {
    kept: Mutex<(HashMap<[u8; 32], Decisions>, usize)>,
}

/// The key a user's decisions are kept under: its name and its groups.
pub fn key(user: &User) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut part = |b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    part(user.name.as_bytes());
    for g in &user.groups {
        part(g.as_bytes());
    }
    h.finalize().into()
}

impl Listable {
    /// Whether the user of `key` may list ConfigMaps in `namespace` (`None`: in all): as
    /// kept, else as `ask` says (then kept); `ask`'s error is returned and nothing kept.
    pub fn may<E>(
        &self,
        key: [u8; 32],
        namespace: Option<&str>,
        now: Instant,
        ask: impl FnOnce() -> Result<bool, E>,
    ) -> Result<bool, E> {
        let ns: Option<Box<str>> = namespace.map(Box::from);
        {
            let mut kept = self.kept.lock().recover();
            if let Some(d) = kept.0.get_mut(&key) {
                d.asked = Some(now);
                if let Some((may, at)) = d.by_namespace.get(&ns)
                    && now.saturating_duration_since(*at) < LISTED_TTL
                {
                    return Ok(*may);
                }
            }
        }
        // Asked outside the lock: a review may take a while.
        let may = ask()?;
        let mut kept = self.kept.lock().recover();
        let (users, count) = &mut *kept;
        let d = users.entry(key).or_default();
        d.asked = Some(now);
        if d.by_namespace.insert(ns, (may, now)).is_none() {
            *count += 1;
        }
        while *count > MAX_LISTED {
            let Some(oldest) = (users.iter())
                .filter(|(k, _)| **k != key)
                .min_by_key(|(_, d)| d.asked)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some(gone) = users.remove(&oldest) {
                *count -= gone.by_namespace.len();
            }
        }
        Ok(may)
    }

    /// Decisions kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept.lock().recover().1
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::cell::Cell;
    use std::collections::BTreeMap;
    use std::convert::Infallible;

    use super::*;

    fn pod(name: &str) -> User {
        let extra = BTreeMap::from([(
            "authentication.kubernetes.io/pod-name".to_string(),
            vec![name.to_string()],
        )]);
        User {
            name: "system:serviceaccount:ns:alloy".into(),
            uid: name.into(),
            groups: vec!["system:serviceaccounts".into()],
            extra,
        }
    }

    /// Review 61 (second), finding 2: 500 namespaces a user may not list are asked once per
    /// `LISTED_TTL`, not at every poll, and once for every pod of a DaemonSet; a call
    /// stopped by its budget resumes where it stopped; another user asks its own.
    #[test]
    fn namespaces_are_asked_once_per_ttl_and_user() {
        let l = Listable::default();
        let asked = Cell::new(0);
        let t = Instant::now();
        let poll = |user: &User, at: Instant, budget: usize| -> Result<usize, ()> {
            let mut may = 0;
            for i in 0..500 {
                let ns = format!("ns{i}");
                let ok = l.may(key(user), Some(&ns), at, || {
                    if asked.get() >= budget {
                        return Err(());
                    }
                    asked.set(asked.get() + 1);
                    Ok(i % 2 == 0)
                })?;
                may += usize::from(ok);
            }
            Ok(may)
        };
        // A budget of 200 reviews a call: the first calls stop, each resuming.
        assert_eq!(poll(&pod("a"), t, 200), Err(()));
        assert_eq!(poll(&pod("a"), t, 400), Err(()));
        assert_eq!(poll(&pod("b"), t, 500), Ok(250));
        assert_eq!(asked.get(), 500);
        // Every poll within the TTL, of every pod: no review.
        for p in 0..100 {
            let at = t + Duration::from_secs(60);
            assert_eq!(poll(&pod(&format!("p{p}")), at, 500), Ok(250));
        }
        assert_eq!((asked.get(), l.len()), (500, 500));
        // Past it, asked again.
        let later = t + LISTED_TTL;
        assert_eq!(poll(&pod("a"), later, 1000), Ok(250));
        assert_eq!(asked.get(), 1000);
        // Another user (other groups) asks its own.
        let mut other = pod("a");
        other.groups.push("admins".into());
        let ask = || Ok::<_, Infallible>(true);
        assert!(l.may(key(&other), None, later, ask).unwrap());
        assert_eq!(l.len(), 501);
    }

    /// The decisions kept are bounded: over `MAX_LISTED`, the user asked longest ago goes.
    #[test]
    fn decisions_kept_are_bounded() {
        let l = Listable::default();
        let t = Instant::now();
        let yes = || Ok::<_, Infallible>(true);
        for u in 0..3 {
            let mut user = pod("a");
            user.name = format!("user{u}");
            let at = t + Duration::from_secs(u);
            for i in 0..MAX_LISTED / 2 {
                l.may(key(&user), Some(&format!("ns{i}")), at, yes).unwrap();
            }
        }
        assert!(l.len() <= MAX_LISTED, "{}", l.len());
        assert!(l.len() >= MAX_LISTED / 2);
    }
}
