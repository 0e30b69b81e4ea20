//! `cmpoll run`'s settings (and so `cmpoll sidecar`'s): the source, the loop, the gate
//! (`--validate`), `--fetch-url-keys`, the endpoints, and every sink's options in SPEC's
//! order. Each is the layer's own `Options` type; this file only assembles them.

use std::net::SocketAddr;
use std::time::Duration;

use super::lookup::{
    Error, Lookup, check_needs, number, parse_listen, path, required, usage, validate_timeout,
};
use super::source::{client_options, logging, resources, source};
use crate::cli::{RunArgs, flag};
use crate::daemon;
use crate::fetch;
use crate::ops::logging as log_options;
use crate::ops::signals::Signal;
use crate::poll::module::Naming;
use crate::sink::{self, child, outdir, reload_url};
use crate::source::origin::{Options as SourceOptions, Origin};
use crate::source::{Resource, Resources};
use crate::template::Template;
use crate::validate;

/// `cmpoll run`: the loop, the endpoints, the validator, the sinks.
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub source: SourceOptions,
    pub logging: log_options::Options,
    /// What to log once logging is set up (`cmpoll sidecar`'s notes on its variables).
    pub notes: Vec<(log::Level, String)>,
    pub daemon: daemon::Options,
    /// How modules' files are named (the `flat` layout's options).
    pub naming: Naming,
    /// `--fetch-url-keys`.
    pub fetch: Option<fetch::Options>,
    /// How `--listen` and `/healthz` behave (`cmpoll sidecar` changes them).
    pub health: HealthRules,
    pub listen: Option<SocketAddr>,
    pub validate: Option<validate::Options>,
    /// `--report-events`.
    pub report_events: bool,
    pub sinks: sink::Options,
}

/// How the endpoints of `--listen` behave; all off for `cmpoll run`, all on for `cmpoll
/// sidecar` (as k8s-sidecar's health server: probes that charts point at it).
#[derive(Clone, Debug, Default)]
pub struct HealthRules {
    /// `/healthz` fails until the first batch is written.
    pub live_after_first_batch: bool,
    /// A port already in use (two sidecars in one pod) is a warning, not an exit.
    pub busy_is_warning: bool,
    /// Where to listen when `--listen` cannot be bound for want of IPv6.
    pub fallback: Option<SocketAddr>,
}

/// `cmpoll run`'s settings.
pub fn run(args: &RunArgs, env: &dyn Fn(&str) -> Option<String>) -> Result<RunSettings, Error> {
    read(args, &Lookup::new(args.given(), env))
}

/// `run`'s settings from `look` (`cmpoll sidecar` looks through k8s-sidecar's variables).
pub fn read(args: &RunArgs, look: &Lookup) -> Result<RunSettings, Error> {
    check_needs(look, !args.agent.is_empty())?;
    let mut source = source(look)?;
    // The flat layout's folders come from an annotation the source reads.
    source.selection.folder_annotation = folder_annotation(look)?;
    if let Origin::Manifests(_) = &source.origin
        && let Some(from) = look.switch(&flag::report_events)?
    {
        return Err(usage(
            &from,
            "needs an apiserver to record events in (not used with --manifests)",
        ));
    }
    assemble(&args.agent, look, source)
}

/// `--folder-annotation`: the annotation's name, if given.
fn folder_annotation(look: &Lookup) -> Result<Option<String>, Error> {
    match look.opt(&flag::folder_annotation) {
        Some(v) if v.value.trim().is_empty() => Err(usage(
            &v.from,
            "empty: give an annotation's name, or unset it",
        )),
        v => Ok(v.map(|v| v.value.trim().to_string())),
    }
}

