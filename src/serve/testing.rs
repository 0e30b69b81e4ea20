//! Made-up polls for the hub's unit tests (`history`, `watch`).

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

pub fn kinds() -> Resources {
    Resources::one(Resource::ConfigMaps)
}
