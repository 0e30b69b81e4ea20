//! The messages of grafana's `collector.v1.CollectorService` (alloy-remote-config v0.0.12's
//! `collector.proto`) the hub reads and writes: `GetConfigRequest`,
//! `RegisterCollectorRequest` and `UnregisterCollectorRequest` decoded, `GetConfigResponse`
//! encoded (the other two responses are empty messages: no bytes). Decoding is strict where
//! a wrong byte would mean something else and lenient where proto3 is: unknown fields are
//! skipped, a repeated field's last value wins, an enum value nobody knows is kept as a
//! number; but every string must be UTF-8, and each is bounded (an id, a name, a hash, an
//! attribute's key and value, a status message, and the count of attributes): a request
//! over a bound is refused whole, with a line naming the field. `effective_config` (the
//! whole content echoed after each load) is skipped unread.

use std::collections::BTreeMap;

use super::wire::{Reader, Value, Writer};

/// A collector's id, at most (Alloy's default is a UUID).
pub const MAX_ID: usize = 256;
/// A collector's name (`RegisterCollector` only), at most.
pub const MAX_NAME: usize = 256;
/// The hash a collector echoes, at most (the hub's own: 64 hex digits).
pub const MAX_HASH: usize = 128;
/// Attributes one request may carry, both maps together, repeats counted.
pub const MAX_ATTRIBUTES: usize = 64;
/// An attribute's key, at most.
pub const MAX_KEY: usize = 256;
/// An attribute's value, at most.
pub const MAX_VALUE: usize = 1024;
/// A status's error message, at most (Alloy's diagnostics, joined).
pub const MAX_MESSAGE: usize = 64 << 10;

/// A collector's attributes: `collector.os`, `collector.version` and its block's own.
pub type Attributes = BTreeMap<String, String>;

/// `RemoteConfigStatuses`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Unset,
    Applied,
    Applying,
    Failed,
    /// A value of a later proto.
    Other(u64),
}

impl Status {
    fn of(v: u64) -> Status {
        match v {
            0 => Status::Unset,
            1 => Status::Applied,
            2 => Status::Applying,
            3 => Status::Failed,
            n => Status::Other(n),
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Status::Unset => "unset",
            Status::Applied => "applied",
            Status::Applying => "applying",
            Status::Failed => "failed",
            Status::Other(_) => "unknown",
        }
    }
}

/// `RemoteConfigStatus`: what the collector made of the content it was last sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reported {
    pub status: Status,
    pub message: String,
}

/// `GetConfigRequest`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GetConfig {
    pub id: String,
    /// `local_attributes` over the deprecated `attributes`.
    pub attributes: Attributes,
    /// The hash the hub last sent this collector, echoed (`""` after its start).
    pub hash: String,
    /// Sent only when it changed since the collector's last request.
    pub status: Option<Reported>,
}

/// `RegisterCollectorRequest`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Register {
    pub id: String,
    pub name: String,
    pub attributes: Attributes,
}

/// `UnregisterCollectorRequest`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unregister {
    pub id: String,
}

/// `GetConfigResponse`, encoded: `content` (field 1), `hash` (2), `not_modified` (3).
pub fn get_config_response(content: &str, hash: &str, not_modified: bool) -> Vec<u8> {
    let mut w = Writer {
        out: Vec::with_capacity(content.len() + hash.len() + 16),
    };
    w.bytes(1, content.as_bytes());
    w.bytes(2, hash.as_bytes());
    w.bool(3, not_modified);
    w.out
}

impl GetConfig {
    pub fn decode(b: &[u8]) -> Result<GetConfig, String> {
        let mut m = GetConfig::default();
        let (mut deprecated, mut local, mut count) = (Attributes::new(), Attributes::new(), 0);
        let mut r = Reader::new(b);
        while let Some(f) = r.field() {
            match f? {
                (1, v) => m.id = string(v, "id", MAX_ID)?,
                (2, v) => entry(v, "attributes", &mut deprecated, &mut count)?,
                (3, v) => m.hash = string(v, "hash", MAX_HASH)?,
                (4, v) => entry(v, "local_attributes", &mut local, &mut count)?,
                (5, v) => m.status = Some(reported(bytes(v, "remote_config_status")?)?),
                // 6, effective_config: the content echoed; nothing the hub reads.
                _ => {}
            }
        }
        deprecated.extend(local);
        m.attributes = deprecated;
        Ok(m)
    }
}

impl Register {
    pub fn decode(b: &[u8]) -> Result<Register, String> {
        let mut m = Register::default();
        let (mut deprecated, mut local, mut count) = (Attributes::new(), Attributes::new(), 0);
        let mut r = Reader::new(b);
        while let Some(f) = r.field() {
            match f? {
                (1, v) => m.id = string(v, "id", MAX_ID)?,
                (2, v) => entry(v, "attributes", &mut deprecated, &mut count)?,
                (3, v) => m.name = string(v, "name", MAX_NAME)?,
                (4, v) => entry(v, "local_attributes", &mut local, &mut count)?,
                _ => {}
            }
        }
        deprecated.extend(local);
        m.attributes = deprecated;
        Ok(m)
    }
}