fn assemble(
    agent_argv: &[String],
    look: &Lookup,
    source: SourceOptions,
) -> Result<RunSettings, Error> {
    let kinds = resources(look)?;
    let out_dir = out_dir(look, kinds)?;
    let naming = Naming {
        unique: look.on(&flag::unique_filenames)?,
        // Made absolute where the command runs (`lib.rs`): a value that names an absolute
        // path must be compared with one.
        folder_root: match (&out_dir, folder_annotation(look)?) {
            (Some(o), Some(_)) => Some(o.dir.clone()),
            _ => None,
        },
    };
    let agent = agent(agent_argv, look, out_dir.as_ref())?;
    let reload_timeout = look.duration(&flag::reload_timeout)?;
    let reload_url = reload_url(look, reload_timeout)?;
    let on_change = match look.opt(&flag::on_change) {
        Some(v) if v.value.trim().is_empty() => {
            return Err(usage(&v.from, "empty: give a command, or unset it"));
        }
        Some(v) => Some(sink::on_change::Options {
            command: v.value,
            timeout: reload_timeout,
            out_dir: out_dir.as_ref().map(|o| o.dir.clone()),
        }),
        None => None,
    };
    let once = look.switch(&flag::once)?;
    if let (Some(from), true) = (&once, agent.is_some()) {
        return Err(usage(from, "cannot be combined with an agent command"));
    }
    let others =
        out_dir.is_some() || agent.is_some() || reload_url.is_some() || on_change.is_some();
    let stdout = look.on(&flag::stdout_events)? || !others;
    let listen = match look.opt(&flag::listen) {
        Some(v) => Some(parse_listen(&v.value).map_err(|e| usage(&v.from, e))?),
        None => None,
    };
    let validate = validate(look, out_dir.as_ref(), kinds)?;
    let fetch = match look.on(&flag::fetch_url_keys)? {
        true => Some(fetch::Options {
            timeout: look.duration(&flag::timeout)?,
            max_bytes: client_options(look)?.max_response_bytes,
            insecure: false,
            basic: None,
        }),
        false => None,
    };
    let interval = look.duration_or(&flag::interval, RUN_INTERVAL)?;
    let mut source = source;
    // A `cmpoll serve` hub may hold each poll until it has something newer, up to the
    // interval this cmpoll would have waited anyway (an unpaged list only: a page has no
    // resourceVersion to compare).
    if once.is_none() && source.page_size == 0 {
        source.wait = Some(interval);
    }
    Ok(RunSettings {
        source,
        logging: logging(look)?,
        notes: Vec::new(),
        naming,
        fetch,
        health: HealthRules::default(),
        daemon: daemon::Options {
            interval,
            jitter: jitter(look)?,
            once: once.is_some(),
            once_tolerates_reloads: false,
            summary: String::new(),
        },
        listen,
        validate,
        report_events: look.on(&flag::report_events)?,
        sinks: sink::Options {
            out_dir,
            agent,
            on_change,
            reload_url,
            stdout,
            stdout_contents: kinds.has(Resource::ConfigMaps),
        },
    })
}

fn validate(
    look: &Lookup,
    out_dir: Option<&outdir::Options>,
    kinds: Resources,
) -> Result<Option<validate::Options>, Error> {
    let confirm = confirm(look)?;
    let Some((command, timeout, jobs)) = validating(look, RUN_VALIDATE_TIMEOUT)? else {
        return Ok(None);
    };
    Ok(Some(validate::Options {
        command,
        timeout,
        jobs,
        meta_dir: out_dir.map(|o| outdir::meta_dir(&o.dir)),
        ext: out_dir
            .filter(|o| o.layout == outdir::Layout::Concat)
            .map(|o| o.ext.clone())
            .unwrap_or_default(),
        template: out_dir.and_then(|o| o.template.clone()),
        kinds,
        confirm,
        out_dir: out_dir.map(|o| o.dir.clone()),
    }))
}

/// `--validate CMD` with `--validate-timeout` (`timeout` by default) and `--validate-jobs`,
/// as `run` and `serve` read them (each read whether `--validate` is given or not).
pub(super) fn validating(
    look: &Lookup,
    timeout: Duration,
) -> Result<Option<(String, Duration, usize)>, Error> {
    let timeout = validate_timeout(look, timeout)?;
    let jobs: usize = number(
        look,
        &flag::validate_jobs,
        |n| (1..=256).contains(n),
        "a number from 1 to 256",
    )?;
    let Some(command) = look.opt(&flag::validate) else {
        return Ok(None);
    };
    if command.value.trim().is_empty() {
        return Err(usage(&command.from, "empty: give a command, or unset it"));
    }
    Ok(Some((command.value, timeout, jobs)))
}

/// `--confirm CMD`.
fn confirm(look: &Lookup) -> Result<Option<String>, Error> {
    match look.opt(&flag::confirm) {
        Some(c) if c.value.trim().is_empty() => {
            Err(usage(&c.from, "empty: give a command, or unset it"))
        }
        c => Ok(c.map(|c| c.value)),
    }
}

/// `--interval`'s default for `cmpoll run`.
pub const RUN_INTERVAL: Duration = Duration::from_secs(30);

