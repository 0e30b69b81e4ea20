//! Unit tests of choosing a context: kubectl's checks and client-go's credential
//! precedence (the differential test in `tests/kubectl_parity.rs` checks the same against
//! kubectl itself).

use super::*;
use std::path::Path;

fn kc(yaml: &str) -> Kubeconfig {
    Kubeconfig::from_yaml(yaml, Path::new("/k")).unwrap()
}

const BASE: &str = "current-context: c\nclusters:\n- name: cl\n  cluster: {server: 'https://h:6443', insecure-skip-tls-verify: true}\ncontexts:\n- name: c\n  context: {cluster: cl, user: u}\n";

fn with_user(user: &str) -> Kubeconfig {
    kc(&format!("{BASE}users:\n- name: u\n  user: {user}\n"))
}

#[test]
fn kubeconfig_users() {
    let c = Config::from_kubeconfig(&with_user("{token: abc}"), None).unwrap();
    assert_eq!(c.credential, Credential::Token(Secret::new("abc")));
    assert_eq!(c.namespace.as_deref(), Some("default"));
    assert_eq!(c.trust, Trust::Insecure);
    // r15: both set, the file wins and the token is its fallback.
    let c = Config::from_kubeconfig(&with_user("{token: abc, tokenFile: /t}"), None).unwrap();
    assert_eq!(
        c.credential,
        Credential::TokenFile {
            path: "/t".into(),
            fallback: Some(Secret::new("abc"))
        }
    );
    let c = Config::from_kubeconfig(&with_user("{username: a, password: b}"), None).unwrap();
    assert!(matches!(c.credential, Credential::Basic { .. }));
    // r15: a static credential wins over an exec plugin, which then never runs.
    let exec = "exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1}";
    for static_cred in ["token: t", "username: a", "tokenFile: /t"] {
        let c = Config::from_kubeconfig(&with_user(&format!("{{{static_cred}, {exec}}}")), None)
            .unwrap();
        assert!(
            !matches!(c.credential, Credential::Exec(_)),
            "{static_cred}: {:?}",
            c.credential
        );
    }
    let c = Config::from_kubeconfig(&with_user(&format!("{{{exec}}}")), None).unwrap();
    assert!(matches!(c.credential, Credential::Exec(_)));
}

#[test]
fn kubectls_refusals_name_its_reason() {
    let refused = [
        (
            "{auth-provider: {name: gcp}}",
            "auth-provider 'gcp' is not supported: use an exec credential plugin",
        ),
        (
            "{exec: {command: x}}",
            "apiVersion must be specified for u to use exec authentication plugin",
        ),
        (
            "{exec: {command: x, apiVersion: client.authentication.k8s.io/v1alpha1}}",
            "exec apiVersion 'client.authentication.k8s.io/v1alpha1' is not supported",
        ),
        (
            "{exec: {command: x, apiVersion: client.authentication.k8s.io/v1}}",
            "interactiveMode must be specified for u to use exec authentication plugin",
        ),
        (
            "{exec: {command: x, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Always}}",
            "cmpoll never runs interactively",
        ),
        (
            "{exec: {command: x, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Sometimes}}",
            "invalid interactiveMode for u: \"Sometimes\"",
        ),
        (
            "{client-certificate-data: QUJD}",
            "client-key-data or client-key must be specified for u",
        ),
        (
            "{client-certificate-data: QUJD, client-certificate: /c, client-key-data: QUJD}",
            "client-cert-data and client-cert are both specified for u",
        ),
        (
            "{token: x, username: a}",
            "more than one authentication method found for u; found [token basicAuth]",
        ),
        (
            "{tokenFile: /t, username: a}",
            "username/password or bearer token may be set, but not both",
        ),
        (
            "{as-groups: [g]}",
            "requesting uid, groups or user-extra for u without impersonating a user",
        ),
    ];
    for (user, want) in refused {
        let e = Config::from_kubeconfig(&with_user(user), None).unwrap_err();
        assert!(e.contains(want), "{user}: {e}");
        assert!(e.starts_with("kubeconfig '/k'"), "{e}");
    }
}

