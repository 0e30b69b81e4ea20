//! Snapshots: the module set of one complete poll, per module only what the diff and the
//! sinks need (uid, resourceVersion, hash, where its files are in the spool), never the
//! contents themselves. `event::diff` turns one snapshot into the next.
//!
//! A snapshot is a sorted vector (`Modules`), not a tree: a poll collects its entries into
//! a vector anyway, and sorting that vector in place makes the snapshot without a second
//! copy or any per-node overhead; lookups are binary searches. Module ids live in one
//! arena string.

use std::fmt;

use super::hash::Hash;
use super::spool::Loc;
use crate::idmap::IdMap;

/// What a snapshot keeps of a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub uid: Ident,
    pub resource_version: Ident,
    pub hash: Hash,
    pub loc: Loc,
    pub files: u32,
    pub bytes: u64,
}

/// A uid or resourceVersion, kept small: snapshots hold one of each per module. A
/// canonical lowercase UUID (what the apiserver gives as uid) is 16 bytes, a canonical
/// decimal number (what it gives as resourceVersion) a `u64`, anything else its text. It
/// shows, and compares, as the text it was made from.
#[derive(Clone, PartialEq, Eq)]
pub enum Ident {
    Uuid([u8; 16]),
    Number(u64),
    Text(Box<str>),
}

impl Ident {
    pub fn new(s: &str) -> Ident {
        let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if digits
            && (s == "0" || !s.starts_with('0'))
            && let Ok(n) = s.parse()
        {
            return Ident::Number(n);
        }
        if let Some(bytes) = uuid(s) {
            return Ident::Uuid(bytes);
        }
        Ident::Text(s.into())
    }
}

/// The 16 bytes of a canonical lowercase UUID (`8-4-4-4-12` hex digits).
fn uuid(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    let mut out = [0u8; 16];
    let mut hex = b.iter().filter(|&&c| c != b'-');
    for byte in &mut out {
        let mut v = 0u8;
        for _ in 0..2 {
            let c = *hex.next()?;
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                _ => return None,
            };
            v = v << 4 | d;
        }
        *byte = v;
    }
    Some(out)
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ident::Number(n) => write!(f, "{n}"),
            Ident::Text(t) => f.write_str(t),
            Ident::Uuid(b) => {
                for (i, byte) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl PartialEq<str> for Ident {
    fn eq(&self, other: &str) -> bool {
        match self {
            Ident::Text(t) => &**t == other,
            _ => *self == Ident::new(other),
        }
    }
}

impl PartialEq<&str> for Ident {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl From<&str> for Ident {
    fn from(s: &str) -> Ident {
        Ident::new(s)
    }
}

impl From<String> for Ident {
    fn from(s: String) -> Ident {
        Ident::new(&s)
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

/// `namespace/name` → (`namespace`, `name`).
pub fn split_id(id: &str) -> (&str, &str) {
    id.split_once('/').unwrap_or(("", id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idents_are_compact_and_show_as_given() {
        for (text, compact) in [
            ("184467120", true),
            ("0", true),
            ("6f1c2d3e-8a9b-4c5d-9e0f-1a2b3c4d5e6f", true),
            ("007", false),
            ("6F1C2D3E-8A9B-4C5D-9E0F-1A2B3C4D5E6F", false),
            ("6f1c2d3e-8a9b-4c5d-9e0f-1a2b3c4d5e6", false),
            ("18446744073709551616", false),
            ("", false),
            ("uid-a", false),
        ] {
            let id = Ident::new(text);
            assert_eq!(id.to_string(), text);
            assert!(id == text, "{text}");
            assert_eq!(!matches!(id, Ident::Text(_)), compact, "{text}");
        }
        assert!(Ident::new("12") != "012");
        assert!(Ident::new("uid-a") != "uid-b");
        assert!(std::mem::size_of::<Ident>() <= 24);
    }
}
