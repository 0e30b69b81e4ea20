//! The shapes users install, under a real kubelet (issue 57): a one-node cluster
//! (`tests/cluster/node.sh`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
//! kubelet and kube-proxy of tests/kube/go.mod, Debian's containerd and runc), cmpoll's
//! images imported into it, the chart installed by the real helm. What a simulated pod
//! (tests/pod.rs) cannot show, each an assertion: probes passing under the kubelet, the
//! process as runc started it, the projected token as the kubelet writes it, Service
//! routing through kube-proxy, and the environment the kubelet gives a container.
//!
//! Its own test binary, so that it never runs beside the parallel suite (cargo runs test
//! binaries one after another): the node takes fixed ports, /run/containerd and CPU the
//! suite's timings would feel. Needs root; under `CI=true` a missing assumption fails.

// A test binary: unwrapping is how it fails loudly.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The running node; `node.sh down` when dropped, and a failure when it leaves anything.
struct Node {
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Node {
    /// Starts the node, or says why it cannot (a skip outside CI, a failure under it).
    fn up() -> Option<Node> {
        let script = root().join("tests/cluster/node.sh");
        let check = Command::new(&script).arg("check").output().unwrap();
        if !check.status.success() {
            let why = String::from_utf8_lossy(&check.stderr).trim().to_string();
            assert!(!in_ci(), "the real node cannot run here and CI=true: {why}");
            eprintln!("SKIPPED: the real node cannot run here ({why}); under CI=true this fails");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("cmpoll-node-")
            .tempdir()
            .unwrap()
            .keep();
        let started = Instant::now();
        let out = Command::new(&script)
            .arg("up")
            .arg(&dir)
            .arg(env!("CARGO_BIN_EXE_cmpoll"))
            // Killed before its Drop, this test still takes the node down.
            .arg(std::process::id().to_string())
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "node.sh up failed (its logs: target/cluster-logs/{:?})",
            dir.file_name().unwrap()
        );
        eprintln!("node Ready after {:?}", started.elapsed());
        let kubeconfig = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        Some(Node { dir, kubeconfig })
    }

    fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut child = Command::new(root().join("tests/kube/bin/kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            // No request hangs the run (waits have their own, shorter, --timeout).
            .arg("--request-timeout=200s")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let input = stdin.unwrap_or("").to_string();
        let mut pipe = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || {
            use std::io::Write as _;
            let _ = pipe.write_all(input.as_bytes());
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args, None)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all)).unwrap()
    }

    /// The pods of `ns` labelled `selector`, those being deleted left out.
    fn pods(&self, ns: &str, selector: &str) -> Vec<Value> {
        let list = self.json(&["-n", ns, "get", "pods", "-l", selector]);
        (list["items"].as_array().unwrap().iter())
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .cloned()
            .collect()
    }

    /// The ready addresses of Service `name`'s EndpointSlices, sorted.
    fn ready_addresses(&self, ns: &str, name: &str) -> Vec<String> {
        let label = format!("kubernetes.io/service-name={name}");
        let slices = self.json(&["-n", ns, "get", "endpointslices", "-l", &label]);
        let mut ready: Vec<String> = (slices["items"].as_array().unwrap().iter())
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .filter(|e| e["conditions"]["ready"] == true)
            .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        ready.sort();
        ready
    }

    /// Makes TLS Secret `name` of `ns`, or replaces it, with the files `crt` and `key`.
    fn tls_secret(&self, ns: &str, name: &str, crt: &Path, key: &Path) {
        let (crt, key) = (crt.to_str().unwrap(), key.to_str().unwrap());
        let args = [
            "-n", ns, "create", "secret", "tls", name, "--cert", crt, "--key", key,
        ];
        let yaml = self.kubectl(&[&args[..], &["--dry-run=client", "-o", "yaml"]].concat());
        self.apply(&yaml);
    }

    fn apply(&self, yaml: &str) {
        self.try_kubectl(&["apply", "-f", "-"], Some(yaml))
            .unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    }

