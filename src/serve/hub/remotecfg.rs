//! The hub's side of `--remotecfg`: a call of `collector.v1.CollectorService`, in this
//! order — without `--remotecfg`, a path like any unknown one (401, then 404); its token
//! authenticated as every request's (401 `unauthenticated`); the call's shape checked
//! (`connect::refused`: 405, 415, `unimplemented`, `invalid_argument`); sent to a lane
//! where reviews may wait; `post` on the procedure's path authorized (a non-resource URL:
//! a ClusterRole's `nonResourceURLs: ["/collector.v1.CollectorService/*"]`; 403
//! `permission_denied`), so that a token of the cluster is not enough to read the root.
//! `GetConfig` then has its status kept (`service`), then needs the hub ready (503
//! `unavailable`, as a follower's list: the collector keeps what it runs) and is served of the view of the caller's cohort (its
//! follower name's, so rollouts apply to collectors as to followers), with the modules of
//! the namespaces where it may `list` ConfigMaps — a follower's report is authorized so —
//! asked first for all namespaces, then for each namespace that holds a module, each
//! decision kept per (user name, groups) for longer than a poll (`listable.rs`).
//! `RegisterCollector` does not wait for a poll: Alloy refuses to start when it fails.
//! Collectors are kept by their identity, `collector_name` (its pod, `NAMESPACE/POD`, else
//! `user:NAME`), and the id they give.
//! Every refusal is Connect's JSON error.

use std::sync::Arc;
use std::time::Instant;

use super::Hub;
use crate::https::http::{Answer, Request};
use crate::https::server::Reply;
use crate::serve::auth::{Attributes, Auth, Halt, HubLane, User};
use crate::serve::fleet::state::follower_name;
use crate::serve::remotecfg::connect::{self, ConnectError, Rpc};
use crate::serve::remotecfg::listable;
use crate::serve::remotecfg::service::Message;
use crate::serve::request::{Query, Route};
use crate::serve::status::StatusError;
use crate::source::Resource;

/// Where a call goes, read: its route, its query and the lane it is on.
pub(super) type At<'a> = (&'a Route, &'a Query, HubLane);

impl Hub {
    /// A collector's call: its answer, or the lane it goes to.
    pub(super) fn collector(&self, req: &Request, at: At) -> Result<Reply, Halt> {
        answer(self, req, at)
    }
}

fn answer(hub: &Hub, req: &Request, (route, query, lane): At) -> Result<Reply, Halt> {
    match call(hub, req, route, query, lane) {
        Ok(a) => Ok(Reply::Answer(a)),
        Err(Halt::Lane(l)) => Err(Halt::Lane(l)),
        Err(Halt::Refused(r)) => {
            if r.code >= 500 {
                log::debug!("{}: {}", req.path, r.message);
            }
            Ok(Reply::Answer(ConnectError::from(r).answer()))
        }
    }
}

