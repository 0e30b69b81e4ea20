//! The images users pull (issue 41), built here by `packaging/image/build.sh` from this
//! machine's files (no base image is pulled) and run by a real OCI runtime: podman with
//! runc, as `../shared/containers.md` found them working here (vfs storage, cgroupfs, no
//! default ulimits, the host's network). The image under test holds the binary under test.
//!
//! - the image is what the Dockerfile promises: its user, entrypoint, commands and labels
//!   read from the Dockerfile itself; a file tree with the binary, exactly the libraries it
//!   links, the CA bundle, nonroot's passwd entry, /tmp — and no shell; the same inputs
//!   make the same image;
//! - `cmpoll --version` runs in it;
//! - `cmpoll run` in it, with k8s/prometheus's settings (its environment, read-only root,
//!   the restricted Pod Security settings: user 65532, every capability dropped, no
//!   privilege escalation; the service-account token mounted where the kubelet mounts
//!   it) against the real apiserver, holding the RBAC k8s/prometheus ships, delivers a
//!   module and stops cleanly;
//! - the `-sidecar` image, with nothing but the Grafana chart's environment, answers
//!   `/healthz` and writes the dashboards.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use test_apiserver::real::RealApiserver;

use crate::util::tools::{curl, free_port, tool, yaml_docs};
use crate::util::{BIN, eventually_explained, root, skip_unless};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The images built from the binary under test, in a store of their own.
struct Images {
    store: tempfile::TempDir,
    conf: PathBuf,
    /// The build script's output: `NAME ID` lines.
    built: String,
}

fn tools_here() -> bool {
    !skip_unless(
        ["buildah", "podman", "runc"]
            .iter()
            .all(|t| tool(t).is_some()),
        "buildah, podman and runc (Debian packages)",
    )
}

/// `packaging/image/build.sh BIN STORE`.
fn build(store: &Path) -> String {
    let out = Command::new(root().join("packaging/image/build.sh"))
        .arg(BIN)
        .arg(store)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .unwrap();
    assert!(out.status.success(), "build.sh: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

impl Images {
    fn build() -> Images {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let built = build(&store);
        // podman's default ulimits cannot be set here (containers.md).
        let conf = dir.path().join("containers.conf");
        std::fs::write(&conf, "[containers]\ndefault_ulimits = []\n").unwrap();
        Images {
            store: dir,
            conf,
            built,
        }
    }

    fn podman(&self) -> Command {
        let store = self.store.path().join("store");
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", &self.conf)
            .arg("--storage-driver")
            .arg("vfs")
            .arg("--root")
            .arg(store.join("root"))
            .arg("--runroot")
            .arg(store.join("run"))
            .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        let out = self.podman().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `podman ARGS` (a `run`) in the background.
    fn start(&self, args: &[String]) -> std::process::Child {
        (self.podman().args(args))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// What container `name` logged.
    fn logs(&self, name: &str) -> String {
        let out = self.podman().args(["logs", name]).output().unwrap();
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout)
    }

    /// `podman stop` (SIGTERM), which must end `child` with 0 (a clean stop); its log.
    fn stop(&self, name: &str, mut child: std::process::Child) -> String {
        let stop = self
            .podman()
            .args(["stop", "-t", "10", name])
            .output()
            .unwrap();
        assert!(stop.status.success(), "{stop:?}");
        let code = child.wait().unwrap().code();
        let log = self.logs(name);
        assert_eq!(code, Some(0), "a clean stop: {log}");
        let _ = self.podman().args(["rm", "-f", name]).output();
        log
    }

    fn inspect(&self, image: &str) -> Value {
        let out = self.run(&["image", "inspect", image]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0].clone()
    }

    /// The image's one layer, as `tar -tv` lists it: (mode and owner, path) per entry.
    fn tree(&self, archive: &str) -> Vec<(String, String)> {
        let dir = tempfile::tempdir().unwrap();
        let tar = self.store.path().join(archive);
        let ok = Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(ok.success(), "{}", tar.display());
        let blob = |digest: &str| dir.path().join("blobs/sha256").join(&digest[7..]);
        let index: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
        let manifest: Value = serde_json::from_slice(
            &std::fs::read(blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap(),
        )
        .unwrap();
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1, "one layer: {manifest}");
        let out = Command::new("tar")
            .arg("-tvzf")
            .arg(blob(layers[0]["digest"].as_str().unwrap()))
            .arg("--numeric-owner")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        (String::from_utf8_lossy(&out.stdout).lines())
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let path = f[5]
                    .trim_start_matches("./")
                    .trim_end_matches('/')
                    .to_string();
                (format!("{} {}", f[0], f[1]), path)
            })
            .filter(|(_, p)| !p.is_empty() && p != ".")
            .collect()
    }
}

/// `podman run` as a kubelet runs a container of a restricted pod: as `user`, every
/// capability dropped, no privilege escalation, a read-only root, the service account's
/// folder `sa` where the kubelet mounts it, the apiserver on the loopback at `port` (the
/// pod's network is the host's here).
fn in_a_pod(name: &str, user: &str, sa: &Path, port: u16) -> Vec<String> {
    [
        "run",
        "--name",
        name,
        "--network",
        "host",
        "--read-only",
        "--user",
        user,
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-v",
        &format!(
            "{}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
            sa.display()
        ),
        "-e",
        "KUBERNETES_SERVICE_HOST=127.0.0.1",
        "-e",
        &format!("KUBERNETES_SERVICE_PORT={port}"),
    ]
    .map(str::to_string)
    .to_vec()
}

/// The cmpoll container of the rendered shape `objects`, which must name `image`.
fn shape_container<'a>(objects: &'a [Value], image: &str) -> &'a Value {
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let container = (deployment["spec"]["template"]["spec"]["containers"].as_array())
        .unwrap()
        .iter()
        .find(|c| c["name"] == "cmpoll")
        .unwrap();
    assert_eq!(container["image"], image, "the shape names this image");
    container
}

