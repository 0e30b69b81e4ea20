//! Every credential source, in SPEC's order, with the real binary.

use test_apiserver::{
    ConfigMap, Credential, Grant, Kubeconfig, Options, Pki, TOKEN, TestApiserver, Trust, USER,
};

use crate::util::Cmpoll;

fn server() -> TestApiserver {
    let s = TestApiserver::start();
    s.put(
        ConfigMap::new("apps", "m")
            .label("cmpoll.io/module", "true")
            .data("k", "v"),
    );
    s.put(
        ConfigMap::new("other", "n")
            .label("cmpoll.io/module", "true")
            .data("k", "v"),
    );
    s
}

/// Lists (with `extra` flags after `list`) and returns the user the apiserver saw.
fn user_seen(s: &TestApiserver, c: &Cmpoll, extra: &[&str]) -> String {
    s.clear_requests();
    let mut args = vec!["list", "--json"];
    args.extend_from_slice(extra);
    c.with_args(&args).run().success();
    s.requests()
        .pop()
        .expect("a request")
        .user
        .expect("authenticated")
}

#[test]
fn kubeconfig_token_file_and_ca_file_resolve_relative_to_the_kubeconfig() {
    let s = server();
    let c = Cmpoll::new();
    c.write("conf/token", &format!("{TOKEN}\n"));
    c.write("conf/ca.crt", &s.ca_pem());
    let kc = s.write_kubeconfig(
        &c.path("conf/kubeconfig"),
        &Kubeconfig::with(Credential::TokenFile("token".into()))
            .trust(Trust::CaFile("ca.crt".into())),
    );
    // cmpoll runs in the folder above: the paths resolve against the kubeconfig's folder.
    assert_eq!(
        user_seen(&s, &c.env("KUBECONFIG", kc.to_str().unwrap()), &[]),
        USER
    );
}

#[test]
fn kubeconfig_client_certificates_as_files_and_data() {
    let s = server();
    let alice = s.client_cert("alice");
    s.grant("alice", Grant::all());
    let c = Cmpoll::new();
    c.write("tls.crt", &alice.cert_pem);
    c.write("tls.key", &alice.key_pem);
    let kc = s.write_kubeconfig(
        &c.path("kubeconfig"),
        &Kubeconfig::with(Credential::ClientCertFiles {
            cert: "tls.crt".into(),
            key: "tls.key".into(),
        }),
    );
    let kc = kc.to_str().unwrap().to_string();
    assert_eq!(user_seen(&s, &c.env("KUBECONFIG", &kc), &[]), "alice");

    let c = Cmpoll::new();
    let kc = s.write_kubeconfig(
        &c.path("kubeconfig"),
        &Kubeconfig::with(Credential::ClientCertData(alice.clone())),
    );
    let kc = kc.to_str().unwrap().to_string();
    assert_eq!(user_seen(&s, &c, &["--kubeconfig", &kc]), "alice");

    // A key that does not belong to the certificate is a configuration error, not a panic.
    let bob = s.client_cert("bob");
    let mixed = test_apiserver::CertPair {
        cert_pem: alice.cert_pem.clone(),
        key_pem: bob.key_pem,
    };
    let run = Cmpoll::against_with(&s, &Kubeconfig::with(Credential::ClientCertData(mixed)))
        .args(&["list"])
        .run()
        .failure(2);
    assert!(
        run.error_line().contains("client certificate and key"),
        "{}",
        run.described
    );
}

#[test]
fn server_flags_with_token_file_and_ca_file() {
    let s = server();
    let c = Cmpoll::new();
    let token = c.write("token", TOKEN);
    let ca = c.write("ca.crt", &s.ca_pem());
    let (token, ca) = (
        token.to_str().unwrap().to_string(),
        ca.to_str().unwrap().to_string(),
    );
    assert_eq!(
        user_seen(
            &s,
            &c,
            &[
                "--server",
                &s.url(),
                "--token-file",
                &token,
                "--ca-file",
                &ca
            ]
        ),
        USER
    );
    // The same through CMPOLL_* variables, as a systemd EnvironmentFile sets them.
    let c = Cmpoll::new()
        .env("CMPOLL_SERVER", &s.url())
        .env("CMPOLL_TOKEN_FILE", &token)
        .env("CMPOLL_CA_FILE", &ca);
    assert_eq!(user_seen(&s, &c, &[]), USER);
}

