//! Real agents nobody here wrote read what cmpoll delivers (issue 16): Debian's `nginx`,
//! supervised by cmpoll (files layout, `--reload-signal HUP`, `include DIR/*/*/*.conf`),
//! and Debian's Prometheus beside it (concat layout, `rule_files: [DIR/*.yaml]`,
//! `--reload-url …/-/reload`). What counts is what the agent serves: nginx's answers on
//! the site's port, Prometheus's `/api/v1/rules`. `.ci/run` installs both packages.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use test_apiserver::{ConfigMap, TestApiserver};

use crate::util::tools::{curl, free_port, prometheus_rules, tool};
use crate::util::{Cmpoll, KillOnDrop, SOON, eventually_explained, labelled, skip_unless};

/// An nginx site: a server on `port` answering `text`.
pub fn site(ns: &str, name: &str, port: u16, text: &str) -> ConfigMap {
    labelled(ns, name).data(
        "site.conf",
        &format!("server {{\n  listen 127.0.0.1:{port};\n  location / {{ return 200 \"{text}\\n\"; }}\n}}\n"),
    )
}

/// nginx's main configuration: its own files under `dir`, a health server on `health`,
/// and every `.conf` cmpoll writes (`DIR/NAMESPACE/NAME/KEY`).
pub fn nginx_conf(dir: &Path, health: u16, out: &Path) -> String {
    let d = dir.display();
    format!(
        "pid {d}/nginx.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  server {{ listen 127.0.0.1:{health}; location = /healthz {{ return 200 \"ok\\n\"; }} }}\n  include {}/*/*/*.conf;\n}}\n",
        out.display()
    )
}

/// The processes whose command line mentions `needle`.
fn processes(needle: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-a", "-f", needle])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("pgrep"))
        .map(str::to_string)
        .collect()
}

#[test]
fn nginx_supervised_by_cmpoll_serves_the_sites_of_configmaps() {
    let nginx = tool("nginx");
    if skip_unless(
        nginx.is_some() && tool("curl").is_some() && tool("pgrep").is_some(),
        "nginx, curl and pgrep (Debian packages nginx, curl, procps)",
    ) {
        return;
    }
    let nginx = nginx.unwrap();
    let (port, health) = (free_port(), free_port());
    let s = TestApiserver::start();
    s.put(site("web", "hello", port, "hello v1"));
    let c = Cmpoll::against(&s);
    let dir = c.path("nginx");
    std::fs::create_dir_all(&dir).unwrap();
    let conf = c.write("nginx/nginx.conf", &nginx_conf(&dir, health, &c.out()));
    let conf_s = conf.display().to_string();
    let out = c.out().display().to_string();
    let d = c.daemon(&[
        "--interval",
        "1s",
        "--out-dir",
        &out,
        "--keys",
        "*.conf",
        "--reload-signal",
        "HUP",
        "--",
        nginx.to_str().unwrap(),
        "-g",
        "daemon off;",
        "-c",
        &conf_s,
    ]);
    let url = format!("http://127.0.0.1:{port}/");
    let explain = || d.stderr();
    eventually_explained(
        "nginx serves the site",
        SOON,
        || curl(&url) == Some((200, "hello v1\n".into())),
        explain,
    );
    // An update reaches nginx through the files and a SIGHUP.
    s.put(site("web", "hello", port, "hello v2"));
    eventually_explained(
        "nginx serves the update",
        SOON,
        || curl(&url) == Some((200, "hello v2\n".into())),
        explain,
    );
    // A removal closes the site; the health server proves nginx is alive and reloaded.
    s.delete("web", "hello");
    eventually_explained("the site is gone", SOON, || curl(&url).is_none(), explain);
    assert_eq!(
        curl(&format!("http://127.0.0.1:{health}/healthz")),
        Some((200, "ok\n".into()))
    );
    let log = d.stderr();
    assert!(
        !log.contains("emerg"),
        "nginx refused a configuration:\n{log}"
    );
    // SIGTERM to cmpoll stops nginx (master and workers) cleanly.
    assert!(!processes(&conf_s).is_empty());
    d.stop();
    eventually_explained(
        "nginx is gone",
        SOON,
        || processes(&conf_s).is_empty(),
        || format!("{:?}", processes(&conf_s)),
    );
    assert!(
        !dir.join("nginx.pid").exists(),
        "nginx did not exit cleanly"
    );
}

