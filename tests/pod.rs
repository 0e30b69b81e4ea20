//! The shipped deployments are executed, not only validated (issue 16). Each kustomize
//! variant is rendered with `kubectl kustomize`, and each Deployment is run the way a
//! kubelet would run it, as far as this machine allows:
//!
//! - the cluster is a test apiserver holding every ConfigMap the variant and
//!   `k8s/examples` ship (module ConfigMaps as Secrets where the variant's role lists
//!   secrets), with the service account's access granted from the rendered ClusterRole or
//!   Role, resource by resource (a variant without RBAC cannot list);
//! - volumes are folders: an emptyDir shared between containers, a ConfigMap volume filled
//!   from the rendered ConfigMap, a projected service-account volume holding the test
//!   apiserver's token, CA and the pod's namespace; each mount path is replaced by its
//!   folder in args, env values and mounted configuration files (no mount namespaces), and
//!   cmpoll finds its service-account folder through `CMPOLL_SERVICE_ACCOUNT_DIR` only when
//!   the container mounts one at the default path (no mount, no token);
//! - env `value`s and `fieldRef`s (`metadata.namespace`, `metadata.name`) are filled,
//!   `KUBERNETES_SERVICE_HOST`/`_PORT` point at the test apiserver, processes run as
//!   `runAsUser`/`runAsGroup` with volume folders owned by `fsGroup`;
//! - init containers run to completion first, then the containers; every declared probe is
//!   asked on its declared port and path until it answers 200 (a probe with a `host` is a
//!   failure: the kubelet would probe the node, not the pod);
//! - images run the real binaries: cmpoll's image the binary under test, Prometheus's
//!   image Debian's `prometheus` (and its `/bin/promtool`, which the webhook component's
//!   init container copies out with the image's `cp`: this machine's `cp`), Alloy's
//!   image the real Alloy tests/alloy/build.sh builds.
//!
//! Besides the kustomize variants: charts/cmpoll's renders, and Grafana's own alloy chart
//! (from Alloy v1.19.2's Go module) with k8s/alloy-helm's values, rendered by the real helm
//! and applied on the real apiserver, whose tokens and RBAC the pods then use.
//!
//! Then the agent must do its job: Prometheus serves the rules of the example modules and
//! cmpoll's own alerts, and an update reaches it.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use test_apiserver::{ConfigMap, Grant, TestApiserver, USER};

use crate::util::tools::{curl, prometheus_rules, tool, yaml_docs};
use crate::util::{BIN, KillOnDrop, SOON, eventually_explained, root, skip_unless};

/// `kubectl kustomize k8s/VARIANT`, as JSON objects (PyYAML of the CI virtualenv).
fn render(variant: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join("k8s").join(variant))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize k8s/{variant}: {out:?}"
    );
    yaml_docs(&out.stdout)
}

fn examples() -> Vec<Value> {
    let mut all = Vec::new();
    for e in std::fs::read_dir(root().join("k8s/examples")).unwrap() {
        all.extend(yaml_docs(&std::fs::read(e.unwrap().path()).unwrap()));
    }
    all
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn to_configmap(o: &Value) -> ConfigMap {
    let m = &o["metadata"];
    let mut cm = ConfigMap::new(s(&m["namespace"]), s(&m["name"]));
    for (k, v) in m["labels"].as_object().into_iter().flatten() {
        cm = cm.label(k, s(v));
    }
    for (k, v) in o["data"].as_object().into_iter().flatten() {
        cm = cm.data(k, s(v));
    }
    for (k, v) in o["binaryData"].as_object().into_iter().flatten() {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s(v))
            .unwrap();
        cm = cm.binary(k, &bytes);
    }
    cm
}

/// One pod of a Deployment, running.
struct Pod {
    processes: Vec<(String, KillOnDrop)>,
    logs: PathBuf,
    /// Volume name → folder.
    volumes: BTreeMap<String, PathBuf>,
}

impl Pod {
    fn log(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(&self.logs).unwrap() {
            let e = e.unwrap();
            out += &format!(
                "--- {}\n{}\n",
                e.file_name().to_string_lossy(),
                std::fs::read_to_string(e.path()).unwrap_or_default()
            );
        }
        out
    }
}

/// The apiserver a pod talks to, as its kubelet sees it: the CA and port it mounts and
/// sets, the token it projects for the pod's service account, and hosts the pod reaches
/// through a Service (`https://NAME.NS.svc` → where that pod listens here).
struct Api {
    ca_pem: String,
    port: u16,
    token: String,
    services: Vec<(String, String)>,
}

impl Api {
    /// The test apiserver, with its one token.
    fn test(server: &TestApiserver) -> Api {
        Api {
            ca_pem: server.ca_pem(),
            port: server.addr().port(),
            token: test_apiserver::TOKEN.to_string(),
            services: Vec::new(),
        }
    }
}

/// What running a container needs from the pod around it.
struct Kubelet<'a> {
    api: &'a Api,
    objects: &'a [Value],
    dir: &'a Path,
    namespace: String,
    pod_name: String,
    /// mountPath → folder: the container's being started, or while mounted files are
    /// mapped, the pod's paths that name one volume in every container.
    mounts: BTreeMap<String, PathBuf>,
    volumes: BTreeMap<String, PathBuf>,
    uid: Option<u32>,
    gid: Option<u32>,
    /// The binary under test, copied where `runAsUser` can run it (the checkout may sit
    /// in a folder only root can enter).
    cmpoll: PathBuf,
    /// The service account's token, CA and namespace the kubelet mounts at the default
    /// path when the pod does not say otherwise (`automountServiceAccountToken`), which
    /// charts rely on.
    automounted: Option<PathBuf>,
}

