//! What the table tells a user beyond parsing: `--help` with each flag's default and
//! variable, the nearest real flag for a typo, and a warning for a `CMPOLL_*` variable that
//! names no flag. All of it reads `flag::ALL`; none of it spells a flag.

use super::entry::Flag;
use super::table::{StatusArgs, flag};

/// The table entry named `name` (`out-dir`), of any command.
fn entry(name: &str) -> Option<&'static Flag> {
    flag::ALL.iter().copied().find(|f| f.name() == name)
}

/// One `--help` entry: the flag and its description, the wrapped lines joined.
struct Entry {
    flag: &'static Flag,
    description: String,
}

/// argh's `--help` with, after each table flag's description, its default and variable:
/// `--interval  time between polls (default: 30s) [CMPOLL_INTERVAL]`, wrapped as argh wraps.
pub fn help_with_variables(help: &str) -> String {
    // `status` is not in the table: its --out-dir and --json are not the daemon's, and
    // take no variable (its help names the one it reads).
    if help.starts_with("Usage: cmpoll status") {
        return help.to_string();
    }
    let mut out = String::new();
    let mut open: Option<Entry> = None;
    for line in help.lines() {
        let continues = line.starts_with("    ") && !line.trim().is_empty();
        if let (true, Some(e)) = (continues, open.as_mut()) {
            if !e.description.is_empty() {
                e.description.push(' ');
            }
            e.description.push_str(line.trim());
            continue;
        }
        if let Some(e) = open.take() {
            write_entry(&mut out, &e);
        }
        let flag = line
            .strip_prefix("  --")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(entry);
        match flag {
            Some(flag) => {
                let description = line.trim_start()[flag.long().len()..].trim().to_string();
                open = Some(Entry { flag, description });
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if let Some(e) = open.take() {
        write_entry(&mut out, &e);
    }
    out
}

fn write_entry(out: &mut String, e: &Entry) {
    let f = e.flag;
    let mut description = e.description.clone();
    if let Some(d) = f.default {
        description.push_str(&format!(" (default: {d})"));
    }
    description.push_str(&format!(" [{}]", f.var()));
    // argh starts each entry with its newline and ends it without one.
    if out.ends_with('\n') {
        out.pop();
    }
    argh_shared::write_description(
        out,
        &argh_shared::CommandInfo {
            name: &f.long(),
            short: &'\0',
            description: &description,
        },
    );
    out.push('\n');
}

/// The long flags argh's `--help` lists for `command` (`run`, `list`), in order.
#[cfg(test)]
pub fn listed_flags(command: &str) -> Vec<String> {
    use argh::FromArgs;
    let mut names = Vec::new();
    if let Err(early) = super::table::TopLevel::from_args(&["cmpoll"], &[command, "--help"]) {
        for line in early.output.lines() {
            if let Some(rest) = line.strip_prefix("  --") {
                let name = rest.split([' ', ',']).next().unwrap_or("");
                if name != "help" {
                    names.push(name.to_string());
                }
            }
        }
    }
    names
}

/// Edit distance, for suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The flag of the table nearest to `name` (at most 2 edits, or a quarter of its length).
fn nearest_flag(name: &str) -> Option<&'static Flag> {
    let limit = (name.len() / 4).max(2);
    flag::ALL
        .iter()
        .map(|f| (distance(name, &f.name()), *f))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| f)
}

/// argh's error for an unknown flag, with the nearest real one suggested.
pub fn with_suggestion(error: &str) -> String {
    let error = error.trim_end();
    let Some(rest) = error.split("Unrecognized argument: --").nth(1) else {
        return error.to_string();
    };
    let typed = rest.split_whitespace().next().unwrap_or("");
    let typed = typed.split('=').next().unwrap_or(typed);
    match nearest_flag(typed) {
        Some(f) => format!("{error} (did you mean {}?)", f.long()),
        None => error.to_string(),
    }
}

/// Warnings for `CMPOLL_*` variables that name no flag (a typo must not pass silently),
/// given as name and value: a kubelet's link to a Service named `cmpoll-…` is no typo.
pub fn unknown_variables<'a>(vars: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, value) in vars {
        let Some(rest) = name.strip_prefix("CMPOLL_") else {
            continue;
        };
        if super::service_link::is_service_link(name, value) {
            continue;
        }
        // `cmpoll status` reads CMPOLL_SERVER_URL (not a flag of the table): set beside the
        // daemon so that `kubectl exec … cmpoll status` finds it, it is no typo.
        if flag::ALL.iter().any(|f| f.var() == name) || name == StatusArgs::SERVER_URL_VAR {
            continue;
        }
        let as_flag = rest.to_ascii_lowercase().replace('_', "-");
        let hint = nearest_flag(&as_flag)
            .map(|f| format!(" (did you mean {}?)", f.var()))
            .unwrap_or_default();
        out.push(format!(
            "{name} names no flag of cmpoll and is ignored{hint}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_the_nearest_flag() {
        let near = |s| nearest_flag(s).map(|f| f.name());
        assert_eq!(near("intervl").as_deref(), Some("interval"));
        assert_eq!(near("out-dri").as_deref(), Some("out-dir"));
        assert_eq!(near("jsno").as_deref(), Some("json"));
        assert_eq!(near("zzzzzzzz"), None);
        assert_eq!(
            with_suggestion("Unrecognized argument: --intervl\n"),
            "Unrecognized argument: --intervl (did you mean --interval?)"
        );
        let warned = unknown_variables(
            [
                ("CMPOLL_INTERVL", "1m"),
                ("CMPOLL_INTERVAL", "1m"),
                ("PATH", "/bin"),
                ("CMPOLL_SERVER_URL", "https://x"),
                ("CMPOLL_HUB_PORT_443_TCP_ADDR", "10.96.0.7"),
                ("CMPOLL_HUB_SERVICE_PORT", "443"),
            ]
            .into_iter(),
        );
        assert_eq!(
            warned,
            [
                "CMPOLL_INTERVL names no flag of cmpoll and is ignored (did you mean CMPOLL_INTERVAL?)"
            ]
        );
    }

    /// Every table flag of `--help` shows its variable (and default), wrapped within 80
    /// columns; the help's other lines pass through.
    #[test]
    fn help_shows_each_variable_and_default() {
        let help = help_with_variables(
            "Options:\n  --timeout         per-request timeout\n  --service-account-dir\n                    where in-cluster credentials are\n  --help            x\n",
        );
        assert_eq!(
            help,
            "Options:\n  --timeout         per-request timeout (default: 10s) [CMPOLL_TIMEOUT]\n  --service-account-dir\n                    where in-cluster credentials are (default:\n                    /var/run/secrets/kubernetes.io/serviceaccount)\n                    [CMPOLL_SERVICE_ACCOUNT_DIR]\n  --help            x\n"
        );
        for command in crate::cli::COMMANDS {
            use argh::FromArgs;
            let Err(early) = crate::cli::TopLevel::from_args(&["cmpoll"], &[command, "--help"])
            else {
                panic!("--help is an early exit")
            };
            let help = help_with_variables(&early.output);
            let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
            for f in flag::ALL.iter().filter(|f| f.group.of(command)) {
                assert!(
                    words.contains(&format!("[{}]", f.var())),
                    "{command}: {}",
                    f.var()
                );
                if let Some(d) = f.default {
                    assert!(words.contains(&format!("(default: {d})")), "{command}: {d}");
                }
            }
            for line in help.lines().filter(|l| l.starts_with("  ")) {
                assert!(line.chars().count() <= 80, "{line}");
            }
        }
    }
}
