//! What one module's entry of the output folder's record says: where its files lie
//! (`Written`: the hash, the mode, and `Placed`, one variant per layout), the digest of what
//! was written, the shared key lists; and how the record holds them in memory (`Modules`:
//! an 80-byte `Stored` a module, a concat file's name rebuilt from its id). `state.json`'s
//! format is `Wire`'s, unchanged by the memory form.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::idmap::IdMap;
use crate::names;
use crate::poll::hash::Hash;
use crate::poll::snapshot::{STEM_MAX, stem};

/// A SHA-256 of bytes cmpoll wrote: 32 bytes in memory, 64 hex digits in `state.json`.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Digest(pub [u8; 32]);

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Digest {
    pub fn parse(s: &str) -> Option<Digest> {
        if s.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Digest(out))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        Digest::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("{} is not a SHA-256", names::go_quote(&s)))
        })
    }
}

/// A module's hash as `state.json` has it: `sha256:HEX`, or `""` for none (a flat
/// module left between two versions by a failure).
mod module_hash {
    use super::*;

    pub fn serialize<S: Serializer>(h: &Option<Hash>, s: S) -> Result<S::Ok, S::Error> {
        match h {
            Some(h) => s.collect_str(h),
            None => s.serialize_str(""),
        }
    }

    /// Anything but a hash cmpoll writes is none: the module is then rewritten.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Hash>, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        Ok(Hash::parse(&s))
    }
}

/// A module's file names (the keys of a version folder), shared by every module with the
/// same ones: most modules of a cluster have the same few keys.
pub type Keys = Arc<[Box<str>]>;

/// `Keys` as a JSON array of strings.
pub(super) mod keys_list {
    use super::*;

    pub fn serialize<S: Serializer>(k: &Keys, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(k.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Keys, D::Error> {
        let v = Vec::<Box<str>>::deserialize(d)?;
        Ok(v.into())
    }
}

/// One `Keys` per distinct set of names.
#[derive(Debug, Default)]
pub struct Interner(HashSet<Keys>);

impl Interner {
    pub fn keys<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) -> Keys {
        let keys: Vec<Box<str>> = names.into_iter().map(Box::from).collect();
        self.intern(keys.into())
    }

    pub fn intern(&mut self, keys: Keys) -> Keys {
        if let Some(k) = self.0.get(&*keys) {
            return k.clone();
        }
        self.0.insert(keys.clone());
        keys
    }
}

fn no_keys(k: &Keys) -> bool {
    k.is_empty()
}

/// What cmpoll wrote for one module: the hash written (`None`: a flat write that failed
/// half-way left the module between two versions, and the next write finishes it), the
/// files' mode, and where they lie. In memory the record holds it as `Stored`; in
/// `state.json` and the journal, as `Wire`.
#[derive(Clone, Debug, PartialEq)]
pub struct Written {
    pub hash: Option<Hash>,
    pub mode: u32,
    pub placed: Placed,
}

/// Where a module's files lie: one variant per layout.
#[derive(Clone, Debug, PartialEq)]
pub enum Placed {
    /// `files`: the version folder under `.cmpoll/versions` the module's symlink points
    /// at, and its files.
    Version { version: Box<str>, files: Keys },
    /// `concat`: the file, relative to DIR, and the SHA-256 of its bytes, which proves
    /// after a crash that a file found there is the one cmpoll renamed into place.
    File {
        file: Box<str>,
        digest: Option<Digest>,
    },
    /// `flat`: each file `DIR/KEY` cmpoll wrote for the module, with the SHA-256 of its
    /// bytes (a file is only ever replaced or removed while it still has them). `left`:
    /// what another layout wrote for the module, recorded until it is cleared (a switch of
    /// layout whose first flat write failed half-way).
    Flat {
        files: BTreeMap<String, Digest>,
        left: Option<Box<Placed>>,
    },
}

/// No flat file.
static NO_FLAT: BTreeMap<String, Digest> = BTreeMap::new();

impl Placed {
    /// The version folder and its files (`files`, or what a flat write left of it).
    pub fn version(&self) -> Option<(&str, &Keys)> {
        match self {
            Placed::Version { version, files } => Some((version, files)),
            Placed::Flat { left: Some(l), .. } => l.version(),
            _ => None,
        }
    }

    /// The concatenated file and its digest (`concat`, or what a flat write left of it).
    pub fn file(&self) -> Option<(&str, Option<&Digest>)> {
        match self {
            Placed::File { file, digest } => Some((file, digest.as_ref())),
            Placed::Flat { left: Some(l), .. } => l.file(),
            _ => None,
        }
    }