impl Kubelet<'_> {
    /// The real Alloy `tests/alloy/build.sh` built, for Alloy's image: copied beside the
    /// binary under test, where `runAsUser` can run it.
    fn alloy(&self) -> PathBuf {
        let built = root().join("tests/alloy/bin/alloy");
        assert!(
            built.exists(),
            "tests/alloy/build.sh has not built {}",
            built.display()
        );
        let copy = self.dir.join("bin/alloy");
        if !copy.exists() {
            std::fs::copy(&built, &copy).unwrap();
        }
        copy
    }

    /// Replaces every mount path by its folder, where it stands as a whole path or a
    /// path's leading part (`/prometheus` in `/prometheus/wal`, not in
    /// `/etc/prometheus`); longest first, in one pass. A whole absolute path with `..`
    /// in it is first resolved as the container's kernel would (`/etc/alloy/../../modules`
    /// is `/modules`, whatever is mounted at `/etc/alloy`).
    fn map(&self, text: &str) -> String {
        let resolved;
        let text = if text.starts_with('/') && text.split('/').any(|p| p == "..") {
            resolved = lexical(text);
            resolved.as_str()
        } else {
            text
        };
        let mut paths: Vec<(&String, &PathBuf)> = self.mounts.iter().collect();
        paths.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        let path_char = |c: char| c.is_alphanumeric() || "._-/".contains(c);
        let mut out = String::new();
        let mut i = 0;
        'scan: while i < text.len() {
            let before = text[..i].chars().next_back();
            if !before.is_some_and(path_char) {
                for (p, dir) in &paths {
                    let rest = &text[i..];
                    if rest.starts_with(p.as_str()) {
                        let after = rest[p.len()..].chars().next();
                        if after.is_none_or(|c| c == '/' || !path_char(c)) {
                            out += &dir.display().to_string();
                            i += p.len();
                            continue 'scan;
                        }
                    }
                }
            }
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
        out
    }

    /// `spec`'s volumes, and (a StatefulSet's) `claims`, each a folder.
    fn volumes(&mut self, spec: &Value, claims: &Value) {
        let fs_group = spec["securityContext"]["fsGroup"].as_u64();
        let claimed = (claims.as_array().into_iter().flatten())
            .map(|c| serde_json::json!({"name": c["metadata"]["name"], "emptyDir": {}}));
        let declared: Vec<Value> = (spec["volumes"].as_array().into_iter().flatten().cloned())
            .chain(claimed)
            .collect();
        for v in &declared {
            let dir = self.dir.join("volumes").join(s(&v["name"]));
            std::fs::create_dir_all(&dir).unwrap();
            // A Secret another controller fills (cert-manager's) is as the test made it:
            // a folder already holding its keys.
            let prefilled = std::fs::read_dir(&dir).unwrap().next().is_some();
            if let (Some(name), false) = (v["secret"]["secretName"].as_str(), prefilled) {
                let secret = self.object("Secret", name);
                let keys = (secret["data"].as_object().into_iter().flatten())
                    .chain(secret["stringData"].as_object().into_iter().flatten())
                    .map(|(k, _)| k);
                for k in keys {
                    let r = serde_json::json!({"name": name, "key": k});
                    std::fs::write(dir.join(k), self.secret_key(&r)).unwrap();
                }
            }
            if let Some(name) = v["configMap"]["name"].as_str() {
                let cm = self
                    .objects
                    .iter()
                    .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == name)
                    .unwrap_or_else(|| panic!("ConfigMap volume {name}: not in the variant"));
                for (k, text) in cm["data"].as_object().into_iter().flatten() {
                    std::fs::write(dir.join(k), s(text)).unwrap();
                    if let Some(mode) = v["configMap"]["defaultMode"].as_u64() {
                        use std::os::unix::fs::PermissionsExt as _;
                        let perms = std::fs::Permissions::from_mode(mode as u32);
                        std::fs::set_permissions(dir.join(k), perms).unwrap();
                    }
                }
            }
            for src in v["projected"]["sources"].as_array().into_iter().flatten() {
                if let Some(path) = src["serviceAccountToken"]["path"].as_str() {
                    std::fs::write(dir.join(path), &self.api.token).unwrap();
                }
                if src["configMap"]["name"] == "kube-root-ca.crt" {
                    for item in src["configMap"]["items"].as_array().into_iter().flatten() {
                        assert_eq!(item["key"], "ca.crt");
                        std::fs::write(dir.join(s(&item["path"])), &self.api.ca_pem).unwrap();
                    }
                } else if let Some(name) = src["configMap"]["name"].as_str() {
                    let cm = self.object("ConfigMap", name);
                    for item in src["configMap"]["items"].as_array().into_iter().flatten() {
                        let text = s(&cm["data"][s(&item["key"])]);
                        std::fs::write(dir.join(s(&item["path"])), text).unwrap();
                    }
                }
                for item in src["downwardAPI"]["items"].as_array().into_iter().flatten() {
                    let value = self.field(&item["fieldRef"]);
                    std::fs::write(dir.join(s(&item["path"])), value).unwrap();
                }
            }
            if let (Some(g), true) = (fs_group, running_as_root()) {
                chown_tree(&dir, self.uid.unwrap_or(0), g as u32);
            }
            self.volumes.insert(s(&v["name"]).to_string(), dir);
        }
    }

    /// The object of `kind` called `name` among the pod's.
    fn object(&self, kind: &str, name: &str) -> &Value {
        (self.objects.iter())
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name}: not among the pod's objects"))
    }

    /// A `secretKeyRef`'s value, from the Secret the rendered objects hold.
    fn secret_key(&self, r: &Value) -> String {
        let secret = (self.objects.iter())
            .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == r["name"])
            .unwrap_or_else(|| panic!("secretKeyRef {r}: not in the rendered objects"));
        let key = s(&r["key"]);
        if let Some(v) = secret["stringData"][key].as_str() {
            return v.to_string();
        }
        use base64::Engine as _;
        let b64 = secret["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("secretKeyRef {r}: no key"));
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
        )
        .unwrap()
    }

    fn field(&self, field_ref: &Value) -> String {
        match s(&field_ref["fieldPath"]) {
            "metadata.namespace" => self.namespace.clone(),
            "metadata.name" => self.pod_name.clone(),
            "spec.nodeName" => "node-0".to_string(),
            other => panic!("fieldRef {other}: not emulated"),
        }
    }

    /// The command line of a container: its image's binary, command and args.
    fn command(&self, c: &Value) -> Option<Command> {
        let image = s(&c["image"]);
        let name = image.rsplit('/').next().unwrap().split(':').next().unwrap();
        let binary: PathBuf = match name {
            "cmpoll" => self.cmpoll.clone(),
            "prometheus" => tool("prometheus").expect("prometheus (Debian package)"),
            "alloy" => self.alloy(),
            _ => return None,
        };
        let mut argv: Vec<String> = c["command"]
            .as_array()
            .map(|a| a.iter().map(|v| self.map(s(v))).collect())
            .unwrap_or_default();
        // Another program of the image (busybox's `cp` in Prometheus's, copying promtool
        // out): the same program of this machine, the image's files as this machine has
        // them.
        let image_files = |p: &str| match (name, p) {
            ("prometheus", "/bin/promtool") => tool("promtool").map(|t| t.display().to_string()),
            ("prometheus", "/bin/prometheus") => {
                tool("prometheus").map(|t| t.display().to_string())
            }
            ("alloy", "/bin/alloy") => Some(self.alloy().display().to_string()),
            _ => None,
        };
        if let Some(program) = argv.first().filter(|p| p.starts_with("/bin/")).cloned()
            && image_files(&program).is_none()
        {
            let mut cmd = Command::new(&program);
            cmd.args(
                argv[1..]
                    .iter()
                    .map(|a| image_files(a).unwrap_or(a.clone())),
            )
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
            if running_as_root() {
                if let Some(u) = self.uid {
                    cmd.uid(u);
                }
                if let Some(g) = self.gid {
                    cmd.gid(g);
                }
            }
            return Some(cmd);
        }
        if !argv.is_empty() {
            argv.remove(0); // the image's binary, run from its Debian or cargo path
        }
        // No command and no args: the image's default command (Dockerfile's CMD): `run`,
        // or `sidecar` for the `-sidecar` target that charts embedding k8s-sidecar use.
        if argv.is_empty() && c["args"].is_null() && name == "cmpoll" {
            let target = if image.ends_with("-sidecar") {
                "sidecar"
            } else {
                "run"
            };
            argv.push(target.into());
        }
        argv.extend(
            c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| self.map(s(v))),
        );
        let mut cmd = Command::new(binary);
        cmd.args(argv).env_clear().env("PATH", "/usr/bin:/bin");
        cmd.env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", self.api.port.to_string());
        for e in c["env"].as_array().into_iter().flatten() {
            let value = if e["valueFrom"]["fieldRef"].is_object() {
                self.field(&e["valueFrom"]["fieldRef"])
            } else if e["valueFrom"]["secretKeyRef"].is_object() {
                self.secret_key(&e["valueFrom"]["secretKeyRef"])
            } else {
                self.map(s(&e["value"]))
            };
            let value = (self.api.services.iter())
                .fold(value, |v, (service, here)| v.replace(service, here));
            cmd.env(s(&e["name"]), value);
        }
        if name == "cmpoll" {
            // The kubelet's mount at the default path, emulated; no mount, no token.
            let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
            let mounted = c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["mountPath"] == sa);
            let dir = if mounted {
                self.mounts[sa].clone()
            } else if let Some(auto) = &self.automounted {
                auto.clone()
            } else {
                self.dir.join("no-service-account")
            };
            cmd.env("CMPOLL_SERVICE_ACCOUNT_DIR", dir);
        }
        if running_as_root() {
            if let Some(u) = self.uid {
                cmd.uid(u);
            }
            if let Some(g) = self.gid {
                cmd.gid(g);
            }
        }
        Some(cmd)
    }
}