impl Unregister {
    pub fn decode(b: &[u8]) -> Result<Unregister, String> {
        let mut m = Unregister::default();
        let mut r = Reader::new(b);
        while let Some(f) = r.field() {
            if let (1, v) = f? {
                m.id = string(v, "id", MAX_ID)?;
            }
        }
        Ok(m)
    }
}

fn bytes<'b>(v: Value<'b>, field: &str) -> Result<&'b [u8], String> {
    match v {
        Value::Bytes(b) => Ok(b),
        _ => Err(format!("{field}: not a length-delimited field")),
    }
}

/// A proto3 string: UTF-8, at most `max` bytes.
fn string(v: Value<'_>, field: &str, max: usize) -> Result<String, String> {
    let b = bytes(v, field)?;
    if b.len() > max {
        return Err(format!("{field}: {} bytes, more than {max}", b.len()));
    }
    String::from_utf8(b.to_vec()).map_err(|_| format!("{field}: not UTF-8"))
}

/// One entry of a `map<string, string>` (a message of `key` = 1 and `value` = 2) put in
/// `into`; `count` the entries read so far, of both maps.
fn entry(
    v: Value<'_>,
    field: &str,
    into: &mut Attributes,
    count: &mut usize,
) -> Result<(), String> {
    *count += 1;
    if *count > MAX_ATTRIBUTES {
        return Err(format!("more than {MAX_ATTRIBUTES} attributes"));
    }
    let mut r = Reader::new(bytes(v, field)?);
    let (mut key, mut value) = (String::new(), String::new());
    while let Some(f) = r.field() {
        match f.map_err(|e| format!("{field}: {e}"))? {
            (1, v) => key = string(v, &format!("{field} key"), MAX_KEY)?,
            (2, v) => value = string(v, &format!("{field} value"), MAX_VALUE)?,
            _ => {}
        }
    }
    into.insert(key, value);
    Ok(())
}

