//! Where the rollouts' state lives: one Secret (`--rollout-state`), read and written with
//! the apiserver's optimistic concurrency — created by POST (409 AlreadyExists: someone
//! was first), replaced by PUT with the `metadata.resourceVersion` it was read at (409: it
//! changed since) — so two hubs and a restarted hub agree without a consensus of their
//! own. `Store` is the seam: `KubeStore` over `kube::Client`, `MemoryStore` for tests.
//! Answers are read bounded; a Secret's data is never logged nor put in an error.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read as _;
#[cfg(test)]
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use serde::Deserialize;

use crate::kube::{self, client::Method};
#[cfg(test)]
use crate::locks::Recover as _;

/// What is read of an answer at most: a Secret holds at most 1 MiB of data, 4/3 of that
/// in base64, with its metadata (managedFields included) well within this.
pub const MAX_ANSWER: u64 = 3 << 20;

/// What an error quotes of the apiserver's message at most.
const MAX_MESSAGE: usize = 1024;

/// The Secret as read or written: its version and its data, decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Stored {
    pub resource_version: String,
    pub data: BTreeMap<String, Vec<u8>>,
}

impl fmt::Debug for Stored {
    /// The version and each key with its size: never the data.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: BTreeMap<&str, usize> = (self.data.iter())
            .map(|(k, v)| (k.as_str(), v.len()))
            .collect();
        f.debug_struct("Stored")
            .field("resource_version", &self.resource_version)
            .field("data (bytes)", &sizes)
            .finish()
    }
}

/// What a write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wrote {
    /// Written: the Secret as the apiserver answered (its new `resourceVersion`).
    Done(Stored),
    /// Someone else wrote first (or it was deleted since it was read): read it again and
    /// redo.
    Conflict,
}

/// The rollouts' state object.
pub trait Store: Send {
    /// The Secret, or None when it does not exist (404).
    fn read(&mut self) -> Result<Option<Stored>, String>;
    /// Creates it (`rv` None: POST; 409 AlreadyExists → Conflict) or replaces its data
    /// (`rv` Some: PUT with metadata.resourceVersion = rv; 409 → Conflict; 404, deleted
    /// since it was read → Conflict too: the next read finds it gone and creates it).
    fn write(
        &mut self,
        rv: Option<&str>,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Wrote, String>;
    /// Where it is, for messages: "secret NS/NAME".
    fn describe(&self) -> String;
}

/// The label every state Secret carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "cmpoll");

/// The Secret in the cluster, through cmpoll's client.
pub struct KubeStore {
    client: kube::Client,
    namespace: String,
    name: String,
}

impl KubeStore {
    /// The Secret `namespace`/`name`, reached with `client`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> KubeStore {
        KubeStore {
            client,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    fn collection(&self) -> String {
        format!("/api/v1/namespaces/{}/secrets", self.namespace)
    }

    /// A request's error as one line: what was asked, the apiserver's words (cut), and for
    /// a 403 the RBAC the hubs need.
    fn failed(&self, e: &kube::Error) -> String {
        let mut m = e.to_string();
        if m.len() > MAX_MESSAGE {
            let mut cut = MAX_MESSAGE;
            while !m.is_char_boundary(cut) {
                cut -= 1;
            }
            m.truncate(cut);
            m.push('…');
        }
        if e.code() == Some(403) {
            m.push_str(&format!(
                " (the hubs need get and update on secrets named {name} in namespace {ns}, and create on secrets in {ns}: a Role and RoleBinding there)",
                name = self.name,
                ns = self.namespace
            ));
        }
        m
    }

    /// `data` as the Secret to send: `type: Opaque`, labelled, at version `rv` for a PUT.
    fn body(&self, rv: Option<&str>, data: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let data: serde_json::Map<String, serde_json::Value> = (data.iter())
            .map(|(k, v)| (k.clone(), b64.encode(v).into()))
            .collect();
        let mut metadata = serde_json::json!({
            "name": self.name,
            "namespace": self.namespace,
            "labels": { MANAGED_BY.0: MANAGED_BY.1 },
        });
        if let Some(rv) = rv {
            metadata["resourceVersion"] = rv.into();
        }
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": "Opaque",
            "data": data,
        })
        .to_string()
        .into_bytes()
    }
}

impl Store for KubeStore {
    fn read(&mut self) -> Result<Option<Stored>, String> {
        let path = format!("{}/{}", self.collection(), self.name);
        let action = format!("read {}", self.describe());
        match self.client.get(&path, "application/json", &action) {
            Ok(body) => decoded(body, &action).map(Some),
            Err(e) if e.is_not_found("secrets", &self.name) => Ok(None),
            Err(e) => Err(self.failed(&e)),
        }
    }