/// `podman run`'s tail for `container`: its environment (`overrides` replacing values),
/// the image, its args.
fn as_the_shape_says(container: &Value, image: &str, overrides: &[(&str, &str)]) -> Vec<String> {
    let mut args = Vec::new();
    for e in container["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        let value = (overrides.iter().find(|(n, _)| *n == name))
            .map_or(e["value"].as_str().unwrap(), |(_, v)| *v);
        args.extend(["-e".to_string(), format!("{name}={value}")]);
    }
    args.push(image.to_string());
    args.extend(
        (container["args"].as_array().unwrap().iter()).map(|a| a.as_str().unwrap().to_string()),
    );
    args
}

/// What the Dockerfile says of a stage: its USER, ENTRYPOINT, CMD and LABELs, following
/// `FROM <stage>` to the stage it builds on (ARG VERSION filled in).
fn dockerfile(stage: &str) -> (String, String, String, Vec<(String, String)>) {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    // Stages by name ("" for the last, unnamed one), each with its lines and its base.
    let mut stages: Vec<(String, String, Vec<String>)> = Vec::new();
    let mut joined = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        joined.push_str(line.trim_end_matches('\\'));
        if line.ends_with('\\') {
            joined.push(' ');
            continue;
        }
        let l = std::mem::take(&mut joined);
        let l = l.trim().to_string();
        if let Some(from) = l.strip_prefix("FROM ") {
            let f: Vec<&str> = from.split_whitespace().collect();
            let name = if f.len() == 3 {
                f[2].to_string()
            } else {
                String::new()
            };
            stages.push((name, f[0].to_string(), Vec::new()));
        } else if !l.is_empty()
            && let Some(s) = stages.last_mut()
        {
            s.2.push(l);
        }
    }
    let mut chain = Vec::new();
    let mut at = stages.iter().find(|s| s.0 == stage).unwrap();
    loop {
        chain.push(at);
        match stages.iter().find(|s| s.0 == at.1) {
            Some(base) => at = base,
            None => break,
        }
    }
    let (mut user, mut entrypoint, mut cmd, mut labels) =
        (String::new(), String::new(), String::new(), Vec::new());
    for s in chain.iter().rev() {
        for l in &s.2 {
            let l = l.replace("${VERSION}", VERSION);
            if let Some(v) = l.strip_prefix("USER ") {
                user = v.to_string();
            } else if let Some(v) = l.strip_prefix("ENTRYPOINT ") {
                entrypoint = v.to_string();
            } else if let Some(v) = l.strip_prefix("CMD ") {
                cmd = v.to_string();
            } else if let Some(v) = l.strip_prefix("LABEL ") {
                // key="value" pairs.
                let mut rest = v.trim();
                while let Some(eq) = rest.find("=\"") {
                    let key = rest[..eq].trim().to_string();
                    let after = &rest[eq + 2..];
                    let end = after.find('"').unwrap();
                    labels.retain(|(k, _): &(String, String)| *k != key);
                    labels.push((key, after[..end].to_string()));
                    rest = after[end + 1..].trim();
                }
            }
        }
    }
    (user, entrypoint, cmd, labels)
}