    /// The flat files (none for another layout).
    pub fn flat(&self) -> &BTreeMap<String, Digest> {
        match self {
            Placed::Flat { files, .. } => files,
            _ => &NO_FLAT,
        }
    }

    /// What another layout wrote, still recorded: a flat module's `left`, else itself.
    fn other_layout(&self) -> Option<&Placed> {
        match self {
            Placed::Flat { left, .. } => left.as_deref(),
            other => Some(other),
        }
    }

    /// These flat files, keeping what another layout wrote (`self`'s, to be cleared).
    pub fn with_flat(&self, files: BTreeMap<String, Digest>) -> Placed {
        Placed::Flat {
            files,
            left: self.other_layout().cloned().map(Box::new),
        }
    }
}

impl Written {
    /// A flat write that stopped half-way: the flat files it got to (`files`), what
    /// another layout wrote for the module before (`old`'s, to be cleared later), and no
    /// hash: the module is neither its old version nor its new one.
    pub fn half_flat(old: Option<&Written>, mode: u32, files: BTreeMap<String, Digest>) -> Written {
        let placed = match old {
            Some(o) => o.placed.with_flat(files),
            None => Placed::Flat { files, left: None },
        };
        Written {
            hash: None,
            mode,
            placed,
        }
    }

    /// Records one more flat file written (a module of another layout becomes flat, what
    /// that layout wrote kept to be cleared).
    pub fn add_flat(&mut self, key: String, digest: Digest) {
        let mut files = self.placed.flat().clone();
        files.insert(key, digest);
        self.placed = self.placed.with_flat(files);
    }
}

/// A `Written` as `state.json` and the journal have it: one field per thing a layout
/// writes, absent where it has none (the format every cmpoll has written).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Wire {
    #[serde(with = "module_hash")]
    hash: Option<Hash>,
    mode: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<Box<str>>,
    #[serde(default, skip_serializing_if = "no_keys", with = "keys_list")]
    files: Keys,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<Box<str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest: Option<Digest>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    flat: BTreeMap<String, Digest>,
}

impl From<&Written> for Wire {
    fn from(w: &Written) -> Wire {
        let mut wire = Wire {
            hash: w.hash,
            mode: w.mode,
            flat: w.placed.flat().clone(),
            ..Wire::default()
        };
        if let Some((version, files)) = w.placed.version() {
            wire.version = Some(version.into());
            wire.files = files.clone();
        }
        if let Some((file, digest)) = w.placed.file() {
            wire.file = Some(file.into());
            wire.digest = digest.copied();
        }
        wire
    }
}

impl From<Wire> for Written {
    /// A version folder makes it `files`, a file `concat`; flat files beside either are a
    /// flat write's, which left the other layout's record to be cleared.
    fn from(w: Wire) -> Written {
        let other = match (w.version, w.file) {
            (Some(version), _) => Some(Placed::Version {
                version,
                files: w.files,
            }),
            (None, Some(file)) => Some(Placed::File {
                file,
                digest: w.digest,
            }),
            (None, None) => None,
        };
        let placed = match other {
            Some(p) if w.flat.is_empty() => p,
            left => Placed::Flat {
                files: w.flat,
                left: left.map(Box::new),
            },
        };
        Written {
            hash: w.hash,
            mode: w.mode,
            placed,
        }
    }
}