/// An absolute path without `.` and `..` (`..` of `/` is `/`), as the kernel resolves one
/// that crosses no symbolic link.
fn lexical(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The binary under test in `dir/bin`, readable and executable by everyone.
pub fn reachable_copy(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let copy = bin.join("cmpoll");
    std::fs::copy(BIN, &copy).unwrap();
    for p in [dir, bin.as_path(), copy.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    copy
}

fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn chown_tree(dir: &Path, uid: u32, gid: u32) {
    let ok = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

/// The port a probe or URL names: a number, or a container port's name.
fn port(c: &Value, p: &Value) -> u16 {
    if let Some(n) = p.as_u64() {
        return n as u16;
    }
    c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["name"] == *p)
        .and_then(|x| x["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("port {p} of container {}", c["name"])) as u16
}

/// Pods use their declared ports: one at a time.
static PODS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Starts the pod of `deployment` (or StatefulSet); init containers must succeed first.
fn start_pod(server: &TestApiserver, objects: &[Value], deployment: &Value, dir: &Path) -> Pod {
    start_pod_on(&Api::test(server), objects, deployment, dir)
}

/// `start_pod`, its kubelet's apiserver `api`.
fn start_pod_on(api: &Api, objects: &[Value], deployment: &Value, dir: &Path) -> Pod {
    let spec = &deployment["spec"]["template"]["spec"];
    let sc = &spec["securityContext"];
    let namespace = s(&deployment["metadata"]["namespace"]).to_string();
    // The pod's word, else its service account's, else the kubelet's default: mounted.
    let account = objects.iter().find(|o| {
        o["kind"] == "ServiceAccount" && o["metadata"]["name"] == spec["serviceAccountName"]
    });
    let automount = match (&spec["automountServiceAccountToken"], account) {
        (Value::Bool(b), _) => *b,
        (_, Some(a)) => a["automountServiceAccountToken"] != false,
        _ => true,
    };
    let automounted = automount.then(|| {
        let sa = dir.join("volumes/kube-api-access");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), &api.token).unwrap();
        std::fs::write(sa.join("ca.crt"), &api.ca_pem).unwrap();
        std::fs::write(sa.join("namespace"), &namespace).unwrap();
        sa
    });
    let mut k = Kubelet {
        api,
        objects,
        dir,
        namespace,
        pod_name: format!("{}-0", s(&deployment["metadata"]["name"])),
        mounts: BTreeMap::new(),
        volumes: BTreeMap::new(),
        uid: sc["runAsUser"].as_u64().map(|u| u as u32),
        gid: sc["runAsGroup"].as_u64().map(|g| g as u32),
        cmpoll: reachable_copy(dir),
        automounted,
    };
    k.volumes(spec, &deployment["spec"]["volumeClaimTemplates"]);
    let containers: Vec<&Value> = spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(spec["containers"].as_array().into_iter().flatten())
        .collect();
    // Each container sees its own mounts (Loki's and its sidecar's `/tmp` are two
    // volumes); mounted files are mapped with the paths every container agrees on.
    let mut own: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    let mut subpaths: Vec<(String, String, PathBuf)> = Vec::new();
    let mut disputed = std::collections::BTreeSet::new();
    for c in &containers {
        let mine = own.entry(s(&c["name"]).to_string()).or_default();
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let vol = k.volumes.get(s(&m["name"])).cloned();
            let vol = vol.unwrap_or_else(|| panic!("mount of a volume not declared: {m}"));
            let path = s(&m["mountPath"]).to_string();
            // One file of a volume mounted into a folder another mount of the container
            // makes (a subPath): a copy there, as this container would see it.
            if let Some(sub) = m["subPath"].as_str() {
                subpaths.push((s(&c["name"]).to_string(), path, vol.join(sub)));
                continue;
            }
            mine.insert(path.clone(), vol.clone());
            if k.mounts
                .insert(path.clone(), vol.clone())
                .is_some_and(|o| o != vol)
            {
                disputed.insert(path);
            }
        }
    }
    for path in &disputed {
        k.mounts.remove(path);
    }
    for (container, path, file) in &subpaths {
        let parent = (own[container].iter())
            .filter(|(p, _)| path.starts_with(&format!("{p}/")))
            .max_by_key(|(p, _)| p.len());
        match parent {
            Some((parent, folder)) => {
                std::fs::copy(file, folder.join(&path[parent.len() + 1..])).unwrap();
            }
            // A file into the image's own folders (Grafana's grafana.ini): the path
            // names its volume's folder, as any mount's does.
            None => {
                let vol = file.parent().unwrap().to_path_buf();
                own.get_mut(container)
                    .unwrap()
                    .insert(path.clone(), vol.clone());
                k.mounts.entry(path.clone()).or_insert(vol);
            }
        }
    }
    // Mounted configuration files name mount paths too (prometheus.yml's rule_files).
    for dir in k.volumes.values() {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if let Ok(text) = std::fs::read_to_string(&p) {
                std::fs::write(&p, k.map(&text)).unwrap();
            }
        }
    }
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut pod = Pod {
        processes: Vec::new(),
        logs: logs.clone(),
        volumes: k.volumes.clone(),
    };
    for c in spec["initContainers"].as_array().into_iter().flatten() {
        let name = s(&c["name"]);
        k.mounts = own[name].clone();
        let mut cmd = k
            .command(c)
            .unwrap_or_else(|| panic!("init container {name}: not runnable here"));
        let log = std::fs::File::create(logs.join(name)).unwrap();
        let st = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .status()
            .unwrap();
        assert!(
            st.success(),
            "init container {name} failed ({st}):\n{}",
            pod.log()
        );
    }
    for c in spec["containers"].as_array().into_iter().flatten() {
        let name = s(&c["name"]);
        k.mounts = own[name].clone();
        let Some(mut cmd) = k.command(c) else {
            continue;
        };
        let log = std::fs::File::create(logs.join(name)).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        pod.processes.push((name.to_string(), KillOnDrop(child)));
    }
    pod
}

/// Every probe of every running container answers 200 on its declared port and path.
fn probes_pass(spec: &Value, pod: &Pod) {
    for c in spec["containers"].as_array().into_iter().flatten() {
        if !pod.processes.iter().any(|(n, _)| n == s(&c["name"])) {
            continue;
        }
        for kind in ["startupProbe", "livenessProbe", "readinessProbe"] {
            let probe = &c[kind];
            if probe.is_null() {
                continue;
            }
            let get = &probe["httpGet"];
            assert!(
                get.is_object(),
                "{} {kind}: only httpGet probes are emulated",
                c["name"]
            );
            assert!(
                get["host"].is_null(),
                "{} {kind} sets host {}: the kubelet would probe that address, not the pod",
                c["name"],
                get["host"]
            );
            let scheme = match get["scheme"].as_str() {
                Some("HTTPS") => "https",
                _ => "http",
            };
            let url = format!(
                "{scheme}://127.0.0.1:{}{}",
                port(c, &get["port"]),
                s(&get["path"])
            );
            eventually_explained(
                &format!("{} {kind} {url}", c["name"]),
                Duration::from_secs(30),
                || curl(&url).is_some_and(|(code, _)| code == 200),
                || pod.log(),
            );
        }
    }
}

/// The resources the variant's cmpoll role may list.
/// Whether a binding's `subjects` name a service account the variant renders (the pod's:
/// the token the pod gets acts as USER).
fn names_a_rendered_account(objects: &[Value], subjects: &Value) -> bool {
    subjects.as_array().into_iter().flatten().any(|x| {
        x["kind"] == "ServiceAccount"
            && objects.iter().any(|o| {
                o["kind"] == "ServiceAccount"
                    && o["metadata"]["name"] == x["name"]
                    && o["metadata"]["namespace"] == x["namespace"]
            })
    })
}

/// The resources the roles bound to the pod's service account let it list.
fn role_resources(objects: &[Value]) -> Vec<String> {
    let bound: Vec<&Value> = (objects.iter())
        .filter(|b| names_a_rendered_account(objects, &b["subjects"]))
        .map(|b| &b["roleRef"]["name"])
        .collect();
    let mut out: Vec<String> = objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
        .filter(|o| bound.contains(&&o["metadata"]["name"]))
        .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| {
            r["verbs"]
                .as_array()
                .is_some_and(|v| v.contains(&"list".into()))
        })
        .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
        .map(|r| s(&r).to_string())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A module object of the variant or the examples as the cluster holds it: a ConfigMap,
/// or (for a variant whose cmpoll reads Secrets) the same module as a Secret.
fn to_object(o: &Value, secrets: bool) -> ConfigMap {
    let mut cm = to_configmap(o);
    if secrets && cm.labels.contains_key("cmpoll.io/module") {
        cm.secret = Some("Opaque".into());
    }
    cm
}

/// The cluster of a variant: its ConfigMaps and the examples, RBAC from its roles.
fn cluster_for(objects: &[Value]) -> TestApiserver {
    let server = TestApiserver::start();
    let resources = role_resources(objects);
    let secrets = resources.iter().any(|r| r == "secrets");
    for o in objects.iter().chain(examples().iter()) {
        if o["kind"] == "ConfigMap" {
            server.put(to_object(o, secrets));
        }
    }
    server.revoke(USER);
    let resources: Vec<&str> = resources.iter().map(String::as_str).collect();
    let sa = |subjects: &Value| names_a_rendered_account(objects, subjects);
    let verbs_ok = |role: &Value| {
        role["rules"].as_array().into_iter().flatten().any(|r| {
            r["verbs"]
                .as_array()
                .is_some_and(|v| v.contains(&"list".into()))
        })
    };
    for b in objects {
        if !sa(&b["subjects"]) {
            continue;
        }
        let role = objects.iter().find(|o| {
            o["kind"] == b["roleRef"]["kind"] && o["metadata"]["name"] == b["roleRef"]["name"]
        });
        match (s(&b["kind"]), role) {
            ("ClusterRoleBinding", Some(r)) if verbs_ok(r) => {
                server.grant(USER, Grant::all().resources(&resources))
            }
            ("RoleBinding", Some(r)) if verbs_ok(r) => server.grant(
                USER,
                Grant::namespaces(&[s(&b["metadata"]["namespace"])]).resources(&resources),
            ),
            _ => {}
        }
    }
    server
}

fn run_prometheus_variant(variant: &str, expect_examples: bool) {
    let _one = PODS.lock().unwrap_or_else(|p| p.into_inner());
    let objects = render(variant);
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let server = cluster_for(&objects);
    let dir = tempfile::tempdir().unwrap();
    let pod = start_pod(&server, &objects, deployment, dir.path());
    let spec = &deployment["spec"]["template"]["spec"];
    probes_pass(spec, &pod);
    let prometheus = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "prometheus")
        .unwrap();
    let web = port(prometheus, &"web".into());
    let mut want = vec![
        "CmpollPollsFailing".to_string(),
        "CmpollReloadsFailing".into(),
    ];
    if expect_examples {
        want.extend([
            "PaymentsHighErrorRate".into(),
            "job:payments_requests:rate5m".into(),
        ]);
    }
    want.sort();
    eventually_explained(
        &format!("{variant}: Prometheus serves the modules' rules"),
        SOON,
        || prometheus_rules(web).unwrap_or_default() == want,
        || {
            format!(
                "rules: {:?}\n{}",
                prometheus_rules(web).unwrap_or_default(),
                pod.log()
            )
        },
    );
    // An update reaches Prometheus through cmpoll's reload call.
    let alerts = objects
        .iter()
        .find(|o| o["metadata"]["name"] == "cmpoll-alerts")
        .unwrap();
    let text =
        s(&alerts["data"]["cmpoll.rules.yaml"]).replace("CmpollPollsFailing", "CmpollPollsStuck");
    let secrets = role_resources(&objects).contains(&"secrets".to_string());
    server.put(to_object(alerts, secrets).data("cmpoll.rules.yaml", &text));
    eventually_explained(
        &format!("{variant}: the update is loaded"),
        Duration::from_secs(40),
        || {
            prometheus_rules(web)
                .unwrap_or_default()
                .contains(&"CmpollPollsStuck".to_string())
        },
        || {
            format!(
                "rules: {:?}\n{}",
                prometheus_rules(web).unwrap_or_default(),
                pod.log()
            )
        },
    );
    assert!(pod.volumes.contains_key("rules"));
    status_in_the_pod(spec, &pod);
    drop(pod);
}

