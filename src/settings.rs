//! What we decided: the command line plus `CMPOLL_*` variables plus defaults, validated.
//!
//! Every usage error is born here, as one line naming the flag (or the variable it came
//! from) and what is wrong with it. The environment is a parameter, so tests need no global
//! state. Nothing here reads files or talks to the network: `kube::Config::resolve` does
//! that next.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{Command, Common, RunArgs};
use crate::error::Error;
use crate::kube::config::Flags;
use crate::module::KeyFilter;
use crate::selector::{FieldSelector, LabelSelector};
use crate::signals::Signal;
use crate::sink::outdir::Layout;
use crate::source::Selection;
use crate::validation;

pub const DEFAULT_SELECTOR: &str = "cmpoll.io/module=true";
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 64 << 20;

#[derive(Clone, Debug)]
pub struct Settings {
    pub command: Mode,
    pub source: SourceSettings,
    pub selection: Selection,
    pub client: ClientSettings,
    pub log_format: LogFormat,
}

#[derive(Clone, Debug)]
pub enum Mode {
    List { json: bool },
    Run(Box<RunSettings>),
}

#[derive(Clone, Debug)]
pub enum SourceSettings {
    Manifests(PathBuf),
    Api(Flags),
}

#[derive(Clone, Debug)]
pub struct ClientSettings {
    pub timeout: Duration,
    pub page_size: u32,
    pub max_response_bytes: u64,
    pub metadata_first: bool,
    pub namespace_from_context: bool,
    pub allow_insecure_http: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildStdin {
    Events,
    Null,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    Always,
    OnFailure,
    Never,
}

#[derive(Clone, Debug)]
pub struct RunSettings {
    pub interval: Duration,
    pub jitter: f64,
    pub once: bool,
    pub stdout_events: bool,
    pub out_dir: Option<PathBuf>,
    pub layout: Layout,
    pub ext: String,
    pub file_mode: u32,
    pub old_version_ttl: Duration,
    pub child_stdin: ChildStdin,
    pub reload_signal: Option<Signal>,
    pub restart: Restart,
    pub shutdown_grace: Duration,
    pub reload_url: Option<String>,
    pub reload_method: String,
    pub reload_ca_file: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub agent: Vec<String>,
}

/// A value and where it came from (`--flag` or `CMPOLL_FLAG`), for messages.
struct Val {
    value: String,
    from: String,
}

/// Looks flags up on the command line, then in the environment.
struct Lookup<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
}

fn env_name(flag: &str) -> String {
    format!("CMPOLL_{}", flag.to_ascii_uppercase().replace('-', "_"))
}

fn usage(from: &str, msg: impl std::fmt::Display) -> Error {
    Error::Usage(format!("{from}: {msg}"))
}

impl Lookup<'_> {
    fn opt(&self, cli: &Option<String>, flag: &str) -> Option<Val> {
        match cli {
            Some(v) => Some(Val {
                value: v.clone(),
                from: format!("--{flag}"),
            }),
            None => {
                let name = env_name(flag);
                (self.env)(&name).map(|value| Val { value, from: name })
            }
        }
    }

    fn list(&self, cli: &[String], flag: &str) -> (Vec<String>, String) {
        if !cli.is_empty() {
            return (cli.to_vec(), format!("--{flag}"));
        }
        let name = env_name(flag);
        let values = (self.env)(&name)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        (values, name)
    }

    fn switch(&self, cli: bool, flag: &str) -> Result<bool, Error> {
        if cli {
            return Ok(true);
        }
        let name = env_name(flag);
        match (self.env)(&name) {
            None => Ok(false),
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "" | "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(usage(
                    &name,
                    format!("'{v}' is not a boolean (true or false)"),
                )),
            },
        }
    }

    fn duration(
        &self,
        cli: &Option<String>,
        flag: &str,
        default: Duration,
    ) -> Result<Duration, Error> {
        let Some(v) = self.opt(cli, flag) else {
            return Ok(default);
        };
        let d = parse_duration(&v)?;
        if d.is_zero() {
            return Err(usage(&v.from, "must be more than zero"));
        }
        Ok(d)
    }

    fn choice<T: Copy>(
        &self,
        cli: &Option<String>,
        flag: &str,
        default: T,
        choices: &[(&str, T)],
    ) -> Result<T, Error> {
        let Some(v) = self.opt(cli, flag) else {
            return Ok(default);
        };
        choices
            .iter()
            .find(|(name, _)| *name == v.value.trim())
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
                usage(
                    &v.from,
                    format!("'{}' is not one of {}", v.value, names.join(", ")),
                )
            })
    }
}

