//! `DIR/.cmpoll/state.json`: what cmpoll wrote in the output folder, and the writes it is
//! about to make (a write-ahead record).
//!
//! The record is the only thing that lets cmpoll delete a file, so it is never trusted
//! blindly: every name read back is checked to be what cmpoll itself would have written
//! (a valid module id, a key the apiserver allows, a single path component, a temporary
//! name of cmpoll's own form). A record that fails the check is a start-up error naming the
//! file and the entry, not something to act on: whoever can write `DIR/.cmpoll` must not be
//! able to make cmpoll delete files elsewhere.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::written::{Interner, Keys, Modules, Written};
use crate::names;
use crate::poll::snapshot::{STEM_MAX, folder_of, stem};

/// A write about to be made (recorded before it is made).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub module: String,
    #[serde(flatten)]
    pub written: Written,
    /// The temporary name used on the way (a symlink or a file), relative to DIR. It did
    /// not exist when the write was recorded and is created exclusively, so whatever is
    /// found there after a crash is cmpoll's.
    pub tmp: String,
    /// `files` layout: the module's folder (`NS`, or `KIND/NS`) did not exist when the
    /// write was recorded, so a folder found there after a crash is cmpoll's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub new_namespace: bool,
    /// `files` layout, a kind-qualified module: nor did its kind's folder (`KIND`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub new_kind: bool,
    /// `flat` layout: folders the files go into that did not exist when the write was
    /// recorded (a folder annotation's), so such a folder found after a crash is cmpoll's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub folders: Vec<String>,
}

/// A version folder no longer in use, deleted once it is older than the TTL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Retired {
    pub version: Box<str>,
    #[serde(with = "super::written::keys_list")]
    pub files: Keys,
    /// Unix seconds when it was replaced.
    pub since: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub version: u32,
    pub seq: u64,
    pub modules: Modules,
    /// Folders cmpoll created (and may remove once empty), relative to DIR: a module's
    /// folder in the `files` layout (`NS`, or `KIND` and `KIND/NS`), the folders of a
    /// folder annotation in the `flat` layout.
    pub namespaces: BTreeSet<String>,
    pub pending: Vec<Pending>,
    pub retired: Vec<Retired>,
}

/// The prefix of every temporary name cmpoll makes in the output folder.
pub const TMP_PREFIX: &str = ".cmpoll-tmp.";

impl Record {
    pub fn new() -> Record {
        Record {
            version: 1,
            ..Record::default()
        }
    }

    /// Parses and checks a record, streamed (at 100k modules the file is tens of MB, which
    /// reading it whole would add to the peak of every start); the error names the entry
    /// that is wrong.
    pub fn read(from: impl std::io::Read) -> Result<Record, String> {
        let r: Record = serde_json::from_reader(std::io::BufReader::with_capacity(64 * 1024, from))
            .map_err(|e| e.to_string())?;
        r.check()?;
        Ok(r)
    }

    /// Shares the key lists of modules with the same keys (after loading).
    pub fn intern(&mut self, interner: &mut Interner) {
        self.modules.intern(interner);
        for r in &mut self.retired {
            r.files = interner.intern(r.files.clone());
        }
    }

    fn check(&self) -> Result<(), String> {
        for (id, w) in self.modules.iter() {
            let at = |what: String| format!("modules[{}]: {what}", names::go_quote(id));
            module_id(id).map_err(at)?;
            written(id, &w).map_err(at)?;
        }
        for f in &self.namespaces {
            flat_path(f).map_err(|e| format!("namespaces: {e}"))?;
        }
        for (i, p) in self.pending.iter().enumerate() {
            let at = |what: String| format!("pending[{i}]: {what}");
            module_id(&p.module).map_err(at)?;
            written(&p.module, &p.written).map_err(at)?;
            tmp(&p.module, &p.tmp).map_err(at)?;
            for f in &p.folders {
                flat_path(f).map_err(at)?;
            }
        }
        for (i, r) in self.retired.iter().enumerate() {
            let at = |what: String| format!("retired[{i}]: {what}");
            version_name(&r.version).map_err(at)?;
            keys(&r.files).map_err(at)?;
        }
        Ok(())
    }
}

