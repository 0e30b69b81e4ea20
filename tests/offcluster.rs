//! Off-cluster credentials as kubectl has them: exec credential plugins (real scripts),
//! HTTP CONNECT proxies (a real proxy) with `NO_PROXY`, and a CA file that rotates.

use std::time::{Duration, Instant};

use test_apiserver::{
    Credential, Grant, Kubeconfig, Options, Pki, TOKEN, TestApiserver, Trust, USER,
};

use crate::util::proxy::ConnectProxy;
use crate::util::{Cmpoll, Daemon, KillOnDrop, SOON, eventually, module, script};

fn server() -> TestApiserver {
    let s = TestApiserver::start();
    s.put(module("apps", "m", "1"));
    s
}

/// A plugin that counts its runs in `DIR/count`, keeps each run's `KUBERNETES_EXEC_INFO`
/// in `DIR/info-N`, says so on stderr, and issues `exec-token-N` valid for the number of
/// seconds in `DIR/life` (read before the count is written, so a test that saw run N can
/// change the life of run N+1).
const TOKEN_PLUGIN: &str = r#"dir=$(dirname "$0")
life=$(cat "$dir/life")
n=$(( $(cat "$dir/count" 2>/dev/null || echo 0) + 1 ))
printf '%s' "$KUBERNETES_EXEC_INFO" > "$dir/info-$n"
echo $n > "$dir/count.new" && mv "$dir/count.new" "$dir/count"
echo "plugin run $n for $PLUGIN_USER" >&2
exp=$(date -u -d "@$(( $(date +%s) + life ))" +%Y-%m-%dT%H:%M:%SZ)
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"exec-token-%s","expirationTimestamp":"%s"}}\n' $n $exp
"#;

fn exec_user(command: &str, extra: &str) -> Credential {
    Credential::Raw(format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {command}\n      interactiveMode: Never\n      env:\n      - name: PLUGIN_USER\n        value: cmpoll-test\n{extra}"
    ))
}

fn runs(c: &Cmpoll) -> u32 {
    std::fs::read_to_string(c.path("plugin/count"))
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(0)
}

/// `eventually`, failing with the daemon's own log lines.
fn wait_daemon(d: &Daemon, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > SOON {
            let log: Vec<String> = d
                .stderr()
                .lines()
                .filter(|l| l.contains(" cmpoll"))
                .map(String::from)
                .collect();
            panic!("timed out waiting for {what}:\n{}", log.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_exec_token_is_renewed_before_expiry_and_after_a_401_and_never_logged() {
    let s = server();
    for n in 1..=10 {
        s.add_token(&format!("exec-token-{n}"), USER);
    }
    // The command has a `/`: it resolves against the kubeconfig's folder.
    let spec = Kubeconfig::with(exec_user("plugin/get-token", ""));
    let c = Cmpoll::against_with(&s, &spec).env("RUST_LOG", "trace");
    script(&c, "plugin/get-token", TOKEN_PLUGIN);
    c.write("plugin/life", "2");
    let d = c.daemon(&["--interval", "100ms"]);
    d.batch(SOON);
    let c = d.cmd();
    assert_eq!(runs(c), 1);
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.path("plugin/info-1")).unwrap()).unwrap();
    assert_eq!(
        info,
        serde_json::json!({"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"interactive":false}})
    );

    // Valid for 2 s: run again a tenth of that before it lapses, with no 401 on the way.
    wait_daemon(&d, "a renewal before expiry", || runs(c) >= 2);
    assert!(s.requests().iter().all(|r| r.status != 401));
    c.write("plugin/life", "3600");
    wait_daemon(&d, "a long-lived token", || runs(c) >= 3);
    let n = runs(c);
    d.quiet_through(&s, 5, 1);
    assert_eq!(runs(c), n, "an hour-long token is kept");

    // Revoked: the 401 re-runs the plugin and the request is retried once, at once.
    s.clear_requests();
    s.revoke_token(&format!("exec-token-{n}"));
    s.put(module("apps", "m", "2"));
    let b = d.batch(SOON);
    assert_eq!(b[0]["type"], "updated");
    assert_eq!(runs(c), n + 1);
    let reqs = s.requests();
    let first_401 = reqs.iter().position(|r| r.status == 401).expect("a 401");
    assert_eq!(reqs[first_401 + 1].status, 200, "{reqs:?}");
    assert_eq!(
        reqs[first_401 + 1].bearer.as_deref(),
        Some(format!("exec-token-{}", n + 1).as_str())
    );

    let stderr = d.stderr();
    d.stop();
    assert!(
        stderr.contains("exec plugin 'plugin/get-token': plugin run 1 for cmpoll-test")
            || stderr.contains("plugin run 1 for cmpoll-test"),
        "the plugin's stderr is logged: {stderr}"
    );
    assert!(stderr.contains("TRACE"), "trace logging was on");
    assert!(!stderr.contains("exec-token-"), "{stderr}");
    assert!(
        !stderr.contains("TRACE ureq"),
        "the HTTP client's byte dumps stay out"
    );
    assert!(!stderr.contains("Bearer"), "{stderr}");
}

#[test]
fn an_exec_client_certificate_is_presented_and_cluster_info_is_provided() {
    let s = server();
    let pair = s.client_cert("exec-alice");
    s.grant("exec-alice", Grant::all());
    let spec = Kubeconfig::with(exec_user("get-cert", "      provideClusterInfo: true\n"))
        .trust(Trust::CaData);
    let c = Cmpoll::against_with(&s, &spec);
    let cred = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"clientCertificateData": pair.cert_pem, "clientKeyData": pair.key_pem},
    });
    c.write("bin/cred.json", &cred.to_string());
    script(
        &c,
        "bin/get-cert",
        "printf '%s' \"$KUBERNETES_EXEC_INFO\" > \"$(dirname \"$0\")/info\"\ncat \"$(dirname \"$0\")/cred.json\"\n",
    );
    // A bare command name: looked up on PATH.
    let path = format!(
        "{}:{}",
        c.path("bin").display(),
        std::env::var("PATH").unwrap()
    );
    let c = c.env("PATH", &path);
    s.clear_requests();
    let run = c.with_args(&["list", "--json"]).run().success();
    assert_eq!(run.modules(), ["apps/m"]);
    assert!(
        s.requests()
            .iter()
            .all(|r| r.user.as_deref() == Some("exec-alice"))
    );
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.path("bin/info")).unwrap()).unwrap();
    let cluster = &info["spec"]["cluster"];
    assert_eq!(cluster["server"], s.url());
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(cluster["certificate-authority-data"].as_str().unwrap())
        .unwrap();
    assert_eq!(String::from_utf8(ca).unwrap(), s.ca_pem());
    assert!(!run.stderr.contains("PRIVATE KEY"), "{}", run.stderr);
}