/// The longest duration any flag takes: a year is already no interval anyone means, and
/// anything far longer would overflow the clock when added to it.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// A humantime duration (`30s`, `1m30s`, `1h`), at most `MAX_DURATION`.
fn parse_duration(v: &Val) -> Result<Duration, Error> {
    let d = humantime::parse_duration(v.value.trim())
        .map_err(|e| usage(&v.from, format!("invalid duration '{}': {e}", v.value)))?;
    if d > MAX_DURATION {
        return Err(usage(
            &v.from,
            format!("'{}' is too long (at most 365d)", v.value),
        ));
    }
    Ok(d)
}

/// `64MiB`, `1Gi`, `500k`, `1048576`: bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 64MiB)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "k" | "K" | "kB" | "KB" => 1000,
        "M" | "MB" => 1000 * 1000,
        "G" | "GB" => 1000 * 1000 * 1000,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "'{s}': unknown unit '{other}' (use B, KiB, MiB, GiB)"
            ));
        }
    };
    n.checked_mul(mult)
        .filter(|b| *b > 0)
        .ok_or_else(|| format!("'{s}' is out of range"))
}

impl Settings {
    /// Validates parsed arguments against the environment.
    pub fn from_args(
        command: &Command,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, Error> {
        let look = Lookup { env };
        let common = match command {
            Command::List(l) => l.common(),
            Command::Run(r) => r.common(),
        };
        let mode = match command {
            Command::List(l) => Mode::List {
                json: look.switch(l.json, "json")?,
            },
            Command::Run(r) => Mode::Run(Box::new(run_settings(r, &look)?)),
        };
        Ok(Settings {
            command: mode,
            source: source(&common, &look)?,
            selection: selection(&common, &look)?,
            client: client(&common, &look)?,
            log_format: look.choice(
                &common.log_format,
                "log-format",
                LogFormat::Text,
                &[("text", LogFormat::Text), ("json", LogFormat::Json)],
            )?,
        })
    }
}

fn path(v: Option<Val>) -> Option<PathBuf> {
    v.map(|v| PathBuf::from(v.value))
}

fn source(c: &Common, look: &Lookup) -> Result<SourceSettings, Error> {
    if let Some(dir) = look.opt(&c.manifests, "manifests") {
        for (flag, given) in [
            ("server", look.opt(&c.server, "server").is_some()),
            (
                "kubeconfig",
                look.opt(&c.kubeconfig, "kubeconfig").is_some(),
            ),
        ] {
            if given {
                log::info!("{}: reading manifests, so --{flag} is not used", dir.from);
            }
        }
        if !std::path::Path::new(&dir.value).is_dir() {
            return Err(usage(&dir.from, format!("'{}' is not a folder", dir.value)));
        }
        return Ok(SourceSettings::Manifests(dir.value.into()));
    }
    let server = look.opt(&c.server, "server").map(|v| v.value);
    Ok(SourceSettings::Api(Flags {
        server,
        token_file: path(look.opt(&c.token_file, "token-file")),
        ca_file: path(look.opt(&c.ca_file, "ca-file")),
        kubeconfig: path(look.opt(&c.kubeconfig, "kubeconfig")),
        context: look.opt(&c.context, "context").map(|v| v.value),
        service_account_dir: path(look.opt(&c.service_account_dir, "service-account-dir")),
    }))
}

fn selection(c: &Common, look: &Lookup) -> Result<Selection, Error> {
    let labels = match look.opt(&c.selector, "selector") {
        Some(v) => LabelSelector::parse(&v.value).map_err(|e| usage(&v.from, e))?,
        None => LabelSelector::parse(DEFAULT_SELECTOR).expect("the default selector parses"),
    };
    let fields = match look.opt(&c.field_selector, "field-selector") {
        Some(v) => FieldSelector::parse(&v.value).map_err(|e| usage(&v.from, e))?,
        None => FieldSelector::default(),
    };
    let (namespaces, from) = look.list(&c.namespace, "namespace");
    for ns in &namespaces {
        let errs = validation::dns1123_label(ns);
        if !errs.is_empty() {
            return Err(usage(
                &from,
                format!("'{ns}' is not a namespace name: {}", errs.join("; ")),
            ));
        }
    }
    let mut namespaces = namespaces;
    namespaces.sort();
    namespaces.dedup();
    let (globs, from) = look.list(&c.keys, "keys");
    let keys = if globs.is_empty() {
        KeyFilter::all()
    } else {
        KeyFilter::new(&globs).map_err(|e| usage(&from, e))?
    };
    Ok(Selection {
        labels,
        fields,
        namespaces,
        keys,
    })
}

fn client(c: &Common, look: &Lookup) -> Result<ClientSettings, Error> {
    let page_size = match look.opt(&c.page_size, "page-size") {
        Some(v) => v.value.trim().parse::<u32>().map_err(|_| {
            usage(
                &v.from,
                format!("'{}' is not a page size (0 or more)", v.value),
            )
        })?,
        None => 0,
    };
    let max_response_bytes = match look.opt(&c.max_response_bytes, "max-response-bytes") {
        Some(v) => parse_size(&v.value).map_err(|e| usage(&v.from, e))?,
        None => DEFAULT_MAX_RESPONSE_BYTES,
    };
    Ok(ClientSettings {
        timeout: look.duration(&c.timeout, "timeout", Duration::from_secs(10))?,
        page_size,
        max_response_bytes,
        metadata_first: look.switch(c.metadata_first, "metadata-first")?,
        namespace_from_context: look.switch(c.namespace_from_context, "namespace-from-context")?,
        allow_insecure_http: look.switch(c.allow_insecure_http, "allow-insecure-http")?,
    })
}

/// `:8080` (all interfaces), `127.0.0.1:8080`, `[::]:8080`.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    let full = if t.starts_with(':') {
        format!("0.0.0.0{t}")
    } else {
        t.to_string()
    };
    full.parse()
        .map_err(|_| format!("'{s}' is not an address (e.g. :8080, 127.0.0.1:8080, [::]:8080)"))
}

