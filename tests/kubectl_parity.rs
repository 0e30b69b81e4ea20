//! kubectl is the oracle for kubeconfigs (issue 15): a differential test. Each scenario is a
//! set of kubeconfig files (one to three, in different folders, with relative paths,
//! symlinked folders, overlapping names, or written by `kubectl config set-*` itself), run
//! by both `kubectl get --raw` and `cmpoll list` against three test apiservers with their
//! own CAs, tokens, basic-auth users and client certificates. Both must succeed or fail
//! together, reach the same server with the same credential (bearer token, client
//! certificate, basic-auth user, impersonation headers), and run an exec plugin the same
//! number of times. Scenarios come from client-go's own tests where one applies
//! (`tools/clientcmd/{loader,client_config,validation}_test.go` at v0.36.3, named in each
//! scenario), and from the cases issue 15 found. Two documented divergences, both failing
//! on both sides: a legacy `auth-provider` is refused by name (SPEC), where kubectl 1.32
//! fails for lack of it; and a context with no credential at all makes kubectl prompt for
//! a username and password on its terminal (`client_config.go`, `canIdentifyUser` and the
//! fallback reader), which a daemon has not got: cmpoll asks anonymously, as client-go's
//! non-interactive config does, and reports the 401 (an apiserver allowing anonymous
//! requests would answer it).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use test_apiserver::{ConfigMap, Grant, Options, TestApiserver};

use crate::util::{bin, skip_unless};

const NAMES: [&str; 3] = ["a", "b", "c"];

/// Three apiservers, each with its own CA, and everything a kubeconfig can point to.
struct World {
    dir: tempfile::TempDir,
    servers: Vec<TestApiserver>,
    vars: BTreeMap<String, String>,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let mut vars = BTreeMap::new();
        let mut servers = Vec::new();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        for n in NAMES {
            // C also listens for plain HTTP, and lets anonymous requests through.
            let s = if n == "c" {
                let mut o = Options {
                    plain_http: true,
                    ..Options::default()
                };
                o.behaviour.anonymous = true;
                TestApiserver::start_with(o)
            } else {
                TestApiserver::start()
            };
            if n == "c" {
                s.grant("system:anonymous", Grant::all());
                vars.insert("HTTP_C".into(), s.http_url().unwrap());
            }
            s.put(
                ConfigMap::new("apps", "m")
                    .label("cmpoll.io/module", "true")
                    .data("k", "v"),
            );
            for token in ["tok", "file", "static", "exec", "other"] {
                let user = format!("{token}-{n}");
                s.add_token(&format!("{token}-{n}"), &user);
                s.grant(&user, Grant::all());
            }
            s.add_basic("alice", &format!("pw-{n}"), &format!("basic-{n}"));
            s.grant(&format!("basic-{n}"), Grant::all());
            s.grant(&format!("cert-{n}"), Grant::all());
            let pair = s.client_cert(&format!("cert-{n}"));
            let up = n.to_uppercase();
            let write = |name: &str, text: &str| {
                let p = dir.path().join("pki").join(name);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, text).unwrap();
                p.display().to_string()
            };
            vars.insert(format!("URL_{up}"), s.url());
            vars.insert(format!("CA_{up}"), b64(&s.ca_pem()));
            vars.insert(
                format!("CAF_{up}"),
                write(&format!("ca-{n}.crt"), &s.ca_pem()),
            );
            vars.insert(
                format!("CERT_{up}"),
                write(&format!("cert-{n}.crt"), &pair.cert_pem),
            );
            vars.insert(
                format!("KEY_{up}"),
                write(&format!("cert-{n}.key"), &pair.key_pem),
            );
            vars.insert(format!("CERTD_{up}"), b64(&pair.cert_pem));
            vars.insert(format!("KEYD_{up}"), b64(&pair.key_pem));
            vars.insert(
                format!("TOKF_{up}"),
                write(&format!("file-{n}"), &format!("file-{n}\n")),
            );
            servers.push(s);
        }
        // An exec plugin: issues $TOKEN (from its kubeconfig env), counts its runs.
        let plugin = dir.path().join("bin/plugin");
        std::fs::create_dir_all(plugin.parent().unwrap()).unwrap();
        std::fs::write(
            &plugin,
            "#!/bin/sh\necho run >> \"$(dirname \"$0\")/runs\"\nv=$(printf '%s' \"$KUBERNETES_EXEC_INFO\" | sed -n 's/.*\"apiVersion\":\"\\([^\"]*\\)\".*/\\1/p')\nprintf '{\"apiVersion\":\"%s\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\"}}\\n' \"$v\" \"$TOKEN\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        vars.insert("PLUGIN".into(), plugin.display().to_string());
        World { dir, servers, vars }
    }

    fn render(&self, text: &str, root: &Path) -> String {
        let mut out = text.replace("{ROOT}", &root.display().to_string());
        for (k, v) in &self.vars {
            out = out.replace(&format!("{{{k}}}"), v);
        }
        out
    }

    fn plugin_runs(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("bin/runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

/// What one client did: whether it succeeded, and the list request it made (which
/// server, and what it presented).
/// What the list request presented, and to which server.
#[derive(Debug, PartialEq)]
struct ListRequest {
    server: usize,
    bearer: Option<String>,
    client_cn: Option<String>,
    basic_user: Option<String>,
    /// `Impersonate-*` headers, sorted.
    impersonate: Vec<(String, String)>,
}

struct Seen {
    ok: bool,
    request: Option<ListRequest>,
    plugin_runs: usize,
    /// Every request made (server, path, status) and the first line of stderr:
    /// shown when a scenario differs, never compared.
    trace: (Vec<(usize, String, u16)>, String),
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok {}, list request {:?}, plugin runs {}; requests {:?}, stderr {:?}",
            self.ok, self.request, self.plugin_runs, self.trace.0, self.trace.1
        )
    }
}

