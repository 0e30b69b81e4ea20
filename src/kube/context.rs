//! Choosing a context of a loaded kubeconfig, as client-go's `DirectClientConfig` does
//! (kubectl is the oracle; `client_config.go` and `validation.go` of client-go v0.36.3).
//!
//! The context is `--context` (which must exist) or `current-context`; its cluster and
//! user are looked up, and a name that is not there is an empty entry, as in client-go
//! (a missing user means no credential). Then `ConfirmUsable`'s checks, with kubectl's
//! words: a cluster without a server, a CA file and its `-data` twin both set, files that
//! cannot be read, a client certificate without a key, more than one authentication
//! method, an exec plugin without command, apiVersion or interactiveMode, impersonation
//! details without a user. The credential follows client-go's precedence: the token file
//! whenever it can be read (re-read as it rotates; a static token is its fallback), else a
//! static token, else basic auth; a client certificate alongside; an exec plugin only when
//! none of those is set; the legacy `auth-provider` is refused by name (SPEC's one
//! exception). Impersonation becomes the `Impersonate-*` headers. A cluster on plain
//! `http://` gets no credential (`PlainHttp::Anonymous`), as client-go reads the user only
//! over TLS.

use std::path::{Path, PathBuf};

use super::auth::Credential;
use super::config::{Config, PlainHttp, normalize_server};
use super::exec::{self, Plugin};
use super::impersonate::Impersonate;
use super::kubeconfig::{AuthInfo, Cluster, ExecConfig, Kubeconfig};
use crate::http::tls::{Identity, Trust};
use crate::secret::Secret;

/// The file an entry came from, for messages.
fn file_of(f: &Path) -> String {
    f.display().to_string()
}

impl Config {
    /// The context `context` (or the current one) of a loaded kubeconfig.
    pub fn from_kubeconfig(kc: &Kubeconfig, context: Option<&str>) -> Result<Config, String> {
        let origin = kc.origin();
        let name = context.unwrap_or(&kc.current_context);
        let ctx = match kc.contexts.get(name) {
            Some(c) => c.value.clone(),
            None if context.is_some() => {
                return Err(format!("{origin}: context \"{name}\" does not exist"));
            }
            None if name.is_empty() => {
                return Err(format!(
                    "{origin}: no current-context and no --context (kubectl: invalid configuration: no configuration has been provided)"
                ));
            }
            None => Default::default(),
        };
        let found_ctx = kc.contexts.contains_key(name);
        let cluster = kc.clusters.get(&ctx.cluster);
        let user = kc.users.get(&ctx.user);
        let where_ = match kc.contexts.get(name) {
            Some(e) => format!("kubeconfig '{}', context '{name}'", file_of(&e.file)),
            None => format!("{origin}, context '{name}'"),
        };
        let cluster_v = cluster.map(|c| c.value.clone()).unwrap_or_default();
        let user_v = user.map(|u| u.value.clone()).unwrap_or_default();
        let mut errs = Vec::new();
        if !found_ctx {
            errs.push(format!(
                "context was not found for specified context: {name}"
            ));
        }
        errs.extend(validate_user(&ctx.user, &user_v));
        errs.extend(validate_cluster(&ctx.cluster, &cluster_v));
        if errs == ["cluster has no server defined"] {
            errs = vec!["no configuration has been provided".into()];
        }
        if !errs.is_empty() {
            return Err(format!(
                "{where_}: invalid configuration (kubectl refuses it too): {}",
                errs.join("; ")
            ));
        }
        let server = normalize_server(&cluster_v.server)
            .map_err(|e| format!("{where_}: cluster \"{}\": server: {e}", ctx.cluster))?;
        // The user's own file when another file than the context's named it.
        let ctx_file = kc.contexts.get(name).map(|e| &e.file);
        let who = match user {
            Some(u) if Some(&u.file) != ctx_file => {
                format!("kubeconfig '{}', user '{}'", file_of(&u.file), ctx.user)
            }
            _ => format!("{where_}, user '{}'", ctx.user),
        };
        let trust = trust(&cluster_v, &where_)?;
        let credential = credential(&user_v, &cluster_v, &server, &who)?;
        Ok(Config {
            server,
            trust,
            identity: identity(&user_v, &who)?,
            tls_server_name: Some(cluster_v.tls_server_name.clone()).filter(|n| !n.is_empty()),
            credential,
            impersonate: impersonate(&user_v),
            namespace: Some(if ctx.namespace.is_empty() {
                "default".to_string()
            } else {
                ctx.namespace.clone()
            }),
            origin: where_,
            disable_compression: cluster_v.disable_compression,
            ca_file: (cluster_v.certificate_authority_data.is_empty()
                && !cluster_v.certificate_authority.is_empty())
            .then(|| PathBuf::from(&cluster_v.certificate_authority)),
            proxy_url: Some(cluster_v.proxy_url.clone()).filter(|p| !p.is_empty()),
            plain_http: PlainHttp::Anonymous,
        })
    }
}

