//! A service-account token for the hub's own audience, verified by the hub (`--token-audience`,
//! docs/serve.md "Tokens for the hub"): a JWT (`HEADER.CLAIMS.SIGNATURE`, base64url) signed
//! by one of the cluster's service-account issuer keys (`issuer.rs`), with the claims the
//! apiserver's service-account authenticator checks — issuer, audience, expiry, not-before
//! and issued-at with go-jose's one-minute leeway — and the user it makes of them, as a
//! TokenReview would return it; and its lifetime (`exp` − `iat`, else `nbf`), which the hub
//! bounds. Nothing read from the token is trusted before its signature is; the time
//! arithmetic on its claims is done in `f64` and cannot overflow.

use std::collections::BTreeMap;

use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;

use super::user::User;

/// go-jose's `DefaultLeeway`, which the apiserver's validator uses for `exp` and `nbf`.
pub const LEEWAY_SECS: f64 = 60.0;

/// One of the issuer's public keys, as its JWKS gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    /// RSA: modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// ECDSA on P-256 or P-384: the uncompressed point (`0x04 ‖ x ‖ y`).
    Ec { curve: Curve, point: Vec<u8> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Curve {
    P256,
    P384,
}

/// A token split and read, its signature not yet checked.
#[derive(Debug)]
pub struct Token<'a> {
    pub alg: String,
    pub kid: Option<String>,
    signed: &'a str,
    signature: Vec<u8>,
    pub claims: Claims,
}

/// The claims the hub reads.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    #[serde(deserialize_with = "one_or_many")]
    pub aud: Vec<String>,
    pub exp: Option<f64>,
    pub nbf: Option<f64>,
    pub iat: Option<f64>,
    pub jti: Option<String>,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: Option<Private>,
}

/// The service account's own claims (`kubernetes.io`).
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct Private {
    pub namespace: String,
    pub serviceaccount: Ref,
    pub pod: Option<Ref>,
    pub node: Option<Ref>,
    pub secret: Option<Ref>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

/// `aud` is a string or an array of strings (RFC 7519 §4.1.3).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Aud {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Aud::deserialize(d)? {
        Aud::One(a) => vec![a],
        Aud::Many(a) => a,
    })
}

/// base64url as RFC 7515 §2 writes it: no padding, no stray bits (one spelling a token).
fn b64(part: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .ok()
}

/// base64url as a lenient reader takes it (Go's `RawURLEncoding` ignores stray bits, and
/// go-jose trims any padding first): several spellings of the same bytes.
const LENIENT: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// A key's part from the issuer's JWKS (the apiserver's own, read leniently).
fn key_b64(part: &str) -> Option<Vec<u8>> {
    LENIENT.decode(part).ok()
}

/// Whether `token` is a JWT spelled otherwise than canonically: three parts that a lenient
/// reader decodes, one of them padded or with stray bits. A reader that takes such a
/// spelling sees one token where the hub, which keys what it knows of a token (its review,
/// the connections it holds) by its bytes, would see many: the hub refuses it.
pub fn noncanonical(token: &str) -> bool {
    // go-jose strips whitespace anywhere before it splits a compact JWS (Go's
    // `unicode.IsSpace`: Unicode's White_Space, as `char::is_whitespace`).
    let bare: String = token.chars().filter(|c| !c.is_whitespace()).collect();
    let parts: Vec<&str> = bare.split('.').collect();
    let lenient = |p: &str| LENIENT.decode(p.trim_end_matches('=')).ok();
    // A JWT: three parts, its header a JSON object (an opaque token of three parts, a
    // static one, is its own bytes).
    let jwt = parts.len() == 3
        && (parts.iter()).all(|p| lenient(p).is_some())
        && lenient(parts[0]).is_some_and(|h| {
            serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&h).is_ok()
        });
    jwt && (bare.len() != token.len() || parts.iter().any(|p| b64(p).is_none()))
}

/// A compact JWT (`HEADER.CLAIMS.SIGNATURE`) split, each part decoded as RFC 7515 spells
/// it (`b64`): the one reader of a token's parts.
struct Parts<'a> {
    signed: &'a str,
    header: Vec<u8>,
    claims: Vec<u8>,
    signature: Vec<u8>,
}

fn split(token: &str) -> Option<Parts<'_>> {
    let (signed, signature) = token.rsplit_once('.')?;
    let (header, claims) = signed.split_once('.')?;
    Some(Parts {
        signed,
        header: b64(header)?,
        claims: b64(claims)?,
        signature: b64(signature)?,
    })
}

