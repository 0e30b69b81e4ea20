//! Looking a flag up: on the command line, then as its `CMPOLL_*` variable, and parsing its
//! value (durations, sizes, switches, choices, lists). Every error names where the value
//! came from (`--flag` or `CMPOLL_FLAG`).

use std::time::Duration;

use crate::error::Error;

/// A value and where it came from (`--flag` or `CMPOLL_FLAG`), for messages.
pub struct Val {
    pub value: String,
    pub from: String,
}

/// Looks flags up on the command line, then in the environment.
pub struct Lookup<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

pub use crate::cli::env_name;

pub fn usage(from: &str, msg: impl std::fmt::Display) -> Error {
    Error::Usage(format!("{from}: {msg}"))
}

impl Lookup<'_> {
    pub fn opt(&self, cli: &Option<String>, flag: &str) -> Option<Val> {
        match cli {
            Some(v) => Some(Val {
                value: v.clone(),
                from: format!("--{flag}"),
            }),
            None => {
                let name = env_name(flag);
                (self.env)(&name).map(|value| Val { value, from: name })
            }
        }
    }

    /// A repeatable flag: each value may itself be a comma-separated list, on the command
    /// line (`--namespace a,b`) as in the environment (`CMPOLL_NAMESPACE=a,b`).
    pub fn list(&self, cli: &[String], flag: &str) -> (Vec<String>, String) {
        let split = |v: &str| -> Vec<String> {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        if !cli.is_empty() {
            return (
                cli.iter().flat_map(|v| split(v)).collect(),
                format!("--{flag}"),
            );
        }
        let name = env_name(flag);
        let values = (self.env)(&name).map(|v| split(&v)).unwrap_or_default();
        (values, name)
    }

    pub fn switch(&self, cli: bool, flag: &str) -> Result<bool, Error> {
        if cli {
            return Ok(true);
        }
        let name = env_name(flag);
        match (self.env)(&name) {
            None => Ok(false),
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "" | "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(usage(
                    &name,
                    format!("'{v}' is not a boolean (true or false)"),
                )),
            },
        }
    }

    pub fn duration(
        &self,
        cli: &Option<String>,
        flag: &str,
        default: Duration,
    ) -> Result<Duration, Error> {
        let Some(v) = self.opt(cli, flag) else {
            return Ok(default);
        };
        let d = parse_duration(&v)?;
        if d.is_zero() {
            return Err(usage(&v.from, "must be more than zero"));
        }
        Ok(d)
    }

    pub fn choice<T: Copy>(
        &self,
        cli: &Option<String>,
        flag: &str,
        default: T,
        choices: &[(&str, T)],
    ) -> Result<T, Error> {
        let Some(v) = self.opt(cli, flag) else {
            return Ok(default);
        };
        choices
            .iter()
            .find(|(name, _)| *name == v.value.trim())
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
                usage(
                    &v.from,
                    format!("'{}' is not one of {}", v.value, names.join(", ")),
                )
            })
    }
}

/// The longest duration any flag takes: a year is already no interval anyone means, and
/// anything far longer would overflow the clock when added to it.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// A humantime duration (`30s`, `1m30s`, `1h`), at most `MAX_DURATION`.
pub fn parse_duration(v: &Val) -> Result<Duration, Error> {
    let d = humantime::parse_duration(v.value.trim())
        .map_err(|e| usage(&v.from, format!("invalid duration '{}': {e}", v.value)))?;
    if d > MAX_DURATION {
        return Err(usage(
            &v.from,
            format!("'{}' is too long (at most 365d)", v.value),
        ));
    }
    Ok(d)
}

/// `64MiB`, `1Gi`, `500k`, `1048576`: bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 64MiB)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "k" | "K" | "kB" | "KB" => 1000,
        "M" | "MB" => 1000 * 1000,
        "G" | "GB" => 1000 * 1000 * 1000,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "'{s}': unknown unit '{other}' (use B, KiB, MiB, GiB)"
            ));
        }
    };
    n.checked_mul(mult)
        .filter(|b| *b > 0)
        .ok_or_else(|| format!("'{s}' is out of range"))
}
