//! `cmpoll serve`'s settings: the source and selection flags it shares with `run` (not
//! `--keys` or `--manifests`: it serves whole objects, as an apiserver listed them), the
//! poll's `--interval` (1s by default here: one poll for a fleet) and `--jitter`, and the
//! HTTPS endpoint (`--listen`, `--tls-cert-file`, `--tls-key-file`, all required), and
//! rollouts (`--rollout`, `--rollout-wait`, `--rollout-state`). The state Secret's default
//! namespace is the hub's own, found as `--namespace-from-context` finds it: the one place
//! these settings read files (the kubeconfig, the service account's namespace file).

use std::path::PathBuf;
use std::time::Duration;

use super::lookup::{Error, Lookup, Val, parse_duration, parse_listen, path, required, usage};
use super::run::{jitter, validating};
use super::source::{logging, source};
use crate::cli::{Needs, ServeArgs, flag};
use crate::kube;
use crate::ops::logging as log_options;
use crate::serve;
use crate::serve::remotecfg::root::{Location, Named, Paths as RemotecfgPaths};
use crate::serve::rollout::steps::{Settings as Rollout, Steps};
use crate::source::Resources;
use crate::source::origin::{self, Origin};
use crate::validate;

/// `--interval`'s default for `cmpoll serve`: one poll a second is one agent's cost, and
/// every follower sees a change within about a second of the hub.
pub const SERVE_INTERVAL: Duration = Duration::from_secs(1);

/// What `cmpoll serve` runs with.
#[derive(Clone, Debug)]
pub struct ServeSettings {
    pub serve: serve::Options,
    pub logging: log_options::Options,
}

/// `cmpoll serve`'s settings.
pub fn serve(
    args: &ServeArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ServeSettings, Error> {
    read(&Lookup::new(args.given(), env))
}

fn read(look: &Lookup) -> Result<ServeSettings, Error> {
    let server = look.given(&flag::server)?.is_some();
    let validating = look.given(&flag::validate)?.is_some();
    let rolling = look.given(&flag::rollout)?.is_some();
    let remote = look.given(&flag::remotecfg)?.is_some();
    look.check_needs(|n| match n {
        Needs::Server => server,
        Needs::Validate => validating,
        Needs::Rollout => rolling,
        Needs::Remotecfg => remote,
        _ => false,
    })?;
    let needed = |f: &'static crate::cli::Flag, what: &str| {
        look.opt(f)
            .filter(|v| !v.value.trim().is_empty())
            .ok_or_else(|| usage(&f.long(), format!("is required: {what}")))
    };
    let listen = needed(
        &flag::listen,
        "the HTTPS address its followers list, e.g. :8443",
    )?;
    let listen = parse_listen(&listen.value).map_err(|e| usage(&listen.from, e))?;
    let cert = needed(&flag::tls_cert_file, "the serving certificate (PEM)")?;
    let key = needed(&flag::tls_key_file, "the serving certificate's key (PEM)")?;
    let source = source(look)?;
    let _ = required(look, &flag::resource)?;
    let validate = validate(look, source.selection.resources)?;
    let rollout = rollout(look, &source)?;
    Ok(ServeSettings {
        serve: serve::Options {
            source,
            interval: look.duration_or(&flag::interval, SERVE_INTERVAL)?,
            jitter: jitter(look)?,
            listen,
            cert: PathBuf::from(cert.value),
            key: PathBuf::from(key.value),
            drain: drain_window(look)?,
            token_audience: (look.opt(&flag::token_audience))
                .map(|v| v.value.trim().to_string())
                .filter(|v| !v.is_empty()),
            per_service_account: look.on(&flag::authorize_per_service_account)?,
            report_events: look.on(&flag::report_events)?,
            // Given without --validate: refused above ("only used with").
            state_dir: path(look.opt(&flag::state_dir))?,
            validate,
            rollout,
            remotecfg: remotecfg(look)?,
        },
        logging: logging(look)?,
    })
}

/// `--validate-timeout`'s default for `cmpoll serve`, as `cmpoll run`'s.
const SERVE_VALIDATE_TIMEOUT: Duration = Duration::from_secs(30);

