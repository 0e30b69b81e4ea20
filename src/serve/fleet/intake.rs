//! A follower's report as the hub takes it in (`hub_protocol::Report`): every byte of it is
//! hostile until checked. The body is read strictly (unknown fields refused, as the types
//! say), then each module is checked — its id a valid `NAMESPACE/NAME` or
//! `KIND/NAMESPACE/NAME` (apimachinery's name rules), its kind `ConfigMap` or `Secret` (and
//! the id's kind the same), its hashes `sha256:` and 64 lowercase hex digits, a refusal's
//! `by` `validate` or `confirm`, no module twice, at most `MAX_REPORT_MODULES` — and made
//! what the fleet keeps: `Holding`s, with a refusal's reason cut again to `KEPT_REASON`
//! (a Secret's to its validator's exit status). A report that breaks a rule is a 400 in the
//! apiserver's words, naming the first thing wrong, never quoting more than a bounded
//! piece of what was sent.

use crate::hub_protocol::{MAX_REPORT_MODULES, MAX_REPORT_REASON, Report, Reported};
use crate::names;
use crate::poll::hash::Hash;
use crate::reason;
use crate::serve::status::StatusError;
use crate::source::Resource;

/// A refusal's reason kept, at most (the contract's `MAX_REPORT_REASON` cut again: what a
/// hub keeps of 10,000 followers stays small whatever they send).
pub const KEPT_REASON: usize = MAX_REPORT_REASON / 2;

/// How much of a client's text a 400 quotes at most.
const QUOTED: usize = 64;

/// Who refused a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// The follower's `--validate`.
    Validate,
    /// Its agent, asked by `--confirm`.
    Confirm,
}

impl By {
    pub fn word(self) -> &'static str {
        match self {
            By::Validate => "validate",
            By::Confirm => "confirm",
        }
    }
}

/// A follower's refusal of one version, as kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub hash: Hash,
    /// The object's resourceVersion at that version, when the follower said it.
    pub resource_version: Option<u64>,
    pub by: By,
    pub reason: Box<str>,
}

/// One module's version in a text sent to a collector (`--remotecfg`): `namespace/name`,
/// its hash, its resourceVersion (what a refusal is matched by: `gate.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub key: Box<str>,
    pub hash: Hash,
    pub rv: u64,
}

/// The module versions of a text, in key order.
pub type Versions = std::sync::Arc<[Version]>;

/// One module a follower holds, as kept: the object (`kind`, `namespace/name`), the version
/// it holds (none: it holds none), its refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub kind: Resource,
    /// `namespace/name`.
    pub key: Box<str>,
    pub hash: Option<Hash>,
    /// The object's resourceVersion at the version held, when the follower said it: a
    /// follower's hash covers only the keys it selects, under its own names.
    pub resource_version: Option<u64>,
    pub refused: Option<Box<Refusal>>,
}

impl Holding {
    /// The bytes it keeps (for the fleet's bound).
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Holding>()
            + self.key.len()
            + (self.refused.as_ref()).map_or(0, |r| std::mem::size_of::<Refusal>() + r.reason.len())
    }

    /// Its namespace and name.
    pub fn names(&self) -> (&str, &str) {
        self.key.split_once('/').unwrap_or(("", &self.key))
    }
}

/// A report checked: what the follower holds, in (kind, key) order, and whether it holds
/// more than it said.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Checked {
    pub holds: Vec<Holding>,
    pub truncated: bool,
}

impl Checked {
    /// Each (kind, namespace) it names, once, in order: what its reporter must be allowed
    /// to `list`.
    pub fn scopes(&self) -> Vec<(Resource, &str)> {
        let mut scopes: Vec<(Resource, &str)> =
            (self.holds.iter()).map(|h| (h.kind, h.names().0)).collect();
        scopes.sort_by(|a, b| (a.0.index(), a.1).cmp(&(b.0.index(), b.1)));
        scopes.dedup();
        scopes
    }
}

