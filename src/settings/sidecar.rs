//! `cmpoll sidecar`: kiwigrid/k8s-sidecar's variables made into `cmpoll run`'s settings.
//!
//! The charts that embed k8s-sidecar (Grafana's, Loki's) set only its environment, never a
//! command, so this reads nothing else. Each variable becomes the value of the flag it
//! means (named by its table entry, so its `CMPOLL_*` name is spelled in one place), put
//! beneath the real environment: a `CMPOLL_*` variable that is set wins, and a message
//! about a value names the k8s-sidecar variable it came from. What no flag expresses (a
//! reload body, basic auth from files, objects read by name, the health server's ways) is
//! applied to the settings afterwards. Variables k8s-sidecar reads that mean nothing here
//! are accepted, noted at debug level (`LOG_TZ` and `LOG_CONFIG` at warning). The mapping
//! reads in SPEC's sections: what is listed, where it goes, when, who hears of it, and
//! operations.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::lookup::{Error, Lookup, usage};
use super::run::{RunSettings, read};
use crate::cli::{Flag, RunArgs, flag};
use crate::fetch::OriginAuth;
use crate::http::url;
use crate::kube::incluster::SERVICE_ACCOUNT_DIR;
use crate::secret::{Secret, SecretSource};
use crate::source::origin::Origin;
use crate::source::{Named, Resource};

/// k8s-sidecar reads these and cmpoll has nothing for them to do.
const WITHOUT_EFFECT: &[&str] = &[
    "WATCH_SERVER_TIMEOUT",
    "WATCH_CLIENT_TIMEOUT",
    "ERROR_THROTTLE_SLEEP",
    "IGNORE_ALREADY_PROCESSED",
    "REQ_RETRY_TOTAL",
    "REQ_RETRY_CONNECT",
    "REQ_RETRY_READ",
    "REQ_RETRY_BACKOFF_FACTOR",
    "ENABLE_5XX",
    "REQ_BASIC_AUTH_ENCODING",
    "DISABLE_X509_STRICT_VERIFICATION",
];

/// The flag values k8s-sidecar's variables mean (by each flag's `CMPOLL_*` name), each
/// with the variable it came from, and what no flag expresses.
#[derive(Debug, Default)]
struct Mapping {
    vars: BTreeMap<String, (String, &'static str)>,
    names: Vec<Named>,
    /// `REQ_PAYLOAD`, for a POST.
    body: Option<Vec<u8>>,
    basic: Option<(SecretSource, SecretSource)>,
    req_insecure: bool,
    api_insecure: bool,
    /// `METHOD=LIST`.
    list: bool,
    req_timeout: Duration,
    /// Tried when the health server cannot listen on IPv6.
    listen_fallback: Option<SocketAddr>,
    notes: Vec<(log::Level, String)>,
}

impl Mapping {
    /// `flag` takes `value`, which k8s-sidecar's variable `from` gave.
    fn put(&mut self, flag: &'static Flag, value: impl Into<String>, from: &'static str) {
        self.vars.insert(flag.var(), (value.into(), from));
    }
}

/// k8s-sidecar's variables as the mapping reads them: unset and blank are the same.
struct Vars<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Vars<'_> {
    /// A variable's value; one the kubelet wrote as a link to a Service (`HEALTH_PORT` =
    /// `tcp://10.96.0.9:8080` beside a Service named `health`) is not the user's: unset.
    fn get(&self, k: &str) -> Option<String> {
        (self.0)(k).filter(|v| !v.trim().is_empty() && !crate::cli::is_service_link(k, v))
    }

    /// A variable k8s-sidecar cannot run without: `what` it is, when it is not set.
    fn required(&self, k: &str, what: &str) -> Result<String, Error> {
        self.get(k)
            .ok_or_else(|| usage(k, format!("not set: {what} (k8s-sidecar's {k})")))
    }

    /// `true`, in any case.
    fn yes(&self, k: &str) -> bool {
        self.get(k)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }
}

/// `cmpoll sidecar`'s settings from the environment.
pub fn sidecar(env: &dyn Fn(&str) -> Option<String>) -> Result<RunSettings, Error> {
    let mut m = mapping(env)?;
    let vars = std::mem::take(&mut m.vars);
    let layered = |k: &str| env(k).or_else(|| vars.get(k).map(|(value, _)| value.clone()));
    // A value the mapping gave is named by the k8s-sidecar variable it came from.
    let origin = |k: &str| {
        (env(k).is_none())
            .then(|| vars.get(k))
            .flatten()
            .map(|(_, from)| from.to_string())
    };
    let args = RunArgs::none();
    let look = Lookup::new(args.given(), &layered).naming(&origin);
    let mut s = read(&args, &look)?;
    apply(&mut s, m, env);
    Ok(s)
}

