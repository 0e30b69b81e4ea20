//! `kube::Config`: where the apiserver is and how to authenticate, as plain data.
//!
//! `Config::resolve` follows SPEC's order: `--server` (with `--token-file`, `--ca-file`),
//! then `--kubeconfig` or `KUBECONFIG` (with `--context`), then in-cluster, then
//! `~/.kube/config`. (`--manifests` is decided before this.) Files a kubeconfig points to
//! are read here, so every problem is a configuration error at start-up naming the flag or
//! file; only token files are read again later (they rotate).

use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::auth::Credential;
use super::exec::{self, Plugin};
use super::incluster;
use super::kubeconfig::Kubeconfig;
use crate::http::tls::{Identity, Trust};
use crate::secret::Secret;

/// How to reach and authenticate to the apiserver.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The base URL, without a trailing slash (a path prefix is allowed).
    pub server: String,
    pub trust: Trust,
    pub identity: Option<Identity>,
    pub tls_server_name: Option<String>,
    pub credential: Credential,
    /// The kubeconfig context's namespace, or the pod's own namespace in-cluster.
    pub namespace: Option<String>,
    /// Where this configuration came from, for messages.
    pub origin: String,
    pub disable_compression: bool,
    /// The file `trust` was read from, re-read when it changes (CA rotation).
    pub ca_file: Option<PathBuf>,
    /// The kubeconfig cluster's `proxy-url`.
    pub proxy_url: Option<String>,
}

/// The flags that choose a source of credentials.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub server: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub service_account_dir: Option<PathBuf>,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} '{}': {e}", path.display()))
}

fn b64(data: &str, what: &str) -> Result<Vec<u8>, String> {
    let compact: String = data.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| format!("{what} is not valid base64: {e}"))
}

impl Config {
    /// Resolves in SPEC's order; the error names every source it tried when none applies.
    pub fn resolve(flags: &Flags, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, String> {
        if flags.server.is_none() {
            if flags.token_file.is_some() {
                return Err("--token-file: only used with --server".into());
            }
            if flags.ca_file.is_some() {
                return Err("--ca-file: only used with --server".into());
            }
        }
        if let Some(server) = &flags.server {
            return Config::from_flags(server, flags);
        }
        if let Some(path) = &flags.kubeconfig {
            let kc = Kubeconfig::read_from(path).map_err(|e| format!("--kubeconfig: {e}"))?;
            return Config::from_kubeconfig(&kc, flags.context.as_deref());
        }
        if let Some(list) = env("KUBECONFIG").filter(|l| !l.is_empty()) {
            let kc = Kubeconfig::read_list(&list)?;
            return Config::from_kubeconfig(&kc, flags.context.as_deref());
        }
        // --context asks for a kubeconfig: in-cluster credentials have no contexts.
        if flags.context.is_none()
            && let (Some(host), Some(port)) = (
                env("KUBERNETES_SERVICE_HOST").filter(|h| !h.is_empty()),
                env("KUBERNETES_SERVICE_PORT").filter(|p| !p.is_empty()),
            )
        {
            let dir = flags
                .service_account_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(incluster::SERVICE_ACCOUNT_DIR));
            return Config::incluster(&host, &port, &dir);
        }
        if let Some(path) = home_kubeconfig(env) {
            let kc = Kubeconfig::read_from(&path)?;
            return Config::from_kubeconfig(&kc, flags.context.as_deref());
        }
        if flags.context.is_some() {
            return Err(
                "--context: no kubeconfig to take it from (--kubeconfig, KUBECONFIG or ~/.kube/config)"
                    .into(),
            );
        }
        Err(
            "no apiserver configured: use --manifests DIR, --server URL, --kubeconfig FILE \
             (or KUBECONFIG), run in a pod (KUBERNETES_SERVICE_HOST), or create ~/.kube/config"
                .into(),
        )
    }

