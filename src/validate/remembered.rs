//! `DIR/.cmpoll/rejected.json`: the modules `--validate` rejected, by module: the hash
//! refused, why, and the last good version (its uid and resourceVersion, its files as a
//! ConfigMap holds them: `data` text, `binaryData` base64), so that a restart keeps the
//! good version, announces it as it was, and does not validate the refused content again. Written atomically, mode
//! 0600 (a Secret's files may be in it). Checked when read: a module name or key the
//! apiserver would not allow is a start-up error naming the file (remove it to start
//! afresh); the good version's hash is computed from its files, never taken from the file.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::names;
use crate::poll::hash::Hash;
use crate::source::{Content, ModuleFile};

const FILE: &str = "rejected.json";

#[derive(Serialize, Deserialize, Default)]
struct Record {
    version: u32,
    modules: BTreeMap<String, Stored>,
}

#[derive(Serialize, Deserialize)]
struct Stored {
    hash: String,
    reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    good: Option<GoodRecord>,
}

/// The last good version, as a ConfigMap holds it.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GoodRecord {
    uid: String,
    resource_version: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    binary_data: BTreeMap<String, String>,
}

/// The last good version of a rejected module: what the sinks hold of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Good {
    pub uid: String,
    pub resource_version: String,
    /// In key order.
    pub files: Vec<ModuleFile>,
}

/// One remembered rejection: hash refused, reason, last good version.
pub type Rejection = (Hash, String, Option<Good>);

pub struct Remembered {
    dir: PathBuf,
}

