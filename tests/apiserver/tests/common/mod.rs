//! A raw HTTP/1.1 client over rustls for protocol tests: it shows the wire as it is
//! (status, headers, framing, gzip) with nothing in between.

#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use test_apiserver::{CertPair, TOKEN, TestApiserver};

pub struct Raw {
    pub status: u16,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    /// The body as sent (still gzip-compressed if it was), de-chunked.
    pub body: Vec<u8>,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

#[derive(Clone)]
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    pub headers: Vec<(String, String)>,
}

impl Client {
    /// A client that trusts the server's CA and sends the default token.
    pub fn new(server: &TestApiserver) -> Client {
        Self::with_cert(server, None).bearer(TOKEN)
    }

    /// A client without credentials, optionally presenting a client certificate.
    pub fn with_cert(server: &TestApiserver, cert: Option<&CertPair>) -> Client {
        Self::to(server.addr(), &server.ca_pem(), cert)
    }

    /// A client of any server at `addr` whose CA is `ca_pem` (the real apiserver too).
    pub fn to(addr: std::net::SocketAddr, ca_pem: &str, cert: Option<&CertPair>) -> Client {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let b = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let cfg = match cert {
            None => b.with_no_client_auth(),
            Some(pair) => {
                let chain = vec![CertificateDer::from_pem_slice(pair.cert_pem.as_bytes()).unwrap()];
                let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap();
                b.with_client_auth_cert(chain, key).unwrap()
            }
        };
        Client {
            tls: Arc::new(cfg),
            addr,
            headers: Vec::new(),
        }
    }

    pub fn bearer(mut self, token: &str) -> Client {
        self.headers
            .retain(|(k, _)| !k.eq_ignore_ascii_case("authorization"));
        self.headers
            .push(("Authorization".into(), format!("Bearer {token}")));
        self
    }

    pub fn header(mut self, k: &str, v: &str) -> Client {
        self.headers.push((k.into(), v.into()));
        self
    }

    /// This client with header `k` set to `v` (replacing any value it had).
    pub fn with_header(&self, k: &str, v: &str) -> Client {
        let mut c = self.clone();
        c.headers.retain(|(h, _)| !h.eq_ignore_ascii_case(k));
        c.headers.push((k.into(), v.into()));
        c
    }

    /// GET `target`; `Err` when the connection fails or is cut.
    pub fn try_get(&self, target: &str) -> io::Result<Raw> {
        let tcp = TcpStream::connect(self.addr)?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let conn =
            rustls::ClientConnection::new(self.tls.clone(), name).map_err(io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let mut req = format!("GET {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
        for (k, v) in &self.headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        tls.write_all(req.as_bytes())?;
        read_response(BufReader::new(tls))
    }

    pub fn get(&self, target: &str) -> Raw {
        self.try_get(target)
            .unwrap_or_else(|e| panic!("GET {target}: {e}"))
    }
}

fn read_response<R: BufRead>(mut r: R) -> io::Result<Raw> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("status line {line:?}"))
        })?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if let Some(len) = get("content-length") {
        let len: usize = len.parse().unwrap();
        body.resize(len, 0);
        r.read_exact(&mut body)?;
    } else if get("transfer-encoding").as_deref() == Some("chunked") {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Raw {
        status,
        headers,
        body,
    })
}