/// `body` read and checked, or the 400 that says why not.
pub fn read(body: &[u8]) -> Result<Checked, StatusError> {
    let report: Report = serde_json::from_slice(body).map_err(|e| {
        let e = e.to_string();
        bad(format!(
            "the report is not a cmpoll report: {}",
            reason::cut(&e, 2 * QUOTED)
        ))
    })?;
    if report.modules.len() > MAX_REPORT_MODULES {
        return Err(bad(format!(
            "the report names {} modules, more than {MAX_REPORT_MODULES}",
            report.modules.len()
        )));
    }
    let mut holds = Vec::with_capacity(report.modules.len());
    for (i, m) in report.modules.iter().enumerate() {
        holds.push(holding(m).map_err(|why| bad(format!("modules[{i}]: {why}")))?);
    }
    holds.sort_by(|a, b| (a.kind.index(), &a.key).cmp(&(b.kind.index(), &b.key)));
    if let Some(w) = holds
        .windows(2)
        .find(|w| (w[0].kind, &w[0].key) == (w[1].kind, &w[1].key))
    {
        return Err(bad(format!(
            "{} {} is named twice",
            w[0].kind.singular(),
            quoted(&w[0].key)
        )));
    }
    Ok(Checked {
        holds,
        truncated: report.truncated,
    })
}

fn bad(message: String) -> StatusError {
    StatusError::bad_request(message)
}

/// At most `QUOTED` bytes of `s`, quoted.
fn quoted(s: &str) -> String {
    names::go_quote(&reason::cut(s, QUOTED))
}

fn hash(s: &str, field: &str) -> Result<Hash, String> {
    Hash::parse(s).ok_or_else(|| {
        format!(
            "{field} {} is not sha256: and 64 lowercase hex digits",
            quoted(s)
        )
    })
}

