//! The differential test's world, made once: three namespaces of ConfigMaps and Secrets
//! (selected and not), one service account per distinct role the cases draw (its Roles or
//! ClusterRole, its token), two hubs over those objects (one cluster-wide, one of `ns0`
//! and `ns1`; both kinds, polling every second), a viewer that may read everything, and
//! the versions requests name. Also the writes: the pre-phase's and each watch batch's
//! script, each at its own moment, further apart than two polls of the hubs.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_apiserver::real::RealApiserver;

use super::compare::{Answer, Body, Selection};
use super::draw::{Kind, Rv, Scope, Who};
use crate::real::LABEL;
use crate::real::hub::{Hub, get, hub_account_with_secrets, start_hub};
use crate::util::eventually_explained;

/// Time between two writes: more than two polls of a hub (1 s, jitter 0.1), so that each
/// write is an event of its own (docs/serve.md: a poll's writes arrive as one event).
pub const STEP: Duration = Duration::from_millis(2500);

const SELECTED_A: &[(&str, &str)] = &[LABEL, ("team", "a")];
const SELECTED_B: &[(&str, &str)] = &[LABEL, ("team", "b")];
const SELECTED: &[(&str, &str)] = &[LABEL];
const UNSELECTED_A: &[(&str, &str)] = &[("team", "a")];

/// The objects of each namespace and kind at the start.
const OBJECTS: &[(&str, &[(&str, &str)])] = &[
    ("a", SELECTED_A),
    ("b", SELECTED_B),
    ("c", SELECTED),
    ("u", UNSELECTED_A),
];

