//! `cmpoll list` end to end: the real binary against the test apiserver.

use std::time::Duration;

use test_apiserver::{ConfigMap, Credential, Fault, Kubeconfig, Match, Route, TestApiserver};

use crate::util::{Cmpoll, labelled, root, spec_hash};

#[test]
fn selects_by_label_and_namespace() {
    let s = TestApiserver::start();
    s.put(labelled("monitoring", "a").data("a.alloy", "1"));
    s.put(labelled("web", "b").data("b.conf", "2"));
    s.put(ConfigMap::new("web", "unlabelled").data("x", "3"));
    s.put(
        labelled("web", "off")
            .label("tier", "legacy")
            .data("x", "4"),
    );
    let run = Cmpoll::against(&s)
        .args(&["list", "--json"])
        .run()
        .success();
    assert_eq!(run.modules(), ["monitoring/a", "web/b", "web/off"]);

    let run = Cmpoll::against(&s)
        .args(&[
            "list",
            "--json",
            "--selector",
            "cmpoll.io/module=true,tier notin (legacy)",
        ])
        .run()
        .success();
    assert_eq!(run.modules(), ["monitoring/a", "web/b"]);

    s.clear_requests();
    let run = Cmpoll::against(&s)
        .args(&["list", "--json", "--namespace", "web"])
        .run()
        .success();
    assert_eq!(run.modules(), ["web/b", "web/off"]);
    let reqs = s.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].path, "/api/v1/namespaces/web/configmaps");
    assert_eq!(
        reqs[0].param("labelSelector"),
        Some("cmpoll.io/module=true")
    );
    assert_eq!(reqs[0].param("resourceVersion"), Some("0"));
    assert_eq!(reqs[0].route, Route::Cache, "served from the watch cache");
    assert_eq!(reqs[0].accept.as_deref(), Some("application/json"));
    assert_eq!(
        reqs[0].user_agent.as_deref(),
        Some(concat!("cmpoll/", env!("CARGO_PKG_VERSION")))
    );

    // Several namespaces: one list each, from the environment as a comma list.
    s.clear_requests();
    let run = Cmpoll::against(&s)
        .env("CMPOLL_NAMESPACE", "web,monitoring")
        .args(&["list", "--json"])
        .run()
        .success();
    assert_eq!(run.modules(), ["monitoring/a", "web/b", "web/off"]);
    assert_eq!(s.requests().len(), 2);

    let run = Cmpoll::against(&s)
        .args(&["list", "--json", "--field-selector", "metadata.name=b"])
        .run()
        .success();
    assert_eq!(run.modules(), ["web/b"]);
}

#[test]
fn key_globs_binary_data_and_the_hash() {
    let s = TestApiserver::start();
    let png: &[u8] = &[0x89, b'P', b'N', b'G', 0, 1, 2, 255];
    s.put(
        labelled("web", "site")
            .data("site.conf", "server {}\n")
            .data("README.md", "docs")
            .binary("logo.png", png),
    );
    s.put(labelled("web", "docs-only").data("README.md", "x"));
    let run = Cmpoll::against(&s)
        .args(&["list", "--json"])
        .run()
        .success();
    let v = run.json();
    let site = &v[1];
    assert_eq!(site["module"], "web/site");
    assert_eq!(site["files"]["site.conf"], "server {}\n");
    assert_eq!(site["binaryFiles"]["logo.png"], "iVBORwABAv8=");
    assert_eq!(
        site["hash"],
        spec_hash(&[
            ("site.conf", b"server {}\n"),
            ("README.md", b"docs"),
            ("logo.png", png)
        ])
    );
    let obj = s.get("web", "site").unwrap();
    assert_eq!(site["uid"], obj.uid.as_str());
    assert_eq!(site["resourceVersion"], obj.resource_version.to_string());

    let run = Cmpoll::against(&s)
        .args(&["list", "--json", "--keys", "*.conf", "--keys", "*.png"])
        .run()
        .success();
    assert_eq!(run.modules(), ["web/site"], "docs-only has no selected key");
    let site = &run.json()[0];
    assert!(site["files"].get("README.md").is_none());
    assert_eq!(
        site["hash"],
        spec_hash(&[("site.conf", b"server {}\n"), ("logo.png", png)]),
        "only selected keys are hashed"
    );
    assert!(
        run.stderr
            .contains("web/docs-only: none of its 1 keys matches --keys"),
        "{}",
        run.stderr
    );

    let run = Cmpoll::against(&s).args(&["list"]).run().success();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[0], "MODULE         FILES      BYTES  HASH");
    assert!(
        lines[2].starts_with("web/site           3         22  sha256:"),
        "{}",
        lines[2]
    );
}

