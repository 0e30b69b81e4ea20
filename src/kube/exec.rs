//! Exec credential plugins (`users[].user.exec`, `client.authentication.k8s.io/v1` and
//! `v1beta1`), run the way client-go runs them, minus the terminal: cmpoll is never
//! interactive.
//!
//! The plugin gets cmpoll's environment plus its `env` entries and `KUBERNETES_EXEC_INFO`
//! (with `spec.cluster` when `provideClusterInfo` is set), no stdin, and at most `TIMEOUT`
//! before it is killed with its process group (`ops::process::run_bounded`, the one runner
//! of bounded commands). Its stderr is logged line by line; its stdout is the credential and
//! never reaches a log line or an error message (parse errors say where, not what).
//! A plugin holds `ops::process::children()` from spawn to exit status, and cmpoll as
//! PID 1 reaps orphans only while nothing holds it, so it never takes a plugin's exit
//! status from under it.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::http::tls::Identity;
use crate::secret::Secret;

pub const V1: &str = "client.authentication.k8s.io/v1";
pub const V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

/// How long a plugin may run before it is killed.
pub const TIMEOUT: Duration = Duration::from_secs(60);
/// The most a plugin may print on stdout.
const MAX_OUTPUT: usize = 1 << 20;
/// The most stderr lines logged per run.
const MAX_STDERR_LINES: usize = 50;

/// An exec plugin as configured (plain data, part of `kube::Config`).
#[derive(Clone, Debug, PartialEq)]
pub struct Plugin {
    pub api_version: String,
    /// A path (resolved against the kubeconfig's folder when it had a `/`) or a name
    /// looked up on `PATH`.
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub install_hint: Option<String>,
    /// `spec.cluster` of `KUBERNETES_EXEC_INFO`, when `provideClusterInfo` is set.
    pub cluster: Option<serde_json::Value>,
    /// The kubeconfig, context and user, for messages.
    pub origin: String,
}

