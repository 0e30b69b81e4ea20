//! Protocol Buffers' binary wire format, as far as `collector.v1` needs it: a reader that
//! walks one message's fields (varints of at most 10 bytes, length-delimited fields bounded
//! by what is left of the message, fixed 32- and 64-bit fields skipped; groups, field 0 and
//! any byte past the end refused) and a writer of the three field shapes a response holds.
//! It holds no message's meaning: `messages.rs` does. Every error is one line that says
//! what was wrong and where, never quoting the bytes.

/// A field's number and its value, as read.
#[derive(Debug, PartialEq, Eq)]
pub enum Value<'b> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 2: the bytes, not yet read as anything.
    Bytes(&'b [u8]),
    /// Wire types 1 and 5: nothing any message here reads as fixed.
    Fixed,
}

/// The largest field number Protocol Buffers allows (2^29 - 1).
const MAX_FIELD: u64 = (1 << 29) - 1;

/// A reader of one message's fields, in order.
pub struct Reader<'b> {
    b: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    pub fn new(b: &'b [u8]) -> Reader<'b> {
        Reader { b, at: 0 }
    }

    /// The next field, `None` at the message's end, or why the bytes are not a message.
    pub fn field(&mut self) -> Option<Result<(u32, Value<'b>), String>> {
        if self.at >= self.b.len() {
            return None;
        }
        Some(self.next_field())
    }

    fn next_field(&mut self) -> Result<(u32, Value<'b>), String> {
        let start = self.at;
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 || number > MAX_FIELD {
            return Err(format!("field number {number} at byte {start}"));
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => self.skip(8).map(|_| Value::Fixed)?,
            2 => {
                let len = self.varint()?;
                let left = (self.b.len() - self.at) as u64;
                if len > left {
                    return Err(format!(
                        "field {number} at byte {start}: a length of {len} bytes, {left} left"
                    ));
                }
                Value::Bytes(self.skip(len as usize)?)
            }
            5 => self.skip(4).map(|_| Value::Fixed)?,
            t => return Err(format!("field {number} at byte {start}: wire type {t}")),
        };
        Ok((number as u32, value))
    }

    /// A varint of at most 10 bytes whose value fits 64 bits.
    fn varint(&mut self) -> Result<u64, String> {
        let start = self.at;
        let mut v: u64 = 0;
        for i in 0..10 {
            let Some(&byte) = self.b.get(self.at) else {
                return Err(format!("a varint cut short at byte {start}"));
            };
            self.at += 1;
            // The tenth byte holds the 64th bit only.
            if i == 9 && byte > 1 {
                return Err(format!("a varint over 64 bits at byte {start}"));
            }
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        // Not reached: the tenth byte has no continuation bit (above).
        Err(format!("a varint over 10 bytes at byte {start}"))
    }

    fn skip(&mut self, n: usize) -> Result<&'b [u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.b.len());
        let Some(end) = end else {
            return Err(format!("a field cut short at byte {}", self.at));
        };
        let out = &self.b[self.at..end];
        self.at = end;
        Ok(out)
    }
}

/// A message's bytes being written.
#[derive(Default)]
pub struct Writer {
    pub out: Vec<u8>,
}

impl Writer {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.out.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.out.push(v as u8);
    }

    /// A length-delimited field (a string, bytes or a message), left out when empty as
    /// proto3 leaves a default out.
    pub fn bytes(&mut self, number: u32, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        self.varint(u64::from(number) << 3 | 2);
        self.varint(b.len() as u64);
        self.out.extend_from_slice(b);
    }

    /// A bool field, left out when false.
    pub fn bool(&mut self, number: u32, v: bool) {
        if v {
            self.varint(u64::from(number) << 3);
            self.varint(1);
        }
    }
}

#[cfg(test)]
pub fn varint_bytes(v: u64) -> Vec<u8> {
    let mut w = Writer::default();
    w.varint(v);
    w.out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn fields(b: &[u8]) -> Result<Vec<(u32, Value<'_>)>, String> {
        let mut r = Reader::new(b);
        let mut out = Vec::new();
        while let Some(f) = r.field() {
            out.push(f?);
        }
        Ok(out)
    }

    /// Varints as Protocol Buffers' documentation writes them (150 is `96 01`), at their
    /// edges, read back as written.
    #[test]
    fn varints_round_trip() {
        assert_eq!(varint_bytes(150), [0x96, 0x01]);
        assert_eq!(varint_bytes(0), [0]);
        assert_eq!(varint_bytes(127), [0x7f]);
        assert_eq!(varint_bytes(128), [0x80, 0x01]);
        assert_eq!(varint_bytes(u64::MAX).len(), 10);
        for v in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut b = vec![0x08];
            b.extend(varint_bytes(v));
            assert_eq!(fields(&b).unwrap(), [(1, Value::Varint(v))], "{v}");
        }
    }

    #[test]
    fn fields_of_each_wire_type_are_read_or_skipped() {
        let b = [
            0x0a, 0x02, b'h', b'i', // 1: "hi"
            0x11, 1, 2, 3, 4, 5, 6, 7, 8, // 2: fixed64
            0x1d, 1, 2, 3, 4, // 3: fixed32
            0x20, 0x05, // 4: 5
            0xa2, 0x06, 0x00, // 100: ""
        ];
        assert_eq!(
            fields(&b).unwrap(),
            [
                (1, Value::Bytes(b"hi")),
                (2, Value::Fixed),
                (3, Value::Fixed),
                (4, Value::Varint(5)),
                (100, Value::Bytes(b"")),
            ]
        );
        let mut w = Writer::default();
        w.bytes(1, b"hi");
        w.bytes(2, b"");
        w.bool(3, true);
        w.bool(4, false);
        assert_eq!(w.out, [0x0a, 2, b'h', b'i', 0x18, 1]);
    }

    /// Hostile bytes: each refused with a line that says where, never read past the end.
    #[test]
    fn malformed_messages_are_refused() {
        let cases: &[(&[u8], &str)] = &[
            (&[0x0a], "cut short"),
            (&[0x0a, 0x05, b'a'], "a length of 5 bytes, 1 left"),
            (&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f], "left"),
            (&[0x08], "cut short"),
            (&[0x08, 0x80], "cut short"),
            (
                &[
                    0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02,
                ],
                "over 64 bits",
            ),
            (
                &[
                    0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x81, 0x00,
                ],
                "over 64 bits",
            ),
            (&[0x00, 0x01], "field number 0"),
            (&[0x0b], "wire type 3"),
            (&[0x0c], "wire type 4"),
            (&[0x0e], "wire type 6"),
            (&[0x11, 1, 2, 3], "cut short"),
            (&[0x1d, 1], "cut short"),
            (
                &[0xf8, 0xff, 0xff, 0xff, 0x1f, 0x00],
                "field number 1073741823",
            ),
        ];
        for (b, why) in cases {
            let e = fields(b).unwrap_err();
            assert!(e.contains(why), "{b:?}: {e}");
        }
        // The largest field number is one.
        assert!(fields(&[0xf8, 0xff, 0xff, 0xff, 0x0f, 0x00]).is_ok());
        assert_eq!(fields(&[]).unwrap(), []);
    }
}