/// A rules ConfigMap: one group with one recording rule named `record`.
pub fn rules(ns: &str, name: &str, record: &str) -> ConfigMap {
    labelled(ns, name)
        .data(
            "app.rules.yaml",
            &format!(
                "groups:\n- name: {name}\n  rules:\n  - record: {record}\n    expr: sum(up)\n"
            ),
        )
        .data("README.md", "not a rule file: --keys leaves it out\n")
}

/// A Prometheus for `c`'s output folder on `port`, once it answers, and its own folder.
pub fn prometheus_up(c: &Cmpoll, port: u16) -> (KillOnDrop, std::path::PathBuf) {
    let dir = c.path("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let prom = prometheus(&dir, port, &c.out());
    eventually_explained(
        "Prometheus is up",
        Duration::from_secs(30),
        || prometheus_rules(port).is_some(),
        || prometheus_log(&dir),
    );
    (prom, dir)
}

/// What Prometheus logged (for failure messages).
pub fn prometheus_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
}

/// cmpoll's flags for Prometheus beside it: one `*.yaml` file per module (concat) in `out`,
/// `*.rules.yaml` keys, and its reload URL.
pub fn rule_file_flags(out: &Path, port: u16) -> Vec<String> {
    let out = out.display().to_string();
    let reload = format!("http://127.0.0.1:{port}/-/reload");
    [
        "--out-dir",
        &out,
        "--layout",
        "concat",
        "--ext",
        ".yaml",
        "--keys",
        "*.rules.yaml",
        "--reload-url",
        &reload,
    ]
    .map(str::to_string)
    .to_vec()
}

/// Prometheus on `port`, its rules from `out/*.yaml`.
pub fn prometheus(dir: &Path, port: u16, out: &Path) -> KillOnDrop {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  evaluation_interval: 1s\nrule_files:\n- {}/*.yaml\n",
            out.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join("prometheus.log"))
        .unwrap();
    let child = Command::new(tool("prometheus").unwrap())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}/data", dir.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--web.enable-lifecycle")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    KillOnDrop(child)
}

#[test]
fn prometheus_beside_cmpoll_loads_the_rules_of_configmaps() {
    if skip_unless(
        tool("prometheus").is_some() && tool("curl").is_some(),
        "prometheus and curl (Debian packages prometheus, curl)",
    ) {
        return;
    }
    let port = free_port();
    let s = TestApiserver::start();
    s.put(rules("monitoring", "app", "app:up:sum"));
    let c = Cmpoll::against(&s);
    let (mut prom, dir) = prometheus_up(&c, port);
    let prom_log = || prometheus_log(&dir);
    let out_dir = c.out();
    let flags = rule_file_flags(&out_dir, port);
    let mut args = vec!["--interval", "1s"];
    args.extend(flags.iter().map(String::as_str));
    let d = c.daemon(&args);
    let explain = || format!("cmpoll:\n{}\nprometheus:\n{}", d.stderr(), prom_log());
    let has = |want: &[&str]| {
        let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        move || prometheus_rules(port) == Some(want.clone())
    };
    eventually_explained("the rules are loaded", SOON, has(&["app:up:sum"]), explain);
    s.put(rules("monitoring", "app", "app:up:total"));
    s.put(rules("team-b", "b", "b:up:sum"));
    eventually_explained(
        "the update and the new module are loaded",
        SOON,
        has(&["app:up:total", "b:up:sum"]),
        explain,
    );
    // Prometheus restarted while cmpoll runs comes back to the same rules.
    drop(prom);
    prom = prometheus(&dir, port, &out_dir);
    eventually_explained(
        "the restarted Prometheus has the same rules",
        Duration::from_secs(30),
        has(&["app:up:total", "b:up:sum"]),
        explain,
    );
    s.delete("monitoring", "app");
    eventually_explained("the removal is unloaded", SOON, has(&["b:up:sum"]), explain);
    d.stop();
    drop(prom);
}