/// The write-ahead journal's lines (`DIR/.cmpoll/journal.jsonl`): one `Pending` per line,
/// each checked as the record's own pending writes are; the error names the line.
pub fn parse_journal(bytes: &[u8]) -> Result<Vec<Pending>, String> {
    let mut out = Vec::new();
    // Every line cmpoll appends ends in a newline; what follows the last one is a line
    // cut short by a crash while it was appended, never synced, so none of its writes was
    // made: it is ignored.
    let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    lines.pop();
    for (i, line) in lines.into_iter().enumerate() {
        let at = |what: String| format!("line {}: {what}", i + 1);
        let p: Pending = serde_json::from_slice(line).map_err(|e| at(e.to_string()))?;
        module_id(&p.module).map_err(at)?;
        written(&p.module, &p.written).map_err(at)?;
        tmp(&p.module, &p.tmp).map_err(at)?;
        for f in &p.folders {
            flat_path(f).map_err(at)?;
        }
        out.push(p);
    }
    Ok(out)
}

/// The sequence number in a temporary name (`[NS/].cmpoll-tmp.SEQ.NONCE`).
pub fn seq_of(tmp: &str) -> Option<u64> {
    let file = tmp.rsplit('/').next()?;
    let hex = file.strip_prefix(TMP_PREFIX)?.split('.').next()?;
    u64::from_str_radix(hex, 16).ok()
}

/// `NS/NAME`, or `KIND/NS/NAME` (both kinds listed).
fn module_id(id: &str) -> Result<(), String> {
    let Some((folder_part, name)) = id.rsplit_once('/') else {
        return Err("not a module name (namespace/name)".into());
    };
    match folder_part.split_once('/') {
        Some((kind, ns)) => {
            kind_word(kind)?;
            namespace(ns)?;
        }
        None => namespace(folder_part)?,
    }
    let errs = names::dns1123_subdomain(name);
    if !errs.is_empty() {
        return Err(format!(
            "name {}: {}",
            names::go_quote(name),
            errs.join("; ")
        ));
    }
    Ok(())
}

fn kind_word(kind: &str) -> Result<(), String> {
    match crate::source::Resource::from_singular(kind) {
        Some(_) => Ok(()),
        None => Err(format!(
            "kind {} is not configmap or secret",
            names::go_quote(kind)
        )),
    }
}

/// A path relative to DIR that cmpoll may make or write (a folder it makes, a `flat`
/// file): safe parts, not in cmpoll's own folder, not one of its temporary names.
pub fn flat_path(p: &str) -> Result<(), String> {
    if p.len() > 4095 {
        return Err(format!(
            "{} is longer than a path may be",
            names::go_quote(p)
        ));
    }
    for c in p.split('/') {
        component(c)?;
        if c.starts_with(TMP_PREFIX) {
            return Err(format!(
                "{} is a temporary name of cmpoll's",
                names::go_quote(c)
            ));
        }
    }
    Ok(())
}

fn namespace(ns: &str) -> Result<(), String> {
    let errs = names::dns1123_label(ns);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "namespace {}: {}",
            names::go_quote(ns),
            errs.join("; ")
        ))
    }
}

/// One path component that stays in its folder and is not cmpoll's meta folder.
pub fn component(s: &str) -> Result<&str, String> {
    if s.is_empty()
        || s == "."
        || s == ".."
        || s.contains('/')
        || s.contains('\0')
        || s == ".cmpoll"
        || s.len() > 255
    {
        return Err(format!("{} is not a safe file name", names::go_quote(s)));
    }
    Ok(s)
}

