//! What a connection speaks through: plaintext in, plaintext out, over TLS (`Tls`: rustls
//! over a non-blocking socket) or not (`Plain`: `--listen` of `cmpoll run`), a server's
//! connection being either (`Io`). The
//! connection's state machine (`conn.rs`) sees only this seam, so its unit tests drive it
//! over a fake. Every buffer here is bounded: rustls holds at most `SEND_BUFFER` bytes
//! of records not yet on the wire, and the kernel's send buffer is set to `SEND_BUFFER`
//! too, so a client that stops reading holds that much of the hub's memory (and of the
//! kernel's, charged to the pod) and no more.
//!
//! A TLS handshake's bytes are read and written here, on the server's thread, but what
//! they say is worked out elsewhere (its crypto: a signature, a key exchange): while bytes
//! of a handshake wait to be processed, `Tls::handshake_step` hands its rustls state to a
//! handshake worker (`handshakes.rs`), and `Tls::back` takes it back. Meanwhile the
//! connection reads, writes and says nothing. A step waits for a whole TLS record
//! (`Records` follows their framing as the bytes come): a client that stalls halfway
//! through its ClientHello costs a worker nothing.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::{ServerConfig, ServerConnection};

/// What one connection may have queued for the wire at most: in rustls, and in the
/// kernel's socket buffer (which Linux doubles for its own bookkeeping).
pub const SEND_BUFFER: usize = 64 * 1024;

/// A connection's byte stream, non-blocking: every call does what it can now.
pub trait Transport {
    /// Appends what arrived (plaintext) to `into`, while it holds less than `cap`; `true`
    /// once the peer has closed its side.
    fn receive(&mut self, into: &mut Vec<u8>, cap: usize) -> io::Result<bool>;
    /// Takes as much of `bytes` as its buffer holds now (0: full, try again when
    /// writable).
    fn send(&mut self, bytes: &[u8]) -> io::Result<usize>;
    /// Moves what it holds to the wire; `true` when nothing is left.
    fn flush(&mut self) -> io::Result<bool>;
    /// Still in its handshake.
    fn handshaking(&self) -> bool;
    /// The client has sent something whole (a TLS record; without TLS, anything).
    fn started(&self) -> bool;
    /// Says goodbye (TLS `close_notify`) after what is queued.
    fn close(&mut self);
    /// Sends the end of this side (TCP's FIN), once all is on the wire; what comes may
    /// still be read.
    fn shutdown(&mut self);
    /// The certificate the client presented (its leaf), if any.
    fn peer_cert(&self) -> Option<CertificateDer<'static>>;
    /// What its handshake may hold of what the client sent (rustls joins a handshake
    /// message of up to 64 KiB across records): the bytes read while handshaking.
    fn handshake_bytes(&self) -> usize {
        0
    }
}

/// HTTPS: rustls over a socket.
pub struct Tls {
    sock: TcpStream,
    /// Its rustls state; `None` while a handshake worker has it.
    tls: Option<ServerConnection>,
    /// A whole record of the handshake was read and waits to be processed.
    unprocessed: bool,
    /// Where the handshake's bytes stand in their records.
    records: Records,
}

impl Tls {
    pub fn new(sock: TcpStream, config: Arc<ServerConfig>) -> io::Result<Tls> {
        let mut tls = ServerConnection::new(config).map_err(io::Error::other)?;
        tls.set_buffer_limit(Some(SEND_BUFFER));
        Ok(Tls {
            sock,
            tls: Some(tls),
            unprocessed: false,
            records: Records::default(),
        })
    }

    pub fn sock(&self) -> &TcpStream {
        &self.sock
    }

    /// Its rustls state, for a handshake worker to process what was read of the handshake
    /// (if bytes of it wait); the connection is idle until it is `back`.
    pub fn handshake_step(&mut self) -> Option<ServerConnection> {
        if !self.unprocessed {
            return None;
        }
        self.unprocessed = false;
        self.tls.take()
    }

    /// Its rustls state back from the worker that processed its handshake's bytes; what
    /// that made (the server's flight, an alert) goes out at the next flush.
    pub fn back(&mut self, tls: ServerConnection) {
        self.tls = Some(tls);
    }