    fn from_flags(server: &str, flags: &Flags) -> Result<Config, String> {
        let trust = match &flags.ca_file {
            Some(p) => Trust::Pem {
                pem: read(p, "CA file").map_err(|e| format!("--ca-file: {e}"))?,
                origin: format!("--ca-file '{}'", p.display()),
            },
            None => Trust::Platform,
        };
        let credential = match &flags.token_file {
            Some(p) => Credential::TokenFile(p.clone()),
            None => Credential::None,
        };
        Ok(Config {
            server: normalize_server(server).map_err(|e| format!("--server: {e}"))?,
            trust,
            identity: None,
            tls_server_name: None,
            credential,
            namespace: None,
            origin: "--server".into(),
            disable_compression: false,
            ca_file: flags.ca_file.clone(),
            proxy_url: None,
        })
    }

    /// The pod's service account: token, CA and namespace files under `dir`.
    pub fn incluster(host: &str, port: &str, dir: &Path) -> Result<Config, String> {
        let files = incluster::files(dir);
        if !files.token.exists() {
            return Err(format!(
                "in-cluster (KUBERNETES_SERVICE_HOST is set): no service-account token at '{}'",
                files.token.display()
            ));
        }
        let (trust, ca_file) = match std::fs::read(&files.ca) {
            Ok(pem) => (
                Trust::Pem {
                    pem,
                    origin: format!("'{}'", files.ca.display()),
                },
                Some(files.ca.clone()),
            ),
            Err(e) => {
                log::warn!(
                    "in-cluster: cannot read '{}' ({e}); verifying the apiserver with the platform CAs",
                    files.ca.display()
                );
                (Trust::Platform, None)
            }
        };
        let namespace = std::fs::read_to_string(&files.namespace)
            .ok()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty());
        Ok(Config {
            server: incluster::server_url(host, port),
            trust,
            identity: None,
            tls_server_name: None,
            credential: Credential::TokenFile(files.token),
            namespace,
            origin: "in-cluster service account".into(),
            disable_compression: false,
            ca_file,
            proxy_url: None,
        })
    }

    /// The context `context` (or the current one) of a loaded kubeconfig.
    pub fn from_kubeconfig(kc: &Kubeconfig, context: Option<&str>) -> Result<Config, String> {
        let origin = kc.origin();
        let name = match context {
            Some(c) => c.to_string(),
            None => kc
                .current_context
                .clone()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| format!("{origin}: no current-context (use --context)"))?,
        };
        let ctx = kc.context(&name).ok_or_else(|| {
            format!(
                "{origin}: no context '{name}' (contexts: {})",
                kc.context_names().join(", ")
            )
        })?;
        let where_ = format!("{origin}, context '{name}'");
        let cluster = kc
            .cluster(&ctx.cluster)
            .ok_or_else(|| format!("{where_}: no cluster '{}'", ctx.cluster))?;
        let server = cluster
            .server
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("{where_}: cluster '{}' has no server", ctx.cluster))?;
        let server = normalize_server(server).map_err(|e| format!("{where_}: server: {e}"))?;
        let insecure = cluster.insecure_skip_tls_verify.unwrap_or(false);
        let ca = match (
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
        ) {
            (Some(data), _) if !data.is_empty() => Some((
                b64(data, &format!("{where_}: certificate-authority-data"))?,
                format!("{where_}: certificate-authority-data"),
            )),
            (_, Some(path)) if !path.is_empty() => Some((
                read(Path::new(path), "certificate-authority")
                    .map_err(|e| format!("{where_}: {e}"))?,
                format!("{where_}: certificate-authority '{path}'"),
            )),
            _ => None,
        };
        let ca_file = match (&ca, &cluster.certificate_authority_data) {
            (Some(_), data) if data.as_deref().is_none_or(str::is_empty) => {
                cluster.certificate_authority.as_ref().map(PathBuf::from)
            }
            _ => None,
        };
        let ca_pem = ca.as_ref().map(|(pem, _)| pem.clone());
        let trust = match (ca, insecure) {
            (Some(_), true) => {
                return Err(format!(
                    "{where_}: certificate-authority together with insecure-skip-tls-verify is not allowed"
                ));
            }
            (Some((pem, origin)), false) => Trust::Pem { pem, origin },
            (None, true) => {
                log::warn!(
                    "{where_}: insecure-skip-tls-verify is set: the apiserver's certificate is NOT verified, anyone in the network path can read the token and forge answers"
                );
                Trust::Insecure
            }
            (None, false) => Trust::Platform,
        };
        let user = if ctx.user.is_empty() {
            Default::default()
        } else {
            kc.user(&ctx.user)
                .ok_or_else(|| format!("{where_}: no user '{}'", ctx.user))?
        };
        let who = format!("{where_}, user '{}'", ctx.user);
        if let Some(p) = &user.auth_provider {
            return Err(format!(
                "{who}: auth-provider '{}' is not supported: use an exec credential plugin (client.authentication.k8s.io)",
                p.name
            ));
        }
        if user.impersonate.is_some() {
            return Err(format!("{who}: impersonation (as) is not supported"));
        }
        let identity = identity(&user, &who)?;
        let credential = if let Some(e) = &user.exec {
            let cluster_info = e
                .provide_cluster_info
                .then(|| cluster_info(cluster, &server, ca_pem.as_deref(), insecure));
            Credential::Exec(Box::new(plugin(e, cluster_info, &who)?))
        } else if let Some(t) = user.token.as_deref().filter(|t| !t.is_empty()) {
            Credential::Token(Secret::new(t))
        } else if let Some(f) = user.token_file.as_deref().filter(|f| !f.is_empty()) {
            Credential::TokenFile(PathBuf::from(f))
        } else if let Some(u) = user.username.as_deref().filter(|u| !u.is_empty()) {
            log::warn!(
                "{who}: basic authentication (username/password) is deprecated and insecure; prefer a token or client certificate"
            );
            Credential::Basic {
                username: u.to_string(),
                password: Secret::new(user.password.clone().unwrap_or_default()),
            }
        } else {
            Credential::None
        };
        Ok(Config {
            server,
            trust,
            identity,
            tls_server_name: cluster.tls_server_name.clone().filter(|n| !n.is_empty()),
            credential,
            namespace: Some(
                ctx.namespace
                    .clone()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "default".into()),
            ),
            origin: where_,
            disable_compression: cluster.disable_compression.unwrap_or(false),
            ca_file,
            proxy_url: cluster.proxy_url.clone().filter(|p| !p.is_empty()),
        })
    }
}

