//! The module hash: `sha256:` + lowercase hex of SHA-256 over, for each file in key order,
//! the key bytes, one 0x00 byte, the content length as 8-byte big-endian, and the content.
//! Only content counts: labels, annotations, resourceVersion and uid never change it.

use std::fmt;

use sha2::{Digest, Sha256};

/// A module hash (the raw 32 bytes; `Display` gives the `sha256:<hex>` form).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    /// Hashes `(key, content)` pairs, which must already be in key byte order.
    pub fn of<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Hash {
        let mut h = Sha256::new();
        for (key, content) in files {
            h.update(key.as_bytes());
            h.update([0u8]);
            h.update((content.len() as u64).to_be_bytes());
            h.update(content);
        }
        Hash(h.finalize().into())
    }

    /// Reads the `sha256:<64 lowercase hex digits>` form back.
    pub fn parse(s: &str) -> Option<Hash> {
        let hex = s.strip_prefix("sha256:")?.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks(2).enumerate() {
            let d = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            };
            out[i] = d(pair[0])? << 4 | d(pair[1])?;
        }
        Some(Hash(out))
    }

    /// Whether `s` is this hash in the `sha256:<hex>` form (read, not made: no allocation).
    pub fn is(&self, s: &str) -> bool {
        Hash::parse(s).is_some_and(|h| h == *self)
    }

    /// The first `n` hex digits, for tables.
    pub fn short(&self, n: usize) -> String {
        let full = self.to_string();
        full[..(7 + n).min(full.len())].to_string()
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_vectors() {
        // Each expected value was computed independently with sha256sum over the framing,
        // e.g. printf 'a\0\0\0\0\0\0\0\0\1x' | sha256sum.
        type Files<'a> = &'a [(&'a str, &'a [u8])];
        let cases: &[(Files, &str)] = &[
            (
                &[],
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            ),
            (
                &[("a", b"x")],
                "d111bd52b5b0762b90ad7eee406879b07483b5f90f397270da284f6b377ff2f6",
            ),
            (
                &[("config.alloy", b"hello")],
                "47ef6f180a13cf569aacc4d213458160fbf543af3f66b25599290772c1205d19",
            ),
            (
                &[("a", b"x"), ("b", b"")],
                "c2f5a869a297306208aa880d8311741e8f11361ba51cc45273e57e6021b46585",
            ),
        ];
        for (files, want) in cases {
            let got = Hash::of(files.iter().map(|(k, c)| (*k, *c)));
            assert_eq!(got.to_string(), format!("sha256:{want}"));
        }
    }

    #[test]
    fn framing_separates_key_from_content() {
        assert_ne!(Hash::of([("ab", &b"c"[..])]), Hash::of([("a", &b"bc"[..])]));
        assert_eq!(Hash::of([]).short(12), "sha256:e3b0c44298fc");
        let h = Hash::of([("a", &b"x"[..])]);
        assert_eq!(Hash::parse(&h.to_string()), Some(h));
        for bad in [
            "",
            "sha256:",
            "md5:00",
            &h.to_string().to_uppercase(),
            &format!("{h}0"),
        ] {
            assert_eq!(Hash::parse(bad), None, "{bad}");
            assert!(!h.is(bad), "{bad}");
        }
        assert!(h.is(&h.to_string()));
        assert!(!Hash::of([]).is(&h.to_string()));
    }
}
