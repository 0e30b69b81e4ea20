//! Unit tests of `Config::resolve`: SPEC's order of sources.

use super::*;
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn nothing_configured_names_all_five_sources() {
    let e = Config::resolve(&Flags::default(), &env(&[("HOME", "/nonexistent")])).unwrap_err();
    for s in [
        "--manifests",
        "--server",
        "--kubeconfig",
        "KUBECONFIG",
        "KUBERNETES_SERVICE_HOST",
        "~/.kube/config",
    ] {
        assert!(e.contains(s), "{s}: {e}");
    }
}

#[test]
fn server_flags_come_first() {
    let flags = Flags {
        server: Some("https://10.0.0.1:6443/".into()),
        kubeconfig: Some("/nonexistent".into()),
        ..Flags::default()
    };
    let c = Config::resolve(&flags, &env(&[("KUBERNETES_SERVICE_HOST", "x")])).unwrap();
    assert_eq!(c.server, "https://10.0.0.1:6443");
    assert_eq!(c.trust, Trust::Platform);
    assert_eq!(c.credential, Credential::None);
    let e = Config::resolve(
        &Flags {
            server: Some("ftp://x".into()),
            ..Flags::default()
        },
        &env(&[]),
    )
    .unwrap_err();
    assert!(e.starts_with("--server: 'ftp://x' is not"), "{e}");
}

#[test]
fn in_cluster_reads_the_service_account_folder() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "t").unwrap();
    std::fs::write(dir.path().join("namespace"), "monitoring\n").unwrap();
    let flags = Flags {
        service_account_dir: Some(dir.path().into()),
        ..Flags::default()
    };
    let c = Config::resolve(
        &flags,
        &env(&[
            ("KUBERNETES_SERVICE_HOST", "fd00::1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        ]),
    )
    .unwrap();
    assert_eq!(c.server, "https://[fd00::1]:443");
    assert_eq!(c.namespace.as_deref(), Some("monitoring"));
    assert_eq!(
        c.credential,
        Credential::TokenFile {
            path: dir.path().join("token"),
            fallback: None
        }
    );
    assert_eq!(
        c.trust,
        Trust::Platform,
        "no ca.crt: platform roots, with a warning"
    );
    std::fs::remove_file(dir.path().join("token")).unwrap();
    let e = Config::resolve(
        &flags,
        &env(&[
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        ]),
    )
    .unwrap_err();
    assert!(e.contains("no service-account token"), "{e}");
}
