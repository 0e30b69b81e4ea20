//! `--state-dir DIR`: what a hub under `--validate` must not forget when it restarts, so
//! that a restarted hub serves each object's last good version even when the cluster now
//! holds a version it refuses, and does not run the validator again on what it judged:
//! `DIR/validated.json`, each object's newest version that passed (its hash) and its
//! refused version (hash and why), rewritten when a verdict changes; and
//! `DIR/objects/KIND.NAMESPACE.NAME.json`, each object's good version as the apiserver
//! served it, rewritten when that changes (a new version passed, a label was edited) and
//! removed when the object goes. Every file is written atomically, mode 0600 (a Secret's
//! values are in its JSON), in a folder of mode 0700. Checked when read: an id the
//! apiserver would not allow, or a hash that is not one, is a start-up error naming the
//! file (remove the folder's content to start afresh); an object file no verdict names is
//! removed, and one that is not that object (`validated.rs`, which computes its hash from
//! the JSON, never takes it from the file) is not used.

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
}

/// Where object files are, in the state folder.
const OBJECTS: &str = "objects";

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
    /// The good version's JSON (a list item's form), as read at start.
    pub served: Option<Vec<u8>>,
}

/// The file, in the state folder.
#[derive(Clone)]
pub struct Memory {
    dir: PathBuf,
}

/// An object's id here: its kind's singular (`configmap`, `secret`), namespace and name.
pub fn id(kind: Resource, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}", kind.singular())
}

/// An object file's name: its id with `.` for `/` (a kind and a namespace hold no `.`).
fn file_name(id: &str) -> String {
    format!("{}.json", id.replace('/', "."))
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
            let file = dir.join(OBJECTS).join(file_name(&id));
            let served = match (good, fs::read(&file)) {
                (Some(_), Ok(json)) => Some(json),
                (_, Err(e)) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(format!(
                        "--state-dir: cannot read '{}': {e}",
                        file.display()
                    ));
                }
                _ => None,
            };
            out.insert(
                id,
                Remembered {
                    good,
                    refused,
                    served,
                },
            );
        }
        let objects = dir.join(OBJECTS);
        crate::atomic::create_dir(&objects, 0o700)
            .or_else(|e| if objects.is_dir() { Ok(()) } else { Err(e) })
            .map_err(|e| format!("--state-dir: cannot create '{}': {e}", objects.display()))?;
        // What no verdict names (an object gone while a save was lost): not kept.
        for entry in fs::read_dir(&objects).map_err(|e| format!("--state-dir: {e}"))? {
            let entry = entry.map_err(|e| format!("--state-dir: {e}"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let named = (out.iter()).any(|(id, r)| r.good.is_some() && file_name(id) == name);
            if !named {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok((
            Memory {
                dir: dir.to_path_buf(),
            },
            out,
        ))
    }

    /// Keeps `json`, the good version of object `id`.
    pub fn keep(&self, id: &str, json: &[u8]) -> Result<(), String> {
        let dir = self.dir.join(OBJECTS);
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let name = file_name(id);
        // Its own temporary name: the validator's threads and the poll's write at once.
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = format!(".{name}.{n}.tmp");
        crate::atomic::remove_if_exists(&dir.join(&tmp))
            .and_then(|()| crate::atomic::replace_file(&dir, &name, &tmp, json, 0o600))
            .map_err(|e| format!("cannot save '{}': {e}", dir.join(&name).display()))
    }

    /// Forgets object `id`'s good version.
    pub fn forget(&self, id: &str) -> Result<(), String> {
        let file = self.dir.join(OBJECTS).join(file_name(id));
        crate::atomic::remove_if_exists(&file)
            .map_err(|e| format!("cannot remove '{}': {e}", file.display()))
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
            let stored = Stored {
                good: r.good.map(|h| h.to_string()),
                refused: (r.refused.as_ref()).map(|(h, why)| StoredRefusal {
                    hash: h.to_string(),
                    reason: why.clone(),
                }),
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
        m.keep("configmap/ns/a", r.served.as_deref().unwrap())
            .unwrap();
        m.keep("configmap/ns/gone", b"{}").unwrap();
        let bare = Remembered {
            good: Some(Hash([3; 32])),
            ..Remembered::default()
        };
        let objects = [("configmap/ns/a", &r), ("secret/ns/b", &bare)];
        m.save(objects.into_iter()).unwrap();
        for f in [FILE, "objects/configmap.ns.a.json"] {
            let mode = fs::metadata(dir.path().join(f)).unwrap();
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
                0o600
            );
        }
        let (m, back) = Memory::open(dir.path()).unwrap();
        assert_eq!(back["configmap/ns/a"], r);
        assert_eq!(back["secret/ns/b"], bare);
        assert!(
            !dir.path().join("objects/configmap.ns.gone.json").exists(),
            "a file no verdict names is removed"
        );
        m.forget("configmap/ns/a").unwrap();
        let (_, back) = Memory::open(dir.path()).unwrap();
        assert_eq!(back["configmap/ns/a"].served, None);
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