/// `--validate CMD` with `--validate-timeout` and `--validate-jobs`: `cmpoll run`'s
/// contract, each object's files staged as `run` stages a module.
fn validate(look: &Lookup, kinds: Resources) -> Result<Option<validate::Options>, Error> {
    let Some((command, timeout, jobs)) = validating(look, SERVE_VALIDATE_TIMEOUT)? else {
        return Ok(None);
    };
    Ok(Some(validate::Options {
        command,
        timeout,
        jobs,
        meta_dir: None,
        ext: String::new(),
        template: None,
        kinds,
        confirm: None,
        out_dir: None,
    }))
}

/// `--rollout-state`'s name when it is not given.
pub const ROLLOUT_STATE_NAME: &str = "cmpoll-rollouts";

/// `--rollout STEPS` with `--rollout-wait` (`0s` included: each step then waits only for
/// its followers) and `--rollout-state`; None without `--rollout` (given alone, the other
/// two were refused above: "only used with").
fn rollout(look: &Lookup, source: &origin::Options) -> Result<Option<Rollout>, Error> {
    let state = look.opt(&flag::rollout_state);
    let wait = look.duration_or_zero(&flag::rollout_wait)?;
    let Some(v) = look.opt(&flag::rollout) else {
        return Ok(None);
    };
    let steps = Steps::parse(&v.value).map_err(|e| usage(&v.from, e))?;
    let (state_namespace, state_name) = match state {
        Some(v) => state_secret(&v)?,
        None => (own_namespace(look, source)?, ROLLOUT_STATE_NAME.to_string()),
    };
    Ok(Some(Rollout {
        steps,
        wait,
        state_namespace,
        state_name,
    }))
}

/// `NAMESPACE/NAME`: a namespace and a Secret's name, as the apiserver takes them.
fn state_secret(v: &Val) -> Result<(String, String), Error> {
    let not = |why: String| {
        usage(
            &v.from,
            format!("'{}' is not NAMESPACE/NAME: {why}", v.value),
        )
    };
    let (ns, name) = (v.value.trim().split_once('/'))
        .ok_or_else(|| not("give the Secret's namespace and name".into()))?;
    let ns_errs = crate::names::dns1123_label(ns);
    if !ns_errs.is_empty() {
        return Err(not(format!("namespace: {}", ns_errs.join("; "))));
    }
    let name_errs = crate::names::dns1123_subdomain(name);
    if !name_errs.is_empty() {
        return Err(not(format!("name: {}", name_errs.join("; "))));
    }
    Ok((ns.to_string(), name.to_string()))
}

/// The hub's own namespace, as `--namespace-from-context` finds it: the namespace of the
/// credentials the hub uses (`kube::Config::resolve`'s order: `--kubeconfig` or
/// `KUBECONFIG`'s context, else in a pod its service account's namespace file, else
/// `~/.kube/config`'s context; `--server` names none). None is a usage error naming
/// `--rollout-state`.
fn own_namespace(look: &Lookup, source: &origin::Options) -> Result<String, Error> {
    let from = flag::rollout_state.long();
    let Origin::Api(flags) = &source.origin else {
        return Err(usage(&from, "needed without an apiserver"));
    };
    let config = kube::Config::resolve(flags, look.env).map_err(|e| {
        usage(
            &from,
            format!(
                "not given, and the hub's own namespace cannot be found ({e}): give NAMESPACE/NAME"
            ),
        )
    })?;
    config.namespace.ok_or_else(|| {
        usage(
            &from,
            format!(
                "not given, and the hub's own namespace is unknown ({} names none): give NAMESPACE/NAME",
                config.origin
            ),
        )
    })
}

/// `--remotecfg ROOT` (a file, or `configmap:NS/NAME`) with `--remotecfg-arguments
/// FILE`. What they name is read when the hub starts (`serve::run`).
fn remotecfg(look: &Lookup) -> Result<Option<RemotecfgPaths>, Error> {
    let arguments = path(look.opt(&flag::remotecfg_arguments))?;
    let Some(v) = look.opt(&flag::remotecfg) else {
        return Ok(None);
    };
    if let Some(named) = Named::parse(&v.value) {
        let root = Location::ConfigMap(named.map_err(|e| usage(&v.from, e))?);
        return Ok(Some(RemotecfgPaths { root, arguments }));
    }
    let Some(root) = path(Some(v))? else {
        return Ok(None);
    };
    Ok(Some(RemotecfgPaths {
        root: Location::File(root),
        arguments,
    }))
}

