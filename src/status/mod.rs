//! `cmpoll status`: asks a running daemon what it holds and why (`GET /status` on its
//! `--listen` address), or reads an output folder's own record when none runs, and prints
//! a table (or, `--json`, the answer). Exit 0 when every module is delivered and the last
//! poll and reload succeeded, 1 when anything is wrong or the daemon cannot be asked.
//!
//! `--fleet` asks a hub (`cmpoll serve`) for its fleet instead (`fleet.rs`), with
//! `--token-file` and `--ca-file` (a hub answers `/status` to a token allowed `get` on it,
//! over HTTPS): exit 1 when a follower refused a served version or is behind.
//!
//! From a folder, a rejection shows the validator's exit status only: the record does not
//! say whether a module is a ConfigMap or a Secret, and a Secret's output never goes out.

pub mod answer;
mod fleet;
mod rollouts;
mod table;

use std::path::Path;
use std::time::Duration;

use self::answer::{ModuleRow, Query, SinkRow, State, StatusReport};
use crate::error::Error;
use crate::http::tls::{self, Trust};

/// Where `cmpoll status` reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A daemon's `--listen` base URL.
    Server(String),
    /// An output folder.
    Folder(std::path::PathBuf),
}

/// What `cmpoll status` runs with (`settings::status` makes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub target: Target,
    pub json: bool,
    /// Which modules to list (by default those rejected or not written).
    pub query: Query,
    /// `--fleet`: a hub's fleet.
    pub fleet: bool,
    pub credentials: Credentials,
}

/// How the daemon is asked: `--token-file`, `--ca-file`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credentials {
    pub token_file: Option<std::path::PathBuf>,
    pub ca_file: Option<std::path::PathBuf>,
}

/// How long the daemon may take to answer.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (a daemon with 100,000 modules answers some 25 MB).
const MAX_ANSWER: u64 = 512 * 1024 * 1024;

pub fn run(s: Options, env: &dyn Fn(&str) -> Option<String>) -> Result<(), Error> {
    if let (true, Target::Server(url)) = (s.fleet, &s.target) {
        return run_fleet(url, &s, env);
    }
    let (answer, raw) = match &s.target {
        Target::Server(url) => ask(url, &s.query, &s.credentials, env)?,
        Target::Folder(dir) => {
            let r = from_folder(dir, &s.query)?;
            let raw = serde_json::to_string_pretty(&r).unwrap_or_default() + "\n";
            (r, raw)
        }
    };
    if s.json {
        print!("{raw}");
    } else {
        print!("{}", answer.table());
    }
    let problems = answer.problems();
    if problems.is_empty() {
        return Ok(());
    }
    if !s.json {
        eprintln!();
        for p in &problems {
            eprintln!("cmpoll status: {p}");
        }
    }
    Err(Error::Exit(1))
}

/// `--fleet`: the hub's fleet, as a table or (`--json`) as it wrote it; exit 1 when a
/// follower refused or is behind.
fn run_fleet(url: &str, s: &Options, env: &dyn Fn(&str) -> Option<String>) -> Result<(), Error> {
    let shown = crate::http::url::redact(&format!("{url}/status"));
    let body = get(url, &format!("{url}/status"), &s.credentials, env)?;
    let status: serde_json::Value = serde_json::from_str(&body)
        .map_err(|e| Error::Runtime(format!("{shown}: not a cmpoll status answer: {e}")))?;
    let answer = match fleet::Fleet::from_status(&status) {
        None => {
            return Err(Error::Runtime(format!(
                "{shown}: no fleet here: not a hub (cmpoll serve), or one older than {}",
                env!("CARGO_PKG_VERSION")
            )));
        }
        Some(f) => f.map_err(|e| Error::Runtime(format!("{shown}: not a fleet: {e}")))?,
    };
    let rollouts = rollouts::from_status(&status)
        .map_err(|e| Error::Runtime(format!("{shown}: not a rollout: {e}")))?;
    if s.json {
        // The fleet as the hub wrote it, with its rollouts (`--rollout`) beside.
        let mut fleet = status["fleet"].clone();
        if let (Some(f), Some(r)) = (fleet.as_object_mut(), status.get("rollouts")) {
            f.insert("rollouts".into(), r.clone());
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&fleet).unwrap_or_default()
        );
    } else {
        print!("{}", answer.table());
        if !rollouts.is_empty() {
            print!("\nrollouts:\n{}", rollouts::lines(&rollouts));
        }
    }
    let mut problems = answer.problems();
    problems.extend(rollouts::problems(&rollouts));
    if problems.is_empty() {
        return Ok(());
    }
    if !s.json {
        eprintln!();
        for p in &problems {
            eprintln!("cmpoll status: {p}");
        }
    }
    Err(Error::Exit(1))
}

