//! `latency`: from a ConfigMap change at the test apiserver to a real agent serving it.
//!
//! ```text
//! cargo run --release -p test-apiserver --bin latency                  # 20 changes each
//! cargo run --release -p test-apiserver --bin latency -- --changes 50 --interval 1s
//! ```
//! nginx (Debian's), supervised by cmpoll: files layout, `include DIR/*/*/*.conf`,
//! `--reload-signal HUP`; the time until `curl` gets the new body from the site's port.
//! Prometheus (Debian's) beside cmpoll: concat layout, `rule_files: [DIR/*.yaml]`,
//! `--reload-url …/-/reload`; the time until `/api/v1/rules` lists the new rule. Each change
//! is made at a random point of the poll interval (`--jitter 0`), so the expected wait is
//! half an interval plus the delivery; the table prints the median, p90 and maximum, and
//! the same minus the time the change waited for the next poll (delivery alone).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_apiserver::{ConfigMap, Kubeconfig, TestApiserver};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/usr/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn curl(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-s", "-f", "--max-time", "2", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).to_string())
}

fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// The lists served so far, to know when the poll after a change started.
fn lists(server: &TestApiserver) -> Vec<Instant> {
    server
        .requests()
        .iter()
        .filter(|r| r.is_list())
        .map(|r| r.at)
        .collect()
}

struct Sample {
    total: Duration,
    delivery: Duration,
}

fn measure(
    server: &TestApiserver,
    changes: usize,
    interval: Duration,
    mut change: impl FnMut(usize),
    mut served: impl FnMut(usize) -> bool,
) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for i in 1..=changes {
        // A random point of the interval.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let pause = interval.mul_f64((seed % 1000) as f64 / 1000.0);
        std::thread::sleep(pause);
        let t0 = Instant::now();
        change(i);
        let total = wait_for(Duration::from_secs(30), || served(i))
            .unwrap_or_else(|| panic!("change {i} never served"));
        let poll = lists(server).into_iter().find(|at| *at >= t0).unwrap_or(t0);
        out.push(Sample {
            total,
            delivery: total.saturating_sub(poll.saturating_duration_since(t0)),
        });
    }
    out
}

fn report(name: &str, samples: &[Sample]) {
    let stats = |mut v: Vec<Duration>| {
        v.sort();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        format!(
            "median {:>6.0} ms  p90 {:>6.0} ms  max {:>6.0} ms",
            at(0.5).as_secs_f64() * 1e3,
            at(0.9).as_secs_f64() * 1e3,
            at(1.0).as_secs_f64() * 1e3
        )
    };
    println!(
        "  {name:<11} change → served: {}   delivery after the poll: {}",
        stats(samples.iter().map(|s| s.total).collect()),
        stats(samples.iter().map(|s| s.delivery).collect())
    );
}

/// `cmpoll run` against the kubeconfig `kc`, polling every `interval` without jitter, into
/// `out`, with the agent's own flags.
fn run_cmpoll(cmpoll: &Path, kc: &Path, interval: &str, out: &Path, agent: &[&str]) -> Killed {
    Killed(
        Command::new(cmpoll)
            .args(["run", "--interval", interval, "--jitter", "0", "--out-dir"])
            .arg(out)
            .args(agent)
            .env("KUBECONFIG", kc)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn site(port: u16, text: &str) -> ConfigMap {
    ConfigMap::new("web", "site")
        .label("cmpoll.io/module", "true")
        .data(
            "site.conf",
            &format!(
                "server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"{text}\"; }} }}\n"
            ),
        )
}

fn nginx(cmpoll: &Path, changes: usize, interval: &str) -> Option<Vec<Sample>> {
    let nginx = which("nginx")?;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out");
    let port = free_port();
    let server = TestApiserver::start();
    server.put(site(port, "v0"));
    let kc = server.write_kubeconfig(&d.join("kubeconfig"), &Kubeconfig::token());
    let conf = d.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "pid {0}/nginx.pid;\nerror_log {0}/error.log;\nevents {{}}\nhttp {{\n access_log off;\n client_body_temp_path {0}/body; proxy_temp_path {0}/proxy; fastcgi_temp_path {0}/fcgi; uwsgi_temp_path {0}/uwsgi; scgi_temp_path {0}/scgi;\n include {1}/*/*/*.conf;\n}}\n",
            d.display(),
            out.display()
        ),
    )
    .unwrap();
    let nginx = nginx.display().to_string();
    let conf = conf.display().to_string();
    let _cmpoll = run_cmpoll(
        cmpoll,
        &kc,
        interval,
        &out,
        &[
            "--reload-signal",
            "HUP",
            "--",
            &nginx,
            "-g",
            "daemon off;",
            "-c",
            &conf,
        ],
    );
    let url = format!("http://127.0.0.1:{port}/");
    wait_for(Duration::from_secs(30), || {
        curl(&url).as_deref() == Some("v0")
    })
    .expect("nginx serves the site");
    let interval = humantime::parse_duration(interval).unwrap();
    Some(measure(
        &server,
        changes,
        interval,
        |i| {
            server.put(site(port, &format!("v{i}")));
        },
        |i| curl(&url).as_deref() == Some(format!("v{i}").as_str()),
    ))
}