/// `kubectl exec deploy/cmpoll -c cmpoll -- cmpoll status`: the image's binary with the
/// cmpoll container's environment (its `CMPOLL_LISTEN` says where to ask) answers with
/// every module delivered and the reload URL's last call ok.
fn status_in_the_pod(spec: &Value, pod: &Pod) {
    let container = (spec["containers"].as_array().unwrap().iter())
        .find(|c| c["name"] == "cmpoll")
        .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["status", "--all"]).env_clear();
    for e in container["env"].as_array().into_iter().flatten() {
        if let Some(v) = e["value"].as_str() {
            cmd.env(s(&e["name"]), v);
        }
    }
    let out = cmd.output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "cmpoll status in the pod: {out:?}\n{table}\n{}",
        pod.log()
    );
    assert!(table.contains("ready: yes"), "{table}");
    let module = (table.lines())
        .find(|l| (l.split_whitespace().next()).is_some_and(|m| m.ends_with("/cmpoll-alerts")))
        .unwrap_or_else(|| panic!("no cmpoll-alerts module:\n{table}"));
    assert!(module.contains(" delivered "), "{table}");
    let reload = (table.lines())
        .find(|l| l.starts_with("reload-url "))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(reload.ends_with(" ok"), "{table}");
}

fn pod_tools() -> bool {
    !skip_unless(
        tool("prometheus").is_some() && tool("curl").is_some() && tool("kubectl").is_some(),
        "prometheus, curl and kubectl (Debian packages)",
    )
}

#[test]
fn the_prometheus_deployments_run_and_serve_the_modules_rules() {
    if !pod_tools() {
        return;
    }
    run_prometheus_variant("prometheus", true);
    // One namespace: only the pod's own (cmpoll's alerts), not team-payments' rules.
    run_prometheus_variant("prometheus-namespaced", false);
    // Rule files from Secrets, for its own namespace (files 0600, the pod's one user reads
    // them).
    run_prometheus_variant("prometheus-secrets", false);
}