/// `--validate-timeout`'s default for `cmpoll run`.
const RUN_VALIDATE_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) fn jitter(look: &Lookup) -> Result<f64, Error> {
    let v = required(look, &flag::jitter)?;
    let j: f64 = (v.value.trim().parse())
        .map_err(|_| usage(&v.from, format!("'{}' is not a fraction", v.value)))?;
    if !(0.0..=1.0).contains(&j) {
        return Err(usage(&v.from, "must be between 0 and 1"));
    }
    Ok(j)
}

fn out_dir(look: &Lookup, kinds: Resources) -> Result<Option<outdir::Options>, Error> {
    let layout: outdir::Layout = look.choice(&flag::layout)?;
    let ext = look.opt(&flag::ext);
    if let Some(e) = &ext
        && (e.value.contains('/') || e.value.contains('\0'))
    {
        return Err(usage(&e.from, "must not contain '/'"));
    }
    let file_modes = match look.opt(&flag::file_mode) {
        Some(v) => outdir::FileModes::all(
            u32::from_str_radix(v.value.trim().trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| {
                    usage(
                        &v.from,
                        format!("'{}' is not an octal mode like 0644", v.value),
                    )
                })?,
        ),
        None => outdir::FileModes::default(),
    };
    let old_version_ttl = look.duration_or_zero(&flag::old_version_ttl)?;
    let dir = path(look.opt(&flag::out_dir))?;
    let folder_annotation = folder_annotation(look)?;
    let template = template(look)?;
    Ok(dir.map(|dir| outdir::Options {
        dir,
        layout,
        ext: ext.map(|e| e.value).unwrap_or_default(),
        file_modes,
        old_version_ttl,
        kinds,
        folder_annotation,
        template,
    }))
}

/// `--module-template` and `--offer-arguments`, read and checked at start.
fn template(look: &Lookup) -> Result<Option<std::sync::Arc<Template>>, Error> {
    let arguments = path(look.opt(&flag::offer_arguments))?;
    let Some(file) = path(look.opt(&flag::module_template))? else {
        return Ok(None);
    };
    Template::read(&file, arguments.as_deref())
        .map(|t| Some(std::sync::Arc::new(t)))
        .map_err(Error::File)
}

fn agent(
    argv: &[String],
    look: &Lookup,
    out_dir: Option<&outdir::Options>,
) -> Result<Option<child::Options>, Error> {
    // The agent command is positional, not a flag: it has no CMPOLL_ variable.
    let stdin: child::ChildStdin = look.choice(&flag::child_stdin)?;
    let reload_signal = match look.opt(&flag::reload_signal) {
        Some(v) => {
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
    let restart: child::Restart = look.choice(&flag::restart)?;
    let grace = look.duration(&flag::shutdown_grace)?;
    let Some(program) = argv.first() else {
        return Ok(None);
    };
    // Found now, before any request, as execvp would find it (SPEC: a usage error).
    crate::ops::process::find_program(program, (look.env)("PATH").as_deref())
        .map_err(|why| usage("agent command", format!("'{program}': {why}")))?;
    Ok(Some(child::Options {
        argv: argv.to_vec(),
        stdin,
        reload_signal,
        restart,
        grace,
        feed_dir: out_dir.map(|o| outdir::meta_dir(&o.dir)),
    }))
}

fn reload_url(
    look: &Lookup,
    timeout: std::time::Duration,
) -> Result<Option<reload_url::Options>, Error> {
    let (urls, from) = look.list(&flag::reload_url);
    for u in &urls {
        crate::kube::config::normalize_server(u).map_err(|e| usage(&from, e))?;
    }
    let method = required(look, &flag::reload_method)?;
    let m = method.value.trim().to_ascii_uppercase();
    if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(usage(
            &method.from,
            format!("'{}' is not an HTTP method", method.value),
        ));
    }
    let ca_file = path(look.opt(&flag::reload_ca_file))?;
    let (raw, header_from) = look.each(&flag::reload_header);
    let mut headers = Vec::new();
    for h in &raw {
        headers.push(reload_url::Header::parse(h).map_err(|e| usage(&header_from, e))?);
    }
    let skip_first = look.on(&flag::reload_skip_first)?;
    Ok((!urls.is_empty()).then_some(reload_url::Options {
        urls,
        method: m,
        ca_file,
        timeout,
        headers,
        skip_first,
        body: None,
        basic: None,
        insecure: false,
    }))
}

#[cfg(test)]
mod tests;