/// Splits and reads `token`; `None` when it is not a JWT at all.
pub fn read(token: &str) -> Option<Token<'_>> {
    #[derive(Deserialize)]
    struct Header {
        alg: String,
        kid: Option<String>,
    }
    let parts = split(token)?;
    let header: Header = serde_json::from_slice(&parts.header).ok()?;
    let claims: Claims = serde_json::from_slice(&parts.claims).ok()?;
    Some(Token {
        alg: header.alg,
        kid: header.kid,
        signed: parts.signed,
        signature: parts.signature,
        claims,
    })
}

/// A JWT's `exp` as any JSON number, whatever its other claims say and its signature
/// unchecked: only for a token a TokenReview already vouched for (`authn.rs` keeps its
/// review no longer than the token lives). `None`: not a JWT, or no `exp`.
pub fn expiry(token: &str) -> Option<serde_json::Number> {
    #[derive(Deserialize)]
    struct Exp {
        exp: Option<serde_json::Number>,
    }
    serde_json::from_slice::<Exp>(&split(token)?.claims)
        .ok()?
        .exp
}

impl Token<'_> {
    /// Whether `key` signed it with its `alg`. `None`: an algorithm the hub does not
    /// check itself (the apiserver may: ask it).
    pub fn signed_by(&self, key: &Key) -> Option<bool> {
        let msg = self.signed.as_bytes();
        let ok = match (self.alg.as_str(), key) {
            ("RS256" | "RS384" | "RS512", Key::Rsa { n, e }) => {
                let alg = match self.alg.as_str() {
                    "RS256" => &signature::RSA_PKCS1_2048_8192_SHA256,
                    "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                    _ => &signature::RSA_PKCS1_2048_8192_SHA512,
                };
                RsaPublicKeyComponents { n, e }
                    .verify(alg, msg, &self.signature)
                    .is_ok()
            }
            (
                "ES256",
                Key::Ec {
                    curve: Curve::P256,
                    point,
                },
            ) => UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(msg, &self.signature)
                .is_ok(),
            (
                "ES384",
                Key::Ec {
                    curve: Curve::P384,
                    point,
                },
            ) => UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                .verify(msg, &self.signature)
                .is_ok(),
            ("RS256" | "RS384" | "RS512" | "ES256" | "ES384", _) => false,
            _ => return None,
        };
        Some(ok)
    }

    /// Whether its claims hold at `now` (Unix seconds) for `issuer` and `audience`: the
    /// apiserver's words for what does not.
    pub fn valid(&self, issuer: &str, audience: &str, now: f64) -> Result<(), String> {
        let c = &self.claims;
        if c.iss != issuer {
            return Err("service account token has another issuer".into());
        }
        if !c.aud.iter().any(|a| a == audience) {
            return Err("token audiences do not include the hub's".into());
        }
        match c.exp {
            Some(exp) if now > exp + LEEWAY_SECS => {
                return Err("service account token has expired".into());
            }
            Some(_) => {}
            None => return Err("service account token has no expiry".into()),
        }
        if c.nbf.is_some_and(|nbf| now < nbf - LEEWAY_SECS) {
            return Err("service account token is not valid yet".into());
        }
        if c.iat.is_some_and(|iat| now < iat - LEEWAY_SECS) {
            return Err("service account token is issued in the future".into());
        }
        let private = c.kubernetes.as_ref().ok_or("not a service account token")?;
        if private.namespace.is_empty() || private.serviceaccount.name.is_empty() {
            return Err("not a service account token".into());
        }
        Ok(())
    }

    /// The user its claims make, as the apiserver's service-account authenticator makes
    /// it (`ServiceAccountInfo.UserInfo`).
    pub fn user(&self) -> Option<User> {
        let p = self.claims.kubernetes.as_ref()?;
        let ns = &p.namespace;
        let mut extra = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            if !v.is_empty() {
                extra.insert(
                    format!("authentication.kubernetes.io/{k}"),
                    vec![v.to_string()],
                );
            }
        };
        if let Some(pod) = &p.pod {
            put("pod-name", &pod.name);
            put("pod-uid", &pod.uid);
        }
        if let Some(node) = &p.node {
            put("node-name", &node.name);
            put("node-uid", &node.uid);
        }
        if let Some(jti) = &self.claims.jti {
            put("credential-id", &format!("JTI={jti}"));
        }
        Some(User {
            name: format!("system:serviceaccount:{ns}:{}", p.serviceaccount.name),
            uid: p.serviceaccount.uid.clone(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
            extra,
        })
    }

    /// Until when it may be trusted (Unix seconds): its expiry, leeway included.
    pub fn expires(&self) -> f64 {
        self.claims.exp.unwrap_or(0.0) + LEEWAY_SECS
    }

    /// Whether its time claims hold at `now` (Unix seconds), whatever else it says: it
    /// may still be valid.
    pub fn fresh(&self, now: f64) -> bool {
        let c = &self.claims;
        c.exp.is_some_and(|exp| now <= exp + LEEWAY_SECS)
            && !c.nbf.is_some_and(|nbf| now < nbf - LEEWAY_SECS)
    }

    /// How long it was issued to live, in seconds: `exp` − `iat` (else `nbf`, the same
    /// moment in the tokens the apiserver issues); `None` without either.
    pub fn lifetime(&self) -> Option<f64> {
        let c = &self.claims;
        Some(c.exp? - c.iat.or(c.nbf)?)
    }
}