/// What no flag expresses, onto the settings `run` made.
fn apply(run: &mut RunSettings, m: Mapping, env: &dyn Fn(&str) -> Option<String>) {
    run.source.selection.names = m.names;
    if let Origin::Api(flags) = &mut run.source.origin {
        flags.insecure_skip_tls_verify = m.api_insecure;
    }
    run.notes = m.notes;
    run.health.live_after_first_batch = true;
    run.health.busy_is_warning = true;
    run.health.fallback = m.listen_fallback;
    run.daemon.once_tolerates_reloads = m.list;
    let origin = env("REQ_URL").and_then(|u| url::origin(&u));
    if let Some(r) = &mut run.sinks.reload_url {
        r.insecure = m.req_insecure;
        if r.method == "POST" {
            r.body = m.body;
        }
        r.basic = m.basic.clone();
    }
    if let Some(f) = &mut run.fetch {
        f.timeout = m.req_timeout;
        f.insecure = m.req_insecure;
        f.basic = match (origin, m.basic) {
            (Some(origin), Some((user, password))) => Some(OriginAuth {
                origin,
                user,
                password,
            }),
            _ => None,
        };
    }
}

/// Reads k8s-sidecar's variables; a missing or malformed one is a usage error naming it.
fn mapping(env: &dyn Fn(&str) -> Option<String>) -> Result<Mapping, Error> {
    let vars = Vars(env);
    let mut m = Mapping::default();
    // What k8s-sidecar cannot run without, in its order.
    let label = vars.required("LABEL", "the label a ConfigMap or Secret must carry")?;
    let folder = vars.required("FOLDER", "the folder the files are written to")?;
    listed(&vars, &mut m, &label)?;
    destination(&vars, &mut m, folder)?;
    timing(&vars, &mut m)?;
    listeners(&vars, &mut m)?;
    operations(&vars, &mut m)?;
    Ok(m)
}

/// What is listed: `LABEL`, `LABEL_VALUE`, `RESOURCE`, `NAMESPACE`, `RESOURCE_NAME`.
fn listed(vars: &Vars, m: &mut Mapping, label: &str) -> Result<(), Error> {
    let selector = match vars.get("LABEL_VALUE") {
        Some(v) => format!("{}={}", label.trim(), v.trim()),
        None => label.trim().to_string(),
    };
    m.put(&flag::selector, selector, "LABEL and LABEL_VALUE");
    let resource = vars.get("RESOURCE").unwrap_or_else(|| "configmap".into());
    let resource = match resource.trim() {
        "configmap" => "configmaps",
        "secret" => "secrets",
        "both" => "configmaps,secrets",
        other => {
            return Err(usage(
                "RESOURCE",
                format!("'{other}' is not configmap, secret or both"),
            ));
        }
    };
    m.put(&flag::resource, resource, "RESOURCE");
    let all = match vars.get("NAMESPACE") {
        Some(ns) if ns.trim() == "ALL" => true,
        Some(ns) => {
            m.put(&flag::namespace, ns, "NAMESPACE");
            false
        }
        None => {
            let dir = (vars.0)(&flag::service_account_dir.var())
                .unwrap_or_else(|| SERVICE_ACCOUNT_DIR.into());
            let file = Path::new(&dir).join("namespace");
            let ns = std::fs::read_to_string(&file).map_err(|e| {
                usage(
                    "NAMESPACE",
                    format!(
                        "not set, and the pod's namespace cannot be read from '{}' ({e}): set NAMESPACE to a namespace, a comma list, or ALL",
                        file.display()
                    ),
                )
            })?;
            m.put(
                &flag::namespace,
                ns.trim(),
                "the service account's namespace file",
            );
            false
        }
    };
    if let Some(names) = vars.get("RESOURCE_NAME") {
        if all {
            m.notes.push((
                log::Level::Warn,
                "RESOURCE_NAME is not used with NAMESPACE=ALL (as k8s-sidecar): objects are selected by LABEL".into(),
            ));
        } else {
            m.names = parse_names(&names)?;
        }
    }
    Ok(())
}