    /// Writes what rustls has for the wire now (an alert before a close), as far as the
    /// socket takes it.
    pub fn alert(&mut self) {
        if let Some(tls) = &mut self.tls {
            let _ = tls.write_tls(&mut self.sock);
        }
    }
}

impl Transport for Tls {
    fn receive(&mut self, into: &mut Vec<u8>, cap: usize) -> io::Result<bool> {
        // Away at a handshake worker: what arrived is read once it is back.
        let Some(tls) = &mut self.tls else {
            return Ok(false);
        };
        let mut eof = false;
        loop {
            if !tls.is_handshaking() {
                // Cheap when nothing new came: what a worker decrypted with the
                // handshake's last flight is taken here too.
                let state = match tls.process_new_packets() {
                    Ok(s) => s,
                    Err(e) => {
                        // Tell the client why (an alert), then close.
                        let _ = tls.write_tls(&mut self.sock);
                        return Err(io::Error::other(e));
                    }
                };
                let n = state.plaintext_bytes_to_read();
                if n > 0 {
                    let at = into.len();
                    make_room(into, n, cap);
                    into.resize(at + n, 0);
                    let got = tls.reader().read(&mut into[at..]).unwrap_or(0);
                    into.truncate(at + got);
                }
                eof |= state.peer_has_closed();
            }
            if into.len() >= cap || eof {
                break;
            }
            let handshaking = tls.is_handshaking();
            let read = match handshaking {
                true => tls.read_tls(&mut Observed {
                    sock: &mut self.sock,
                    records: &mut self.records,
                }),
                false => tls.read_tls(&mut self.sock),
            };
            match read {
                Ok(0) => eof = true,
                Ok(_) => self.unprocessed |= handshaking && self.records.take_whole(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A handshake's buffer is full: a worker makes room.
                Err(e) if e.kind() == io::ErrorKind::InvalidData && self.unprocessed => break,
                Err(e) => return Err(e),
            }
        }
        Ok(eof)
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let Some(tls) = &mut self.tls else {
            return Ok(0);
        };
        match tls.writer().write(bytes) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }

    fn flush(&mut self) -> io::Result<bool> {
        let Some(tls) = &mut self.tls else {
            return Ok(false);
        };
        while tls.wants_write() {
            match tls.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn handshaking(&self) -> bool {
        self.tls.as_ref().is_none_or(|t| t.is_handshaking())
    }

    fn started(&self) -> bool {
        self.records.any
    }

    fn close(&mut self) {
        if let Some(tls) = &mut self.tls {
            tls.send_close_notify();
        }
    }

    fn shutdown(&mut self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }

    fn handshake_bytes(&self) -> usize {
        if self.handshaking() {
            self.records.seen
        } else {
            0
        }
    }

    fn peer_cert(&self) -> Option<CertificateDer<'static>> {
        (self.tls.as_ref())
            .and_then(|t| t.peer_certificates())
            .and_then(|certs| certs.first())
            .map(|c| c.clone().into_owned())
    }
}

/// The socket as rustls reads a handshake from it, each byte seen by `Records`.
struct Observed<'a> {
    sock: &'a mut TcpStream,
    records: &'a mut Records,
}

impl Read for Observed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.sock.read(buf)?;
        self.records.take(&buf[..n]);
        Ok(n)
    }
}

/// TLS's records as their bytes come (RFC 8446 §5.1: a type, a version, a 16-bit length,
/// then that many bytes): whether a whole one came. What cannot be a record (another type,
/// a length past any record's) counts as whole, for rustls to refuse at once.
#[derive(Debug, Default)]
struct Records {
    head: [u8; 5],
    /// Bytes of the head in.
    have: usize,
    /// Bytes of the record's body still to come.
    left: usize,
    /// A record came whole since the last `take_whole`.
    whole: bool,
    /// A record came whole.
    any: bool,
    /// Bytes seen.
    seen: usize,
}