fn keys<S: AsRef<str>>(files: &[S]) -> Result<(), String> {
    for f in files {
        let f = f.as_ref();
        let errs = names::config_map_key(f);
        if !errs.is_empty() {
            return Err(format!("file {}: {}", names::go_quote(f), errs.join("; ")));
        }
    }
    Ok(())
}

/// A version folder's name: `STEM.HEX`, as `plan` makes it (see `super::stem`).
fn version_name(v: &str) -> Result<(), String> {
    component(v)?;
    let ok = v
        .rsplit_once('.')
        .is_some_and(|(_, seq)| !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "version {} is not a version folder name",
            names::go_quote(v)
        ))
    }
}

fn written(id: &str, w: &Written) -> Result<(), String> {
    if let Some((v, files)) = w.placed.version() {
        version_name(v)?;
        // As `plan` names it, or as cmpoll did before names were bounded.
        let now = format!("{}.", stem(id, STEM_MAX));
        if !v.starts_with(&now) && !v.starts_with(&format!("{}.", id.replace('/', "."))) {
            return Err(format!(
                "version {} is not this module's",
                names::go_quote(v)
            ));
        }
        keys(files)?;
    }
    for key in w.placed.flat().keys() {
        flat_path(key).map_err(|e| format!("file {}: {e}", names::go_quote(key)))?;
    }
    if let Some((f, _)) = w.placed.file() {
        component(f)?;
        if f.starts_with(TMP_PREFIX) {
            return Err(format!("file {} is a temporary name", names::go_quote(f)));
        }
    }
    Ok(())
}