/// Where it goes: `FOLDER`, `FOLDER_ANNOTATION`, `UNIQUE_FILENAMES`, `DEFAULT_FILE_MODE`.
fn destination(vars: &Vars, m: &mut Mapping, folder: String) -> Result<(), Error> {
    m.put(&flag::out_dir, folder, "FOLDER");
    m.put(&flag::layout, "flat", "FOLDER");
    let annotation = vars
        .get("FOLDER_ANNOTATION")
        .unwrap_or_else(|| "k8s-sidecar-target-directory".into());
    m.put(&flag::folder_annotation, annotation, "FOLDER_ANNOTATION");
    if vars.yes("UNIQUE_FILENAMES") {
        m.put(&flag::unique_filenames, "true", "UNIQUE_FILENAMES");
    }
    m.put(&flag::fetch_url_keys, "true", "FOLDER");
    let mode = match vars.get("DEFAULT_FILE_MODE") {
        // k8s-sidecar leaves files as the process creates them: 0644, Secrets too.
        None => "0644".to_string(),
        Some(v) => {
            let t = v.trim();
            match u32::from_str_radix(t.trim_start_matches("0o"), 8) {
                Ok(mode) if mode <= 0o7777 => format!("{mode:04o}"),
                _ => {
                    return Err(usage(
                        "DEFAULT_FILE_MODE",
                        format!("'{v}' is not an octal mode like 640 or 0640"),
                    ));
                }
            }
        }
    };
    m.put(&flag::file_mode, mode, "DEFAULT_FILE_MODE");
    Ok(())
}

/// When: `METHOD` (`WATCH`: a poll every 5 s; `SLEEP`: every `SLEEP_TIME`; `LIST`: once).
fn timing(vars: &Vars, m: &mut Mapping) -> Result<(), Error> {
    match vars.get("METHOD").as_deref().map(str::trim) {
        Some("LIST") => {
            m.list = true;
            m.put(&flag::once, "true", "METHOD");
        }
        Some("SLEEP") => {
            let secs = vars.get("SLEEP_TIME").unwrap_or_else(|| "60".into());
            let ms = seconds(&secs).ok_or_else(|| {
                usage("SLEEP_TIME", format!("'{secs}' is not a number of seconds"))
            })?;
            m.put(&flag::interval, format!("{ms}ms"), "SLEEP_TIME");
        }
        other => {
            if let Some(other) = other.filter(|o| *o != "WATCH") {
                m.notes.push((
                    log::Level::Warn,
                    format!(
                        "METHOD={other} is taken as WATCH (as k8s-sidecar does): a poll every 5s"
                    ),
                ));
            }
            m.put(&flag::interval, "5s", "METHOD");
        }
    }
    Ok(())
}

/// Who hears of it: `REQ_URL` and the other `REQ_*` variables, `SCRIPT`.
fn listeners(vars: &Vars, m: &mut Mapping) -> Result<(), Error> {
    let req_timeout = vars.get("REQ_TIMEOUT").unwrap_or_else(|| "10".into());
    let ms = seconds(&req_timeout).ok_or_else(|| {
        usage(
            "REQ_TIMEOUT",
            format!("'{req_timeout}' is not a number of seconds"),
        )
    })?;
    m.req_timeout = Duration::from_millis(ms);
    if let Some(u) = vars.get("REQ_URL") {
        m.put(&flag::reload_url, u, "REQ_URL");
        m.put(
            &flag::reload_method,
            vars.get("REQ_METHOD").unwrap_or_else(|| "GET".into()),
            "REQ_METHOD",
        );
        // METHOD=LIST calls REQ_URL whatever REQ_SKIP_INIT says (as k8s-sidecar).
        if vars.yes("REQ_SKIP_INIT") && !m.list {
            m.put(&flag::reload_skip_first, "true", "REQ_SKIP_INIT");
        }
        m.put(&flag::reload_timeout, format!("{ms}ms"), "REQ_TIMEOUT");
        if let Some(p) = vars.get("REQ_PAYLOAD") {
            // As k8s-sidecar posts it: the JSON it is, else the text as a JSON string.
            let body = match serde_json::from_str::<serde_json::Value>(&p) {
                Ok(v) => v,
                Err(_) => serde_json::Value::String(p),
            };
            m.body = Some(body.to_string().into_bytes());
        }
    }
    let credential = |name: &'static str| -> Option<SecretSource> {
        match (vars.get(&format!("{name}_FILE")), vars.get(name)) {
            (Some(file), _) => Some(SecretSource::File(PathBuf::from(file))),
            (None, Some(v)) => Some(SecretSource::Text(Secret::new(v))),
            (None, None) => None,
        }
    };
    if let (Some(user), Some(password)) = (credential("REQ_USERNAME"), credential("REQ_PASSWORD")) {
        m.basic = Some((user, password));
    }
    if vars.yes("REQ_SKIP_TLS_VERIFY") {
        m.req_insecure = true;
        m.notes.push((
            log::Level::Warn,
            "REQ_SKIP_TLS_VERIFY=true: REQ_URL's and .url downloads' certificates are NOT verified"
                .into(),
        ));
    }
    if let Some(script) = vars.get("SCRIPT") {
        m.put(&flag::on_change, script_command(&script), "SCRIPT");
        if vars.get("REQ_URL").is_none() {
            m.put(&flag::reload_timeout, format!("{ms}ms"), "REQ_TIMEOUT");
        }
    }
    Ok(())
}

