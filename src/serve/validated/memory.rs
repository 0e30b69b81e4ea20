//! `--state-dir DIR/validated.json`: what a hub under `--validate` must not forget when it
//! restarts — each object's newest version that passed (its hash), its refused version
//! (hash and why), and, for an object held back, the good version's JSON as the apiserver
//! sent it — so that a restarted hub serves the last good version instead of nothing and
//! does not run the validator again on what it judged. Written atomically, mode 0600 (a
//! Secret's values are in a held-back Secret's JSON). Checked when read: an id the
//! apiserver would not allow, a hash that is not one, or a good version whose JSON is not
//! that object at that hash (the hash is computed from the JSON, never taken from the
//! file) is a start-up error naming the file (remove it to start afresh).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::names;
use crate::poll::hash::Hash;
use crate::source::Resource;

const FILE: &str = "validated.json";

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Record {
    version: u32,
    objects: BTreeMap<String, Stored>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    good: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refused: Option<StoredRefusal>,
    /// The good version's JSON, while a newer one is held back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    served: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredRefusal {
    hash: String,
    reason: String,
}

/// What is remembered of one object (`kind/namespace/name`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Remembered {
    /// The newest version that passed.
    pub good: Option<Hash>,
    /// The newest version refused, and why.
    pub refused: Option<(Hash, String)>,
    /// The good version's JSON (a list item's form), kept while a newer one is held back.
    pub served: Option<Vec<u8>>,
}

/// The file, in the state folder.
pub struct Memory {
    dir: PathBuf,
}

/// An object's id here: its kind's singular (`configmap`, `secret`), namespace and name.
pub fn id(kind: Resource, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}", kind.singular())
}

/// The kind, namespace and name an id names, if it names one the apiserver allows.
pub fn parse_id(id: &str) -> Option<(Resource, &str, &str)> {
    let (kind, rest) = id.split_once('/')?;
    let kind = [Resource::ConfigMaps, Resource::Secrets]
        .into_iter()
        .find(|k| k.singular() == kind)?;
    let (ns, name) = rest.split_once('/')?;
    let valid = names::dns1123_label(ns).is_empty() && names::dns1123_subdomain(name).is_empty();
    valid.then_some((kind, ns, name))
}

impl Memory {
    /// Reads what an earlier run judged (nothing when the file is not there yet).
    pub fn open(dir: &Path) -> Result<(Memory, BTreeMap<String, Remembered>), String> {
        let path = dir.join(FILE);
        let fail = |e: String| {
            format!(
                "--state-dir: '{}' is not valid ({e}); remove it to start afresh",
                path.display()
            )
        };
        let record: Record = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Record::default(),
            Err(e) => {
                return Err(format!(
                    "--state-dir: cannot read '{}': {e}",
                    path.display()
                ));
            }
        };
        let mut out = BTreeMap::new();
        for (id, s) in record.objects {
            let at = |what: &str| fail(format!("{}: {what}", names::go_quote(&id)));
            parse_id(&id).ok_or_else(|| at("not kind/namespace/name"))?;
            let hash = |h: &str| Hash::parse(h).ok_or_else(|| at("not a hash"));
            let good = s.good.as_deref().map(hash).transpose()?;
            let refused = match s.refused {
                Some(r) => Some((hash(&r.hash)?, r.reason)),
                None => None,
            };
            if s.served.is_some() && good.is_none() {
                return Err(at("a served version without its hash"));
            }
            let remembered = Remembered {
                good,
                refused,
                served: s.served.map(String::into_bytes),
            };
            out.insert(id, remembered);
        }
        Ok((
            Memory {
                dir: dir.to_path_buf(),
            },
            out,
        ))
    }

    /// Replaces the file with `objects`.
    pub fn save<'a>(
        &self,
        objects: impl Iterator<Item = (&'a str, &'a Remembered)>,
    ) -> Result<(), String> {
        let mut record = Record {
            version: 1,
            objects: BTreeMap::new(),
        };
        for (id, r) in objects {
            let served = match &r.served {
                Some(json) => Some(
                    String::from_utf8(json.clone())
                        .map_err(|_| format!("{id}: its JSON is not UTF-8"))?,
                ),
                None => None,
            };
            let stored = Stored {
                good: r.good.map(|h| h.to_string()),
                refused: (r.refused.as_ref()).map(|(h, why)| StoredRefusal {
                    hash: h.to_string(),
                    reason: why.clone(),
                }),
                served,
            };
            record.objects.insert(id.to_string(), stored);
        }
        let bytes = serde_json::to_vec(&record).map_err(|e| e.to_string())?;
        let tmp = ".validated.json.tmp";
        crate::atomic::remove_if_exists(&self.dir.join(tmp))
            .and_then(|()| crate::atomic::replace_file(&self.dir, FILE, tmp, &bytes, 0o600))
            .map_err(|e| format!("cannot save '{}': {e}", self.dir.join(FILE).display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_saved_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (m, none) = Memory::open(dir.path()).unwrap();
        assert!(none.is_empty());
        let r = Remembered {
            good: Some(Hash([1; 32])),
            refused: Some((Hash([2; 32]), "bad\nline".into())),
            served: Some(br#"{"metadata":{"name":"a"}}"#.to_vec()),
        };
        let bare = Remembered {
            good: Some(Hash([3; 32])),
            ..Remembered::default()
        };
        let objects = [("configmap/ns/a", &r), ("secret/ns/b", &bare)];
        m.save(objects.into_iter()).unwrap();
        let mode = fs::metadata(dir.path().join(FILE)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        let (_, back) = Memory::open(dir.path()).unwrap();
        assert_eq!(back["configmap/ns/a"], r);
        assert_eq!(back["secret/ns/b"], bare);
    }

    #[test]
    fn a_hostile_or_broken_file_is_a_start_up_error_naming_it() {
        let h = format!("sha256:{}", "ab".repeat(32));
        for (bad, why) in [
            ("{".to_string(), "is not valid"),
            (
                r#"{"version":1,"objects":{"../x/y":{}}}"#.into(),
                "not kind/namespace/name",
            ),
            (
                r#"{"version":1,"objects":{"configmap/NS/y":{}}}"#.into(),
                "not kind/namespace/name",
            ),
            (
                r#"{"version":1,"objects":{"configmap/ns/y":{"good":"md5:1"}}}"#.into(),
                "not a hash",
            ),
            (
                r#"{"version":1,"objects":{"configmap/ns/y":{"served":"{}"}}}"#.into(),
                "without its hash",
            ),
            (
                format!(r#"{{"version":1,"objects":{{"configmap/ns/y":{{"good":"{h}","x":1}}}}}}"#),
                "unknown field",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(FILE), bad.as_bytes()).unwrap();
            let e = Memory::open(dir.path()).err().unwrap();
            assert!(e.starts_with("--state-dir: '"), "{e}");
            assert!(e.contains(why), "{bad}: {e}");
            assert!(e.contains("remove it to start afresh"), "{e}");
        }
    }
}