/// The images are what the Dockerfile's `runtime` and `sidecar` targets promise, their
/// file tree is exactly what cmpoll needs (no shell), and building again gives the same
/// images.
#[test]
fn the_images_are_what_the_dockerfile_promises() {
    if !tools_here() {
        return;
    }
    let images = Images::build();
    for (image, stage) in [
        (format!("ghcr.io/cmpoll/cmpoll:{VERSION}"), ""),
        (
            format!("ghcr.io/cmpoll/cmpoll:{VERSION}-sidecar"),
            "sidecar",
        ),
        (
            format!("ghcr.io/cmpoll/cmpoll:{VERSION}-webhook"),
            "webhook",
        ),
    ] {
        let i = images.inspect(&image);
        let (user, entrypoint, cmd, labels) = dockerfile(stage);
        let config = &i["Config"];
        assert_eq!(config["User"], user, "{image}");
        let json = |v: &Value| serde_json::to_string(v).unwrap().replace(',', ", ");
        assert_eq!(json(&config["Entrypoint"]), entrypoint, "{image}");
        assert_eq!(json(&config["Cmd"]), cmd, "{image}");
        // The Dockerfile was read (title, description, version, licenses, source).
        assert!(labels.len() >= 5 && !user.is_empty(), "{stage}: {labels:?}");
        for (k, v) in &labels {
            assert_eq!(config["Labels"][k], *v, "{image}: label {k}");
        }
    }
    let tree = images.tree(&format!("cmpoll-{VERSION}.oci.tar"));
    let paths: Vec<&str> = tree.iter().map(|(_, p)| p.as_str()).collect();
    let mode = |p: &str| {
        (tree.iter().find(|(_, q)| q == p))
            .map(|(m, _)| m.as_str())
            .unwrap_or_else(|| panic!("{p} not in {paths:?}"))
    };
    assert_eq!(mode("usr/local/bin/cmpoll"), "-rwxr-xr-x 0/0");
    assert_eq!(mode("tmp"), "drwxrwxrwt 0/0");
    assert_eq!(mode("home/nonroot"), "drwx------ 65532/65532");
    for p in [
        "etc/ssl/certs/ca-certificates.crt",
        "etc/passwd",
        "etc/group",
    ] {
        assert!(mode(p).starts_with("-rw-r--r--"), "{p}");
    }
    // The libraries are exactly those the binary links.
    let ldd = Command::new("ldd").arg(BIN).output().unwrap();
    let mut linked: Vec<String> = (String::from_utf8_lossy(&ldd.stdout).lines())
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=> ") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| path[1..].to_string())
        })
        .collect();
    linked.sort();
    let mut files: Vec<String> = (tree.iter())
        .filter(|(m, _)| m.starts_with('-'))
        .map(|(_, p)| p.clone())
        .filter(|p| p.starts_with("lib"))
        .collect();
    files.sort();
    assert_eq!(files, linked);
    assert!(
        !paths.iter().any(|p| p.ends_with("bin/sh")),
        "no shell: {paths:?}"
    );
    assert_eq!(
        paths.iter().filter(|p| !p.starts_with("lib")).count(),
        // usr usr/local usr/local/bin cmpoll, etc etc/ssl etc/ssl/certs bundle passwd
        // group, tmp, home home/nonroot
        13,
        "{paths:?}"
    );
    // The same inputs, the same images (their IDs are the digests of their configs,
    // which name every layer's digest).
    let again = tempfile::tempdir().unwrap();
    assert_eq!(build(&again.path().join("store")), images.built);
    // Every cmpoll image a shape, a chart, the alloy chart's values or a chart fixture
    // names is one the script built (a new tag, or a version bump the manifests missed,
    // would name an image nobody can pull).
    let out = images.run(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
    let built: Vec<String> = (String::from_utf8_lossy(&out.stdout).lines())
        .map(|l| l.trim().to_string())
        .collect();
    let rendered = crate::deploy::manifests();
    let fixtures = root().join("tests/fixtures/charts");
    let mut named = std::collections::BTreeSet::new();
    for dir in [rendered.path(), fixtures.as_path()] {
        for e in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap_or_default();
            for (i, _) in text.match_indices("ghcr.io/cmpoll/cmpoll:") {
                let image: String = text[i..]
                    .chars()
                    .take_while(|c| !c.is_whitespace() && !"\"',".contains(*c))
                    .collect();
                named.insert(image);
            }
        }
    }
    assert!(named.len() >= 3, "{named:?}");
    for image in &named {
        assert!(
            built.contains(image),
            "{image} is named but not built: {built:?}"
        );
    }
}

