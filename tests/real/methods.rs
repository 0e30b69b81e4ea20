//! Methods besides GET, the real apiserver as the oracle (issue 58.6): the hub answers a
//! HEAD, a write, or a method nobody registers with the apiserver's status code, for the
//! same token on the same paths — authorized for the verb the apiserver's request-info
//! resolver names (403 without it), then refused with 405 where the apiserver refuses too
//! (a HEAD). A write the role may make is the one documented deviation (docs/serve.md:
//! the hub serves GETs), and no role here may write.

use std::io::{Read, Write};
use std::time::Duration;

use super::hub::*;
use super::*;

/// One request with `Connection: close` over a fresh TLS connection: the status code and
/// the `Status` body's reason and message (empty for a HEAD, which has none).
fn ask(port: u16, ca: &str, request: &str) -> (u16, String, String) {
    let mut tls = crate::util::flood::tls_to(&format!("127.0.0.1:{port}"), ca).unwrap();
    tls.sock
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    tls.write_all(request.as_bytes()).unwrap();
    let mut wire = Vec::new();
    let _ = tls.read_to_end(&mut wire);
    let wire = String::from_utf8_lossy(&wire).to_string();
    let code = wire.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = wire.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let status: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let text = |k: &str| status[k].as_str().unwrap_or_default().to_string();
    (code, text("reason"), text("message"))
}

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
                    "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let want = ask(k.port, &apiserver_ca, &request);
                let got = ask(hub.port, &hub.ca_pem, &request);
                assert_ne!(want.0, 0, "{role}: {method} {path}: the apiserver answered");
                // The code always; a refusal's words where the apiserver refused (a 403
                // names the verb asked); a 405 is the hub's own (the apiserver's, for a
                // HEAD, carries no body).
                match want.0 {
                    403 => assert_eq!(got, want, "{role}: {method} {path}: hub vs apiserver"),
                    _ => assert_eq!(got.0, want.0, "{role}: {method} {path}: hub vs apiserver"),
                }
                *seen.entry(want.0).or_insert(0) += 1;
            }
        }
    }
    // Both answers the apiserver gives were met (a HEAD it authorized is a 405, anything
    // else a 403): the comparison above is not of one code throughout.
    assert!(
        seen.contains_key(&405) && seen.contains_key(&403),
        "{seen:?}"
    );
    eprintln!("codes met, as the apiserver's: {seen:?}");
}