impl Remembered {
    /// Reads what an earlier run rejected.
    pub fn open(dir: &Path) -> Result<(Remembered, BTreeMap<String, Rejection>), String> {
        let path = dir.join(FILE);
        let fail = |e: String| {
            format!(
                "--validate: '{}' is not valid ({e}); remove it to start afresh",
                path.display()
            )
        };
        let record: Record = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Record::default(),
            Err(e) => return Err(format!("--validate: cannot read '{}': {e}", path.display())),
        };
        let mut out = BTreeMap::new();
        for (id, e) in record.modules {
            let at = |what: String| fail(format!("{}: {what}", names::go_quote(&id)));
            // `ns/name`, or `kind/ns/name` when one cmpoll lists both kinds.
            let bare = match crate::source::Resource::named_in(&id) {
                Some(_) => id.split_once('/').map_or(id.as_str(), |(_, rest)| rest),
                None => id.as_str(),
            };
            let (ns, name) = bare
                .split_once('/')
                .ok_or_else(|| at("not ns/name".into()))?;
            if !names::dns1123_label(ns).is_empty() || !names::dns1123_subdomain(name).is_empty() {
                return Err(at("not a module name".into()));
            }
            let hash = Hash::parse(&e.hash).ok_or_else(|| at("not a hash".into()))?;
            let good = match e.good {
                None => None,
                Some(g) => {
                    let mut files = Vec::new();
                    let text = g.data.into_iter().map(|(k, v)| (k, Ok(Content::Text(v))));
                    let binary = g.binary_data.into_iter().map(|(k, b64)| {
                        let bytes = base64::engine::general_purpose::STANDARD.decode(b64);
                        (k, bytes.map(Content::Binary))
                    });
                    for (key, content) in text.chain(binary) {
                        if !names::config_map_key(&key).is_empty()
                            || files.iter().any(|f: &ModuleFile| f.key == key)
                        {
                            return Err(at(format!("key {}", names::go_quote(&key))));
                        }
                        let content = content.map_err(|_| at("a file is not base64".into()))?;
                        files.push(ModuleFile { key, content });
                    }
                    files.sort_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
                    Some(Good {
                        uid: g.uid,
                        resource_version: g.resource_version,
                        files,
                    })
                }
            };
            out.insert(id, (hash, e.reason, good));
        }
        Ok((
            Remembered {
                dir: dir.to_path_buf(),
            },
            out,
        ))
    }

    /// Replaces the record with these rejections.
    pub fn save<'a>(
        &self,
        entries: impl Iterator<Item = (&'a str, &'a Hash, &'a str, Option<&'a Good>)>,
    ) -> Result<(), String> {
        let mut record = Record {
            version: 1,
            modules: BTreeMap::new(),
        };
        for (id, hash, reason, good) in entries {
            let good = good.map(|g| {
                let mut r = GoodRecord {
                    uid: g.uid.clone(),
                    resource_version: g.resource_version.clone(),
                    data: BTreeMap::new(),
                    binary_data: BTreeMap::new(),
                };
                for f in &g.files {
                    match &f.content {
                        Content::Text(t) => r.data.insert(f.key.clone(), t.clone()),
                        Content::Binary(b) => r.binary_data.insert(
                            f.key.clone(),
                            base64::engine::general_purpose::STANDARD.encode(b),
                        ),
                    };
                }
                r
            });
            record.modules.insert(
                id.to_string(),
                Stored {
                    hash: hash.to_string(),
                    reason: reason.to_string(),
                    good,
                },
            );
        }
        let bytes = serde_json::to_vec_pretty(&record).map_err(|e| e.to_string())?;
        let tmp = ".rejected.json.tmp";
        crate::atomic::remove_if_exists(&self.dir.join(tmp))
            .and_then(|()| crate::atomic::replace_file(&self.dir, FILE, tmp, &bytes, 0o600))
            .map_err(|e| format!("cannot save '{}': {e}", self.dir.join(FILE).display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile_records() {
        let dir = tempfile::tempdir().unwrap();
        let (held, none) = Remembered::open(dir.path()).unwrap();
        assert!(none.is_empty());
        let good = Good {
            uid: "0d6e4a3c-0000-4000-8000-000000000001".into(),
            resource_version: "42".into(),
            files: vec![
                ModuleFile {
                    key: "a.yaml".into(),
                    content: Content::Text("ok\n".into()),
                },
                ModuleFile {
                    key: "b.bin".into(),
                    content: Content::Binary(vec![0, 255]),
                },
            ],
        };
        let h = Hash([3; 32]);
        held.save([("ns/m", &h, "bad expr", Some(&good))].into_iter())
            .unwrap();
        let (_, back) = Remembered::open(dir.path()).unwrap();
        let (hash, reason, files) = &back["ns/m"];
        assert_eq!((hash, reason.as_str()), (&h, "bad expr"));
        assert_eq!(
            files.as_ref(),
            Some(&good),
            "text stays text, bytes stay bytes"
        );
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(
            fs::metadata(dir.path().join(FILE)).unwrap().mode() & 0o777,
            0o600
        );
        // Issue 30: a kind-qualified id (`--resource configmaps,secrets`) reads back; a
        // restart of such a cmpoll with a rejection in the record was a start-up error.
        held.save(
            [
                ("secret/ns/m", &h, "exit 1", None),
                ("configmap/ns/m", &h, "x", None),
            ]
            .into_iter(),
        )
        .unwrap();
        let (_, back) = Remembered::open(dir.path()).unwrap();
        assert_eq!(
            back.keys().collect::<Vec<_>>(),
            ["configmap/ns/m", "secret/ns/m"]
        );
        for bad in [
            r#"{"version":1,"modules":{"../x/m":{"hash":"sha256:00","reason":""}}}"#,
            r#"{"version":1,"modules":{"pod/ns/m":{"hash":"sha256:0303030303030303030303030303030303030303030303030303030303030303","reason":""}}}"#,
            r#"{"version":1,"modules":{"secret/ns/m/x":{"hash":"sha256:0303030303030303030303030303030303030303030303030303030303030303","reason":""}}}"#,
            r#"{"version":1,"modules":{"ns/m":{"hash":"nope","reason":""}}}"#,
            r#"{"version":1,"modules":{"ns/m":{"hash":"sha256:0303030303030303030303030303030303030303030303030303030303030303","reason":"","good":{"uid":"","resourceVersion":"","data":{"../x":""}}}}}"#,
            r#"{"version":1,"modules":{"ns/m":{"hash":"sha256:0303030303030303030303030303030303030303030303030303030303030303","reason":"","good":{"uid":"","resourceVersion":"","data":{"k":""},"binaryData":{"k":""}}}}}"#,
            r#"{"version":1,"modules":{"ns/m":{"hash":"sha256:0303030303030303030303030303030303030303030303030303030303030303","reason":"","good":{"uid":"","resourceVersion":"","binaryData":{"k":"%%"}}}}}"#,
        ] {
            fs::write(dir.path().join(FILE), bad).unwrap();
            let e = Remembered::open(dir.path()).err().unwrap();
            assert!(
                e.contains("rejected.json") && e.contains("remove it"),
                "{e}"
            );
        }
    }
}
