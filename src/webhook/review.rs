//! One AdmissionReview (`admission.k8s.io/v1`): the request decoded, the decision, the
//! answer encoded with the request's `uid`.
//!
//! The object under review becomes a module exactly as `cmpoll run` makes one (the manifest
//! reader's object → item, `--keys`, `--selector`, `Module::from_item`), so the validator
//! sees the same staged files. Allowed without running the validator: DELETE (and CONNECT),
//! a kind `--resource` does not name, an object the selector does not match, one with no
//! selected key, one whose module's content an UPDATE leaves unchanged (a label edit: run
//! would not validate it either), and an object cmpoll would refuse as invalid (the
//! apiserver's own validation answers for it). Denied: the validator's output (a Secret's:
//! its exit status only), at most `MAX_MESSAGE` bytes. Fail-open: a validator that cannot
//! run or times out allows, with a warning the user sees.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::poll::module::{Module, Naming, NotAModule};
use crate::reason::cut;
use crate::source::manifests;
use crate::source::{Resource, Selection};
use crate::validate::Verdict;

/// A denial's `status.message` at most.
pub const MAX_MESSAGE: usize = 1024;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<AdmissionRequest>,
}

/// What the apiserver asks about.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub resource: GroupResource,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    pub operation: String,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
}

#[derive(Deserialize, Debug, Default)]
pub struct GroupResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub resource: String,
}

/// Reads an AdmissionReview; the error says what is wrong with it (a 400).
pub fn decode(body: &[u8]) -> Result<AdmissionRequest, String> {
    let review: Review =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    match (review.api_version.as_deref(), review.kind.as_deref()) {
        (Some("admission.k8s.io/v1"), Some("AdmissionReview")) => {}
        (v, k) => {
            return Err(format!(
                "not an admission.k8s.io/v1 AdmissionReview (apiVersion {}, kind {})",
                v.unwrap_or("none"),
                k.unwrap_or("none")
            ));
        }
    }
    review
        .request
        .ok_or_else(|| "an AdmissionReview without a request".to_string())
}

/// What to answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allowed without running the validator: why (for the debug log).
    Skip(&'static str),
    Allow,
    Deny(String),
    /// Allowed although the validator could not say: the warning.
    FailOpen(String),
}

impl Decision {
    /// For `cmpoll_webhook_reviews_total{result}`.
    pub fn result(&self) -> &'static str {
        match self {
            Decision::Skip(_) | Decision::Allow => "allowed",
            Decision::Deny(_) => "denied",
            Decision::FailOpen(_) => "error",
        }
    }
}

/// The module the object under review would be, or why there is nothing to validate.
pub fn module(req: &AdmissionRequest, selection: &Selection) -> Result<Module, &'static str> {
    if !matches!(req.operation.as_str(), "CREATE" | "UPDATE") {
        return Err("not a CREATE or UPDATE");
    }
    let kind = match (req.resource.group.as_str(), req.resource.resource.as_str()) {
        ("", "configmaps") => Resource::ConfigMaps,
        ("", "secrets") => Resource::Secrets,
        _ => return Err("not a ConfigMap or Secret"),
    };
    if !selection.resources.has(kind) {
        return Err("a kind --resource does not name");
    }
    let Some(new) = of(req.object.as_ref(), &req.namespace, selection) else {
        return Err("not selected");
    };
    let new = match Module::from_item(new, &Naming::default()) {
        Ok(m) => m,
        Err(NotAModule::NoMatchingKey) => return Err("no selected key"),
        Err(NotAModule::Invalid(_)) => return Err("invalid: the apiserver's validation answers"),
    };
    if req.operation == "UPDATE"
        && let Some(old) = of(req.old_object.as_ref(), &req.namespace, selection)
        && let Ok(old) = Module::from_item(old, &Naming::default())
        && old.hash == new.hash
    {
        return Err("its content is unchanged");
    }
    Ok(new)
}

/// The item an object of the review makes (`None`: absent, unreadable or not selected).
fn of(
    object: Option<&Value>,
    namespace: &str,
    selection: &Selection,
) -> Option<crate::source::Item> {
    let mut object = object?.clone();
    // On CREATE the namespace may be only in the request (kubectl apply -n NS).
    if object["metadata"]["namespace"]
        .as_str()
        .is_none_or(str::is_empty)
    {
        object["metadata"]["namespace"] = Value::from(namespace);
    }
    let mut out = Vec::new();
    manifests::files::parse(Path::new("request.json"), &object.to_string(), &mut out).ok()?;
    let cm = out.into_iter().next()?;
    manifests::item(cm, selection)
}

/// What a validator's verdict on `module` answers.
pub fn decide(module: &Module, verdict: Verdict) -> Decision {
    match verdict {
        Verdict::Pass => Decision::Allow,
        Verdict::Fail(why) if crate::validate::timed_out(&why) => Decision::FailOpen(format!(
            "cmpoll: {}: {} (allowed: cmpoll run validates it again before the agent gets it)",
            module.id(),
            why.lines().last().unwrap_or("").trim_matches(['(', ')'])
        )),
        Verdict::Fail(why) => {
            let why = match module.kind {
                Resource::Secrets => crate::reason::redacted(&why),
                Resource::ConfigMaps => why,
            };
            Decision::Deny(cut(&why, MAX_MESSAGE).into_owned())
        }
        Verdict::Error(why) => Decision::FailOpen(format!(
            "cmpoll: {}: {} (allowed: cmpoll run validates it again before the agent gets it)",
            module.id(),
            cut(&why, 512)
        )),
    }
}

