//! Made-up polls for the hub's unit tests (`history`, `watch`), a made-up issuer's
//! signing key (`jwt`, `issuer`) and a made-up apiserver's reviews (`authn`, `authz`,
//! `auth`).

use std::collections::BTreeMap;

use super::held::{Gather, Held};
use crate::source::{Collect, Item, RawObject, Resource, Resources};

/// An object as the apiserver lists it: `ns/name` at `rv`, with `labels`.
pub fn item(ns: &str, name: &str, rv: u64, labels: &[(&str, &str)]) -> Item {
    let labels_json: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let metadata = serde_json::json!({"name": name, "namespace": ns,
        "resourceVersion": rv.to_string(), "labels": labels_json})
    .to_string();
    let json = format!("{{\"metadata\":{metadata},\"data\":{{\"k\":\"{rv}\"}}}}");
    let m = "{\"metadata\":".len();
    Item {
        kind: Resource::ConfigMaps,
        namespace: ns.into(),
        name: name.into(),
        resource_version: rv.to_string(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        raw: Some(RawObject {
            json: json.as_bytes().into(),
            metadata: m..m + metadata.len(),
        }),
        ..Item::default()
    }
}

/// A poll that listed `scopes` (namespace, resourceVersion) and found `items`.
pub fn poll(prev: &Held, n: u64, scopes: &[(Option<&str>, u64)], items: Vec<Item>) -> Held {
    let mut g = Gather::new(prev);
    for i in items {
        g.item(i).unwrap();
    }
    for (ns, rv) in scopes {
        g.listed(Resource::ConfigMaps, *ns, &rv.to_string());
    }
    g.finish(n).unwrap()
}

/// What a configmaps request to `path` (`/api/v1/…`) with `query` selects.
pub fn filter(path: &str, query: &str) -> super::watch::Filter {
    let super::request::Route::Read(target) = super::request::route(path) else {
        panic!("{path} is no read")
    };
    let q = super::request::Query::parse(query);
    super::watch::Filter::of(&super::request::ask(target, &q, &|_| None).unwrap())
}

pub fn kinds() -> Resources {
    Resources::one(Resource::ConfigMaps)
}

/// base64url without padding, as JWTs and JWKs write it.
pub fn enc(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// A P-256 signing key of id `kid`, as a service-account issuer's: its JWK, and tokens
/// it signs (ES256).
pub struct Signer(ring::signature::EcdsaKeyPair, String);

impl Signer {
    pub fn new(kid: &str) -> Signer {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        Signer(key, kid.to_string())
    }

    pub fn key(&self) -> super::jwt::Key {
        use ring::signature::KeyPair as _;
        super::jwt::Key::Ec {
            curve: super::jwt::Curve::P256,
            point: self.0.public_key().as_ref().to_vec(),
        }
    }

    /// Its JWK, as `/openid/v1/jwks` lists it.
    pub fn jwk(&self) -> serde_json::Value {
        use ring::signature::KeyPair as _;
        let point = self.0.public_key().as_ref();
        serde_json::json!({"use": "sig", "kty": "EC", "kid": self.1, "crv": "P-256",
            "alg": "ES256", "x": enc(&point[1..33]), "y": enc(&point[33..])})
    }

    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let head = enc(format!(r#"{{"alg":"ES256","kid":"{}"}}"#, self.1).as_bytes());
        let body = enc(claims.to_string().as_bytes());
        let signed = format!("{head}.{body}");
        let rng = ring::rand::SystemRandom::new();
        let sig = self.0.sign(&rng, signed.as_bytes()).unwrap();
        format!("{signed}.{}", enc(sig.as_ref()))
    }
}

/// A made-up apiserver's reviews: token "good" is alice (every token, with `anyone`), who
/// may list configmaps in "team-a" only; every service account exists with uid "sa-uid";
/// how many reviews it made of each kind, and, with `fail`, reviews it cannot make.
#[derive(Default)]
pub struct Fake {
    pub tokens: std::sync::atomic::AtomicUsize,
    pub access: std::sync::atomic::AtomicUsize,
    pub accounts: std::sync::atomic::AtomicUsize,
    pub fail: std::sync::atomic::AtomicBool,
    pub anyone: bool,
    /// The audience the last TokenReview asked for.
    pub audience: std::sync::Mutex<Option<String>>,
}

impl super::reviewer::Reviewer for std::sync::Arc<Fake> {
    fn token(
        &self,
        token: &crate::secret::Secret,
        audience: Option<&str>,
    ) -> Result<Option<super::user::User>, String> {
        use std::sync::atomic::Ordering;
        self.tokens.fetch_add(1, Ordering::SeqCst);
        *self.audience.lock().unwrap() = audience.map(str::to_string);
        if self.fail.load(Ordering::SeqCst) {
            return Err("connection refused".into());
        }
        Ok((self.anyone || token.expose() == "good").then(alice))
    }

    fn access(
        &self,
        _user: &super::user::User,
        what: &super::reviewer::Attributes,
    ) -> Result<super::reviewer::Decision, String> {
        use super::reviewer::{Attributes, Decision};
        use std::sync::atomic::Ordering;
        self.access.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return Err("connection refused".into());
        }
        Ok(match what {
            Attributes::Resource {
                verb: "list",
                kind: Resource::ConfigMaps,
                namespace: Some(ns),
                ..
            } if ns == "team-a" => Decision::Allowed,
            // Alloy's remotecfg calls (`--remotecfg`).
            Attributes::Path { verb: "post", path }
                if path.starts_with("/collector.v1.CollectorService/") =>
            {
                Decision::Allowed
            }
            _ => Decision::Denied(String::new()),
        })
    }

    fn account(&self, _ns: &str, _name: &str) -> Result<super::reviewer::Account, String> {
        use std::sync::atomic::Ordering;
        self.accounts.fetch_add(1, Ordering::SeqCst);
        Ok(super::reviewer::Account::Exists {
            uid: "sa-uid".into(),
            deleted: None,
        })
    }
}

pub fn alice() -> super::user::User {
    super::user::User {
        name: "alice".into(),
        uid: "u1".into(),
        groups: vec!["system:authenticated".into()],
        extra: BTreeMap::new(),
    }
}