/// Alloy's API: (component, health), of the root or of module `module`.
fn alloy_components(port: u16, module: Option<&str>) -> Vec<(String, String)> {
    let path = match module {
        None => "/api/v0/web/components".to_string(),
        Some(m) => format!("/api/v0/web/modules/{m}/components"),
    };
    let Some((200, body)) = curl(&format!("http://127.0.0.1:{port}{path}")) else {
        return Vec::new();
    };
    let list: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let mut out: Vec<(String, String)> = (list.as_array().into_iter().flatten())
        .map(|c| {
            (
                s(&c["localID"]).to_string(),
                s(&c["health"]["state"]).to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

/// The pod tools and tests/alloy's alloy, else a loud skip (a failure in CI).
fn alloy_pod_tools() -> bool {
    pod_tools()
        && !skip_unless(
            root().join("tests/alloy/bin/alloy").exists(),
            "tests/alloy/build.sh's alloy",
        )
}

/// The Alloy container of a pod `spec`.
fn alloy_container(spec: &Value) -> &Value {
    (spec["containers"].as_array().unwrap().iter())
        .find(|c| s(&c["image"]).contains("grafana/alloy"))
        .expect("an Alloy container")
}

/// Waits until the pod's Alloy (API on `port`) runs the root's remote write and the
/// example module, both healthy; those two (component, health) pairs.
fn alloy_runs_the_example(port: u16, pod: &Pod) -> Vec<(String, String)> {
    let want: Vec<(String, String)> = [
        "monitoring_S_payments_scrape.module",
        "prometheus.remote_write.default",
    ]
    .iter()
    .map(|c| (c.to_string(), "healthy".to_string()))
    .collect();
    eventually_explained(
        "Alloy runs the root's remote write and the example module",
        SOON,
        || alloy_components(port, None) == want,
        || format!("{:?}\n{}", alloy_components(port, None), pod.log()),
    );
    want
}

/// k8s/alloy run as a kubelet would, with the real Alloy (tests/alloy): init containers
/// copy `alloy` out of Alloy's image and the root configuration into Alloy's folder (no
/// subPath mount anywhere), Alloy starts on it, cmpoll writes every module through the
/// template (checked by `alloy fmt` and `alloy validate`) and has Alloy confirm it, every
/// probe answers, Alloy runs the example module as a component of its own; an update
/// reaches Alloy, a broken module is rejected and one Alloy cannot build is refused by
/// Alloy and removed, while the others keep running. No token reaches Alloy.
#[test]
fn the_alloy_deployment_runs_real_alloy_with_one_module_per_configmap() {
    if !alloy_pod_tools() {
        return;
    }
    let _one = PODS.lock().unwrap_or_else(|p| p.into_inner());
    let objects = render("alloy");
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    let alloy = alloy_container(spec);
    let server = cluster_for(&objects);
    let dir = tempfile::tempdir().unwrap();
    let pod = start_pod(&server, &objects, deployment, dir.path());
    probes_pass(spec, &pod);
    let port = port(alloy, &"http".into());
    let module = "monitoring_S_payments_scrape.module";
    let want = alloy_runs_the_example(port, &pod);
    assert_eq!(
        alloy_components(port, Some(module)),
        [(
            "prometheus.scrape.payments".to_string(),
            "healthy".to_string()
        )]
    );
    // An update: the module gains a scrape with a label another team could use too.
    let example = updated_example();
    server.put(to_object(&example, false));
    // A broken module from another team: rejected by Alloy's validate, alone; and one
    // that passes validate but that Alloy cannot build: refused by Alloy, removed.
    server.put(
        ConfigMap::new("team-x", "broken")
            .label("cmpoll.io/module", "true")
            .data("x.alloy", "prometheus.scrape \"x\" {\n"),
    );
    eventually_explained(
        "the update reaches Alloy through /-/reload",
        Duration::from_secs(60),
        || {
            alloy_components(port, Some(module))
                == [
                    (
                        "prometheus.scrape.default".to_string(),
                        "healthy".to_string(),
                    ),
                    (
                        "prometheus.scrape.payments".to_string(),
                        "healthy".to_string(),
                    ),
                ]
        },
        || pod.log(),
    );
    assert_eq!(
        alloy_components(port, None),
        want,
        "the broken module never reached Alloy"
    );
    assert!(
        pod.log().contains("team-x/broken") && pod.log().contains("rejected"),
        "{}",
        pod.log()
    );
    server.put(
        ConfigMap::new("team-y", "unbuildable")
            .label("cmpoll.io/module", "true")
            .data(
                "y.alloy",
                "prometheus.scrape \"y\" {\n  targets         = []\n  forward_to      = []\n  scrape_interval = \"1s\"\n  scrape_timeout  = \"5s\"\n}\n",
            ),
    );
    eventually_explained(
        "Alloy refuses the module it cannot build, and cmpoll removes it (a 15 s poll)",
        Duration::from_secs(60),
        || {
            pod.log()
                .contains("module team-y/unbuildable rejected: refused by the agent: ")
        },
        || pod.log(),
    );
    eventually_explained(
        "Alloy runs the others, without it",
        SOON,
        || alloy_components(port, None) == want,
        || pod.log(),
    );
    // Mounts a runtime accepts: no file mount point under a read-only mount.
    for c in (spec["initContainers"].as_array().into_iter().flatten())
        .chain(spec["containers"].as_array().unwrap())
    {
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            assert!(m["subPath"].is_null(), "{}: subPath {m}", c["name"]);
        }
    }
    // A module the agent may not load has no Kubernetes API to reach: no token for Alloy.
    assert!(
        !alloy["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| s(&m["mountPath"]).contains("serviceaccount")),
        "Alloy gets a service-account token"
    );
    assert_eq!(spec["automountServiceAccountToken"], false);
    drop(pod);
}

/// Per tenant (k8s/alloy-tenants/team-a, run as a kubelet would, with the real Alloy):
/// team-a's Alloy loads team-a's module with team-a's offered arguments, and never team-b's
/// module, though its service account could list it.
#[test]
fn a_tenants_alloy_loads_only_its_tenants_modules() {
    if !alloy_pod_tools() {
        return;
    }
    let _one = PODS.lock().unwrap_or_else(|p| p.into_inner());
    let objects = render("alloy-tenants/team-a");
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    let alloy = alloy_container(spec);
    let server = cluster_for(&objects);
    let module = |tenant: &str| {
        ConfigMap::new(tenant, "scrape")
            .label("cmpoll.io/module", "true")
            .label("cmpoll.io/tenant", tenant)
            .data(
                "scrape.alloy",
                "argument \"receiver\" { }\nargument \"tenant\" { }\n\nprometheus.scrape \"default\" {\n  targets    = [{\"__address__\" = \"127.0.0.1:9\", \"tenant\" = argument.tenant.value}]\n  forward_to = [argument.receiver.value]\n}\n",
            )
    };
    server.put(module("team-a"));
    server.put(module("team-b"));
    let dir = tempfile::tempdir().unwrap();
    let pod = start_pod(&server, &objects, deployment, dir.path());
    probes_pass(spec, &pod);
    let port = port(alloy, &"http".into());
    let want: Vec<(String, String)> = ["prometheus.remote_write.default", "team_a_S_scrape.module"]
        .iter()
        .map(|c| (c.to_string(), "healthy".to_string()))
        .collect();
    eventually_explained(
        "team-a's Alloy runs team-a's module only",
        SOON,
        || alloy_components(port, None) == want,
        || format!("{:?}\n{}", alloy_components(port, None), pod.log()),
    );
    let written = std::fs::read_to_string(dir.path().join("volumes/modules/team-a.scrape.alloy"))
        .unwrap_or_else(|e| panic!("{e}\n{}", pod.log()));
    assert!(
        written.contains("tenant   = \"team-a\"") || written.contains("tenant = \"team-a\""),
        "{written}"
    );
    assert!(
        !dir.path()
            .join("volumes/modules/team-b.scrape.alloy")
            .exists()
    );
    drop(pod);
}

/// A chart rendered with `sidecar.image` set to cmpoll's sidecar image
/// (`tests/fixtures/charts/README.md` says which chart, values and command).
fn chart(file: &str) -> Vec<Value> {
    yaml_docs(&std::fs::read(root().join("tests/fixtures/charts").join(file)).unwrap())
}

/// The chart's cluster: the service account gets what the chart's ClusterRole grants
/// (every namespace), and the chart's own labelled objects are in it.
fn chart_cluster(objects: &[Value]) -> TestApiserver {
    let server = TestApiserver::start();
    server.revoke(USER);
    let mut resources: Vec<String> = (objects.iter())
        .filter(|o| o["kind"] == "ClusterRole")
        .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| {
            r["verbs"]
                .as_array()
                .is_some_and(|v| v.contains(&"list".into()))
        })
        .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
        .map(|r| s(&r).to_string())
        .collect();
    resources.sort();
    resources.dedup();
    let resources: Vec<&str> = resources.iter().map(String::as_str).collect();
    server.grant(USER, Grant::all().resources(&resources));
    for o in objects.iter().filter(|o| o["kind"] == "ConfigMap") {
        server.put(to_configmap(o));
    }
    server
}

/// The sidecar containers of a workload: the image cmpoll's sidecar image, and no
/// command or args (the chart sets only the environment).
fn sidecars(workload: &Value) -> Vec<&Value> {
    let spec = &workload["spec"]["template"]["spec"];
    let all = spec["containers"].as_array().into_iter().flatten();
    let sidecars: Vec<&Value> = all
        .filter(|c| s(&c["image"]).ends_with("cmpoll:0.1.0-sidecar"))
        .collect();
    for c in &sidecars {
        assert!(
            c["command"].is_null() && c["args"].is_null(),
            "{}: the chart sets a command",
            c["name"]
        );
    }
    sidecars
}

fn env_of<'a>(c: &'a Value, name: &str) -> Option<&'a str> {
    (c["env"].as_array().into_iter().flatten())
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
}

/// Grafana's reload endpoints, where the charts' REQ_URL points (`localhost:3000`): one
/// for the test binary, its calls emptied for each test (they hold `PODS`).
fn grafana_api() -> std::sync::Arc<std::sync::Mutex<Vec<crate::util::http::Call>>> {
    type Calls = std::sync::Arc<std::sync::Mutex<Vec<crate::util::http::Call>>>;
    static API: std::sync::OnceLock<Calls> = std::sync::OnceLock::new();
    let calls = API.get_or_init(|| {
        crate::util::http::web_server_at("[::]:3000", |_, _| (200, vec![], b"{}".to_vec())).1
    });
    calls.lock().unwrap().clear();
    calls.clone()
}

fn chart_tools() -> bool {
    !skip_unless(tool("curl").is_some(), "curl (Debian package)")
}

/// Issue 26: the Grafana chart (12.11.1) with `sidecar.image` set to cmpoll's sidecar
/// image, dashboards in every namespace sorted into folders by an annotation: its pod runs
/// as the kubelet would (the chart's environment only, the image's default command, the
/// shared volume), the dashboards land where Grafana's file provider (the chart's
/// provider.yaml, folders from the file structure) reads them, and Grafana's reload API
/// gets the chart's POST with basic auth from the chart's admin Secret.
#[test]
fn the_grafana_charts_dashboard_sidecar_runs_on_cmpolls_image() {
    if !chart_tools() {
        return;
    }
    let _one = PODS.lock().unwrap_or_else(|p| p.into_inner());
    let objects = chart("grafana-12.11.1.yaml");
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let sidecar = sidecars(deployment)[0];
    let folder = env_of(sidecar, "FOLDER").unwrap();
    // Grafana's provider reads the folder the sidecar writes, folders as folders.
    let provider = objects
        .iter()
        .find(|o| o["metadata"]["name"] == "grafana-config-dashboards")
        .unwrap();
    let provider = yaml_docs(s(&provider["data"]["provider.yaml"]).as_bytes()).remove(0);
    let options = &provider["providers"][0]["options"];
    assert_eq!(
        (
            s(&options["path"]),
            options["foldersFromFilesStructure"].as_bool()
        ),
        (folder, Some(true))
    );
    let server = chart_cluster(&objects);
    server.put(
        ConfigMap::new("team-a", "node")
            .label("grafana_dashboard", "1")
            .annotation("grafana_folder", "Team A")
            .data("node.json", "{\"title\":\"Nodes\"}"),
    );
    server.put(
        ConfigMap::secret("team-b", "db")
            .label("grafana_dashboard", "1")
            .data("db.json", "{\"title\":\"DB\"}"),
    );
    server.put(ConfigMap::new("team-a", "not-a-dashboard").data("x.json", "{}"));
    let calls = grafana_api();
    let dir = tempfile::tempdir().unwrap();
    let pod = start_pod(&server, &objects, deployment, dir.path());
    let volume = pod.volumes["sc-dashboard-volume"].clone();
    eventually_explained(
        "the dashboards in the provider's folder",
        SOON,
        || {
            crate::util::tree(&volume)
                == crate::util::map(&[
                    ("Team A/node.json", "{\"title\":\"Nodes\"}"),
                    ("db.json", "{\"title\":\"DB\"}"),
                ])
        },
        || format!("{:?}\n{}", crate::util::tree(&volume), pod.log()),
    );
    eventually_explained(
        "the reload call",
        SOON,
        || !calls.lock().unwrap().is_empty(),
        || pod.log(),
    );
    let (line, headers) = calls.lock().unwrap()[0].clone();
    assert_eq!(
        line,
        "POST /api/admin/provisioning/dashboards/reload HTTP/1.1"
    );
    // printf admin:s3cret-admin | base64: the chart's admin Secret
    assert_eq!(headers["authorization"], "Basic YWRtaW46czNjcmV0LWFkbWlu");
    drop(pod);
}

/// kube-prometheus-stack (88.5.3, Grafana 12.11.1): two sidecars in one pod, both on the
/// default health port (the second warns and runs on), dashboards from every namespace
/// (the stack's own among them) and datasources from the pod's own namespace.
#[test]
fn kube_prometheus_stacks_two_sidecars_run_on_cmpolls_image() {
    if !chart_tools() {
        return;
    }
    let _one = PODS.lock().unwrap_or_else(|p| p.into_inner());
    let objects = chart("kube-prometheus-stack-88.5.3-grafana.yaml");
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(sidecars(deployment).len(), 2);
    let server = chart_cluster(&objects);
    server.put(
        ConfigMap::new("apps", "payments")
            .label("grafana_dashboard", "1")
            .data("payments.json", "{}"),
    );
    let dashboards: Vec<String> = (objects.iter())
        .filter(|o| o["metadata"]["labels"]["grafana_dashboard"] == "1")
        .flat_map(|o| {
            o["data"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        })
        .chain(["payments.json".to_string()])
        .collect();
    let calls = grafana_api();
    let dir = tempfile::tempdir().unwrap();
    let pod = start_pod(&server, &objects, deployment, dir.path());
    let volumes = pod.volumes.clone();
    let names = |v: &str| -> Vec<String> {
        let mut n: Vec<String> = crate::util::tree(&volumes[v]).into_keys().collect();
        n.sort();
        n
    };
    let mut want = dashboards.clone();
    want.sort();
    eventually_explained(
        "the dashboards",
        SOON,
        || names("sc-dashboard-volume") == want,
        || format!("{:?}\n{}", names("sc-dashboard-volume"), pod.log()),
    );
    eventually_explained(
        "the datasources",
        SOON,
        || names("sc-datasources-volume") == ["datasource.yaml"],
        || format!("{:?}\n{}", names("sc-datasources-volume"), pod.log()),
    );
    eventually_explained(
        "both reload calls",
        SOON,
        || {
            let c = calls.lock().unwrap();
            ["dashboards", "datasources"].iter().all(|k| {
                c.iter()
                    .any(|(l, _)| l.contains(&format!("/api/admin/provisioning/{k}/reload")))
            })
        },
        || pod.log(),
    );
    assert!(
        pod.log().contains("going on without /healthz"),
        "{}",
        pod.log()
    );
    drop(pod);
}

/// The Loki chart (18.11.0): its rules sidecar, on by default, with the probes the chart
/// sets on /healthz (503 until the first batch, then 200) and a tenant folder from the
/// annotation, in a root filesystem it may not write to but for its volume.
#[test]
fn lokis_rules_sidecar_runs_on_cmpolls_image() {
    if !chart_tools() {
        return;
    }
    let _one = PODS.lock().unwrap_or_else(|p| p.into_inner());
    let objects = chart("loki-18.11.0.yaml");
    let sts = objects.iter().find(|o| o["kind"] == "StatefulSet").unwrap();
    let sidecar = sidecars(sts)[0];
    assert_eq!(sidecar["securityContext"]["readOnlyRootFilesystem"], true);
    let server = chart_cluster(&objects);
    server.put(
        ConfigMap::new("loki", "alerts")
            .label("loki_rule", "")
            .annotation("k8s-sidecar-target-directory", "fake")
            .data("rules.yaml", "groups: []\n"),
    );
    let dir = tempfile::tempdir().unwrap();
    let pod = start_pod(&server, &objects, sts, dir.path());
    probes_pass(&sts["spec"]["template"]["spec"], &pod);
    let volume = pod.volumes["sc-rules-volume"].clone();
    eventually_explained(
        "the tenant's rules",
        SOON,
        || crate::util::tree(&volume) == crate::util::map(&[("fake/rules.yaml", "groups: []\n")]),
        || pod.log(),
    );
    drop(pod);
}

/// The webhook component's Deployment, run as a kubelet would: the init container copies
/// promtool out of Prometheus's image, `cmpoll webhook` serves HTTPS with the pair
/// cert-manager would have put in its Secret, both probes answer over HTTPS, and a review
/// the real apiserver sent (a content UPDATE to a broken rule, tests/fixtures/admission)
/// is denied with promtool's message; the same review with the rule fixed is allowed.
#[test]
fn the_webhook_deployment_runs_and_denies_a_broken_rule_with_promtool() {
    webhook_pod(Webhook::Kustomize);
}

/// Issue 41.4: charts/cmpoll's webhook (`webhook.enabled=true`, release `cmpoll`) runs the
/// same way and denies the same broken rule with promtool's words.
#[test]
fn the_charts_webhook_runs_and_denies_a_broken_rule_with_promtool() {
    webhook_pod(Webhook::Chart);
}

/// Where the webhook's objects come from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Webhook {
    Kustomize,
    KustomizeWithClientCert,
    Chart,
}

/// Issue 42.6: with the k8s/webhook-client-cert component the same Deployment runs (its
/// probes, which present no certificate, pass), a review from a client presenting the
/// apiserver's certificate is denied with promtool's words, and one from a client with
/// no certificate is refused (403).
#[test]
fn the_webhook_deployment_with_the_client_cert_component_reviews_only_the_apiserver() {
    webhook_pod(Webhook::KustomizeWithClientCert);
}

fn webhook_pod(from: Webhook) {
    let client_cert = from == Webhook::KustomizeWithClientCert;
    if !pod_tools() || skip_unless(tool("promtool").is_some(), "promtool (Debian prometheus)") {
        return;
    }
    let _one = PODS.lock().unwrap_or_else(|p| p.into_inner());
    let rendered = match from {
        Webhook::Kustomize => crate::deploy::overlay("k8s/prometheus", &["k8s/webhook"]),
        Webhook::KustomizeWithClientCert => crate::deploy::overlay(
            "k8s/prometheus",
            &["k8s/webhook", "k8s/webhook-client-cert"],
        ),
        Webhook::Chart => {
            crate::deploy::helm_template(&["hub.enabled=false", "webhook.enabled=true"])
        }
    };
    let mut objects = yaml_docs(rendered.as_bytes());
    // The CA of the apiserver's webhook client certificate, as its operator puts it there.
    let clients = test_apiserver::Pki::new("apiserver-webhook-clients");
    objects.push(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cmpoll-webhook-client-ca", "namespace": "cmpoll"},
        "data": {"ca.crt": clients.ca_pem()}}));
    let deployment = (objects.iter())
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "cmpoll-webhook")
        .unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    let server = cluster_for(&objects);
    let dir = tempfile::tempdir().unwrap();
    // The Secret cert-manager fills (`cmpoll-webhook-tls`), as its volume shows it.
    let tls = dir.path().join("volumes/tls");
    std::fs::create_dir_all(&tls).unwrap();
    let pki = test_apiserver::Pki::new("webhook-ca");
    std::fs::write(tls.join("tls.crt"), &pki.server.cert_pem).unwrap();
    std::fs::write(tls.join("tls.key"), &pki.server.key_pem).unwrap();
    let pod = start_pod(&server, &objects, deployment, dir.path());
    probes_pass(spec, &pod);
    let webhook = (spec["containers"].as_array().unwrap().iter())
        .find(|c| c["name"] == "webhook")
        .unwrap();
    let url = format!(
        "https://127.0.0.1:{}/validate",
        port(webhook, &"https".into())
    );
    let golden = root().join("tests/fixtures/admission/update-configmap-content.json");
    let apiserver = clients.client_cert("kube-apiserver");
    let (cert, key) = (dir.path().join("client.crt"), dir.path().join("client.key"));
    std::fs::write(&cert, &apiserver.cert_pem).unwrap();
    std::fs::write(&key, &apiserver.key_pem).unwrap();
    if client_cert {
        let anyone = Command::new("curl")
            .args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--data-binary",
            ])
            .arg(format!("@{}", golden.display()))
            .arg(&url)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&anyone.stdout),
            "403",
            "{}",
            pod.log()
        );
    }
    let review = |body: &Path| -> Value {
        let out = Command::new("curl")
            .args([
                "-sk",
                "--max-time",
                "10",
                "-H",
                "Content-Type: application/json",
            ])
            .arg("--cert")
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .arg("--data-binary")
            .arg(format!("@{}", body.display()))
            .arg(&url)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {out:?}\n{}", pod.log()))
    };
    let answer = review(&golden);
    assert_eq!(
        answer["response"]["allowed"],
        false,
        "{answer}\n{}",
        pod.log()
    );
    let message = s(&answer["response"]["status"]["message"]);
    assert!(
        message.contains("unclosed left parenthesis") && message.contains("payments.rules.yaml"),
        "promtool's own words: {message}"
    );
    // The rule fixed: the same review, allowed.
    let mut fixed: Value = serde_json::from_slice(&std::fs::read(&golden).unwrap()).unwrap();
    let rule =
        s(&fixed["request"]["object"]["data"]["payments.rules.yaml"]).replace("[5m]\n", "[5m]))\n");
    fixed["request"]["object"]["data"]["payments.rules.yaml"] = rule.into();
    // As a CREATE: an UPDATE back to the old content would be allowed unvalidated.
    fixed["request"]["operation"] = "CREATE".into();
    fixed["request"]["oldObject"] = Value::Null;
    let file = dir.path().join("fixed.json");
    std::fs::write(&file, fixed.to_string()).unwrap();
    let answer = review(&file);
    assert_eq!(
        answer["response"]["allowed"],
        true,
        "{answer}\n{}",
        pod.log()
    );
    assert!(
        pod.log()
            .contains("CREATE of configmaps golden-0/rules: allowed ("),
        "validated by promtool, not skipped:\n{}",
        pod.log()
    );
}