impl PartialEq for Seen {
    fn eq(&self, other: &Seen) -> bool {
        (self.ok, &self.request, self.plugin_runs) == (other.ok, &other.request, other.plugin_runs)
    }
}

/// kubectl prompts on its terminal for a user without credentials; cmpoll cannot.
const NO_PROMPT: Option<(bool, bool)> = Some((false, false));

/// How a scenario sets its kubeconfig up.
struct Scenario {
    name: &'static str,
    /// Where the case comes from.
    origin: &'static str,
    /// (path relative to the scenario folder, contents with placeholders).
    files: Vec<(&'static str, String)>,
    /// (link, target), relative to the scenario folder.
    links: Vec<(&'static str, &'static str)>,
    /// `KUBECONFIG`, with placeholders (`{ROOT}` is the scenario folder).
    env: Option<&'static str>,
    /// Extra arguments for both clients (`--kubeconfig`, `--context`).
    args: Vec<String>,
    /// `kubectl` commands run first, in the scenario folder, to write files.
    kubectl_writes: Vec<Vec<String>>,
    /// Whether kubectl succeeds (from client-go's source): checked, so that a scenario
    /// broken by a typo cannot pass by both clients failing alike.
    ok: bool,
    /// The differences SPEC documents: (what cmpoll does, what kubectl does).
    divergence: Option<(bool, bool)>,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            name: "",
            origin: "",
            files: Vec::new(),
            links: Vec::new(),
            env: Some("{ROOT}/config"),
            args: Vec::new(),
            kubectl_writes: Vec::new(),
            ok: true,
            divergence: None,
        }
    }
}

/// A one-file kubeconfig: cluster `cl` on server A (CA as data), context `c` of user `u`.
fn one(user: &str) -> Vec<(&'static str, String)> {
    vec![(
        "config",
        config_with(
            "server: {URL_A}\n    certificate-authority-data: {CA_A}",
            user,
        ),
    )]
}

