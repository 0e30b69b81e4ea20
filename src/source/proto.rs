//! Reading a `PartialObjectMetadataList` in the apiserver's protobuf encoding
//! (`application/vnd.kubernetes.protobuf`), one item at a time.
//!
//! The real apiserver (v1.37.2) spends about half the CPU on a metadata list in protobuf
//! that it spends on the same list in JSON (`bench --only apiserver-requests`), so
//! `auto` and `metadata` ask for it first, as client-go's metadata client does, and read
//! JSON when that is what comes back. Only what cmpoll needs of the wire format is here:
//! the envelope (`k8s\0` and a `runtime.Unknown`: typeMeta = 1, raw = 2,
//! contentEncoding = 3, contentType = 4), the list (`ListMeta` = 1, items = 2), an item
//! (`ObjectMeta` = 1) and of `ObjectMeta` name = 1, namespace = 3, uid = 5,
//! resourceVersion = 6, labels = 11 and annotations = 12 (map entries: key = 1,
//! value = 2), field numbers from apimachinery's `generated.proto`. Every other field is
//! skipped by its wire type. Like `reader::ListReader` it is pulled and holds one item:
//! a length is never trusted for an allocation (the body's cap stops a lying one), and a
//! body cut anywhere is an error, never a shorter list.

use std::io::Read;

use super::reader::{ListMeta, Meta, ReadError};

/// The media type the apiserver answers protobuf with.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
const MAGIC: &[u8; 4] = b"k8s\0";
const LIST_KIND: &str = "PartialObjectMetadataList";

fn bad(cause: impl std::fmt::Display) -> ReadError {
    ReadError::Bad(format!("protobuf: {cause}"))
}

/// A field's wire type and the value it carries, as far as cmpoll needs it.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Skipped,
}

/// A protobuf message in memory, read field by field.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Fields { bytes, at: 0 }
    }

    fn varint(&mut self) -> Result<u64, ReadError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.bytes.get(self.at) else {
                return Err(bad("a varint cut short"));
            };
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("a varint longer than 10 bytes"))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], ReadError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.at.checked_add(n))
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| bad("a field longer than its message"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    /// The next field: its number and value; `None` at the end of the message.
    fn next(&mut self) -> Result<Option<(u64, Value<'a>)>, ReadError> {
        if self.at == self.bytes.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Skipped
            }
            2 => {
                let n = self.varint()?;
                Value::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Value::Skipped
            }
            t => {
                return Err(bad(format!(
                    "wire type {t} (groups are not used by Kubernetes)"
                )));
            }
        };
        Ok(Some((key >> 3, value)))
    }
}

fn text(b: &[u8], what: &str) -> Result<String, ReadError> {
    String::from_utf8(b.to_vec()).map_err(|_| bad(format!("{what} is not UTF-8")))
}

/// A `map<string, string>` entry.
fn entry(b: &[u8]) -> Result<(String, String), ReadError> {
    let (mut k, mut v) = (String::new(), String::new());
    let mut f = Fields::new(b);
    while let Some((n, value)) = f.next()? {
        match (n, value) {
            (1, Value::Bytes(b)) => k = text(b, "a map key")?,
            (2, Value::Bytes(b)) => v = text(b, "a map value")?,
            _ => {}
        }
    }
    Ok((k, v))
}

/// One `PartialObjectMetadata` (or any object whose field 1 is its `ObjectMeta`).
fn item_meta(item: &[u8], annotation: Option<&str>) -> Result<Meta, ReadError> {
    let mut meta = Meta {
        partial: true,
        ..Meta::default()
    };
    let mut f = Fields::new(item);
    while let Some((n, value)) = f.next()? {
        let (1, Value::Bytes(object_meta)) = (n, value) else {
            continue;
        };
        let mut m = Fields::new(object_meta);
        while let Some((n, value)) = m.next()? {
            let Value::Bytes(b) = value else { continue };
            match n {
                1 => meta.name = text(b, "metadata.name")?,
                3 => meta.namespace = text(b, "metadata.namespace")?,
                5 => meta.uid = text(b, "metadata.uid")?,
                6 => meta.resource_version = text(b, "metadata.resourceVersion")?,
                11 => meta.labels.push(entry(b)?),
                12 if annotation.is_some() => {
                    let (k, v) = entry(b)?;
                    if Some(k.as_str()) == annotation {
                        meta.folder = Some(v);
                    }
                }
                _ => {}
            }
        }
    }
    // Labels as the JSON reader gives them: sorted by key (a protobuf map has no order).
    meta.labels.sort();
    Ok(meta)
}

