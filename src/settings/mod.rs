//! What we decided: the command line plus `CMPOLL_*` variables plus defaults, validated,
//! assembled into each layer's own options (`source::Options`, `daemon::Options`, every
//! sink's `Options`). Settings own no option type of their own.
//!
//! Every usage error is born here, as one line naming the flag (or the variable it came
//! from) and what is wrong with it. The environment is a parameter, so tests need no global
//! state. Nothing here reads files or talks to the network: `source::open` does that next.

mod lookup;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use self::lookup::parse_size;
use self::lookup::{Lookup, Val, parse_duration, usage};
use crate::cli::{Command, Common, RunArgs};
use crate::daemon;
use crate::error::Error;
use crate::kube::client;
use crate::kube::config::Flags;
use crate::names;
use crate::ops::logging::LogFormat;
use crate::ops::signals::Signal;
use crate::selector::{FieldSelector, LabelSelector};
use crate::sink::{self, child, outdir, reload_url};
use crate::source::{self, KeyFilter, Resource, Selection};
use crate::validate;

pub const DEFAULT_SELECTOR: &str = "cmpoll.io/module=true";
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 64 << 20;

#[derive(Clone, Debug)]
pub struct Settings {
    pub command: Mode,
    pub source: source::Options,
    pub log_format: LogFormat,
    /// `--log-level`; `None`: `RUST_LOG`, else info.
    pub log_level: Option<log::LevelFilter>,
}

#[derive(Clone, Debug)]
pub enum Mode {
    List { json: bool },
    Run(Box<RunSettings>),
}

/// `cmpoll run`: the loop, the endpoints, the validator, the sinks.
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub daemon: daemon::Options,
    pub listen: Option<SocketAddr>,
    pub validate: Option<validate::Options>,
    pub sinks: sink::Options,
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
        let source = source_options(&common, &look)?;
        let mode = match command {
            Command::List(l) => Mode::List {
                json: look.switch(l.json, "json")?,
            },
            Command::Run(r) => Mode::Run(Box::new(run(r, &look)?)),
        };
        Ok(Settings {
            command: mode,
            source,
            log_format: look.choice(
                &common.log_format,
                "log-format",
                LogFormat::Text,
                &[("text", LogFormat::Text), ("json", LogFormat::Json)],
            )?,
            log_level: match look.opt(&common.log_level, "log-level") {
                None => None,
                Some(v) => Some(
                    [
                        ("error", log::LevelFilter::Error),
                        ("warn", log::LevelFilter::Warn),
                        ("info", log::LevelFilter::Info),
                        ("debug", log::LevelFilter::Debug),
                        ("trace", log::LevelFilter::Trace),
                    ]
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(v.value.trim()))
                    .map(|(_, l)| *l)
                    .ok_or_else(|| {
                        usage(
                            &v.from,
                            format!(
                                "'{}' is not one of error, warn, info, debug, trace",
                                v.value
                            ),
                        )
                    })?,
                ),
            },
        })
    }
}

/// A path flag; an empty value (`CMPOLL_OUT_DIR=` from an empty template) is an error
/// naming where it came from, not a path.
fn path(v: Option<Val>) -> Result<Option<PathBuf>, Error> {
    match v {
        Some(v) if v.value.is_empty() => Err(usage(&v.from, "empty: give a path, or unset it")),
        v => Ok(v.map(|v| PathBuf::from(v.value))),
    }
}

fn source_options(c: &Common, look: &Lookup) -> Result<source::Options, Error> {
    let page_size = match look.opt(&c.page_size, "page-size") {
        Some(v) => v.value.trim().parse::<u32>().map_err(|_| {
            usage(
                &v.from,
                format!("'{}' is not a page size (0 or more)", v.value),
            )
        })?,
        None => 0,
    };
    let metadata_first = look.switch(c.metadata_first, "metadata-first")?;
    let list_mode = look.opt(&c.list_mode, "list-mode");
    if let (true, Some(v)) = (metadata_first, &list_mode) {
        return Err(usage(
            &v.from,
            "not used with --metadata-first (an alias of --list-mode metadata): give one",
        ));
    }
    let list_mode = if metadata_first {
        source::ListMode::Metadata
    } else {
        look.choice(
            &c.list_mode,
            "list-mode",
            source::ListMode::Auto,
            &[
                ("auto", source::ListMode::Auto),
                ("full", source::ListMode::Full),
                ("metadata", source::ListMode::Metadata),
            ],
        )?
    };
    Ok(source::Options {
        origin: origin(c, look)?,
        selection: selection(c, look)?,
        page_size,
        list_mode,
        namespace_from_context: look.switch(c.namespace_from_context, "namespace-from-context")?,
        client: client_options(c, look)?,
    })
}

