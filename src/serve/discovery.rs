//! Discovery as the apiserver answers it, for what the hub serves: `/api` (the core
//! group's one version), `/api/v1` (the kinds it lists, with the verbs it serves: `get`,
//! `list`, `watch`), `/apis` (no group). kubectl asks these before it lists (`kubectl get cm`
//! finds `cm` here); its aggregated-discovery `Accept` falls back to these plain answers,
//! as it does with an apiserver that has none.

use super::request::Discovery;
use crate::source::{Resource, Resources};

/// The body for `d`, the hub listing `kinds`; `addr` is the address the client reached.
pub fn body(d: Discovery, kinds: Resources, addr: &str) -> Vec<u8> {
    let json = match d {
        Discovery::Api => serde_json::json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}],
        }),
        Discovery::ApiV1 => {
            let resources: Vec<serde_json::Value> = kinds
                .iter()
                .map(|k| {
                    let mut r = serde_json::json!({
                        "name": k.plural(),
                        "singularName": k.singular(),
                        "namespaced": true,
                        "kind": k.kind(),
                        "verbs": ["get", "list", "watch"],
                    });
                    if k == Resource::ConfigMaps {
                        r["shortNames"] = serde_json::json!(["cm"]);
                    }
                    r
                })
                .collect();
            serde_json::json!({
                "kind": "APIResourceList",
                "groupVersion": "v1",
                "resources": resources,
            })
        }
        Discovery::Apis => serde_json::json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [],
        }),
    };
    let mut out = json.to_string().into_bytes();
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_names_what_is_served() {
        let v1 = String::from_utf8(body(
            Discovery::ApiV1,
            Resources::one(Resource::ConfigMaps),
            "x",
        ))
        .unwrap();
        assert!(v1.contains("\"name\":\"configmaps\""), "{v1}");
        assert!(!v1.contains("secrets"), "{v1}");
        assert!(
            v1.contains("\"verbs\":[\"get\",\"list\",\"watch\"]"),
            "{v1}"
        );
    }
}
