//! Kubeconfig files, loaded as client-go loads them (kubectl is the oracle).
//!
//! One file: YAML read with YAML 1.1 scalars as sigs.k8s.io/yaml reads them (`namespace:
//! no` is a boolean, not a string, and is refused), `clusters`/`users`/`contexts` may be
//! `null` or missing (what `kubectl config set-*` writes into a new file), any entry may
//! lack any key, a name used twice in one list is an error, `-data` fields are base64 and
//! decoded here, and relative paths (`certificate-authority`, `client-certificate`,
//! `client-key`, `tokenFile`, an exec `command` with a `/`) are joined to the absolute
//! folder of the file *as text* (`filepath.Abs` + `filepath.Join`: `..` is cleaned, never
//! resolved through a symlink). Several files (`KUBECONFIG=a:b`): missing ones are skipped,
//! the first file to name a cluster, user or context wins with its whole entry, and the
//! first non-empty `current-context` wins. Every entry remembers its file, for messages.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

/// A loaded (and possibly merged) kubeconfig.
#[derive(Clone, Debug, Default)]
pub struct Kubeconfig {
    pub clusters: BTreeMap<String, Named<Cluster>>,
    pub users: BTreeMap<String, Named<AuthInfo>>,
    pub contexts: BTreeMap<String, Named<Context>>,
    pub current_context: String,
    /// The files this config was read from, in order.
    pub files: Vec<PathBuf>,
}

/// A named entry and the file it came from.
#[derive(Clone, Debug)]
pub struct Named<T> {
    pub value: T,
    pub file: PathBuf,
}

#[derive(Clone, Debug, Default)]
pub struct Cluster {
    pub server: String,
    pub certificate_authority: String,
    pub certificate_authority_data: Vec<u8>,
    pub insecure_skip_tls_verify: bool,
    pub tls_server_name: String,
    pub proxy_url: String,
    pub disable_compression: bool,
    pub extensions: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default)]
pub struct AuthInfo {
    pub client_certificate: String,
    pub client_certificate_data: Vec<u8>,
    pub client_key: String,
    pub client_key_data: Vec<u8>,
    pub token: String,
    pub token_file: String,
    pub impersonate: String,
    pub impersonate_uid: String,
    pub impersonate_groups: Vec<String>,
    pub impersonate_user_extra: BTreeMap<String, Vec<String>>,
    pub username: String,
    pub password: String,
    /// Only its name: cmpoll refuses the legacy auth providers.
    pub auth_provider: Option<String>,
    pub exec: Option<ExecConfig>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExecConfig {
    pub api_version: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub install_hint: String,
    pub provide_cluster_info: bool,
    pub interactive_mode: String,
}

#[derive(Clone, Debug, Default)]
pub struct Context {
    pub cluster: String,
    pub user: String,
    pub namespace: String,
}

// --- the file format (client-go's clientcmd/api/v1 types, as much as cmpoll reads) -------

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct RawConfig {
    clusters: Option<Vec<Option<RawNamed<RawCluster>>>>,
    users: Option<Vec<Option<RawNamed<RawAuthInfo>>>>,
    contexts: Option<Vec<Option<RawNamed<RawContext>>>>,
    current_context: Option<String>,
}

#[derive(Deserialize)]
struct RawNamed<T> {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, alias = "cluster", alias = "user", alias = "context")]
    value: Option<T>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct RawCluster {
    server: Option<String>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
    tls_server_name: Option<String>,
    proxy_url: Option<String>,
    disable_compression: Option<bool>,
    extensions: Option<Vec<Option<RawExtension>>>,
}