/// The AdmissionReview that answers `uid`.
pub fn encode(uid: &str, decision: &Decision) -> Value {
    let response = match decision {
        Decision::Skip(_) | Decision::Allow => json!({"uid": uid, "allowed": true}),
        Decision::Deny(message) => json!({
            "uid": uid,
            "allowed": false,
            "status": {"code": 400, "message": message},
        }),
        Decision::FailOpen(warning) => json!({
            "uid": uid,
            "allowed": true,
            "warnings": [cut(warning, MAX_MESSAGE)],
        }),
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::hash::Hash;
    use crate::selector::{FieldSelector, LabelSelector};
    use crate::source::{KeyFilter, Resources};

    /// A review the real apiserver sent (recorded by `tests/real/webhook.rs`), its
    /// volatile fields as recorded.
    fn golden(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/admission/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn selection(keys: &[&str], kinds: Resources) -> Selection {
        Selection {
            resources: kinds,
            labels: LabelSelector::parse("cmpoll.io/module=true").unwrap(),
            fields: FieldSelector::default(),
            namespaces: Vec::new(),
            keys: KeyFilter::new(&keys.iter().map(|k| k.to_string()).collect::<Vec<_>>()).unwrap(),
            folder_annotation: None,
            names: Vec::new(),
        }
    }

    fn configmaps() -> Selection {
        selection(&["*.rules.yaml"], Resources::one(Resource::ConfigMaps))
    }

    #[test]
    fn the_real_apiservers_create_becomes_the_module_run_would_make() {
        let req = decode(&golden("create-configmap.json")).unwrap();
        assert_eq!(req.operation, "CREATE");
        let m = module(&req, &configmaps()).unwrap();
        assert_eq!(m.id(), format!("{}/rules", req.namespace));
        let keys: Vec<&str> = m.files.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, ["payments.rules.yaml"], "--keys selects");
        // The hash run computes: over the selected files only.
        assert_eq!(
            m.hash,
            Hash::of(m.files.iter().map(|f| (f.key.as_str(), f.content.bytes())))
        );
        // Not selected: another selector, another kind, no matching key.
        let mut other = configmaps();
        other.labels = LabelSelector::parse("team=x").unwrap();
        assert_eq!(module(&req, &other).unwrap_err(), "not selected");
        let secrets = selection(&["*"], Resources::one(Resource::Secrets));
        assert_eq!(
            module(&req, &secrets).unwrap_err(),
            "a kind --resource does not name"
        );
        let none = selection(&["*.alloy"], Resources::one(Resource::ConfigMaps));
        assert_eq!(module(&req, &none).unwrap_err(), "no selected key");
    }

    #[test]
    fn an_update_that_leaves_the_content_alone_is_not_validated() {
        let req = decode(&golden("update-configmap-labels.json")).unwrap();
        assert_eq!(req.operation, "UPDATE");
        assert!(req.old_object.is_some());
        assert_eq!(
            module(&req, &configmaps()).unwrap_err(),
            "its content is unchanged"
        );
        let req = decode(&golden("update-configmap-content.json")).unwrap();
        assert!(module(&req, &configmaps()).is_ok());
    }

    #[test]
    fn a_secrets_data_is_decoded_as_run_decodes_it() {
        let req = decode(&golden("create-secret.json")).unwrap();
        let m = module(&req, &selection(&["*"], Resources::one(Resource::Secrets))).unwrap();
        assert_eq!(m.files[0].key, "password");
        assert_eq!(m.files[0].content.bytes(), b"hunter2");
        let denied = decide(
            &m,
            Verdict::Fail("hunter2 is weak\n(validator exited with status 1)".into()),
        );
        assert_eq!(
            denied,
            Decision::Deny("validator exited with status 1".into())
        );
    }

    #[test]
    fn delete_and_other_operations_are_allowed_unrun() {
        let mut req = decode(&golden("create-configmap.json")).unwrap();
        req.operation = "DELETE".into();
        assert_eq!(
            module(&req, &configmaps()).unwrap_err(),
            "not a CREATE or UPDATE"
        );
    }

    #[test]
    fn bad_reviews_are_refused_with_a_reason() {
        for (body, want) in [
            (&b"{"[..], "not an AdmissionReview"),
            (
                br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#,
                "apiVersion admission.k8s.io/v1beta1",
            ),
            (
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
                "without a request",
            ),
        ] {
            let e = decode(body).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn answers_are_encoded_as_the_api_defines_them() {
        let m = module(
            &decode(&golden("create-configmap.json")).unwrap(),
            &configmaps(),
        )
        .unwrap();
        let long = "x".repeat(5000);
        let deny = decide(
            &m,
            Verdict::Fail(format!("{long}\n(validator exited with status 1)")),
        );
        let Decision::Deny(message) = &deny else {
            panic!("{deny:?}")
        };
        assert!(message.len() <= MAX_MESSAGE);
        assert_eq!(
            encode("u-1", &Decision::Deny("bad rule".into())),
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": "u-1", "allowed": false,
                                "status": {"code": 400, "message": "bad rule"}}})
        );
        assert_eq!(
            encode("u-2", &Decision::Allow),
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": "u-2", "allowed": true}})
        );
        let open = decide(
            &m,
            Verdict::Error(
                "validator cannot run: it exited with status 127: sh: promtool: not found".into(),
            ),
        );
        assert_eq!(open.result(), "error");
        let answer = encode("u-3", &open);
        assert_eq!(answer["response"]["allowed"], true);
        let warning = answer["response"]["warnings"][0].as_str().unwrap();
        assert!(warning.contains("promtool: not found"), "{warning}");
        let slow = decide(
            &m,
            Verdict::Fail("started\n(validator killed after --validate-timeout 8s)".into()),
        );
        assert_eq!(slow.result(), "error", "{slow:?}");
    }
}
