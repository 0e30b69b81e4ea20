//! TLS to the apiserver: a rustls `ClientConfig` (ring, TLS 1.2 and 1.3) built from the
//! configured trust and client identity, plugged into ureq as a connector.
//!
//! Building the config ourselves (rather than through ureq's `TlsConfig`) lets cmpoll check
//! a CA bundle and a certificate/key pair up front with a clear error (ureq drops unparsable
//! roots silently and panics on a key mismatch), use every certificate of a bundle, and set
//! the name the certificate is checked against (kubeconfig `tls-server-name`). The connector
//! uses ureq's `unversioned` API, which is why ureq is pinned to `~3.5`.

use std::fmt;
use std::io::{Read, Write};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme, StreamOwned};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, Transport,
    TransportAdapter,
};

/// Whom to trust.
#[derive(Clone, PartialEq, Eq)]
pub enum Trust {
    /// A PEM bundle (every certificate in it), and where it came from for messages.
    Pem { pem: Vec<u8>, origin: String },
    /// The platform's CA bundle.
    Platform,
    /// No verification at all (`insecure-skip-tls-verify`).
    Insecure,
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trust::Pem { origin, .. } => write!(f, "Pem({origin})"),
            Trust::Platform => f.write_str("Platform"),
            Trust::Insecure => f.write_str("Insecure"),
        }
    }
}

/// A client certificate chain and its key, both PEM. The key is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    pub cert_pem: Vec<u8>,
    pub key_pem: crate::secret::Secret,
    pub origin: String,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({}, key [REDACTED])", self.origin)
    }
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Where platforms keep their CA bundle.
const PLATFORM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

fn parse_certs(pem: &[u8], origin: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{origin}: not a PEM certificate bundle: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{origin}: no CERTIFICATE in it"));
    }
    Ok(certs)
}

/// The platform bundle: `$SSL_CERT_FILE`, or the first of the usual paths.
fn platform_roots(env: &dyn Fn(&str) -> Option<String>) -> Result<(Vec<u8>, String), String> {
    let candidates: Vec<String> = env("SSL_CERT_FILE")
        .into_iter()
        .chain(PLATFORM_BUNDLES.iter().map(|s| s.to_string()))
        .collect();
    for path in &candidates {
        if let Ok(pem) = std::fs::read(path) {
            return Ok((pem, format!("platform CA bundle '{path}'")));
        }
    }
    Err(format!(
        "no CA to verify the apiserver with: none configured and no platform bundle found ({})",
        candidates.join(", ")
    ))
}

/// `Platform` read into `Pem` (once, so the config can be rebuilt without the
/// environment); other kinds as they are.
pub fn resolve_trust(trust: &Trust, env: &dyn Fn(&str) -> Option<String>) -> Result<Trust, String> {
    Ok(match trust {
        Trust::Platform => {
            let (pem, origin) = platform_roots(env)?;
            Trust::Pem { pem, origin }
        }
        other => other.clone(),
    })
}

/// Builds the rustls config; every problem is a one-line error naming its origin.
pub fn client_config(
    trust: &Trust,
    identity: Option<&Identity>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<ClientConfig>, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match trust {
        Trust::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider))),
        Trust::Pem { pem, origin } => builder.with_root_certificates(root_store(pem, origin)?),
        Trust::Platform => {
            let (pem, origin) = platform_roots(env)?;
            builder.with_root_certificates(root_store(&pem, &origin)?)
        }
    };
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let chain = parse_certs(&id.cert_pem, &id.origin)?;
            let key = PrivateKeyDer::from_pem_slice(id.key_pem.expose().as_bytes())
                .map_err(|e| format!("{}: client key: not a PEM private key: {e}", id.origin))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("{}: client certificate and key: {e}", id.origin))?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn root_store(pem: &[u8], origin: &str) -> Result<rustls::RootCertStore, String> {
    let certs = parse_certs(pem, origin)?;
    let mut store = rustls::RootCertStore::empty();
    let (added, ignored) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!(
            "{origin}: none of its {ignored} certificates is usable as a CA"
        ));
    }
    Ok(store)
}

/// `insecure-skip-tls-verify`: accepts any certificate, still checks handshake signatures.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The ureq connector that wraps the TCP (or proxy tunnel) transport in our TLS.
#[derive(Debug)]
pub struct TlsConnector {
    pub config: Arc<ClientConfig>,
    /// Checked instead of the URL's host (kubeconfig `tls-server-name`).
    pub server_name: Option<ServerName<'static>>,
}

pub struct TlsTransport {
    buffers: LazyBuffers,
    stream: StreamOwned<ClientConnection, TransportAdapter>,
}

impl fmt::Debug for TlsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsTransport")
    }
}

impl<In: Transport> Connector<In> for TlsConnector {
    type Out = Either<In, TlsTransport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(transport) = chained else {
            return Ok(None);
        };
        if !details.needs_tls() || transport.is_tls() {
            return Ok(Some(Either::A(transport)));
        }
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => {
                let host = details.uri.host().unwrap_or_default();
                let host = host.trim_start_matches('[').trim_end_matches(']');
                ServerName::try_from(host.to_string())
                    .map_err(|_| ureq::Error::Tls("invalid server name"))?
            }
        };
        let mut conn = ClientConnection::new(self.config.clone(), name)
            .map_err(|e| ureq::Error::Io(std::io::Error::other(e)))?;
        let boxed: Box<dyn Transport> = Box::new(transport);
        let mut sock = TransportAdapter::new(boxed, details.current_time.clone());
        sock.set_timeout(details.timeout);
        conn.complete_io(&mut sock)?;
        let buffers = LazyBuffers::new(
            details.config.input_buffer_size(),
            details.config.output_buffer_size(),
        );
        Ok(Some(Either::B(TlsTransport {
            buffers,
            stream: StreamOwned { conn, sock },
        })))
    }
}

impl Transport for TlsTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let output = &self.buffers.output()[..amount];
        self.stream.write_all(output)?;
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let input = self.buffers.input_append_buf();
        let amount = self.stream.read(input)?;
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        self.stream.get_mut().get_mut().is_open()
    }

    fn is_tls(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn bad_trust_and_identity_are_errors_not_panics() {
        let e = client_config(
            &Trust::Pem {
                pem: b"not pem".to_vec(),
                origin: "--ca-file 'x'".into(),
            },
            None,
            &no_env,
        )
        .unwrap_err();
        assert!(e.starts_with("--ca-file 'x': no CERTIFICATE"), "{e}");
        let id = Identity {
            cert_pem: b"nope".to_vec(),
            key_pem: crate::secret::Secret::new("nope"),
            origin: "user 'u'".into(),
        };
        let e = client_config(&Trust::Insecure, Some(&id), &no_env).unwrap_err();
        assert!(e.contains("user 'u'"), "{e}");
        assert!(
            !format!("{id:?}").contains("nope\""),
            "the key never prints"
        );
    }

    #[test]
    fn platform_bundle_comes_from_ssl_cert_file_first() {
        let env = |k: &str| (k == "SSL_CERT_FILE").then(|| "/nonexistent/bundle.pem".to_string());
        match platform_roots(&env) {
            Ok((_, origin)) => assert!(!origin.contains("nonexistent")),
            Err(e) => assert!(e.contains("/nonexistent/bundle.pem"), "{e}"),
        }
    }
}