fn rules(i: usize) -> ConfigMap {
    ConfigMap::new("monitoring", "rules")
        .label("cmpoll.io/module", "true")
        .data(
            "app.rules.yaml",
            &format!(
                "groups:\n- name: app\n  rules:\n  - record: change_{i}\n    expr: vector(1)\n"
            ),
        )
}

fn prometheus(cmpoll: &Path, changes: usize, interval: &str) -> Option<Vec<Sample>> {
    let prometheus = which("prometheus")?;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let port = free_port();
    let server = TestApiserver::start();
    server.put(rules(0));
    let kc = server.write_kubeconfig(&d.join("kubeconfig"), &Kubeconfig::token());
    std::fs::write(
        d.join("prometheus.yml"),
        format!("rule_files:\n- {}/*.yaml\n", out.display()),
    )
    .unwrap();
    let _prom = Killed(
        Command::new(prometheus)
            .arg(format!("--config.file={}/prometheus.yml", d.display()))
            .arg(format!("--storage.tsdb.path={}/data", d.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-lifecycle")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let api = format!("http://127.0.0.1:{port}/api/v1/rules");
    wait_for(Duration::from_secs(30), || curl(&api).is_some()).expect("Prometheus is up");
    let reload = format!("http://127.0.0.1:{port}/-/reload");
    let _cmpoll = run_cmpoll(
        cmpoll,
        &kc,
        interval,
        &out,
        &[
            "--layout",
            "concat",
            "--ext",
            ".yaml",
            "--reload-url",
            &reload,
        ],
    );
    let has = |i: usize| curl(&api).is_some_and(|b| b.contains(&format!("\"change_{i}\"")));
    wait_for(Duration::from_secs(30), || has(0)).expect("Prometheus loads the rules");
    let interval = humantime::parse_duration(interval).unwrap();
    Some(measure(
        &server,
        changes,
        interval,
        |i| {
            server.put(rules(i));
        },
        has,
    ))
}

fn main() {
    let mut changes = 20;
    let mut interval = "1s".to_string();
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let v = argv.next().unwrap_or_default();
        match flag.as_str() {
            "--changes" => changes = v.parse().expect("--changes N"),
            "--interval" => interval = v,
            _ => {
                eprintln!("usage: latency [--changes 20] [--interval 1s]");
                std::process::exit(2);
            }
        }
    }
    let cmpoll = common::release_cmpoll();
    println!("change → agent serving it, {changes} changes at --interval {interval}:");
    match nginx(&cmpoll, changes, &interval) {
        Some(s) => report("nginx", &s),
        None => println!("  nginx: not installed (apt-get install nginx)"),
    }
    match prometheus(&cmpoll, changes, &interval) {
        Some(s) => report("Prometheus", &s),
        None => println!("  Prometheus: not installed (apt-get install prometheus)"),
    }
}
