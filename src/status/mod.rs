//! `cmpoll status`: asks a running daemon what it holds and why (`GET /status` on its
//! `--listen` address), or reads an output folder's own record when none runs, and prints
//! a table (or, `--json`, the answer). Exit 0 when every module is delivered and the last
//! poll and reload succeeded, 1 when anything is wrong or the daemon cannot be asked.
//!
//! From a folder, a rejection shows the validator's exit status only: the record does not
//! say whether a module is a ConfigMap or a Secret, and a Secret's output never goes out.

pub mod answer;
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
}

/// How long the daemon may take to answer.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (a daemon with 100,000 modules answers some 25 MB).
const MAX_ANSWER: u64 = 512 * 1024 * 1024;

pub fn run(s: Options, env: &dyn Fn(&str) -> Option<String>) -> Result<(), Error> {
    let (answer, raw) = match &s.target {
        Target::Server(url) => ask(url, &s.query, env)?,
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

/// `GET URL/status`: the report and the answer as it came.
fn ask(
    url: &str,
    query: &Query,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(StatusReport, String), Error> {
    let shown = crate::http::url::redact(&format!("{url}/status"));
    let status_url = match query.to_query() {
        q if q.is_empty() => format!("{url}/status"),
        q => format!("{url}/status?{q}"),
    };
    let trust = match url.starts_with("https://") {
        true => Trust::Platform,
        false => Trust::Insecure,
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
    let mut answer = agent.get(&status_url).call().map_err(|e| {
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
    let answer: StatusReport = serde_json::from_str(&body)
        .map_err(|e| Error::Runtime(format!("{shown}: not a cmpoll status answer: {e}")))?;
    // An older daemon reads no query: it answers every module, narrowed here.
    Ok((answer.narrowed(query), body))
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
