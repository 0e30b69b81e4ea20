//! cmpoll against the real kube-apiserver (issue 24): the apiserver-facing scenarios of the
//! suite, each checked against what the real apiserver says it served (its metrics and its
//! audit log), not only against what cmpoll printed. Two clusters per test binary
//! (`test_apiserver::real::shared`), each used by one test at a time; each test works in
//! namespaces of its own. This file has
//! the helpers; the scenarios are `lists.rs` (list modes, paging, RBAC), `credentials.rs`
//! (tokens, 401s, kubeconfigs, impersonation), `flow.rs` (APF) and `manifests.rs` (the
//! shipped manifests and the label policy).

mod bounds;
mod budgets;
mod clients;
mod connections;
mod credentials;
// The hub against the apiserver, request by request: generated roles × requests, both
// answers compared (never more than the apiserver); `CMPOLL_DIFF_SEED`, `CMPOLL_DIFF_CASES`.
mod differential;
mod events;
mod fleet;
mod fleet_alloy;
mod flow;
mod follower_reports;
mod following;
mod hostile;
mod hub;
mod lists;
mod manifests;
mod methods;
mod remotecfg;
mod remotecfg_rollout;
// Issue 60: rollouts (steps, cohorts, refusals, replaced versions, two hubs and restarts).
mod rollout;
mod serve;
mod short_watch;
mod tokens;
mod validated;
mod watch;
mod webhook;

use std::sync::{Mutex, MutexGuard, TryLockError};

use serde_json::{Value, json};
use test_apiserver::real::{self, RealApiserver, User};

use crate::util::{Cmpoll, skip_unless};

pub const LABEL: (&str, &str) = ("cmpoll.io/module", "true");

/// A shared real cluster, or `None` (a loud skip; a failure under CI) when it is not
/// built. The guard keeps the tests that use one cluster one at a time: they read the
/// apiserver's own counters, which every client moves. There are `real::LANES` of them, so
/// that a scenario waiting on its apiserver does not hold up every other one: at most
/// `real::LANES` scenarios at once, each alone on its cluster.
pub fn cluster() -> Option<(MutexGuard<'static, ()>, &'static RealApiserver)> {
    if skip_unless(
        real::built(),
        "the real kube-apiserver (tests/kube/build.sh)",
    ) {
        return None;
    }
    loop {
        for (lane, lock) in LOCKS.iter().enumerate() {
            let guard = match lock.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => continue,
            };
            return Some((guard, real::shared(lane)));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `cluster()`, with no other real scenario running meanwhile (every lane held): for the
/// scenarios that measure a rate or a delay, which a second scenario's apiserver beside
/// them would slow. (`cluster()` never waits while it holds a lane, so taking them all in
/// order cannot deadlock.)
pub fn cluster_alone() -> Option<(Vec<MutexGuard<'static, ()>>, &'static RealApiserver)> {
    if skip_unless(
        real::built(),
        "the real kube-apiserver (tests/kube/build.sh)",
    ) {
        return None;
    }
    let guards = (LOCKS.iter())
        .map(|l| l.lock().unwrap_or_else(|p| p.into_inner()))
        .collect();
    Some((guards, real::shared(0)))
}

/// One lock per shared cluster.
static LOCKS: [Mutex<()>; real::LANES] = [const { Mutex::new(()) }; real::LANES];

/// A cmpoll whose kubeconfig is `user`'s.
pub fn cmpoll_as(k: &RealApiserver, name: &str, user: &User) -> Cmpoll {
    let c = Cmpoll::new();
    let kubeconfig = k.write_kubeconfig(&format!("{name}.kubeconfig"), user);
    c.env("KUBECONFIG", kubeconfig.to_str().unwrap())
}

/// The rules the shipped ClusterRole grants (`k8s/cluster-wide/clusterrole.yaml`): the
/// scenarios run cmpoll with exactly those, unless they test a narrower role.
pub fn shipped_rules() -> Value {
    let path = crate::util::root().join("k8s/cluster-wide/clusterrole.yaml");
    let role: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(role["rules"].is_array(), "{role}");
    role["rules"].clone()
}

/// A service account in `ns` with a Role there of `rules` (`None`: the shipped ones); its
/// bound token.
pub fn account(k: &RealApiserver, ns: &str, name: &str, rules: Option<Value>) -> String {
    let rules = rules.unwrap_or_else(shipped_rules);
    k.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": name, "namespace": ns}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": name, "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}]})
        .to_string(),
    );
    k.token(ns, name, "1h")
}

/// The audit events since `mark` of requests by `user` to `ns`'s ConfigMaps, in order.
pub fn requests(k: &RealApiserver, mark: u64, user: &str, ns: &str) -> Vec<Value> {
    k.audit_since(mark)
        .into_iter()
        .filter(|e| e["user"]["username"] == user && e["stage"] == "ResponseComplete")
        .filter(|e| e["objectRef"]["namespace"] == ns && e["objectRef"]["resource"] == "configmaps")
        .collect()
}

/// `verb uri code` of audit events, for messages.
pub fn show(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e["verb"].as_str().unwrap_or(""),
                e["requestURI"].as_str().unwrap_or(""),
                e["responseStatus"]["code"]
            )
        })
        .collect()
}

