//! Who asks, and whether they may — the two checks every request meets, as
//! kube-rbac-proxy draws them: authentication (`authn.rs`: a bearer token made a user by a
//! TokenReview, or by the hub itself for `--token-audience`) and authorization (`authz.rs`:
//! what the request asks, by a SubjectAccessReview), each with its caches and budgets, both
//! asking the same `Reviewer` (`reviews.rs`: the apiserver). This room joins them for the
//! handler (`hub.rs`) and names their shared vocabulary (`reviewer.rs`).

use std::sync::Arc;

use super::authn::Authenticator;
use super::authz::Authorizer;
use super::issuer::Issuer;
use crate::ops::metrics::{Decisions, ServerCounts};

pub use super::authn::{REVIEW_BURST, REVIEW_RATE, Who};
pub use super::reviewer::{Attributes, Halt, HubLane, Reviewer};
pub use super::user::User;

/// Authentication and authorization with their caches.
pub struct Auth {
    authn: Authenticator,
    authz: Authorizer,
}

impl Auth {
    pub fn new(reviewer: Box<dyn Reviewer>, decisions: Decisions, counts: ServerCounts) -> Auth {
        Auth::with_rate(reviewer, decisions, counts, REVIEW_RATE, REVIEW_BURST)
    }

    /// `new`, with another bound on the reviews of unknown tokens.
    pub fn with_rate(
        reviewer: Box<dyn Reviewer>,
        decisions: Decisions,
        counts: ServerCounts,
        rate: f64,
        burst: f64,
    ) -> Auth {
        let reviewer: Arc<dyn Reviewer> = Arc::from(reviewer);
        Auth {
            authn: Authenticator::new(
                reviewer.clone(),
                decisions.clone(),
                counts.clone(),
                (rate, burst),
            ),
            authz: Authorizer::new(reviewer, decisions, counts),
        }
    }

    /// The cluster's service-account issuer: which tokens it signed (their reviews draw on
    /// a larger budget), and with `--token-audience` tokens for the hub verified here.
    pub fn verifying(mut self, issuer: Option<Issuer>) -> Auth {
        self.authn = self.authn.verifying(issuer);
        self
    }

    /// Reviews a service account's access once for all its pods
    /// (`--authorize-per-service-account`).
    pub fn per_service_account(mut self, on: bool) -> Auth {
        self.authn = self.authn.per_service_account(on);
        self
    }

    /// The user behind an `Authorization` header (`Authenticator::authenticate`).
    pub fn authenticate(&self, authorization: Option<&str>, lane: HubLane) -> Result<Who, Halt> {
        self.authn.authenticate(authorization, lane)
    }

    /// Whether `user` may do `what` (`Authorizer::authorize`).
    pub fn authorize(
        &self,
        user: &Arc<User>,
        what: &Attributes,
        lane: HubLane,
    ) -> Result<(), Halt> {
        self.authz.authorize(user, what, lane)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;
    use crate::serve::reviewer::{Account, Decision};
    use crate::serve::testing::Fake;
    use crate::source::Resource;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn code<T: std::fmt::Debug>(r: Result<T, Halt>) -> u16 {
        match r.unwrap_err() {
            Halt::Refused(r) => r.code,
            Halt::Lane(_) => 0,
        }
    }

    fn list(kind: Resource, ns: Option<&str>) -> Attributes {
        Attributes::Resource {
            verb: "list",
            kind,
            namespace: ns.map(str::to_string),
            name: None,
        }
    }

    /// A request's two checks, each kept: a token reviewed once, a decision once.
    #[test]
    fn who_and_what_are_each_reviewed_once() {
        let fake = Arc::new(Fake::default());
        let decisions = Decisions::default();
        let auth = Auth::new(
            Box::new(fake.clone()),
            decisions.clone(),
            ServerCounts::default(),
        );
        assert!(matches!(
            auth.authenticate(Some("Bearer good"), HubLane::Answer),
            Err(Halt::Lane(HubLane::Authenticate))
        ));
        let alice = auth
            .authenticate(Some("Bearer good"), HubLane::Authenticate)
            .unwrap()
            .user;
        let team_a = list(Resource::ConfigMaps, Some("team-a"));
        auth.authorize(&alice, &team_a, HubLane::Authorize).unwrap();
        auth.authorize(&alice, &team_a, HubLane::Answer).unwrap();
        assert_eq!(
            code(auth.authorize(
                &alice,
                &list(Resource::ConfigMaps, None),
                HubLane::Authorize
            )),
            403
        );
        assert_eq!(
            code(auth.authenticate(Some("Bearer bad"), HubLane::Authenticate)),
            401
        );
        assert_eq!(
            code(auth.authenticate(Some("Bearer bad"), HubLane::Answer)),
            401
        );
        assert_eq!(fake.tokens.load(Ordering::SeqCst), 2);
        assert_eq!(fake.access.load(Ordering::SeqCst), 2);
        assert_eq!(decisions.get("authorization", "allowed", "hit"), 1);
        assert_eq!(decisions.get("authentication", "denied", "hit"), 1);
    }

    /// Every token "pod-N" is service account team/agent in pod N.
    #[derive(Default)]
    struct Pods {
        tokens: AtomicUsize,
        access: AtomicUsize,
    }

    impl Reviewer for Arc<Pods> {
        fn token(&self, token: &Secret, _: Option<&str>) -> Result<Option<User>, String> {
            self.tokens.fetch_add(1, Ordering::SeqCst);
            let pod = token.expose().strip_prefix("pod-").map(str::to_string);
            Ok(pod.map(|pod| User {
                name: "system:serviceaccount:team:agent".into(),
                uid: "sa-uid".into(),
                groups: vec!["system:serviceaccounts".into()],
                extra: [(
                    "authentication.kubernetes.io/pod-name".to_string(),
                    vec![pod],
                )]
                .into(),
            }))
        }

        fn access(&self, _user: &User, _what: &Attributes) -> Result<Decision, String> {
            self.access.fetch_add(1, Ordering::SeqCst);
            Ok(Decision::Allowed)
        }

        fn account(&self, _: &str, _: &str) -> Result<Account, String> {
            Ok(Account::Gone)
        }
    }

    /// Issue 49.2: a DaemonSet's pods differ only in `extra`; with
    /// `--authorize-per-service-account` their access is reviewed once per scope, without
    /// it once per pod.
    #[test]
    fn a_service_accounts_pods_share_their_access_review_when_asked() {
        for (per_account, reviews) in [(false, 5), (true, 1)] {
            let pods = Arc::new(Pods::default());
            let auth = Auth::new(
                Box::new(pods.clone()),
                Decisions::default(),
                ServerCounts::default(),
            )
            .per_service_account(per_account);
            for n in 0..5 {
                let who = auth
                    .authenticate(Some(&format!("Bearer pod-{n}")), HubLane::Authenticate)
                    .unwrap();
                let what = list(Resource::ConfigMaps, Some("team"));
                auth.authorize(&who.user, &what, HubLane::Authorize)
                    .unwrap();
            }
            assert_eq!(pods.access.load(Ordering::SeqCst), reviews, "{per_account}");
            assert_eq!(pods.tokens.load(Ordering::SeqCst), 5, "each token reviewed");
        }
    }
}