/// A temporary name: `.cmpoll-tmp.X` in DIR, or `FOLDER/.cmpoll-tmp.X` in the module's
/// folder.
fn tmp(id: &str, t: &str) -> Result<(), String> {
    let (folder, file) = match t.rsplit_once('/') {
        Some((folder, file)) => (Some(folder), file),
        None => (None, t),
    };
    let bad = || {
        format!(
            "tmp {} is not a temporary name cmpoll makes",
            names::go_quote(t)
        )
    };
    if let Some(folder) = folder
        && folder != folder_of(id).0
    {
        return Err(bad());
    }
    component(file).map_err(|_| bad())?;
    if !file.starts_with(TMP_PREFIX) {
        return Err(bad());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(json: &str) -> Result<Record, String> {
        Record::read(json.as_bytes())
    }

    #[test]
    fn a_record_cmpoll_wrote_parses() {
        let r = with(
            r#"{"version":1,"seq":3,"modules":{"ns/m":{"hash":"h","mode":420,"version":"ns.m.2","files":["a.conf"]},"ns/c":{"hash":"h","mode":420,"file":"ns.c.conf","digest":"0000000000000000000000000000000000000000000000000000000000000000"}},"namespaces":["ns"],"pending":[{"module":"ns/m","hash":"h","mode":420,"version":"ns.m.3","files":["a.conf"],"tmp":"ns/.cmpoll-tmp.3"}],"retired":[{"version":"ns.m.1","files":["a.conf"],"since":5}]}"#,
        )
        .unwrap();
        assert_eq!(
            r.pending[0].written.placed.version().map(|(v, _)| v),
            Some("ns.m.3")
        );
    }

    /// The journal: complete lines are checked like the record's pending writes; a last
    /// line cut short (never synced) is ignored; the sequence is read from the names.
    #[test]
    fn journal_lines_are_checked_and_a_torn_last_line_is_dropped() {
        let line = r#"{"module":"ns/m","hash":"h","mode":420,"version":"ns.m.1f","files":["a"],"tmp":"ns/.cmpoll-tmp.1f.abcd"}"#;
        let torn = &line[..40];
        let journal = format!("{line}\n{torn}");
        let p = parse_journal(journal.as_bytes()).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(seq_of(&p[0].tmp), Some(0x1f));
        let hostile = format!(
            "{line}\n{}\n",
            line.replace("ns/.cmpoll-tmp.1f.abcd", "../../etc/x")
        );
        let e = parse_journal(hostile.as_bytes()).unwrap_err();
        assert!(e.starts_with("line 2: tmp"), "{e}");
        let e = parse_journal(format!("{torn}\n").as_bytes()).unwrap_err();
        assert!(e.starts_with("line 1:"), "{e}");
    }

    /// r13: paths read back are checked, never joined onto DIR blindly.
    #[test]
    fn hostile_records_are_refused_by_entry() {
        let cases = [
            (
                r#"{"modules":{"../etc/x":{"hash":"","mode":0}}}"#,
                "modules[\"../etc/x\"]: kind \"..\" is not configmap or secret",
            ),
            (
                r#"{"modules":{"ns/m":{"hash":"","mode":0,"file":"../../etc/passwd"}}}"#,
                "not a safe file name",
            ),
            (
                r#"{"modules":{"ns/m":{"hash":"","mode":0,"file":"/etc/passwd"}}}"#,
                "not a safe file name",
            ),
            (
                r#"{"modules":{"ns/m":{"hash":"","mode":0,"version":"ns.m.1","files":["../../x"]}}}"#,
                "file \"../../x\"",
            ),
            (
                r#"{"modules":{"ns/m":{"hash":"","mode":0,"version":"other.x.1"}}}"#,
                "is not this module's",
            ),
            (
                r#"{"namespaces":[".."]}"#,
                "namespaces: \"..\" is not a safe file name",
            ),
            (
                r#"{"namespaces":["secret/../x"]}"#,
                "namespaces: \"..\" is not a safe file name",
            ),
            (
                r#"{"namespaces":["/etc"]}"#,
                "namespaces: \"\" is not a safe file name",
            ),
            (
                r#"{"modules":{"pod/ns/m":{"hash":"","mode":0}}}"#,
                "kind \"pod\" is not configmap or secret",
            ),
            (
                r#"{"pending":[{"module":"ns/m","hash":"","mode":0,"tmp":"../x"}]}"#,
                "pending[0]: tmp \"../x\"",
            ),
            (
                r#"{"pending":[{"module":"ns/m","hash":"","mode":0,"tmp":"other/.cmpoll-tmp.1"}]}"#,
                "not a temporary name",
            ),
            (
                r#"{"pending":[{"module":"ns/m","hash":"","mode":0,"tmp":"ns.m.conf"}]}"#,
                "not a temporary name",
            ),
            (
                r#"{"retired":[{"version":"..","files":[],"since":0}]}"#,
                "retired[0]",
            ),
            (
                r#"{"modules":{"ns/m":{"hash":"","mode":0,"flat":{"../x":"0000000000000000000000000000000000000000000000000000000000000000"}}}}"#,
                "file \"../x\"",
            ),
            (
                r#"{"modules":{"ns/m":{"hash":"","mode":0,"flat":{".cmpoll-tmp.1":"0000000000000000000000000000000000000000000000000000000000000000"}}}}"#,
                "temporary name",
            ),
            (
                r#"{"modules":{"ns/m":{"hash":"","mode":0,"flat":{"k":"zz"}}}}"#,
                "is not a SHA-256",
            ),
            (
                r#"{"retired":[{"version":".cmpoll","files":[],"since":0}]}"#,
                "retired[0]",
            ),
        ];
        for (json, want) in cases {
            let full = json.replacen('{', r#"{"version":1,"seq":1,"#, 1);
            let full =
                ["modules", "namespaces", "pending", "retired"]
                    .iter()
                    .fold(full, |acc, k| {
                        if acc.contains(&format!("\"{k}\"")) {
                            acc
                        } else {
                            let empty = if *k == "modules" { "{}" } else { "[]" };
                            acc.replacen('{', &format!(r#"{{"{k}":{empty},"#), 1)
                        }
                    });
            let e = with(&full).unwrap_err();
            assert!(e.contains(want), "{json}: {e}");
        }
    }
}