/// Issue 39.5: k8s/serve and k8s/serve-alloy applied to the real apiserver (a server-side
/// dry run, then applied) and run as a kubelet would: the hub's pod, with its own service
/// account's projected token, polls the real apiserver and answers its probes over HTTPS;
/// the Alloy DaemonSet's pod (the real Alloy) gets its modules from the hub through the
/// Service's name, with its own token and the hubs' CA, and an update reaches Alloy
/// through the hub. The follower never asks the apiserver anything (its audit log says).
#[test]
fn the_hub_and_the_alloy_daemonset_following_it_run_on_the_real_apiserver() {
    use test_apiserver::real::{self, RealApiserver};
    if !alloy_pod_tools()
        || skip_unless(
            real::built(),
            "the real kube-apiserver (tests/kube/build.sh)",
        )
    {
        return;
    }
    let _one = PODS.lock().unwrap_or_else(|p| p.into_inner());
    let k = RealApiserver::start();
    let hub_objects = render("serve");
    let alloy_objects = render("serve-alloy");
    k.ok(&["create", "namespace", "cmpoll"]);
    for objects in [&hub_objects, &alloy_objects] {
        dry_run_and_apply(&k, objects);
    }
    // What docs/serve.md has the platform make: the hubs' certificate (for the Service's
    // name, and 127.0.0.1 where the pod listens here) and their CA where followers run.
    let pki = test_apiserver::Pki::with_server_names(
        "cmpoll-hub-ca",
        &["cmpoll-hub.cmpoll.svc", "127.0.0.1"],
    );
    let made = vec![
        serde_json::json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "cmpoll-hub-tls", "namespace": "cmpoll"},
            "stringData": {"tls.crt": pki.server.cert_pem, "tls.key": pki.server.key_pem}}),
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cmpoll-hub-ca", "namespace": "cmpoll"},
            "data": {"ca.crt": pki.ca_pem()}}),
    ];
    let example = example_module();
    k.ok(&["create", "namespace", s(&example["metadata"]["namespace"])]);
    for o in made.iter().chain([&example]) {
        k.apply(&o.to_string());
    }
    let objects: Vec<Value> = (hub_objects.iter().chain(&alloy_objects).chain(&made))
        .cloned()
        .collect();
    let hub = (hub_objects.iter())
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    let daemonset = (alloy_objects.iter())
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    let hub_dir = tempfile::tempdir().unwrap();
    let (hub_pod, https) = start_hub(&k, &objects, hub, hub_dir.path());
    let mark = k.audit_mark();
    let follower_api = Api {
        ca_pem: k.ca_pem(),
        port: k.port,
        token: k.token("cmpoll", "cmpoll", "1h"),
        services: vec![(
            "https://cmpoll-hub.cmpoll.svc".to_string(),
            format!("https://127.0.0.1:{https}"),
        )],
    };
    let dir = tempfile::tempdir().unwrap();
    let pod = start_pod_on(&follower_api, &objects, daemonset, dir.path());
    let spec = &daemonset["spec"]["template"]["spec"];
    probes_pass(spec, &pod);
    let alloy = alloy_container(spec);
    let port = port(alloy, &"http".into());
    let module = "monitoring_S_payments_scrape.module";
    let both = |extra: bool| {
        let mut want = vec![(
            "prometheus.scrape.payments".to_string(),
            "healthy".to_string(),
        )];
        if extra {
            want.insert(
                0,
                (
                    "prometheus.scrape.default".to_string(),
                    "healthy".to_string(),
                ),
            );
        }
        want
    };
    eventually_explained(
        "Alloy runs the example module it got through the hub",
        SOON,
        || alloy_components(port, Some(module)) == both(false),
        || format!("{}\n{}", pod.log(), hub_pod.log()),
    );
    // An update: through the hub to Alloy, long before the follower's 60 s interval.
    k.apply(&updated_example().to_string());
    eventually_explained(
        "the update reaches Alloy through the hub",
        Duration::from_secs(30),
        || alloy_components(port, Some(module)) == both(true),
        || format!("{}\n{}", pod.log(), hub_pod.log()),
    );
    // The follower asked the apiserver nothing: the hub did, for it.
    let follower = "system:serviceaccount:cmpoll:cmpoll";
    let asked: Vec<Value> = (k.audit_since(mark).into_iter())
        .filter(|e| e["user"]["username"] == follower)
        .collect();
    assert!(
        asked.is_empty(),
        "the follower called the apiserver: {asked:?}"
    );
    let reviews = (k.audit_since(mark).into_iter())
        .filter(|e| e["user"]["username"] == "system:serviceaccount:cmpoll:cmpoll-hub")
        .filter(|e| e["objectRef"]["resource"] == "tokenreviews")
        .count();
    assert!(reviews >= 1, "the hub reviewed the follower's token");
    drop(pod);
    drop(hub_pod);
}