/// Operations: `HEALTH_PORT`, `HEALTH_HOST`, `LOG_LEVEL`, `LOG_FORMAT`, `SKIP_TLS_VERIFY`,
/// and the variables that mean nothing here.
fn operations(vars: &Vars, m: &mut Mapping) -> Result<(), Error> {
    if let Some(link) = (vars.0)("HEALTH_PORT")
        .filter(|v| vars.get("HEALTH_PORT").is_none() && !v.trim().is_empty())
    {
        m.notes.push((
            log::Level::Info,
            format!("HEALTH_PORT={link} is the kubelet's link to a Service named `health`, not a port: ignored"),
        ));
    }
    let port = vars.get("HEALTH_PORT").unwrap_or_else(|| "8080".into());
    let port: u16 = (port.trim().parse())
        .map_err(|_| usage("HEALTH_PORT", format!("'{port}' is not a port")))?;
    match vars.get("HEALTH_HOST") {
        Some(host) => {
            let host = host.trim().trim_start_matches('[').trim_end_matches(']');
            let ip: std::net::IpAddr = (host.parse())
                .map_err(|_| usage("HEALTH_HOST", format!("'{host}' is not an IP address")))?;
            m.put(
                &flag::listen,
                SocketAddr::new(ip, port).to_string(),
                "HEALTH_HOST",
            );
        }
        None => {
            // Dual-stack where the pod has IPv6, else IPv4 (k8s-sidecar 2.10).
            m.put(&flag::listen, format!("[::]:{port}"), "HEALTH_PORT");
            m.listen_fallback = Some(SocketAddr::from(([0, 0, 0, 0], port)));
        }
    }
    let level = vars.get("LOG_LEVEL").unwrap_or_else(|| "INFO".into());
    let level = match level.trim().to_ascii_uppercase().as_str() {
        "DEBUG" => "debug",
        "INFO" => "info",
        "WARN" | "WARNING" => "warn",
        "ERROR" | "CRITICAL" | "FATAL" => "error",
        _ => {
            return Err(usage(
                "LOG_LEVEL",
                format!("'{level}' is not DEBUG, INFO, WARNING, ERROR or CRITICAL"),
            ));
        }
    };
    m.put(&flag::log_level, level, "LOG_LEVEL");
    let format = vars.get("LOG_FORMAT").unwrap_or_else(|| "JSON".into());
    let format = match format.trim().to_ascii_uppercase().as_str() {
        "JSON" => "json",
        "LOGFMT" => "text",
        _ => {
            return Err(usage(
                "LOG_FORMAT",
                format!("'{format}' is not JSON or LOGFMT"),
            ));
        }
    };
    m.put(&flag::log_format, format, "LOG_FORMAT");
    if vars.yes("SKIP_TLS_VERIFY") {
        m.api_insecure = true;
        m.notes.push((
            log::Level::Warn,
            "SKIP_TLS_VERIFY=true: the apiserver's certificate is NOT verified; anyone in the network path can read the token and forge answers".into(),
        ));
    }
    for v in WITHOUT_EFFECT {
        if let Some(value) = vars.get(v) {
            m.notes.push((
                log::Level::Debug,
                format!("{v}={value}: k8s-sidecar's; nothing for cmpoll to do with it"),
            ));
        }
    }
    for v in ["LOG_TZ", "LOG_CONFIG"] {
        if vars.get(v).is_some() {
            m.notes.push((
                log::Level::Warn,
                format!("{v} is not used: cmpoll logs UTC timestamps, as LOG_FORMAT says"),
            ));
        }
    }
    Ok(())
}

