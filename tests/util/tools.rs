//! Tools the tests ask, found and driven in one place: programs on `PATH` (with the sbin
//! folders), free loopback ports, `curl`, the CI virtualenv's Python (YAML to JSON), and
//! Prometheus's loaded rules.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The full path of a program on `PATH` (with the sbin folders, where Debian puts nginx).
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// A loopback port nobody listens on (the kernel's pick, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `curl URL`: (status, body), or None when nothing answers.
pub fn curl(url: &str) -> Option<(u16, String)> {
    // An https:// probe is the kubelet's: it does not verify the certificate.
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "3", "-w", "\n%{http_code}", url])
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap();
    Some((code.parse().unwrap(), body.to_string()))
}

/// The Python with the CI virtualenv's packages: `CMPOLL_TEST_PYTHON`, then
/// `target/ci-venv/bin/python`, then `python3`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CMPOLL_TEST_PYTHON") {
        return p.into();
    }
    let venv = super::root().join("target/ci-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// The documents of a YAML stream as JSON values, read by PyYAML (empty ones dropped).
pub fn yaml_docs(yaml: &[u8]) -> Vec<serde_json::Value> {
    use std::io::Write as _;
    let mut child = Command::new(python())
        .args([
            "-c",
            "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python (bash .ci/run makes target/ci-venv)");
    child.stdin.take().unwrap().write_all(yaml).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "PyYAML (pip install pyyaml)");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The names of the rules a Prometheus on 127.0.0.1:`port` has loaded, sorted; None while it
/// does not answer.
pub fn prometheus_rules(port: u16) -> Option<Vec<String>> {
    let (code, body) = curl(&format!("http://127.0.0.1:{port}/api/v1/rules"))?;
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut names: Vec<String> = v["data"]["groups"]
        .as_array()?
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    Some(names)
}