/// `cmpoll --version` in the image, and `cmpoll run` as k8s/prometheus runs it, against
/// the real apiserver, holding the RBAC k8s/prometheus ships.
#[test]
fn the_image_delivers_a_module_from_the_real_apiserver_as_the_prometheus_shape_runs_it() {
    if !tools_here() || skip_unless(test_apiserver::real::built(), "the real kube-apiserver") {
        return;
    }
    let images = Images::build();
    let image = format!("ghcr.io/cmpoll/cmpoll:{VERSION}");
    let out = images.run(&["run", "--rm", "--network", "host", &image, "--version"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("cmpoll {VERSION}")
    );
    // The shape, applied as shipped.
    let k = RealApiserver::start();
    let rendered = k.ok(&["kustomize", root().join("k8s/prometheus").to_str().unwrap()]);
    k.ok(&["create", "namespace", "cmpoll"]);
    k.ok_in(&["apply", "--server-side", "-f", "-"], Some(&rendered));
    let objects = yaml_docs(rendered.as_bytes());
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    let container = shape_container(&objects, &image);
    let ns = k.namespace("team");
    k.put_configmap(
        &ns,
        "alerts",
        &[("cmpoll.io/module", "true")],
        &[("a.rules.yaml", "groups: []\n")],
    );
    // The service-account folder the kubelet mounts: a bound token, the CA, the namespace.
    let sa = tempfile::tempdir().unwrap();
    std::fs::write(sa.path().join("token"), k.token("cmpoll", "cmpoll", "1h")).unwrap();
    std::fs::write(sa.path().join("ca.crt"), k.ca_pem()).unwrap();
    std::fs::write(sa.path().join("namespace"), "cmpoll").unwrap();
    let rules = tempfile::tempdir().unwrap();
    let sc = &spec["securityContext"];
    let user = format!("{}:{}", sc["runAsUser"], sc["runAsGroup"]);
    std::os::unix::fs::chown(rules.path(), Some(65532), Some(65532)).unwrap();
    let csc = &container["securityContext"];
    assert_eq!(csc["readOnlyRootFilesystem"], true);
    assert_eq!(csc["allowPrivilegeEscalation"], false);
    assert_eq!(csc["capabilities"]["drop"][0], "ALL");
    let listen = free_port();
    let name = format!("cmpoll-image-{listen}");
    let mut args = in_a_pod(&name, &user, sa.path(), k.port);
    args.extend(["-v".into(), format!("{}:/rules", rules.path().display())]);
    // Its own port here (the host's network is shared with other tests).
    let listen_at = format!("127.0.0.1:{listen}");
    args.extend(as_the_shape_says(
        container,
        &image,
        &[("CMPOLL_LISTEN", &listen_at)],
    ));
    let child = images.start(&args);
    let written = rules.path().join(format!("{ns}.alerts.yaml"));
    eventually_explained(
        "the module is in the mounted folder, written by the container",
        Duration::from_secs(60),
        || std::fs::read_to_string(&written).is_ok_and(|t| t == "groups: []\n"),
        || format!("{:?}", std::fs::read_dir(rules.path()).map(|d| d.count())),
    );
    let healthz = curl(&format!("http://127.0.0.1:{listen}/healthz"));
    assert_eq!(healthz.map(|(c, _)| c), Some(200));
    let log = images.stop(&name, child);
    assert!(log.contains("\"poll 1: "), "{log}");
}

/// The `-sidecar` image with nothing but the Grafana chart's sidecar environment (the
/// reload call's credentials, which the chart takes from its Secret, given as values; the
/// health port moved off 8080, the host's network being shared): its default command is
/// `sidecar`, it answers `/healthz`, and the labelled dashboard lands in the chart's folder.
#[test]
fn the_sidecar_image_runs_with_the_grafana_charts_environment() {
    if !tools_here() {
        return;
    }
    let images = Images::build();
    let image = format!("ghcr.io/cmpoll/cmpoll:{VERSION}-sidecar");
    let objects = yaml_docs(
        &std::fs::read(root().join("tests/fixtures/charts/grafana-12.11.1.yaml")).unwrap(),
    );
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let sidecar = (deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap())
    .iter()
    .find(|c| c["image"].as_str().is_some_and(|i| i.ends_with("-sidecar")))
    .unwrap();
    assert_eq!(
        sidecar["image"],
        image.as_str(),
        "the chart names this image"
    );
    assert!(sidecar["command"].is_null() && sidecar["args"].is_null());
    let server = test_apiserver::TestApiserver::start();
    // What the chart's ClusterRole grants: ConfigMaps and Secrets.
    server.grant(
        test_apiserver::USER,
        test_apiserver::Grant::all().resources(&["configmaps", "secrets"]),
    );
    server.put(
        test_apiserver::ConfigMap::new("team-a", "node")
            .label("grafana_dashboard", "1")
            .data("node.json", "{\"title\":\"Nodes\"}"),
    );
    let sa = tempfile::tempdir().unwrap();
    std::fs::write(sa.path().join("token"), test_apiserver::TOKEN).unwrap();
    std::fs::write(sa.path().join("ca.crt"), server.ca_pem()).unwrap();
    std::fs::write(sa.path().join("namespace"), "grafana").unwrap();
    // The user the kubelet would run it as: the container's, else the pod's, else the
    // image's; the shared volume is the pod's fsGroup's.
    let pod_sc = &deployment["spec"]["template"]["spec"]["securityContext"];
    let sc = &sidecar["securityContext"];
    let id = |k: &str| sc[k].as_u64().or(pod_sc[k].as_u64()).unwrap_or(65532) as u32;
    let (uid, gid) = (id("runAsUser"), id("runAsGroup"));
    let dashboards = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dashboards.path(), Some(uid), Some(gid)).unwrap();
    let health = free_port();
    let name = format!("cmpoll-sidecar-{health}");
    let mut args = in_a_pod(
        &name,
        &format!("{uid}:{gid}"),
        sa.path(),
        server.addr().port(),
    );
    args.extend(["-e".into(), format!("HEALTH_PORT={health}")]);
    let mut folder = String::new();
    for e in sidecar["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        let value = match e["value"].as_str() {
            Some(v) => v.to_string(),
            // The chart's Secret: a value here.
            None => "admin".to_string(),
        };
        if name == "FOLDER" {
            folder = value.clone();
        }
        args.extend(["-e".into(), format!("{name}={value}")]);
    }
    args.extend([
        "-v".into(),
        format!("{}:{folder}", dashboards.path().display()),
    ]);
    args.push(image);
    let child = images.start(&args);
    let logs = || images.logs(&name);
    eventually_explained(
        "the dashboard in the chart's folder, and /healthz",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(dashboards.path().join("node.json"))
                .is_ok_and(|t| t == "{\"title\":\"Nodes\"}")
                && curl(&format!("http://127.0.0.1:{health}/healthz")).map(|(c, _)| c) == Some(200)
        },
        logs,
    );
    images.stop(&name, child);
}