#[test]
fn a_missing_plugin_names_its_install_hint_and_a_failing_one_fails_the_poll() {
    let s = server();
    let spec = Kubeconfig::with(exec_user(
        "no-such-credential-helper",
        "      installHint: |\n        Install it with:\n          apt install no-such-credential-helper\n",
    ));
    let run = Cmpoll::against_with(&s, &spec)
        .args(&["list"])
        .run()
        .failure(2);
    let line = run.error_line();
    assert!(line.starts_with("kubeconfig '"), "{line}");
    assert!(
        line.ends_with(", context 'test', user 'test': exec credential plugin 'no-such-credential-helper' not found on PATH (install hint: Install it with: apt install no-such-credential-helper)"),
        "{line}"
    );
    assert!(s.requests().is_empty());

    let c = Cmpoll::against_with(&s, &Kubeconfig::with(exec_user("./fails", "")));
    script(&c, "fails", "echo 'no SSO session' >&2\nexit 3\n");
    let run = c.with_args(&["list"]).run().failure(1);
    assert!(
        run.error_line().ends_with(&format!(
            "exec credential plugin '{}' failed (exit status: 3); its stderr is in the log",
            c.path("fails").display()
        )),
        "{}",
        run.described
    );
    assert!(run.stderr.contains("no SSO session"), "{}", run.described);
    assert!(s.requests().is_empty());
}

/// A server whose certificate names `apiserver.test`, reachable only through the proxy
/// (the name does not resolve here).
fn named_server() -> TestApiserver {
    let s = TestApiserver::start_with(Options {
        pki: Some(Pki::with_server_names(
            "test-ca",
            &["apiserver.test", "127.0.0.1"],
        )),
        ..Options::default()
    });
    s.put(module("apps", "m", "1"));
    s
}

fn named(s: &TestApiserver) -> Kubeconfig {
    let mut spec = Kubeconfig::token();
    spec.server = Some(format!("https://apiserver.test:{}", s.addr().port()));
    spec
}

#[test]
fn proxy_url_in_the_kubeconfig_tunnels_every_request() {
    let s = named_server();
    let proxy = ConnectProxy::start();
    let mut spec = named(&s);
    spec.proxy_url = Some(proxy.url());
    let run = Cmpoll::against_with(&s, &spec)
        .env("NO_PROXY", "*")
        .args(&["list", "--json"])
        .run()
        .success();
    assert_eq!(run.modules(), ["apps/m"]);
    let target = format!("apiserver.test:{}", s.addr().port());
    assert_eq!(
        proxy.seen(),
        [target],
        "proxy-url ignores NO_PROXY, as kubectl does"
    );
}