/// An exec plugin from a kubeconfig user, checked as client-go checks it.
fn plugin(
    e: &super::kubeconfig::ExecConfig,
    cluster: Option<serde_json::Value>,
    who: &str,
) -> Result<Plugin, String> {
    let api_version = e.api_version.clone().unwrap_or_default();
    if api_version != exec::V1 && api_version != exec::V1BETA1 {
        return Err(format!(
            "{who}: exec apiVersion '{api_version}' is not supported (use {} or {})",
            exec::V1,
            exec::V1BETA1
        ));
    }
    if e.command.is_empty() {
        return Err(format!("{who}: exec has no command"));
    }
    match e.interactive_mode.as_deref() {
        None if api_version == exec::V1 => {
            return Err(format!(
                "{who}: exec interactiveMode must be specified for {api_version} (Never or IfAvailable)"
            ));
        }
        None | Some("Never") | Some("IfAvailable") => {}
        Some("Always") => {
            return Err(format!(
                "{who}: exec interactiveMode is Always, but cmpoll never runs interactively (use Never or IfAvailable)"
            ));
        }
        Some(other) => {
            return Err(format!(
                "{who}: exec interactiveMode '{other}' is not one of Never, IfAvailable, Always"
            ));
        }
    }
    Ok(Plugin {
        api_version,
        command: e.command.clone(),
        args: e.args.clone().unwrap_or_default(),
        env: e
            .env
            .iter()
            .flatten()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect(),
        install_hint: e.install_hint.clone(),
        cluster,
        origin: who.to_string(),
    })
}

/// `spec.cluster` for a plugin with `provideClusterInfo`: client-go's `Cluster`, empty
/// fields left out.
fn cluster_info(
    cluster: &super::kubeconfig::Cluster,
    server: &str,
    ca_pem: Option<&[u8]>,
    insecure: bool,
) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("server".into(), server.into());
    if let Some(n) = cluster.tls_server_name.as_deref().filter(|n| !n.is_empty()) {
        m.insert("tls-server-name".into(), n.into());
    }
    if insecure {
        m.insert("insecure-skip-tls-verify".into(), true.into());
    }
    if let Some(pem) = ca_pem {
        m.insert(
            "certificate-authority-data".into(),
            base64::engine::general_purpose::STANDARD.encode(pem).into(),
        );
    }
    if let Some(p) = cluster.proxy_url.as_deref().filter(|p| !p.is_empty()) {
        m.insert("proxy-url".into(), p.into());
    }
    if cluster.disable_compression == Some(true) {
        m.insert("disable-compression".into(), true.into());
    }
    if let Some(config) = super::kubeconfig::extensions(cluster).remove(EXEC_EXTENSION) {
        m.insert("config".into(), config);
    }
    serde_json::Value::Object(m)
}

