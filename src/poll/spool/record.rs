//! The spool's record, as it lies in the spool file: a head (plain or shelved, the
//! object's kind, its uid and resourceVersion, how many files and bytes) and the files
//! (each flagged binary or not, its key, its length, and its bytes unless shelved). What
//! a record says of its object is an `ObjectRef` going in and a `Meta` coming out; a
//! record that does not parse is an `InvalidData` error, never a panic.

use std::io;

use crate::source::{Content, ModuleFile, Resource};

/// The first byte of a record: its files' contents follow, or (shelved) only their keys.
pub(super) const PLAIN: u8 = 0;
pub(super) const SHELVED: u8 = 2;

/// The object a module's record came from: its kind, and its uid and resourceVersion as
/// the apiserver gave them (events carry them; a snapshot keeps none of them in memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectRef<'a> {
    pub kind: Resource,
    pub uid: &'a str,
    pub resource_version: &'a str,
}

impl<'a> ObjectRef<'a> {
    pub fn new(kind: Resource, uid: &'a str, resource_version: &'a str) -> ObjectRef<'a> {
        ObjectRef {
            kind,
            uid,
            resource_version,
        }
    }

    /// A ConfigMap's (for tests).
    #[cfg(test)]
    pub fn configmap(uid: &'a str, resource_version: &'a str) -> ObjectRef<'a> {
        ObjectRef::new(Resource::ConfigMaps, uid, resource_version)
    }
}

/// What a record says of its module besides the files: its `ObjectRef`, and how many files
/// and bytes it has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub kind: Resource,
    pub uid: String,
    pub resource_version: String,
    pub files: u32,
    pub bytes: u64,
}

pub(super) fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("spool: {what}"))
}

/// A record's head: plain or shelved, the object's kind, the number of files and their
/// bytes, the uid and the resourceVersion.
pub(super) fn encode_head(buf: &mut Vec<u8>, record: u8, object: &ObjectRef, files: &[ModuleFile]) {
    buf.push(record);
    buf.push(u8::from(object.kind == Resource::Secrets));
    buf.extend_from_slice(&(files.len() as u32).to_be_bytes());
    let bytes: u64 = files.iter().map(|f| f.content.bytes().len() as u64).sum();
    buf.extend_from_slice(&bytes.to_be_bytes());
    for text in [object.uid, object.resource_version] {
        buf.extend_from_slice(&(text.len() as u32).to_be_bytes());
        buf.extend_from_slice(text.as_bytes());
    }
}

pub(super) fn decode_head(buf: &mut &[u8]) -> io::Result<(u8, Meta)> {
    let record = take(buf, 1)?[0];
    if record != PLAIN && record != SHELVED {
        return Err(corrupt("not a record"));
    }
    let kind = match take(buf, 1)?[0] {
        0 => Resource::ConfigMaps,
        1 => Resource::Secrets,
        _ => return Err(corrupt("not a kind")),
    };
    let files = u32::from_be_bytes(take(buf, 4)?.try_into().expect("4 bytes"));
    let bytes = u64::from_be_bytes(take(buf, 8)?.try_into().expect("8 bytes"));
    let mut text = || -> io::Result<String> {
        let n = u32::from_be_bytes(take(buf, 4)?.try_into().expect("4 bytes")) as usize;
        String::from_utf8(take(buf, n)?.to_vec()).map_err(|_| corrupt("not UTF-8"))
    };
    let uid = text()?;
    let resource_version = text()?;
    Ok((
        record,
        Meta {
            kind,
            uid,
            resource_version,
            files,
            bytes,
        },
    ))
}

/// Files as a record holds them: flag (binary or not), key, length, and the contents
/// when `contents` (a shelved record has none).
pub(super) fn encode_files(buf: &mut Vec<u8>, files: &[ModuleFile], contents: bool) {
    for f in files {
        buf.push(u8::from(f.content.is_binary()));
        buf.extend_from_slice(&(f.key.len() as u32).to_be_bytes());
        buf.extend_from_slice(f.key.as_bytes());
        let bytes = f.content.bytes();
        buf.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        if contents {
            buf.extend_from_slice(bytes);
        }
    }
}

pub(super) fn take<'a>(buf: &mut &'a [u8], n: usize) -> io::Result<&'a [u8]> {
    if buf.len() < n {
        return Err(corrupt("truncated record"));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// One file's head in a record: binary or not, key, content length.
pub(super) fn head(buf: &mut &[u8]) -> io::Result<(bool, String, usize)> {
    let binary = take(buf, 1)?[0] == 1;
    let klen = u32::from_be_bytes(take(buf, 4)?.try_into().expect("4 bytes")) as usize;
    let key =
        String::from_utf8(take(buf, klen)?.to_vec()).map_err(|_| corrupt("key is not UTF-8"))?;
    let clen = u64::from_be_bytes(take(buf, 8)?.try_into().expect("8 bytes")) as usize;
    Ok((binary, key, clen))
}

/// A file as a record says it is: binary, or text that must be UTF-8.
pub(super) fn file(binary: bool, key: String, bytes: Vec<u8>) -> io::Result<ModuleFile> {
    let content = if binary {
        Content::Binary(bytes)
    } else {
        Content::Text(String::from_utf8(bytes).map_err(|_| corrupt("text is not UTF-8"))?)
    };
    Ok(ModuleFile { key, content })
}

/// A plain record's files.
pub(super) fn decode(mut buf: &[u8]) -> io::Result<Vec<ModuleFile>> {
    let mut files = Vec::new();
    while !buf.is_empty() {
        let (binary, key, clen) = head(&mut buf)?;
        files.push(file(binary, key, take(&mut buf, clen)?.to_vec())?);
    }
    Ok(files)
}

/// A shelved record's files: binary or not, key, length.
pub(super) fn decode_heads(mut buf: &[u8]) -> io::Result<Vec<(bool, String, usize)>> {
    let mut heads = Vec::new();
    while !buf.is_empty() {
        heads.push(head(&mut buf)?);
    }
    Ok(heads)
}