/// `validateClusterInfo`.
fn validate_cluster(name: &str, c: &Cluster) -> Vec<String> {
    let empty = c.server.is_empty()
        && c.certificate_authority.is_empty()
        && c.certificate_authority_data.is_empty()
        && !c.insecure_skip_tls_verify
        && c.tls_server_name.is_empty()
        && c.proxy_url.is_empty()
        && !c.disable_compression
        && c.extensions.is_empty();
    if empty {
        return vec!["cluster has no server defined".into()];
    }
    let mut errs = Vec::new();
    if c.server.is_empty() {
        errs.push(if name.is_empty() {
            "default cluster has no server defined".to_string()
        } else {
            format!("no server found for cluster \"{name}\"")
        });
    }
    if !c.certificate_authority.is_empty() && !c.certificate_authority_data.is_empty() {
        errs.push(format!(
            "certificate-authority-data and certificate-authority are both specified for {name}. certificate-authority-data will override."
        ));
    }
    if !c.certificate_authority.is_empty()
        && let Err(e) = std::fs::File::open(&c.certificate_authority)
    {
        errs.push(format!(
            "unable to read certificate-authority {} for {name} due to {e}",
            c.certificate_authority
        ));
    }
    errs
}

/// `validateAuthInfo`, plus the one conflict client-go's transport refuses (basic auth and
/// a bearer token).
fn validate_user(name: &str, u: &AuthInfo) -> Vec<String> {
    let mut errs = Vec::new();
    let mut methods = Vec::new();
    if !u.token.is_empty() {
        methods.push("token");
    }
    if !u.username.is_empty() || !u.password.is_empty() {
        methods.push("basicAuth");
    }
    if !u.client_certificate.is_empty() || !u.client_certificate_data.is_empty() {
        if !u.client_certificate.is_empty() && !u.client_certificate_data.is_empty() {
            errs.push(format!("client-cert-data and client-cert are both specified for {name}. client-cert-data will override."));
        }
        if !u.client_key.is_empty() && !u.client_key_data.is_empty() {
            errs.push(format!("client-key-data and client-key are both specified for {name}; client-key-data will override"));
        }
        if u.client_key.is_empty() && u.client_key_data.is_empty() {
            errs.push(format!("client-key-data or client-key must be specified for {name} to use the clientCert authentication method."));
        }
        for (what, path) in [
            ("client-cert", &u.client_certificate),
            ("client-key", &u.client_key),
        ] {
            if !path.is_empty()
                && let Err(e) = std::fs::File::open(path)
            {
                errs.push(format!(
                    "unable to read {what} {path} for {name} due to {e}"
                ));
            }
        }
    }
    if let Some(e) = &u.exec {
        errs.extend(validate_exec(name, u, e));
    }
    if methods.len() > 1 {
        errs.push(format!(
            "more than one authentication method found for {name}; found [{}], only one is allowed",
            methods.join(" ")
        ));
    }
    if !u.username.is_empty() && !u.token_file.is_empty() && u.token.is_empty() {
        errs.push("username/password or bearer token may be set, but not both".into());
    }
    let details = !u.impersonate_uid.is_empty()
        || !u.impersonate_groups.is_empty()
        || !u.impersonate_user_extra.is_empty();
    if details && u.impersonate.is_empty() {
        errs.push(format!(
            "requesting uid, groups or user-extra for {name} without impersonating a user"
        ));
    }
    errs
}

