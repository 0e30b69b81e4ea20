//! What we decided: the command line plus `CMPOLL_*` variables plus defaults, validated,
//! assembled into each layer's own options (`source::origin::Options`, `daemon::Options`, every
//! sink's `Options`). Settings own no option type of their own.
//!
//! Every usage error is born here, as one line naming the flag (or the variable it came
//! from) and what is wrong with it. The environment is a parameter, so tests need no global
//! state. Nothing here reads files or talks to the network: `source::open` does that next.

mod lookup;
pub mod sidecar;
pub mod status;
pub mod webhook;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use self::lookup::parse_size;
use self::lookup::{Lookup, Val, usage};
use crate::cli::{Command, Needs, flag};
use crate::daemon;
use crate::error::Error;
use crate::fetch;
use crate::kube::client;
use crate::kube::config::Flags;
use crate::names;
use crate::ops::logging::LogFormat;
use crate::ops::signals::Signal;
use crate::poll::module::Naming;
use crate::selector::{FieldSelector, LabelSelector};
use crate::sink::{self, child, outdir, reload_url};
use crate::source::{self, KeyFilter, Named, Resource, Resources, Selection};
use crate::validate;

#[derive(Clone, Debug)]
pub struct Settings {
    pub command: Mode,
    pub source: source::origin::Options,
    pub log_format: LogFormat,
    /// `--log-level`; `None`: `RUST_LOG`, else info.
    pub log_level: Option<log::LevelFilter>,
    /// What to log once logging is set up (`cmpoll sidecar`'s notes on its variables).
    pub notes: Vec<(log::Level, String)>,
}

