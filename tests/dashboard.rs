//! The shipped Grafana dashboard (`k8s/monitoring/cmpoll-dashboard.json`): what its
//! generator (`tools/dashboard`, Grafana's grafana-foundation-sdk) prints, every query
//! parsed by Prometheus' own parser (`promtool check rules`), and every metric a query
//! names exported by a real cmpoll: a renamed metric breaks the build. `exported()` is
//! also what the documentation's metric coverage test reads.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::{Value, json};

use crate::util::http::{get, listening, until_body};
use crate::util::tools::{curl, free_port, tool};
use crate::util::{Cmpoll, Daemon, SOON, cluster, eventually, root, skip_unless};

const DASHBOARD: &str = "k8s/monitoring/cmpoll-dashboard.json";

/// The names a real cmpoll exports: each metric family (`# TYPE`) with the sample names
/// its type gives it, from `cmpoll run` with every optional metric on (an apiserver,
/// --validate, a reload URL, --report-events) and from `cmpoll webhook` after a review.
pub fn exported() -> BTreeSet<String> {
    // A rejected module, so that --report-events records (or tries to).
    let (s, c) = cluster(&[("a", "m", "1"), ("a", "r", "reject-me")]);
    let (url, _) = crate::util::http::reload_server(vec![]);
    let d = Daemon::start(
        c,
        &[
            "--interval",
            "100ms",
            "--listen",
            "127.0.0.1:0",
            "--validate",
            "! grep -rq reject-me .",
            "--reload-url",
            &url,
            "--report-events",
            "--stdout-events",
        ],
    );
    let addr = listening(&d);
    // Every family with known labels is there at 0 from the start (issue 42): wait for
    // what only a poll, a rejection and its Event bring.
    until_body(
        &addr,
        "/metrics",
        200,
        "cmpoll_apiserver_requests_total{code=\"200\"}",
    );
    until_body(&addr, "/metrics", 200, "cmpoll_rejected_modules 1");
    until_body(
        &addr,
        "/metrics",
        200,
        "cmpoll_reloads_total{result=\"success\"} 1",
    );
    let mut text = get(&addr, "/metrics").1;
    drop((d, s));

    let pki = test_apiserver::Pki::new("webhook");
    let w = Cmpoll::new();
    let cert = w.write("tls.crt", &pki.server.cert_pem);
    let key = w.write("tls.key", &pki.server.key_pem);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = Daemon::webhook(
        w,
        &[
            "--listen",
            &listen,
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
            "--validate",
            "true",
        ],
    );
    eventually("the webhook serving", SOON, || {
        d.stderr().contains("over HTTPS on")
    });
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "1", "operation": "CREATE", "namespace": "a", "name": "m",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "object": {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "m", "namespace": "a", "labels": {"cmpoll.io/module": "true"}},
                "data": {"k": "v"}}}});
    let posted = Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "10",
            "-H",
            "Content-Type: application/json",
            "-d",
        ])
        .arg(review.to_string())
        .arg(format!("https://{listen}/validate"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&posted.stdout).contains(r#""allowed":true"#),
        "{posted:?}"
    );
    text += &curl(&format!("https://{listen}/metrics")).unwrap().1;
    drop(d);

    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (family, kind) = rest.split_once(' ').unwrap();
        names.insert(family.to_string());
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        for s in suffixes {
            names.insert(format!("{family}{s}"));
        }
    }
    for needed in [
        "cmpoll_webhook_reviews_total",
        "cmpoll_event_reports_total",
        "cmpoll_hub_reports_total",
        "cmpoll_validations_total",
        "cmpoll_reloads_total",
        "cmpoll_apiserver_requests_total",
    ] {
        assert!(names.contains(needed), "{needed} not in:\n{text}");
    }
    names
}

