//! `cmpoll serve`'s settings: the source and selection flags it shares with `run` (not
//! `--keys` or `--manifests`: it serves whole objects, as an apiserver listed them), the
//! poll's `--interval` (1s by default here: one poll for a fleet) and `--jitter`, and the
//! HTTPS endpoint (`--listen`, `--tls-cert-file`, `--tls-key-file`, all required).

use std::path::PathBuf;
use std::time::Duration;

use super::lookup::{Error, Lookup, parse_duration, parse_listen, path, required, usage};
use super::run::{jitter, validating};
use super::source::{logging, source};
use crate::cli::{Needs, ServeArgs, flag};
use crate::ops::logging as log_options;
use crate::serve;
use crate::source::Resources;
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
    look.check_needs(|n| (n == Needs::Server && server) || (n == Needs::Validate && validating))?;
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
}