/// One write: an object put (created or replaced by server-side apply) with these labels,
/// or deleted.
pub enum Write {
    Put(
        Kind,
        usize,
        &'static str,
        &'static [(&'static str, &'static str)],
    ),
    Delete(Kind, usize, &'static str),
}

use Kind::{ConfigMaps as Cm, Secrets as Sec};

/// Between the old version and the static phase: two objects change, two appear.
pub const PRE_PHASE: &[Write] = &[
    Write::Put(Cm, 0, "b", SELECTED_B),
    Write::Put(Sec, 1, "b", SELECTED_B),
    Write::Put(Cm, 0, "p", SELECTED_A),
    Write::Put(Sec, 2, "p", SELECTED),
];

/// What every watch batch sees: `w` created, changed, moved out of `team=a` and out of
/// the hub's selection and back, in three namespaces, deleted; then `a` changed in `ns0`
/// alone (both kinds), its neighbour `ns1` quiet.
pub const SCRIPT: &[Write] = &[
    Write::Put(Cm, 0, "w", SELECTED_A),
    Write::Put(Sec, 1, "w", SELECTED_A),
    Write::Put(Cm, 0, "w", SELECTED_A),
    Write::Put(Cm, 0, "w", SELECTED_B),
    Write::Put(Sec, 1, "w", UNSELECTED_A),
    Write::Put(Cm, 2, "w", SELECTED),
    Write::Put(Sec, 1, "w", SELECTED_A),
    Write::Put(Cm, 0, "w", SELECTED_A),
    Write::Delete(Cm, 0, "w"),
    Write::Delete(Sec, 1, "w"),
    Write::Delete(Cm, 2, "w"),
    Write::Put(Cm, 0, "a", SELECTED_A),
    Write::Put(Sec, 0, "a", SELECTED_A),
];

/// A collection at a hub: (hub, kind, namespace or all).
type Collection = (usize, Kind, Option<usize>);

pub struct World {
    pub k: &'static RealApiserver,
    pub ns: [String; 3],
    pub hubs: Vec<Hub>,
    /// What each hub serves.
    pub sels: Vec<Selection>,
    /// The version of each hub's first poll.
    pub hub_first: Vec<u64>,
    /// May get, list and watch both kinds everywhere.
    pub viewer: String,
    tokens: HashMap<Who, String>,
    /// A version from before the pre-phase.
    pub old: u64,
    /// Versions read in this phase: each hub's per collection, and the apiserver's.
    rvs: RefCell<HashMap<Collection, u64>>,
    api_rv: RefCell<Option<u64>>,
    writes: RefCell<u64>,
}

impl World {
    pub fn make(k: &'static RealApiserver, roles: &[Who]) -> World {
        let started = Instant::now();
        let ns = [
            k.namespace("diff"),
            k.namespace("diff"),
            k.namespace("diff"),
        ];
        let accounts = k.namespace("diff-accounts");
        let mut items = Vec::new();
        for n in &ns {
            for (name, labels) in OBJECTS {
                items.push(object(Cm, n, name, labels, "0"));
                items.push(object(Sec, n, name, labels, "0"));
            }
        }
        // One account per role, bound where the role says; the viewer last.
        let mut tokens = HashMap::new();
        let mut names = Vec::new();
        for (i, who) in roles.iter().enumerate() {
            let Who::Account(role) = who else {
                continue;
            };
            let sa = format!("r{i}");
            items.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": sa, "namespace": accounts}}));
            let bind_in: Vec<Option<&str>> = match role.scope {
                Scope::One => vec![Some(&ns[0])],
                Scope::Two => vec![Some(&ns[0]), Some(&ns[1])],
                Scope::Cluster => vec![None],
            };
            for at in bind_in {
                items.extend(binding(&accounts, &sa, at, role.rules()));
            }
            names.push((who.clone(), sa));
        }
        items.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "viewer", "namespace": accounts}}));
        items.extend(binding(
            &accounts,
            "viewer",
            None,
            json!([{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list", "watch"]}]),
        ));
        k.ok_in(
            &["create", "-f", "-"],
            Some(&json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()),
        );
        let token = |sa: &str| {
            k.ok(&["create", "token", sa, "-n", &accounts, "--duration", "2h"])
                .trim()
                .to_string()
        };
        let made: Vec<(Who, String)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..3)
                .map(|w| {
                    let names = &names;
                    s.spawn(move || {
                        (names.iter().skip(w).step_by(3))
                            .map(|(who, sa)| (who.clone(), token(sa)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        tokens.extend(made);
        tokens.insert(Who::Anonymous, String::new());
        tokens.insert(Who::Refused, "diff-refused-token-0123456789".into());
        let viewer = token("viewer");
        let hub_token = hub_account_with_secrets(k, &accounts, "hub");
        let both = ["--resource", "configmaps,secrets", "--interval", "1s"];
        let two = [&both[..], &["--namespace", &ns[0], "--namespace", &ns[1]]].concat();
        let hubs = vec![
            start_hub(k, &hub_token, &both),
            start_hub(k, &hub_token, &two),
        ];
        let sels = vec![
            Selection { namespaces: None },
            Selection {
                namespaces: Some(vec![ns[0].clone(), ns[1].clone()]),
            },
        ];
        let mut w = World {
            k,
            ns,
            hubs,
            sels,
            hub_first: Vec::new(),
            viewer,
            tokens,
            old: 0,
            rvs: RefCell::default(),
            api_rv: RefCell::default(),
            writes: RefCell::new(0),
        };
        w.settle();
        w.hub_first = (0..w.hubs.len())
            .map(|h| w.hub_rv(h, Cm, None).min(w.hub_rv(h, Sec, None)))
            .collect();
        w.old = w.api_rv();
        eprintln!(
            "differential: ns0={} ns1={} ns2={}, {} accounts, hubs at {:?}, old version {} ({:.0?})",
            w.ns[0],
            w.ns[1],
            w.ns[2],
            names.len(),
            w.hub_first,
            w.old,
            started.elapsed()
        );
        w
    }

    pub fn token(&self, who: &Who) -> &str {
        &self.tokens[who]
    }

    /// Writes `writes`, the first at once, each `STEP` after the one before.
    pub fn run(&self, writes: &[Write]) {
        let start = Instant::now();
        for (i, w) in writes.iter().enumerate() {
            let at = start + STEP * i as u32;
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            self.write(w);
        }
        std::thread::sleep(STEP);
    }

    fn write(&self, w: &Write) {
        let n = {
            let mut n = self.writes.borrow_mut();
            *n += 1;
            n.to_string()
        };
        match w {
            Write::Put(Cm, i, name, labels) => {
                self.k
                    .put_configmap(&self.ns[*i], name, labels, &[("k", &n)]);
            }
            Write::Put(Sec, i, name, labels) => {
                self.k.put_secret(&self.ns[*i], name, labels, &[("k", &n)]);
            }
            Write::Delete(kind, i, name) => {
                let kind = if *kind == Cm { "configmap" } else { "secret" };
                self.k.delete(kind, &self.ns[*i], name);
            }
        }
    }

    /// Waits until each hub serves what the apiserver holds, through its selection; then
    /// forgets the versions read before.
    pub fn settle(&self) {
        self.rvs.borrow_mut().clear();
        *self.api_rv.borrow_mut() = None;
        let sel = "?labelSelector=cmpoll.io%2Fmodule%3Dtrue";
        for (h, hub) in self.hubs.iter().enumerate() {
            let last = RefCell::new(String::new());
            let within =
                |ns: &String| (self.sels[h].namespaces.as_ref()).is_none_or(|n| n.contains(ns));
            eventually_explained(
                "the hub serving what the apiserver holds",
                Duration::from_secs(30),
                || {
                    [Cm, Sec].into_iter().all(|kind| {
                        let path = format!("/api/v1/{}{sel}", kind.plural());
                        let api = self.fetch(&self.k.url, &self.k.ca_file(), &path);
                        let at_hub = self.fetch(&hub.url(), &hub.ca, &path);
                        let api = keys(&api, within);
                        let at_hub = keys(&at_hub, |_| true);
                        *last.borrow_mut() = format!(
                            "hub {h} {}: apiserver {api:?}, hub {at_hub:?}",
                            kind.plural()
                        );
                        api.is_some() && api == at_hub
                    })
                },
                || last.borrow().clone(),
            );
        }
    }

    /// A GET as the viewer, read.
    fn fetch(&self, base: &str, ca: &std::path::Path, path: &str) -> Answer {
        let (code, _, body) = get(base, ca, &self.viewer, path, &[]);
        Answer::parse(code, &body, None)
    }

    /// The apiserver's current version (read once a phase).
    pub fn api_rv(&self) -> u64 {
        if let Some(rv) = *self.api_rv.borrow() {
            return rv;
        }
        let rv = self.list_rv(&self.k.url, &self.k.ca_file(), "/api/v1/configmaps?limit=1");
        *self.api_rv.borrow_mut() = Some(rv);
        rv
    }

    /// The version of a collection at hub `h` (read once a phase): what its clients hold.
    pub fn hub_rv(&self, h: usize, kind: Kind, ns: Option<usize>) -> u64 {
        if let Some(rv) = self.rvs.borrow().get(&(h, kind, ns)) {
            return *rv;
        }
        let scope = ns
            .map(|i| format!("/namespaces/{}", self.ns[i]))
            .unwrap_or_default();
        let path = format!(
            "/api/v1{scope}/{}?labelSelector=cmpoll.io%2Fmodule%3Dtrue",
            kind.plural()
        );
        let hub = &self.hubs[h];
        let rv = self.list_rv(&hub.url(), &hub.ca, &path);
        self.rvs.borrow_mut().insert((h, kind, ns), rv);
        rv
    }

    fn list_rv(&self, base: &str, ca: &std::path::Path, path: &str) -> u64 {
        let (code, _, body) = get(base, ca, &self.viewer, path, &[]);
        let v: Value = serde_json::from_slice(&body).unwrap_or_default();
        (v["metadata"]["resourceVersion"].as_str())
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("{base}{path}: {code} {v}"))
    }

    /// The version a request names, as sent.
    pub fn rv(&self, rv: Option<Rv>, h: usize, kind: Kind, ns: Option<usize>) -> Option<String> {
        Some(match rv? {
            Rv::Zero => "0".into(),
            Rv::Hub => self.hub_rv(h, kind, ns).to_string(),
            Rv::Api => self.api_rv().to_string(),
            Rv::Old => self.old.to_string(),
            Rv::Bogus => "abc".into(),
        })
    }
}

/// A list's objects in the namespaces `within` takes, as `ns/name@rv`.
fn keys(a: &Answer, within: impl Fn(&String) -> bool) -> Option<BTreeSet<String>> {
    match &a.body {
        Body::List { items, .. } => Some(
            (items.iter())
                .filter(|o| within(&o.ns))
                .map(|o| format!("{}/{}@{}", o.ns, o.name, o.rv))
                .collect(),
        ),
        _ => None,
    }
}

fn object(kind: Kind, ns: &str, name: &str, labels: &[(&str, &str)], v: &str) -> Value {
    let labels: serde_json::Map<String, Value> = (labels.iter())
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let (kind, field) = match kind {
        Cm => ("ConfigMap", "data"),
        Sec => ("Secret", "stringData"),
    };
    json!({"apiVersion": "v1", "kind": kind,
        "metadata": {"name": name, "namespace": ns, "labels": labels}, field: {"k": v}})
}

/// A Role and RoleBinding in `ns` (`None`: a ClusterRole and ClusterRoleBinding) giving
/// `rules` to service account `accounts/sa`.
fn binding(accounts: &str, sa: &str, ns: Option<&str>, rules: Value) -> Vec<Value> {
    let name = format!("diff-{accounts}-{sa}");
    let meta = match ns {
        Some(ns) => json!({"name": name, "namespace": ns}),
        None => json!({"name": name}),
    };
    let (role, bound) = match ns {
        Some(_) => ("Role", "RoleBinding"),
        None => ("ClusterRole", "ClusterRoleBinding"),
    };
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": role, "metadata": meta, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": bound, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": accounts}]}),
    ]
}
