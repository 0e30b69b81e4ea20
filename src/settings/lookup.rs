//! Looking a flag up by its table entry: on the command line, then as its `CMPOLL_*`
//! variable, then its default, and parsing the value (durations, sizes, paths, numbers,
//! addresses, switches, choices, lists). Every error names where the value came from
//! (`--flag`, `CMPOLL_FLAG`, a k8s-sidecar variable). The "only used with" rule is here
//! too, once, from each entry's `needs`.

use std::cell::RefCell;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{Flag, Given, Needs, Raw, flag};
use crate::words::Words;

/// What is wrong with what a command was given. `main` prints it once and exits 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A value (of a flag, a variable, the agent command) and what is wrong with it: `from`
    /// names where it came from as the user wrote it (`--interval`, `CMPOLL_INTERVAL`,
    /// `LABEL`, `the default of --layout`).
    Value { from: String, problem: String },
    /// A file a flag names cannot be used (`--module-template`): the message names both.
    File(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Value { from, problem } => write!(f, "{from}: {problem}"),
            Error::File(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for crate::error::Error {
    fn from(e: Error) -> crate::error::Error {
        match e {
            Error::Value { .. } => crate::error::Error::Usage(e.to_string()),
            Error::File(m) => crate::error::Error::Config(m),
        }
    }
}

/// A value and where it came from (`--flag`, `CMPOLL_FLAG`, or the flag's default), for
/// messages.
pub struct Val {
    pub value: String,
    pub from: String,
}

/// Looks a command's flags up on the command line, then in the environment, then in the
/// table's defaults; remembers which flags were read (a test checks every flag is).
pub struct Lookup<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    given: Given,
    read: RefCell<Vec<&'static str>>,
    /// How a variable's value is named in messages when it did not come from the variable
    /// itself (`cmpoll sidecar`: the k8s-sidecar variable it means).
    origin: Option<&'a Origin<'a>>,
}

/// See `Lookup::origin`.
pub type Origin<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// `from`'s value is wrong: `msg` says how.
pub fn usage(from: &str, msg: impl fmt::Display) -> Error {
    Error::Value {
        from: from.to_string(),
        problem: msg.to_string(),
    }
}

/// Asked for the default of a flag that has none in the table: a mistake in cmpoll, which
/// the settings tests find (every default is read there).
fn no_default(flag: &Flag) -> Error {
    usage(
        &flag.long(),
        "has no default (a bug in cmpoll's flag table)",
    )
}

static NOT_GIVEN: Raw = Raw::Value(None);

impl<'a> Lookup<'a> {
    /// Looks up the flags a command was `given` (`RunArgs::given()`…).
    pub fn new(given: Given, env: &'a dyn Fn(&str) -> Option<String>) -> Lookup<'a> {
        Lookup {
            env,
            given,
            read: RefCell::new(Vec::new()),
            origin: None,
        }
    }

    /// Names values by `origin` (see the field).
    pub fn naming(mut self, origin: &'a Origin<'a>) -> Lookup<'a> {
        self.origin = Some(origin);
        self
    }

    /// How the variable `name`'s value is named in messages.
    fn var_name(&self, name: String) -> String {
        self.origin.and_then(|o| o(&name)).unwrap_or(name)
    }

    /// What the command line gave `flag`; a flag of another command was given nothing.
    fn raw(&self, flag: &'static Flag) -> &Raw {
        match self.given.iter().find(|(f, _)| *f == flag) {
            Some((_, raw)) => raw,
            None => &NOT_GIVEN,
        }
    }

    fn mark(&self, flag: &'static Flag) {
        self.read.borrow_mut().push(flag.field);
    }

    /// The fields of the flags read so far.
    #[cfg(test)]
    pub fn read(&self) -> Vec<&'static str> {
        self.read.borrow().clone()
    }

    /// The flag's value from the command line or its variable; `None` when neither has it.
    pub fn opt(&self, flag: &'static Flag) -> Option<Val> {
        self.mark(flag);
        match self.raw(flag) {
            Raw::Value(Some(v)) => Some(Val {
                value: v.clone(),
                from: flag.long(),
            }),
            _ => {
                let name = flag.var();
                (self.env)(&name).map(|value| Val {
                    value,
                    from: self.var_name(name),
                })
            }
        }
    }

    /// `opt`, else the table's default.
    pub fn value(&self, flag: &'static Flag) -> Option<Val> {
        self.opt(flag).or_else(|| {
            flag.default.map(|d| Val {
                value: d.to_string(),
                from: format!("the default of {}", flag.long()),
            })
        })
    }

    /// A repeatable flag: each value may itself be a comma-separated list, on the command
    /// line (`--namespace a,b`) as in the environment (`CMPOLL_NAMESPACE=a,b`); else the
    /// default's list.
    pub fn list(&self, flag: &'static Flag) -> (Vec<String>, String) {
        self.values(flag, true)
    }

    /// A repeatable flag whose values may hold commas (`--reload-header`): one per flag on
    /// the command line; the variable still splits on commas.
    pub fn each(&self, flag: &'static Flag) -> (Vec<String>, String) {
        self.values(flag, false)
    }

    fn values(&self, flag: &'static Flag, split_flags: bool) -> (Vec<String>, String) {
        self.mark(flag);
        let split = |v: &str| -> Vec<String> {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        if let Raw::List(given) = self.raw(flag)
            && !given.is_empty()
        {
            let values = match split_flags {
                true => given.iter().flat_map(|v| split(v)).collect(),
                false => given.clone(),
            };
            return (values, flag.long());
        }
        // An empty variable (from an empty template) is the default, as an unset one.
        let name = flag.var();
        match (self.env)(&name).map(|v| split(&v)) {
            Some(v) if !v.is_empty() => (v, self.var_name(name)),
            _ => (
                flag.default.map(split).unwrap_or_default(),
                format!("the default of {}", flag.long()),
            ),
        }
    }

    /// A switch: where it was turned on (`--once`, `CMPOLL_ONCE`), or `None` when off.
    pub fn switch(&self, flag: &'static Flag) -> Result<Option<String>, Error> {
        self.mark(flag);
        self.switched(flag)
    }

    /// `switch`, as a bool.
    pub fn on(&self, flag: &'static Flag) -> Result<bool, Error> {
        Ok(self.switch(flag)?.is_some())
    }

    fn switched(&self, flag: &'static Flag) -> Result<Option<String>, Error> {
        if self.raw(flag) == &Raw::Switch(true) {
            return Ok(Some(flag.long()));
        }
        let name = flag.var();
        match (self.env)(&name) {
            None => Ok(None),
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(Some(self.var_name(name))),
                "" | "0" | "false" | "no" | "off" => Ok(None),
                _ => Err(usage(
                    &self.var_name(name),
                    format!("'{v}' is not a boolean (true or false)"),
                )),
            },
        }
    }

    /// A duration flag, more than zero; its default when not given.
    pub fn duration(&self, flag: &'static Flag) -> Result<Duration, Error> {
        let Some(v) = self.value(flag) else {
            return Err(no_default(flag));
        };
        let d = parse_duration(&v)?;
        if d.is_zero() {
            return Err(usage(&v.from, "must be more than zero"));
        }
        Ok(d)
    }

    /// A duration more than zero; `default` when not given (a flag whose default is not the
    /// same for every command).
    pub fn duration_or(&self, flag: &'static Flag, default: Duration) -> Result<Duration, Error> {
        if self.value(flag).is_none() {
            return Ok(default);
        }
        self.duration(flag)
    }

    /// Whether `flag` is one of this command's (given or not).
    pub fn takes(&self, flag: &'static Flag) -> bool {
        self.given.iter().any(|(f, _)| *f == flag)
    }

    /// A duration flag that may be zero (`--old-version-ttl 0s`); its default when not given.
    pub fn duration_or_zero(&self, flag: &'static Flag) -> Result<Duration, Error> {
        let v = self.value(flag).ok_or_else(|| no_default(flag))?;
        parse_duration(&v)
    }

    /// One of `T`'s words; its default when not given.
    pub fn choice<T: Words>(&self, flag: &'static Flag) -> Result<T, Error> {
        self.maybe_choice(flag)?.ok_or_else(|| no_default(flag))
    }

    /// One of `T`'s words, or `None` for a flag without a default that is not given.
    pub fn maybe_choice<T: Words>(&self, flag: &'static Flag) -> Result<Option<T>, Error> {
        let Some(v) = self.value(flag) else {
            return Ok(None);
        };
        let t = T::from_word(&v.value).ok_or_else(|| {
            usage(
                &v.from,
                format!("'{}' is not one of {}", v.value, T::names()),
            )
        })?;
        Ok(Some(t))
    }

    /// Whether `flag` is given at all, on the command line or as its variable (a switch:
    /// turned on). Not a read.
    pub fn given(&self, flag: &'static Flag) -> Result<Option<String>, Error> {
        if flag.kind == crate::cli::Kind::Switch {
            return self.switched(flag);
        }
        if self.raw(flag).given() {
            return Ok(Some(flag.long()));
        }
        let name = flag.var();
        Ok((self.env)(&name).map(|_| self.var_name(name)))
    }

    /// "--flag: only used with …" for the first flag given without what it needs.
    pub fn check_needs(&self, have: impl Fn(Needs) -> bool) -> Result<(), Error> {
        for (flag, _) in &self.given {
            if flag.needs != Needs::Nothing
                && !have(flag.needs)
                && let Some(from) = self.given(flag)?
            {
                return Err(usage(
                    &from,
                    format!("only used with {}", flag.needs.what()),
                ));
            }
        }
        Ok(())
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

/// A flag given without the sink, source or flag it belongs to is a mistake, not a no-op
/// (`agent`: an agent command was given).
pub fn check_needs(look: &Lookup, agent: bool) -> Result<(), Error> {
    let given = |f| look.given(f).map(|g| g.is_some());
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
        // `cmpoll serve`'s own: no command checked here takes --rollout or --remotecfg.
        Needs::Rollout | Needs::Remotecfg => false,
    })
}