#[test]
fn in_cluster_from_the_environment_and_service_account_files() {
    let s = server();
    let c = Cmpoll::new();
    c.write("sa/token", TOKEN);
    c.write("sa/ca.crt", &s.ca_pem());
    c.write("sa/namespace", "apps");
    let sa = c.path("sa");
    let port = s.addr().port().to_string();
    let c = c
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", &port)
        .env("CMPOLL_SERVICE_ACCOUNT_DIR", sa.to_str().unwrap());
    s.clear_requests();
    let run = c
        .args(&["list", "--json", "--namespace-from-context"])
        .run()
        .success();
    assert_eq!(run.modules(), ["apps/m"], "the pod's own namespace");
    let r = s.requests().pop().unwrap();
    assert_eq!(r.path, "/api/v1/namespaces/apps/configmaps");
    assert_eq!(r.user.as_deref(), Some(USER));
}

#[test]
fn in_cluster_over_ipv6_puts_the_host_in_brackets() {
    let s = TestApiserver::start_with(Options {
        bind: "::1".parse().unwrap(),
        ..Options::default()
    });
    s.put(
        ConfigMap::new("a", "b")
            .label("cmpoll.io/module", "true")
            .data("k", "v"),
    );
    let c = Cmpoll::new();
    c.write("sa/token", TOKEN);
    c.write("sa/ca.crt", &s.ca_pem());
    let sa = c.path("sa");
    let run = c
        .env("KUBERNETES_SERVICE_HOST", "::1")
        .env("KUBERNETES_SERVICE_PORT", &s.addr().port().to_string())
        .args(&[
            "list",
            "--json",
            "--service-account-dir",
            sa.to_str().unwrap(),
        ])
        .run()
        .success();
    assert_eq!(run.modules(), ["a/b"]);
}

#[test]
fn home_kubeconfig_is_the_last_resort_and_kubeconfig_files_merge() {
    let s = server();
    let c = Cmpoll::new();
    s.write_kubeconfig(&c.path(".kube/config"), &Kubeconfig::token());
    assert_eq!(user_seen(&s, &c, &[]), USER);

    // KUBECONFIG=a:b: the user from a, the cluster and context from b.
    let c = Cmpoll::new();
    c.write(
        "a/config",
        "users:\n- name: test\n  user:\n    tokenFile: token\n",
    );
    c.write("a/token", TOKEN);
    let full = s.kubeconfig_yaml(&Kubeconfig::with(Credential::Token(
        "from-b-ignored".into(),
    )));
    c.write("b/config", &full);
    let list = format!(
        "{}:{}",
        c.path("a/config").display(),
        c.path("b/config").display()
    );
    assert_eq!(user_seen(&s, &c.env("KUBECONFIG", &list), &[]), USER);
}

#[test]
fn tls_server_name_checks_the_certificate_against_another_name() {
    let s = TestApiserver::start_with(Options {
        pki: Some(Pki::with_server_names(
            "dns-only-ca",
            &["kubernetes.default.svc"],
        )),
        ..Options::default()
    });
    s.put(
        ConfigMap::new("a", "b")
            .label("cmpoll.io/module", "true")
            .data("k", "v"),
    );
    let run = Cmpoll::against(&s).args(&["list"]).run().failure(1);
    assert!(
        run.error_line()
            .contains("certificate not valid for name \"127.0.0.1\""),
        "{}",
        run.described
    );

    let mut spec = Kubeconfig::token();
    spec.tls_server_name = Some("kubernetes.default.svc".into());
    assert_eq!(user_seen(&s, &Cmpoll::against_with(&s, &spec), &[]), USER);
}