/// `--drain-window`: a duration, `0s` (no drain) included.
fn drain_window(look: &Lookup) -> Result<Duration, Error> {
    match look.value(&flag::drain_window) {
        Some(v) => parse_duration(&v),
        None => Ok(Duration::ZERO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::testing;

    fn serve_of(args: &[&str], env: &[(&str, &str)]) -> Result<ServeSettings, String> {
        let crate::cli::Command::Serve(args) = testing::command(&[&["serve"], args].concat())?
        else {
            panic!("serve")
        };
        serve(&args, &testing::env(env)).map_err(|e| e.to_string())
    }

    const NEEDED: [&str; 6] = [
        "--listen",
        ":8443",
        "--tls-cert-file",
        "c.pem",
        "--tls-key-file",
        "k.pem",
    ];

    #[test]
    fn what_it_needs_and_its_defaults() {
        let s = serve_of(&NEEDED, &[]).unwrap();
        assert_eq!(s.serve.interval, SERVE_INTERVAL, "1s here");
        assert_eq!(s.serve.listen.to_string(), "0.0.0.0:8443");
        assert_eq!(
            s.serve.source.selection.labels.as_str(),
            "cmpoll.io/module=true"
        );
        let s = serve_of(&NEEDED, &[("CMPOLL_INTERVAL", "10s")]).unwrap();
        assert_eq!(s.serve.interval, Duration::from_secs(10));
        for (i, flag) in ["--listen", "--tls-cert-file", "--tls-key-file"]
            .iter()
            .enumerate()
        {
            let mut args = NEEDED.to_vec();
            args.drain(i * 2..i * 2 + 2);
            let e = serve_of(&args, &[]).unwrap_err();
            assert!(e.starts_with(&format!("{flag}: is required")), "{e}");
        }
        // Neither a flag nor a variable of `run` only is one of the hub's.
        assert!(serve_of(&[&NEEDED[..], &["--out-dir", "x"]].concat(), &[]).is_err());
        assert!(serve_of(&[&NEEDED[..], &["--keys", "*.yaml"]].concat(), &[]).is_err());
        assert!(serve_of(&[&NEEDED[..], &["--manifests", "."]].concat(), &[]).is_err());
        let s = serve_of(&NEEDED, &[("CMPOLL_MANIFESTS", "."), ("CMPOLL_KEYS", "x")]).unwrap();
        assert!(matches!(
            s.serve.source.origin,
            crate::source::origin::Origin::Api(_)
        ));
        let e = serve_of(&[&NEEDED[..], &["--token-file", "t"]].concat(), &[]).unwrap_err();
        assert!(
            e.starts_with("--token-file: only used with --server"),
            "{e}"
        );
    }

    #[test]
    fn remotecfg_takes_a_file_and_its_arguments() {
        let s = serve_of(&NEEDED, &[]).unwrap();
        assert!(s.serve.remotecfg.is_none());
        let with = [&NEEDED[..], &["--remotecfg", "/etc/root.alloy"]].concat();
        let r = serve_of(&with, &[("CMPOLL_REMOTECFG_ARGUMENTS", "/etc/args")])
            .unwrap()
            .serve
            .remotecfg
            .unwrap();
        assert_eq!(r.root, Location::File(PathBuf::from("/etc/root.alloy")));
        assert_eq!(r.arguments, Some(PathBuf::from("/etc/args")));
        let cm = [&NEEDED[..], &["--remotecfg", "configmap:ops/root"]].concat();
        let r = serve_of(&cm, &[]).unwrap().serve.remotecfg.unwrap();
        let named = Named::parse("configmap:ops/root").unwrap().unwrap();
        assert_eq!(r.root, Location::ConfigMap(named));
        let bad = [&NEEDED[..], &["--remotecfg", "configmap:ops"]].concat();
        let e = serve_of(&bad, &[]).unwrap_err();
        assert!(
            e.starts_with("--remotecfg: 'configmap:ops': give configmap:NAMESPACE/NAME"),
            "{e}"
        );
        let alone = [&NEEDED[..], &["--remotecfg-arguments", "/etc/args"]].concat();
        let e = serve_of(&alone, &[]).unwrap_err();
        assert!(
            e.starts_with("--remotecfg-arguments: only used with --remotecfg"),
            "{e}"
        );
        let empty = [&NEEDED[..], &["--remotecfg", ""]].concat();
        assert!(
            serve_of(&empty, &[])
                .unwrap_err()
                .starts_with("--remotecfg: empty")
        );
    }

    #[test]
    fn validate_and_what_it_remembers() {
        let s = serve_of(&NEEDED, &[]).unwrap();
        assert!(s.serve.validate.is_none());
        let with = [
            &NEEDED[..],
            &["--validate", "check", "--state-dir", "/var/lib/h"],
        ]
        .concat();
        let s = serve_of(&with, &[("CMPOLL_VALIDATE_JOBS", "3")]).unwrap();
        let v = s.serve.validate.unwrap();
        assert_eq!((v.command.as_str(), v.jobs), ("check", 3));
        assert_eq!(v.timeout, Duration::from_secs(30));
        assert_eq!(s.serve.state_dir, Some(PathBuf::from("/var/lib/h")));
        for (alone, flag) in [
            (["--state-dir", "/d"], "--state-dir"),
            (["--validate-timeout", "5s"], "--validate-timeout"),
            (["--validate-jobs", "2"], "--validate-jobs"),
        ] {
            let e = serve_of(&[&NEEDED[..], &alone].concat(), &[]).unwrap_err();
            assert!(
                e.starts_with(&format!("{flag}: only used with --validate")),
                "{e}"
            );
        }
        let e = serve_of(&[&NEEDED[..], &["--validate", " "]].concat(), &[]).unwrap_err();
        assert!(e.starts_with("--validate: empty"), "{e}");
        // What `run` only has stays run's.
        let e = serve_of(
            &[&NEEDED[..], &["--validate", "c", "--confirm", "x"]].concat(),
            &[],
        )
        .unwrap_err();
        assert!(e.contains("--confirm"), "{e}");
    }

    /// Every flag of the hub's table entries is read, and no other.
    #[test]
    fn every_flag_of_serve_is_read() {
        let Ok(crate::cli::Command::Serve(args)) =
            testing::command(&[&["serve"][..], &NEEDED].concat())
        else {
            panic!("serve")
        };
        let env = |_: &str| None;
        let look = Lookup::new(args.given(), &env);
        read(&look).unwrap();
        let mut read = look.read();
        read.sort();
        read.dedup();
        let mut table: Vec<&str> = (flag::ALL.iter())
            .filter(|f| f.group.of("serve"))
            .map(|f| f.field)
            .collect();
        table.sort();
        assert_eq!(read, table);
    }

    fn rolling(args: &[&str], env: &[(&str, &str)]) -> Result<Rollout, String> {
        let s = serve_of(&[&NEEDED[..], args].concat(), env)?;
        Ok(s.serve.rollout.expect("--rollout"))
    }

    #[test]
    fn rollout_flags() {
        assert_eq!(serve_of(&NEEDED, &[]).unwrap().serve.rollout, None);
        let r = rolling(
            &[
                "--rollout",
                "1%,10%,50%,100%",
                "--rollout-state",
                "ops/hub-rollouts",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(r.steps.fractions(), [0.01, 0.1, 0.5, 1.0]);
        assert_eq!(r.wait, Duration::from_secs(60), "1m by default");
        assert_eq!(
            (r.state_namespace.as_str(), r.state_name.as_str()),
            ("ops", "hub-rollouts")
        );
        let r = rolling(
            &["--rollout-state", " ops/x "],
            &[("CMPOLL_ROLLOUT", "none"), ("CMPOLL_ROLLOUT_WAIT", "10s")],
        )
        .unwrap();
        assert!(r.steps.is_none());
        assert_eq!(r.wait, Duration::from_secs(10));
        assert_eq!(r.state_name, "x");
        let r = rolling(
            &[
                "--rollout",
                "100%",
                "--rollout-wait",
                "0s",
                "--rollout-state",
                "a/b",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            r.wait,
            Duration::ZERO,
            "each step waits only for its followers"
        );
    }

    #[test]
    fn rollout_flags_refused_name_the_flag() {
        let state = ["--rollout-state", "ops/r"];
        for (args, env, says) in [
            (
                &["--rollout", "50%"][..],
                &[][..],
                "--rollout: the last step is 50%, not 100%",
            ),
            (
                &["--rollout", "1e3%"],
                &[],
                "--rollout: step 1: '1e3%' is not N%",
            ),
            (&["--rollout", ""], &[], "--rollout: empty"),
            (
                &[],
                &[("CMPOLL_ROLLOUT", "0%,100%")],
                "CMPOLL_ROLLOUT: step 1: '0%'",
            ),
            (
                &["--rollout", "100%", "--rollout-wait", "soon"],
                &[],
                "--rollout-wait: invalid duration 'soon'",
            ),
            (
                &["--rollout", "100%", "--rollout-wait", "400d"],
                &[],
                "--rollout-wait: '400d' is too long",
            ),
            (
                &["--rollout-wait", "1m"],
                &[],
                "--rollout-wait: only used with --rollout",
            ),
            (
                &[],
                &[("CMPOLL_ROLLOUT_WAIT", "1m")],
                "CMPOLL_ROLLOUT_WAIT: only used with --rollout",
            ),
            (
                &["--rollout-state", "a/b"],
                &[],
                "--rollout-state: only used with --rollout",
            ),
        ] {
            let args = [&state[..], args].concat();
            // --rollout-state itself is given alone in the last case.
            let args = if says.starts_with("--rollout-state") {
                &args[2..]
            } else {
                &args[..]
            };
            let e = serve_of(&[&NEEDED[..], args].concat(), env)
                .map(|_| ())
                .unwrap_err();
            assert!(e.starts_with(says), "{args:?} {env:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        for (bad, says) in [
            ("rollouts", "give the Secret's namespace and name"),
            ("/rollouts", "namespace: "),
            ("ops/", "name: "),
            ("Ops/rollouts", "namespace: "),
            ("a.b/rollouts", "namespace: must not contain dots"),
            ("ops/a/b", "name: "),
            ("ops/UP", "name: "),
        ] {
            let e = rolling(&["--rollout", "100%", "--rollout-state", bad], &[]).unwrap_err();
            let want = format!("--rollout-state: '{bad}' is not NAMESPACE/NAME: {says}");
            assert!(e.starts_with(&want), "{bad}: {e}");
        }
    }

    /// Without --rollout-state: `cmpoll-rollouts` in the hub's own namespace, found as
    /// --namespace-from-context finds it; none is a usage error naming the flag.
    #[test]
    fn rollout_state_defaults_to_the_hub_s_own_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let sa = dir.path().join("sa");
        std::fs::create_dir(&sa).unwrap();
        std::fs::write(sa.join("token"), "t").unwrap();
        let sa_dir = sa.to_str().unwrap();
        let in_pod = [
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("CMPOLL_SERVICE_ACCOUNT_DIR", sa_dir),
        ];
        let e = rolling(&["--rollout", "100%"], &in_pod).unwrap_err();
        assert_eq!(
            e,
            "--rollout-state: not given, and the hub's own namespace is unknown (in-cluster service account names none): give NAMESPACE/NAME"
        );
        std::fs::write(sa.join("namespace"), "monitoring\n").unwrap();
        let r = rolling(&["--rollout", "100%"], &in_pod).unwrap();
        assert_eq!(
            (r.state_namespace.as_str(), r.state_name.as_str()),
            ("monitoring", "cmpoll-rollouts"),
        );
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n\
             users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
             \x20   namespace: team-a\ncurrent-context: x\n",
        )
        .unwrap();
        let kc = kubeconfig.to_str().unwrap();
        let r = rolling(&["--rollout", "100%", "--kubeconfig", kc], &[]).unwrap();
        assert_eq!(r.state_namespace, "team-a");
        let r = rolling(&["--rollout", "100%"], &[("KUBECONFIG", kc)]).unwrap();
        assert_eq!(r.state_namespace, "team-a");
        let e = rolling(&["--rollout", "100%", "--server", "https://k:6443"], &[]).unwrap_err();
        assert!(e.starts_with("--rollout-state: not given, and the hub's own namespace is unknown (--server names none)"), "{e}");
        let e = rolling(&["--rollout", "100%"], &[]).unwrap_err();
        assert!(e.starts_with("--rollout-state: not given, and the hub's own namespace cannot be found (no apiserver configured"), "{e}");
        // Given, it is taken as it is: nothing is read.
        let r = rolling(&["--rollout", "100%", "--rollout-state", "a/b"], &[]).unwrap();
        assert_eq!(r.state_namespace, "a");
    }
}
