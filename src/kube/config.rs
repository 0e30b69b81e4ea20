//! `kube::Config`: where the apiserver is and how to authenticate, as plain data.
//!
//! `Config::resolve` follows SPEC's order: `--server` (with `--token-file`, `--ca-file`),
//! then `--kubeconfig` or `KUBECONFIG` (with `--context`), then in-cluster, then
//! `~/.kube/config`. (`--manifests` is decided before this.) A kubeconfig's context is
//! chosen as kubectl chooses it (`context.rs`). Files a kubeconfig points to are read here,
//! so every problem is a configuration error at start-up naming the flag or file; only
//! token and CA files are read again later (they rotate).

use std::path::{Path, PathBuf};

use super::auth::Credential;
use super::impersonate::Impersonate;
use super::incluster;
use super::kubeconfig::Kubeconfig;
use crate::http::tls::{Identity, Trust};

/// How to reach and authenticate to the apiserver.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The base URL, without a trailing slash (a path prefix is allowed).
    pub server: String,
    pub trust: Trust,
    pub identity: Option<Identity>,
    pub tls_server_name: Option<String>,
    pub credential: Credential,
    /// Act as another user (kubeconfig `as` and friends).
    pub impersonate: Option<Impersonate>,
    /// The kubeconfig context's namespace, or the pod's own namespace in-cluster.
    pub namespace: Option<String>,
    /// Where this configuration came from, for messages.
    pub origin: String,
    pub disable_compression: bool,
    /// The file `trust` was read from, re-read when it changes (CA rotation).
    pub ca_file: Option<PathBuf>,
    /// The kubeconfig cluster's `proxy-url`.
    pub proxy_url: Option<String>,
    /// What an `http://` server gets without `--allow-insecure-http`.
    pub plain_http: PlainHttp,
}

/// Credentials and plain HTTP, without `--allow-insecure-http`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlainHttp {
    /// A configuration error (`--server` with `--token-file`, in-cluster).
    Refuse,
    /// No credential and no client certificate, as kubectl sends none for a kubeconfig
    /// cluster that is not `https://` (client-go reads the user only "if we are secure").
    Anonymous,
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
    /// No verification of the apiserver's certificate, whatever the source says
    /// (`cmpoll sidecar`'s `SKIP_TLS_VERIFY=true`, warned about).
    pub insecure_skip_tls_verify: bool,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} '{}': {e}", path.display()))
}

impl Config {
    /// Resolves in SPEC's order; the error names every source it tried when none applies.
    pub fn resolve(flags: &Flags, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, String> {
        let mut c = Config::resolve_source(flags, env)?;
        if flags.insecure_skip_tls_verify {
            c.trust = Trust::Insecure;
            c.ca_file = None;
        }
        Ok(c)
    }

    fn resolve_source(
        flags: &Flags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, String> {
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
            Some(p) => Credential::TokenFile {
                path: p.clone(),
                fallback: None,
            },
            None => Credential::None,
        };
        Ok(Config {
            server: normalize_server(server).map_err(|e| format!("--server: {e}"))?,
            trust,
            identity: None,
            tls_server_name: None,
            credential,
            impersonate: None,
            namespace: None,
            origin: "--server".into(),
            disable_compression: false,
            ca_file: flags.ca_file.clone(),
            proxy_url: None,
            plain_http: PlainHttp::Refuse,
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
            credential: Credential::TokenFile {
                path: files.token,
                fallback: None,
            },
            impersonate: None,
            namespace,
            origin: "in-cluster service account".into(),
            disable_compression: false,
            ca_file,
            proxy_url: None,
            plain_http: PlainHttp::Refuse,
        })
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
mod tests;