fn config_with(cluster: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: cl\n  cluster:\n    {cluster}\ncontexts:\n- name: c\n  context:\n    cluster: cl\n    user: u\nusers:\n- name: u\n  user:\n{}\n",
        user.lines()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

fn exec(version: &str, extra: &str) -> String {
    format!(
        "exec:\n  apiVersion: client.authentication.k8s.io/{version}\n  command: {{PLUGIN}}\n  env:\n  - name: TOKEN\n    value: exec-a\n{extra}"
    )
}

fn scenarios() -> Vec<Scenario> {
    let s = Scenario::default;
    let mut v = vec![
        Scenario { name: "static token", origin: "validation_test.go TestValidateCleanTokenAuthInfo", files: one("token: tok-a"), ..s() },
        Scenario { name: "token file", origin: "client_config_test.go TestBasicTokenFile", files: one("tokenFile: {TOKF_A}"), ..s() },
        Scenario { name: "token and token file: the file wins", origin: "client_config_test.go TestPrecedenceTokenFile", files: one("token: static-a\ntokenFile: {TOKF_A}"), ..s() },
        Scenario { name: "token and a missing token file: the token", origin: "issue 15", files: one("token: static-a\ntokenFile: {ROOT}/nope"), ..s() },
        Scenario { name: "a missing token file alone", ok: false, origin: "client_config.go getUserIdentificationPartialConfig", files: one("tokenFile: {ROOT}/nope"), ..s() },
        Scenario { name: "basic auth", origin: "client_config_test.go TestBasicAuthData", files: one("username: alice\npassword: pw-a"), ..s() },
        Scenario { name: "client certificate files", origin: "validation_test.go TestValidateCleanCertFilesAuthInfo", files: one("client-certificate: {CERT_A}\nclient-key: {KEY_A}"), ..s() },
        Scenario { name: "client certificate data", origin: "client_config_test.go TestCertificateData", files: one("client-certificate-data: {CERTD_A}\nclient-key-data: {KEYD_A}"), ..s() },
        Scenario { name: "client certificate and token: both", origin: "issue 15", files: one("client-certificate-data: {CERTD_A}\nclient-key-data: {KEYD_A}\ntoken: tok-a"), ..s() },
        Scenario { name: "certificate without a key", ok: false, origin: "validation.go validateAuthInfo", files: one("client-certificate: {CERT_A}"), ..s() },
        Scenario { name: "certificate file and data", ok: false, origin: "validation_test.go TestValidateCertDataOverridesFiles", files: one("client-certificate: {CERT_A}\nclient-certificate-data: {CERTD_A}\nclient-key-data: {KEYD_A}"), ..s() },
        Scenario { name: "key file and data", ok: false, origin: "validation_test.go TestValidateCertDataOverridesFiles", files: one("client-certificate-data: {CERTD_A}\nclient-key: {KEY_A}\nclient-key-data: {KEYD_A}"), ..s() },
        Scenario { name: "certificate file missing", ok: false, origin: "validation_test.go TestValidateCertFilesNotFoundAuthInfo", files: one("client-certificate: {ROOT}/nope.crt\nclient-key: {KEY_A}"), ..s() },
        Scenario { name: "token and basic auth", ok: false, origin: "validation_test.go TestValidateMultipleMethodsAuthInfo", files: one("token: tok-a\nusername: alice\npassword: pw-a"), ..s() },
        Scenario { name: "token file and basic auth", ok: false, origin: "transport: username/password or bearer token", files: one("tokenFile: {TOKF_A}\nusername: alice\npassword: pw-a"), ..s() },
        Scenario { name: "exec v1", origin: "validation_test.go TestValidateAuthInfoExec", files: one(&exec("v1", "  interactiveMode: Never\n")), ..s() },
        Scenario { name: "exec v1beta1 without interactiveMode", origin: "api/v1 defaults (IfAvailable)", files: one(&exec("v1beta1", "")), ..s() },
        Scenario { name: "exec v1 without interactiveMode", ok: false, origin: "validation_test.go TestValidateAuthInfoExecInteractiveModeMissing", files: one(&exec("v1", "")), ..s() },
        Scenario { name: "exec with an invalid interactiveMode", ok: false, origin: "validation_test.go TestValidateAuthInfoExecInteractiveModeInvalid", files: one(&exec("v1", "  interactiveMode: Sometimes\n")), ..s() },
        Scenario { name: "exec without apiVersion", ok: false, origin: "validation_test.go TestValidateAuthInfoExecNoVersion", files: one("exec:\n  command: {PLUGIN}\n  interactiveMode: Never"), ..s() },
        Scenario { name: "exec without command", ok: false, origin: "validation_test.go TestValidateAuthInfoExecNoCommand", files: one("exec:\n  apiVersion: client.authentication.k8s.io/v1\n  interactiveMode: Never"), ..s() },
        Scenario { name: "exec env without a name", ok: false, origin: "validation_test.go TestValidateAuthInfoExecNoEnv", files: one(&exec("v1", "  - value: x\n  interactiveMode: Never\n")), ..s() },
        Scenario { name: "exec next to a token: the token, no plugin run", origin: "exec.go UpdateTransportConfig", files: one(&format!("token: tok-a\n{}", exec("v1", "  interactiveMode: Never\n"))), ..s() },
        Scenario { name: "exec next to basic auth", origin: "exec.go UpdateTransportConfig", files: one(&format!("username: alice\npassword: pw-a\n{}", exec("v1", "  interactiveMode: Never\n"))), ..s() },
        Scenario { name: "exec next to a client certificate", origin: "exec.go UpdateTransportConfig", files: one(&format!("client-certificate: {{CERT_A}}\nclient-key: {{KEY_A}}\n{}", exec("v1", "  interactiveMode: Never\n"))), ..s() },
        Scenario { name: "exec with an auth-provider", ok: false, origin: "validation_test.go TestValidateAuthInfoExecWithAuthProvider", files: one(&format!("auth-provider:\n  name: oidc\n{}", exec("v1", "  interactiveMode: Never\n"))), ..s() },
        Scenario { name: "impersonate a user", origin: "validation_test.go TestValidateAuthInfoImpersonateUser", files: one("token: tok-a\nas: somebody"), ..s() },
        Scenario { name: "impersonate everything", origin: "client_config_test.go TestFullImpersonateConfig", files: one("token: tok-a\nas: somebody\nas-uid: '42'\nas-groups: [g1, g2]\nas-user-extra:\n  scopes.example.com/x: [one, two]\n  team: [ops]"), ..s() },
        Scenario { name: "impersonation groups without a user", ok: false, origin: "validation_test.go TestValidateAuthInfoImpersonateGroupsWithoutUserInvalid", files: one("token: tok-a\nas-groups: [g1]"), ..s() },
        Scenario { name: "impersonation extra without a user", ok: false, origin: "validation_test.go TestValidateAuthInfoImpersonateExtraWithoutUserInvalid", files: one("token: tok-a\nas-user-extra: {x: [y]}"), ..s() },
        Scenario { name: "impersonation uid without a user", ok: false, origin: "validation_test.go TestValidateAuthInfoImpersonateUIDWithoutUserInvalid", files: one("token: tok-a\nas-uid: '1'"), ..s() },
        Scenario { name: "an empty user", ok: false, origin: "validation_test.go TestValidateEmptyAuthInfo", files: one("{}"), divergence: NO_PROMPT, ..s() },
        Scenario { name: "a context whose user is not there", ok: false, origin: "client_config.go getAuthInfo (not required)", files: vec![("config", "current-context: c\nclusters:\n- name: cl\n  cluster: {server: '{URL_A}', certificate-authority-data: '{CA_A}'}\ncontexts:\n- name: c\n  context: {cluster: cl, user: ghost}\n".into())], divergence: NO_PROMPT, ..s() },
        Scenario { name: "a context without a user", ok: false, origin: "client_config.go getAuthInfo", files: vec![("config", "current-context: c\nclusters:\n- name: cl\n  cluster: {server: '{URL_A}', certificate-authority-data: '{CA_A}'}\ncontexts:\n- name: c\n  context: {cluster: cl}\n".into())], divergence: NO_PROMPT, ..s() },
        Scenario { name: "a context whose cluster is not there", ok: false, origin: "validation_test.go TestConfirmUsableMissingObjects", files: vec![("config", "current-context: c\ncontexts:\n- name: c\n  context: {cluster: ghost, user: u}\nusers:\n- name: u\n  user: {token: tok-a}\n".into())], ..s() },
        Scenario { name: "a cluster without a server", ok: false, origin: "validation_test.go TestValidateEmptyClusterInfo", files: vec![("config", config_with("certificate-authority-data: {CA_A}", "token: tok-a"))], ..s() },
        Scenario { name: "CA file and CA data", ok: false, origin: "validation.go validateClusterInfo", files: vec![("config", config_with("server: {URL_A}\n    certificate-authority: {CAF_A}\n    certificate-authority-data: {CA_A}", "token: tok-a"))], ..s() },
        Scenario { name: "a missing CA file", ok: false, origin: "validation_test.go TestValidateMissingCAFileClusterInfo", files: vec![("config", config_with("server: {URL_A}\n    certificate-authority: {ROOT}/nope.crt", "token: tok-a"))], ..s() },
        Scenario { name: "CA file", origin: "validation_test.go TestValidateCleanWithCAClusterInfo", files: vec![("config", config_with("server: {URL_A}\n    certificate-authority: {CAF_A}", "token: tok-a"))], ..s() },
        Scenario { name: "insecure-skip-tls-verify", origin: "client_config_test.go TestInsecureOverridesCA", files: vec![("config", config_with("server: {URL_A}\n    insecure-skip-tls-verify: true", "token: tok-a"))], ..s() },
        Scenario { name: "insecure with a CA", ok: false, origin: "rest TLSConfigFor", files: vec![("config", config_with("server: {URL_A}\n    insecure-skip-tls-verify: true\n    certificate-authority-data: {CA_A}", "token: tok-a"))], ..s() },
        Scenario { name: "another server's CA", ok: false, origin: "TLS verification", files: vec![("config", config_with("server: {URL_A}\n    certificate-authority-data: {CA_B}", "token: tok-a"))], ..s() },
        Scenario { name: "tls-server-name", origin: "client_config_test.go TestTLSServerName", files: vec![("config", config_with("server: {URL_A}\n    certificate-authority-data: {CA_A}\n    tls-server-name: localhost", "token: tok-a"))], ..s() },
        Scenario { name: "null lists", ok: false, origin: "loader_test.go TestLoadingEmptyMaps", files: vec![("config", "apiVersion: v1\nclusters: null\ncontexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {}\nusers: null\n".into())], ..s() },
        Scenario { name: "an empty file", ok: false, origin: "loader.go Load (empty data)", files: vec![("config", String::new())], ..s() },
        Scenario { name: "duplicate cluster names", ok: false, origin: "loader_test.go TestDuplicateClusterName", files: vec![("config", "current-context: c\nclusters:\n- name: cl\n  cluster: {server: '{URL_A}', certificate-authority-data: '{CA_A}'}\n- name: cl\n  cluster: {server: '{URL_B}', certificate-authority-data: '{CA_B}'}\ncontexts:\n- name: c\n  context: {cluster: cl, user: u}\nusers:\n- name: u\n  user: {token: tok-a}\n".into())], ..s() },
        Scenario { name: "duplicate user names", ok: false, origin: "loader_test.go TestDuplicateUserName", files: vec![("config", format!("{}- name: u\n  user: {{token: tok-b}}\n", config_with("server: {URL_A}\n    certificate-authority-data: {CA_A}", "token: tok-a")))], ..s() },
        Scenario { name: "duplicate context names", ok: false, origin: "loader_test.go TestDuplicateContextName", files: vec![("config", "current-context: c\nclusters:\n- name: cl\n  cluster: {server: '{URL_A}', certificate-authority-data: '{CA_A}'}\ncontexts:\n- name: c\n  context: {cluster: cl, user: u}\n- name: c\n  context: {cluster: cl, user: u}\nusers:\n- name: u\n  user: {token: tok-a}\n".into())], ..s() },
        Scenario { name: "namespace: no", ok: false, origin: "issue 15 (YAML 1.1 boolean)", files: vec![("config", config_with("server: {URL_A}\n    certificate-authority-data: {CA_A}", "token: tok-a").replace("    user: u\n", "    user: u\n    namespace: no\n"))], ..s() },
        Scenario { name: "an unused context without a cluster key", origin: "issue 15", files: vec![("config", config_with("server: {URL_A}\n    certificate-authority-data: {CA_A}", "token: tok-a").replace("contexts:\n", "contexts:\n- name: other\n  context:\n    user: u\n"))], ..s() },
        Scenario { name: "current-context names a missing context", ok: false, origin: "client_config_test.go TestCreateMissingContext", files: vec![("config", config_with("server: {URL_A}\n    certificate-authority-data: {CA_A}", "token: tok-a").replace("current-context: c", "current-context: ghost"))], ..s() },
        Scenario { name: "--context names a missing context", ok: false, origin: "client_config.go getContext (required)", files: one("token: tok-a"), args: vec!["--context".into(), "ghost".into()], ..s() },
        Scenario { name: "--context picks another", origin: "client_config_test.go TestModifyContext", files: vec![("config", "current-context: c\nclusters:\n- name: ca\n  cluster: {server: '{URL_A}', certificate-authority-data: '{CA_A}'}\n- name: cb\n  cluster: {server: '{URL_B}', certificate-authority-data: '{CA_B}'}\ncontexts:\n- name: c\n  context: {cluster: ca, user: ua}\n- name: d\n  context: {cluster: cb, user: ub}\nusers:\n- name: ua\n  user: {token: tok-a}\n- name: ub\n  user: {token: tok-b}\n".into())], args: vec!["--context".into(), "d".into()], ..s() },
        Scenario { name: "auth-provider", ok: false, origin: "SPEC: refused by name", files: one("auth-provider:\n  name: gcp"), divergence: Some((false, false)), ..s() },
        // client_config.go ClientConfig: "only try to read the auth information if we are secure".
        Scenario { name: "plain http: no token is sent", origin: "client_config.go ClientConfig (IsConfigTransportTLS)", files: vec![("config", config_with("server: {HTTP_C}", "token: tok-c"))], ..s() },
        Scenario { name: "plain http: no token file is read", origin: "client_config.go ClientConfig (IsConfigTransportTLS)", files: vec![("config", config_with("server: {HTTP_C}", "tokenFile: {TOKF_C}"))], ..s() },
        Scenario { name: "plain http: the exec plugin does not run", origin: "client_config.go ClientConfig (IsConfigTransportTLS)", files: vec![("config", config_with("server: {HTTP_C}", &exec("v1", "  interactiveMode: Never\n")))], ..s() },
        Scenario { name: "plain http: impersonation is still sent", origin: "client_config.go ClientConfig (Impersonate before the TLS check)", files: vec![("config", config_with("server: {HTTP_C}", "token: tok-c\nas: somebody\nas-groups: [g1]"))], ..s() },
        Scenario { name: "plain http: two methods are still refused", ok: false, origin: "validation.go validateAuthInfo (ConfirmUsable runs first)", files: vec![("config", config_with("server: {HTTP_C}", "token: tok-c\nusername: alice\npassword: pw-c"))], ..s() },
        // Several files (loader_test.go).
        Scenario {
            name: "split into cluster, user and context files",
            origin: "issue 15; loader_test.go TestToleratingMissingFiles",
            files: vec![
                ("contexts/config", "current-context: c\ncontexts:\n- name: c\n  context: {cluster: cl, user: u}\n".into()),
                ("clusters/config", "clusters:\n- name: cl\n  cluster: {server: '{URL_B}', certificate-authority-data: '{CA_B}'}\n".into()),
                ("users/config", "users:\n- name: u\n  user: {token: tok-b}\n".into()),
            ],
            env: Some("{ROOT}/contexts/config:{ROOT}/missing:{ROOT}/clusters/config:{ROOT}/users/config"),
            ..s()
        },
        Scenario {
            name: "the first file to name an entry wins it whole",
            origin: "loader.go Load (merge)",
            files: vec![
                ("one/config", "current-context: c\ncontexts:\n- name: c\n  context: {cluster: cl, user: u}\nusers:\n- name: u\n  user: {token: tok-a}\n".into()),
                ("two/config", "current-context: other\nclusters:\n- name: cl\n  cluster: {server: '{URL_A}', certificate-authority-data: '{CA_A}'}\nusers:\n- name: u\n  user: {username: alice, password: pw-a}\n".into()),
            ],
            env: Some("{ROOT}/one/config:{ROOT}/two/config"),
            ..s()
        },
        Scenario {
            name: "conflicting current contexts: the first",
            origin: "loader_test.go TestConflictingCurrentContext",
            files: vec![
                ("one/config", "current-context: a\n".into()),
                ("two/config", "current-context: b\nclusters:\n- name: ca\n  cluster: {server: '{URL_A}', certificate-authority-data: '{CA_A}'}\n- name: cb\n  cluster: {server: '{URL_B}', certificate-authority-data: '{CA_B}'}\ncontexts:\n- name: a\n  context: {cluster: ca, user: ua}\n- name: b\n  context: {cluster: cb, user: ub}\nusers:\n- name: ua\n  user: {token: tok-a}\n- name: ub\n  user: {token: tok-b}\n".into()),
            ],
            env: Some("{ROOT}/one/config:{ROOT}/two/config"),
            ..s()
        },
        Scenario {
            name: "--context from the second file",
            origin: "loader.go Load (merge)",
            files: vec![
                ("one/config", "current-context: a\ncontexts:\n- name: a\n  context: {cluster: ca, user: u}\nclusters:\n- name: ca\n  cluster: {server: '{URL_A}', certificate-authority-data: '{CA_A}'}\nusers:\n- name: u\n  user: {token: tok-a}\n".into()),
                ("two/config", "contexts:\n- name: b\n  context: {cluster: cb, user: v}\nclusters:\n- name: cb\n  cluster: {server: '{URL_C}', certificate-authority-data: '{CA_C}'}\nusers:\n- name: v\n  user: {token: tok-c}\n".into()),
            ],
            env: Some("{ROOT}/one/config:{ROOT}/two/config"),
            args: vec!["--context".into(), "b".into()],
            ..s()
        },
        Scenario {
            name: "duplicate names across files are no error",
            origin: "loader.go Load (merge)",
            files: vec![
                ("one/config", config_with("server: {URL_A}\n    certificate-authority-data: {CA_A}", "token: tok-a")),
                ("two/config", config_with("server: {URL_B}\n    certificate-authority-data: {CA_B}", "token: tok-b")),
            ],
            env: Some("{ROOT}/two/config:{ROOT}/one/config"),
            ..s()
        },
        Scenario {
            name: "all files missing", ok: false,
            origin: "loader_test.go TestToleratingMissingFiles",
            files: vec![],
            env: Some("{ROOT}/nope:{ROOT}/nada"),
            ..s()
        },
        Scenario {
            name: "--kubeconfig that does not exist", ok: false,
            origin: "loader_test.go TestNonExistentCommandLineFile",
            files: vec![],
            env: None,
            args: vec!["--kubeconfig".into(), "{ROOT}/nope".into()],
            ..s()
        },
        Scenario {
            name: "--kubeconfig with --context",
            origin: "client_config_test.go TestModifyContext",
            files: vec![("k/config", "clusters:\n- name: cb\n  cluster: {server: '{URL_B}', certificate-authority-data: '{CA_B}'}\ncontexts:\n- name: x\n  context: {cluster: cb, user: u}\nusers:\n- name: u\n  user: {token: tok-b}\n".into())],
            env: Some("{ROOT}/nope"),
            args: vec!["--kubeconfig".into(), "{ROOT}/k/config".into(), "--context".into(), "x".into()],
            ..s()
        },
        Scenario {
            name: "relative paths against each file's own folder",
            origin: "loader_test.go TestResolveRelativePaths",
            files: vec![
                ("one/config", "current-context: c\ncontexts:\n- name: c\n  context: {cluster: cl, user: u}\nusers:\n- name: u\n  user: {tokenFile: ../tokens/t, client-certificate: certs/c.crt, client-key: certs/c.key}\n".into()),
                ("tokens/t", "tok-c\n".into()),
                ("one/certs/c.crt", "{CERT_PEM_C}".into()),
                ("one/certs/c.key", "{KEY_PEM_C}".into()),
                ("two/sub/config", "clusters:\n- name: cl\n  cluster: {server: '{URL_C}', certificate-authority: ../ca.crt}\n".into()),
                ("two/ca.crt", "{CA_PEM_C}".into()),
            ],
            env: Some("{ROOT}/one/config:{ROOT}/two/sub/config"),
            ..s()
        },
        Scenario {
            name: "'..' through a symlinked folder is cleaned as text",
            origin: "issue 15; loader.go ResolveLocalPaths",
            files: vec![
                ("real/deep/config", "current-context: c\nclusters:\n- name: cl\n  cluster: {server: '{URL_A}', certificate-authority-data: '{CA_A}'}\ncontexts:\n- name: c\n  context: {cluster: cl, user: u}\nusers:\n- name: u\n  user: {tokenFile: ../t}\n".into()),
                ("real/t", "tok-b\n".into()),
                ("t", "tok-a\n".into()),
            ],
            links: vec![("link", "real/deep")],
            env: Some("{ROOT}/link/config"),
            ..s()
        },
        Scenario {
            name: "a relative exec command",
            origin: "loader.go GetAuthInfoFileReferences",
            files: vec![("config", config_with("server: {URL_A}\n    certificate-authority-data: {CA_A}", &exec("v1", "  interactiveMode: Never\n").replace("{PLUGIN}", "./plugin-link")))],
            links: vec![("plugin-link", "{PLUGIN}")],
            ..s()
        },
    ];
    v.extend(written_by_kubectl());
    v
}

/// Files written by `kubectl config set-*` itself.
fn written_by_kubectl() -> Vec<Scenario> {
    let cmd = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let cluster = |file: &str, n: &str| {
        cmd(&[
            "--kubeconfig",
            file,
            "config",
            "set-cluster",
            "cl",
            &format!("--server={{URL_{n}}}"),
            &format!("--certificate-authority={{CAF_{n}}}"),
            "--embed-certs=true",
        ])
    };
    let context = |file: &str| {
        cmd(&[
            "--kubeconfig",
            file,
            "config",
            "set-context",
            "c",
            "--cluster=cl",
            "--user=u",
        ])
    };
    let use_context = |file: &str| cmd(&["--kubeconfig", file, "config", "use-context", "c"]);
    let s = Scenario::default;
    vec![
        Scenario {
            name: "kubectl config set-*: token",
            origin: "kubectl config set-cluster/set-credentials/set-context",
            kubectl_writes: vec![
                cluster("{ROOT}/config", "A"),
                cmd(&[
                    "--kubeconfig",
                    "{ROOT}/config",
                    "config",
                    "set-credentials",
                    "u",
                    "--token=tok-a",
                ]),
                context("{ROOT}/config"),
                use_context("{ROOT}/config"),
            ],
            ..s()
        },
        Scenario {
            name: "kubectl config set-*: one file each",
            origin: "issue 15: a new file per set-* command",
            kubectl_writes: vec![
                cluster("{ROOT}/clusters", "B"),
                cmd(&[
                    "--kubeconfig",
                    "{ROOT}/users",
                    "config",
                    "set-credentials",
                    "u",
                    "--client-certificate={CERT_B}",
                    "--client-key={KEY_B}",
                ]),
                context("{ROOT}/contexts"),
                use_context("{ROOT}/contexts"),
            ],
            env: Some("{ROOT}/contexts:{ROOT}/clusters:{ROOT}/users"),
            ..s()
        },
        Scenario {
            name: "kubectl config set-*: a cluster only",
            ok: false,
            origin: "issue 15: users: null, contexts: null",
            kubectl_writes: vec![cluster("{ROOT}/config", "A")],
            ..s()
        },
        Scenario {
            name: "kubectl config set-*: basic auth and a namespace",
            origin: "kubectl config set-credentials --username --password",
            kubectl_writes: vec![
                cluster("{ROOT}/config", "C"),
                cmd(&[
                    "--kubeconfig",
                    "{ROOT}/config",
                    "config",
                    "set-credentials",
                    "u",
                    "--username=alice",
                    "--password=pw-c",
                ]),
                cmd(&[
                    "--kubeconfig",
                    "{ROOT}/config",
                    "config",
                    "set-context",
                    "c",
                    "--cluster=cl",
                    "--user=u",
                    "--namespace=apps",
                ]),
                use_context("{ROOT}/config"),
            ],
            ..s()
        },
        Scenario {
            name: "kubectl config set-*: exec plugin",
            origin: "kubectl config set-credentials --exec-*",
            kubectl_writes: vec![
                cluster("{ROOT}/config", "A"),
                cmd(&[
                    "--kubeconfig",
                    "{ROOT}/config",
                    "config",
                    "set-credentials",
                    "u",
                    "--exec-command={PLUGIN}",
                    "--exec-api-version=client.authentication.k8s.io/v1",
                    "--exec-env=TOKEN=exec-a",
                    "--exec-interactive-mode=Never",
                ]),
                context("{ROOT}/config"),
                use_context("{ROOT}/config"),
            ],
            ..s()
        },
        Scenario {
            name: "kubectl config set-*: token file and embedded certificate",
            origin: "kubectl config set-credentials --client-certificate --embed-certs",
            kubectl_writes: vec![
                cluster("{ROOT}/config", "B"),
                cmd(&[
                    "--kubeconfig",
                    "{ROOT}/config",
                    "config",
                    "set-credentials",
                    "u",
                    "--client-certificate={CERT_B}",
                    "--client-key={KEY_B}",
                    "--embed-certs=true",
                ]),
                cmd(&[
                    "--kubeconfig",
                    "{ROOT}/config",
                    "config",
                    "set-credentials",
                    "u",
                    "--token=tok-b",
                ]),
                context("{ROOT}/config"),
                use_context("{ROOT}/config"),
            ],
            ..s()
        },
    ]
}

/// Runs one client with the scenario's environment; what it did.
fn observe(w: &World, root: &Path, env: &Option<String>, mut cmd: Command) -> Seen {
    for s in &w.servers {
        s.clear_requests();
    }
    let runs = w.plugin_runs();
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", root)
        .current_dir(root);
    if let Some(kc) = env {
        cmd.env("KUBECONFIG", kc);
    }
    let out = crate::util::bounded(cmd, std::time::Duration::from_secs(60)).expect("finished");
    let request = w.servers.iter().enumerate().find_map(|(i, s)| {
        // kubectl may ask for discovery first; the list itself is what both make.
        s.requests()
            .into_iter()
            .find(|r| r.path == "/api/v1/configmaps")
            .map(|r| {
                let mut impersonate = r.impersonate.clone();
                impersonate.sort();
                ListRequest {
                    server: i,
                    bearer: r.bearer.clone(),
                    client_cn: r.client_cn.clone(),
                    basic_user: r.basic_user.clone(),
                    impersonate,
                }
            })
    });
    let all = w
        .servers
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.requests().into_iter().map(move |r| (i, r.path, r.status)))
        .collect();
    let stderr = String::from_utf8_lossy(&out.stderr)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    Seen {
        ok: out.status.success(),
        request,
        plugin_runs: w.plugin_runs() - runs,
        trace: (all, stderr),
    }
}

