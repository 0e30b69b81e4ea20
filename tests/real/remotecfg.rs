//! Alloy's `remotecfg` against a hub (issue 61): a hub under `--remotecfg` on the real
//! apiserver, and real Alloys whose local file holds nothing but a `remotecfg` block (a
//! bound service-account token in `bearer_token_file`, the hub's CA in `tls_config`). A
//! module ConfigMap written runs as a component of every Alloy within its poll frequency
//! (10 s) plus 2 s; updated and deleted likewise; a module that would leave its block is
//! sent to none; a collector without a valid token, or
//! without the right to call the service, gets nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::fleet::pod_token;
use super::hub::*;
use super::*;
use crate::alloy_modules::{alloy_bin, alloy_on, scrape_module, unbuildable};
use crate::util::{Cmpoll, KillOnDrop, SOON, eventually_explained, tools::free_port};

/// Alloy's poll frequency here: its least.
pub(crate) const POLL: Duration = Duration::from_secs(10);

/// What a change may take to run in every Alloy: a poll and 2 s.
const WITHIN: Duration = Duration::from_secs(12);

/// A service account whose pods may call the service (a ClusterRole's non-resource URL)
/// and list ConfigMaps in `ns` (a Role): what docs/alloy.md says a collector needs.
pub(crate) fn collector_account(k: &test_apiserver::real::RealApiserver, ns: &str, name: &str) {
    let _ = account(
        k,
        ns,
        name,
        Some(json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}])),
    );
    let role = format!("cmpoll-collector-{ns}-{name}");
    k.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": role},
             "rules": [{"nonResourceURLs": ["/collector.v1.CollectorService/*"], "verbs": ["post"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": role},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}]})
        .to_string(),
    );
}

/// The platform's root and offered arguments, written in `platform`: a remote write
/// (its endpoint need not answer for the component to be built) offered as `receiver`.
pub(crate) fn platform_root(platform: &Cmpoll) -> (PathBuf, PathBuf) {
    let root = platform.write(
        "root.alloy",
        &format!(
            "prometheus.remote_write \"default\" {{\n  endpoint {{\n    url = \"http://127.0.0.1:{}/api/v1/write\"\n  }}\n}}\n",
            free_port()
        ),
    );
    let offered = platform.write(
        "offered-arguments",
        "receiver = prometheus.remote_write.default.receiver\n",
    );
    (root, offered)
}

/// A module ConfigMap `ns/name` whose `module.alloy` is `text`, labelled for the hub.
pub(crate) fn module_cm(ns: &str, name: &str, text: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {"cmpoll.io/module": "true"}},
        "data": {"module.alloy": text}})
}

/// A real Alloy whose only configuration is a `remotecfg` block pointed at `hub`.
pub(crate) struct Collector {
    pub(crate) id: String,
    pub(crate) port: u16,
    logs: PathBuf,
    child: KillOnDrop,
    /// Its folder (config, token, logs), gone with it.
    _dir: Cmpoll,
}

impl Collector {
    pub(crate) fn start(alloy: &Path, hub: &Hub, id: &str, token: &str) -> Collector {
        let c = Cmpoll::new();
        let logs = c.path("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let token_file = c.write("token", token);
        let config = c.write(
            "config.alloy",
            &format!(
                r#"remotecfg {{
  url               = "{}"
  id                = "{id}"
  poll_frequency    = "{}s"
  bearer_token_file = "{}"
  attributes        = {{"team" = "a"}}
  tls_config {{
    ca_file = "{}"
  }}
}}
"#,
                hub.url(),
                POLL.as_secs(),
                token_file.display(),
                hub.ca.display()
            ),
        );
        let port = free_port();
        let child = alloy_on(alloy, &config, port, &logs, id);
        Collector {
            id: id.into(),
            port,
            logs,
            child,
            _dir: c,
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.logs.join(format!("{}.log", self.id))).unwrap_or_default()
    }

    /// Its remote components (`GET /api/v0/web/remotecfg/components`): localID → health.
    pub(crate) fn components(&self) -> Vec<(String, String)> {
        let url = format!(
            "http://127.0.0.1:{}/api/v0/web/remotecfg/components",
            self.port
        );
        let Some((200, body)) = crate::util::tools::curl(&url) else {
            return Vec::new();
        };
        let all: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        (all.as_array().into_iter().flatten())
            .map(|c| {
                let id = c["localID"].as_str().unwrap_or_default().to_string();
                (id, c["health"]["state"].as_str().unwrap_or_default().into())
            })
            .collect()
    }

    /// The components inside the remote module instance `instance` (the module it
    /// created, as Alloy's API names it).
    pub(crate) fn inside(&self, instance: &str) -> Vec<String> {
        let base = format!("http://127.0.0.1:{}/api/v0/web/remotecfg", self.port);
        let list = |url: &str| -> Vec<Value> {
            let Some((200, body)) = crate::util::tools::curl(url) else {
                return Vec::new();
            };
            let all: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            all.as_array().cloned().unwrap_or_default()
        };
        let top = list(&format!("{base}/components"));
        let Some(module) = (top.iter())
            .find(|c| c["localID"] == instance)
            .and_then(|c| c["createdModuleIDs"][0].as_str().map(str::to_string))
        else {
            return Vec::new();
        };
        (list(&format!("{base}/modules/{module}/components")).iter())
            .filter_map(|c| Some(c["localID"].as_str()?.to_string()))
            .collect()
    }
}

