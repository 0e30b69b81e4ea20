//! The service accounts that tokens for the hub (`--token-audience`) name, as the
//! apiserver's service-account authenticator checks them at every review
//! (`pkg/serviceaccount/claims.go`): the account exists, has the uid the token claims, and
//! its deletion did not begin more than a minute ago (go-jose's leeway). Read with the
//! hub's credentials (`get serviceaccounts`) and kept `ACCOUNT_TTL`, so a deleted or
//! re-created account's tokens are refused within a minute; a fleet of one account costs
//! one read a minute.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::jwt::LEEWAY_SECS;
use super::kept::Cache;
use super::reviewer::{Account, Reviewer};
use crate::locks::Recover;

/// How long a service account read is used.
pub const ACCOUNT_TTL: Duration = Duration::from_secs(60);
/// Accounts kept at most.
const MAX_ACCOUNTS: usize = 16_384;

/// What the check of a token's account says.
#[derive(Debug, PartialEq)]
pub enum Check {
    /// The account exists with the token's uid.
    Holds,
    /// It does not: why, in the apiserver's words.
    Refused(String),
    /// The hub may not read service accounts: the apiserver is to review the token.
    Unreadable,
    /// It could not be read: as a review the apiserver could not make.
    Unavailable(String),
}

/// The accounts read, kept a while.
pub struct Accounts {
    kept: Mutex<Cache<(String, String), Account>>,
}

impl Default for Accounts {
    fn default() -> Self {
        Accounts {
            kept: Mutex::new(Cache::new(MAX_ACCOUNTS)),
        }
    }
}

impl Accounts {
    /// Whether account `namespace/name` holds for a token that claims `uid`, at `now`
    /// (Unix seconds `unix`); reads it with `reviewer` when not kept.
    pub fn check(
        &self,
        reviewer: &dyn Reviewer,
        (namespace, name, uid): (&str, &str, &str),
        now: Instant,
        unix: f64,
    ) -> Check {
        let named = crate::names::dns1123_label(namespace).is_empty()
            && crate::names::dns1123_subdomain(name).is_empty();
        if !named {
            return Check::Refused("not a service account token".into());
        }
        let key = (namespace.to_string(), name.to_string());
        let held = self.kept.lock().recover().get(&key, now);
        let account = match held {
            Some(a) => a,
            None => match reviewer.account(namespace, name) {
                Ok(a) => {
                    let until = crate::backoff::after(now, ACCOUNT_TTL);
                    (self.kept.lock().recover()).put(key, a.clone(), until);
                    a
                }
                Err(e) => return Check::Unavailable(e),
            },
        };
        match account {
            Account::Gone => Check::Refused(format!("serviceaccounts \"{name}\" not found")),
            Account::Unreadable => Check::Unreadable,
            Account::Exists { uid: held, .. } if held != uid => Check::Refused(format!(
                "service account UID ({held}) does not match claim ({uid})"
            )),
            Account::Exists {
                deleted: Some(at), ..
            } if at < unix - LEEWAY_SECS => Check::Refused(format!(
                "service account {namespace}/{name} has been deleted"
            )),
            Account::Exists { .. } => Check::Holds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;
    use crate::serve::reviewer::{Attributes, Decision};
    use crate::serve::user::User;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// team/agent, whose state a test sets; how often it was read.
    struct Cluster {
        agent: Mutex<Result<Account, String>>,
        reads: AtomicUsize,
    }

    impl Reviewer for Cluster {
        fn token(&self, _: &Secret, _: Option<&str>) -> Result<Option<User>, String> {
            unreachable!()
        }
        fn access(&self, _: &User, _: &Attributes) -> Result<Decision, String> {
            unreachable!()
        }
        fn account(&self, ns: &str, name: &str) -> Result<Account, String> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            match (ns, name) {
                ("team", "agent") => self.agent.lock().unwrap().clone(),
                _ => Ok(Account::Gone),
            }
        }
    }

    /// Issue 56.7: as the apiserver's authenticator, a token whose account is gone, has
    /// another uid (deleted and re-created) or is being deleted since more than a minute
    /// is refused; the account is read once a minute however many tokens name it.
    #[test]
    fn a_tokens_account_must_exist_with_its_uid() {
        let c = Cluster {
            agent: Mutex::new(Ok(Account::Exists {
                uid: "u1".into(),
                deleted: None,
            })),
            reads: AtomicUsize::new(0),
        };
        let a = Accounts::default();
        let t0 = Instant::now();
        let unix = 10_000.0;
        for _ in 0..100 {
            assert_eq!(a.check(&c, ("team", "agent", "u1"), t0, unix), Check::Holds);
        }
        assert_eq!(c.reads.load(Ordering::SeqCst), 1, "read once");
        assert_eq!(
            a.check(&c, ("team", "agent", "u0"), t0, unix),
            Check::Refused("service account UID (u1) does not match claim (u0)".into())
        );
        assert_eq!(
            a.check(&c, ("team", "gone", "u1"), t0, unix),
            Check::Refused("serviceaccounts \"gone\" not found".into())
        );
        assert!(matches!(
            a.check(&c, ("team", "../../x", "u1"), t0, unix),
            Check::Refused(_)
        ));
        assert_eq!(
            c.reads.load(Ordering::SeqCst),
            2,
            "not asked about a made-up name"
        );
        // Deleted and re-created: refused once the read is a minute old.
        *c.agent.lock().unwrap() = Ok(Account::Exists {
            uid: "u2".into(),
            deleted: None,
        });
        let t1 = t0 + ACCOUNT_TTL + Duration::from_secs(1);
        assert!(matches!(
            a.check(&c, ("team", "agent", "u1"), t1, unix),
            Check::Refused(_)
        ));
        // Being deleted: within the leeway it holds, after it it does not.
        *c.agent.lock().unwrap() = Ok(Account::Exists {
            uid: "u1".into(),
            deleted: Some(unix - 30.0),
        });
        let t2 = t1 + ACCOUNT_TTL + Duration::from_secs(1);
        assert_eq!(a.check(&c, ("team", "agent", "u1"), t2, unix), Check::Holds);
        assert!(matches!(
            a.check(&c, ("team", "agent", "u1"), t2, unix + 60.0),
            Check::Refused(why) if why.contains("has been deleted")
        ));
        // Not readable (403), or not at all: said so, and an outage is not kept.
        *c.agent.lock().unwrap() = Err("connection refused".into());
        let t3 = t2 + ACCOUNT_TTL + Duration::from_secs(1);
        assert!(matches!(
            a.check(&c, ("team", "agent", "u1"), t3, unix),
            Check::Unavailable(_)
        ));
        *c.agent.lock().unwrap() = Ok(Account::Unreadable);
        assert_eq!(
            a.check(&c, ("team", "agent", "u1"), t3, unix),
            Check::Unreadable
        );
    }
}
