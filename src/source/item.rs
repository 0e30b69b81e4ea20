//! What a source produces: one selected ConfigMap with the keys `--keys` selects.

use super::selection::{Resource, Resources};

/// A file's content: `data` values are text, `binaryData` values are bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    Text(String),
    Binary(Vec<u8>),
}

impl Content {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Content::Text(s) => s.as_bytes(),
            Content::Binary(b) => b,
        }
    }

    pub fn is_binary(&self) -> bool {
        matches!(self, Content::Binary(_))
    }
}

/// One selected key of a ConfigMap: a file of its module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleFile {
    pub key: String,
    pub content: Content,
}

/// A ConfigMap (or Secret) as a source delivers it, not yet validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Item {
    pub kind: Resource,
    /// Listed with the other kind: its id starts with its kind.
    pub qualified: bool,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: Vec<(String, String)>,
    /// The selected keys, in any order.
    pub files: Vec<ModuleFile>,
    /// Keys of `data` and `binaryData` seen in all, selected or not.
    pub keys_seen: usize,
    /// What was wrong with the item while decoding it (bad base64, a repeated key).
    pub problems: Vec<String>,
    /// The value of the `--folder-annotation` annotation, when asked for and set.
    pub folder: Option<String>,
    /// The object as the apiserver served it, when the source was asked to keep it
    /// (`cmpoll serve` serves it again).
    pub raw: Option<RawObject>,
}

/// An object's JSON as the apiserver serves it in a list: every field as it came, without
/// `kind` and `apiVersion` (a GET's answer has them, a list's items do not). A Secret's
/// values are in it, so it never prints them: `Debug` gives its size only.
#[derive(Clone, PartialEq, Eq)]
pub struct RawObject {
    pub json: Box<[u8]>,
    /// Where its `metadata` value is in `json`.
    pub metadata: std::ops::Range<usize>,
}

impl std::fmt::Debug for RawObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawObject([REDACTED], {} bytes)", self.json.len())
    }
}

impl RawObject {
    /// Its `metadata` value.
    pub fn metadata(&self) -> &[u8] {
        &self.json[self.metadata.clone()]
    }
}

impl Item {
    /// `namespace/name`, or `kind/namespace/name` (see `Resources::id`).
    pub fn id(&self) -> String {
        Resources::listed_with(self.kind, self.qualified).id(self.kind, &self.namespace, &self.name)
    }
}
