//! The serving certificate of an HTTPS server (`cmpoll webhook`, `cmpoll serve`): a rustls
//! `ServerConfig` whose certificate resolver re-reads `--tls-cert-file` and
//! `--tls-key-file` when either changes (cert-manager and kubelet's Secret volumes swap them
//! in place), checked at most once a second from the handshakes themselves. A pair that
//! does not load (half-written, mismatched) keeps the previous one, with a warning; at
//! start-up it is a configuration error naming the flag.
//!
//! With `--client-ca-file`, a client that presents a certificate must present one that CA
//! signed (the apiserver's client certificate for webhooks, which its AdmissionConfiguration
//! names), or the handshake fails; a client may present none (kubelet's probes do not), and
//! the server then decides per request (`Peer::cert`). The CA bundle is read at start.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::kube::auth::{Stamp, stamp};
use crate::locks::Recover;

/// How often a handshake may look at the files.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Reads and checks a pair: the chain, the key, and that they belong together.
pub fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("--tls-cert-file '{}': {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--tls-cert-file '{}': {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert-file '{}': no certificate in it",
            cert.display()
        ));
    }
    let der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key-file '{}': {e}", key.display()))?;
    let provider = crate::http::tls::provider();
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| format!("--tls-key-file '{}': {e}", key.display()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        format!(
            "--tls-key-file '{}' is not the key of --tls-cert-file '{}': {e}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(Arc::new(certified))
}

/// The current pair, re-read when its files change.
#[derive(Debug)]
pub struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    current: Arc<CertifiedKey>,
    stamps: (Option<Stamp>, Option<Stamp>),
    checked: Instant,
}

impl Reloading {
    pub fn new(cert: PathBuf, key: PathBuf) -> Result<Reloading, String> {
        let current = load(&cert, &key)?;
        let stamps = (stamp(&cert), stamp(&key));
        Ok(Reloading {
            cert,
            key,
            state: Mutex::new(State {
                current,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The pair to serve now (re-read first if the files changed).
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut s = self.state.lock().recover();
        if s.checked.elapsed() >= CHECK_EVERY {
            s.checked = Instant::now();
            let now = (stamp(&self.cert), stamp(&self.key));
            if now != s.stamps {
                match load(&self.cert, &self.key) {
                    Ok(pair) => {
                        log::info!(
                            "serving certificate '{}' changed: serving the new one",
                            self.cert.display()
                        );
                        s.current = pair;
                        s.stamps = now;
                    }
                    // Read again at the next check: the other file may not be there yet.
                    Err(e) => log::warn!("{e}; serving the previous certificate"),
                }
            }
        }
        s.current.clone()
    }

    /// A server config that asks this resolver at every handshake and, with `client_ca`
    /// (the `--client-ca-file` bundle), accepts only clients with a certificate it signed.
    pub fn config(self: &Arc<Self>, client_ca: Option<&Path>) -> Result<Arc<ServerConfig>, String> {
        let provider = crate::http::tls::provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(file) => {
                let fail = |e: &dyn std::fmt::Display| {
                    format!("--client-ca-file '{}': {e}", file.display())
                };
                let mut roots = rustls::RootCertStore::empty();
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(file)
                    .map_err(|e| fail(&e))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| fail(&e))?;
                let (added, ignored) = roots.add_parsable_certificates(certs);
                if added == 0 || ignored > 0 {
                    return Err(fail(&format!(
                        "{added} usable certificate(s), {ignored} unusable"
                    )));
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .allow_unauthenticated()
                .build()
                .map_err(|e| fail(&e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(self.clone());
        // The apiserver's client speaks HTTP/1.1 when the server offers nothing else.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn a_new_pair_is_served_and_a_broken_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c1, k1) = pair("one.example");
        std::fs::write(&cert, &c1).unwrap();
        std::fs::write(&key, &k1).unwrap();
        let r = Reloading::new(cert.clone(), key.clone()).unwrap();
        let first = r.current();
        // A new pair, written as a Secret volume swaps files.
        let (c2, k2) = pair("two.example");
        std::fs::write(dir.path().join("new.crt"), &c2).unwrap();
        std::fs::write(dir.path().join("new.key"), &k2).unwrap();
        std::fs::rename(dir.path().join("new.crt"), &cert).unwrap();
        std::fs::rename(dir.path().join("new.key"), &key).unwrap();
        r.state.lock().unwrap().checked -= CHECK_EVERY;
        let second = r.current();
        assert_ne!(first.cert, second.cert, "the new certificate is served");
        // Half a rotation: the new certificate with the old key does not load.
        let (c3, _) = pair("three.example");
        std::fs::write(&cert, &c3).unwrap();
        r.state.lock().unwrap().checked -= CHECK_EVERY;
        assert_eq!(r.current().cert, second.cert, "the previous pair stays");
        // Start-up errors name the flag.
        let e = Reloading::new(cert.clone(), key.clone()).unwrap_err();
        assert!(e.starts_with("--tls-key-file"), "{e}");
        let e = Reloading::new(dir.path().join("none"), key).unwrap_err();
        assert!(e.starts_with("--tls-cert-file"), "{e}");
    }
}
