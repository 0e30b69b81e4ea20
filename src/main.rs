//! The `cmpoll` binary: parse, run, print `cmpoll: error: …` once, exit 0/1/2.

use std::process::ExitCode;

use argh::FromArgs;
use cmpoll::cli::TopLevel;
use cmpoll::error::Error;

fn main() -> ExitCode {
    cmpoll::ops::malloc::tune(&|k| std::env::var(k).ok());
    let args: Vec<String> = std::env::args().collect();
    let strs: Vec<&str> = args.iter().map(String::as_str).collect();
    let top = match TopLevel::from_args(&["cmpoll"], strs.get(1..).unwrap_or_default()) {
        Ok(t) => t,
        Err(early) => {
            return match early.status {
                Ok(()) => {
                    print!("{}", cmpoll::cli::help_with_variables(&early.output));
                    ExitCode::SUCCESS
                }
                Err(()) => {
                    eprintln!(
                        "cmpoll: error: {}",
                        cmpoll::cli::with_suggestion(&early.output)
                    );
                    ExitCode::from(2)
                }
            };
        }
    };
    if top.version {
        println!("cmpoll {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let Some(command) = top.command else {
        eprintln!(
            "cmpoll: error: a command is needed: cmpoll run | cmpoll list | cmpoll status | cmpoll webhook | cmpoll sidecar | cmpoll serve (see cmpoll --help)"
        );
        return ExitCode::from(2);
    };
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    match cmpoll::run(command, &|k| std::env::var(k).ok(), &names) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::Exit(code)) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("{}", cmpoll::ops::logging::fatal_line(&e.to_string()));
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