/// What a plugin issued.
#[derive(Clone, Debug, PartialEq)]
pub struct Issued {
    pub token: Option<Secret>,
    pub identity: Option<Identity>,
    pub expires: Option<SystemTime>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Output {
    api_version: Option<String>,
    kind: Option<String>,
    status: Option<ExecStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecStatus {
    expiration_timestamp: Option<String>,
    token: Option<String>,
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
}

impl Plugin {
    /// Where the command is: a configuration check at start-up, so that a missing plugin
    /// is reported once, with its install hint, before any poll.
    pub fn locate(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf, String> {
        crate::ops::process::find_program(&self.command, env("PATH").as_deref())
            .map_err(|_| self.not_found())
    }

    fn not_found(&self) -> String {
        let mut msg = format!(
            "{}: exec credential plugin '{}' not found{}",
            self.origin,
            self.command,
            if self.command.contains('/') {
                ""
            } else {
                " on PATH"
            }
        );
        if let Some(hint) = self
            .install_hint
            .as_deref()
            .filter(|h| !h.trim().is_empty())
        {
            let hint: Vec<&str> = hint.split_whitespace().collect();
            msg += &format!(" (install hint: {})", hint.join(" "));
        }
        msg
    }

    /// The `KUBERNETES_EXEC_INFO` value.
    fn exec_info(&self) -> String {
        let mut spec = serde_json::Map::new();
        if let Some(cluster) = &self.cluster {
            spec.insert("cluster".into(), cluster.clone());
        }
        spec.insert("interactive".into(), false.into());
        serde_json::json!({
            "kind": "ExecCredential",
            "apiVersion": self.api_version,
            "spec": spec,
        })
        .to_string()
    }

    /// Runs the plugin once and checks what it printed. It runs through the one bounded
    /// runner (`ops::process::run_bounded`): in its own process group, which is killed at
    /// the timeout, and what it left running there once it exits.
    pub fn run(&self, timeout: Duration) -> Result<Issued, String> {
        use crate::ops::process::{self, Capture, RunError};
        let mut cmd = Command::new(&self.command);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("KUBERNETES_EXEC_INFO", self.exec_info());
        let who = format!("exec plugin '{}'", self.command);
        let mut lines = 0;
        let stderr = Box::new(move |line: &[u8]| {
            lines += 1;
            if lines <= MAX_STDERR_LINES {
                log::info!("{who}: {}", String::from_utf8_lossy(line).trim_end());
            }
        });
        let done = process::run_bounded(cmd, timeout, Capture::Split(MAX_OUTPUT + 1, stderr))
            .map_err(|e| match e {
                RunError::Start(e) if e.kind() == std::io::ErrorKind::NotFound => self.not_found(),
                e => format!(
                    "{}: cannot run exec credential plugin '{}': {e}",
                    self.origin, self.command
                ),
            })?;
        let Some(status) = done.exit else {
            return Err(format!(
                "{}: exec credential plugin '{}' did not finish within {}; killed it",
                self.origin,
                self.command,
                humantime::format_duration(timeout)
            ));
        };
        if !status.success() {
            // Worded as the standard library words an exit status (as before the runner
            // was shared): `exit status: 3`, `signal: 9 (SIGKILL)`.
            let how = match (status.code, status.signal) {
                (Some(c), _) => format!("exit status: {c}"),
                (None, s) => {
                    let s = s.unwrap_or(0);
                    format!("signal: {s} ({})", crate::ops::signals::Signal(s))
                }
            };
            return Err(format!(
                "{}: exec credential plugin '{}' failed ({how}); its stderr is in the log",
                self.origin, self.command
            ));
        }
        if !done.complete {
            return Err(format!(
                "{}: exec credential plugin '{}' exited but its output did not end",
                self.origin, self.command
            ));
        }
        if done.output.len() > MAX_OUTPUT {
            return Err(format!(
                "{}: exec credential plugin '{}' printed more than {MAX_OUTPUT} bytes",
                self.origin, self.command
            ));
        }
        self.parse(&done.output)
    }

    /// Checks an `ExecCredential` as client-go does. Errors never quote the output.
    pub fn parse(&self, out: &[u8]) -> Result<Issued, String> {
        let bad = |why: String| {
            format!(
                "{}: exec credential plugin '{}': {why}",
                self.origin, self.command
            )
        };
        let parsed: Output = serde_json::from_slice(out).map_err(|e| {
            bad(format!(
                "its output is not an ExecCredential ({} error at line {} column {})",
                match e.classify() {
                    serde_json::error::Category::Io => "read",
                    serde_json::error::Category::Syntax => "JSON syntax",
                    serde_json::error::Category::Data => "field type",
                    serde_json::error::Category::Eof => "unexpected end",
                },
                e.line(),
                e.column()
            ))
        })?;
        if parsed.kind.as_deref() != Some("ExecCredential") {
            return Err(bad(format!(
                "it returned kind '{}', not ExecCredential",
                parsed.kind.unwrap_or_default()
            )));
        }
        let version = parsed.api_version.unwrap_or_default();
        if version != self.api_version {
            return Err(bad(format!(
                "it is configured to use API version {}, but returned version {version}",
                self.api_version
            )));
        }
        let status = parsed
            .status
            .ok_or_else(|| bad("it did not return a status".into()))?;
        let expires = match status.expiration_timestamp.as_deref() {
            None | Some("") => None,
            Some(t) => Some(humantime::parse_rfc3339_weak(t).map_err(|e| {
                bad(format!(
                    "expirationTimestamp '{t}' is not an RFC 3339 time: {e}"
                ))
            })?),
        };
        let non_empty = |s: Option<String>| s.filter(|v| !v.is_empty());
        let cert = non_empty(status.client_certificate_data);
        let key = non_empty(status.client_key_data);
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some(Identity {
                cert_pem: cert.into_bytes(),
                key_pem: Secret::new(key),
                origin: format!("{} (exec plugin '{}')", self.origin, self.command),
            }),
            (None, None) => None,
            _ => {
                return Err(bad(
                    "it returned a client certificate or key, but not both".into()
                ));
            }
        };
        let token = non_empty(status.token).map(Secret::new);
        if token.is_none() && identity.is_none() {
            return Err(bad(
                "it returned neither a token nor a client certificate and key".into(),
            ));
        }
        Ok(Issued {
            token,
            identity,
            expires,
        })
    }
}

/// When to run the plugin again: a little before `expires` (a tenth of the credential's
/// lifetime, at most a minute), so a request never goes out with a credential about to
/// lapse. `None`: only after a 401.
pub fn refresh_at(obtained: SystemTime, expires: Option<SystemTime>) -> Option<SystemTime> {
    let expires = expires?;
    let life = expires.duration_since(obtained).unwrap_or_default();
    Some(expires - (life / 10).min(Duration::from_secs(60)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn plugin() -> Plugin {
        Plugin {
            api_version: V1.into(),
            command: "get-token".into(),
            args: vec![],
            env: vec![],
            install_hint: Some("brew install\n  get-token".into()),
            cluster: None,
            origin: "kubeconfig 'k', context 'c', user 'u'".into(),
        }
    }

    #[test]
    fn outputs_are_checked_as_client_go_checks_them() {
        let p = plugin();
        let ok = br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t0k3n","expirationTimestamp":"2026-11-29T10:15:00Z"}}"#;
        let issued = p.parse(ok).unwrap();
        assert_eq!(issued.token.unwrap().expose(), "t0k3n");
        assert_eq!(
            issued.expires,
            Some(humantime::parse_rfc3339("2026-11-29T10:15:00Z").unwrap())
        );
        let cert = br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"C","clientKeyData":"K"}}"#;
        let issued = p.parse(cert).unwrap();
        assert_eq!(issued.identity.unwrap().cert_pem, b"C");
        assert_eq!(issued.expires, None);
        for (out, why) in [
            (&br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"t"}}"#[..], "returned version client.authentication.k8s.io/v1beta1"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}"#, "did not return a status"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{}}"#, "neither a token"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientKeyData":"K"}}"#, "not both"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"Status","status":{"token":"t"}}"#, "kind 'Status'"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t","expirationTimestamp":"soon"}}"#, "not an RFC 3339 time"),
        ] {
            let e = p.parse(out).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn parse_errors_never_quote_the_output() {
        let p = plugin();
        for out in [
            &br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":"s3cr3t"}"#[..],
            br#"{"status":{"token":["s3cr3t"]}}"#,
            b"s3cr3t",
            br#"{"kind":"s3cr3t"#,
        ] {
            let e = p.parse(out).unwrap_err();
            assert!(!e.contains("s3cr3t"), "{e}");
            assert!(e.contains("not an ExecCredential") || e.contains("kind"), "{e}");
        }
    }

    #[test]
    fn exec_info_carries_the_cluster_only_when_asked() {
        let mut p = plugin();
        let info: serde_json::Value = serde_json::from_str(&p.exec_info()).unwrap();
        let fixture: serde_json::Value =
            serde_json::from_slice(&crate::testutil::fixture("execcredential-v1-input.json"))
                .unwrap();
        assert_eq!(info, fixture);
        p.cluster = Some(serde_json::json!({"server": "https://203.0.113.10:6443"}));
        let info: serde_json::Value = serde_json::from_str(&p.exec_info()).unwrap();
        assert_eq!(
            info["spec"]["cluster"]["server"],
            "https://203.0.113.10:6443"
        );
        assert_eq!(info["spec"]["interactive"], false);
    }

    #[test]
    fn a_missing_command_names_the_hint_on_one_line() {
        let p = plugin();
        let e = p.locate(&|_| Some("/nonexistent".into())).unwrap_err();
        assert_eq!(
            e,
            "kubeconfig 'k', context 'c', user 'u': exec credential plugin 'get-token' not found on PATH (install hint: brew install get-token)"
        );
        let found = Plugin {
            command: "sh".into(),
            ..plugin()
        }
        .locate(&|_| Some("/nonexistent:/bin:/usr/bin".into()))
        .unwrap();
        assert!(found.ends_with("sh"));
    }

    #[test]
    fn a_hanging_plugin_is_killed_and_a_working_one_gets_its_env() {
        let hang = Plugin {
            command: "sh".into(),
            args: vec!["-c".into(), "exec sleep 30".into()],
            ..plugin()
        };
        let started = Instant::now();
        let e = hang.run(Duration::from_millis(300)).unwrap_err();
        assert!(e.ends_with("did not finish within 300ms; killed it"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let ok = Plugin {
            command: "sh".into(),
            args: vec![
                "-c".into(),
                r#"printf '{"apiVersion":"%s","kind":"ExecCredential","status":{"token":"%s"}}' client.authentication.k8s.io/v1 "$TOKEN_FROM_ENV""#.into(),
            ],
            env: vec![("TOKEN_FROM_ENV".into(), "from-env".into())],
            ..plugin()
        };
        let issued = ok.run(Duration::from_secs(10)).unwrap();
        assert_eq!(issued.token.unwrap().expose(), "from-env");
    }

    /// Issue 25: the plugin runs in its own process group, so at the timeout what it
    /// started dies with it (before, only the plugin was killed and its grandchild lived
    /// on, holding the pipes).
    #[test]
    fn a_plugin_that_hangs_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("grandchild");
        let hang = Plugin {
            command: "sh".into(),
            args: vec![
                "-c".into(),
                format!("sleep 30 & echo $! > '{}'; wait", pid_file.display()),
            ],
            ..plugin()
        };
        let e = hang.run(Duration::from_millis(500)).unwrap_err();
        assert!(e.ends_with("did not finish within 500ms; killed it"), "{e}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let proc = format!("/proc/{pid}/stat");
        let started = Instant::now();
        // Gone, or a zombie waiting for its parent (this test process is not it).
        while std::fs::read_to_string(&proc).is_ok_and(|s| !s.contains(") Z ")) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the grandchild {pid} outlived the plugin's timeout"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn refresh_comes_a_little_before_expiry() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3600);
        assert_eq!(refresh_at(t0, None), None);
        assert_eq!(
            refresh_at(t0, Some(t0 + hour)),
            Some(t0 + hour - Duration::from_secs(60))
        );
        assert_eq!(
            refresh_at(t0, Some(t0 + Duration::from_secs(100))),
            Some(t0 + Duration::from_secs(90))
        );
        assert_eq!(refresh_at(t0, Some(t0)), Some(t0), "already expired");
    }
}
