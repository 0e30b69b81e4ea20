//! What one request costs the real kube-apiserver (issue 31, item 3), by its shape: the
//! list cmpoll makes in each mode and encoding, over a new connection or a kept one, a
//! GET of one object, and `GET /version` (the cost of any request) — so that a change to
//! what cmpoll asks is decided on the apiserver's figures. For each shape curl (HTTP/1.1,
//! as cmpoll speaks it) makes `requests` requests in a row as the fleet's service account,
//! and the apiserver's CPU (its `/proc`) over them is divided by their number; the median
//! of `runs`. M labelled ConfigMaps of 2 KiB, as in the fleet part.

use std::process::{Command, Stdio};

use test_apiserver::real::{RealApiserver, built};

use super::apifleet::{account_token, load};

pub struct Plan {
    pub objects: Vec<usize>,
    pub requests: usize,
    pub runs: usize,
}

const SELECTOR: &str = "labelSelector=cmpoll.io%2Fmodule%3Dtrue";
const META_JSON: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json";
const META_PROTO: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const PROTO: &str = "application/vnd.kubernetes.protobuf";

struct Shape {
    name: &'static str,
    path: String,
    accept: &'static str,
    gzip: bool,
    new_connection: bool,
}

/// Seconds of CPU the apiserver spent.
fn apiserver_cpu(api: &RealApiserver) -> f64 {
    super::proc_usage(api.apiserver_pid()).0
}

/// curl's arguments for one shape, the token read from a file (not on the command line).
fn curl(api: &RealApiserver, header: &std::path::Path, s: &Shape, n: usize) -> Command {
    let url = format!("{}{}", api.url, s.path);
    let mut c = Command::new("curl");
    c.args(["-sS", "--fail", "--http1.1", "--cacert"])
        .arg(api.ca_file())
        .arg("-H")
        .arg(format!("@{}", header.display()))
        .args(["-H", &format!("Accept: {}", s.accept)]);
    if s.gzip {
        c.arg("--compressed");
    }
    if s.new_connection {
        c.args(["-H", "Connection: close"]);
    }
    for _ in 0..n {
        c.args(["-o", "/dev/null", &url]);
    }
    c.stdin(Stdio::null());
    c
}

/// Bytes of one answer as sent (compressed when gzip was accepted).
fn answer_bytes(api: &RealApiserver, header: &std::path::Path, s: &Shape) -> u64 {
    let mut c = curl(api, header, s, 0);
    c.args(["-o", "/dev/null", "-w", "%{size_download}"])
        .arg(format!("{}{}", api.url, s.path));
    let out = c.output().expect("curl");
    assert!(
        out.status.success(),
        "{}: {}",
        s.name,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

pub fn run(plan: &Plan) {
    println!(
        "== what one request costs the real kube-apiserver: {:?} ConfigMaps of 2048 B, {} requests per shape, median of {} ==",
        plan.objects, plan.requests, plan.runs
    );
    if !built() {
        println!("skipped: the real apiserver is not built (tests/kube/build.sh)");
        return;
    }
    if Command::new("curl").arg("--version").output().is_err() {
        println!("skipped: curl is not installed");
        return;
    }
    let api = RealApiserver::start();
    let token = account_token(&api);
    let dir = tempfile::tempdir().expect("tempdir");
    let header = dir.path().join("auth");
    std::fs::write(&header, format!("Authorization: Bearer {token}\n")).expect("write");
    let list = format!("/api/v1/configmaps?{SELECTOR}&resourceVersion=0");
    let shape = |name, path: &str, accept, gzip, new_connection| Shape {
        name,
        path: path.to_string(),
        accept,
        gzip,
        new_connection,
    };
    let shapes = [
        shape(
            "GET /version, new connection",
            "/version",
            "application/json",
            false,
            true,
        ),
        shape(
            "GET /version, kept connection",
            "/version",
            "application/json",
            false,
            false,
        ),
        shape(
            "GET one ConfigMap (cache), kept",
            "/api/v1/namespaces/fleet-0/configmaps/module-0?resourceVersion=0",
            "application/json",
            true,
            false,
        ),
        shape(
            "metadata list JSON, new connection",
            &list,
            META_JSON,
            true,
            true,
        ),
        shape("metadata list JSON, kept", &list, META_JSON, true, false),
        shape(
            "metadata list protobuf, new connection",
            &list,
            META_PROTO,
            true,
            true,
        ),
        shape(
            "metadata list protobuf, kept",
            &list,
            META_PROTO,
            true,
            false,
        ),
        shape(
            "full list JSON gzip, kept",
            &list,
            "application/json",
            true,
            false,
        ),
        shape(
            "full list JSON, kept",
            &list,
            "application/json",
            false,
            false,
        ),
        shape("full list protobuf gzip, kept", &list, PROTO, true, false),
        shape("full list protobuf, kept", &list, PROTO, false, false),
    ];
    println!(
        "{:<6} {:<40} {:>12} {:>12}",
        "M", "request", "apiCPU/req", "bytes/answer"
    );
    let mut loaded = 0;
    for &m in &plan.objects {
        load(&api, loaded, m);
        loaded = loaded.max(m);
        for s in &shapes {
            let bytes = answer_bytes(&api, &header, s);
            // A warm-up, then the runs.
            let _ = curl(&api, &header, s, 20).output();
            let mut per: Vec<f64> = (0..plan.runs)
                .map(|_| {
                    let a = apiserver_cpu(&api);
                    let out = curl(&api, &header, s, plan.requests)
                        .output()
                        .expect("curl");
                    assert!(
                        out.status.success(),
                        "{}: {}",
                        s.name,
                        String::from_utf8_lossy(&out.stderr)
                    );
                    (apiserver_cpu(&api) - a) / plan.requests as f64 * 1000.0
                })
                .collect();
            per.sort_by(f64::total_cmp);
            println!(
                "{:<6} {:<40} {:>9.2} ms {:>12}",
                m,
                s.name,
                per[per.len() / 2],
                bytes
            );
        }
    }
}