/// `GET URL/status`: the report and the answer as it came.
fn ask(
    url: &str,
    query: &Query,
    credentials: &Credentials,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(StatusReport, String), Error> {
    let shown = crate::http::url::redact(&format!("{url}/status"));
    let status_url = match query.to_query() {
        q if q.is_empty() => format!("{url}/status"),
        q => format!("{url}/status?{q}"),
    };
    let body = get(url, &status_url, credentials, env)?;
    let answer: StatusReport = serde_json::from_str(&body)
        .map_err(|e| Error::Runtime(format!("{shown}: not a cmpoll status answer: {e}")))?;
    // An older daemon reads no query: it answers every module, narrowed here.
    Ok((answer.narrowed(query), body))
}

/// `GET status_url` of the daemon at `url`, with `credentials`: its body, when 200.
fn get(
    url: &str,
    status_url: &str,
    credentials: &Credentials,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, Error> {
    let shown = crate::http::url::redact(&format!("{url}/status"));
    let read = |flag: &str, p: &Path| {
        std::fs::read(p).map_err(|e| Error::Config(format!("{flag} {}: {e}", p.display())))
    };
    let trust = match (&credentials.ca_file, url.starts_with("https://")) {
        (Some(ca), _) => Trust::Pem {
            pem: read("--ca-file", ca)?,
            origin: format!("--ca-file {}", ca.display()),
        },
        (None, true) => Trust::Platform,
        (None, false) => Trust::Insecure,
    };
    let token = match &credentials.token_file {
        Some(p) => {
            let t = String::from_utf8(read("--token-file", p)?)
                .map_err(|_| Error::Config(format!("--token-file {}: not UTF-8", p.display())))?;
            Some(crate::secret::Secret::new(t.trim().to_string()))
        }
        None => None,
    };
    let tls = tls::client_config(&trust, None, env).map_err(Error::Config)?;
    let agent = crate::http::agent(crate::http::AgentOptions {
        tls,
        server_name: None,
        timeout: TIMEOUT,
        disable_compression: false,
        proxy: None,
        keep_idle: crate::http::SHORT_IDLE,
    });
    let mut request = agent.get(status_url);
    if let Some(t) = &token {
        request = request.header("Authorization", format!("Bearer {}", t.expose()));
    }
    let mut answer = request.call().map_err(|e| {
        Error::Runtime(format!(
            "cannot ask {shown}: {e} (is cmpoll run serving --listen there? give --server-url, or --out-dir to read a folder)"
        ))
    })?;
    let code = answer.status();
    let body = answer
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER)
        .read_to_string()
        .map_err(|e| Error::Runtime(format!("{shown}: {e}")))?;
    if code == 404 {
        return Err(Error::Runtime(format!(
            "{shown}: 404: this server has no /status (cmpoll webhook, a cmpoll older than {}, or not cmpoll)",
            env!("CARGO_PKG_VERSION")
        )));
    }
    if code != 200 {
        let first = body.lines().next().unwrap_or("");
        return Err(Error::Runtime(format!("{shown}: {code}: {first}")));
    }
    Ok(body)
}

/// What an output folder records: every module it holds (delivered), what `--validate`
/// rejected (`rejected.json`), and what a failed or interrupted write left behind.
fn from_folder(dir: &Path, query: &Query) -> Result<StatusReport, Error> {
    let (written, pending) = crate::sink::outdir::recorded(dir).map_err(Error::Config)?;
    let meta = crate::sink::outdir::meta_dir(dir);
    let rejections = crate::validate::rejections(&meta).map_err(Error::Config)?;
    let row = |module: &str, hash: String| ModuleRow {
        module: module.to_string(),
        // A folder's record does not say what a `NS/NAME` module is.
        kind: crate::source::Resource::named_in(module)
            .map(|r| r.kind().to_string())
            .unwrap_or_default(),
        hash,
        resource_version: None,
        state: State::Delivered,
        reason: None,
        error: None,
    };
    let mut modules: Vec<ModuleRow> = Vec::new();
    for (id, hash) in &written {
        let mut r = row(id, hash.map(|h| h.to_string()).unwrap_or_default());
        if hash.is_none() {
            r.state = State::Unwritten;
            r.error = Some("a write failed half-way; the next poll rewrites it".into());
        }
        modules.push(r);
    }
    for id in &pending {
        let at = match modules.iter().position(|m| &m.module == id) {
            Some(i) => i,
            None => {
                modules.push(row(id, String::new()));
                modules.len() - 1
            }
        };
        modules[at].state = State::Unwritten;
        modules[at].error =
            Some("a batch was interrupted while writing it; cmpoll completes it at start".into());
    }
    for (id, refused) in rejections {
        let at = match modules.iter().position(|m| m.module == id) {
            Some(i) => i,
            None => {
                modules.push(row(&id, String::new()));
                modules.len() - 1
            }
        };
        let m = &mut modules[at];
        m.hash = refused.hash.to_string();
        m.state = State::Rejected;
        m.reason = Some(crate::reason::redacted(&refused.reason));
    }
    modules.sort_by(|a, b| a.module.cmp(&b.module));
    let mut answer = StatusReport {
        version: env!("CARGO_PKG_VERSION").into(),
        source: format!("the record of output folder {}", dir.display()),
        selector: "(not recorded)".into(),
        interval: None,
        ready: true,
        not_ready: None,
        last_poll: None,
        last_success: None,
        sinks: vec![SinkRow {
            sink: "out-dir".into(),
            last_delivery: None,
            reloads: Vec::new(),
        }],
        counts: None,
        modules,
    };
    answer.ready = answer.problems().is_empty();
    Ok(answer.narrowed(query))
}