#[test]
fn insecure_skip_tls_verify_works_with_a_loud_warning() {
    let s = server();
    let run = Cmpoll::against_with(&s, &Kubeconfig::token().trust(Trust::Insecure))
        .args(&["list", "--json"])
        .run()
        .success();
    assert!(
        run.stderr.contains("insecure-skip-tls-verify is set"),
        "{}",
        run.stderr
    );
}

#[test]
fn plain_http_gets_no_token_unless_asked() {
    let s = TestApiserver::start_with(Options {
        plain_http: true,
        ..Options::default()
    });
    s.put(
        ConfigMap::new("a", "b")
            .label("cmpoll.io/module", "true")
            .data("k", "v"),
    );
    let http = s.http_url().unwrap();
    let c = Cmpoll::new();
    let token = c.write("token", TOKEN);
    let token = token.to_str().unwrap().to_string();
    let run = c
        .with_args(&["list", "--server", &http, "--token-file", &token])
        .run()
        .failure(2);
    assert!(
        run.error_line().contains("refusing to send credentials"),
        "{}",
        run.described
    );
    assert!(s.requests().is_empty());
    let run = c
        .with_args(&[
            "list",
            "--json",
            "--server",
            &http,
            "--token-file",
            &token,
            "--allow-insecure-http",
        ])
        .run()
        .success();
    assert_eq!(run.modules(), ["a/b"]);
    // A kubeconfig cluster on plain http gets no credential, as kubectl sends none (the
    // differential test compares that with kubectl); unless asked, as above.
    s.clear_requests();
    let mut spec = Kubeconfig::token();
    spec.server = Some(http.clone());
    let run = Cmpoll::against_with(&s, &spec)
        .args(&["list"])
        .run()
        .failure(1);
    assert!(
        run.stderr.contains("no credentials are sent"),
        "{}",
        run.described
    );
    let seen = s.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!((seen[0].status, seen[0].bearer.as_deref()), (401, None));
    let run = Cmpoll::against_with(&s, &spec)
        .args(&["list", "--json", "--allow-insecure-http"])
        .run()
        .success();
    assert_eq!(run.modules(), ["a/b"]);
}

#[test]
fn unsupported_kubeconfig_users_are_refused_by_name() {
    let s = server();
    for (user, want) in [
        (
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: helper\n      interactiveMode: Always\n",
            "exec interactiveMode is Always, but cmpoll never runs interactively",
        ),
        (
            "    auth-provider:\n      name: oidc\n",
            "auth-provider 'oidc' is not supported: use an exec credential plugin",
        ),
    ] {
        let run = Cmpoll::against_with(&s, &Kubeconfig::with(Credential::Raw(user.into())))
            .args(&["list"])
            .run()
            .failure(2);
        assert!(run.error_line().contains(want), "{}", run.described);
        assert!(s.requests().is_empty());
    }
}

#[test]
fn the_token_never_appears_in_logs_even_at_trace_level() {
    let s = server();
    s.add_token("t0p-s3cr3t-t0k3n", USER);
    let spec = Kubeconfig::with(Credential::Token("t0p-s3cr3t-t0k3n".into()));
    let run = Cmpoll::against_with(&s, &spec)
        .env("RUST_LOG", "trace")
        .args(&["list", "--json"])
        .run()
        .success();
    assert!(
        run.stderr.len() > 100,
        "trace logging is on: {}",
        run.stderr
    );
    assert!(!run.stderr.contains("t0p-s3cr3t-t0k3n"), "{}", run.stderr);
    // ureq-proto's trace dumps request bytes 16 to a line, which could split a token.
    assert!(!run.stderr.contains("TRACE ureq"), "{}", run.stderr);
    assert!(!run.stderr.contains("Bearer"), "{}", run.stderr);
}
