//! `test-apiserver`: the test apiserver as a standalone process, for demos and benchmarks.
//!
//! ```text
//! cargo run -p test-apiserver -- --configmaps 10000 --size 2048 --namespaces 20
//! cargo run -p test-apiserver -- --manifests k8s/examples
//! ```
//! It prints its URL and the path of a kubeconfig that reaches it, then serves until killed.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use test_apiserver::{Kubeconfig, Options, TOKEN, TestApiserver};

const USAGE: &str = "usage: test-apiserver [--configmaps N] [--size BYTES] [--namespaces N]
                      [--manifests DIR] [--bind ADDR] [--http] [--dir DIR]

  --configmaps N    generate N module ConfigMaps (label cmpoll.io/module=true)
  --size BYTES      bytes of data per generated ConfigMap (default 2048)
  --namespaces N    spread generated ConfigMaps over N namespaces (default 20)
  --manifests DIR   also load ConfigMap manifests (YAML/JSON) from DIR
  --bind ADDR       address to listen on (default 127.0.0.1; ::1 for IPv6)
  --http            also serve plain HTTP on another port
  --dir DIR         where to write kubeconfig and ca.crt (default: a new temp folder)";

struct Args {
    configmaps: usize,
    size: usize,
    namespaces: usize,
    manifests: Option<PathBuf>,
    bind: IpAddr,
    http: bool,
    dir: Option<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        configmaps: 0,
        size: 2048,
        namespaces: 20,
        manifests: None,
        bind: IpAddr::from([127, 0, 0, 1]),
        http: false,
        dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag}: missing value"));
        let num = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--configmaps" => a.configmaps = num(value()?)?,
            "--size" => a.size = num(value()?)?,
            "--namespaces" => a.namespaces = num(value()?)?,
            "--manifests" => a.manifests = Some(value()?.into()),
            "--bind" => a.bind = value()?.parse().map_err(|e| format!("--bind: {e}"))?,
            "--http" => a.http = true,
            "--dir" => a.dir = Some(value()?.into()),
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let server = TestApiserver::start_with(Options {
        bind: args.bind,
        plain_http: args.http,
        behaviour: Default::default(),
        ..Options::default()
    });
    let started = Instant::now();
    server.bulk_load(args.configmaps, args.size, args.namespaces);
    if let Some(dir) = &args.manifests {
        match server.load_manifests(dir) {
            Ok(n) => eprintln!("loaded {n} ConfigMaps from {}", dir.display()),
            Err(e) => {
                eprintln!("test-apiserver: error: --manifests: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let dir = args.dir.unwrap_or_else(|| {
        tempfile::Builder::new()
            .prefix("test-apiserver-")
            .tempdir()
            .expect("temp dir")
            .keep()
    });
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("test-apiserver: error: --dir {}: {e}", dir.display());
        return ExitCode::from(2);
    }
    let kubeconfig = server.write_kubeconfig(&dir.join("kubeconfig"), &Kubeconfig::token());
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, server.ca_pem()).expect("write ca.crt");
    std::fs::write(dir.join("token"), TOKEN).expect("write token");
    println!("url: {}", server.url());
    if let Some(u) = server.http_url() {
        println!("http-url: {u}");
    }
    println!("kubeconfig: {}", kubeconfig.display());
    println!("ca: {}", ca.display());
    println!("token-file: {}", dir.join("token").display());
    println!(
        "configmaps: {} (loaded in {:?})",
        server.objects().len(),
        started.elapsed()
    );
    loop {
        std::thread::park();
    }
}