/// A call of the service with curl as `token`, its body empty: (status, Connect code).
fn call(hub: &Hub, procedure: &str, token: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&hub.ca)
        .args(["-X", "POST", "-H", "Content-Type: application/proto"])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["--data-binary", "", "-w", "\n%{http_code}"])
        .arg(format!(
            "{}/collector.v1.CollectorService/{procedure}",
            hub.url()
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    (
        code.trim().parse().unwrap_or(0),
        v["code"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn alloys_with_only_a_remotecfg_block_run_every_module() {
    let Some(alloy) = alloy_bin() else { return };
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-remotecfg");
    let platform = Cmpoll::new();
    let (root, offered) = platform_root(&platform);
    let hub = start_hub(
        k,
        &hub_account(k, &ns, "hub"),
        &[
            "--namespace",
            &ns,
            "--interval",
            "1s",
            "--drain-window",
            "0s",
            "--remotecfg",
            root.to_str().unwrap(),
            "--remotecfg-arguments",
            offered.to_str().unwrap(),
        ],
    );
    collector_account(k, &ns, "collector");
    let _ = account(k, &ns, "nobody", Some(json!([])));
    let alloys: Vec<Collector> = ["node-1", "node-2", "node-3", "node-4", "node-5"]
        .iter()
        .map(|pod| Collector::start(&alloy, &hub, pod, &pod_token(k, &ns, "collector", pod)))
        .collect();
    for a in &alloys {
        eventually_explained(
            "Alloy started on its remotecfg block, the root running",
            SOON,
            || (a.components().iter()).any(|(id, _)| id == "prometheus.remote_write.default"),
            || format!("{}\n{}", a.log(), hub.d.stderr()),
        );
    }

    // A collector without a valid token gets nothing: Alloy does not even start.
    let stranger = Collector::start(&alloy, &hub, "stranger", "not-a-token");
    // Nor does one whose token may not call the service.
    let nobody_token = k.token(&ns, "nobody", "10m");
    let nobody = Collector::start(&alloy, &hub, "nobody", &nobody_token);
    assert_eq!(
        call(&hub, "GetConfig", "not-a-token"),
        (401, "unauthenticated".into())
    );
    assert_eq!(
        call(&hub, "GetConfig", &nobody_token),
        (403, "permission_denied".into())
    );

    let instance = format!("{}_S_web.module", ns.replace('-', "_"));
    let cm = |name: &str, text: &str| module_cm(&ns, name, text);
    let put = |text: &str| {
        k.apply(&cm("web", text).to_string());
        Instant::now()
    };
    let every = |what: &str, written: Instant, ok: &dyn Fn(&Collector) -> bool| {
        eventually_explained(
            what,
            WITHIN,
            || alloys.iter().all(ok),
            || {
                let a = &alloys[0];
                format!("{:?}\n{}\n{}", a.components(), a.log(), hub.d.stderr())
            },
        );
        eprintln!("{what}: {:?} after the write", written.elapsed());
    };

    let written = put(&scrape_module("web", alloys[0].port, ""));
    every("the module runs in every Alloy", written, &|a| {
        a.components()
            .contains(&(instance.clone(), "healthy".into()))
    });
    let inside = alloys[0].inside(&instance);
    assert!(
        inside
            .iter()
            .any(|c| c.ends_with("prometheus.scrape.default")),
        "{inside:?}"
    );

    // Isolation, through this path too (docs/alloy.md, "Isolation, by construction"): a
    // module that closes its block to add a component to the root, one declaring another
    // module's block, one instantiating it with its own arguments — each sent to no
    // collector, said in the hub's log; the moment passed (a poll and 2 s after the hub
    // said so), no Alloy runs any of them and the module beside them runs on.
    let hostile = [
        (
            "escape",
            "argument \"receiver\" { }\n}\n\nprometheus.remote_write \"evil\" {\n  endpoint {\n    url = \"http://127.0.0.1:9/\"\n  }\n}\n\ndeclare \"swallow\" {\n",
        ),
        (
            "redeclare",
            &format!("declare \"{}_S_web\" {{\n}}\n", ns.replace('-', "_")),
        ),
        (
            "borrow",
            &format!(
                "argument \"receiver\" {{ }}\n{}_S_web \"mine\" {{\n  receiver = argument.receiver.value\n}}\n",
                ns.replace('-', "_")
            ),
        ),
    ];
    let items: Vec<Value> = hostile.iter().map(|(name, text)| cm(name, text)).collect();
    k.apply(&json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string());
    eventually_explained(
        "the hub sends the hostile modules to no collector",
        SOON,
        || {
            let log = hub.d.stderr();
            (hostile.iter()).all(|(name, _)| {
                log.contains(&format!("--remotecfg: {ns}/{name}: sent to no collector"))
            })
        },
        || hub.d.stderr(),
    );
    std::thread::sleep(WITHIN);
    for a in &alloys {
        let c = a.components();
        assert!(
            c.contains(&(instance.clone(), "healthy".into()))
                && !c.iter().any(|(id, _)| {
                    id.contains("evil")
                        || id.contains("swallow")
                        || hostile.iter().any(|(n, _)| id.contains(&format!("_S_{n}")))
                }),
            "{}: {c:?}",
            a.id
        );
    }
    k.ok(&[
        "delete",
        "configmap",
        "escape",
        "redeclare",
        "borrow",
        "-n",
        &ns,
    ]);

    // The update, with a second module added beside it.
    let updated = scrape_module("web", alloys[0].port, "").replace("\"default\"", "\"v2\"");
    let db = scrape_module("db", alloys[0].port, "");
    k.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [cm("db", &db), cm("web", &updated)]})
            .to_string(),
    );
    let written = Instant::now();
    every("the update runs in every Alloy", written, &|a| {
        let inside = a.inside(&instance);
        inside.iter().any(|c| c.ends_with("prometheus.scrape.v2"))
            && !inside
                .iter()
                .any(|c| c.ends_with("prometheus.scrape.default"))
    });

    // A version Alloy cannot build (it passes the hub's checks): the whole text fails in
    // each Alloy, which keeps running the last one; the hub's /status names the module.
    let token = scraper(k, &ns);
    let status = || {
        let (code, _, body) = get(&hub.url(), &hub.ca, token.trim(), "/status", &[]);
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        (code, v)
    };
    // With a good update of the other module in the same write: the one Alloy's
    // diagnostics point into is named (written first, the good one lands in the same text
    // or in the one before). Not a new module: Alloy v1.19.2 keeps the loader of a module
    // instance a failed text added, and refuses every later text with it ("a loader exists
    // already exists for remotecfg/…").
    let db2 = db.replace("\"default\"", "\"d2\"");
    let bad = unbuildable("web", alloys[0].port).replace("\"default\"", "\"v3\"");
    k.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [cm("db", &db2), cm("web", &bad)]})
            .to_string(),
    );
    let written = Instant::now();
    eventually_explained(
        "every collector's FAILED on /status, naming the module",
        WITHIN,
        || {
            let (_, v) = status();
            let f = &v["remotecfg"]["failed"];
            let named = |i: usize| {
                f[i]["modules"] == json!([format!("{ns}/web")])
                    && (f[i]["message"].as_str()).is_some_and(|m| m.contains("scrape_timeout"))
            };
            v["remotecfg"]["failedCount"] == alloys.len() && (0..alloys.len()).all(named)
        },
        || format!("{}\n{}", status().1, hub.d.stderr()),
    );
    eprintln!("FAILED on /status: {:?} after the write", written.elapsed());
    for a in &alloys {
        let inside = a.inside(&instance);
        assert!(
            inside.iter().any(|c| c.ends_with("prometheus.scrape.v2")),
            "the last good version runs on: {inside:?}"
        );
    }

    k.ok(&["delete", "configmap", "web", "-n", &ns]);
    let written = Instant::now();
    let db_instance = format!("{}_S_db.module", ns.replace('-', "_"));
    every(
        "the module is gone from every Alloy, the other one runs",
        written,
        &|a| {
            let c = a.components();
            !c.iter().any(|(id, _)| *id == instance)
                && c.contains(&(db_instance.clone(), "healthy".into()))
                && c.iter()
                    .any(|(id, _)| id == "prometheus.remote_write.default")
        },
    );

    // The hub's /status: every collector, each running what it was last sent.
    eventually_explained(
        "the hub's /status names every collector applied",
        WITHIN,
        || {
            let (code, v) = status();
            code == 200
                && v["remotecfg"]["collectors"] == alloys.len()
                && v["remotecfg"]["applied"] == alloys.len()
                && v["remotecfg"]["failedCount"] == 0
        },
        || status().1.to_string(),
    );

    // The refused ones never ran anything: Alloy stops when it cannot register.
    for (mut a, words) in [(stranger, "unauthenticated"), (nobody, "permission_denied")] {
        let status = wait_exit(&mut a.child.0, SOON);
        let log = a.log();
        assert!(
            status.is_some_and(|s| !s.success()) && log.contains(words),
            "{}: {status:?}\n{log}",
            a.id
        );
    }
}

/// The child's exit status within `within`, if it exits.
fn wait_exit(
    child: &mut std::process::Child,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}