impl Records {
    fn take(&mut self, mut bytes: &[u8]) {
        self.seen = self.seen.saturating_add(bytes.len());
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = self.left.min(bytes.len());
                self.left -= n;
                bytes = &bytes[n..];
                self.whole |= self.left == 0;
                continue;
            }
            let n = (self.head.len() - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == self.head.len() {
                self.have = 0;
                self.left = usize::from(u16::from_be_bytes([self.head[3], self.head[4]]));
                let record = (20..=23).contains(&self.head[0]) && self.left <= MAX_RECORD;
                self.whole |= self.left == 0 || !record;
            }
        }
    }

    /// Whether a whole record came since the last time it was asked.
    fn take_whole(&mut self) -> bool {
        self.any |= self.whole;
        std::mem::take(&mut self.whole)
    }
}

/// The longest a TLS record may be on the wire (RFC 8446 §5.2: 2^14 + 256 bytes of
/// ciphertext; TLS 1.2's compressed records, 2^14 + 2048).
const MAX_RECORD: usize = (1 << 14) + 2048;

/// Room for `n` more bytes in `into`: doubling as a `Vec` does, but never past `cap` (a
/// body's buffer grows toward its length, not to twice it).
fn make_room(into: &mut Vec<u8>, n: usize, cap: usize) {
    let need = into.len().saturating_add(n);
    if into.capacity() < need {
        let want = (2 * into.capacity()).max(need).min(cap.max(need));
        into.reserve_exact(want - into.len());
    }
}

/// Plain HTTP (`cmpoll run --listen`: probes and scrapes on the pod network).
pub struct Plain {
    sock: TcpStream,
}

impl Plain {
    pub fn new(sock: TcpStream) -> Plain {
        Plain { sock }
    }

    pub fn sock(&self) -> &TcpStream {
        &self.sock
    }
}