fn kubectl_available() -> bool {
    Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn kubeconfigs_are_read_as_kubectl_reads_them() {
    if skip_unless(kubectl_available(), "kubectl") {
        return;
    }
    let mut w = World::new();
    for n in NAMES {
        let up = n.to_uppercase();
        let i = NAMES.iter().position(|x| *x == n).unwrap();
        let pair = w.servers[i].client_cert(&format!("cert-{n}"));
        let ca = w.servers[i].ca_pem();
        w.vars.insert(format!("CERT_PEM_{up}"), pair.cert_pem);
        w.vars.insert(format!("KEY_PEM_{up}"), pair.key_pem);
        w.vars.insert(format!("CA_PEM_{up}"), ca);
    }
    let all = scenarios();
    assert!(all.len() >= 60, "{} scenarios", all.len());
    let mut failures = Vec::new();
    for (i, sc) in all.iter().enumerate() {
        let root = w.dir.path().join(format!("s{i:02}"));
        std::fs::create_dir_all(&root).unwrap();
        for (rel, text) in &sc.files {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, w.render(text, &root)).unwrap();
        }
        for (link, target) in &sc.links {
            let target = w.render(target, &root);
            std::os::unix::fs::symlink(&target, root.join(link)).unwrap();
        }
        for args in &sc.kubectl_writes {
            let args: Vec<String> = args.iter().map(|a| w.render(a, &root)).collect();
            let st = Command::new("kubectl")
                .args(&args)
                .env("HOME", &root)
                .output()
                .unwrap();
            assert!(st.status.success(), "{}: kubectl {args:?}: {st:?}", sc.name);
        }
        let env = sc.env.map(|e| w.render(e, &root));
        let args: Vec<String> = sc.args.iter().map(|a| w.render(a, &root)).collect();
        let mut kubectl = Command::new("kubectl");
        kubectl.args(&args).args([
            "get",
            "--raw",
            "/api/v1/configmaps?labelSelector=cmpoll.io%2Fmodule%3Dtrue",
        ]);
        let theirs = observe(&w, &root, &env, kubectl);
        let mut cmpoll = Command::new(bin());
        cmpoll.arg("list").args(&args);
        let ours = observe(&w, &root, &env, cmpoll);
        if theirs.ok != sc.ok {
            failures.push(format!(
                "{} ({}): the scenario is broken: kubectl {} where client-go's source says it {}\n  kubectl: {theirs:?}\n  files in {}",
                sc.name,
                sc.origin,
                if theirs.ok { "succeeds" } else { "fails" },
                if sc.ok { "succeeds" } else { "fails" },
                root.display()
            ));
            continue;
        }
        let same = match sc.divergence {
            None => ours == theirs,
            // Where cmpoll diverges it never sends a credential kubectl would not.
            Some((ours_ok, theirs_ok)) => {
                ours.ok == ours_ok
                    && theirs.ok == theirs_ok
                    && ours.request.as_ref().is_none_or(|r| {
                        r.bearer.is_none()
                            && r.client_cn.is_none()
                            && r.basic_user.is_none()
                            && r.impersonate.is_empty()
                    })
            }
        };
        if !same {
            failures.push(format!(
                "{} ({}):\n  kubectl: {theirs:?}\n  cmpoll:  {ours:?}\n  files in {}",
                sc.name,
                sc.origin,
                root.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios differ from kubectl:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    eprintln!("kubectl parity: {} scenarios, all alike", all.len());
}