fn validate_exec(name: &str, u: &AuthInfo, e: &ExecConfig) -> Vec<String> {
    let mut errs = Vec::new();
    if u.auth_provider.is_some() {
        errs.push(format!(
            "authProvider cannot be provided in combination with an exec plugin for {name}"
        ));
    }
    if e.command.is_empty() {
        errs.push(format!(
            "command must be specified for {name} to use exec authentication plugin"
        ));
    }
    if e.api_version.is_empty() {
        errs.push(format!(
            "apiVersion must be specified for {name} to use exec authentication plugin"
        ));
    }
    if e.env.iter().any(|(k, _)| k.is_empty()) {
        errs.push(format!(
            "env variable name must be specified for {name} to use exec authentication plugin"
        ));
    }
    // client-go's defaulting: v1beta1 (and older) plugins default to IfAvailable.
    let mode = match e.interactive_mode.as_str() {
        "" if e.api_version != exec::V1 && !e.api_version.is_empty() => "IfAvailable",
        m => m,
    };
    match mode {
        "" => errs.push(format!(
            "interactiveMode must be specified for {name} to use exec authentication plugin"
        )),
        "Never" | "IfAvailable" | "Always" => {}
        other => errs.push(format!("invalid interactiveMode for {name}: \"{other}\"")),
    }
    errs
}

fn trust(c: &Cluster, where_: &str) -> Result<Trust, String> {
    let ca = if !c.certificate_authority_data.is_empty() {
        Some((
            c.certificate_authority_data.clone(),
            format!("{where_}: certificate-authority-data"),
        ))
    } else if !c.certificate_authority.is_empty() {
        let pem = std::fs::read(&c.certificate_authority).map_err(|e| {
            format!(
                "{where_}: cannot read certificate-authority '{}': {e}",
                c.certificate_authority
            )
        })?;
        let origin = format!(
            "{where_}: certificate-authority '{}'",
            c.certificate_authority
        );
        Some((pem, origin))
    } else {
        None
    };
    match (ca, c.insecure_skip_tls_verify) {
        (Some(_), true) => Err(format!(
            "{where_}: specifying a root certificates file with the insecure flag is not allowed"
        )),
        (Some((pem, origin)), false) => Ok(Trust::Pem { pem, origin }),
        (None, true) => {
            log::warn!(
                "{where_}: insecure-skip-tls-verify is set: the apiserver's certificate is NOT verified, anyone in the network path can read the token and forge answers"
            );
            Ok(Trust::Insecure)
        }
        (None, false) => Ok(Trust::Platform),
    }
}

fn identity(u: &AuthInfo, who: &str) -> Result<Option<Identity>, String> {
    let read = |data: &[u8], path: &str, what: &str| -> Result<Option<Vec<u8>>, String> {
        if !data.is_empty() {
            return Ok(Some(data.to_vec()));
        }
        if path.is_empty() {
            return Ok(None);
        }
        std::fs::read(path)
            .map(Some)
            .map_err(|e| format!("{who}: cannot read {what} '{path}': {e}"))
    };
    let cert = read(
        &u.client_certificate_data,
        &u.client_certificate,
        "client-certificate",
    )?;
    let key = read(&u.client_key_data, &u.client_key, "client-key")?;
    Ok(match (cert, key) {
        (Some(cert_pem), Some(key)) => Some(Identity {
            cert_pem,
            key_pem: Secret::new(String::from_utf8_lossy(&key).into_owned()),
            origin: who.to_string(),
        }),
        _ => None,
    })
}

fn impersonate(u: &AuthInfo) -> Option<Impersonate> {
    (!u.impersonate.is_empty()).then(|| Impersonate {
        user: u.impersonate.clone(),
        uid: u.impersonate_uid.clone(),
        groups: u.impersonate_groups.clone(),
        extra: u.impersonate_user_extra.clone(),
    })
}

