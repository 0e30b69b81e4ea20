//! kubectl against the test apiserver: the proof that it is a faithful stand-in. kubectl is
//! a real client-go program; if it lists, pages, filters and reports errors here as it does
//! against a cluster, so will cmpoll's tests. `.ci/run` installs kubectl where it is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use test_apiserver::{
    ConfigMap, Credential, Grant, Kubeconfig, Route, TOKEN, TestApiserver, Trust, USER,
};

struct Kubectl {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn new(server: &TestApiserver, spec: &Kubeconfig) -> Kubectl {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = server.write_kubeconfig(&dir.path().join("kubeconfig"), spec);
        Kubectl { dir, kubeconfig }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .expect("kubectl is installed (bash .ci/run installs it)")
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "kubectl {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn names(v: &serde_json::Value) -> Vec<String> {
    let mut n: Vec<String> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap(),
                i["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    n.sort();
    n
}

fn populated() -> TestApiserver {
    let s = TestApiserver::start();
    s.put(ConfigMap::new("apps", "a1").label("a", "x").data("k", "1"));
    s.put(
        ConfigMap::new("apps", "a2")
            .label("a", "y")
            .label("b", "on"),
    );
    s.put(ConfigMap::new("web", "w1").label("a", "y"));
    s.put(ConfigMap::new("web", "w2").label("a", "z"));
    s.put(ConfigMap::new("web", "w3"));
    s
}

fn lists(s: &TestApiserver) -> Vec<test_apiserver::Recorded> {
    s.requests().into_iter().filter(|r| r.is_list()).collect()
}

#[test]
fn kubectl_lists_with_a_set_based_selector_across_namespaces() {
    let s = populated();
    let k = Kubectl::new(&s, &Kubeconfig::token());
    let v = k.json(&[
        "get",
        "configmaps",
        "-A",
        "-l",
        "a in (x,y),!b",
        "-o",
        "json",
    ]);
    assert_eq!(names(&v), ["apps/a1", "web/w1"]);
    let list = lists(&s).pop().unwrap();
    assert_eq!(list.path, "/api/v1/configmaps");
    assert_eq!(list.param("labelSelector"), Some("a in (x,y),!b"));
}

#[test]
fn kubectl_pages_with_chunk_size() {
    let s = TestApiserver::start();
    for i in 0..8 {
        s.put(ConfigMap::new("p", &format!("c{i}")).data("k", "v"));
    }
    let k = Kubectl::new(&s, &Kubeconfig::token());
    let v = k.json(&["get", "cm", "-A", "--chunk-size=3", "-o", "json"]);
    assert_eq!(names(&v).len(), 8);
    let pages = lists(&s);
    assert_eq!(pages.len(), 3, "3 + 3 + 2");
    assert!(pages.iter().all(|p| p.param("limit") == Some("3")));
    assert!(pages[0].param("continue").is_none());
    assert!(pages[1].param("continue").is_some() && pages[2].param("continue").is_some());
    assert!(pages.iter().all(|p| p.route == Route::Etcd));
}

#[test]
fn kubectl_lists_one_namespace_and_filters_by_field() {
    let s = populated();
    let k = Kubectl::new(&s, &Kubeconfig::token());
    let v = k.json(&["get", "cm", "-n", "web", "-o", "json"]);
    assert_eq!(names(&v), ["web/w1", "web/w2", "web/w3"]);
    assert_eq!(
        lists(&s).pop().unwrap().path,
        "/api/v1/namespaces/web/configmaps"
    );
    let v = k.json(&[
        "get",
        "cm",
        "-A",
        "--field-selector",
        "metadata.name=w2",
        "-o",
        "json",
    ]);
    assert_eq!(names(&v), ["web/w2"]);
}

#[test]
fn kubectl_prints_the_servers_message_for_bad_selectors() {
    let s = populated();
    let k = Kubectl::new(&s, &Kubeconfig::token());
    let err = k.fails(&["get", "cm", "-A", "-l", "a=b b"]);
    assert!(
        err.contains("found 'b', expected: ',' or 'end of string'"),
        "{err}"
    );
    let err = k.fails(&["get", "cm", "-A", "--field-selector", "data.x=1"]);
    assert!(
        err.contains("\"data.x\" is not a known field selector"),
        "{err}"
    );
}

#[test]
fn kubectl_default_output_is_a_server_side_table() {
    let s = populated();
    let k = Kubectl::new(&s, &Kubeconfig::token());
    let out = k.run(&["get", "cm", "-A"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("NAMESPACE"), "{text}");
    assert!(text.contains("web         w3"), "{text}");
    let list = lists(&s).pop().unwrap();
    assert!(list.accept.unwrap().contains("as=Table"));
}

#[test]
fn kubectl_raw_shows_the_resource_version_routing() {
    let s = populated();
    let k = Kubectl::new(&s, &Kubeconfig::token());
    let rv = s.revision();

    let v = k.json(&[
        "get",
        "--raw",
        "/api/v1/configmaps?resourceVersion=0&limit=1",
    ]);
    assert_eq!(
        v["items"].as_array().unwrap().len(),
        5,
        "limit ignored at RV 0"
    );
    assert!(v["metadata"].get("continue").is_none());
    assert_eq!(lists(&s).pop().unwrap().route, Route::Cache);

    let v = k.json(&[
        "get",
        "--raw",
        &format!("/api/v1/configmaps?resourceVersion={rv}&resourceVersionMatch=NotOlderThan"),
    ]);
    assert_eq!(v["metadata"]["resourceVersion"], rv.to_string());
    assert_eq!(lists(&s).pop().unwrap().route, Route::Cache);

    let err = k.fails(&[
        "get",
        "--raw",
        &format!(
            "/api/v1/configmaps?resourceVersion={}&resourceVersionMatch=NotOlderThan",
            rv + 100
        ),
    ]);
    assert!(err.contains("Too large resource version"), "{err}");

    let v = k.json(&["get", "--raw", "/api/v1/configmaps?limit=2"]);
    assert!(v["metadata"]["continue"].is_string());
    assert_eq!(v["metadata"]["remainingItemCount"], 3);
    assert_eq!(lists(&s).pop().unwrap().route, Route::Etcd);
    let token = v["metadata"]["continue"].as_str().unwrap().to_string();

    let err = k.fails(&[
        "get",
        "--raw",
        &format!("/api/v1/configmaps?limit=2&resourceVersion=7&continue={token}"),
    ]);
    assert!(
        err.contains("specifying resource version is not allowed when using continue"),
        "{err}"
    );
    let err = k.fails(&[
        "get",
        "--raw",
        "/api/v1/configmaps?resourceVersionMatch=NotOlderThan",
    ]);
    assert!(
        err.contains("resourceVersionMatch is forbidden unless resourceVersion is provided"),
        "{err}"
    );
    s.expire_continue_tokens();
    let err = k.fails(&[
        "get",
        "--raw",
        &format!("/api/v1/configmaps?limit=2&continue={token}"),
    ]);
    assert!(err.contains("continue parameter is too old"), "{err}");
}

#[test]
fn kubectl_reports_forbidden_and_unauthorized() {
    let s = populated();
    s.add_token("limited", "limited-user");
    s.grant("limited-user", Grant::namespaces(&["web"]));
    let k = Kubectl::new(&s, &Kubeconfig::with(Credential::Token("limited".into())));
    let err = k.fails(&["get", "cm", "-A"]);
    assert!(
        err.contains("User \"limited-user\" cannot list resource \"configmaps\" in API group \"\" at the cluster scope"),
        "{err}"
    );
    assert_eq!(
        names(&k.json(&["get", "cm", "-n", "web", "-o", "json"])).len(),
        3
    );
    let k = Kubectl::new(&s, &Kubeconfig::with(Credential::Token("wrong".into())));
    let err = k.fails(&["get", "cm", "-A"]);
    assert!(
        err.contains("Unauthorized") || err.contains("credentials"),
        "{err}"
    );
}

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

#[test]
fn kubectl_accepts_every_kubeconfig_variant_the_writer_makes() {
    let s = populated();
    let alice = s.client_cert("alice");
    s.grant("alice", Grant::all());
    let tmp = tempfile::tempdir().unwrap();
    let ca = write(&tmp.path().join("ca.crt"), &s.ca_pem());
    let token = write(&tmp.path().join("token"), TOKEN);
    let cert = write(&tmp.path().join("tls.crt"), &alice.cert_pem);
    let key = write(&tmp.path().join("tls.key"), &alice.key_pem);
    let variants = [
        ("token + CA data", Kubeconfig::token(), USER),
        (
            "token file + CA file",
            Kubeconfig::with(Credential::TokenFile(token)).trust(Trust::CaFile(ca.clone())),
            USER,
        ),
        (
            "client certificate files",
            Kubeconfig::with(Credential::ClientCertFiles { cert, key }).trust(Trust::CaFile(ca)),
            "alice",
        ),
        (
            "client certificate data",
            Kubeconfig::with(Credential::ClientCertData(alice.clone())),
            "alice",
        ),
        (
            "insecure-skip-tls-verify",
            Kubeconfig::token().trust(Trust::Insecure),
            USER,
        ),
    ];
    for (what, spec, user) in variants {
        s.clear_requests();
        let k = Kubectl::new(&s, &spec);
        let v = k.json(&["get", "cm", "-A", "-o", "json"]);
        assert_eq!(names(&v).len(), 5, "{what}");
        assert_eq!(
            lists(&s).pop().unwrap().user.as_deref(),
            Some(user),
            "{what}"
        );
    }
    // And a CA that is not the server's is refused by kubectl.
    let other = test_apiserver::Pki::new("other");
    let k = Kubectl::new(&s, &Kubeconfig::token().trust(Trust::System));
    let bad_ca = write(&k.path("other.crt"), &other.ca_pem());
    let k = Kubectl::new(&s, &Kubeconfig::token().trust(Trust::CaFile(bad_ca)));
    let err = k.fails(&["get", "cm", "-A"]);
    assert!(err.contains("certificate"), "{err}");
}

/// Secrets: kubectl lists and gets them (its own decoding of `data`, its table with the
/// type column, its paging across both resources' shared revision), and RBAC is per
/// resource, as cmpoll's `--resource secrets` needs.
#[test]
fn kubectl_reads_secrets_as_from_a_cluster() {
    let s = populated();
    s.put(
        ConfigMap::secret("apps", "db")
            .label("a", "x")
            .data("password", "hunter2")
            .binary("key.der", &[0, 255]),
    );
    s.put(ConfigMap::secret("web", "tls").label("a", "y"));
    let k = Kubectl::new(&s, &Kubeconfig::token());
    let err = k.fails(&["get", "secrets", "-A"]);
    assert!(
        err.contains("cannot list resource \"secrets\" in API group \"\" at the cluster scope"),
        "{err}"
    );
    s.grant(USER, Grant::all().resources(&["configmaps", "secrets"]));
    let v = k.json(&["get", "secrets", "-A", "-l", "a=x", "-o", "json"]);
    assert_eq!(names(&v), ["apps/db"]);
    assert_eq!(v["kind"], "List");
    assert_eq!(v["items"][0]["kind"], "Secret");
    assert_eq!(v["items"][0]["data"]["password"], "aHVudGVyMg==");
    assert_eq!(v["items"][0]["type"], "Opaque");
    let out = k.run(&[
        "get",
        "secret",
        "db",
        "-n",
        "apps",
        "-o",
        "jsonpath={.data.key\\.der}",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "AP8=");
    let out = k.run(&["get", "secrets", "-A"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("NAMESPACE"), "{text}");
    assert!(text.contains("TYPE") && text.contains("Opaque"), "{text}");
    let v = k.json(&["get", "secrets", "-A", "--chunk-size=1", "-o", "json"]);
    assert_eq!(
        names(&v),
        ["apps/db", "web/tls"],
        "paged, and no ConfigMap in between"
    );
    assert_eq!(
        names(&k.json(&["get", "cm", "-A", "-o", "json"])).len(),
        5,
        "and no Secret among the ConfigMaps"
    );
    let err = k.fails(&["get", "--raw", "/api/v1/namespaces/apps/secrets/nope"]);
    assert!(err.contains("secrets \"nope\" not found"), "{err}");
}
