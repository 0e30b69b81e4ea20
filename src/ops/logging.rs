//! Logging to stderr through `log` + env_logger: `RUST_LOG` sets levels (default `info`),
//! `--log-format json` writes one JSON object per line (timestamp, level, target, message)
//! for log pipelines. Under systemd, when stderr is the journal's stream (`JOURNAL_STREAM`
//! names its device and inode, sd-daemon(3)), every line starts with its syslog priority
//! (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug) so that `journalctl -p warning`
//! works; journald strips the prefix and stamps the time itself. The HTTP client's own
//! trace output is never written: it dumps the raw request bytes, `Authorization` header
//! included.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl crate::words::Words for LogFormat {
    const WORDS: &'static [(&'static str, Self)] =
        &[("text", LogFormat::Text), ("json", LogFormat::Json)];
}

/// How a command logs (`--log-format`, `--log-level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub format: LogFormat,
    /// `None`: `RUST_LOG`, else info.
    pub level: Option<log::LevelFilter>,
}

static JSON: AtomicBool = AtomicBool::new(false);
static JOURNAL: AtomicBool = AtomicBool::new(false);

/// Whether stderr is the stream systemd connected to the journal: `JOURNAL_STREAM` is
/// `DEVICE:INODE` of it (a stale value inherited by a child does not match).
pub fn stderr_is_journal(env: &dyn Fn(&str) -> Option<String>) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Some(value) = env("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// `stderr_is_journal`, remembered for `fatal_line`.
pub fn detect_journal(env: &dyn Fn(&str) -> Option<String>) -> bool {
    let journal = stderr_is_journal(env);
    JOURNAL.store(journal, Ordering::Relaxed);
    journal
}

/// sd-daemon(3)'s priority prefix of a level.
fn priority(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "<3>",
        log::Level::Warn => "<4>",
        log::Level::Info => "<6>",
        log::Level::Debug | log::Level::Trace => "<7>",
    }
}

/// The line `main` prints for a fatal error: `cmpoll: error: …`, or a JSON object when the
/// logs are JSON, so a log pipeline never meets a line it cannot parse.
pub fn fatal_line(message: &str) -> String {
    let line = if JSON.load(Ordering::Relaxed) {
        json_line("error", "cmpoll", message)
    } else {
        format!("cmpoll: error: {message}")
    };
    if JOURNAL.load(Ordering::Relaxed) {
        format!("{}{line}", priority(log::Level::Error))
    } else {
        line
    }
}

fn json_line(level: &str, target: &str, message: &str) -> String {
    serde_json::json!({
        "timestamp": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        "level": level,
        "target": target,
        "message": message,
    })
    .to_string()
}

/// `journal`: stderr is the journal's stream (`stderr_is_journal`); `level`: `--log-level`,
/// which wins over `RUST_LOG`'s default level.
pub fn init(opts: Options, journal: bool) {
    let Options { format, level } = opts;
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if let Some(level) = level {
        b.filter_level(level);
    }
    if format == LogFormat::Json {
        JSON.store(true, Ordering::Relaxed);
        b.format(move |buf, record| {
            let level = record.level().as_str().to_ascii_lowercase();
            let line = json_line(&level, record.target(), &record.args().to_string());
            let prefix = if journal {
                priority(record.level())
            } else {
                ""
            };
            writeln!(buf, "{prefix}{line}")
        });
    } else if journal {
        b.format(|buf, record| {
            writeln!(
                buf,
                "{}{} {}: {}",
                priority(record.level()),
                record.level(),
                record.target(),
                record.args()
            )
        });
    }
    let logger = b.build();
    let max = logger.filter();
    // A second init (tests calling run twice) keeps the first logger.
    if log::set_logger(Box::leak(Box::new(Guarded(logger)))).is_ok() {
        log::set_max_level(max);
    }
}

/// env_logger minus what must never reach a log: trace records of ureq and ureq-proto.
struct Guarded(env_logger::Logger);

fn hidden(meta: &log::Metadata) -> bool {
    meta.level() == log::Level::Trace && meta.target().starts_with("ureq")
}

impl log::Log for Guarded {
    fn enabled(&self, meta: &log::Metadata) -> bool {
        !hidden(meta) && self.0.enabled(meta)
    }

    fn log(&self, record: &log::Record) {
        if !hidden(record.metadata()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}
