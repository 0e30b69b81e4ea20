//! Snapshots: the module set of one complete poll, per module only what the diff and the
//! sinks need (uid, resourceVersion, hash, where its files are in the spool), never the
//! contents themselves. `batch::diff` turns one snapshot into the next.
//!
//! A snapshot is a sorted vector (`Modules`), not a tree: a poll collects its entries into
//! a vector anyway, and sorting that vector in place makes the snapshot without a second
//! copy or any per-node overhead; lookups are binary searches. Module ids live in one
//! arena string.

use sha2::{Digest as _, Sha256};

use super::hash::Hash;
use super::spool::Loc;
use crate::idmap::IdMap;

/// What a snapshot keeps of a module, in 56 bytes (a daemon holds two snapshots of every
/// module of the cluster while it polls): the hash, where its contents are in the spool,
/// and the object's resourceVersion (which tells a metadata list what changed). The uid,
/// the resourceVersion's text and the counts are in the spool record (`spool::Meta`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub hash: Hash,
    pub loc: Loc,
    pub resource_version: Rv,
}

/// A resourceVersion in 8 bytes: a canonical decimal below 2^63 (what the apiserver gives)
/// as its number, any other text as the top bit and 63 bits of its SHA-256. Two are equal
/// exactly when their texts are, but for a 2^-63 chance between two texts that are not
/// such numbers (made-up versions in `--manifests` files, which never asks whether an
/// object changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rv(u64);

const TEXT: u64 = 1 << 63;

impl Rv {
    pub fn new(s: &str) -> Rv {
        let canonical = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        match s.parse::<u64>() {
            Ok(n) if canonical && n < TEXT => Rv(n),
            _ => {
                let d = Sha256::digest(s.as_bytes());
                let top = u64::from_be_bytes(d[..8].try_into().expect("8 bytes"));
                Rv(TEXT | top)
            }
        }
    }
}

impl Rv {
    /// The number, for a resourceVersion the apiserver gave (a canonical decimal).
    pub fn number(self) -> Option<u64> {
        (self.0 & TEXT == 0).then_some(self.0)
    }
}

impl PartialEq<str> for Rv {
    fn eq(&self, other: &str) -> bool {
        *self == Rv::new(other)
    }
}

impl PartialEq<&str> for Rv {
    fn eq(&self, other: &&str) -> bool {
        *self == Rv::new(other)
    }
}

impl From<&str> for Rv {
    fn from(s: &str) -> Rv {
        Rv::new(s)
    }
}

/// Entries by module id (`namespace/name`), sorted by id (byte order = module-name order).
pub type Modules = IdMap<Entry>;

/// Sorts what a poll pushed; of two entries for one id, the later wins (warned).
pub fn sorted(mut m: Modules) -> Modules {
    for id in m.sort() {
        log::warn!("configmap {id} was listed twice; using the last one");
    }
    m
}

/// The modules of one complete poll, by `namespace/name` (byte order = module-name order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub modules: Modules,
}

impl Snapshot {
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }
}

/// A module id → (`namespace`, `name`): `namespace/name`, or `kind/namespace/name` when one
/// cmpoll lists both kinds (`Resources::id`).
pub fn split_id(id: &str) -> (&str, &str) {
    let (folder, name) = folder_of(id);
    (folder.rsplit('/').next().unwrap_or(folder), name)
}

/// A module id → (its folder in the `files` layout, `name`): (`namespace`, `name`), or
/// (`kind/namespace`, `name`) for a kind-qualified id.
pub fn folder_of(id: &str) -> (&str, &str) {
    id.rsplit_once('/').unwrap_or(("", id))
}

/// The longest name of one path element (Linux's `NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// The most bytes of a stem that leaves room for `.` and a sequence number of up to 16 hex
/// digits (a version folder of `--out-dir`, a staged validation), so a name never
/// outgrows `NAME_MAX` however many versions follow.
pub const STEM_MAX: usize = NAME_MAX - 17;

/// A name for things cmpoll makes for module `id` in at most `room` bytes: `NS.NAME`
/// where it fits, else its start cut and `~` with 16 hex digits of the SHA-256 of `id`
/// (a `~` is in no valid name, so the two forms never meet). A namespace may have 63
/// bytes and a name 253: `NS.NAME` alone can be longer than a path element may be.
pub fn stem(id: &str, room: usize) -> String {
    let dotted = id.replace('/', ".");
    if dotted.len() <= room {
        return dotted;
    }
    let digest = Sha256::digest(id.as_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let mut end = room.saturating_sub(1 + hash.len()).min(dotted.len());
    while !dotted.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}~{hash}", &dotted[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_equal_when_their_texts_are() {
        for (a, b, equal) in [
            ("184467120", "184467120", true),
            ("0", "0", true),
            ("12", "012", false),
            ("12", "13", false),
            ("9223372036854775807", "9223372036854775807", true),
            ("9223372036854775808", "9223372036854775808", true),
            ("18446744073709551616", "18446744073709551616", true),
            ("", "", true),
            ("", "0", false),
            ("v1", "v1", true),
            ("v1", "v2", false),
        ] {
            assert_eq!(Rv::new(a) == Rv::new(b), equal, "{a:?} {b:?}");
            assert_eq!(Rv::new(a) == b, equal, "{a:?} {b:?}");
        }
        assert_eq!(Rv::new("42"), Rv(42), "the apiserver's numbers as they are");
        assert_eq!(std::mem::size_of::<Entry>(), 56);
    }

    #[test]
    fn stems_fit_their_room_and_keep_long_names_apart() {
        assert_eq!(stem("ns/m", STEM_MAX), "ns.m");
        let a = format!("ns/{}x", "a".repeat(252));
        let b = format!("ns/{}y", "a".repeat(252));
        let (sa, sb) = (stem(&a, STEM_MAX), stem(&b, STEM_MAX));
        assert!(sa.len() <= STEM_MAX && sb.len() <= STEM_MAX);
        assert!(sa.starts_with("ns.aaaa") && sa.contains('~'), "{sa}");
        assert_ne!(sa, sb);
        assert!(stem(&a, 40).len() <= 40);
    }
}