/// The keys of a JWKS document (`/openid/v1/jwks`), by key id; keys of a type the hub
/// does not check are left out (their tokens go to a TokenReview).
pub fn keys(jwks: &[u8]) -> Result<BTreeMap<String, Key>, String> {
    #[derive(Deserialize)]
    struct Set {
        keys: Vec<Jwk>,
    }
    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct Jwk {
        kty: String,
        kid: String,
        crv: String,
        n: String,
        e: String,
        x: String,
        y: String,
    }
    let set: Set =
        serde_json::from_slice(jwks).map_err(|e| format!("not a JSON Web Key Set: {e}"))?;
    let mut out = BTreeMap::new();
    for k in set.keys {
        let key = match (k.kty.as_str(), k.crv.as_str()) {
            ("RSA", _) => match (key_b64(&k.n), key_b64(&k.e)) {
                (Some(n), Some(e)) => Key::Rsa { n, e },
                _ => continue,
            },
            ("EC", "P-256" | "P-384") => {
                let curve = match k.crv.as_str() {
                    "P-256" => Curve::P256,
                    _ => Curve::P384,
                };
                let (Some(x), Some(y)) = (key_b64(&k.x), key_b64(&k.y)) else {
                    continue;
                };
                let point = [&[4u8][..], &x, &y].concat();
                Key::Ec { curve, point }
            }
            _ => continue,
        };
        out.insert(k.kid, key);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::testing::{Signer, enc};

    fn claims(aud: &str, exp: f64) -> serde_json::Value {
        serde_json::json!({
            "iss": "https://kubernetes.default.svc",
            "sub": "system:serviceaccount:team:agent",
            "aud": [aud],
            "exp": exp,
            "nbf": 1000.0,
            "jti": "j-1",
            "kubernetes.io": {
                "namespace": "team",
                "serviceaccount": {"name": "agent", "uid": "sa-uid"},
                "pod": {"name": "agent-x", "uid": "pod-uid"},
                "node": {"name": "n1", "uid": "node-uid"}
            }
        })
    }

    const ISS: &str = "https://kubernetes.default.svc";

    #[test]
    fn a_token_signed_by_the_issuer_for_the_hub_is_its_service_account() {
        let s = Signer::new("k1");
        let token = s.sign(&claims("cmpoll-hub", 5000.0));
        let t = read(&token).unwrap();
        assert_eq!((t.alg.as_str(), t.kid.as_deref()), ("ES256", Some("k1")));
        assert_eq!(t.signed_by(&s.key()), Some(true));
        assert_eq!(
            t.signed_by(&Signer::new("k1").key()),
            Some(false),
            "another key"
        );
        assert_eq!(t.valid(ISS, "cmpoll-hub", 2000.0), Ok(()));
        let u = t.user().unwrap();
        assert_eq!(u.name, "system:serviceaccount:team:agent");
        assert_eq!(u.uid, "sa-uid");
        assert_eq!(
            u.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:team",
                "system:authenticated"
            ]
        );
        assert_eq!(
            u.extra.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "authentication.kubernetes.io/credential-id",
                "authentication.kubernetes.io/node-name",
                "authentication.kubernetes.io/node-uid",
                "authentication.kubernetes.io/pod-name",
                "authentication.kubernetes.io/pod-uid"
            ]
        );
        assert_eq!(
            u.extra["authentication.kubernetes.io/credential-id"],
            ["JTI=j-1"]
        );
    }

    #[test]
    fn claims_that_do_not_hold_are_refused_in_the_apiservers_words() {
        let s = Signer::new("k1");
        let t = s.sign(&claims("cmpoll-hub", 5000.0));
        let t = read(&t).unwrap();
        assert!(t.valid(ISS, "other", 2000.0).is_err(), "another audience");
        assert!(t.valid("https://elsewhere", "cmpoll-hub", 2000.0).is_err());
        assert_eq!(
            t.valid(ISS, "cmpoll-hub", 5061.0),
            Err("service account token has expired".into())
        );
        assert_eq!(t.valid(ISS, "cmpoll-hub", 5059.0), Ok(()), "the leeway");
        assert_eq!(
            t.valid(ISS, "cmpoll-hub", 900.0),
            Err("service account token is not valid yet".into())
        );
        let mut future = claims("cmpoll-hub", 5000.0);
        future["iat"] = serde_json::json!(3000.0);
        let future = s.sign(&future);
        assert_eq!(
            read(&future).unwrap().valid(ISS, "cmpoll-hub", 2000.0),
            Err("service account token is issued in the future".into())
        );
        // A claim too large for any clock is compared, never added to one.
        let huge = s.sign(&claims("cmpoll-hub", 1.8e19));
        assert_eq!(
            read(&huge).unwrap().valid(ISS, "cmpoll-hub", 2000.0),
            Ok(())
        );
        // Another payload under the same signature: not what the issuer signed.
        let orig = s.sign(&claims("cmpoll-hub", 5000.0));
        let longer = enc(claims("cmpoll-hub", 9e9).to_string().as_bytes());
        let mut parts: Vec<&str> = orig.split('.').collect();
        parts[1] = &longer;
        let forged = parts.join(".");
        assert_eq!(read(&forged).unwrap().signed_by(&s.key()), Some(false));
        // Not a JWT, or an algorithm it leaves to the apiserver.
        assert!(read("opaque-token").is_none());
        let none = format!("{}.{}.", enc(br#"{"alg":"none"}"#), enc(b"{}"));
        assert_eq!(read(&none).unwrap().signed_by(&s.key()), None);
    }

    #[test]
    fn a_tokens_lifetime_is_exp_less_iat_else_nbf() {
        let s = Signer::new("k1");
        let mut c = claims("cmpoll-hub", 4600.0);
        let t = s.sign(&c);
        assert_eq!(read(&t).unwrap().lifetime(), Some(3600.0), "from nbf");
        c["iat"] = serde_json::json!(4000.0);
        let t = s.sign(&c);
        assert_eq!(read(&t).unwrap().lifetime(), Some(600.0), "from iat");
        c.as_object_mut().unwrap().remove("iat");
        c.as_object_mut().unwrap().remove("nbf");
        let t = s.sign(&c);
        assert_eq!(read(&t).unwrap().lifetime(), None);
        let t = read(&t).unwrap();
        assert!(t.fresh(4600.0 + LEEWAY_SECS) && !t.fresh(4600.0 + LEEWAY_SECS + 1.0));
    }

    #[test]
    fn a_jwks_gives_the_keys_the_hub_can_check() {
        let jwks = br#"{"keys":[
            {"use":"sig","kty":"RSA","kid":"r","alg":"RS256","n":"AQAB","e":"AQAB"},
            {"use":"sig","kty":"EC","kid":"e","crv":"P-256","alg":"ES256","x":"AQ","y":"Ag"},
            {"use":"sig","kty":"EC","kid":"big","crv":"P-521","x":"AQ","y":"Ag"},
            {"use":"sig","kty":"OKP","kid":"ed","crv":"Ed25519","x":"AQ"}
        ]}"#;
        let k = keys(jwks).unwrap();
        assert_eq!(k.keys().collect::<Vec<_>>(), ["e", "r"]);
        assert_eq!(
            k["e"],
            Key::Ec {
                curve: Curve::P256,
                point: vec![4, 1, 2]
            }
        );
        assert!(keys(b"{}").is_err());
    }

    #[test]
    fn a_token_spelled_otherwise_than_canonically_is_told_apart() {
        let t = Signer::new("k1").sign(&claims("https://kubernetes.default.svc", 2e9));
        assert!(!noncanonical(&t), "{t}");
        assert!(read(&t).is_some());
        let (rest, sig) = t.rsplit_once('.').unwrap();
        // Padded: what go-jose trims.
        let padded = format!("{rest}.{sig}==");
        assert!(noncanonical(&padded));
        assert!(read(&padded).is_none());
        // A stray bit in the last character: the same bytes to Go's RawURLEncoding.
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let last = sig.as_bytes()[sig.len() - 1];
        let i = alphabet.iter().position(|c| *c == last).unwrap();
        let stray = format!(
            "{rest}.{}{}",
            &sig[..sig.len() - 1],
            alphabet[i ^ 1] as char
        );
        assert_eq!(
            LENIENT.decode(&stray[rest.len() + 1..]).unwrap(),
            b64(sig).unwrap()
        );
        assert!(noncanonical(&stray));
        // Whitespace anywhere: what go-jose strips.
        for space in [" ", "\u{a0}", "\u{3000}", "\u{b}"] {
            let spaced = format!("{}{space}{}", &t[..5], &t[5..]);
            assert!(noncanonical(&spaced), "{space:?}");
        }
        // Not a JWT at all: opaque, as a static or bootstrap token is (three parts of
        // base64url with stray bits, but no JSON header, included).
        assert!(LENIENT.decode("baz").is_ok() && b64("baz").is_none());
        for opaque in [
            "abcdef.0123456789abcdef",
            "a.b.c==",
            "foo.bar.baz",
            "not a token",
        ] {
            assert!(!noncanonical(opaque), "{opaque}");
        }
    }
}