/// A number of seconds (`5`, `0.5`) in milliseconds; `None` if it is not one, or not more
/// than zero.
fn seconds(s: &str) -> Option<u64> {
    let f: f64 = s.trim().parse().ok()?;
    (f.is_finite() && f > 0.0 && f < 365.0 * 86400.0).then(|| (f * 1000.0).round() as u64)
}

/// `SCRIPT` as `--on-change` runs it: directly when it is executable, else with `sh` (as
/// k8s-sidecar does).
fn script_command(script: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let quoted = format!("'{}'", script.replace('\'', r"'\''"));
    let executable =
        std::fs::metadata(script).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if executable {
        quoted
    } else {
        format!("sh {quoted}")
    }
}

/// `RESOURCE_NAME`: a comma list of `NAME`, `KIND/NAME` or `NAMESPACE/KIND/NAME`.
fn parse_names(list: &str) -> Result<Vec<Named>, Error> {
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parts: Vec<&str> = entry.split('/').collect();
        let kind = |k: &str| -> Result<Resource, Error> {
            Resource::from_singular(k).ok_or_else(|| {
                usage(
                    "RESOURCE_NAME",
                    format!("'{entry}': '{k}' is not configmap or secret"),
                )
            })
        };
        let named = match parts[..] {
            [name] => Named {
                namespace: None,
                kind: None,
                name: name.to_string(),
            },
            [k, name] => Named {
                namespace: None,
                kind: Some(kind(k)?),
                name: name.to_string(),
            },
            [ns, k, name] => Named {
                namespace: Some(ns.to_string()),
                kind: Some(kind(k)?),
                name: name.to_string(),
            },
            _ => {
                return Err(usage(
                    "RESOURCE_NAME",
                    format!("'{entry}' is not NAME, KIND/NAME or NAMESPACE/KIND/NAME"),
                ));
            }
        };
        let errs = crate::names::dns1123_subdomain(&named.name);
        if !errs.is_empty() {
            return Err(usage(
                "RESOURCE_NAME",
                format!("'{entry}': {}", errs.join("; ")),
            ));
        }
        out.push(named);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::outdir::{FileModes, Layout};
    use std::collections::HashMap;

    fn sidecar_of(vars: &[(&str, &str)]) -> Result<RunSettings, Error> {
        let sa = tempfile::tempdir().unwrap();
        std::fs::write(sa.path().join("namespace"), "monitoring\n").unwrap();
        let mut env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.entry("CMPOLL_SERVICE_ACCOUNT_DIR".into())
            .or_insert_with(|| sa.path().display().to_string());
        sidecar(&|k| env.get(k).cloned())
    }

    fn run(s: &RunSettings) -> &RunSettings {
        s
    }

    const CHART: &[(&str, &str)] = &[
        // The Grafana chart's dashboard sidecar, as it renders with the defaults.
        ("METHOD", "WATCH"),
        ("LABEL", "grafana_dashboard"),
        ("FOLDER", "/tmp/dashboards"),
        ("RESOURCE", "both"),
        ("REQ_USERNAME", "admin"),
        ("REQ_PASSWORD", "pw"),
        (
            "REQ_URL",
            "http://localhost:3000/api/admin/provisioning/dashboards/reload",
        ),
        ("REQ_METHOD", "POST"),
    ];

    #[test]
    fn the_grafana_charts_variables() {
        let s = sidecar_of(CHART).unwrap();
        let sel = &s.source.selection;
        assert_eq!(sel.labels.as_str(), "grafana_dashboard");
        assert!(sel.resources.qualified(), "both kinds");
        assert_eq!(sel.namespaces, ["monitoring"], "the pod's own namespace");
        assert_eq!(
            sel.folder_annotation.as_deref(),
            Some("k8s-sidecar-target-directory")
        );
        let r = run(&s);
        let out = r.sinks.out_dir.as_ref().unwrap();
        assert_eq!(
            (out.dir.to_str(), out.layout),
            (Some("/tmp/dashboards"), Layout::Flat)
        );
        assert_eq!(
            out.file_modes,
            FileModes::all(0o644),
            "Secrets too, as k8s-sidecar"
        );
        assert_eq!(r.daemon.interval, Duration::from_secs(5));
        assert!(!r.daemon.once);
        let reload = r.sinks.reload_url.as_ref().unwrap();
        assert_eq!((reload.method.as_str(), reload.urls.len()), ("POST", 1));
        assert!(reload.basic.is_some() && reload.body.is_none() && !reload.skip_first);
        let fetch = r.fetch.as_ref().unwrap();
        assert_eq!(
            fetch.basic.as_ref().map(|b| b.origin.as_str()),
            Some("http://localhost:3000"),
            "REQ_USERNAME goes to REQ_URL's origin only"
        );
        assert_eq!(r.listen, Some("[::]:8080".parse().unwrap()));
        assert!(r.health.live_after_first_batch && r.health.busy_is_warning);
        assert_eq!(r.health.fallback, Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(s.logging.format, crate::ops::logging::LogFormat::Json);
    }

    #[test]
    fn each_variable_and_what_it_becomes() {
        let with = |extra: &[(&str, &str)]| {
            let mut v = vec![("LABEL", "l"), ("FOLDER", "/f")];
            v.extend_from_slice(extra);
            sidecar_of(&v).unwrap()
        };
        let s = with(&[("LABEL_VALUE", "1"), ("NAMESPACE", "ALL")]);
        assert_eq!(s.source.selection.labels.as_str(), "l=1");
        assert!(
            s.source.selection.namespaces.is_empty(),
            "ALL: every namespace"
        );
        let s = with(&[("NAMESPACE", "a, b"), ("RESOURCE", "secret")]);
        assert_eq!(s.source.selection.namespaces, ["a", "b"]);
        assert!(s.source.selection.resources.has(Resource::Secrets));
        let s = with(&[("METHOD", "SLEEP"), ("SLEEP_TIME", "2.5")]);
        assert_eq!(run(&s).daemon.interval, Duration::from_millis(2500));
        let s = with(&[("METHOD", "SLEEP")]);
        assert_eq!(run(&s).daemon.interval, Duration::from_secs(60));
        let s = with(&[
            ("METHOD", "LIST"),
            ("REQ_URL", "http://h/r"),
            ("REQ_SKIP_INIT", "true"),
        ]);
        let r = run(&s);
        assert!(r.daemon.once && r.daemon.once_tolerates_reloads);
        assert!(
            !r.sinks.reload_url.as_ref().unwrap().skip_first,
            "LIST calls it anyway"
        );
        let s = with(&[
            ("REQ_URL", "https://h/r"),
            ("REQ_PAYLOAD", "{\"a\":1}"),
            ("REQ_METHOD", "POST"),
            ("REQ_SKIP_INIT", "TRUE"),
            ("REQ_TIMEOUT", "3"),
            ("REQ_SKIP_TLS_VERIFY", "true"),
        ]);
        let reload = run(&s).sinks.reload_url.clone().unwrap();
        assert_eq!(reload.body.as_deref(), Some(&b"{\"a\":1}"[..]));
        assert!(reload.skip_first && reload.insecure);
        assert_eq!(reload.timeout, Duration::from_secs(3));
        assert_eq!(
            run(&s).fetch.as_ref().unwrap().timeout,
            Duration::from_secs(3)
        );
        let s = with(&[
            ("REQ_URL", "http://h/r"),
            ("REQ_PAYLOAD", "not json"),
            ("REQ_METHOD", "POST"),
        ]);
        assert_eq!(
            run(&s).sinks.reload_url.as_ref().unwrap().body.as_deref(),
            Some(&b"\"not json\""[..]),
            "a JSON string"
        );
        let s = with(&[("REQ_URL", "http://h/r"), ("REQ_PAYLOAD", "{}")]);
        let reload = run(&s).sinks.reload_url.clone().unwrap();
        assert_eq!(
            (reload.method.as_str(), reload.body),
            ("GET", None),
            "no body on a GET"
        );
        let s = with(&[("DEFAULT_FILE_MODE", "640"), ("UNIQUE_FILENAMES", "True")]);
        let r = run(&s);
        assert_eq!(
            r.sinks.out_dir.as_ref().unwrap().file_modes,
            FileModes::all(0o640)
        );
        assert!(r.naming.unique);
        let s = with(&[("HEALTH_HOST", "127.0.0.1"), ("HEALTH_PORT", "18080")]);
        assert_eq!(run(&s).listen, Some("127.0.0.1:18080".parse().unwrap()));
        // A Service named `health` in the pod's namespace: the kubelet's link, not a port.
        let s = with(&[
            ("HEALTH_HOST", "127.0.0.1"),
            ("HEALTH_PORT", "tcp://10.96.0.9:80"),
        ]);
        assert_eq!(run(&s).listen, Some("127.0.0.1:8080".parse().unwrap()));
        assert!(
            s.notes.iter().any(|(_, n)| n.contains("link to a Service")),
            "{:?}",
            s.notes
        );
        assert_eq!(run(&s).health.fallback, None);
        let s = with(&[("LOG_LEVEL", "critical"), ("LOG_FORMAT", "LOGFMT")]);
        assert_eq!(s.logging.level, Some(log::LevelFilter::Error));
        assert_eq!(s.logging.format, crate::ops::logging::LogFormat::Text);
        let s = with(&[("RESOURCE_NAME", "a,configmap/b,other/secret/c")]);
        assert_eq!(s.source.selection.names.len(), 3);
        assert_eq!(
            s.source.selection.names[2].namespace.as_deref(),
            Some("other")
        );
        let s = with(&[("WATCH_CLIENT_TIMEOUT", "66"), ("LOG_TZ", "UTC")]);
        assert_eq!(s.notes.len(), 2);
        assert_eq!(s.notes[1].0, log::Level::Warn);
        // A CMPOLL_* variable wins over the mapping.
        let s = with(&[("CMPOLL_INTERVAL", "1m"), ("CMPOLL_LOG_FORMAT", "text")]);
        assert_eq!(run(&s).daemon.interval, Duration::from_secs(60));
        assert_eq!(s.logging.format, crate::ops::logging::LogFormat::Text);
    }

    #[test]
    fn usage_errors_name_the_variable() {
        let err = |vars: &[(&str, &str)]| match sidecar_of(vars) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{vars:?} should fail"),
        };
        for (vars, want) in [
            (&[("FOLDER", "/f")][..], "LABEL: not set"),
            (&[("LABEL", "l")][..], "FOLDER: not set"),
            (
                &[("LABEL", "l"), ("FOLDER", "/f"), ("RESOURCE", "pods")][..],
                "RESOURCE: 'pods' is not configmap, secret or both",
            ),
            (
                &[
                    ("LABEL", "l"),
                    ("FOLDER", "/f"),
                    ("DEFAULT_FILE_MODE", "rw"),
                ][..],
                "DEFAULT_FILE_MODE: 'rw' is not an octal mode",
            ),
            (
                &[
                    ("LABEL", "l"),
                    ("FOLDER", "/f"),
                    ("DEFAULT_FILE_MODE", "99"),
                ][..],
                "DEFAULT_FILE_MODE",
            ),
            (
                &[
                    ("LABEL", "l"),
                    ("FOLDER", "/f"),
                    ("SLEEP_TIME", "x"),
                    ("METHOD", "SLEEP"),
                ][..],
                "SLEEP_TIME",
            ),
            (
                &[("LABEL", "l"), ("FOLDER", "/f"), ("HEALTH_PORT", "http")][..],
                "HEALTH_PORT",
            ),
            (
                &[("LABEL", "l"), ("FOLDER", "/f"), ("LOG_LEVEL", "LOUD")][..],
                "LOG_LEVEL",
            ),
            (
                &[("LABEL", "l"), ("FOLDER", "/f"), ("RESOURCE_NAME", "pod/x")][..],
                "RESOURCE_NAME",
            ),
            (
                &[("LABEL", "a b"), ("FOLDER", "/f")][..],
                "LABEL and LABEL_VALUE:",
            ),
        ] {
            let e = err(vars);
            assert!(e.contains(want), "{vars:?}: {e}");
        }
        // Unset NAMESPACE and no service-account file: said so, naming NAMESPACE.
        let env: HashMap<&str, &str> = [
            ("LABEL", "l"),
            ("FOLDER", "/f"),
            ("CMPOLL_SERVICE_ACCOUNT_DIR", "/nonexistent"),
        ]
        .into();
        let e = sidecar(&|k| env.get(k).map(|v| v.to_string()))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("NAMESPACE: not set") && e.contains("ALL"),
            "{e}"
        );
    }
}
