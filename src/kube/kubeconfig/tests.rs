//! Unit tests of kubeconfig loading: what `kubectl config set-*` and client-go write,
//! what kubectl refuses, relative paths made absolute as text, and merging.

use super::*;

const EXAMPLE: &str = include_str!("../../../tests/fixtures/kube-api/kubeconfig-example.yaml");

fn parse(yaml: &str) -> Result<Kubeconfig, String> {
    Kubeconfig::from_yaml(yaml, Path::new("/k/config"))
}

#[test]
fn parses_the_example_with_every_field() {
    // The shared fixture's client certificate and key are placeholders (`LS0tLS1CRUdJTi...`),
    // which kubectl refuses ("illegal base64 data at input byte 14"), and so does cmpoll.
    let e = parse(EXAMPLE).unwrap_err();
    assert!(
        e.contains("client-certificate-data: illegal base64 data"),
        "{e}"
    );
    let kc = parse(&EXAMPLE.replace("LS0tLS1CRUdJTi...", "LS0tLS1CRUdJTi0tLS0t")).unwrap();
    assert_eq!(kc.current_context, "prod-poller");
    let prod = &kc.clusters["prod"].value;
    assert_eq!(prod.tls_server_name, "kubernetes.default.svc");
    assert_eq!(
        prod.extensions["client.authentication.k8s.io/exec"]["audience"],
        "06e3fbd18de8"
    );
    let exec = kc.users["poller-exec"].value.exec.clone().unwrap();
    assert_eq!(exec.command, "cloud-auth-helper");
    assert_eq!(exec.args, ["token", "--cluster", "prod"]);
    assert!(exec.provide_cluster_info);
    assert_eq!(kc.contexts["prod-poller"].value.namespace, "team-a");
    assert_eq!(
        kc.users["poller-token"].value.token_file,
        "/var/run/cm-poller/token"
    );
}

/// r15: what `kubectl config set-cluster/set-credentials/set-context` write into a new
/// file (null lists), and entries without some keys, are accepted.
#[test]
fn null_lists_and_missing_keys_are_accepted() {
    let kc = parse(
        "apiVersion: v1\nkind: Config\nclusters: null\ncontexts: null\ncurrent-context: \"\"\npreferences: {}\nusers: null\n",
    )
    .unwrap();
    assert!(kc.clusters.is_empty() && kc.users.is_empty() && kc.contexts.is_empty());
    let kc = parse(
        "contexts:\n- name: no-cluster\n  context: {user: u}\n- name: empty\n- name: bare\n  context: null\nusers:\n- name: u\n",
    )
    .unwrap();
    assert_eq!(kc.contexts["no-cluster"].value.cluster, "");
    assert_eq!(kc.contexts["empty"].value.user, "");
    assert_eq!(kc.users["u"].value.token, "");
    assert!(parse("").unwrap().clusters.is_empty());
}

/// r15: what kubectl refuses at load time.
#[test]
fn kubectl_refusals_at_load_time() {
    for (yaml, want) in [
        (
            "clusters:\n- name: a\n  cluster: {server: 'https://x'}\n- name: a\n  cluster: {server: 'https://y'}\n",
            "duplicate name \"a\" in the clusters list",
        ),
        (
            "users:\n- name: u\n- name: u\n",
            "duplicate name \"u\" in the users list",
        ),
        (
            "contexts:\n- name: c\n- name: c\n",
            "duplicate name \"c\" in the contexts list",
        ),
        (
            "contexts:\n- name: c\n  context: {cluster: x, user: u, namespace: no}\n",
            "The string value [no] must be quoted",
        ),
        (
            "clusters:\n- name: a\n  cluster: {certificate-authority-data: '!!notbase64'}\n",
            "certificate-authority-data: illegal base64",
        ),
        ("clusters: [1, 2]\n", ""),
    ] {
        let e = parse(yaml).unwrap_err();
        assert!(e.contains(want), "{yaml}: {e}");
    }
}

/// r15: client-go joins relative paths to the absolute folder of the file as text, so
/// `..` never goes through a symlinked folder.
#[test]
fn relative_paths_are_joined_and_cleaned_as_text() {
    let kc = Kubeconfig::from_yaml(
        "users:\n- name: u\n  user: {tokenFile: ../tok, client-certificate: ./c.crt, client-key: /abs/k, exec: {command: ./bin/plugin}}\n- name: v\n  user: {exec: {command: on-path}}\nclusters:\n- name: c\n  cluster: {certificate-authority: sub/../ca.crt}\n",
        Path::new("/a/link/config"),
    )
    .unwrap();
    let u = &kc.users["u"].value;
    assert_eq!(u.token_file, "/a/tok");
    assert_eq!(u.client_certificate, "/a/link/c.crt");
    assert_eq!(u.client_key, "/abs/k");
    assert_eq!(u.exec.as_ref().unwrap().command, "/a/link/bin/plugin");
    assert_eq!(
        kc.users["v"].value.exec.as_ref().unwrap().command,
        "on-path"
    );
    assert_eq!(
        kc.clusters["c"].value.certificate_authority,
        "/a/link/ca.crt"
    );
    assert_eq!(clean(Path::new("/../x/./y/../z")), Path::new("/x/z"));
    assert_eq!(clean(Path::new("a/../../b")), Path::new("../b"));
}

#[test]
fn merging_keeps_the_first_entry_and_current_context() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let b = sub.join("b");
    std::fs::write(
        &a,
        "current-context: one\nusers:\n- name: u\n  user: {tokenFile: tok-a}\ncontexts:\n- name: one\n  context: {cluster: c, user: u}\n",
    )
    .unwrap();
    std::fs::write(
        &b,
        "current-context: two\nclusters:\n- name: c\n  cluster: {server: 'https://b', certificate-authority: ca.crt}\nusers:\n- name: u\n  user: {token: from-b, client-key: k}\n- name: v\n  user: {tokenFile: /abs/tok}\n",
    )
    .unwrap();
    let list = format!(
        "{}:{}:{}:/nonexistent",
        a.display(),
        b.display(),
        a.display()
    );
    let kc = Kubeconfig::read_list(&list).unwrap();
    assert_eq!(kc.current_context, "one");
    let u = &kc.users["u"];
    assert_eq!(
        u.value.token, "",
        "whole entries: b's fields for u are discarded"
    );
    assert_eq!(
        u.value.token_file,
        dir.path().join("tok-a").to_string_lossy()
    );
    assert_eq!(u.file, a, "each entry knows its file");
    assert_eq!(kc.users["v"].value.token_file, "/abs/tok");
    assert_eq!(
        kc.clusters["c"].value.certificate_authority,
        sub.join("ca.crt").to_string_lossy(),
        "relative to b's own folder"
    );
    assert_eq!(
        kc.files.len(),
        2,
        "duplicates and missing files are skipped"
    );
    assert!(
        Kubeconfig::read_list("/nope:/nada")
            .unwrap_err()
            .contains("none of its files")
    );
}

#[test]
fn broken_yaml_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config");
    std::fs::write(&p, "clusters:\n- name: x\n  cluster:\n    server: [oops\n").unwrap();
    let e = Kubeconfig::read_from(&p).unwrap_err();
    assert!(e.contains("config") && e.contains("line"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}
