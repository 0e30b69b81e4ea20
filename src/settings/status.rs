//! `cmpoll status`'s settings: which daemon to ask (`--server-url`, else `CMPOLL_SERVER_URL`,
//! else the address the daemon's own `CMPOLL_LISTEN` or `HEALTH_PORT` gives), or which
//! folder to read (`--out-dir`); errors name the flag. It reads neither `CMPOLL_OUT_DIR`
//! nor `CMPOLL_JSON`: `kubectl exec … cmpoll status` runs where they are set for the daemon.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use super::lookup::{Error, parse_listen, usage};
use crate::cli::{StatusArgs, flag};
use crate::status::answer::{Query, State};
use crate::status::{Credentials, Options as StatusSettings, Target};

/// `cmpoll status`'s settings.
pub fn status(
    args: &StatusArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<StatusSettings, Error> {
    fn given(v: &Option<String>) -> Option<&str> {
        v.as_deref().map(str::trim).filter(|v| !v.is_empty())
    }
    let target = match (given(&args.server_url), given(&args.out_dir)) {
        (Some(_), Some(_)) => {
            return Err(usage(
                "--out-dir",
                "not used with --server-url: give one (a daemon to ask, or a folder to read)",
            ));
        }
        (None, Some(dir)) => Target::Folder(PathBuf::from(dir)),
        (Some(url), None) => Target::Server(server_url("--server-url", url)?),
        (None, None) => match env(StatusArgs::SERVER_URL_VAR).filter(|v| !v.trim().is_empty()) {
            Some(url) => Target::Server(server_url(StatusArgs::SERVER_URL_VAR, url.trim())?),
            None => Target::Server(from_listen(env)?),
        },
    };
    if args.all && !args.module.is_empty() {
        return Err(usage(
            "--module",
            "not used with --all: give one (one module, or every module)",
        ));
    }
    let query = Query {
        states: match (args.all, args.module.is_empty()) {
            (false, true) => vec![State::Rejected, State::Unwritten],
            _ => Vec::new(),
        },
        modules: args.module.iter().map(|m| m.trim().to_string()).collect(),
        summary: false,
    };
    let server = matches!(target, Target::Server(_));
    let path = |flag: &str, v: &Option<String>| -> Result<Option<PathBuf>, Error> {
        match (given(v), server) {
            (Some(_), false) => Err(usage(flag, "only used with --server-url (a daemon asked)")),
            (v, _) => Ok(v.map(PathBuf::from)),
        }
    };
    if args.fleet && !server {
        return Err(usage(
            "--fleet",
            "only used with --server-url (a hub asked)",
        ));
    }
    if args.fleet && (args.all || !args.module.is_empty()) {
        return Err(usage(
            "--fleet",
            "not used with --all or --module (a hub lists its fleet's objects)",
        ));
    }
    Ok(StatusSettings {
        target,
        json: args.json,
        query,
        fleet: args.fleet,
        credentials: Credentials {
            token_file: path("--token-file", &args.token_file)?,
            ca_file: path("--ca-file", &args.ca_file)?,
        },
    })
}

fn server_url(from: &str, url: &str) -> Result<String, Error> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(usage(
            from,
            format!(
                "'{url}' is not an http:// or https:// URL (for example http://127.0.0.1:8080)"
            ),
        ));
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// The daemon's own address: `CMPOLL_LISTEN` (all interfaces → the loopback), else
/// `HEALTH_PORT` (`cmpoll sidecar`), else port 8080.
fn from_listen(env: &dyn Fn(&str) -> Option<String>) -> Result<String, Error> {
    let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let listen_var = flag::listen.var();
    let addr = if let Some(listen) = var(&listen_var) {
        parse_listen(&listen).map_err(|e| usage(&listen_var, e))?
    } else if let Some(port) = var("HEALTH_PORT") {
        let port: u16 = (port.trim().parse())
            .map_err(|_| usage("HEALTH_PORT", format!("'{port}' is not a port number")))?;
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080)
    };
    // A daemon listening on every interface answers on the loopback (a [::] socket takes
    // IPv4 too).
    let addr = match addr.ip() {
        ip if ip.is_unspecified() => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port()),
        _ => addr,
    };
    Ok(format!("http://{addr}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(server_url: Option<&str>, out_dir: Option<&str>) -> StatusArgs {
        StatusArgs {
            server_url: server_url.map(String::from),
            out_dir: out_dir.map(String::from),
            json: false,
            all: false,
            module: Vec::new(),
            fleet: false,
            token_file: None,
            ca_file: None,
        }
    }

    /// --server-url, --out-dir, the environment, and what it makes.
    type Case = (
        Option<&'static str>,
        Option<&'static str>,
        &'static [(&'static str, &'static str)],
        Result<Target, &'static str>,
    );

    #[test]
    fn where_status_reads() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let server = |u: &str| Ok(Target::Server(u.to_string()));
        let cases: &[Case] = &[
            (None, None, &[], server("http://127.0.0.1:8080")),
            (
                None,
                None,
                &[("CMPOLL_LISTEN", ":9090")],
                server("http://127.0.0.1:9090"),
            ),
            (
                None,
                None,
                &[("CMPOLL_LISTEN", "[::]:9090")],
                server("http://127.0.0.1:9090"),
            ),
            (
                None,
                None,
                &[("CMPOLL_LISTEN", "[::1]:9090")],
                server("http://[::1]:9090"),
            ),
            (
                None,
                None,
                &[("CMPOLL_LISTEN", "10.0.0.1:80")],
                server("http://10.0.0.1:80"),
            ),
            (
                None,
                None,
                &[("HEALTH_PORT", "8081")],
                server("http://127.0.0.1:8081"),
            ),
            (
                None,
                None,
                &[
                    ("CMPOLL_SERVER_URL", "https://x:1/"),
                    ("CMPOLL_LISTEN", ":1"),
                ],
                server("https://x:1"),
            ),
            (
                Some("http://a:1"),
                None,
                &[("CMPOLL_SERVER_URL", "http://b:2")],
                server("http://a:1"),
            ),
            (
                None,
                Some("/out"),
                &[("CMPOLL_LISTEN", ":1")],
                Ok(Target::Folder("/out".into())),
            ),
            (
                Some("http://a:1"),
                Some("/out"),
                &[],
                Err("--out-dir: not used with --server-url"),
            ),
            (
                Some("a:1"),
                None,
                &[],
                Err("--server-url: 'a:1' is not an http:// or https:// URL"),
            ),
            (
                None,
                None,
                &[("CMPOLL_LISTEN", "nope")],
                Err("CMPOLL_LISTEN: 'nope' is not an address"),
            ),
            (
                None,
                None,
                &[("HEALTH_PORT", "x")],
                Err("HEALTH_PORT: 'x' is not a port number"),
            ),
        ];
        for (url, dir, vars, want) in cases {
            let got = status(&args(*url, *dir), &env(vars));
            match (got, want) {
                (Ok(s), Ok(t)) => assert_eq!(&s.target, t, "{url:?} {dir:?} {vars:?}"),
                (Err(e), Err(w)) => {
                    assert!(e.to_string().starts_with(w), "{e}");
                    assert_eq!(crate::error::Error::from(e.clone()).exit_code(), 2);
                }
                (got, want) => panic!("{url:?} {dir:?} {vars:?}: {got:?}, want {want:?}"),
            }
        }
    }
}