impl Serialize for Written {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Wire::from(self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Written {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Written, D::Error> {
        Wire::deserialize(d).map(Written::from)
    }
}

/// A `Written` as the record holds it in memory, one per module of the folder, so kept
/// small (80 bytes): what `plan` names from the module id is kept without the name — a
/// `files` module's version folder as its sequence number (and its keys), a `concat`
/// module's file as the index of its suffix (the folder's `--ext`, in `Modules::suffixes`)
/// beside its digest; anything else (the flat layout, an older cmpoll's names) is boxed
/// aside.
#[derive(Clone, Debug, PartialEq)]
struct Stored {
    hash: Option<Hash>,
    mode: u32,
    place: Place,
}

#[derive(Clone, Debug, PartialEq)]
enum Place {
    /// `files`: the version folder `stem(id).SEQ` (SEQ in hex, never 0) and its files.
    Version { seq: u64, files: Keys },
    /// `concat`: the file `NS.NAME` (the id, `/` made `.`) and `Modules::suffixes[suffix]`.
    File { suffix: u16, digest: Option<Digest> },
    /// Anything else, as it is.
    Other(Box<Placed>),
}

/// The version folder name `plan` gives `id` at `seq`.
pub fn version_of(id: &str, seq: u64) -> String {
    format!("{}.{seq:x}", stem(id, STEM_MAX))
}

/// `ns/name` → `ns.name`: the start of a concat file's name.
fn dotted(id: &str) -> String {
    id.replace('/', ".")
}

impl Stored {
    fn new(id: &str, w: Written, suffixes: &mut Vec<Box<str>>) -> Stored {
        let place = match w.placed {
            Placed::Version { version, files } => {
                let seq = (version.rsplit_once('.'))
                    .and_then(|(_, hex)| u64::from_str_radix(hex, 16).ok())
                    .filter(|&seq| seq != 0 && *version == *version_of(id, seq));
                match seq {
                    Some(seq) => Place::Version { seq, files },
                    None => Place::Other(Box::new(Placed::Version { version, files })),
                }
            }
            Placed::File { file, digest } => {
                let suffix =
                    (file.strip_prefix(&*dotted(id))).and_then(|s| Self::suffix(s, suffixes));
                match suffix {
                    Some(suffix) => Place::File { suffix, digest },
                    None => Place::Other(Box::new(Placed::File { file, digest })),
                }
            }
            other => Place::Other(Box::new(other)),
        };
        Stored {
            hash: w.hash,
            mode: w.mode,
            place,
        }
    }

    /// The index of `suffix` in `suffixes`, added if new (`None`: the table is full, which
    /// a folder with one `--ext` never comes near).
    fn suffix(suffix: &str, suffixes: &mut Vec<Box<str>>) -> Option<u16> {
        let at = match suffixes.iter().position(|s| **s == *suffix) {
            Some(at) => at,
            None => {
                suffixes.push(suffix.into());
                suffixes.len() - 1
            }
        };
        u16::try_from(at).ok()
    }

    fn written(&self, id: &str, suffixes: &[Box<str>]) -> Written {
        let placed = match &self.place {
            Place::Version { seq, files } => Placed::Version {
                version: version_of(id, *seq).into(),
                files: files.clone(),
            },
            Place::File { suffix, digest } => Placed::File {
                file: format!(
                    "{}{}",
                    dotted(id),
                    suffixes.get(usize::from(*suffix)).map_or("", |s| &**s)
                )
                .into(),
                digest: *digest,
            },
            Place::Other(p) => (**p).clone(),
        };
        Written {
            hash: self.hash,
            mode: self.mode,
            placed,
        }
    }
}

/// The record's modules by id: each given and taken as a `Written`, held as a `Stored`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Modules {
    by_id: IdMap<Stored>,
    /// The suffixes of concat files' names (one in a folder with one `--ext`).
    suffixes: Vec<Box<str>>,
}

impl Modules {
    pub fn get(&self, id: &str) -> Option<Written> {
        (self.by_id.get(id)).map(|s| s.written(id, &self.suffixes))
    }

