//! What every command that lists shares: the source (`--manifests`, `--server`, a
//! kubeconfig, in-cluster credentials; `--timeout`, `--page-size`, `--list-mode`…), the
//! selection (`--selector`, `--keys`, `--resource`, `--namespace`, `--field-selector`) and
//! logging; and `cmpoll list`, which is nothing more.

use super::lookup::{Error, Lookup, check_needs, number, path, required, usage};
use crate::cli::{ListArgs, flag};
use crate::kube::client;
use crate::kube::config::Flags;
use crate::names;
use crate::ops::logging;
use crate::selector::{FieldSelector, LabelSelector};
use crate::source::origin::{Options, Origin};
use crate::source::{KeyFilter, ListMode, Resource, Resources, Selection};

/// What `cmpoll list` runs with.
#[derive(Clone, Debug)]
pub struct ListSettings {
    pub source: Options,
    pub logging: logging::Options,
    /// `--json`: modules with their files, not a table.
    pub json: bool,
}

/// `cmpoll list`'s settings.
pub fn list(args: &ListArgs, env: &dyn Fn(&str) -> Option<String>) -> Result<ListSettings, Error> {
    read_list(&Lookup::new(args.given(), env))
}

/// `list`'s settings from `look`.
pub(super) fn read_list(look: &Lookup) -> Result<ListSettings, Error> {
    check_needs(look, false)?;
    Ok(ListSettings {
        source: source(look)?,
        logging: logging(look)?,
        json: look.on(&flag::json)?,
    })
}

/// `--log-format`, `--log-level`.
pub fn logging(look: &Lookup) -> Result<logging::Options, Error> {
    Ok(logging::Options {
        format: look.choice(&flag::log_format)?,
        level: look.maybe_choice(&flag::log_level)?,
    })
}

/// Where the modules are listed from, and how.
pub fn source(look: &Lookup) -> Result<Options, Error> {
    let page_size: u32 = number(look, &flag::page_size, |_| true, "a page size (0 or more)")?;
    let metadata_first = look.on(&flag::metadata_first)?;
    let list_mode = match (metadata_first, look.opt(&flag::list_mode)) {
        (true, Some(v)) => {
            return Err(usage(
                &v.from,
                "not used with --metadata-first (an alias of --list-mode metadata): give one",
            ));
        }
        (true, None) => ListMode::Metadata,
        (false, _) => look.choice(&flag::list_mode)?,
    };
    Ok(Options {
        origin: origin(look)?,
        selection: selection(look)?,
        page_size,
        list_mode,
        namespace_from_context: look.on(&flag::namespace_from_context)?,
        client: client_options(look)?,
        raw: false,
        short_watch: false,
        wait: None,
    })
}

fn origin(look: &Lookup) -> Result<Origin, Error> {
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
    if look.takes(&flag::manifests)
        && let Some(dir) = look.opt(&flag::manifests)
    {
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
        return Ok(Origin::Manifests(dir.value.into()));
    }
    Ok(Origin::Api(flags))
}

/// `--resource`: one kind, or both.
pub fn resources(look: &Lookup) -> Result<Resources, Error> {
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

/// `--keys` (every key for a command without it: `cmpoll serve` serves objects whole).
pub fn keys(look: &Lookup) -> Result<KeyFilter, Error> {
    if !look.takes(&flag::keys) {
        return Ok(KeyFilter::all());
    }
    let (globs, from) = look.list(&flag::keys);
    KeyFilter::new(&globs).map_err(|e| usage(&from, e))
}

/// `--selector`: never empty.
pub fn labels(look: &Lookup, resources: Resources) -> Result<LabelSelector, Error> {
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

pub fn client_options(look: &Lookup) -> Result<client::Options, Error> {
    let max = required(look, &flag::max_response_bytes)?;
    Ok(client::Options {
        timeout: look.duration(&flag::timeout)?,
        max_response_bytes: super::lookup::parse_size(&max.value)
            .map_err(|e| usage(&max.from, e))?,
        allow_insecure_http: look.on(&flag::allow_insecure_http)?,
    })
}