/// A path flag; an empty value (`CMPOLL_OUT_DIR=` from an empty template) is an error
/// naming where it came from, not a path.
pub fn path(v: Option<Val>) -> Result<Option<PathBuf>, Error> {
    match v {
        Some(v) if v.value.is_empty() => Err(usage(&v.from, "empty: give a path, or unset it")),
        v => Ok(v.map(|v| PathBuf::from(v.value))),
    }
}

/// The flag's value, else its default (every caller's flag has one in the table).
pub fn required(look: &Lookup, f: &'static Flag) -> Result<Val, Error> {
    look.value(f)
        .ok_or_else(|| usage(&f.long(), "has no default (a bug in cmpoll's flag table)"))
}

/// A number flag: its value or default, parsed and checked by `ok`.
pub fn number<T: std::str::FromStr>(
    look: &Lookup,
    f: &'static Flag,
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

/// `:8080` (all interfaces), `127.0.0.1:8080`, `[::]:8080`.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    let full = if t.starts_with(':') {
        format!("0.0.0.0{t}")
    } else {
        t.to_string()
    };
    full.parse()
        .map_err(|_| format!("'{s}' is not an address (e.g. :8080, 127.0.0.1:8080, [::]:8080)"))
}

/// `--validate-timeout`, else `default` (the command's: see the flag's help).
pub fn validate_timeout(look: &Lookup, default: Duration) -> Result<Duration, Error> {
    match look.opt(&flag::validate_timeout) {
        Some(v) => parse_duration(&v),
        None => Ok(default),
    }
}