impl Transport for Plain {
    fn receive(&mut self, into: &mut Vec<u8>, cap: usize) -> io::Result<bool> {
        let mut buf = [0u8; 4096];
        while into.len() < cap {
            let room = buf.len().min(cap - into.len());
            match self.sock.read(&mut buf[..room]) {
                Ok(0) => return Ok(true),
                Ok(n) => {
                    make_room(into, n, cap);
                    into.extend_from_slice(&buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<usize> {
        loop {
            match self.sock.write(bytes) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn flush(&mut self) -> io::Result<bool> {
        Ok(true)
    }

    fn handshaking(&self) -> bool {
        false
    }

    fn started(&self) -> bool {
        true
    }

    fn close(&mut self) {}

    fn shutdown(&mut self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }

    fn peer_cert(&self) -> Option<CertificateDer<'static>> {
        None
    }
}

/// An in-memory transport for the state machine's tests: what the client sends, what
/// the "wire" takes before it is full, what came out.
/// A connection's transport: TLS or plain.
pub enum Io {
    Tls(Box<Tls>),
    Plain(Plain),
}

impl Io {
    pub fn sock(&self) -> BorrowedFd<'_> {
        match self {
            Io::Tls(t) => t.sock().as_fd(),
            Io::Plain(p) => p.sock().as_fd(),
        }
    }

    fn inner(&mut self) -> &mut dyn Transport {
        match self {
            Io::Tls(t) => t.as_mut(),
            Io::Plain(p) => p,
        }
    }

    fn inner_ref(&self) -> &dyn Transport {
        match self {
            Io::Tls(t) => t.as_ref(),
            Io::Plain(p) => p,
        }
    }
}

impl Transport for Io {
    fn receive(&mut self, into: &mut Vec<u8>, cap: usize) -> io::Result<bool> {
        self.inner().receive(into, cap)
    }
    fn send(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.inner().send(bytes)
    }
    fn flush(&mut self) -> io::Result<bool> {
        self.inner().flush()
    }
    fn handshaking(&self) -> bool {
        self.inner_ref().handshaking()
    }
    fn started(&self) -> bool {
        self.inner_ref().started()
    }
    fn close(&mut self) {
        self.inner().close()
    }
    fn shutdown(&mut self) {
        self.inner().shutdown()
    }
    fn peer_cert(&self) -> Option<CertificateDer<'static>> {
        self.inner_ref().peer_cert()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body's buffer grows as a `Vec` does, by doubling, but never past its cap (an
    /// AdmissionReview of 1 MiB arriving a record at a time took 2 MiB before).
    #[test]
    fn a_buffer_grows_toward_its_cap_never_past_it() {
        let cap = 1_000_000;
        let mut v: Vec<u8> = Vec::new();
        let mut grew = 0;
        while v.len() < cap {
            let n = 16_384.min(cap - v.len());
            let before = v.capacity();
            make_room(&mut v, n, cap);
            grew += usize::from(v.capacity() != before);
            v.resize(v.len() + n, 0);
        }
        assert!(v.capacity() <= cap + 16_384, "{}", v.capacity());
        assert!(grew < 12, "doubling, not a record at a time: {grew}");
    }

    /// A record's bytes in any pieces make one whole record, once the last comes; what
    /// cannot be a record is whole at once.
    #[test]
    fn records_are_whole_once_their_last_byte_comes() {
        let mut wire = vec![22, 3, 1, 0, 10];
        wire.extend([7u8; 10]);
        wire.extend([20, 3, 3, 0, 1, 1]);
        for cut in 1..wire.len() {
            let mut r = Records::default();
            r.take(&wire[..cut]);
            let first = r.take_whole();
            assert_eq!(first, cut >= 15, "cut at {cut}");
            r.take(&wire[cut..]);
            assert!(r.take_whole(), "the last record, cut at {cut}");
            assert!(!r.take_whole(), "asked once");
        }
        let mut r = Records::default();
        r.take(b"GET / HTTP/1.1\r\n");
        assert!(r.take_whole(), "not TLS");
        let mut r = Records::default();
        r.take(&[22, 3, 1, 0xff, 0xff, 1]);
        assert!(r.take_whole(), "longer than a record may be");
        let mut r = Records::default();
        r.take(&[22, 3, 1, 2, 0, 1, 0, 1]);
        assert!(!r.take_whole(), "a ClientHello begun");
    }
}

#[cfg(test)]
pub mod fake {
    use super::*;

    #[derive(Default)]
    pub struct Fake {
        /// Bytes the client has sent and the server not yet read.
        pub incoming: Vec<u8>,
        /// The client closed its side (after `incoming`).
        pub closed: bool,
        /// Bytes the wire takes before it is full (`None`: any).
        pub room: Option<usize>,
        /// What went out.
        pub sent: Vec<u8>,
        pub said_goodbye: bool,
        /// A buffer of this size before the wire, as rustls has (`None`: none).
        pub buffer: Option<usize>,
        pub buffered: Vec<u8>,
        /// The client presented a certificate.
        pub cert: bool,
        /// The client sent nothing whole yet.
        pub unstarted: bool,
        /// The end of the server's side was sent.
        pub shut: bool,
        /// Bytes read while handshaking.
        pub handshake: usize,
    }

    impl Fake {
        /// Puts what the wire takes of `bytes` on it.
        fn wire(&mut self, bytes: &[u8]) -> usize {
            let n = self.room.map_or(bytes.len(), |r| r.min(bytes.len()));
            if let Some(r) = &mut self.room {
                *r -= n;
            }
            self.sent.extend_from_slice(&bytes[..n]);
            n
        }
    }

    impl Transport for Fake {
        fn receive(&mut self, into: &mut Vec<u8>, cap: usize) -> io::Result<bool> {
            let n = self.incoming.len().min(cap.saturating_sub(into.len()));
            into.extend(self.incoming.drain(..n));
            Ok(self.closed && self.incoming.is_empty())
        }

        fn send(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if let Some(cap) = self.buffer {
                let n = cap.saturating_sub(self.buffered.len()).min(bytes.len());
                self.buffered.extend_from_slice(&bytes[..n]);
                return Ok(n);
            }
            Ok(self.wire(bytes))
        }

        fn flush(&mut self) -> io::Result<bool> {
            let pending = std::mem::take(&mut self.buffered);
            let n = self.wire(&pending);
            self.buffered = pending[n..].to_vec();
            Ok(self.buffered.is_empty())
        }

        fn handshake_bytes(&self) -> usize {
            self.handshake
        }

        fn handshaking(&self) -> bool {
            false
        }

        fn started(&self) -> bool {
            !self.unstarted
        }

        fn close(&mut self) {
            self.said_goodbye = true;
        }

        fn shutdown(&mut self) {
            self.shut = true;
        }

        fn peer_cert(&self) -> Option<CertificateDer<'static>> {
            self.cert
                .then(|| CertificateDer::from(b"a client".to_vec()))
        }
    }
}