#[test]
fn contexts_and_clusters() {
    let e = Config::from_kubeconfig(&kc(BASE), Some("nope")).unwrap_err();
    assert_eq!(e, "kubeconfig '/k': context \"nope\" does not exist");
    let e = Config::from_kubeconfig(&kc("contexts: []\n"), None).unwrap_err();
    assert!(e.contains("no current-context and no --context"), "{e}");
    let e = Config::from_kubeconfig(&kc("current-context: gone\n"), None).unwrap_err();
    assert!(
        e.contains("context was not found for specified context: gone"),
        "{e}"
    );
    // client-go: a user that is not there is no credential, not an error.
    let c = Config::from_kubeconfig(&kc(&format!("{BASE}users: []\n")), None).unwrap();
    assert_eq!(c.credential, Credential::None);
    let both = BASE.replace(
        "insecure-skip-tls-verify: true",
        "insecure-skip-tls-verify: true, certificate-authority-data: QUJD",
    );
    let e = Config::from_kubeconfig(
        &kc(&format!("{both}users: [{{name: u, user: {{}}}}]\n")),
        None,
    )
    .unwrap_err();
    assert!(
        e.contains("root certificates file with the insecure flag"),
        "{e}"
    );
    let e = Config::from_kubeconfig(
        &kc("current-context: c\nclusters: [{name: cl, cluster: {insecure-skip-tls-verify: true}}]\ncontexts: [{name: c, context: {cluster: cl}}]\n"),
        None,
    )
    .unwrap_err();
    assert!(e.contains("no server found for cluster \"cl\""), "{e}");
}

#[test]
fn impersonation_becomes_headers() {
    let c = Config::from_kubeconfig(
        &with_user("{token: t, as: admin, as-uid: '42', as-groups: [ops, dev], as-user-extra: {scopes.example.com/x: [a, b]}}"),
        None,
    )
    .unwrap();
    let h = c.impersonate.unwrap().headers();
    assert_eq!(
        h,
        [
            ("Impersonate-User".to_string(), "admin".to_string()),
            ("Impersonate-Uid".into(), "42".into()),
            ("Impersonate-Group".into(), "ops".into()),
            ("Impersonate-Group".into(), "dev".into()),
            (
                "Impersonate-Extra-scopes.example.com%2Fx".into(),
                "a".into()
            ),
            (
                "Impersonate-Extra-scopes.example.com%2Fx".into(),
                "b".into()
            ),
        ]
    );
}

#[test]
fn exec_plugins_with_and_without_cluster_info() {
    let yaml = format!(
        "{BASE}users:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: get-token\n      args: [--region, eu]\n      env: [{{name: A, value: b}}]\n      installHint: brew install get-token\n"
    );
    let c = Config::from_kubeconfig(&kc(&yaml), None).unwrap();
    let Credential::Exec(p) = &c.credential else {
        panic!("{:?}", c.credential)
    };
    assert_eq!(p.command, "get-token");
    assert_eq!(p.args, ["--region", "eu"]);
    assert_eq!(p.env, [("A".to_string(), "b".to_string())]);
    assert_eq!(p.cluster, None);
    let with_info = yaml
        .replace("command: get-token", "command: get-token\n      provideClusterInfo: true")
        .replace(
            "insecure-skip-tls-verify: true}",
            "insecure-skip-tls-verify: true, proxy-url: 'http://p:3128', extensions: [{name: client.authentication.k8s.io/exec, extension: {audience: x}}]}",
        );
    let c = Config::from_kubeconfig(&kc(&with_info), None).unwrap();
    let Credential::Exec(p) = &c.credential else {
        panic!("{:?}", c.credential)
    };
    assert_eq!(
        p.cluster,
        Some(serde_json::json!({
            "server": "https://h:6443",
            "insecure-skip-tls-verify": true,
            "proxy-url": "http://p:3128",
            "config": {"audience": "x"},
        }))
    );
    assert_eq!(c.proxy_url.as_deref(), Some("http://p:3128"));
}