/// The `-webhook` image (a shell, busybox's tools, curl) runs k8s/alloy's cmpoll as the
/// shape runs it — its environment, its scripts and mounts, read-only root, user 65532,
/// every capability dropped — beside a real Alloy: `check-module.sh` (alloy fmt and
/// validate) and `confirm-modules.sh` (curl, sed, awk) run inside the image; a good module
/// runs in Alloy, one Alloy cannot build is refused and removed.
#[test]
fn the_webhook_image_runs_the_alloy_shapes_scripts_beside_a_real_alloy() {
    let alloy = root().join("tests/alloy/bin/alloy");
    if !tools_here() || skip_unless(alloy.exists(), "tests/alloy/build.sh's alloy") {
        return;
    }
    let images = Images::build();
    let image = format!("ghcr.io/cmpoll/cmpoll:{VERSION}-webhook");
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join("k8s/alloy"))
        .output()
        .unwrap();
    let objects = yaml_docs(&out.stdout);
    let container = shape_container(&objects, &image);
    let server = test_apiserver::TestApiserver::start();
    let scrape = |extra: &str| {
        format!(
            "argument \"receiver\" {{ }}\nprometheus.scrape \"default\" {{\n  targets    = []\n  forward_to = [argument.receiver.value]\n{extra}}}\n"
        )
    };
    server.put(
        test_apiserver::ConfigMap::new("team-a", "web")
            .label("cmpoll.io/module", "true")
            .data("m.alloy", &scrape("")),
    );
    server.put(
        test_apiserver::ConfigMap::new("team-y", "web")
            .label("cmpoll.io/module", "true")
            .data(
                "m.alloy",
                &scrape("  scrape_interval = \"1s\"\n  scrape_timeout  = \"5s\"\n"),
            ),
    );
    // The pod's volumes, as folders.
    let dir = tempfile::tempdir().unwrap();
    let volume = |name: &str| {
        let p = dir.path().join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let (modules, tools, scripts, root_dir, sa) = (
        volume("modules"),
        volume("tools"),
        volume("cmpoll-alloy"),
        volume("alloy-root"),
        volume("sa"),
    );
    std::fs::copy(&alloy, tools.join("alloy")).unwrap();
    for f in [
        "module.tmpl",
        "offered-arguments",
        "check-module.sh",
        "confirm-modules.sh",
    ] {
        std::fs::copy(root().join("k8s/alloy").join(f), scripts.join(f)).unwrap();
    }
    std::fs::copy(
        root().join("k8s/alloy/root.alloy"),
        root_dir.join("root.alloy"),
    )
    .unwrap();
    // The alloy-root init container's copy.
    std::fs::copy(
        root().join("k8s/alloy/root.alloy"),
        modules.join("root.alloy"),
    )
    .unwrap();
    std::os::unix::fs::chown(&modules, Some(65532), Some(65532)).unwrap();
    std::fs::write(sa.join("token"), test_apiserver::TOKEN).unwrap();
    std::fs::write(sa.join("ca.crt"), server.ca_pem()).unwrap();
    std::fs::write(sa.join("namespace"), "cmpoll").unwrap();
    // Alloy, on the folder (its own container in the pod).
    let alloy_port = free_port();
    let _alloy = crate::util::KillOnDrop(
        Command::new(&alloy)
            .arg("run")
            .arg(format!("--server.http.listen-addr=127.0.0.1:{alloy_port}"))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("alloy-data").display()
            ))
            .arg(&modules)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let name = format!("cmpoll-alloy-{alloy_port}");
    let mut args = in_a_pod(&name, "65532:65532", &sa, server.addr().port());
    for (host, at) in [
        (&modules, "/modules"),
        (&tools, "/tools:ro"),
        (&scripts, "/etc/cmpoll-alloy:ro"),
        (&root_dir, "/etc/alloy-root:ro"),
    ] {
        args.extend(["-v".into(), format!("{}:{at}", host.display())]);
    }
    let listen = free_port();
    // Their own ports here (the host's network is shared with other tests).
    let (alloy_url, listen_at) = (
        format!("http://127.0.0.1:{alloy_port}"),
        format!("127.0.0.1:{listen}"),
    );
    args.extend(as_the_shape_says(
        container,
        &image,
        &[("ALLOY_URL", &alloy_url), ("CMPOLL_LISTEN", &listen_at)],
    ));
    let child = images.start(&args);
    let components = || {
        let Some((200, body)) = curl(&format!(
            "http://127.0.0.1:{alloy_port}/api/v0/web/components"
        )) else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let mut c: Vec<String> = (v.as_array().into_iter().flatten())
            .map(|c| {
                format!(
                    "{} {}",
                    c["localID"].as_str().unwrap_or(""),
                    c["health"]["state"].as_str().unwrap_or("")
                )
            })
            .collect();
        c.sort();
        c
    };
    eventually_explained(
        "Alloy runs team-a's module; team-y's, which it cannot build, is refused and gone",
        Duration::from_secs(60),
        || {
            components()
                == [
                    "prometheus.remote_write.default healthy",
                    "team_a_S_web.module healthy",
                ]
                && !modules.join("team-y.web.alloy").exists()
                && images
                    .logs(&name)
                    .contains("module team-y/web rejected: refused by the agent: ")
        },
        || format!("{:?}\n{}", components(), images.logs(&name)),
    );
    assert!(modules.join("team-a.web.alloy").exists());
    images.stop(&name, child);
}
