//! Clients that do not behave: a connection that stalls in the TLS handshake, one that
//! sends half a request and waits. What a server that holds real clients within a bound
//! must outlast (`tests/webhook.rs`, `tests/real/serve.rs`).

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;

/// A connection that says it starts a TLS handshake and then says nothing more.
pub fn stalled_handshake(addr: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).ok()?;
    // A TLS record header announcing a 512-byte ClientHello, and three bytes of it.
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01])
        .ok()?;
    Some(s)
}

/// A TLS connection to `addr` (127.0.0.1:PORT) trusting `ca`, its handshake still to come.
pub fn tls_to(
    addr: &str,
    ca: &str,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    tls_over(TcpStream::connect(addr).ok()?, ca)
}

/// `tls_to`, from a socket whose receive buffer is `rcvbuf` bytes (set before it
/// connects, so that the kernel never grows it): a client that does not read then holds
/// next to nothing on its side, and what the server queued for it is all the server's.
pub fn tls_with_small_window(
    addr: &str,
    ca: &str,
    rcvbuf: usize,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    use rustix::net::{AddressFamily, SocketType, connect, socket, sockopt};
    let to: std::net::SocketAddr = addr.parse().ok()?;
    let fd = socket(AddressFamily::INET, SocketType::STREAM, None).ok()?;
    sockopt::set_socket_recv_buffer_size(&fd, rcvbuf).ok()?;
    connect(&fd, &to).ok()?;
    tls_over(TcpStream::from(fd), ca)
}

/// A connection to `addr` from the local address `from` (another loopback address, say
/// 127.0.0.2: a client elsewhere, as the server sees it).
pub fn connect_from(addr: &str, from: std::net::IpAddr) -> Option<TcpStream> {
    use rustix::net::{AddressFamily, SocketType, bind, connect, socket};
    let to: std::net::SocketAddr = addr.parse().ok()?;
    let fd = socket(AddressFamily::INET, SocketType::STREAM, None).ok()?;
    bind(&fd, &std::net::SocketAddr::new(from, 0)).ok()?;
    connect(&fd, &to).ok()?;
    Some(TcpStream::from(fd))
}

/// A ClientHello for a server `ca` signed (as rustls sends it first): sent as it is on
/// many connections, each makes the server do a whole handshake's first flight.
pub fn client_hello(ca: &str) -> Vec<u8> {
    let mut tls = tls_over_nothing(ca);
    let mut hello = Vec::new();
    while tls.wants_write() {
        tls.write_tls(&mut hello).unwrap();
    }
    hello
}

fn tls_over_nothing(ca: &str) -> rustls::ClientConnection {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    rustls::ClientConnection::new(Arc::new(config), name).unwrap()
}

/// A TLS client over `sock`, trusting `ca`.
pub fn tls_over(
    sock: TcpStream,
    ca: &str,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.ok()?).ok()?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("127.0.0.1").ok()?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    sock.set_read_timeout(Some(std::time::Duration::from_secs(15)))
        .ok()?;
    Some(rustls::StreamOwned::new(conn, sock))
}

/// A connection that completes the handshake (trusting `ca`) and sends half a request.
pub fn stalled_request(
    addr: &str,
    ca: &str,
    line: &str,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let mut tls = tls_to(addr, ca)?;
    tls.write_all(
        format!("{line} HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n{{\"apiVersion\"")
            .as_bytes(),
    )
    .ok()?;
    Some(tls)
}

/// Sends `request` over a fresh TLS connection to `addr` (trusting `ca`) and reads until
/// the server closes it or `within` passes: every byte that came back, and whether the
/// server closed the connection.
pub fn exchange(
    addr: &str,
    ca: &str,
    request: &[u8],
    within: std::time::Duration,
) -> (Vec<u8>, bool) {
    use std::io::Read;
    let Some(mut tls) = tls_to(addr, ca) else {
        return (Vec::new(), false);
    };
    let _ = tls.sock.set_read_timeout(Some(within));
    if tls.write_all(request).is_err() {
        return (Vec::new(), true);
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tls.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                break false;
            }
            // A reset, or a close without close_notify: closed all the same.
            Err(_) => break true,
        }
    };
    (got, closed)
}

/// The requests a client may hide behind a body whose length is told twice, or wrongly
/// (issue 47.6): each, sent alone on a connection, must get one 400 and the connection
/// closed, never an answer to the hidden request.
pub fn smuggled(path: &str) -> Vec<Vec<u8>> {
    let hidden = format!("GET {path} HTTP/1.1\r\nHost: hidden\r\n\r\n");
    let n = hidden.len();
    vec![
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: {n}\r\n\r\n{hidden}"),
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\nContent-Length: 0\r\n\r\n{hidden}"),
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: +{n}\r\n\r\n{hidden}"),
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {n}, 0\r\n\r\n{hidden}"),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect()
}

/// `smuggled`'s check: one answer, a 400, and the connection closed.
pub fn refused_whole(addr: &str, ca: &str, request: &[u8]) -> Result<(), String> {
    let (got, closed) = exchange(addr, ca, request, std::time::Duration::from_secs(5));
    let text = String::from_utf8_lossy(&got);
    let answers = text.matches("HTTP/1.1 ").count();
    if text.starts_with("HTTP/1.1 400 ") && answers == 1 && closed {
        Ok(())
    } else {
        Err(format!("{answers} answers, closed: {closed}: {text}"))
    }
}