/// k8s/examples' payments-scrape module.
fn example_module() -> Value {
    (examples().into_iter())
        .find(|o| o["metadata"]["name"] == "payments-scrape")
        .unwrap()
}

/// The example module updated: it gains a scrape whose label another team could use too.
fn updated_example() -> Value {
    let mut example = example_module();
    example["data"]["scrape.alloy"] = format!(
            "{}\nprometheus.scrape \"default\" {{\n  targets    = []\n  forward_to = [argument.receiver.value]\n}}\n",
            s(&example["data"]["scrape.alloy"])
        )
    .into();
    example
}

/// Grafana's alloy chart rendered with the values files the `helm install alloy` line of
/// k8s/alloy-helm's `values` names, and a real apiserver to run it on, with the pods' lock
/// held; `None` (a loud skip, a failure in CI) without the pod tools, the real Alloy, the
/// real apiserver or helm.
fn alloy_chart_on_a_real_apiserver(
    values: &str,
) -> Option<(
    Vec<Value>,
    test_apiserver::real::RealApiserver,
    std::sync::MutexGuard<'static, ()>,
)> {
    use test_apiserver::real;
    if !alloy_pod_tools()
        || skip_unless(
            real::built(),
            "the real kube-apiserver (tests/kube/build.sh)",
        )
    {
        return None;
    }
    let install = (documented_commands(values).into_iter())
        .find(|c| c.starts_with("helm install alloy "))
        .unwrap_or_else(|| panic!("{values}: no `helm install alloy` line"));
    let words: Vec<&str> = install.split_whitespace().collect();
    let files: Vec<&str> = (words.windows(2))
        .filter(|w| w[0] == "-f")
        .map(|w| w[1].trim_start_matches("k8s/alloy-helm/"))
        .collect();
    assert!(files.contains(&values), "{install}");
    let rendered = crate::deploy::alloy_chart(&files);
    if rendered.is_empty() {
        return None; // no helm: skipped loudly
    }
    let one = PODS.lock().unwrap_or_else(|p| p.into_inner());
    Some((
        yaml_docs(rendered.as_bytes()),
        real::RealApiserver::start(),
        one,
    ))
}

/// The `kubectl …` and `helm …` commands the head of k8s/alloy-helm's `values` tells the
/// platform to run (its comment lines, `\` continued; a `#` after a command ends it).
fn documented_commands(values: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root().join("k8s/alloy-helm").join(values)).unwrap();
    let mut commands: Vec<String> = Vec::new();
    // Whether the line before ended in `\`, and whether it was a command's.
    let (mut continued, mut command) = (false, false);
    for line in text.lines().map_while(|l| l.strip_prefix('#')) {
        let line = line.split(" #").next().unwrap_or_default().trim();
        if !continued {
            command = line.starts_with("kubectl ") || line.starts_with("helm ");
            if command {
                commands.push(String::new());
            }
        }
        if command {
            let last = commands.last_mut().unwrap();
            last.push_str(line.trim_end_matches('\\').trim());
            last.push(' ');
        }
        continued = line.ends_with('\\');
    }
    commands
}