fn origin(c: &Common, look: &Lookup) -> Result<source::Origin, Error> {
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
        return Ok(source::Origin::Manifests(dir.value.into()));
    }
    Ok(source::Origin::Api(Flags {
        server: look.opt(&c.server, "server").map(|v| v.value),
        token_file: path(look.opt(&c.token_file, "token-file"))?,
        ca_file: path(look.opt(&c.ca_file, "ca-file"))?,
        kubeconfig: path(look.opt(&c.kubeconfig, "kubeconfig"))?,
        context: look.opt(&c.context, "context").map(|v| v.value),
        service_account_dir: path(look.opt(&c.service_account_dir, "service-account-dir"))?,
    }))
}

/// `--resource`.
fn resource(c: &Common, look: &Lookup) -> Result<Resource, Error> {
    look.choice(
        &c.resource,
        "resource",
        Resource::ConfigMaps,
        &[
            ("configmaps", Resource::ConfigMaps),
            ("secrets", Resource::Secrets),
            // k8s-sidecar's RESOURCE and kubectl take the singular too.
            ("configmap", Resource::ConfigMaps),
            ("secret", Resource::Secrets),
        ],
    )
}

fn selection(c: &Common, look: &Lookup) -> Result<Selection, Error> {
    let resource = resource(c, look)?;
    let labels = match look.opt(&c.selector, "selector") {
        Some(v) if v.value.trim().is_empty() => {
            return Err(usage(
                &v.from,
                format!(
                    "empty: it would hand every {} of the scope to the agent (give a selector; the default is cmpoll.io/module=true)",
                    resource.kind()
                ),
            ));
        }
        Some(v) => LabelSelector::parse(&v.value).map_err(|e| usage(&v.from, e))?,
        None => LabelSelector::parse(DEFAULT_SELECTOR).expect("the default selector parses"),
    };
    let fields = match look.opt(&c.field_selector, "field-selector") {
        Some(v) => FieldSelector::parse(&v.value).map_err(|e| usage(&v.from, e))?,
        None => FieldSelector::default(),
    };
    let (mut namespaces, from) = look.list(&c.namespace, "namespace");
    for ns in &namespaces {
        let errs = names::dns1123_label(ns);
        if !errs.is_empty() {
            return Err(usage(
                &from,
                format!("'{ns}' is not a namespace name: {}", errs.join("; ")),
            ));
        }
    }
    namespaces.sort();
    namespaces.dedup();
    let (globs, from) = look.list(&c.keys, "keys");
    let keys = if globs.is_empty() {
        KeyFilter::all()
    } else {
        KeyFilter::new(&globs).map_err(|e| usage(&from, e))?
    };
    Ok(Selection {
        resource,
        labels,
        fields,
        namespaces,
        keys,
    })
}

