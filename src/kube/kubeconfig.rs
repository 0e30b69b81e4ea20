//! Kubeconfig files: the serde model, relative-path fix-up, and merging as kubectl merges
//! (`KUBECONFIG=a:b`: the first file to set a name wins, whole entries, never field by
//! field; the first `current-context` wins; each file's relative paths resolve against that
//! file's own folder). Only the fields cmpoll uses are modelled; fields it refuses
//! (`auth-provider`, impersonation) are modelled so it can refuse them by name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Kubeconfig {
    #[serde(default)]
    pub clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    pub users: Vec<NamedUser>,
    #[serde(default)]
    pub contexts: Vec<Named<Context>>,
    pub current_context: Option<String>,
    /// The files this config was read from, in order (for messages).
    #[serde(skip)]
    pub files: Vec<PathBuf>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Named<T> {
    pub name: String,
    #[serde(alias = "cluster", alias = "context")]
    pub value: T,
}

#[derive(Clone, Debug, Deserialize)]
pub struct NamedUser {
    pub name: String,
    #[serde(default)]
    pub user: Option<AuthInfo>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Cluster {
    pub server: Option<String>,
    pub certificate_authority: Option<String>,
    pub certificate_authority_data: Option<String>,
    pub insecure_skip_tls_verify: Option<bool>,
    pub tls_server_name: Option<String>,
    pub proxy_url: Option<String>,
    pub disable_compression: Option<bool>,
    #[serde(default)]
    pub extensions: Vec<NamedExtension>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct NamedExtension {
    pub name: String,
    pub extension: serde_json::Value,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct AuthInfo {
    pub token: Option<String>,
    #[serde(rename = "tokenFile")]
    pub token_file: Option<String>,
    pub client_certificate: Option<String>,
    pub client_certificate_data: Option<String>,
    pub client_key: Option<String>,
    pub client_key_data: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub exec: Option<ExecConfig>,
    pub auth_provider: Option<AuthProvider>,
    #[serde(rename = "as")]
    pub impersonate: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AuthProvider {
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecConfig {
    pub api_version: Option<String>,
    pub command: String,
    #[serde(default)]
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<ExecEnv>>,
    pub install_hint: Option<String>,
    #[serde(default)]
    pub provide_cluster_info: bool,
    pub interactive_mode: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ExecEnv {
    pub name: String,
    pub value: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Context {
    pub cluster: String,
    #[serde(default)]
    pub user: String,
    pub namespace: Option<String>,
}

/// Resolves `p` against `dir` unless it is absolute or empty.
fn resolve(p: &mut Option<String>, dir: &Path) {
    if let Some(path) = p.as_mut()
        && !path.is_empty()
        && Path::new(path).is_relative()
    {
        *path = dir.join(&*path).to_string_lossy().into_owned();
    }
}

impl Kubeconfig {
    /// Parses one file and resolves its relative paths against its folder.
    pub fn read_from(path: &Path) -> Result<Kubeconfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read kubeconfig '{}': {e}", path.display()))?;
        let mut kc = Kubeconfig::from_yaml(&text)
            .map_err(|e| format!("kubeconfig '{}': {e}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for c in &mut kc.clusters {
            resolve(&mut c.value.certificate_authority, dir);
        }
        for u in &mut kc.users {
            if let Some(user) = u.user.as_mut() {
                resolve(&mut user.token_file, dir);
                resolve(&mut user.client_certificate, dir);
                resolve(&mut user.client_key, dir);
                if let Some(exec) = user.exec.as_mut()
                    && exec.command.contains('/')
                {
                    let bare = exec.command.trim_start_matches("./");
                    let mut cmd = Some(bare.to_string());
                    resolve(&mut cmd, dir);
                    exec.command = cmd.unwrap_or_default();
                }
            }
        }
        kc.files = vec![path.to_path_buf()];
        Ok(kc)
    }

    pub fn from_yaml(text: &str) -> Result<Kubeconfig, String> {
        if text.trim().is_empty() {
            return Ok(Kubeconfig::default());
        }
        let options = serde_saphyr::options! { with_snippet: false };
        serde_saphyr::from_str_with_options(text, options).map_err(|e| {
            let msg = e.to_string();
            msg.trim_start_matches("error: ").trim().to_string()
        })
    }

    /// Merges `next` into `self`: entries and `current-context` already set here win.
    pub fn merge(mut self, next: Kubeconfig) -> Kubeconfig {
        fn add<T>(into: &mut Vec<T>, from: Vec<T>, name: impl Fn(&T) -> &str) {
            for item in from {
                if !into.iter().any(|i| name(i) == name(&item)) {
                    into.push(item);
                }
            }
        }
        add(&mut self.clusters, next.clusters, |c| &c.name);
        add(&mut self.users, next.users, |u| &u.name);
        add(&mut self.contexts, next.contexts, |c| &c.name);
        if self.current_context.as_deref().is_none_or(str::is_empty) {
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

    pub fn context(&self, name: &str) -> Option<&Context> {
        self.contexts
            .iter()
            .find(|c| c.name == name)
            .map(|c| &c.value)
    }

    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters
            .iter()
            .find(|c| c.name == name)
            .map(|c| &c.value)
    }

    pub fn user(&self, name: &str) -> Option<AuthInfo> {
        self.users
            .iter()
            .find(|u| u.name == name)
            .map(|u| u.user.clone().unwrap_or_default())
    }

    pub fn context_names(&self) -> Vec<&str> {
        self.contexts.iter().map(|c| c.name.as_str()).collect()
    }
}

/// Extension values by name (`clusters[].cluster.extensions`), for exec plugins.
pub fn extensions(cluster: &Cluster) -> BTreeMap<String, serde_json::Value> {
    cluster
        .extensions
        .iter()
        .map(|e| (e.name.clone(), e.extension.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../tests/fixtures/kube-api/kubeconfig-example.yaml");

    #[test]
    fn parses_the_example_with_every_field() {
        let kc = Kubeconfig::from_yaml(EXAMPLE).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("prod-poller"));
        let prod = kc.cluster("prod").unwrap();
        assert_eq!(
            prod.tls_server_name.as_deref(),
            Some("kubernetes.default.svc")
        );
        assert_eq!(
            extensions(prod)["client.authentication.k8s.io/exec"]["audience"],
            "06e3fbd18de8"
        );
        let exec = kc.user("poller-exec").unwrap().exec.unwrap();
        assert_eq!(exec.command, "cloud-auth-helper");
        assert_eq!(exec.args.unwrap(), ["token", "--cluster", "prod"]);
        assert!(exec.provide_cluster_info);
        assert_eq!(
            kc.context("prod-poller").unwrap().namespace.as_deref(),
            Some("team-a")
        );
        assert_eq!(
            kc.user("poller-token").unwrap().token_file.as_deref(),
            Some("/var/run/cm-poller/token")
        );
    }

    #[test]
    fn namespace_no_stays_a_string() {
        let kc = Kubeconfig::from_yaml(
            "contexts:\n- name: c\n  context: {cluster: x, user: y, namespace: no}\n",
        )
        .unwrap();
        assert_eq!(kc.context("c").unwrap().namespace.as_deref(), Some("no"));
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
        assert_eq!(kc.current_context.as_deref(), Some("one"));
        let u = kc.user("u").unwrap();
        assert_eq!(
            u.token, None,
            "whole entries: b's fields for u are discarded"
        );
        assert_eq!(
            u.token_file.unwrap(),
            dir.path().join("tok-a").to_string_lossy()
        );
        assert_eq!(
            kc.user("v").unwrap().token_file.as_deref(),
            Some("/abs/tok")
        );
        assert_eq!(
            kc.cluster("c")
                .unwrap()
                .certificate_authority
                .as_deref()
                .unwrap(),
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
}