/// The `kubectl …` commands of `values`' head, run as written on the real apiserver from
/// the repository's root, `HUBS_CA.pem` being `hub_ca`.
fn run_documented_kubectl(k: &test_apiserver::real::RealApiserver, values: &str, hub_ca: &Path) {
    let commands: Vec<String> = (documented_commands(values).into_iter())
        .filter(|c| c.starts_with("kubectl "))
        .collect();
    assert!(commands.len() >= 2, "{values}: {commands:?}");
    for command in &commands {
        let args: Vec<String> = (command.split_whitespace().skip(1))
            .map(|a| match a.split_once("--from-file=") {
                Some(("", file)) => {
                    let (key, path) = file.split_once('=').map_or(("", file), |(k, p)| (k, p));
                    let path = match path {
                        "HUBS_CA.pem" => hub_ca.to_path_buf(),
                        p => root().join(p),
                    };
                    let key = if key.is_empty() {
                        String::new()
                    } else {
                        format!("{key}=")
                    };
                    format!("--from-file={key}{}", path.display())
                }
                _ => a.to_string(),
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        k.ok(&args);
    }
}

/// The hub's pod (`hub`, a Deployment of service account cmpoll/cmpoll-hub) on the real
/// apiserver with its own token, its probes answering; and the port it serves on.
fn start_hub(
    k: &test_apiserver::real::RealApiserver,
    objects: &[Value],
    hub: &Value,
    dir: &Path,
) -> (Pod, u16) {
    let api = Api {
        ca_pem: k.ca_pem(),
        port: k.port,
        token: k.token("cmpoll", "cmpoll-hub", "1h"),
        services: Vec::new(),
    };
    let pod = start_pod_on(&api, objects, hub, dir);
    let spec = &hub["spec"]["template"]["spec"];
    probes_pass(spec, &pod);
    (pod, port(&spec["containers"][0], &"https".into()))
}

/// Rendered objects, server-side dry run and then applied on the real apiserver, as one
/// List (what `helm install` would send).
fn dry_run_and_apply(k: &test_apiserver::real::RealApiserver, objects: &[Value]) {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let dry = k.server_dry_run(&list.to_string());
    assert!(dry["kind"].is_string(), "{dry}");
    k.server_apply(&list.to_string());
}

/// Grafana's own alloy chart with k8s/alloy-helm/values-deployment.yaml (rendered by the
/// real helm from the chart in Alloy v1.19.2's source, dry-run and applied on the real
/// apiserver after the commands its notes name) run as a kubelet would, with the real
/// Alloy: the chart's Alloy loads the folder cmpoll writes (the chart's
/// `/etc/alloy/KEY` path), the example module runs, an update reaches it, a module Alloy
/// cannot build is refused and removed and its author gets a Kubernetes Event (the
/// chart's ClusterRole is cmpoll's and it suffices); Alloy gets no token.
#[test]
fn the_alloy_charts_deployment_runs_cmpoll_beside_real_alloy() {
    let Some((mut objects, k, _one)) = alloy_chart_on_a_real_apiserver("values-deployment.yaml")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    run_documented_kubectl(&k, "values-deployment.yaml", Path::new("/nonexistent"));
    dry_run_and_apply(&k, &objects);
    let made: Value = serde_json::from_str(&k.ok(&[
        "-n",
        "monitoring",
        "get",
        "configmap",
        "cmpoll-alloy",
        "-o",
        "json",
    ]))
    .unwrap();
    objects.push(made);
    let example = example_module();
    assert_eq!(example["metadata"]["namespace"], "monitoring");
    k.apply(&example.to_string());
    let deployment = (objects.iter())
        .find(|o| o["kind"] == "Deployment")
        .unwrap()
        .clone();
    let spec = &deployment["spec"]["template"]["spec"];
    let alloy = alloy_container(spec);
    assert!(
        (alloy["args"].as_array().unwrap().iter()).any(|a| a == "/etc/alloy/../../modules"),
        "{}",
        alloy["args"]
    );
    let api = Api {
        ca_pem: k.ca_pem(),
        port: k.port,
        token: k.token("monitoring", "alloy", "1h"),
        services: Vec::new(),
    };
    let pod = start_pod_on(&api, &objects, &deployment, dir.path());
    probes_pass(spec, &pod);
    let port = port(alloy, &"http-metrics".into());
    let module = "monitoring_S_payments_scrape.module";
    let want = alloy_runs_the_example(port, &pod);
    k.apply(&updated_example().to_string());
    k.ok(&["create", "namespace", "team-y"]);
    let unbuildable = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "unbuildable", "namespace": "team-y",
            "labels": {"cmpoll.io/module": "true"}},
        "data": {"y.alloy": "prometheus.scrape \"y\" {\n  targets         = []\n  forward_to      = []\n  scrape_interval = \"1s\"\n  scrape_timeout  = \"5s\"\n}\n"}});
    k.apply(&unbuildable.to_string());
    eventually_explained(
        "the update reaches the chart's Alloy",
        Duration::from_secs(60),
        || alloy_components(port, Some(module)).len() == 2,
        || format!("{:?}\n{}", alloy_components(port, Some(module)), pod.log()),
    );
    eventually_explained(
        "Alloy refuses the module it cannot build, and its author gets an Event",
        Duration::from_secs(60),
        || {
            let events: Value = serde_json::from_str(&k.ok(&[
                "-n",
                "team-y",
                "get",
                "events.events.k8s.io",
                "-o",
                "json",
            ]))
            .unwrap();
            (events["items"].as_array().into_iter().flatten()).any(|e| {
                e["reason"] == "Rejected"
                    && e["regarding"]["name"] == "unbuildable"
                    && s(&e["note"]).contains("refused by the agent")
            })
        },
        || pod.log(),
    );
    eventually_explained(
        "the chart's Alloy runs the others, without it",
        SOON,
        || alloy_components(port, None) == want,
        || pod.log(),
    );
    assert!(
        !dir.path()
            .join("volumes/modules/team-y.unbuildable.alloy")
            .exists()
    );
    // No token for Alloy: its account mounts none, only cmpoll's container projects one.
    let account = (objects.iter())
        .find(|o| o["kind"] == "ServiceAccount")
        .unwrap();
    assert_eq!(account["automountServiceAccountToken"], false);
    assert!(
        !(alloy["volumeMounts"].as_array().unwrap().iter())
            .any(|m| s(&m["mountPath"]).contains("serviceaccount")),
        "Alloy gets a service-account token"
    );
    drop(pod);
}

/// charts/cmpoll's hubs and Grafana's alloy chart with k8s/alloy-helm/values-daemonset.yaml
/// (both rendered by the real helm, dry-run and applied on the real apiserver after the
/// commands the values' notes name), run as a kubelet would: the DaemonSet's follower
/// gets the example module from the hub through the Service's name with the chart's
/// service account's token (reviewed by the hub against the follower ClusterRole the
/// values add), the real Alloy runs it, an update arrives long before the follower's
/// interval, and the follower asks the apiserver nothing.
#[test]
fn the_alloy_charts_daemonset_follows_the_cmpoll_charts_hub() {
    let Some((mut objects, k, _one)) = alloy_chart_on_a_real_apiserver("values-daemonset.yaml")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let hub_objects = yaml_docs(crate::deploy::helm_template(&[]).as_bytes());
    k.ok(&["create", "namespace", "cmpoll"]);
    dry_run_and_apply(&k, &hub_objects);
    let pki = test_apiserver::Pki::with_server_names(
        "cmpoll-hub-ca",
        &["cmpoll-hub.cmpoll.svc", "127.0.0.1"],
    );
    let tls = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "cmpoll-hub-tls", "namespace": "cmpoll"},
        "stringData": {"tls.crt": pki.server.cert_pem, "tls.key": pki.server.key_pem}});
    k.apply(&tls.to_string());
    let hub_ca = dir.path().join("hubs-ca.pem");
    std::fs::write(&hub_ca, pki.ca_pem()).unwrap();
    run_documented_kubectl(&k, "values-daemonset.yaml", &hub_ca);
    dry_run_and_apply(&k, &objects);
    for name in ["cmpoll-alloy", "cmpoll-hub-ca"] {
        let made = k.ok(&["-n", "monitoring", "get", "configmap", name, "-o", "json"]);
        objects.push(serde_json::from_str(&made).unwrap());
    }
    objects.push(tls);
    objects.extend(hub_objects.iter().cloned());
    let example = example_module();
    k.apply(&example.to_string());
    let hub = (hub_objects.iter())
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    let hub_dir = tempfile::tempdir().unwrap();
    let (hub_pod, https) = start_hub(&k, &objects, hub, hub_dir.path());
    let mark = k.audit_mark();
    let daemonset = (objects.iter())
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap()
        .clone();
    let spec = &daemonset["spec"]["template"]["spec"];
    let follower_api = Api {
        ca_pem: k.ca_pem(),
        port: k.port,
        token: k.token("monitoring", "alloy", "1h"),
        services: vec![(
            "https://cmpoll-hub.cmpoll.svc".to_string(),
            format!("https://127.0.0.1:{https}"),
        )],
    };
    let pod = start_pod_on(&follower_api, &objects, &daemonset, dir.path());
    probes_pass(spec, &pod);
    let alloy = alloy_container(spec);
    let port = port(alloy, &"http-metrics".into());
    let module = "monitoring_S_payments_scrape.module";
    eventually_explained(
        "the chart's Alloy runs the example module it got through the hub",
        SOON,
        || alloy_components(port, Some(module)).len() == 1,
        || format!("{}\n{}", pod.log(), hub_pod.log()),
    );
    k.apply(&updated_example().to_string());
    eventually_explained(
        "the update reaches the chart's Alloy through the hub, before the 60 s interval",
        Duration::from_secs(30),
        || {
            alloy_components(port, Some(module))
                .iter()
                .filter(|(_, h)| h == "healthy")
                .count()
                == 2
        },
        || format!("{}\n{}", pod.log(), hub_pod.log()),
    );
    let audit = k.audit_since(mark);
    let asked: Vec<&Value> = (audit.iter())
        .filter(|e| e["user"]["username"] == "system:serviceaccount:monitoring:alloy")
        .collect();
    assert!(
        asked.is_empty(),
        "the follower called the apiserver: {asked:?}"
    );
    let reviewed = (audit.iter())
        .filter(|e| e["user"]["username"] == "system:serviceaccount:cmpoll:cmpoll-hub")
        .any(|e| e["objectRef"]["resource"] == "subjectaccessreviews");
    assert!(reviewed, "the hub asked whether the follower may list");
    drop(pod);
    drop(hub_pod);
}