    fn write(
        &mut self,
        rv: Option<&str>,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Wrote, String> {
        let body = self.body(rv, data);
        let content_type = "application/json";
        let (method, path, action) = match rv {
            None => (
                Method::Post { content_type, body },
                self.collection(),
                format!("create {}", self.describe()),
            ),
            Some(_) => (
                Method::Put { content_type, body },
                format!("{}/{}", self.collection(), self.name),
                format!("update {}", self.describe()),
            ),
        };
        match self.client.request(method, &path, content_type, &action) {
            Ok(body) => decoded(body, &action).map(Wrote::Done),
            Err(e) if e.code() == Some(409) => Ok(Wrote::Conflict),
            Err(e) if rv.is_some() && e.is_not_found("secrets", &self.name) => Ok(Wrote::Conflict),
            Err(e) => Err(self.failed(&e)),
        }
    }

    fn describe(&self) -> String {
        format!("secret {}/{}", self.namespace, self.name)
    }
}

/// A Secret's answer, read bounded: its version and its data, decoded.
fn decoded(mut body: kube::client::Body, action: &str) -> Result<Stored, String> {
    let mut bytes = Vec::new();
    (&mut body)
        .take(MAX_ANSWER + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| body.failure().io(e).to_string())?;
    if bytes.len() as u64 > MAX_ANSWER {
        return Err(format!(
            "cannot {action}: the answer is larger than {} MiB",
            MAX_ANSWER >> 20
        ));
    }
    parse(&bytes).map_err(|e| format!("cannot {action}: {e}"))
}

/// A Secret's JSON as the apiserver writes it. Errors name a key or a place, never a
/// value (serde's own messages may quote one).
fn parse(bytes: &[u8]) -> Result<Stored, String> {
    #[derive(Deserialize)]
    struct Secret {
        metadata: Meta,
        #[serde(default)]
        data: Option<BTreeMap<String, String>>,
    }
    #[derive(Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion", default)]
        resource_version: String,
    }
    let secret: Secret = serde_json::from_slice(bytes)
        .map_err(|e| format!("not a Secret (line {}, column {})", e.line(), e.column()))?;
    if secret.metadata.resource_version.is_empty() {
        return Err("a Secret without metadata.resourceVersion".into());
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut data = BTreeMap::new();
    for (k, v) in secret.data.unwrap_or_default() {
        let bytes = b64
            .decode(v.as_bytes())
            .map_err(|_| format!("data[{k}] is not base64"))?;
        data.insert(k, bytes);
    }
    Ok(Stored {
        resource_version: secret.metadata.resource_version,
        data,
    })
}

#[cfg(test)]
/// An in-memory Store for tests: its resourceVersion a counter, its conflicts the
/// apiserver's. Clones share the Secret (two hubs, one object); `fail` is each clone's own
/// (one hub cut off).
#[derive(Clone, Debug)]
pub struct MemoryStore {
    shared: Arc<Mutex<Shared>>,
    failing: Option<String>,
    namespace: String,
    name: String,
}

#[cfg(test)]
#[derive(Debug, Default)]
struct Shared {
    stored: Option<Stored>,
    version: u64,
}

#[cfg(test)]
impl Default for MemoryStore {
    /// `cmpoll/cmpoll-rollouts`, not yet created.
    fn default() -> MemoryStore {
        MemoryStore::new("cmpoll", "cmpoll-rollouts")
    }
}

#[cfg(test)]
impl MemoryStore {
    /// The Secret `namespace`/`name`, not yet created.
    pub fn new(namespace: &str, name: &str) -> MemoryStore {
        MemoryStore {
            shared: Arc::default(),
            failing: None,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// Every call of this handle fails with `why` (None: works again).
    pub fn fail(&mut self, why: Option<String>) {
        self.failing = why;
    }

    /// The Secret as it is now, whatever `fail` says.
    pub fn stored(&self) -> Option<Stored> {
        self.shared.lock().recover().stored.clone()
    }

    fn working(&self) -> Result<(), String> {
        match &self.failing {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
impl Store for MemoryStore {
    fn read(&mut self) -> Result<Option<Stored>, String> {
        self.working()?;
        Ok(self.stored())
    }

    fn write(
        &mut self,
        rv: Option<&str>,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Wrote, String> {
        self.working()?;
        let mut shared = self.shared.lock().recover();
        let current = shared.stored.as_ref().map(|s| s.resource_version.as_str());
        // As the apiserver: a create of what exists, a replace of another version or of
        // what is gone, conflict.
        let fresh = match (rv, current) {
            (None, None) => true,
            (Some(rv), Some(now)) => rv == now,
            _ => false,
        };
        if !fresh {
            return Ok(Wrote::Conflict);
        }
        shared.version += 1;
        let stored = Stored {
            resource_version: shared.version.to_string(),
            data: data.clone(),
        };
        shared.stored = Some(stored.clone());
        Ok(Wrote::Done(stored))
    }

    fn describe(&self) -> String {
        format!("secret {}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests;