#[derive(Clone, Debug)]
pub enum Mode {
    List { json: bool },
    Run(Box<RunSettings>),
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

/// `cmpoll run`: the loop, the endpoints, the validator, the sinks.
#[derive(Clone, Debug)]
pub struct RunSettings {
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

impl Settings {
    /// Validates parsed arguments against the environment.
    pub fn from_args(
        command: &Command,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, Error> {
        if let Command::Sidecar(_) = command {
            return sidecar::settings(env);
        }
        let look = Lookup::new(command, env);
        let settings = Settings::read(command, &look)?;
        Ok(settings)
    }

    pub(crate) fn read(command: &Command, look: &Lookup) -> Result<Settings, Error> {
        check_needs(command, look)?;
        let mut source = source_options(look)?;
        let mode = match command {
            Command::List(_) => Mode::List {
                json: look.on(&flag::json)?,
            },
            Command::Run(r) => {
                // The flat layout's folders come from an annotation the source reads.
                source.selection.folder_annotation = folder_annotation(look)?;
                Mode::Run(Box::new(run(&r.agent, look)?))
            }
            // (`webhook` and `status` have settings of their own: see `webhook.rs`,
            // `status.rs`.)
            Command::Webhook(_) | Command::Status(_) => {
                return Err(Error::Usage(format!(
                    "cmpoll {}: read with settings::{}",
                    command.name(),
                    command.name()
                )));
            }
            // (`sidecar` reads `run`'s settings: see `sidecar.rs`.)
            Command::Sidecar(_) => {
                source.selection.folder_annotation = folder_annotation(look)?;
                Mode::Run(Box::new(run(&[], look)?))
            }
        };
        if let (Command::Run(_), source::origin::Origin::Manifests(_)) = (command, &source.origin)
            && let Some(from) = look.switch(&flag::report_events)?
        {
            return Err(usage(
                &from,
                "needs an apiserver to record events in (not used with --manifests)",
            ));
        }
        Ok(Settings {
            command: mode,
            source,
            log_format: look.choice(&flag::log_format)?,
            log_level: look.maybe_choice(&flag::log_level)?,
            notes: Vec::new(),
        })
    }
}

/// A flag given without the sink, source or flag it belongs to is a mistake, not a no-op.
fn check_needs(command: &Command, look: &Lookup) -> Result<(), Error> {
    let given = |f| look.given(f).map(|g| g.is_some());
    let agent = matches!(command, Command::Run(r) if !r.agent.is_empty());
    let server = given(&flag::server)?;
    let out_dir = given(&flag::out_dir)?;
    let layout = |l: &str| out_dir && look.opt(&flag::layout).is_some_and(|v| v.value.trim() == l);
    let (concat, flat) = (layout("concat"), layout("flat"));
    let reload_url = given(&flag::reload_url)?;
    let on_change = given(&flag::on_change)?;
    let validate = given(&flag::validate)?;
    let template = given(&flag::module_template)?;
    look.check_needs(|needs| match needs {
        Needs::Nothing => true,
        Needs::Server => server,
        Needs::OutDir => out_dir,
        Needs::Concat => concat,
        Needs::Flat => flat,
        Needs::ModuleTemplate => concat && template,
        Needs::Agent => agent,
        Needs::ReloadUrl => reload_url,
        Needs::ReloadUrlOrOnChange => reload_url || on_change,
        Needs::Validate => validate,
    })
}

/// A path flag; an empty value (`CMPOLL_OUT_DIR=` from an empty template) is an error
/// naming where it came from, not a path.
fn path(v: Option<Val>) -> Result<Option<PathBuf>, Error> {
    match v {
        Some(v) if v.value.is_empty() => Err(usage(&v.from, "empty: give a path, or unset it")),
        v => Ok(v.map(|v| PathBuf::from(v.value))),
    }
}

/// The flag's value, else its default (every caller's flag has one in the table).
fn required(look: &Lookup, f: &'static crate::cli::Flag) -> Result<Val, Error> {
    look.value(f)
        .ok_or_else(|| usage(&f.long(), "has no default (a bug in cmpoll's flag table)"))
}

/// A number flag: its value or default, parsed and checked by `ok`.
fn number<T: std::str::FromStr>(
    look: &Lookup,
    f: &'static crate::cli::Flag,
    ok: impl Fn(&T) -> bool,
    what: &str,
) -> Result<T, Error> {
    let v = required(look, f)?;
    v.value
        .trim()
        .parse::<T>()
        .ok()
        .filter(ok)
        .ok_or_else(|| usage(&v.from, format!("'{}' is not {what}", v.value)))
}

fn source_options(look: &Lookup) -> Result<source::origin::Options, Error> {
    let page_size: u32 = number(look, &flag::page_size, |_| true, "a page size (0 or more)")?;
    let metadata_first = look.on(&flag::metadata_first)?;
    let list_mode = match (metadata_first, look.opt(&flag::list_mode)) {
        (true, Some(v)) => {
            return Err(usage(
                &v.from,
                "not used with --metadata-first (an alias of --list-mode metadata): give one",
            ));
        }
        (true, None) => source::ListMode::Metadata,
        (false, _) => look.choice(&flag::list_mode)?,
    };
    Ok(source::origin::Options {
        origin: origin(look)?,
        selection: selection(look)?,
        page_size,
        list_mode,
        namespace_from_context: look.on(&flag::namespace_from_context)?,
        client: client_options(look)?,
    })
}

fn origin(look: &Lookup) -> Result<source::origin::Origin, Error> {
    let server = look.opt(&flag::server).map(|v| v.value);
    let kubeconfig = path(look.opt(&flag::kubeconfig))?;
    let flags = Flags {
        token_file: path(look.opt(&flag::token_file))?,
        ca_file: path(look.opt(&flag::ca_file))?,
        context: look.opt(&flag::context).map(|v| v.value),
        service_account_dir: path(look.opt(&flag::service_account_dir))?,
        server,
        kubeconfig,
        insecure_skip_tls_verify: false,
    };
    if let Some(dir) = look.opt(&flag::manifests) {
        for (f, given) in [
            (&flag::server, flags.server.is_some()),
            (&flag::kubeconfig, flags.kubeconfig.is_some()),
        ] {
            if given {
                log::info!(
                    "{}: reading manifests, so {} is not used",
                    dir.from,
                    f.long()
                );
            }
        }
        if !std::path::Path::new(&dir.value).is_dir() {
            return Err(usage(&dir.from, format!("'{}' is not a folder", dir.value)));
        }
        return Ok(source::origin::Origin::Manifests(dir.value.into()));
    }
    Ok(source::origin::Origin::Api(flags))
}

/// `--resource`: one kind, or both.
fn resources(look: &Lookup) -> Result<Resources, Error> {
    let v = required(look, &flag::resource)?;
    Resources::parse(&v.value).map_err(|e| usage(&v.from, e))
}

fn selection(look: &Lookup) -> Result<Selection, Error> {
    let resources = resources(look)?;
    let labels = labels(look, resources)?;
    let fields = match look.opt(&flag::field_selector) {
        Some(v) => FieldSelector::parse(&v.value).map_err(|e| usage(&v.from, e))?,
        None => FieldSelector::default(),
    };
    let (mut namespaces, from) = look.list(&flag::namespace);
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
    Ok(Selection {
        resources,
        labels,
        fields,
        namespaces,
        keys: keys(look)?,
        folder_annotation: None,
        names: Vec::new(),
    })
}

/// `--keys`.
fn keys(look: &Lookup) -> Result<KeyFilter, Error> {
    let (globs, from) = look.list(&flag::keys);
    KeyFilter::new(&globs).map_err(|e| usage(&from, e))
}

/// `--selector`: never empty.
fn labels(look: &Lookup, resources: Resources) -> Result<LabelSelector, Error> {
    Ok(match look.opt(&flag::selector) {
        Some(v) if v.value.trim().is_empty() => {
            return Err(usage(
                &v.from,
                format!(
                    "empty: it would hand every {} of the scope to the agent (give a selector; the default is {})",
                    resources
                        .iter()
                        .map(Resource::kind)
                        .collect::<Vec<_>>()
                        .join(" and "),
                    flag::selector.default.unwrap_or_default()
                ),
            ));
        }
        _ => {
            let v = required(look, &flag::selector)?;
            LabelSelector::parse(&v.value).map_err(|e| usage(&v.from, e))?
        }
    })
}

fn client_options(look: &Lookup) -> Result<client::Options, Error> {
    let max = required(look, &flag::max_response_bytes)?;
    Ok(client::Options {
        timeout: look.duration(&flag::timeout)?,
        max_response_bytes: parse_size(&max.value).map_err(|e| usage(&max.from, e))?,
        allow_insecure_http: look.on(&flag::allow_insecure_http)?,
    })
}

/// `:8080` (all interfaces), `127.0.0.1:8080`, `[::]:8080`.
pub(crate) fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    let full = if t.starts_with(':') {
        format!("0.0.0.0{t}")
    } else {
        t.to_string()
    };
    full.parse()
        .map_err(|_| format!("'{s}' is not an address (e.g. :8080, 127.0.0.1:8080, [::]:8080)"))
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

fn run(agent_argv: &[String], look: &Lookup) -> Result<RunSettings, Error> {
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
    Ok(RunSettings {
        naming,
        fetch,
        health: HealthRules::default(),
        daemon: daemon::Options {
            interval: look.duration(&flag::interval)?,
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
    let command = look.opt(&flag::validate);
    let timeout = validate_timeout(look, RUN_VALIDATE_TIMEOUT)?;
    let jobs: usize = number(
        look,
        &flag::validate_jobs,
        |n| (1..=256).contains(n),
        "a number from 1 to 256",
    )?;
    let Some(command) = command else {
        return Ok(None);
    };
    if command.value.trim().is_empty() {
        return Err(usage(&command.from, "empty: give a command, or unset it"));
    }
    Ok(Some(validate::Options {
        command: command.value,
        timeout,
        jobs,
        meta_dir: out_dir.map(|o| outdir::meta_dir(&o.dir)),
        ext: out_dir
            .filter(|o| o.layout == outdir::Layout::Concat)
            .map(|o| o.ext.clone())
            .unwrap_or_default(),
        template: out_dir.and_then(|o| o.template.clone()),
        kinds,
    }))
}

/// `--validate-timeout`'s default for `cmpoll run`.
const RUN_VALIDATE_TIMEOUT: Duration = Duration::from_secs(30);

/// `--validate-timeout`, else `default` (the command's: see the flag's help).
fn validate_timeout(look: &Lookup, default: Duration) -> Result<Duration, Error> {
    match look.opt(&flag::validate_timeout) {
        Some(v) => lookup::parse_duration(&v),
        None => Ok(default),
    }
}

fn jitter(look: &Lookup) -> Result<f64, Error> {
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
fn template(look: &Lookup) -> Result<Option<std::sync::Arc<outdir::template::Template>>, Error> {
    let arguments = path(look.opt(&flag::offer_arguments))?;
    let Some(file) = path(look.opt(&flag::module_template))? else {
        return Ok(None);
    };
    outdir::template::Template::read(&file, arguments.as_deref())
        .map(|t| Some(std::sync::Arc::new(t)))
        .map_err(Error::Config)
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