fn client_options(c: &Common, look: &Lookup) -> Result<client::Options, Error> {
    let max_response_bytes = match look.opt(&c.max_response_bytes, "max-response-bytes") {
        Some(v) => parse_size(&v.value).map_err(|e| usage(&v.from, e))?,
        None => DEFAULT_MAX_RESPONSE_BYTES,
    };
    Ok(client::Options {
        timeout: look.duration(&c.timeout, "timeout", Duration::from_secs(10))?,
        max_response_bytes,
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

fn run(r: &RunArgs, look: &Lookup) -> Result<RunSettings, Error> {
    let resource = resource(&r.common(), look)?;
    let out_dir = out_dir(r, look, resource)?;
    let agent = agent(r, look, out_dir.as_ref())?;
    let reload_url = reload_url(r, look)?;
    let on_change = match look.opt(&r.on_change, "on-change") {
        Some(v) if v.value.trim().is_empty() => {
            return Err(usage(&v.from, "empty: give a command, or unset it"));
        }
        Some(v) => Some(sink::on_change::Options {
            command: v.value,
            timeout: look.duration(&r.reload_timeout, "reload-timeout", Duration::from_secs(30))?,
            out_dir: out_dir.as_ref().map(|o| o.dir.clone()),
        }),
        None => None,
    };
    let once = look.switch(r.once, "once")?;
    if once && agent.is_some() {
        return Err(usage("--once", "cannot be combined with an agent command"));
    }
    let others =
        out_dir.is_some() || agent.is_some() || reload_url.is_some() || on_change.is_some();
    let stdout = look.switch(r.stdout_events, "stdout-events")? || !others;
    let listen = match look.opt(&r.listen, "listen") {
        Some(v) => Some(parse_listen(&v.value).map_err(|e| usage(&v.from, e))?),
        None => None,
    };
    let validate = validate(r, look, out_dir.as_ref())?;
    Ok(RunSettings {
        daemon: daemon::Options {
            interval: look.duration(&r.interval, "interval", Duration::from_secs(30))?,
            jitter: jitter(r, look)?,
            once,
            summary: String::new(),
        },
        listen,
        validate,
        sinks: sink::Options {
            out_dir,
            agent,
            on_change,
            reload_url,
            stdout,
            stdout_contents: resource.shows_contents(),
        },
    })
}

fn validate(
    r: &RunArgs,
    look: &Lookup,
    out_dir: Option<&outdir::Options>,
) -> Result<Option<validate::Options>, Error> {
    let command = look.opt(&r.validate, "validate");
    if command.is_none() {
        for (value, flag) in [
            (&r.validate_timeout, "validate-timeout"),
            (&r.validate_jobs, "validate-jobs"),
        ] {
            if let Some(v) = look.opt(value, flag) {
                return Err(usage(&v.from, "only used with --validate"));
            }
        }
        return Ok(None);
    }
    let command = command.expect("checked above");
    if command.value.trim().is_empty() {
        return Err(usage(&command.from, "empty: give a command, or unset it"));
    }
    let jobs = match look.opt(&r.validate_jobs, "validate-jobs") {
        Some(v) => v
            .value
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=256).contains(n))
            .ok_or_else(|| {
                usage(
                    &v.from,
                    format!("'{}' is not a number from 1 to 256", v.value),
                )
            })?,
        None => 1,
    };
    Ok(Some(validate::Options {
        command: command.value,
        timeout: look.duration(
            &r.validate_timeout,
            "validate-timeout",
            Duration::from_secs(30),
        )?,
        jobs,
        meta_dir: out_dir.map(|o| outdir::meta_dir(&o.dir)),
        ext: out_dir
            .filter(|o| o.layout == outdir::Layout::Concat)
            .map(|o| o.ext.clone())
            .unwrap_or_default(),
    }))
}

fn jitter(r: &RunArgs, look: &Lookup) -> Result<f64, Error> {
    let Some(v) = look.opt(&r.jitter, "jitter") else {
        return Ok(0.1);
    };
    let j: f64 = (v.value.trim().parse())
        .map_err(|_| usage(&v.from, format!("'{}' is not a fraction", v.value)))?;
    if !(0.0..=1.0).contains(&j) {
        return Err(usage(&v.from, "must be between 0 and 1"));
    }
    Ok(j)
}

fn out_dir(
    r: &RunArgs,
    look: &Lookup,
    resource: Resource,
) -> Result<Option<outdir::Options>, Error> {
    let layout = look.choice(
        &r.layout,
        "layout",
        outdir::Layout::Files,
        &[
            ("files", outdir::Layout::Files),
            ("concat", outdir::Layout::Concat),
            ("flat", outdir::Layout::Flat),
        ],
    )?;
    let ext = look.opt(&r.ext, "ext");
    if let Some(e) = &ext {
        if layout != outdir::Layout::Concat {
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
        // A Secret's files are for the agent's user only.
        None if resource == Resource::Secrets => 0o600,
        None => 0o644,
    };
    let old_version_ttl = match look.opt(&r.old_version_ttl, "old-version-ttl") {
        Some(v) => parse_duration(&v)?,
        None => Duration::from_secs(30),
    };
    let dir = path(look.opt(&r.out_dir, "out-dir"))?;
    if dir.is_none() {
        // A flag of the output folder without one is a mistake, not a no-op.
        for (value, flag) in [
            (&r.layout, "layout"),
            (&r.file_mode, "file-mode"),
            (&r.old_version_ttl, "old-version-ttl"),
        ] {
            if let Some(v) = look.opt(value, flag) {
                return Err(usage(&v.from, "only used with --out-dir"));
            }
        }
    }
    Ok(dir.map(|dir| outdir::Options {
        dir,
        layout,
        ext: ext.map(|e| e.value).unwrap_or_default(),
        file_mode,
        old_version_ttl,
    }))
}

fn agent(
    r: &RunArgs,
    look: &Lookup,
    out_dir: Option<&outdir::Options>,
) -> Result<Option<child::Options>, Error> {
    // The agent command is positional, not a flag: it has no CMPOLL_ variable.
    let needs_agent = |v: &Option<Val>| match v {
        Some(v) if r.agent.is_empty() => Err(usage(
            &v.from,
            "only used with an agent command (cmpoll run [options] -- AGENT ARGS...)",
        )),
        _ => Ok(()),
    };
    needs_agent(&look.opt(&r.child_stdin, "child-stdin"))?;
    let stdin = look.choice(
        &r.child_stdin,
        "child-stdin",
        child::ChildStdin::Null,
        &[
            ("events", child::ChildStdin::Events),
            ("null", child::ChildStdin::Null),
        ],
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
        child::Restart::Always,
        &[
            ("always", child::Restart::Always),
            ("on-failure", child::Restart::OnFailure),
            ("never", child::Restart::Never),
        ],
    )?;
    needs_agent(&look.opt(&r.shutdown_grace, "shutdown-grace"))?;
    let grace = look.duration(&r.shutdown_grace, "shutdown-grace", Duration::from_secs(10))?;
    if r.agent.is_empty() {
        return Ok(None);
    }
    // Found now, before any request, as execvp would find it (SPEC: a usage error).
    crate::ops::process::find_program(&r.agent[0], (look.env)("PATH").as_deref())
        .map_err(|why| usage("agent command", format!("'{}': {why}", r.agent[0])))?;
    Ok(Some(child::Options {
        argv: r.agent.clone(),
        stdin,
        reload_signal,
        restart,
        grace,
        feed_dir: out_dir.map(|o| outdir::meta_dir(&o.dir)),
    }))
}

fn reload_url(r: &RunArgs, look: &Lookup) -> Result<Option<reload_url::Options>, Error> {
    let on_change = look.opt(&r.on_change, "on-change").is_some();
    let (urls, from) = look.list(&r.reload_url, "reload-url");
    for u in &urls {
        crate::kube::config::normalize_server(u).map_err(|e| usage(&from, e))?;
    }
    let given = !urls.is_empty();
    let only_with_url = |from: &str| usage(from, "only used with --reload-url");
    let method = match look.opt(&r.reload_method, "reload-method") {
        Some(v) => {
            let m = v.value.trim().to_ascii_uppercase();
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(usage(
                    &v.from,
                    format!("'{}' is not an HTTP method", v.value),
                ));
            }
            if !given {
                return Err(only_with_url(&v.from));
            }
            m
        }
        None => "POST".into(),
    };
    let ca_file = look.opt(&r.reload_ca_file, "reload-ca-file");
    if let Some(v) = &ca_file
        && !given
    {
        return Err(only_with_url(&v.from));
    }
    // Header values may hold commas: one per flag; the variable splits on commas.
    let (raw, header_from) = if r.reload_header.is_empty() {
        look.list(&[], "reload-header")
    } else {
        (r.reload_header.clone(), "--reload-header".to_string())
    };
    let mut headers = Vec::new();
    for h in &raw {
        headers.push(reload_url::Header::parse(h).map_err(|e| usage(&header_from, e))?);
    }
    if !headers.is_empty() && !given {
        return Err(only_with_url(&header_from));
    }
    let timeout_v = look.opt(&r.reload_timeout, "reload-timeout");
    if let Some(v) = &timeout_v
        && !given
        && !on_change
    {
        return Err(usage(&v.from, "only used with --reload-url or --on-change"));
    }
    let timeout = look.duration(&r.reload_timeout, "reload-timeout", Duration::from_secs(30))?;
    let skip_first = look.switch(r.reload_skip_first, "reload-skip-first")?;
    if skip_first && !given {
        return Err(only_with_url("--reload-skip-first"));
    }
    let ca_file = path(ca_file)?;
    Ok(given.then_some(reload_url::Options {
        urls,
        method,
        ca_file,
        timeout,
        headers,
        skip_first,
    }))
}

#[cfg(test)]
mod tests;