fn call(
    hub: &Hub,
    req: &Request,
    route: &Route,
    query: &Query,
    lane: HubLane,
) -> Result<Answer, Halt> {
    let (who, what) = hub.who(req, route, query, lane)?;
    let (Some(service), Some(rpc)) = (&hub.remotecfg, Rpc::at(&req.path)) else {
        return Err(StatusError::no_such_path().into());
    };
    if let Some(refused) = connect::refused(req) {
        return Ok(refused);
    }
    if !lane.may_wait() {
        return Err(Halt::Lane(HubLane::Authorize));
    }
    let auth = &hub.auth;
    auth.authorize(&who.user, &what, lane)?;
    let name = collector_name(&who.user);
    let now = Instant::now();
    let done = match rpc {
        Rpc::RegisterCollector => service.register(&name, &req.body, now),
        Rpc::UnregisterCollector => service.unregister(&name, &req.body),
        Rpc::GetConfig => {
            // Asked only once the call's status is kept (`service::get_config`).
            let view = || Ok::<_, Halt>(hub.ready_held(hub.cohort(&who.user))?.1);
            let (key, listable) = (listable::key(&who.user), &service.listable);
            let ask = |ns: Option<&str>| {
                listable.may(key, ns, now, || may_list(auth, &who.user, ns, lane))
            };
            let mut everywhere = None;
            let may = |ns: &str| {
                let all = match everywhere {
                    Some(all) => all,
                    None => *everywhere.insert(ask(None)?),
                };
                match all {
                    true => Ok(true),
                    false => ask(Some(ns)),
                }
            };
            let fleet_name = follower_name(&who.user);
            let mut tell = |word| hub.fleet.collected(&fleet_name, word, now);
            service.get_config(&name, &req.body, (view, may), &mut tell, now)?
        }
    };
    Ok(match done {
        Ok(Message::Made(bytes)) => {
            let gzipped = || crate::serve::render::gzip(&bytes).into();
            connect::message(req, bytes.clone().into(), gzipped)
        }
        Ok(Message::Text(c)) => connect::message(req, c.response(), || c.response_gzipped()),
        Err(e) => e.answer(),
    })
}

/// Who a collector is, as the hub keeps and names it (`collectors.rs`, `/status`): its pod,
/// `NAMESPACE/POD`, for a token bound to one (a ServiceAccount's, the pod's name a DNS
/// label's characters: no `:` in either part), else `user:NAME`. The two never meet: a
/// pod's name has no `:`, a user's has one before any `/` — so a user named `ns/pod` is
/// `user:ns/pod`, never that pod (a follower's name, `follower_name`, does not tell them
/// apart).
fn collector_name(user: &User) -> String {
    let pod = (user.extra.get("authentication.kubernetes.io/pod-name"))
        .and_then(|v| v.first())
        .map(String::as_str);
    let namespace = (user.name.strip_prefix("system:serviceaccount:"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _)| ns);
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && (s.bytes())
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    match (namespace, pod) {
        (Some(ns), Some(pod)) if plain(ns) && plain(pod) => format!("{ns}/{pod}"),
        _ => format!("user:{}", user.name),
    }
}

/// Whether `user` may list ConfigMaps in namespace `ns` (`None`: in all); a review that
/// fails is the call's error, never a refusal.
fn may_list(auth: &Auth, user: &Arc<User>, ns: Option<&str>, lane: HubLane) -> Result<bool, Halt> {
    let what = Attributes::Resource {
        verb: "list",
        kind: Resource::ConfigMaps,
        namespace: ns.map(str::to_string),
        name: None,
    };
    match auth.authorize(user, &what, lane) {
        Ok(()) => Ok(true),
        Err(Halt::Refused(r)) if r.code == 403 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn user(name: &str, pod: Option<&str>) -> User {
        let mut extra = BTreeMap::new();
        if let Some(p) = pod {
            let key = "authentication.kubernetes.io/pod-name".to_string();
            extra.insert(key, vec![p.to_string()]);
        }
        User {
            name: name.into(),
            uid: String::new(),
            groups: Vec::new(),
            extra,
        }
    }

    /// A user named like a pod is not that pod's collector: the names never meet.
    #[test]
    fn a_collectors_name_tells_pods_and_users_apart() {
        let pod = user("system:serviceaccount:ns:alloy", Some("pod"));
        assert_eq!(collector_name(&pod), "ns/pod");
        assert_eq!(collector_name(&user("ns/pod", None)), "user:ns/pod");
        assert_eq!(
            collector_name(&user("system:serviceaccount:ns:alloy", None)),
            "user:system:serviceaccount:ns:alloy"
        );
        // A pod name from elsewhere than a ServiceAccount, or one with a `/` or `:`.
        assert_eq!(collector_name(&user("alice", Some("pod"))), "user:alice");
        let odd = user("system:serviceaccount:ns:alloy", Some("a/b"));
        assert_eq!(collector_name(&odd), "user:system:serviceaccount:ns:alloy");
    }
}
