//! The reference in `docs/` describes what is built: every flag `--help` lists is in
//! `docs/flags.md` (which is what `tools/flags-doc.py` makes of the help), every metric a
//! running cmpoll exports is in `docs/operations.md`, and every relative link of the docs
//! leads to a file of the repository.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use crate::util::{bin, root};

fn read(p: &str) -> String {
    std::fs::read_to_string(root().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// `--flag` names in a command's `--help`, with the variable it shows.
fn help_flags(command: &str) -> Vec<(String, Option<String>)> {
    let out = Command::new(bin())
        .args([command, "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let options = text.split("Options:\n").nth(1).unwrap();
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    for line in options.lines() {
        if let Some(rest) = line.strip_prefix("  --") {
            let name = rest.split([' ', ',']).next().unwrap();
            if name != "help" {
                flags.push((format!("--{name}"), None));
            }
        }
        if let (Some(last), Some(var)) = (flags.last_mut(), line.trim_end().strip_suffix(']'))
            && let Some((_, v)) = var.rsplit_once('[')
        {
            last.1 = Some(v.to_string());
        }
    }
    assert!(flags.len() >= 3, "{command}: {text}");
    flags
}

#[test]
fn every_flag_of_help_is_in_the_reference() {
    let flags_md = read("docs/flags.md");
    let mut missing = Vec::new();
    for command in ["run", "list", "webhook", "status"] {
        let section = flags_md
            .split(&format!("## `cmpoll {command}`"))
            .nth(1)
            .unwrap_or_else(|| panic!("docs/flags.md has no section for cmpoll {command}"));
        let section = section.split("\n## ").next().unwrap();
        for (flag, var) in help_flags(command) {
            if !section.contains(&format!("| `{flag}` |")) {
                missing.push(format!("cmpoll {command} {flag}"));
            }
            if let Some(v) = var.filter(|_| command != "status")
                && !section.contains(&format!("`{v}`"))
            {
                missing.push(format!("cmpoll {command} {flag}: {v}"));
            }
        }
    }
    assert!(missing.is_empty(), "not in docs/flags.md: {missing:?}");
    // And the page is what its script makes of today's help (a changed help text, a new
    // default: run the command its first lines give).
    let python = crate::util::tools::python();
    let out = Command::new(python)
        .arg(root().join("tools/flags-doc.py"))
        .arg(bin())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8(out.stdout).unwrap() == flags_md,
        "docs/flags.md is not what `python3 tools/flags-doc.py target/debug/cmpoll` prints: run it"
    );
}

#[test]
fn every_exported_metric_is_documented() {
    let operations = read("docs/operations.md");
    let exported = crate::dashboard::exported();
    // Each family as Prometheus sees its samples: a counter by its _total.
    let families: BTreeSet<&String> = (exported.iter())
        .filter(|n| !exported.contains(&format!("{n}_total")))
        .filter(|n| !["_bucket", "_sum", "_count"].iter().any(|s| n.ends_with(s)))
        .collect();
    let missing: Vec<&&String> = (families.iter())
        .filter(|m| !operations.contains(&format!("| `{m}")))
        .collect();
    assert!(families.len() >= 16, "{families:?}");
    assert!(
        missing.is_empty(),
        "not in docs/operations.md's metrics table: {missing:?}"
    );
}

/// Relative links of the README, docs/, HACKING.md and SECURITY.md lead to files that are
/// there; nothing points at the team's shared SPEC, which a clone does not have.
#[test]
fn the_docs_link_to_what_is_in_the_repository() {
    let mut pages = vec![
        root().join("README.md"),
        root().join("HACKING.md"),
        root().join("SECURITY.md"),
    ];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        pages.push(e.unwrap().path());
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        assert!(
            !text.contains("shared/SPEC"),
            "{} points at ../shared/SPEC.md",
            page.display()
        );
        let dir = page.parent().unwrap();
        for (i, _) in text.match_indices("](") {
            let target = text[i + 2..].split(')').next().unwrap();
            let path = target.split('#').next().unwrap();
            if path.is_empty()
                || path.contains("://")
                || path.starts_with("mailto:")
                || path.contains(' ')
            {
                continue;
            }
            if !Path::new(&dir.join(path)).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:#?}");
    let readme = read("README.md");
    assert!(
        readme.lines().count() < 400,
        "the README is the front door: keep it short"
    );
}
