//! Logging to stderr through `log` + env_logger: `RUST_LOG` sets levels (default `info`),
//! `--log-format json` writes one JSON object per line (timestamp, level, target, message)
//! for log pipelines. The HTTP client's own trace output is never written: it dumps the
//! raw request bytes, `Authorization` header included.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

static JSON: AtomicBool = AtomicBool::new(false);

/// The line `main` prints for a fatal error: `cmpoll: error: …`, or a JSON object when the
/// logs are JSON, so a log pipeline never meets a line it cannot parse.
pub fn fatal_line(message: &str) -> String {
    if JSON.load(Ordering::Relaxed) {
        json_line("error", "cmpoll", message)
    } else {
        format!("cmpoll: error: {message}")
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

pub fn init(format: LogFormat) {
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if format == LogFormat::Json {
        JSON.store(true, Ordering::Relaxed);
        b.format(|buf, record| {
            let level = record.level().as_str().to_ascii_lowercase();
            let line = json_line(&level, record.target(), &record.args().to_string());
            writeln!(buf, "{line}")
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