/// `RemoteConfigStatus`.
fn reported(b: &[u8]) -> Result<Reported, String> {
    let mut out = Reported {
        status: Status::Unset,
        message: String::new(),
    };
    let mut r = Reader::new(b);
    while let Some(f) = r.field() {
        match f.map_err(|e| format!("remote_config_status: {e}"))? {
            (1, Value::Varint(v)) => out.status = Status::of(v),
            (1, _) => return Err("remote_config_status.status: not a varint".into()),
            (2, v) => out.message = string(v, "remote_config_status.error_message", MAX_MESSAGE)?,
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::serve::remotecfg::wire::varint_bytes;

    /// A length-delimited field, written by hand (not by the code under test).
    fn ld(number: u32, b: &[u8]) -> Vec<u8> {
        let mut out = varint_bytes(u64::from(number) << 3 | 2);
        out.extend(varint_bytes(b.len() as u64));
        out.extend_from_slice(b);
        out
    }

    fn pair(number: u32, k: &str, v: &str) -> Vec<u8> {
        ld(number, &[ld(1, k.as_bytes()), ld(2, v.as_bytes())].concat())
    }

    /// What Alloy v1.19.2 sends after a load that failed: id, local attributes, the
    /// hub's hash, the status, and the effective config (skipped).
    fn alloy_request() -> Vec<u8> {
        let status = [vec![0x08, 0x03], ld(2, b"3:5: unknown component")].concat();
        let effective = ld(1, &pair(1, "", "whatever"));
        [
            ld(1, b"alloy-1"),
            pair(4, "collector.os", "linux"),
            pair(4, "team", "a"),
            ld(3, b"abc"),
            ld(5, &status),
            ld(6, &effective),
            // A field of a later proto.
            vec![0xb8, 0x01, 0x07],
        ]
        .concat()
    }

    #[test]
    fn get_config_is_read_as_alloy_sends_it() {
        let m = GetConfig::decode(&alloy_request()).unwrap();
        assert_eq!(m.id, "alloy-1");
        assert_eq!(m.hash, "abc");
        assert_eq!(
            m.attributes,
            Attributes::from([
                ("collector.os".into(), "linux".into()),
                ("team".into(), "a".into())
            ])
        );
        assert_eq!(
            m.status,
            Some(Reported {
                status: Status::Failed,
                message: "3:5: unknown component".into()
            })
        );
        // The first request after a start: status present, UNSET (field 5, length 0).
        let first = [ld(1, b"x"), vec![0x2a, 0x00]].concat();
        let m = GetConfig::decode(&first).unwrap();
        assert_eq!(m.status.unwrap().status, Status::Unset);
        assert_eq!(GetConfig::decode(&[]).unwrap(), GetConfig::default());
    }

    #[test]
    fn local_attributes_win_over_the_deprecated_ones() {
        let b = [
            pair(4, "a", "local"),
            pair(2, "a", "old"),
            pair(2, "b", "old"),
        ]
        .concat();
        let m = Register::decode(&[b.clone(), ld(3, b"name"), ld(1, b"id")].concat()).unwrap();
        assert_eq!(m.attributes["a"], "local");
        assert_eq!(m.attributes["b"], "old");
        assert_eq!((m.id.as_str(), m.name.as_str()), ("id", "name"));
        assert_eq!(Unregister::decode(&ld(1, b"z")).unwrap().id, "z");
    }

    #[test]
    fn the_response_is_what_a_proto3_encoder_writes() {
        // Written by hand from the wire format's rules: key (1 << 3 | 2) = 0a, length 4,
        // "// x"; key (2 << 3 | 2) = 12, length 1, "h"; key (3 << 3 | 0) = 18, true = 01.
        assert_eq!(
            get_config_response("// x", "h", true),
            [0x0a, 4, b'/', b'/', b' ', b'x', 0x12, 1, b'h', 0x18, 1]
        );
        assert_eq!(get_config_response("", "", false), Vec::<u8>::new());
        let long = "a".repeat(300);
        let b = get_config_response(&long, "", false);
        assert_eq!(&b[..3], [0x0a, 0xac, 0x02]);
        assert_eq!(b.len(), 303);
    }

    /// Every bound, and bytes that are not what the field is, refuse the request whole.
    #[test]
    fn hostile_requests_are_refused() {
        let over = |n: usize| "x".repeat(n + 1);
        let many: Vec<u8> = (0..=MAX_ATTRIBUTES)
            .flat_map(|i| pair(4, &format!("k{i}"), "v"))
            .collect();
        let split: Vec<u8> = (0..MAX_ATTRIBUTES)
            .flat_map(|i| pair(if i % 2 == 0 { 2 } else { 4 }, "same", "v"))
            .chain(pair(2, "one", "more"))
            .collect();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (ld(1, over(MAX_ID).as_bytes()), "id: 257 bytes"),
            (ld(3, over(MAX_HASH).as_bytes()), "hash: 129 bytes"),
            (
                pair(4, &over(MAX_KEY), "v"),
                "local_attributes key: 257 bytes",
            ),
            (
                pair(2, "k", &over(MAX_VALUE)),
                "attributes value: 1025 bytes",
            ),
            (many, "more than 64 attributes"),
            (split, "more than 64 attributes"),
            (ld(1, &[0xff, 0xfe]), "id: not UTF-8"),
            (pair(4, "k", "\u{0}ok"), ""),
            (vec![0x08, 0x01], "id: not a length-delimited field"),
            (ld(4, &[0x0a, 0x09]), "local_attributes: field 1 at byte 0"),
            (ld(5, &[0x0a, 0x00]), "status: not a varint"),
            (
                ld(5, &ld(2, over(MAX_MESSAGE).as_bytes())),
                "error_message: 65537 bytes",
            ),
            (vec![0x0a, 0x10, b'a'], "a length of 16 bytes, 1 left"),
        ];
        for (b, why) in cases {
            match GetConfig::decode(&b) {
                // A NUL is valid UTF-8: kept, as Go's protobuf keeps it.
                Ok(_) if why.is_empty() => {}
                Ok(m) => panic!("{why}: taken: {m:?}"),
                Err(e) => assert!(!why.is_empty() && e.contains(why), "{why}: {e}"),
            }
        }
        assert!(Register::decode(&ld(3, over(MAX_NAME).as_bytes())).is_err());
        assert!(Unregister::decode(&[0x0a]).is_err());
        // At the bounds: taken.
        let at = [
            ld(1, "x".repeat(MAX_ID).as_bytes()),
            pair(4, &"k".repeat(MAX_KEY), &"v".repeat(MAX_VALUE)),
        ]
        .concat();
        assert!(GetConfig::decode(&at).is_ok());
    }

    /// Any bytes at all: an answer (a message or a refusal), never a panic, and what is
    /// taken stays within its bounds.
    #[test]
    fn any_bytes_are_answered() {
        let base = alloy_request();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut b = base.clone();
            let cut = (seed as usize) % (b.len() + 1);
            b.truncate(cut);
            if !b.is_empty() {
                let at = (seed >> 20) as usize % b.len();
                b[at] = (seed >> 40) as u8;
            }
            if let Ok(m) = GetConfig::decode(&b) {
                assert!(m.id.len() <= MAX_ID && m.attributes.len() <= MAX_ATTRIBUTES);
            }
            let _ = Register::decode(&b);
            let _ = Unregister::decode(&b);
        }
    }
}