    fn helm(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(root().join("tools/helm/bin/helm"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"))
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            Ok(text)
        } else {
            Err(text)
        }
    }

    /// `helm ARGS`, or a failure saying `what` failed with the pods and events of the
    /// release's namespace.
    fn helm_ok(&self, args: &[&str], what: &str) {
        if let Err(e) = self.helm(args) {
            let pods =
                self.try_kubectl(&["-n", "cmpoll", "get", "pods,events", "-o", "wide"], None);
            panic!("{what} failed: {e}\n{pods:?}");
        }
    }

    /// The kubelet's own folder of pod `uid`.
    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.dir.join("kubelet/pods").join(uid)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let out = Command::new(root().join("tests/cluster/node.sh"))
            .arg("down")
            .arg(&self.dir)
            .output()
            .unwrap();
        if !out.status.success() && !std::thread::panicking() {
            panic!(
                "node.sh down left the machine changed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Waits for `check`, saying what it waited for and what it last saw.
fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if start.elapsed() > timeout => panic!("timed out waiting: {what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// A serving certificate for `names`, made with openssl, signed by the CA of `dir` (made
/// the first time): (CA PEM, cert, key) paths. Each call a new key and serial.
fn serving_cert(dir: &Path, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let run = |args: &str| {
        let out = Command::new("openssl")
            .args(args.split(' '))
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl {args}: {out:?}");
    };
    if !dir.join("ca.crt").exists() {
        run(
            "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -subj /CN=hub-ca -days 2 -out ca.crt",
        );
    }
    run("req -new -newkey rsa:2048 -nodes -keyout tls.key -subj /CN=cmpoll-hub -out tls.csr");
    let sans: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    let ext = format!(
        "subjectAltName={}\nextendedKeyUsage=serverAuth\n",
        sans.join(",")
    );
    std::fs::write(dir.join("tls.ext"), ext).unwrap();
    run(
        "x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile tls.ext -out tls.crt",
    );
    (dir.join("ca.crt"), dir.join("tls.crt"), dir.join("tls.key"))
}

/// A JWT's claims, unverified (the apiserver verified them; this reads what it put in).
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

mod alloy;
mod chart;
mod fleet;
mod follower;
mod prometheus;
mod remotecfg;
mod rotation;
mod shapes;
mod webhook;

/// One node, every shape in turn. The hubs and followers whose tokens rotate start first
/// and run through the steps that do not touch them; the rotation is waited for (10
/// minutes' tokens rotate after 8) before the steps that replace the hubs.
#[test]
fn the_shapes_users_install_run_under_a_real_kubelet() {
    let Some(node) = Node::up() else { return };
    let step = Instant::now();
    let took = |what: &str| eprintln!("{:?}: {what}", step.elapsed());
    let hubs = chart::installed(&node);
    let followers = fleet::start(&node);
    let start = rotation::first_tokens(&node, &hubs, &followers);
    took("the chart installed, its hubs Ready and followed");
    chart::the_process_is_as_runc_started_it(&node, &hubs);
    chart::the_projected_token_is_the_kubelets(&node, &hubs);
    follower::lists_through_the_service(&node);
    took("a follower listed through the Service by its DNS name");
    remotecfg::alloy_with_only_a_remotecfg_block_runs_the_hubs_modules(&node);
    took("k8s/alloy-remotecfg ran the root and a module of the chart's hubs");
    alloy::serve_alloy_runs_what_the_hub_serves(&node);
    took("k8s/serve-alloy ran a module, its update and its delete");
    prometheus::the_primary_shape_serves_the_rules(&node);
    took("k8s/ served its rules");
    shapes::each_comes_up_ready(&node);
    took("the other k8s/ shapes came up Ready");
    webhook::the_webhook_reviews_in_the_admission_chain(&node);
    webhook::the_shapes_webhook_reviews_without_cert_manager(&node);
    took("the chart's webhook and k8s/webhook reviewed in the admission chain");
    rotation::tokens_rotate_under_running_hubs_and_followers(&node, &start, &hubs);
    took("every token rotated, no request failed");
    fleet::followers_ride_out_a_rotation_and_an_eviction(&node, &followers);
    took("followers rode out a TLS rotation and both hubs evicted");
    shapes::serve_serves_a_follower(&node);
    took("k8s/serve served a follower");
}
