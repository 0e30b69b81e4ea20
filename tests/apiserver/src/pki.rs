//! Certificates for the test apiserver, made at start-up: a CA, a serving certificate for
//! `127.0.0.1`, `::1`, `localhost` and `kubernetes.default.svc`, and client certificates on
//! demand. `subject_cn` reads a client certificate's subject CN, which is the user name, as
//! the apiserver's x509 authenticator does.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate authority that can issue serving and client certificates.
pub struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
    /// The serving certificate, issued by this CA.
    pub server: CertPair,
}

impl Pki {
    /// A fresh CA named `name` and a serving certificate signed by it.
    pub fn new(name: &str) -> Pki {
        Pki::with_server_names(
            name,
            &["127.0.0.1", "::1", "localhost", "kubernetes.default.svc"],
        )
    }

    /// A fresh CA whose serving certificate has only `names` (for example a DNS-only one,
    /// reached by IP with `tls-server-name`).
    pub fn with_server_names(name: &str, names: &[&str]) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("empty SAN list");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("key generation");
        let ca = CertifiedIssuer::self_signed(params, key).expect("self-signed CA");
        let server = issue(
            &ca,
            "kube-apiserver",
            names,
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        Pki { ca, server }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    pub fn ca_der(&self) -> Vec<u8> {
        self.ca.der().to_vec()
    }

    /// A client certificate whose subject CN is `user`.
    pub fn client_cert(&self, user: &str) -> CertPair {
        issue(&self.ca, user, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate for `user` in `group` (the subject O, as the real apiserver's
    /// x509 authenticator reads it: `system:masters` is the admin group). One group only:
    /// rcgen keeps one value per attribute type.
    pub fn client_cert_in(&self, user: &str, group: &str) -> CertPair {
        issue_with(
            &self.ca,
            user,
            Some(group),
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }
}

/// A key pair for signing service-account tokens: the private key (PKCS#8, as
/// `--service-account-signing-key-file` reads it) and the public key (PKIX, for
/// `--service-account-key-file`, which reads no PKCS#8 EC key).
pub fn signing_key() -> (String, String) {
    let key = KeyPair::generate().expect("key generation");
    (key.serialize_pem(), key.public_key_pem())
}

fn issue(
    ca: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> CertPair {
    issue_with(ca, cn, None, sans, usage)
}

fn issue_with(
    ca: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    group: Option<&str>,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> CertPair {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(sans).expect("valid SANs");
    if let Some(g) = group {
        params.distinguished_name.push(DnType::OrganizationName, g);
    }
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![usage];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let key = KeyPair::generate().expect("key generation");
    let cert = params.signed_by(&key, ca).expect("signing");
    CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// One DER TLV: (tag, content, rest).
fn tlv(d: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, d) = d.split_first()?;
    let (&first, mut d) = d.split_first()?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || d.len() < n {
            return None;
        }
        let len = d[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | *b as usize);
        d = &d[n..];
        len
    };
    (d.len() >= len).then(|| (tag, &d[..len], &d[len..]))
}

/// The subject CommonName of a DER certificate.
pub fn subject_cn(der: &[u8]) -> Option<String> {
    let (_, cert, _) = tlv(der)?; // Certificate SEQUENCE
    let (_, tbs, _) = tlv(cert)?; // TBSCertificate SEQUENCE
    let mut rest = tbs;
    let (tag, _, r) = tlv(rest)?;
    if tag == 0xa0 {
        rest = r; // [0] version
    }
    let (_, _, r) = tlv(rest)?; // serialNumber
    let (_, _, r) = tlv(r)?; // signature algorithm
    let (_, _, r) = tlv(r)?; // issuer
    let (_, _, r) = tlv(r)?; // validity
    let (_, mut subject, _) = tlv(r)?;
    while !subject.is_empty() {
        let (_, set, r) = tlv(subject)?;
        subject = r;
        let (_, attr, _) = tlv(set)?;
        let (_, oid, value) = tlv(attr)?;
        if oid == [0x55, 0x04, 0x03] {
            let (_, cn, _) = tlv(value)?;
            return String::from_utf8(cn.to_vec()).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{CertificateDer, pem::PemObject};

    #[test]
    fn reads_the_subject_cn_not_the_issuers() {
        let pki = Pki::new("test-ca");
        let pair = pki.client_cert("alice");
        let der = CertificateDer::from_pem_slice(pair.cert_pem.as_bytes()).unwrap();
        assert_eq!(subject_cn(&der).as_deref(), Some("alice"));
        assert_eq!(subject_cn(&pki.ca_der()).as_deref(), Some("test-ca"));
        assert_eq!(subject_cn(b"\x30\x03junk"), None);
    }
}