#[derive(Deserialize)]
struct RawExtension {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    extension: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct RawAuthInfo {
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    #[serde(rename = "as")]
    impersonate: Option<String>,
    #[serde(rename = "as-uid")]
    impersonate_uid: Option<String>,
    #[serde(rename = "as-groups")]
    impersonate_groups: Option<Vec<String>>,
    #[serde(rename = "as-user-extra")]
    impersonate_user_extra: Option<BTreeMap<String, Option<Vec<String>>>>,
    username: Option<String>,
    password: Option<String>,
    auth_provider: Option<RawAuthProvider>,
    exec: Option<RawExec>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawAuthProvider {
    name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawExec {
    api_version: Option<String>,
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<Vec<Option<RawEnv>>>,
    install_hint: Option<String>,
    provide_cluster_info: Option<bool>,
    interactive_mode: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawEnv {
    name: Option<String>,
    value: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawContext {
    cluster: Option<String>,
    user: Option<String>,
    namespace: Option<String>,
}

/// Decodes a `-data` field as Go's `encoding/json` decodes a `[]byte` (standard base64;
/// line breaks ignored).
fn data(field: &str, v: Option<String>) -> Result<Vec<u8>, String> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let compact: String = v.chars().filter(|c| *c != '\n' && *c != '\r').collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| format!("{field}: illegal base64 data: {e}"))
}

/// Checks one list's names the way client-go's conversion does, and keys the entries.
fn named<R, T>(
    what: &str,
    list: Option<Vec<Option<RawNamed<R>>>>,
    file: &Path,
    convert: impl Fn(R) -> Result<T, String>,
) -> Result<BTreeMap<String, Named<T>>, String>
where
    R: Default,
{
    let mut out = BTreeMap::new();
    for n in list.into_iter().flatten().flatten() {
        let name = n.name.unwrap_or_default();
        if out.contains_key(&name) {
            return Err(format!(
                "duplicate name \"{name}\" in the {what} list (kubectl refuses it)"
            ));
        }
        let value =
            convert(n.value.unwrap_or_default()).map_err(|e| format!("{what} \"{name}\": {e}"))?;
        out.insert(
            name,
            Named {
                value,
                file: file.to_path_buf(),
            },
        );
    }
    Ok(out)
}

fn cluster(r: RawCluster) -> Result<Cluster, String> {
    let mut extensions = BTreeMap::new();
    for e in r.extensions.into_iter().flatten().flatten() {
        let name = e.name.unwrap_or_default();
        if extensions.contains_key(&name) {
            return Err(format!("duplicate extension name \"{name}\""));
        }
        extensions.insert(name, e.extension.unwrap_or(serde_json::Value::Null));
    }
    Ok(Cluster {
        server: r.server.unwrap_or_default(),
        certificate_authority: r.certificate_authority.unwrap_or_default(),
        certificate_authority_data: data(
            "certificate-authority-data",
            r.certificate_authority_data,
        )?,
        insecure_skip_tls_verify: r.insecure_skip_tls_verify.unwrap_or(false),
        tls_server_name: r.tls_server_name.unwrap_or_default(),
        proxy_url: r.proxy_url.unwrap_or_default(),
        disable_compression: r.disable_compression.unwrap_or(false),
        extensions,
    })
}

fn auth_info(r: RawAuthInfo) -> Result<AuthInfo, String> {
    let exec = r.exec.map(|e| ExecConfig {
        api_version: e.api_version.unwrap_or_default(),
        command: e.command.unwrap_or_default(),
        args: e.args.unwrap_or_default(),
        env: (e.env.into_iter().flatten().flatten())
            .map(|v| (v.name.unwrap_or_default(), v.value.unwrap_or_default()))
            .collect(),
        install_hint: e.install_hint.unwrap_or_default(),
        provide_cluster_info: e.provide_cluster_info.unwrap_or(false),
        interactive_mode: e.interactive_mode.unwrap_or_default(),
    });
    Ok(AuthInfo {
        client_certificate: r.client_certificate.unwrap_or_default(),
        client_certificate_data: data("client-certificate-data", r.client_certificate_data)?,
        client_key: r.client_key.unwrap_or_default(),
        client_key_data: data("client-key-data", r.client_key_data)?,
        token: r.token.unwrap_or_default(),
        token_file: r.token_file.unwrap_or_default(),
        impersonate: r.impersonate.unwrap_or_default(),
        impersonate_uid: r.impersonate_uid.unwrap_or_default(),
        impersonate_groups: r.impersonate_groups.unwrap_or_default(),
        impersonate_user_extra: (r.impersonate_user_extra.into_iter().flatten())
            .map(|(k, v)| (k, v.unwrap_or_default()))
            .collect(),
        username: r.username.unwrap_or_default(),
        password: r.password.unwrap_or_default(),
        auth_provider: r.auth_provider.map(|p| p.name.unwrap_or_default()),
        exec,
    })
}

fn context(r: RawContext) -> Result<Context, String> {
    Ok(Context {
        cluster: r.cluster.unwrap_or_default(),
        user: r.user.unwrap_or_default(),
        namespace: r.namespace.unwrap_or_default(),
    })
}

/// Go's `filepath.Clean`, on text: `.` and `x/..` elements removed, never looking at the
/// file system (so `..` is not resolved through a symlink).
pub fn clean(path: &Path) -> PathBuf {
    let mut out: Vec<Component> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir) => {}
                _ => out.push(c),
            },
            c => out.push(c),
        }
    }
    if out.is_empty() {
        return PathBuf::from(".");
    }
    out.iter().collect()
}