#[test]
fn a_bad_selector_is_refused_locally_without_a_request() {
    let s = TestApiserver::start();
    let run = Cmpoll::against(&s)
        .args(&["list", "--selector", "app in (a,b"])
        .run()
        .failure(2);
    assert_eq!(
        run.error_line(),
        "--selector: unable to parse requirement: found '', expected: ',' or ')'"
    );
    assert!(s.requests().is_empty(), "nothing was sent");
}

#[test]
fn paging_walks_every_page_with_client_gos_parameters() {
    let s = TestApiserver::start();
    for i in 0..7 {
        s.put(labelled("p", &format!("m{i}")).data("k", &i.to_string()));
    }
    let run = Cmpoll::against(&s)
        .args(&["list", "--json", "--page-size", "3"])
        .run()
        .success();
    assert_eq!(run.modules().len(), 7);
    let reqs = s.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.param("limit"), Some("3"));
        assert_eq!(r.param("resourceVersion"), None, "paged lists carry no RV");
    }
    assert!(reqs[1].param("continue").is_some());
}

#[test]
fn an_expired_continue_token_gives_the_full_list() {
    let s = TestApiserver::start();
    for i in 0..6 {
        s.put(labelled("p", &format!("m{i}")).data("k", &i.to_string()));
    }
    // The token expires while the second page waits.
    s.fault(
        Match::continue_pages(),
        Fault::Delay(Duration::from_millis(400)),
        1,
    );
    let c = Cmpoll::against(&s).args(&["list", "--json", "--page-size", "2"]);
    let child = c.spawn();
    let waited = std::time::Instant::now();
    while s.requests().is_empty() {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "no request\n{}",
            c.describe()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    s.put(labelled("p", "m9").data("k", "late"));
    s.expire_continue_tokens();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["m0", "m1", "m2", "m3", "m4", "m5", "m9"],
        "one consistent list, not pages of two"
    );
    let reqs = s.requests();
    assert_eq!(reqs[1].status, 410);
    let last = reqs.last().unwrap();
    assert_eq!(
        (last.param("limit"), last.param("continue")),
        (None, None),
        "one unpaged list"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("410"));
}

#[test]
fn a_failure_after_an_expired_token_prints_nothing() {
    let s = TestApiserver::start();
    for i in 0..4 {
        s.put(labelled("p", &format!("m{i}")).data("k", "v"));
    }
    s.fault(
        Match::continue_pages(),
        Fault::Status(
            410,
            "Expired".into(),
            "The provided continue parameter is too old".into(),
        ),
        1,
    );
    // Page 1 passes, page 2 gets the 410, the unpaged retry gets a 500.
    s.fault_after(Match::lists(), 1, Fault::InternalError, 1);
    let run = Cmpoll::against(&s)
        .args(&["list", "--json", "--page-size", "2"])
        .run()
        .failure(1);
    assert!(
        run.stdout.is_empty(),
        "never a partial list: {}",
        run.stdout
    );
    assert!(
        run.error_line().contains("500 InternalError"),
        "{}",
        run.described
    );
}