#[cfg(test)]
mod fleet_tests {
    use super::*;
    use argh::FromArgs as _;

    /// `--fleet`, `--token-file` and `--ca-file` ask a server; the first lists no module.
    #[test]
    fn fleet_and_credentials_ask_a_server() {
        let none = |_: &str| None;
        let parse = |a: &[&str]| StatusArgs::from_args(&["status"], a).unwrap();
        let s = status(
            &parse(&[
                "--server-url",
                "https://hub:8443",
                "--fleet",
                "--token-file",
                "/t",
                "--ca-file",
                "/ca",
            ]),
            &none,
        )
        .unwrap();
        assert!(s.fleet);
        assert_eq!(s.credentials.token_file, Some(PathBuf::from("/t")));
        assert_eq!(s.credentials.ca_file, Some(PathBuf::from("/ca")));
        for (a, flag) in [
            (&["--out-dir", "/o", "--fleet"][..], "--fleet"),
            (
                &["--out-dir", "/o", "--token-file", "/t"][..],
                "--token-file",
            ),
            (&["--out-dir", "/o", "--ca-file", "/c"][..], "--ca-file"),
            (&["--fleet", "--all"][..], "--fleet"),
        ] {
            let e = status(&parse(a), &none).unwrap_err().to_string();
            assert!(e.contains(flag), "{a:?}: {e}");
        }
    }
}