/// The metric names a PromQL expression selects: identifiers outside label matchers,
/// ranges, strings and `by (…)`/`without (…)` lists that are not functions or keywords.
fn selected(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: &[&str] = &[
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' || c == '[' || c == '"' {
            let close = match c {
                '{' => '}',
                '[' => ']',
                _ => '"',
            };
            i += 1;
            while i < chars.len() && chars[i] != close {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        // A number or a duration (`0.99`, `5m`).
        if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            let call = chars.get(j) == Some(&'(');
            if KEYWORDS.contains(&word.as_str()) {
                skip_group = matches!(word.as_str(), "by" | "without" | "on" | "ignoring");
            } else if !call && !word.starts_with('$') {
                out.insert(word);
            }
            continue;
        }
        if c == '(' && skip_group {
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            skip_group = false;
        }
        i += 1;
    }
    out
}

#[test]
fn the_selected_metrics_of_an_expression() {
    let cases = [
        (
            "max(time() - cmpoll_last_success_timestamp_seconds{job=~\"$job\"})",
            vec!["cmpoll_last_success_timestamp_seconds"],
        ),
        (
            "sum by (le) (rate(x_bucket{a=\"b}\"}[$__rate_interval]))",
            vec!["x_bucket"],
        ),
        (
            "histogram_quantile(0.5, sum without (pod) (rate(y[5m])))",
            vec!["y"],
        ),
        ("a / on (job) group_left b offset 5m", vec!["a", "b"]),
    ];
    for (expr, want) in cases {
        let got: Vec<String> = selected(expr).into_iter().collect();
        assert_eq!(got, want, "{expr}");
    }
}

/// Every `expr` of every panel's targets, with the panel's title.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{panel}");
            out.push((
                panel["title"].as_str().unwrap().to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

#[test]
fn the_dashboard_is_its_generators_and_queries_metrics_cmpoll_exports() {
    let shipped: Value =
        serde_json::from_slice(&std::fs::read(root().join(DASHBOARD)).unwrap()).unwrap();
    // What Grafana's own model makes of tools/dashboard: the file is not edited by hand.
    let go = tool("go");
    if !skip_unless(go.is_some(), "go (it builds tools/dashboard)") {
        let out = Command::new(go.unwrap())
            .args(["run", "."])
            .current_dir(root().join("tools/dashboard"))
            .env("GOFLAGS", "-mod=readonly")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let made: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            made, shipped,
            "{DASHBOARD} is not what tools/dashboard prints: run `go run . > ../../{DASHBOARD}` there"
        );
    }
    assert_eq!(shipped["uid"], "cmpoll");
    let templating: Vec<&str> = (shipped["templating"]["list"].as_array().unwrap().iter())
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(templating, ["datasource", "job", "instance"]);
    let queries = queries(&shipped);
    assert!(queries.len() >= 15, "{queries:?}");

    // Prometheus' parser: each query as a recording rule for `promtool check rules`.
    let promtool = tool("promtool");
    if !skip_unless(promtool.is_some(), "promtool (Debian package prometheus)") {
        let dir = tempfile::tempdir().unwrap();
        let rules: Vec<Value> = (queries.iter().enumerate())
            .map(|(i, (_, e))| {
                // Grafana's own variables, as Grafana would put them in.
                let e = e
                    .replace("$__rate_interval", "5m")
                    .replace("$job", ".*")
                    .replace("$instance", ".*");
                json!({"record": format!("cmpoll:dashboard:{i}"), "expr": e})
            })
            .collect();
        let file = dir.path().join("dashboard.rules.yaml");
        std::fs::write(
            &file,
            json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string(),
        )
        .unwrap();
        let out = Command::new(promtool.unwrap())
            .args(["check", "rules"])
            .arg(&file)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success()
                && said.contains(&format!("SUCCESS: {} rules found", queries.len())),
            "{said}"
        );
    }

    // Every metric a query (or a variable) selects, from a real cmpoll.
    let exported = exported();
    let mut named: Vec<(String, String)> = Vec::new();
    for (title, e) in &queries {
        for m in selected(e) {
            named.push((title.clone(), m));
        }
    }
    for v in shipped["templating"]["list"].as_array().unwrap() {
        if let (Some("query"), Some(q)) = (v["type"].as_str(), v["query"].as_str()) {
            let inner = q.trim_start_matches("label_values(");
            let metric = inner.split([',', '{']).next().unwrap().trim();
            named.push((format!("variable {}", v["name"]), metric.to_string()));
        }
    }
    let unknown: Vec<&(String, String)> = named
        .iter()
        .filter(|(_, m)| !exported.contains(m))
        .collect();
    assert!(
        unknown.is_empty(),
        "not exported by cmpoll: {unknown:?}\nexported: {exported:?}"
    );
    // And the dashboard shows what the operator on call asks about.
    let shown: BTreeSet<&str> = named.iter().map(|(_, m)| m.as_str()).collect();
    for m in [
        "cmpoll_polls_total",
        "cmpoll_poll_duration_seconds_bucket",
        "cmpoll_modules",
        "cmpoll_events_total",
        "cmpoll_rejected_modules",
        "cmpoll_reloads_total",
        "cmpoll_apiserver_requests_total",
        "cmpoll_apiserver_response_bytes_total",
        "cmpoll_child_restarts_total",
        "cmpoll_module_write_failures",
    ] {
        assert!(shown.contains(m), "the dashboard has no panel for {m}");
    }
}
