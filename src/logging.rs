//! Logging to stderr through `log` + env_logger: `RUST_LOG` sets levels (default `info`),
//! `--log-format json` writes one JSON object per line (timestamp, level, target, message)
//! for log pipelines.

use std::io::Write;

use crate::settings::LogFormat;

pub fn init(format: LogFormat) {
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if format == LogFormat::Json {
        b.format(|buf, record| {
            let line = serde_json::json!({
                "timestamp": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
                "level": record.level().as_str().to_ascii_lowercase(),
                "target": record.target(),
                "message": record.args().to_string(),
            });
            writeln!(buf, "{line}")
        });
    }
    // A second init (tests calling run twice) keeps the first logger.
    let _ = b.try_init();
}