fn run_settings(r: &RunArgs, look: &Lookup) -> Result<RunSettings, Error> {
    let jitter = match look.opt(&r.jitter, "jitter") {
        Some(v) => {
            let j: f64 = v
                .value
                .trim()
                .parse()
                .map_err(|_| usage(&v.from, format!("'{}' is not a fraction", v.value)))?;
            if !(0.0..=1.0).contains(&j) {
                return Err(usage(&v.from, "must be between 0 and 1"));
            }
            j
        }
        None => 0.1,
    };
    let layout = look.choice(
        &r.layout,
        "layout",
        Layout::Files,
        &[("files", Layout::Files), ("concat", Layout::Concat)],
    )?;
    let ext = look.opt(&r.ext, "ext");
    if let Some(e) = &ext {
        if layout != Layout::Concat {
            return Err(usage(&e.from, "only used with --layout concat"));
        }
        if e.value.contains('/') || e.value.contains('\0') {
            return Err(usage(&e.from, "must not contain '/'"));
        }
    }
    let file_mode = match look.opt(&r.file_mode, "file-mode") {
        Some(v) => u32::from_str_radix(v.value.trim().trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| {
                usage(
                    &v.from,
                    format!("'{}' is not an octal mode like 0644", v.value),
                )
            })?,
        None => 0o644,
    };
    // The agent command is positional, not a flag: it has no CMPOLL_ variable.
    let agent = r.agent.clone();
    let needs_agent = |v: &Option<Val>| match v {
        Some(v) if agent.is_empty() => Err(usage(
            &v.from,
            "only used with an agent command (cmpoll run [options] -- AGENT ARGS...)",
        )),
        _ => Ok(()),
    };
    let child_stdin_val = look.opt(&r.child_stdin, "child-stdin");
    needs_agent(&child_stdin_val)?;
    let child_stdin = look.choice(
        &r.child_stdin,
        "child-stdin",
        ChildStdin::Null,
        &[("events", ChildStdin::Events), ("null", ChildStdin::Null)],
    )?;
    let reload_signal = match look.opt(&r.reload_signal, "reload-signal") {
        Some(v) => {
            needs_agent(&Some(Val {
                value: v.value.clone(),
                from: v.from.clone(),
            }))?;
            let sig = v.value.parse::<Signal>().map_err(|e| usage(&v.from, e))?;
            if sig.to_rustix().is_none() {
                return Err(usage(
                    &v.from,
                    format!("{sig} cannot be sent (use a named signal)"),
                ));
            }
            Some(sig)
        }
        None => None,
    };
    needs_agent(&look.opt(&r.restart, "restart"))?;
    let restart = look.choice(
        &r.restart,
        "restart",
        Restart::Always,
        &[
            ("always", Restart::Always),
            ("on-failure", Restart::OnFailure),
            ("never", Restart::Never),
        ],
    )?;
    let reload_url = match look.opt(&r.reload_url, "reload-url") {
        Some(v) => {
            crate::kube::config::normalize_server(&v.value).map_err(|e| usage(&v.from, e))?;
            Some(v.value)
        }
        None => None,
    };
    let reload_method = match look.opt(&r.reload_method, "reload-method") {
        Some(v) => {
            let m = v.value.trim().to_ascii_uppercase();
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(usage(
                    &v.from,
                    format!("'{}' is not an HTTP method", v.value),
                ));
            }
            if reload_url.is_none() {
                return Err(usage(&v.from, "only used with --reload-url"));
            }
            m
        }
        None => "POST".into(),
    };
    let reload_ca_file = look.opt(&r.reload_ca_file, "reload-ca-file");
    if let Some(v) = &reload_ca_file
        && reload_url.is_none()
    {
        return Err(usage(&v.from, "only used with --reload-url"));
    }
    let listen = match look.opt(&r.listen, "listen") {
        Some(v) => Some(parse_listen(&v.value).map_err(|e| usage(&v.from, e))?),
        None => None,
    };
    let once = look.switch(r.once, "once")?;
    if once && !agent.is_empty() {
        return Err(usage("--once", "cannot be combined with an agent command"));
    }
    Ok(RunSettings {
        interval: look.duration(&r.interval, "interval", Duration::from_secs(30))?,
        jitter,
        once,
        stdout_events: look.switch(r.stdout_events, "stdout-events")?,
        out_dir: path(look.opt(&r.out_dir, "out-dir")),
        layout,
        ext: ext.map(|e| e.value).unwrap_or_default(),
        file_mode,
        old_version_ttl: match look.opt(&r.old_version_ttl, "old-version-ttl") {
            Some(v) => parse_duration(&v)?,
            None => Duration::from_secs(30),
        },
        child_stdin,
        reload_signal,
        restart,
        shutdown_grace: look.duration(
            &r.shutdown_grace,
            "shutdown-grace",
            Duration::from_secs(10),
        )?,
        reload_url,
        reload_method,
        reload_ca_file: path(reload_ca_file),
        listen,
        agent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::TopLevel;
    use argh::FromArgs;
    use std::collections::HashMap;

    fn settings(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, String> {
        let top = TopLevel::from_args(&["cmpoll"], args).map_err(|e| e.output)?;
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_args(&top.command.unwrap(), &|k| env.get(k).cloned())
            .map_err(|e| e.to_string())
    }

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<RunSettings, String> {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        match settings(&all, env)?.command {
            Mode::Run(r) => Ok(*r),
            Mode::List { .. } => unreachable!(),
        }
    }

    #[test]
    fn defaults() {
        let s = settings(&["list"], &[]).unwrap();
        assert_eq!(s.selection.labels.as_str(), DEFAULT_SELECTOR);
        assert!(s.selection.namespaces.is_empty());
        assert_eq!(s.client.timeout, Duration::from_secs(10));
        assert_eq!(s.client.max_response_bytes, 64 << 20);
        assert_eq!(s.client.page_size, 0);
        let r = run(&[], &[]).unwrap();
        assert_eq!(r.interval, Duration::from_secs(30));
        assert_eq!(r.jitter, 0.1);
        assert_eq!(r.file_mode, 0o644);
        assert_eq!(r.restart, Restart::Always);
        assert_eq!(r.reload_method, "POST");
    }

    #[test]
    fn environment_fills_in_and_the_flag_wins() {
        let env = [
            ("CMPOLL_INTERVAL", "5s"),
            ("CMPOLL_NAMESPACE", "a, b,,a"),
            ("CMPOLL_ONCE", "true"),
            ("CMPOLL_SELECTOR", "x=y"),
        ];
        let s = settings(&["run", "--interval", "2s"], &env).unwrap();
        let Mode::Run(r) = s.command else { panic!() };
        assert_eq!(r.interval, Duration::from_secs(2), "flag wins");
        assert!(r.once);
        assert_eq!(s.selection.namespaces, ["a", "b"]);
        assert_eq!(s.selection.labels.as_str(), "x=y");
        let s = settings(&["list", "--namespace", "c"], &env).unwrap();
        assert_eq!(
            s.selection.namespaces,
            ["c"],
            "a repeated flag replaces the list"
        );
    }

    #[test]
    fn usage_errors_name_the_flag_or_variable() {
        type Env<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(&[&str], Env, &str)] = &[
            (
                &["list", "--selector", "a=b b"],
                &[],
                "--selector: found 'b', expected: ',' or 'end of string'",
            ),
            (
                &["list"],
                &[("CMPOLL_SELECTOR", "app:web")],
                "CMPOLL_SELECTOR: unable to parse requirement",
            ),
            (
                &["list", "--field-selector", "data.x=1"],
                &[],
                "--field-selector: \"data.x\" is not a known field selector",
            ),
            (
                &["list", "--namespace", "Bad_NS"],
                &[],
                "--namespace: 'Bad_NS' is not a namespace name",
            ),
            (&["list", "--keys", "["], &[], "--keys: invalid glob '['"),
            (
                &["list", "--timeout", "five"],
                &[],
                "--timeout: invalid duration 'five'",
            ),
            (
                &["list", "--timeout", "0s"],
                &[],
                "--timeout: must be more than zero",
            ),
            (
                &["run", "--interval", "10000000000000000000s"],
                &[],
                "--interval: '10000000000000000000s' is too long (at most 365d)",
            ),
            (
                &["run"],
                &[("CMPOLL_SHUTDOWN_GRACE", "400d")],
                "CMPOLL_SHUTDOWN_GRACE: '400d' is too long",
            ),
            (
                &["list", "--page-size", "-1"],
                &[],
                "--page-size: '-1' is not a page size",
            ),
            (
                &["list", "--max-response-bytes", "64XB"],
                &[],
                "--max-response-bytes: '64XB': unknown unit",
            ),
            (
                &["list", "--log-format", "xml"],
                &[],
                "--log-format: 'xml' is not one of text, json",
            ),
            (
                &["list"],
                &[("CMPOLL_JSON", "maybe")],
                "CMPOLL_JSON: 'maybe' is not a boolean",
            ),
            (
                &["list", "--manifests", "/nonexistent"],
                &[],
                "--manifests: '/nonexistent' is not a folder",
            ),
            (
                &["run", "--jitter", "2"],
                &[],
                "--jitter: must be between 0 and 1",
            ),
            (
                &["run", "--layout", "tree"],
                &[],
                "--layout: 'tree' is not one of files, concat",
            ),
            (
                &["run", "--ext", ".conf"],
                &[],
                "--ext: only used with --layout concat",
            ),
            (
                &["run", "--file-mode", "999"],
                &[],
                "--file-mode: '999' is not an octal mode",
            ),
            (
                &["run", "--reload-signal", "HUP"],
                &[],
                "--reload-signal: only used with an agent command",
            ),
            (
                &["run", "--reload-signal", "BOGUS", "--", "a"],
                &[],
                "--reload-signal: unknown signal 'BOGUS'",
            ),
            (
                &["run", "--child-stdin", "events"],
                &[],
                "--child-stdin: only used with an agent command",
            ),
            (
                &["run", "--reload-method", "GET"],
                &[],
                "--reload-method: only used with --reload-url",
            ),
            (
                &["run", "--reload-url", "ftp://x"],
                &[],
                "--reload-url: 'ftp://x' is not an http",
            ),
            (
                &["run", "--listen", "nowhere"],
                &[],
                "--listen: 'nowhere' is not an address",
            ),
            (
                &["run", "--once", "--", "agent"],
                &[],
                "--once: cannot be combined with an agent command",
            ),
        ];
        for (args, env, want) in cases {
            let e = settings(args, env).unwrap_err();
            assert!(e.starts_with(want), "{args:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn run_values() {
        let r = run(
            &[
                "--file-mode",
                "0600",
                "--layout",
                "concat",
                "--ext",
                ".alloy",
                "--listen",
                ":9090",
                "--reload-url",
                "http://127.0.0.1:9/-/reload",
                "--reload-method",
                "put",
                "--",
                "agent",
                "--flag",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(r.file_mode, 0o600);
        assert_eq!(r.ext, ".alloy");
        assert_eq!(r.listen, Some("0.0.0.0:9090".parse().unwrap()));
        assert_eq!(r.reload_method, "PUT");
        assert_eq!(r.agent, ["agent", "--flag"]);
        assert_eq!(parse_listen("[::]:8080").unwrap().to_string(), "[::]:8080");
    }

    #[test]
    fn sizes() {
        for (s, want) in [
            ("64MiB", 64 << 20),
            ("64Mi", 64 << 20),
            ("1GiB", 1 << 30),
            ("500k", 500_000),
            ("1024", 1024),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        assert!(parse_size("0").is_err());
        assert!(parse_size("MiB").is_err());
    }
}