/// The cluster extension handed to exec plugins as `spec.cluster.config`.
const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";

fn identity(user: &super::kubeconfig::AuthInfo, who: &str) -> Result<Option<Identity>, String> {
    let cert = match (&user.client_certificate_data, &user.client_certificate) {
        (Some(d), _) if !d.is_empty() => Some(b64(d, &format!("{who}: client-certificate-data"))?),
        (_, Some(p)) if !p.is_empty() => {
            Some(read(Path::new(p), "client-certificate").map_err(|e| format!("{who}: {e}"))?)
        }
        _ => None,
    };
    let key = match (&user.client_key_data, &user.client_key) {
        (Some(d), _) if !d.is_empty() => Some(b64(d, &format!("{who}: client-key-data"))?),
        (_, Some(p)) if !p.is_empty() => {
            Some(read(Path::new(p), "client-key").map_err(|e| format!("{who}: {e}"))?)
        }
        _ => None,
    };
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert_pem), Some(key)) => Ok(Some(Identity {
            cert_pem,
            key_pem: Secret::new(String::from_utf8_lossy(&key).into_owned()),
            origin: who.to_string(),
        })),
        (Some(_), None) => Err(format!("{who}: client certificate without a client key")),
        (None, Some(_)) => Err(format!("{who}: client key without a client certificate")),
    }
}

fn home_kubeconfig(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let p = PathBuf::from(env("HOME")?).join(".kube").join("config");
    p.exists().then_some(p)
}