#[test]
fn https_proxy_from_the_environment_and_no_proxy_bypass() {
    let s = named_server();
    let proxy = ConnectProxy::start();
    let target = format!("apiserver.test:{}", s.addr().port());
    let via_env = |no_proxy: &str| {
        Cmpoll::against_with(&s, &named(&s))
            .env("HTTPS_PROXY", &format!("127.0.0.1:{}", proxy.port))
            .env("NO_PROXY", no_proxy)
            .args(&["list", "--json"])
            .run()
    };
    let run = via_env("10.0.0.0/8, .example.com").success();
    assert_eq!(run.modules(), ["apps/m"]);
    assert_eq!(proxy.seen(), std::slice::from_ref(&target));
    assert!(
        run.stderr.contains("through the proxy http://127.0.0.1:"),
        "{}",
        run.stderr
    );

    // Bypassed: cmpoll goes direct, and `apiserver.test` does not resolve here.
    for no_proxy in [".test", "apiserver.test", "*"] {
        let run = via_env(no_proxy).failure(1);
        assert!(
            run.error_line().contains("apiserver.test"),
            "{}",
            run.described
        );
        assert_eq!(
            proxy.seen().len(),
            1,
            "NO_PROXY={no_proxy} bypasses the proxy"
        );
    }

    // Loopback is never proxied (Go's rule).
    let run = Cmpoll::against(&s)
        .env("HTTPS_PROXY", &proxy.url())
        .args(&["list", "--json"])
        .run()
        .success();
    assert_eq!(run.modules(), ["apps/m"]);
    assert_eq!(proxy.seen().len(), 1);

    let run = Cmpoll::against_with(&s, &named(&s))
        .env("HTTPS_PROXY", "socks5://127.0.0.1:1")
        .args(&["list"])
        .run()
        .failure(2);
    assert!(
        run.error_line()
            .contains("HTTPS_PROXY: 'socks5://127.0.0.1:1' is not supported"),
        "{}",
        run.described
    );
}

#[test]
fn a_ca_file_that_changes_is_read_again() {
    let s = server();
    let c = Cmpoll::new();
    // Start with the wrong CA: every poll fails verification.
    c.write("ca.crt", &Pki::new("another-ca").ca_pem());
    c.write("token", TOKEN);
    let (token, ca) = (c.path("token"), c.path("ca.crt"));
    let d = c.daemon(&[
        "--interval",
        "100ms",
        "--server",
        &s.url(),
        "--token-file",
        token.to_str().unwrap(),
        "--ca-file",
        ca.to_str().unwrap(),
    ]);
    eventually("a failed poll", SOON, || d.stderr().contains("TLS"));
    // Rotated as kubelet does it: a new file renamed over the old one.
    let c = d.cmd();
    c.write("ca.new", &s.ca_pem());
    std::fs::rename(c.path("ca.new"), c.path("ca.crt")).unwrap();
    let b = d.batch(SOON);
    assert_eq!(b[0]["module"], "apps/m");
    assert!(
        d.stderr()
            .contains("verifying the apiserver with the new CA"),
        "{}",
        d.stderr()
    );
    d.stop();
}

#[test]
fn as_pid_1_reaping_orphans_never_takes_a_plugins_exit_status() {
    if !crate::util::unshare_available() {
        return;
    }
    let s = server();
    for n in 1..=100 {
        s.add_token(&format!("exec-token-{n}"), USER);
    }
    let c = Cmpoll::against_with(&s, &Kubeconfig::with(exec_user("plugin/get-token", "")));
    script(&c, "plugin/get-token", TOKEN_PLUGIN);
    // One second of life: a run about every 0.9 s, while orphans keep PID 1 reaping.
    c.write("plugin/life", "1");
    script(
        &c,
        "agent.sh",
        "while true; do sh -c 'sleep 0.02 &'; sleep 0.03; done\n",
    );
    let stderr = std::fs::File::create(c.path("stderr")).unwrap();
    let child = KillOnDrop(
        c.wrapped(
            &["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"],
            &[
                "run",
                "--interval",
                "50ms",
                "--",
                c.path("agent.sh").to_str().unwrap(),
            ],
        )
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap(),
    );
    eventually("four plugin runs", SOON, || runs(&c) >= 4);
    drop(child);
    let log = std::fs::read_to_string(c.path("stderr")).unwrap();
    assert!(
        !log.contains("cannot wait for exec credential plugin"),
        "{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("poll ") && l.contains(" failed: ")),
        "{log}"
    );
    assert!(s.requests().iter().all(|r| r.status == 200));
}

/// A `client.authentication.k8s.io/v1beta1` plugin end to end (no `interactiveMode`
/// needed): its token is sent, and it is told the version it was configured with.
#[test]
fn a_v1beta1_exec_plugin_end_to_end() {
    let s = server();
    s.add_token("beta-token", USER);
    let plugin = r#"dir=$(dirname "$0")
printf '%s' "$KUBERNETES_EXEC_INFO" > "$dir/info"
printf '{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"beta-token"}}\n'
"#;
    let spec = Kubeconfig::with(Credential::Raw(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: plugin/beta\n".into(),
    ));
    let c = Cmpoll::against_with(&s, &spec);
    script(&c, "plugin/beta", plugin);
    let run = c.with_args(&["list", "--json"]).run().success();
    assert_eq!(run.modules(), ["apps/m"]);
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.path("plugin/info")).unwrap()).unwrap();
    assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1beta1");
    assert!(
        s.requests()
            .iter()
            .all(|r| r.bearer.as_deref() == Some("beta-token")),
        "{:?}",
        s.requests()
    );
}
