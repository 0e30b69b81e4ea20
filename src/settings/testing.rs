//! For the settings' unit tests: a command line as `main` reads it, and an environment
//! given as pairs.

use crate::cli::{Command, TopLevel};
use argh::FromArgs;

/// The command `args` (after `cmpoll`) name, or argh's words.
pub fn command(args: &[&str]) -> Result<Command, String> {
    let top = TopLevel::from_args(&["cmpoll"], args).map_err(|e| e.output)?;
    top.command.ok_or_else(|| "no command".to_string())
}

/// `pairs` as the environment a settings reader looks names up in.
pub fn env<'a>(pairs: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
    |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}
