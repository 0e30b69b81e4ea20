//! The crate's error: what `main` prints once as `cmpoll: error: …`, and the exit code.
//! 2 for usage and configuration errors (the message names the flag or file), 1 for runtime
//! failures; `Exit` carries a supervised agent's own code (`--restart never`).

use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// A flag or variable is wrong.
    Usage(String),
    /// A configuration file or the environment is wrong.
    Config(String),
    /// Something failed while running.
    Runtime(String),
    /// Exit with this code, without a message (the agent's exit code).
    Exit(i32),
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Config(_) => 2,
            Error::Runtime(_) => 1,
            Error::Exit(code) => *code,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(m) | Error::Config(m) | Error::Runtime(m) => f.write_str(m),
            Error::Exit(code) => write!(f, "exit {code}"),
        }
    }
}

impl std::error::Error for Error {}
