//! Unit tests of settings: defaults, the environment, and one usage error per flag.

use super::*;
use crate::cli::{Command, TopLevel};
use crate::settings::lookup::parse_size;
use crate::settings::source::{list, read_list};
use argh::FromArgs;
use std::collections::HashMap;
use std::time::Duration;

/// `list`'s or `run`'s settings, with the source they share on top.
#[derive(Debug)]
struct Settings {
    source: SourceOptions,
    command: Mode,
}

#[derive(Debug)]
enum Mode {
    List,
    Run(Box<RunSettings>),
}

/// `PATH` is `/usr/bin:/bin` unless given: agent commands are found at start-up.
fn settings(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, String> {
    let top = TopLevel::from_args(&["cmpoll"], args).map_err(|e| e.output)?;
    let mut env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.entry("PATH".into())
        .or_insert_with(|| "/usr/bin:/bin".into());
    let env = |k: &str| env.get(k).cloned();
    match top.command.unwrap() {
        Command::List(a) => {
            let l = list(&a, &env).map_err(|e| e.to_string())?;
            Ok(Settings {
                source: l.source,
                command: Mode::List,
            })
        }
        Command::Run(a) => {
            let r = run(&a, &env).map_err(|e| e.to_string())?;
            Ok(Settings {
                source: r.source.clone(),
                command: Mode::Run(Box::new(r)),
            })
        }
        _ => panic!("list or run"),
    }
}

fn run_of(args: &[&str], env: &[(&str, &str)]) -> Result<RunSettings, String> {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    match settings(&all, env)?.command {
        Mode::Run(r) => Ok(*r),
        Mode::List => unreachable!(),
    }
}

#[test]
fn defaults() {
    let s = settings(&["list"], &[]).unwrap();
    assert_eq!(s.source.selection.labels.as_str(), "cmpoll.io/module=true");
    assert!(s.source.selection.namespaces.is_empty());
    assert_eq!(s.source.client.timeout, Duration::from_secs(10));
    assert_eq!(s.source.client.max_response_bytes, 64 << 20);
    assert_eq!(s.source.page_size, 0);
    let r = run_of(&[], &[]).unwrap();
    assert_eq!(r.daemon.interval, Duration::from_secs(30));
    assert_eq!(r.daemon.jitter, 0.1);
    assert!(r.sinks.stdout, "stdout when no other sink is given");
    let r = run_of(
        &["--out-dir", "o", "--reload-url", "http://h/", "--", "true"],
        &[],
    )
    .unwrap();
    let out = r.sinks.out_dir.unwrap();
    assert_eq!(
        out.file_modes,
        outdir::FileModes::default(),
        "0644, 0600 for a Secret's"
    );
    assert_eq!(r.sinks.agent.unwrap().restart, child::Restart::Always);
    assert_eq!(r.sinks.reload_url.unwrap().method, "POST");
    assert!(!r.sinks.stdout);
}

#[test]
fn environment_fills_in_and_the_flag_wins() {
    let env = [
        ("CMPOLL_INTERVAL", "5s"),
        ("CMPOLL_NAMESPACE", "a, b,,a"),
        ("CMPOLL_ONCE", "true"),
        ("CMPOLL_SELECTOR", "x=y"),
    ];
    let s = settings(&["run", "--interval", "2s"], &env).unwrap();
    let Mode::Run(r) = s.command else { panic!() };
    assert_eq!(r.daemon.interval, Duration::from_secs(2), "flag wins");
    assert!(r.daemon.once);
    assert_eq!(s.source.selection.namespaces, ["a", "b"]);
    assert_eq!(s.source.selection.labels.as_str(), "x=y");
    let s = settings(&["list", "--namespace", "c"], &env).unwrap();
    assert_eq!(
        s.source.selection.namespaces,
        ["c"],
        "a repeated flag replaces the list"
    );
}

#[test]
fn usage_errors_name_the_flag_or_variable() {
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(&[&str], Env, &str)] = &[
        (
            &["list", "--selector", "a=b b"],
            &[],
            "--selector: found 'b', expected: ',' or 'end of string'",
        ),
        (
            &["list"],
            &[("CMPOLL_SELECTOR", "app:web")],
            "CMPOLL_SELECTOR: unable to parse requirement",
        ),
        (
            &["list", "--field-selector", "data.x=1"],
            &[],
            "--field-selector: \"data.x\" is not a known field selector",
        ),
        (
            &["list", "--namespace", "Bad_NS"],
            &[],
            "--namespace: 'Bad_NS' is not a namespace name",
        ),
        (&["list", "--keys", "["], &[], "--keys: invalid glob '['"),
        (
            &["list", "--timeout", "five"],
            &[],
            "--timeout: invalid duration 'five'",
        ),
        (
            &["list", "--timeout", "0s"],
            &[],
            "--timeout: must be more than zero",
        ),
        (
            &["run", "--interval", "10000000000000000000s"],
            &[],
            "--interval: '10000000000000000000s' is too long (at most 365d)",
        ),
        (
            &["run", "--", "true"],
            &[("CMPOLL_SHUTDOWN_GRACE", "400d")],
            "CMPOLL_SHUTDOWN_GRACE: '400d' is too long",
        ),
        (
            &["list", "--page-size", "-1"],
            &[],
            "--page-size: '-1' is not a page size",
        ),
        (
            &["list", "--max-response-bytes", "64XB"],
            &[],
            "--max-response-bytes: '64XB': unknown unit",
        ),
        (
            &["list", "--log-format", "xml"],
            &[],
            "--log-format: 'xml' is not one of text, json",
        ),
        (
            &["list"],
            &[("CMPOLL_JSON", "maybe")],
            "CMPOLL_JSON: 'maybe' is not a boolean",
        ),
        (
            &["list", "--manifests", "/nonexistent"],
            &[],
            "--manifests: '/nonexistent' is not a folder",
        ),
        (
            &["run", "--jitter", "2"],
            &[],
            "--jitter: must be between 0 and 1",
        ),
        (
            &["run", "--out-dir", "o", "--layout", "tree"],
            &[],
            "--layout: 'tree' is not one of files, concat",
        ),
        (
            &["run", "--ext", ".conf"],
            &[],
            "--ext: only used with --layout concat",
        ),
        (
            &["run", "--out-dir", "o", "--file-mode", "999"],
            &[],
            "--file-mode: '999' is not an octal mode",
        ),
        (
            &["run", "--reload-signal", "HUP"],
            &[],
            "--reload-signal: only used with an agent command",
        ),
        (
            &["run", "--reload-signal", "BOGUS", "--", "a"],
            &[],
            "--reload-signal: unknown signal 'BOGUS'",
        ),
        (
            &["run", "--child-stdin", "events"],
            &[],
            "--child-stdin: only used with an agent command",
        ),
        (
            &["run", "--reload-method", "GET"],
            &[],
            "--reload-method: only used with --reload-url",
        ),
        (
            &["run", "--reload-url", "ftp://x"],
            &[],
            "--reload-url: 'ftp://x' is not an http",
        ),
        (
            &["run", "--listen", "nowhere"],
            &[],
            "--listen: 'nowhere' is not an address",
        ),
        (
            &["run", "--once", "--", "true"],
            &[],
            "--once: cannot be combined with an agent command",
        ),
        // Issue 17: mistakes that used to pass.
        (
            &["list", "--selector", ""],
            &[],
            "--selector: empty: it would hand every ConfigMap",
        ),
        (
            &["list"],
            &[("CMPOLL_SELECTOR", " ")],
            "CMPOLL_SELECTOR: empty: it would hand every ConfigMap",
        ),
        (
            &["run", "--layout", "concat"],
            &[],
            "--layout: only used with --out-dir",
        ),
        (
            &["run"],
            &[("CMPOLL_FILE_MODE", "0640")],
            "CMPOLL_FILE_MODE: only used with --out-dir",
        ),
        (
            &["run", "--old-version-ttl", "5s"],
            &[],
            "--old-version-ttl: only used with --out-dir",
        ),
        (
            &["run", "--shutdown-grace", "5s"],
            &[],
            "--shutdown-grace: only used with an agent command",
        ),
        (
            &["run"],
            &[("CMPOLL_OUT_DIR", "")],
            "CMPOLL_OUT_DIR: empty: give a path, or unset it",
        ),
        (
            &["run", "--", "no-such-agent-here"],
            &[],
            "agent command: 'no-such-agent-here': not found on PATH",
        ),
        (
            &["run", "--", "/dev/null"],
            &[],
            "agent command: '/dev/null': not an executable file",
        ),
        (
            &["list"],
            &[("CMPOLL_KUBECONFIG", "")],
            "CMPOLL_KUBECONFIG: empty: give a path, or unset it",
        ),
        (
            &["list", "--token-file", "t"],
            &[],
            "--token-file: only used with --server",
        ),
        (
            &["list"],
            &[("CMPOLL_CA_FILE", "ca.crt")],
            "CMPOLL_CA_FILE: only used with --server",
        ),
        (
            &["run", "--out-dir", "o", "--ext", ".conf"],
            &[],
            "--ext: only used with --layout concat",
        ),
        (
            &["run", "--validate-timeout", "5s"],
            &[],
            "--validate-timeout: only used with --validate",
        ),
        (
            &["run", "--reload-skip-first"],
            &[],
            "--reload-skip-first: only used with --reload-url",
        ),
        (
            &["run"],
            &[("CMPOLL_RELOAD_TIMEOUT", "5s")],
            "CMPOLL_RELOAD_TIMEOUT: only used with --reload-url or --on-change",
        ),
        (
            &["run", "--", "true"],
            &[("CMPOLL_ONCE", "1")],
            "CMPOLL_ONCE: cannot be combined with an agent command",
        ),
        (
            &["run", "--validate", "true", "--validate-jobs", "0"],
            &[],
            "--validate-jobs: '0' is not a number from 1 to 256",
        ),
        (
            &["run", "--", "true"],
            &[("CMPOLL_RESTART", "sometimes")],
            "CMPOLL_RESTART: 'sometimes' is not one of always, on-failure, never",
        ),
    ];
    for (args, env, want) in cases {
        let e = settings(args, env).unwrap_err();
        assert!(e.starts_with(want), "{args:?}: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

#[test]
fn run_values() {
    let r = run_of(
        &[
            "--out-dir",
            "o",
            "--old-version-ttl",
            "0s",
            "--file-mode",
            "0600",
            "--layout",
            "concat",
            "--ext",
            ".alloy",
            "--listen",
            ":9090",
            "--reload-url",
            "http://127.0.0.1:9/-/reload",
            "--reload-method",
            "put",
            "--",
            "true",
            "--flag",
        ],
        &[],
    )
    .unwrap();
    let out = r.sinks.out_dir.unwrap();
    assert_eq!(out.file_modes, outdir::FileModes::all(0o600));
    assert_eq!(out.old_version_ttl, Duration::ZERO, "a ttl may be zero");
    assert_eq!(out.ext, ".alloy");
    assert_eq!(r.listen, Some("0.0.0.0:9090".parse().unwrap()));
    assert_eq!(r.sinks.reload_url.unwrap().method, "PUT");
    assert_eq!(r.sinks.agent.unwrap().argv, ["true", "--flag"]);
    assert_eq!(parse_listen("[::]:8080").unwrap().to_string(), "[::]:8080");
}

#[test]
fn sizes() {
    for (s, want) in [
        ("64MiB", 64 << 20),
        ("64Mi", 64 << 20),
        ("1GiB", 1 << 30),
        ("500k", 500_000),
        ("1024", 1024),
    ] {
        assert_eq!(parse_size(s), Ok(want), "{s}");
    }
    assert!(parse_size("0").is_err());
    assert!(parse_size("MiB").is_err());
}

/// `--namespace a,b` on the command line, as `CMPOLL_NAMESPACE=a,b` (issue 17).
#[test]
fn list_flags_take_commas_on_the_command_line_too() {
    let names = |args: &[&str], env: &[(&str, &str)]| {
        let s = settings(args, env).unwrap();
        s.source.selection.namespaces.clone()
    };
    let want = ["a", "b", "c"];
    assert_eq!(
        names(&["list", "--namespace", "a,b", "--namespace", "c"], &[]),
        want
    );
    assert_eq!(names(&["list"], &[("CMPOLL_NAMESPACE", "a, b,c")]), want);
}

/// Every flag of the table is read by settings (a flag nobody reads would be accepted and do
/// nothing), each command reads only its own flags, and every default parses.
#[test]
fn every_flag_of_the_table_is_read() {
    use crate::cli::flag;
    let env = |_: &str| None;
    for command in ["run", "list"] {
        let top = TopLevel::from_args(&["cmpoll"], &[command]).unwrap();
        let look = match top.command.unwrap() {
            Command::Run(a) => {
                let look = Lookup::new(a.given(), &env);
                read(&a, &look).unwrap();
                look
            }
            Command::List(a) => {
                let look = Lookup::new(a.given(), &env);
                read_list(&look).unwrap();
                look
            }
            _ => unreachable!(),
        };
        let mut read = look.read();
        read.sort();
        read.dedup();
        let mut table: Vec<&str> = flag::ALL
            .iter()
            .filter(|f| f.group.of(command))
            .map(|f| f.field)
            .collect();
        table.sort();
        assert_eq!(read, table, "{command}");
    }
}

/// A value's source is named as the user wrote it, a switch's too; words print as typed.
#[test]
fn messages_name_the_variable_and_words_print_as_typed() {
    let r = run_of(&["--", "true"], &[("CMPOLL_RESTART", "on-failure")]).unwrap();
    assert_eq!(
        crate::words::Words::word(r.sinks.agent.unwrap().restart),
        "on-failure"
    );
    let e = run_of(&["--reload-skip-first"], &[]).unwrap_err();
    assert_eq!(e, "--reload-skip-first: only used with --reload-url");
    let e = run_of(&[], &[("CMPOLL_RELOAD_SKIP_FIRST", "true")]).unwrap_err();
    assert_eq!(e, "CMPOLL_RELOAD_SKIP_FIRST: only used with --reload-url");
    // Off is not given.
    run_of(&[], &[("CMPOLL_RELOAD_SKIP_FIRST", "false")]).unwrap();
}

/// `--report-events` records in the apiserver it lists from: with `--manifests` there is
/// none.
#[test]
fn report_events_needs_an_apiserver() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().to_str().unwrap();
    let e = run_of(&["--manifests", m, "--report-events"], &[]).unwrap_err();
    assert_eq!(
        e,
        "--report-events: needs an apiserver to record events in (not used with --manifests)"
    );
    let e = run_of(&["--manifests", m], &[("CMPOLL_REPORT_EVENTS", "true")]).unwrap_err();
    assert!(e.starts_with("CMPOLL_REPORT_EVENTS"), "{e}");
    assert!(
        run_of(&["--server", "https://k", "--report-events"], &[])
            .unwrap()
            .report_events
    );
}