/// The request credential, by client-go's precedence.
fn credential(u: &AuthInfo, c: &Cluster, server: &str, who: &str) -> Result<Credential, String> {
    if let Some(p) = &u.auth_provider {
        return Err(format!(
            "{who}: auth-provider '{p}' is not supported: use an exec credential plugin (client.authentication.k8s.io)"
        ));
    }
    let has_cert = (!u.client_certificate.is_empty() || !u.client_certificate_data.is_empty())
        && (!u.client_key.is_empty() || !u.client_key_data.is_empty());
    let token = Some(u.token.clone())
        .filter(|t| !t.is_empty())
        .map(Secret::new);
    let credential = if !u.token_file.is_empty() {
        // The file wins whenever it can be read (it rotates); the token is the fallback.
        Credential::TokenFile {
            path: PathBuf::from(&u.token_file),
            fallback: token,
        }
    } else if let Some(t) = token {
        Credential::Token(t)
    } else if !u.username.is_empty() {
        log::warn!(
            "{who}: basic authentication (username/password) is deprecated and insecure; prefer a token or client certificate"
        );
        Credential::Basic {
            username: u.username.clone(),
            password: Secret::new(u.password.clone()),
        }
    } else if let Some(e) = u.exec.as_ref().filter(|_| !has_cert) {
        // client-go runs a plugin only when no static credential is set.
        let info = e.provide_cluster_info.then(|| cluster_info(c, server));
        Credential::Exec(Box::new(plugin(e, info, who)?))
    } else {
        Credential::None
    };
    Ok(credential)
}

/// An exec plugin from a kubeconfig user, checked as client-go checks it.
fn plugin(e: &ExecConfig, cluster: Option<serde_json::Value>, who: &str) -> Result<Plugin, String> {
    if e.api_version != exec::V1 && e.api_version != exec::V1BETA1 {
        return Err(format!(
            "{who}: exec apiVersion '{}' is not supported (use {} or {})",
            e.api_version,
            exec::V1,
            exec::V1BETA1
        ));
    }
    if e.interactive_mode == "Always" {
        return Err(format!(
            "{who}: exec interactiveMode is Always, but cmpoll never runs interactively (use Never or IfAvailable)"
        ));
    }
    Ok(Plugin {
        api_version: e.api_version.clone(),
        command: e.command.clone(),
        args: e.args.clone(),
        env: e.env.clone(),
        install_hint: Some(e.install_hint.clone()).filter(|h| !h.is_empty()),
        cluster,
        origin: who.to_string(),
    })
}

/// The cluster extension handed to exec plugins as `spec.cluster.config`.
const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";

/// `spec.cluster` for a plugin with `provideClusterInfo`: client-go's `Cluster`, empty
/// fields left out.
fn cluster_info(c: &Cluster, server: &str) -> serde_json::Value {
    use base64::Engine as _;
    let mut m = serde_json::Map::new();
    m.insert("server".into(), server.into());
    if !c.tls_server_name.is_empty() {
        m.insert("tls-server-name".into(), c.tls_server_name.clone().into());
    }
    if c.insecure_skip_tls_verify {
        m.insert("insecure-skip-tls-verify".into(), true.into());
    }
    let ca = if !c.certificate_authority_data.is_empty() {
        Some(c.certificate_authority_data.clone())
    } else {
        std::fs::read(&c.certificate_authority).ok()
    };
    if let Some(pem) = ca {
        m.insert(
            "certificate-authority-data".into(),
            base64::engine::general_purpose::STANDARD.encode(pem).into(),
        );
    }
    if !c.proxy_url.is_empty() {
        m.insert("proxy-url".into(), c.proxy_url.clone().into());
    }
    if c.disable_compression {
        m.insert("disable-compression".into(), true.into());
    }
    if let Some(config) = c.extensions.get(EXEC_EXTENSION) {
        m.insert("config".into(), config.clone());
    }
    serde_json::Value::Object(m)
}

#[cfg(test)]
mod tests;