/// A pulled reader of a protobuf `PartialObjectMetadataList` body.
pub struct MetaListReader<R> {
    reader: R,
    /// Bytes of the envelope's `raw` field (the list) not read yet.
    raw_left: u64,
    /// Whether the envelope has been read up to its `raw` field.
    in_raw: bool,
    kind: Option<String>,
    list: ListMeta,
    index: usize,
    item: Vec<u8>,
}

impl<R: Read> MetaListReader<R> {
    /// Reads the magic number and the envelope up to the list.
    pub fn new(mut reader: R) -> Result<Self, ReadError> {
        let mut magic = [0u8; 4];
        read_exact(&mut reader, &mut magic, "the magic number")?;
        if &magic != MAGIC {
            return Err(bad(
                "no 'k8s\\0' magic number: not a Kubernetes protobuf object",
            ));
        }
        let mut r = MetaListReader {
            reader,
            raw_left: 0,
            in_raw: false,
            kind: None,
            list: ListMeta::default(),
            index: 0,
            item: Vec::new(),
        };
        r.envelope_until_raw()?;
        Ok(r)
    }

    /// The envelope's fields up to `raw` (then `in_raw`) or its end.
    fn envelope_until_raw(&mut self) -> Result<(), ReadError> {
        while let Some(key) = self.stream_key()? {
            let (n, wire) = (key >> 3, key & 7);
            if (n, wire) == (2, 2) {
                self.raw_left = self.stream_varint()?;
                self.in_raw = true;
                return Ok(());
            }
            let value = self.stream_value(wire)?;
            match (n, value) {
                (1, Some(b)) => {
                    let mut f = Fields::new(&b);
                    while let Some((n, v)) = f.next()? {
                        if let (2, Value::Bytes(b)) = (n, v) {
                            self.kind = Some(text(b, "the kind")?);
                        }
                    }
                    self.check_kind()?;
                }
                (3, Some(b)) if !b.is_empty() => {
                    return Err(bad(format!(
                        "content encoding '{}' is not supported",
                        String::from_utf8_lossy(&b)
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn check_kind(&self) -> Result<(), ReadError> {
        match self.kind.as_deref() {
            Some(k) if k != LIST_KIND => Err(ReadError::Bad(format!(
                "expected a {LIST_KIND}, got kind '{k}' in protobuf"
            ))),
            _ => Ok(()),
        }
    }

    /// The next item's metadata (with the value of `annotation` if asked for).
    pub fn next_meta(&mut self, annotation: Option<&str>) -> Result<Option<Meta>, ReadError> {
        while self.in_raw && self.raw_left > 0 {
            let before = self.raw_left;
            let key = self.raw_varint()?;
            let (n, wire) = (key >> 3, key & 7);
            let value = match wire {
                2 => {
                    let len = self.raw_varint()?;
                    if len > self.raw_left {
                        return Err(bad("an item longer than the list"));
                    }
                    self.item.clear();
                    let got = (&mut self.reader).take(len).read_to_end(&mut self.item)?;
                    if (got as u64) < len {
                        return Err(bad("the list cut short"));
                    }
                    self.raw_left -= len;
                    true
                }
                0 => {
                    self.raw_varint()?;
                    false
                }
                1 | 5 => {
                    let mut skip = vec![0u8; if wire == 1 { 8 } else { 4 }];
                    if skip.len() as u64 > self.raw_left {
                        return Err(bad("a field longer than the list"));
                    }
                    read_exact(&mut self.reader, &mut skip, "the list")?;
                    self.raw_left -= skip.len() as u64;
                    false
                }
                t => return Err(bad(format!("wire type {t} in the list"))),
            };
            debug_assert!(self.raw_left < before);
            match (n, value) {
                (1, true) => self.list_meta()?,
                (2, true) => {
                    let index = self.index;
                    self.index += 1;
                    return item_meta(&self.item, annotation)
                        .map(Some)
                        .map_err(|e| match e {
                            ReadError::Bad(m) => ReadError::Bad(format!("item {index}: {m}")),
                            e => e,
                        });
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// The list's `ListMeta`, in `self.item`.
    fn list_meta(&mut self) -> Result<(), ReadError> {
        let mut f = Fields::new(&self.item);
        while let Some((n, v)) = f.next()? {
            match (n, v) {
                (2, Value::Bytes(b)) => {
                    self.list.resource_version = Some(text(b, "the list's resourceVersion")?)
                }
                (3, Value::Bytes(b)) => {
                    self.list.continue_token =
                        Some(text(b, "the list's continue token")?).filter(|c| !c.is_empty())
                }
                (4, Value::Varint(v)) => self.list.remaining_item_count = Some(v as i64),
                _ => {}
            }
        }
        Ok(())
    }

    /// The rest of the list and of the envelope: what the list says about itself.
    pub fn finish(mut self) -> Result<ListMeta, ReadError> {
        while self.next_meta(None)?.is_some() {}
        if !self.in_raw {
            return Err(bad("no list in the envelope"));
        }
        self.in_raw = false;
        self.envelope_until_raw()?;
        if self.in_raw {
            return Err(bad("two lists in one envelope"));
        }
        self.list.kind = self.kind.take().unwrap_or_default();
        Ok(self.list)
    }

    /// A varint inside `raw`, counted against it.
    fn raw_varint(&mut self) -> Result<u64, ReadError> {
        let mut n = 0;
        let v = self
            .varint_counted(&mut n)?
            .ok_or_else(|| bad("the list cut short"))?;
        if n > self.raw_left {
            return Err(bad("a field longer than the list"));
        }
        self.raw_left -= n;
        Ok(v)
    }

    /// A varint from the stream; `None` at a clean end (before a field's key).
    fn stream_key(&mut self) -> Result<Option<u64>, ReadError> {
        self.varint_counted(&mut 0)
    }

    /// A varint from the stream that must be there (a length, a value).
    fn stream_varint(&mut self) -> Result<u64, ReadError> {
        self.varint_counted(&mut 0)?
            .ok_or_else(|| bad("the body cut short"))
    }

    /// A varint, its length added to `n`; `None` when the body ends before its first byte.
    fn varint_counted(&mut self, n: &mut u64) -> Result<Option<u64>, ReadError> {
        let mut v = 0u64;
        for (i, shift) in (0..64).step_by(7).enumerate() {
            let mut b = [0u8; 1];
            if let Err(e) = self.reader.read_exact(&mut b) {
                return match e.kind() {
                    std::io::ErrorKind::UnexpectedEof if i == 0 => Ok(None),
                    std::io::ErrorKind::UnexpectedEof => Err(bad("the body cut short")),
                    _ => Err(e.into()),
                };
            }
            *n += 1;
            v |= u64::from(b[0] & 0x7f) << shift;
            if b[0] & 0x80 == 0 {
                return Ok(Some(v));
            }
        }
        Err(bad("a varint longer than 10 bytes"))
    }

    /// An envelope field's value from the stream (only length-delimited ones are kept).
    fn stream_value(&mut self, wire: u64) -> Result<Option<Vec<u8>>, ReadError> {
        let len = match wire {
            0 => {
                self.stream_varint()?;
                return Ok(None);
            }
            1 => 8,
            5 => 4,
            2 => self.stream_varint()?,
            t => return Err(bad(format!("wire type {t} in the envelope"))),
        };
        let mut b = Vec::new();
        let got = (&mut self.reader).take(len).read_to_end(&mut b)?;
        if (got as u64) < len {
            return Err(bad("the body cut short"));
        }
        Ok((wire == 2).then_some(b))
    }
}

fn read_exact<R: Read>(r: &mut R, buf: &mut [u8], what: &str) -> Result<(), ReadError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => bad(format!("the body cut short in {what}")),
        _ => ReadError::Io(e),
    })
}

#[cfg(test)]
mod tests;