/// Lists of ConfigMaps as the real apiserver counts them: served from the watch cache,
/// from etcd, and the etcd lists that are the apiserver's own — its watch cache (re)filling
/// itself (`apiserver_watch_cache_initializations_total`: a cache whose etcd watch broke,
/// under load, lists again) and a consistent read the cache could not serve in time
/// (`apiserver_watch_cache_consistent_read_total{fallback="true"}`: a list with no
/// resourceVersion, which cmpoll never sends — its lists are read off the audit log).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lists {
    pub cache: f64,
    pub etcd: f64,
    /// Consistent reads sent to etcd: one etcd list each.
    pub fallbacks: f64,
    /// Cache refills, done or failed: pages of etcd lists, how many not known.
    pub refills: f64,
}

impl Lists {
    /// Lists from etcd between `self` and `later` that are not the apiserver's own; `None`
    /// when its cache refilled meanwhile (then nobody can tell: the attempt says nothing).
    pub fn unexplained_since(&self, later: &Lists) -> Option<f64> {
        (later.refills == self.refills)
            .then_some((later.etcd - self.etcd) - (later.fallbacks - self.fallbacks))
    }
}

pub fn storage_lists(k: &RealApiserver) -> Lists {
    let text = k.metrics();
    let configmaps = [("resource", "configmaps")];
    let sum = |name: &str, labels: &[(&str, &str)]| real::metric_sum(&text, name, labels);
    let all = sum("apiserver_storage_list_total", &configmaps);
    let cache = sum(
        "apiserver_storage_list_total",
        &[("resource", "configmaps"), ("storage", "watchcache")],
    );
    Lists {
        cache,
        etcd: all - cache,
        fallbacks: sum(
            "apiserver_watch_cache_consistent_read_total",
            &[("resource", "configmaps"), ("fallback", "true")],
        ),
        refills: sum("apiserver_watch_cache_initializations_total", &configmaps)
            + sum(
                "apiserver_watch_cache_initialization_errors_total",
                &configmaps,
            ),
    }
}

/// When an audit event's request arrived.
pub fn received(e: &Value) -> std::time::SystemTime {
    humantime::parse_rfc3339(e["requestReceivedTimestamp"].as_str().unwrap()).unwrap()
}

/// A cmpoll that runs in-cluster as a pod would: `KUBERNETES_SERVICE_*` pointing at `k`,
/// and a service-account folder with `token`, the CA and `namespace`; also that folder.
pub fn in_cluster(k: &RealApiserver, token: &str, namespace: &str) -> (Cmpoll, std::path::PathBuf) {
    let c = Cmpoll::new();
    c.write("sa/token", token);
    c.write("sa/ca.crt", &k.ca_pem());
    c.write("sa/namespace", namespace);
    let sa = c.path("sa");
    let c = c
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", &k.port.to_string())
        .env("CMPOLL_SERVICE_ACCOUNT_DIR", sa.to_str().unwrap());
    (c, sa)
}

/// A fresh namespace `PREFIX-N` with one module, `a` (`k: 1`), and a service account
/// `name` there with the shipped rules: the namespace and the account's bound token.
pub fn namespace_with_a_module(k: &RealApiserver, prefix: &str, name: &str) -> (String, String) {
    let ns = k.namespace(prefix);
    let token = account(k, &ns, name, None);
    k.put_configmap(&ns, "a", &[LABEL], &[("k", "1")]);
    (ns, token)
}
