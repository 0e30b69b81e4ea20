//! Methods besides GET, the real apiserver as the oracle (issue 58.6): the hub answers a
//! HEAD, a write, or a method nobody registers with the apiserver's status code, for the
//! same token on the same paths — authorized for the verb the apiserver's request-info
//! resolver names (403 without it), then refused with 405 where the apiserver refuses too
//! (a HEAD). A write the role may make is the one documented deviation (docs/serve.md:
//! the hub serves GETs), and no role here may write.

use super::hub::*;
use super::*;

#[test]
fn methods_besides_get_are_answered_with_the_apiservers_codes() {
    let Some((_one, k)) = cluster() else {
        return;
    };
    let ns = k.namespace("hub-methods");
    put_module(k, &ns, "m", "k.yaml", "v");
    let hub = start_hub(k, &hub_account(k, &ns, "hub"), &["--namespace", &ns]);
    // One role without `watch` and one with it: a HEAD of a watch is a 403 for the first
    // and a 405 for the second, at both servers.
    let readers = [
        ("list-get", follower(k, &ns, "list-get", cm_rules(), false)),
        (
            "watch-too",
            follower(
                k,
                &ns,
                "watch-too",
                json!([{"apiGroups": [""], "resources": ["configmaps"],
                        "verbs": ["list", "get", "watch"]}]),
                false,
            ),
        ),
    ];
    let paths = [
        format!("/api/v1/namespaces/{ns}/configmaps"),
        format!("/api/v1/namespaces/{ns}/configmaps?watch=true&timeoutSeconds=1"),
        format!("/api/v1/namespaces/{ns}/configmaps/m"),
        format!("/api/v1/watch/namespaces/{ns}/configmaps?timeoutSeconds=1"),
    ];
    let methods = [
        "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "FOO",
    ];
    let apiserver_ca = k.ca_pem();
    let mut seen = std::collections::BTreeMap::new();
    for (role, token) in &readers {
        for path in &paths {
            for method in methods {
                let request = format!(
                    "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: 0\r\n\r\n"
                );
                let want = raw_request(k.port, &apiserver_ca, request.as_bytes());
                let got = raw_request(hub.port, &hub.ca_pem, request.as_bytes());
                assert!(
                    want.is_some(),
                    "{role}: {method} {path}: the apiserver answered"
                );
                assert_eq!(got, want, "{role}: {method} {path}: hub vs apiserver");
                *seen.entry(want).or_insert(0) += 1;
            }
        }
    }
    // Both answers the apiserver gives were met (a HEAD it authorized is a 405, anything
    // else a 403): the comparison above is not of one code throughout.
    assert!(
        seen.contains_key(&Some(405)) && seen.contains_key(&Some(403)),
        "{seen:?}"
    );
    eprintln!("codes met, as the apiserver's: {seen:?}");
}