#[test]
fn failures_are_one_clear_line_and_exit_1() {
    let s = TestApiserver::start();
    s.put(labelled("a", "b").data("k", "v"));
    // 403, with the apiserver's message.
    s.add_token("weak", "weak-user");
    s.grant("weak-user", test_apiserver::Grant::namespaces(&["other"]));
    let with_token =
        |token: &str| Cmpoll::against_with(&s, &Kubeconfig::with(Credential::Token(token.into())));
    let run = with_token("weak").args(&["list"]).run().failure(1);
    assert_eq!(
        run.error_line(),
        "apiserver refused to list configmaps in all namespaces: 403 Forbidden: configmaps is forbidden: User \"weak-user\" cannot list resource \"configmaps\" in API group \"\" at the cluster scope"
    );
    let run = with_token("wrong").args(&["list"]).run().failure(1);
    assert_eq!(
        run.error_line(),
        "apiserver refused to list configmaps in all namespaces: 401 Unauthorized: Unauthorized"
    );
    assert!(!run.stderr.contains("wrong"), "the token never shows");

    let run = Cmpoll::against(&s)
        .args(&["list", "--max-response-bytes", "100"])
        .run()
        .failure(1);
    assert!(
        run.error_line()
            .ends_with("the answer is larger than 100 bytes (raise --max-response-bytes, e.g. --max-response-bytes 1MiB, or list less per request: --namespace, --page-size)"),
        "{}",
        run.described
    );

    s.fault(Match::lists(), Fault::Delay(Duration::from_secs(3)), 1);
    let started = std::time::Instant::now();
    let run = Cmpoll::against(&s)
        .args(&["list", "--timeout", "300ms"])
        .run()
        .failure(1);
    assert!(
        run.error_line()
            .ends_with("did not answer within 300ms (raise --timeout, or list less per request: --namespace, --page-size)"),
        "{}",
        run.described
    );
    assert!(started.elapsed() < Duration::from_secs(3));

    // An unreachable server.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let c = Cmpoll::new();
    let ca = c.write("ca.crt", &s.ca_pem());
    let run = c
        .args(&[
            "list",
            "--server",
            &format!("https://{addr}"),
            "--ca-file",
            ca.to_str().unwrap(),
        ])
        .run()
        .failure(1);
    assert!(
        run.error_line().starts_with(&format!(
            "cannot list configmaps in all namespaces: https://{addr}: "
        )),
        "{}",
        run.described
    );

    for (fault, want) in [
        (Fault::NotJson, "unexpected answer: not a valid list"),
        (
            Fault::CutShort,
            "the connection closed before the answer was complete",
        ),
        (Fault::Reset, "cannot list configmaps in all namespaces"),
        (
            Fault::TooManyRequests(2),
            "429 Too Many Requests: Too many requests, please try again later.",
        ),
    ] {
        s.fault(Match::lists(), fault.clone(), 1);
        let run = Cmpoll::against(&s)
            .args(&["list", "--json"])
            .run()
            .failure(1);
        assert!(
            run.error_line().contains(want),
            "{fault:?}\n{}",
            run.described
        );
        assert!(run.stdout.is_empty());
    }
}

#[test]
fn a_wrong_ca_is_a_tls_error() {
    let s = TestApiserver::start();
    let other = test_apiserver::Pki::new("someone-else");
    let c = Cmpoll::new();
    let ca = c.write("other.crt", &other.ca_pem());
    let run = c
        .args(&[
            "list",
            "--server",
            &s.url(),
            "--ca-file",
            ca.to_str().unwrap(),
        ])
        .run()
        .failure(1);
    let line = run.error_line();
    assert!(
        line.contains("TLS") && line.contains("UnknownIssuer"),
        "{line}"
    );
}

#[test]
fn large_lists_arrive_gzipped_and_decode() {
    let s = TestApiserver::start();
    s.bulk_load(300, 2048, 3);
    let run = Cmpoll::against(&s)
        .args(&["list", "--json"])
        .run()
        .success();
    assert_eq!(run.modules().len(), 300);
    let r = s.requests().pop().unwrap();
    assert!(r.gzip, "the body went compressed");
    assert!(r.accept_encoding.unwrap().contains("gzip"));
}

#[test]
fn hostile_answers_are_checked_not_trusted() {
    let s = TestApiserver::start();
    s.put(labelled("ns", "evil").data("../../x", "pwned"));
    s.put(labelled("ns", "good").data("ok.conf", "fine"));
    let run = Cmpoll::against(&s)
        .args(&["list", "--json"])
        .run()
        .success();
    assert_eq!(run.modules(), ["ns/good"], "the rest go on");
    assert!(
        run.stderr
            .contains("configmap ns/evil rejected: invalid key \"../../x\""),
        "{}",
        run.stderr
    );
}

#[test]
fn manifests_folder_without_a_cluster() {
    let run = Cmpoll::new()
        .args(&[
            "list",
            "--json",
            "--manifests",
            root().join("k8s/examples").to_str().unwrap(),
        ])
        .run()
        .success();
    assert_eq!(
        run.modules(),
        [
            "monitoring/payments-scrape",
            "team-payments/payments-rules",
            "web/status-page"
        ]
    );
    let v = run.json();
    assert!(
        v[2]["binaryFiles"]["favicon.png"]
            .as_str()
            .unwrap()
            .starts_with("iVBORw0KGgo")
    );
    let c = Cmpoll::new();
    c.write(
        "m/bad.yaml",
        "kind: ConfigMap\nmetadata: {name: a}\ndata:\n  port: 8080\n",
    );
    let run = c.args(&["list", "--manifests", "m"]).run().failure(1);
    let line = run.error_line();
    assert!(
        line.contains("bad.yaml") && line.contains("line 4"),
        "{line}"
    );
}