/// One reported module checked, as kept.
fn holding(m: &Reported) -> Result<Holding, String> {
    let kind = match m.kind.as_str() {
        "ConfigMap" => Resource::ConfigMaps,
        "Secret" => Resource::Secrets,
        other => return Err(format!("kind {} is not ConfigMap or Secret", quoted(other))),
    };
    let parts: Vec<&str> = m.module.split('/').collect();
    let (ns, name) = match parts[..] {
        [ns, name] => (ns, name),
        [k, ns, name] if Resource::from_singular(k) == Some(kind) => (ns, name),
        [k, _, _] => {
            return Err(format!(
                "module {}: {} is not its kind's word ({})",
                quoted(&m.module),
                quoted(k),
                kind.singular()
            ));
        }
        _ => {
            return Err(format!(
                "module {} is not NAMESPACE/NAME or KIND/NAMESPACE/NAME",
                quoted(&m.module)
            ));
        }
    };
    if let Some(e) = names::dns1123_label(ns).first() {
        return Err(format!("module {}: namespace: {e}", quoted(&m.module)));
    }
    if let Some(e) = names::dns1123_subdomain(name).first() {
        return Err(format!("module {}: name: {e}", quoted(&m.module)));
    }
    let held = m.hash.as_deref().map(|h| hash(h, "hash")).transpose()?;
    let refused = match &m.refused {
        None => None,
        Some(r) => {
            let by = match r.by.as_str() {
                "validate" => By::Validate,
                "confirm" => By::Confirm,
                other => {
                    return Err(format!(
                        "refused.by {} is not validate or confirm",
                        quoted(other)
                    ));
                }
            };
            // A Secret's reason is its validator's exit status at most, whatever was sent:
            // what `reason::redacted` makes of it is kept only in the shape it gives an exit
            // status, anything else (words of an older or foreign client) is not shown.
            let why = match kind {
                Resource::Secrets => secret_reason(&r.reason),
                Resource::ConfigMaps => r.reason.clone(),
            };
            Some(Box::new(Refusal {
                hash: hash(&r.hash, "refused.hash")?,
                resource_version: version(
                    r.resource_version.as_deref(),
                    "refused.resourceVersion",
                )?,
                by,
                reason: reason::cut(&why, KEPT_REASON).into(),
            }))
        }
    };
    Ok(Holding {
        kind,
        key: format!("{ns}/{name}").into(),
        hash: held,
        resource_version: version(m.resource_version.as_deref(), "resourceVersion")?,
        refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const H2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn code_and_message(body: &str) -> (u16, String) {
        match read(body.as_bytes()) {
            Ok(c) => (204, format!("{c:?}")),
            Err(e) => (e.code, e.message),
        }
    }

    #[test]
    fn a_report_is_read_into_what_is_kept() {
        let body = format!(
            r#"{{"modules":[
            {{"module":"team-b/y","kind":"ConfigMap","hash":"{H1}"}},
            {{"module":"configmap/team-a/x","kind":"ConfigMap","hash":"{H1}",
              "refused":{{"hash":"{H2}","by":"confirm","reason":"{}"}}}},
            {{"module":"secret/team-a/s","kind":"Secret",
              "refused":{{"hash":"{H2}","by":"validate","reason":"the password is hunter2\n(validator exited with status 1)"}}}}
            ],"truncated":true}}"#,
            "x".repeat(600)
        );
        let c = read(body.as_bytes()).unwrap();
        assert!(c.truncated);
        let keys: Vec<_> = c.holds.iter().map(|h| (h.kind, &*h.key)).collect();
        assert_eq!(
            keys,
            [
                (Resource::ConfigMaps, "team-a/x"),
                (Resource::ConfigMaps, "team-b/y"),
                (Resource::Secrets, "team-a/s")
            ]
        );
        let cut = &c.holds[0].refused.as_ref().unwrap().reason;
        assert!(cut.len() <= KEPT_REASON && cut.ends_with('…'), "{cut}");
        let secret = &c.holds[2].refused.as_ref().unwrap().reason;
        assert!(!secret.contains("hunter2"), "{secret}");
        assert_eq!(c.holds[2].hash, None);
        assert_eq!(
            c.scopes(),
            [
                (Resource::ConfigMaps, "team-a"),
                (Resource::ConfigMaps, "team-b"),
                (Resource::Secrets, "team-a")
            ]
        );
    }

    /// Each rule refuses the whole report with a 400 that names what is wrong, quoting at
    /// most a bounded piece of it.
    #[test]
    fn rejected_bodies() {
        let m = |module: &str, kind: &str, hash: &str| {
            format!(r#"{{"modules":[{{"module":"{module}","kind":"{kind}","hash":"{hash}"}}]}}"#)
        };
        let long = "a".repeat(10_000);
        let cases = [
            ("".to_string(), "not a cmpoll report"),
            ("[]".to_string(), "not a cmpoll report"),
            (r#"{"modules":[],"extra":1}"#.to_string(), "unknown field"),
            (
                r#"{"modules":[{"module":"a/b","kind":"ConfigMap","x":1}]}"#.to_string(),
                "unknown field",
            ),
            (m("a/b", "Pod", H1), "is not ConfigMap or Secret"),
            (m("a", "ConfigMap", H1), "is not NAMESPACE/NAME"),
            (m("a/b/c/d", "ConfigMap", H1), "is not NAMESPACE/NAME"),
            (m("secret/a/b", "ConfigMap", H1), "is not its kind's word"),
            (m("A_B/b", "ConfigMap", H1), "namespace"),
            (m("a/B_", "ConfigMap", H1), "name"),
            (m(&format!("a/{long}"), "ConfigMap", H1), "name"),
            (m("a/b", "ConfigMap", "sha256:abc"), "is not sha256:"),
            (m("a/b", "ConfigMap", &H1.to_uppercase()), "is not sha256:"),
            (
                m("a/b", "ConfigMap", &H1.replace("sha256", "md5")),
                "is not sha256:",
            ),
            (
                format!(
                    r#"{{"modules":[{{"module":"a/b","kind":"ConfigMap","refused":{{"hash":"{H1}","by":"me","reason":""}}}}]}}"#
                ),
                "is not validate or confirm",
            ),
            (
                format!(
                    r#"{{"modules":[{},{}]}}"#,
                    format_args!(r#"{{"module":"a/b","kind":"ConfigMap","hash":"{H1}"}}"#),
                    format_args!(
                        r#"{{"module":"configmap/a/b","kind":"ConfigMap","hash":"{H2}"}}"#
                    )
                ),
                "named twice",
            ),
        ];
        for (body, why) in cases {
            let (code, message) = code_and_message(&body);
            assert_eq!(code, 400, "{body}");
            assert!(message.contains(why), "{body}: {message}");
            assert!(message.len() < 400, "{message}");
        }
        let many: Vec<String> = (0..=MAX_REPORT_MODULES)
            .map(|i| format!(r#"{{"module":"a/m{i}","kind":"ConfigMap","hash":"{H1}"}}"#))
            .collect();
        let (code, message) = code_and_message(&format!(r#"{{"modules":[{}]}}"#, many.join(",")));
        assert_eq!(
            (code, message.contains("more than 4096")),
            (400, true),
            "{message}"
        );
    }
}

/// A resourceVersion as a follower reports it: the apiserver's decimal number.
fn version(v: Option<&str>, what: &str) -> Result<Option<u64>, String> {
    match v {
        None => Ok(None),
        Some(v) if !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit()) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{what} {} is not a number", quoted(v))),
        Some(v) => Err(format!("{what} {} is not a number", quoted(v))),
    }
}

/// A Secret's refusal as kept: the validator's exit status (`validator exited with status
/// 1`, `validator cannot run: …`, killed after the timeout) or the fixed words for an agent's
/// refusal, else nothing of what was sent.
fn secret_reason(sent: &str) -> String {
    let r = reason::redacted(sent);
    // Exactly an exit status, nothing after it.
    let digits = |s: &str| !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit());
    let signal = |s: &str| {
        s.strip_prefix("SIG").is_some_and(|n| {
            !n.is_empty()
                && n.len() <= 8
                && n.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        })
    };
    let exit = |s: &str| {
        s.strip_prefix("exited with status ").is_some_and(digits)
            || s.strip_prefix("was killed by ").is_some_and(signal)
    };
    let status = |s: &str| match s.strip_prefix("validator ") {
        Some(rest) => {
            exit(rest)
                || rest.strip_prefix("cannot run: it ").is_some_and(exit)
                || rest
                    .strip_prefix("killed after --validate-timeout ")
                    .is_some_and(|d| d.len() <= 16 && d.bytes().all(|b| b.is_ascii_alphanumeric()))
        }
        None => false,
    };
    match status(&r) {
        true => r,
        false => "refused (a Secret's reason is not shown)".into(),
    }
}

#[cfg(test)]
mod secret_tests {
    use super::secret_reason;

    /// A Secret's refusal keeps an exit status, never words (an older or foreign client's).
    #[test]
    fn a_secrets_reason_is_an_exit_status_or_nothing() {
        for kept in [
            "validator exited with status 1",
            "output that quotes it\n(validator exited with status 3)",
            "validator was killed by SIGKILL",
            "validator cannot run: it exited with status 127: sh: x: not found",
            "validator killed after --validate-timeout 30s",
        ] {
            assert!(secret_reason(kept).starts_with("validator "), "{kept}");
            assert!(!secret_reason(kept).contains("quotes"), "{kept}");
        }
        for hidden in [
            "the password is hunter2",
            "validator said hunter2 is wrong here",
            "",
        ] {
            assert_eq!(
                secret_reason(hidden),
                "refused (a Secret's reason is not shown)",
                "{hidden}"
            );
        }
    }
}