/// Checks a server URL: http or https, with a host; returns it without a trailing slash.
pub fn normalize_server(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| format!("'{url}' is not an http:// or https:// URL"))?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err(format!("'{url}' has no host"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn nothing_configured_names_all_five_sources() {
        let e = Config::resolve(&Flags::default(), &env(&[("HOME", "/nonexistent")])).unwrap_err();
        for s in [
            "--manifests",
            "--server",
            "--kubeconfig",
            "KUBECONFIG",
            "KUBERNETES_SERVICE_HOST",
            "~/.kube/config",
        ] {
            assert!(e.contains(s), "{s}: {e}");
        }
    }

    #[test]
    fn server_flags_come_first() {
        let flags = Flags {
            server: Some("https://10.0.0.1:6443/".into()),
            kubeconfig: Some("/nonexistent".into()),
            ..Flags::default()
        };
        let c = Config::resolve(&flags, &env(&[("KUBERNETES_SERVICE_HOST", "x")])).unwrap();
        assert_eq!(c.server, "https://10.0.0.1:6443");
        assert_eq!(c.trust, Trust::Platform);
        assert_eq!(c.credential, Credential::None);
        let e = Config::resolve(
            &Flags {
                token_file: Some("t".into()),
                ..Flags::default()
            },
            &env(&[]),
        )
        .unwrap_err();
        assert_eq!(e, "--token-file: only used with --server");
        let e = Config::resolve(
            &Flags {
                server: Some("ftp://x".into()),
                ..Flags::default()
            },
            &env(&[]),
        )
        .unwrap_err();
        assert!(e.starts_with("--server: 'ftp://x' is not"), "{e}");
    }

    #[test]
    fn in_cluster_reads_the_service_account_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "t").unwrap();
        std::fs::write(dir.path().join("namespace"), "monitoring\n").unwrap();
        let flags = Flags {
            service_account_dir: Some(dir.path().into()),
            ..Flags::default()
        };
        let c = Config::resolve(
            &flags,
            &env(&[
                ("KUBERNETES_SERVICE_HOST", "fd00::1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
            ]),
        )
        .unwrap();
        assert_eq!(c.server, "https://[fd00::1]:443");
        assert_eq!(c.namespace.as_deref(), Some("monitoring"));
        assert_eq!(
            c.credential,
            Credential::TokenFile(dir.path().join("token"))
        );
        assert_eq!(
            c.trust,
            Trust::Platform,
            "no ca.crt: platform roots, with a warning"
        );
        std::fs::remove_file(dir.path().join("token")).unwrap();
        let e = Config::resolve(
            &flags,
            &env(&[
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
            ]),
        )
        .unwrap_err();
        assert!(e.contains("no service-account token"), "{e}");
    }

    fn kc(yaml: &str) -> Kubeconfig {
        let mut kc = Kubeconfig::from_yaml(yaml).unwrap();
        kc.files = vec!["/k".into()];
        kc
    }

    const BASE: &str = "current-context: c\nclusters:\n- name: cl\n  cluster: {server: 'https://h:6443', insecure-skip-tls-verify: true}\ncontexts:\n- name: c\n  context: {cluster: cl, user: u}\n";

    #[test]
    fn kubeconfig_users() {
        let with_user = |user: &str| kc(&format!("{BASE}users:\n- name: u\n  user: {user}\n"));
        let c = Config::from_kubeconfig(&with_user("{token: abc, tokenFile: /t}"), None).unwrap();
        assert_eq!(
            c.credential,
            Credential::Token(Secret::new("abc")),
            "token wins"
        );
        assert_eq!(c.namespace.as_deref(), Some("default"));
        assert_eq!(c.trust, Trust::Insecure);
        let c = Config::from_kubeconfig(&with_user("{username: a, password: b}"), None).unwrap();
        assert!(matches!(c.credential, Credential::Basic { .. }));
        let refused = [
            (
                "{auth-provider: {name: gcp}}",
                "auth-provider 'gcp' is not supported: use an exec credential plugin",
            ),
            (
                "{exec: {command: x}}",
                "exec apiVersion '' is not supported",
            ),
            (
                "{exec: {command: x, apiVersion: client.authentication.k8s.io/v1alpha1}}",
                "exec apiVersion 'client.authentication.k8s.io/v1alpha1' is not supported",
            ),
            (
                "{exec: {command: x, apiVersion: client.authentication.k8s.io/v1}}",
                "exec interactiveMode must be specified for client.authentication.k8s.io/v1",
            ),
            (
                "{exec: {command: x, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Always}}",
                "cmpoll never runs interactively",
            ),
            (
                "{exec: {command: x, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Sometimes}}",
                "interactiveMode 'Sometimes' is not one of",
            ),
            ("{as: admin}", "impersonation"),
            (
                "{client-certificate-data: QUJD}",
                "client certificate without a client key",
            ),
            (
                "{token: x, client-key-data: '!!'}",
                "client-key-data is not valid base64",
            ),
        ];
        for (user, want) in refused {
            let e = Config::from_kubeconfig(&with_user(user), None).unwrap_err();
            assert!(e.contains(want), "{user}: {e}");
            assert!(
                e.starts_with("kubeconfig '/k', context 'c', user 'u'"),
                "{e}"
            );
        }
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
        let with_info = yaml.replace("command: get-token", "command: get-token\n      provideClusterInfo: true")
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

    #[test]
    fn kubeconfig_contexts_and_clusters() {
        let e = Config::from_kubeconfig(&kc(BASE), Some("nope")).unwrap_err();
        assert_eq!(e, "kubeconfig '/k': no context 'nope' (contexts: c)");
        let e = Config::from_kubeconfig(&kc("contexts: []\n"), None).unwrap_err();
        assert!(e.contains("no current-context (use --context)"), "{e}");
        let e = Config::from_kubeconfig(&kc(&format!("{BASE}users: []\n")), None).unwrap_err();
        assert!(e.contains("no user 'u'"), "{e}");
        let both = BASE.replace(
            "insecure-skip-tls-verify: true",
            "insecure-skip-tls-verify: true, certificate-authority-data: QUJD",
        );
        let e = Config::from_kubeconfig(
            &kc(&format!("{both}users: [{{name: u, user: {{}}}}]\n")),
            None,
        )
        .unwrap_err();
        assert!(e.contains("together with insecure-skip-tls-verify"), "{e}");
    }
}