#[test]
fn version_help_and_usage() {
    let run = Cmpoll::new().args(&["--version"]).run().success();
    assert_eq!(
        run.stdout.trim(),
        concat!("cmpoll ", env!("CARGO_PKG_VERSION"))
    );
    let run = Cmpoll::new().args(&["list", "--help"]).run().success();
    for flag in [
        "--json",
        "--selector",
        "--keys",
        "--namespace",
        "--manifests",
        "--page-size",
    ] {
        assert!(run.stdout.contains(flag), "{flag}\n{}", run.stdout);
    }
    let run = Cmpoll::new().args(&["list", "--bogus"]).run().failure(2);
    assert!(run.error_line().contains("--bogus"));
    let run = Cmpoll::new().args(&["list"]).run().failure(2);
    assert!(
        run.error_line()
            .starts_with("no apiserver configured: use --manifests DIR, --server URL")
    );
}

/// Mistakes caught before any request (issue 17), with the real binary: exit 2, one line
/// naming the flag or variable; and `--namespace a,b` on the command line.
#[test]
fn cli_mistakes_are_usage_errors_before_any_request() {
    let s = test_apiserver::TestApiserver::start();
    for (args, env, want) in [
        (&["list", "--selector", ""][..], None, "--selector: empty"),
        (
            &["list"][..],
            Some(("CMPOLL_SELECTOR", "")),
            "CMPOLL_SELECTOR: empty",
        ),
        (
            &["run", "--layout", "concat"][..],
            None,
            "--layout: only used with --out-dir",
        ),
        (
            &["run", "--shutdown-grace", "1s"][..],
            None,
            "--shutdown-grace: only used with an agent",
        ),
        (
            &["run"][..],
            Some(("CMPOLL_OUT_DIR", "")),
            "CMPOLL_OUT_DIR: empty",
        ),
    ] {
        let mut c = crate::util::Cmpoll::against(&s).args(args);
        if let Some((k, v)) = env {
            c = c.env(k, v);
        }
        let run = c.run().failure(2);
        assert!(run.error_line().starts_with(want), "{}", run.described);
        assert!(s.requests().is_empty(), "{}", run.described);
    }
    s.put(crate::util::module("a", "m", "1"));
    s.put(crate::util::module("b", "m", "1"));
    s.put(crate::util::module("c", "m", "1"));
    let run = crate::util::Cmpoll::against(&s)
        .args(&["list", "--json", "--namespace", "a,b"])
        .run()
        .success();
    assert_eq!(run.modules(), ["a/m", "b/m"]);
}

/// Typos and missing pieces caught at start-up with the real binary (issue 17): a
/// `CMPOLL_*` variable that names no flag is warned about with the nearest one, a mistyped
/// flag gets the nearest real one, `--help` shows each flag's variable, an agent command
/// that cannot be found is exit 2 before any request, `--log-level` works, and the
/// start-up line says what runs.
#[test]
fn typos_and_missing_agents_are_caught_at_start_up() {
    let s = test_apiserver::TestApiserver::start();
    s.put(crate::util::module("a", "m", "1"));
    let c = crate::util::Cmpoll::against(&s);
    let run = c.with_args(&["run", "--intervl", "5s"]).run().failure(2);
    assert!(
        run.error_line()
            .ends_with("Unrecognized argument: --intervl (did you mean --interval?)"),
        "{}",
        run.described
    );
    let help = c.with_args(&["run", "--help"]).run().success();
    assert!(
        help.stdout.contains("[CMPOLL_RELOAD_URL]") && help.stdout.contains("[CMPOLL_OUT_DIR]")
    );
    for agent in ["no-such-agent-anywhere", "./not-here.sh"] {
        let run = c.with_args(&["run", "--", agent]).run().failure(2);
        assert!(
            run.error_line()
                .starts_with(&format!("agent command: '{agent}': not found")),
            "{}",
            run.described
        );
    }
    assert!(s.requests().is_empty());
    let c = c.env("CMPOLL_INTERVL", "5s").env("CMPOLL_NAMESPACE", "a");
    let run = c
        .with_args(&["run", "--once", "--stdout-events", "--keys", "k"])
        .run()
        .success();
    assert!(
        run.stderr.contains(
            "CMPOLL_INTERVL names no flag of cmpoll and is ignored (did you mean CMPOLL_INTERVAL?)"
        ),
        "{}",
        run.described
    );
    assert!(
        run.stderr.contains(
            "selector 'cmpoll.io/module=true', namespaces a, keys k; delivering to stdout events"
        ),
        "{}",
        run.described
    );
    let quiet = c
        .with_args(&["run", "--once", "--stdout-events", "--log-level", "error"])
        .run()
        .success();
    assert_eq!(quiet.stderr, "", "{}", quiet.described);
}