    #[cfg(test)]
    pub fn contains_key(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    /// Inserts or replaces; what was replaced.
    pub fn insert(&mut self, id: &str, w: Written) -> Option<Written> {
        let stored = Stored::new(id, w, &mut self.suffixes);
        let old = self.by_id.insert(id, stored);
        old.map(|s| s.written(id, &self.suffixes))
    }

    pub fn remove(&mut self, id: &str) -> Option<Written> {
        (self.by_id.remove(id)).map(|s| s.written(id, &self.suffixes))
    }

    /// Changes the record of `id`, if there is one.
    pub fn update(&mut self, id: &str, change: impl FnOnce(&mut Written)) {
        if let Some(mut w) = self.get(id) {
            change(&mut w);
            self.insert(id, w);
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.by_id.keys()
    }

    /// In id order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Written)> {
        (self.by_id.iter()).map(|(id, s)| (id, s.written(id, &self.suffixes)))
    }

    /// Shares the key lists of modules with the same keys (after loading).
    pub fn intern(&mut self, interner: &mut Interner) {
        for s in self.by_id.values_mut() {
            match &mut s.place {
                Place::Version { files, .. } => *files = interner.intern(files.clone()),
                Place::Other(p) => {
                    if let Placed::Version { files, .. } = &mut **p {
                        *files = interner.intern(files.clone());
                    }
                }
                Place::File { .. } => {}
            }
        }
    }
}

impl Serialize for Modules {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Modules {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Modules, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Modules;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of module names to what was written")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Modules, A::Error> {
                let mut m = Modules::default();
                while let Some((id, w)) = a.next_entry::<std::borrow::Cow<'de, str>, Written>()? {
                    m.insert(&id, w);
                }
                Ok(m)
            }
        }
        d.deserialize_map(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each layout's record, and the mix a flat write that failed half-way leaves after a
    /// switch of layout, reads into its variant and is written back byte for byte as the
    /// format every cmpoll has written.
    #[test]
    fn every_layout_keeps_the_format_on_disk() {
        let d0 = "00".repeat(32);
        let d1 = "11".repeat(32);
        let h = format!("sha256:{}", "ab".repeat(32));
        for (json, layout) in [
            (
                format!(r#"{{"hash":"{h}","mode":420,"version":"ns.m.2","files":["a","b"]}}"#),
                "files",
            ),
            (
                format!(r#"{{"hash":"{h}","mode":420,"file":"ns.m.conf","digest":"{d0}"}}"#),
                "concat",
            ),
            (
                format!(r#"{{"hash":"{h}","mode":384,"flat":{{"a":"{d0}","x/b":"{d1}"}}}}"#),
                "flat",
            ),
            (
                format!(
                    r#"{{"hash":"","mode":420,"version":"ns.m.2","files":["a"],"flat":{{"a":"{d0}"}}}}"#
                ),
                "half flat over files",
            ),
            (
                format!(
                    r#"{{"hash":"","mode":420,"file":"ns.m.conf","digest":"{d0}","flat":{{"a":"{d1}"}}}}"#
                ),
                "half flat over concat",
            ),
        ] {
            let w: Written = serde_json::from_str(&json).unwrap();
            let variant = match &w.placed {
                Placed::Version { .. } => "files",
                Placed::File { .. } => "concat",
                Placed::Flat { left: None, .. } => "flat",
                Placed::Flat { left: Some(l), .. } => match **l {
                    Placed::Version { .. } => "half flat over files",
                    _ => "half flat over concat",
                },
            };
            assert_eq!(variant, layout, "{json}");
            assert_eq!(serde_json::to_string(&w).unwrap(), json, "{layout}");
            let mut m = Modules::default();
            m.insert("ns/m", w.clone());
            assert_eq!(m.get("ns/m"), Some(w), "{layout}: the compact form");
        }
    }

    /// In memory a module's record is small, and it is given back exactly as it was
    /// taken, whatever its layout or the age of its version folder's name.
    #[test]
    fn the_compact_form_gives_back_what_it_took() {
        assert!(std::mem::size_of::<Stored>() <= 80);
        let mut suffixes = Vec::new();
        let keys: Keys = vec![Box::from("a.conf")].into();
        let long = format!("ns/{}", "n".repeat(253));
        let cases = [
            // (id, version folder, held as a number)
            ("ns/m", Some(version_of("ns/m", 0x2f)), true),
            (long.as_str(), Some(version_of(&long, 7)), true),
            // As a cmpoll before bounded names had it, and names that are not `plan`'s.
            (
                long.as_str(),
                Some(format!("ns.{}.7", "n".repeat(253))),
                false,
            ),
            ("ns/m", Some("ns.m.07".into()), false),
            ("ns/m", Some("ns.m.0".into()), false),
        ];
        for (id, version, number) in cases {
            let w = Written {
                hash: Some(Hash([3; 32])),
                mode: 0o640,
                placed: Placed::Version {
                    version: version.unwrap().into(),
                    files: keys.clone(),
                },
            };
            let stored = Stored::new(id, w.clone(), &mut suffixes);
            assert_eq!(stored.written(id, &suffixes), w, "{:?}", w.placed);
            let compact = matches!(stored.place, Place::Version { .. });
            assert_eq!(compact, number, "{:?}", w.placed);
        }
        // A concat file named from its id is kept as its suffix's index and its digest,
        // any other name as it is.
        for (id, file, compact) in [
            ("ns/c", "ns.c.conf", true),
            ("configmap/ns/c", "configmap.ns.c.alloy", true),
            ("ns/x", "ns.x", true),
            ("ns/c", "other.conf", false),
        ] {
            let w = Written {
                hash: Some(Hash([4; 32])),
                mode: 0o644,
                placed: Placed::File {
                    file: file.into(),
                    digest: Some(Digest([1; 32])),
                },
            };
            let stored = Stored::new(id, w.clone(), &mut suffixes);
            assert_eq!(stored.written(id, &suffixes), w, "{file}");
            assert_eq!(
                matches!(stored.place, Place::File { .. }),
                compact,
                "{file}"
            );
        }
        assert_eq!(suffixes.len(), 3, "{suffixes:?}: one per --ext");
        let concat = Written {
            hash: None,
            mode: 0,
            placed: Placed::File {
                file: "ns.c.conf".into(),
                digest: Some(Digest([1; 32])),
            },
        };
        let flat = Written {
            hash: None,
            mode: 0,
            placed: Placed::Flat {
                files: [("k".to_string(), Digest([2; 32]))].into(),
                left: None,
            },
        };
        let mut m = Modules::default();
        for (id, w) in [("ns/c", &concat), ("ns/f", &flat)] {
            m.insert(id, w.clone());
            assert_eq!(m.get(id).as_ref(), Some(w));
        }
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Modules>(&json).unwrap(), m);
    }
}