/// `filepath.Abs`: joined to the current folder if relative, then cleaned as text.
fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        clean(path)
    } else {
        let cwd = std::env::current_dir().unwrap_or_default();
        clean(&cwd.join(path))
    }
}

/// Joins a relative, non-empty path to `base` (client-go's `ResolvePaths`).
fn resolve(p: &mut String, base: &Path) {
    if !p.is_empty() && Path::new(p.as_str()).is_relative() {
        *p = clean(&base.join(&*p)).to_string_lossy().into_owned();
    }
}

impl Kubeconfig {
    /// Parses one file's text; `file` is where it came from (relative paths are joined to
    /// its folder).
    pub fn from_yaml(text: &str, file: &Path) -> Result<Kubeconfig, String> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            let options = serde_saphyr::options! { no_schema: true, with_snippet: false };
            serde_saphyr::from_str_with_options::<Option<RawConfig>>(text, options)
                .map_err(|e| {
                    e.to_string()
                        .trim_start_matches("error: ")
                        .trim()
                        .to_string()
                })?
                .unwrap_or_default()
        };
        let mut kc = Kubeconfig {
            clusters: named("clusters", raw.clusters, file, cluster)?,
            users: named("users", raw.users, file, auth_info)?,
            contexts: named("contexts", raw.contexts, file, context)?,
            current_context: raw.current_context.unwrap_or_default(),
            files: vec![file.to_path_buf()],
        };
        let base = absolute(file.parent().unwrap_or(Path::new(".")));
        for c in kc.clusters.values_mut() {
            resolve(&mut c.value.certificate_authority, &base);
        }
        for u in kc.users.values_mut() {
            let u = &mut u.value;
            resolve(&mut u.client_certificate, &base);
            resolve(&mut u.client_key, &base);
            resolve(&mut u.token_file, &base);
            if let Some(exec) = u.exec.as_mut()
                && exec.command.contains('/')
            {
                resolve(&mut exec.command, &base);
            }
        }
        Ok(kc)
    }

    /// Reads and parses one file; errors name it.
    pub fn read_from(path: &Path) -> Result<Kubeconfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read kubeconfig '{}': {e}", path.display()))?;
        Kubeconfig::from_yaml(&text, path)
            .map_err(|e| format!("kubeconfig '{}': {e}", path.display()))
    }

    /// Merges `next` into `self`: names and `current-context` already set here win.
    pub fn merge(mut self, next: Kubeconfig) -> Kubeconfig {
        for (k, v) in next.clusters {
            self.clusters.entry(k).or_insert(v);
        }
        for (k, v) in next.users {
            self.users.entry(k).or_insert(v);
        }
        for (k, v) in next.contexts {
            self.contexts.entry(k).or_insert(v);
        }
        if self.current_context.is_empty() {
            self.current_context = next.current_context;
        }
        self.files.extend(next.files);
        self
    }

    /// Reads and merges the files of a `KUBECONFIG` list (missing files are skipped, as
    /// kubectl skips them); an error if none exists.
    pub fn read_list(list: &str) -> Result<Kubeconfig, String> {
        let mut seen = Vec::new();
        for p in list.split(':').filter(|p| !p.is_empty()) {
            if !seen.contains(&p) {
                seen.push(p);
            }
        }
        let mut merged: Option<Kubeconfig> = None;
        for p in &seen {
            let path = Path::new(p);
            if !path.exists() {
                log::debug!("KUBECONFIG: skipping '{p}', which does not exist");
                continue;
            }
            let kc = Kubeconfig::read_from(path)?;
            merged = Some(match merged {
                None => kc,
                Some(m) => m.merge(kc),
            });
        }
        merged.ok_or_else(|| format!("KUBECONFIG='{list}': none of its files exists"))
    }

    /// A short name for messages: `kubeconfig 'a'` or `kubeconfig 'a:b'`.
    pub fn origin(&self) -> String {
        let files: Vec<String> = self.files.iter().map(|f| f.display().to_string()).collect();
        format!("kubeconfig '{}'", files.join(":"))
    }
}

#[cfg(test)]
mod tests;
