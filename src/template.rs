//! `--module-template FILE` (concat layout): each module's file written through a template
//! instead of as its files joined, and `--offer-arguments FILE`: the arguments the platform
//! offers every module, of which each module is passed the ones it declares.
//!
//! Placeholders: `{{module}}` (`namespace/name`, or `kind/namespace/name`), `{{namespace}}`,
//! `{{name}}`, `{{ident}}` (the module's name as an identifier: `ident`), `{{hash}}` (of
//! the files written, as the module's hash is computed),
//! `{{content}}` (the files joined as `concat` joins them) and `{{arguments}}` (one
//! `NAME = VALUE` line per offered argument the module declares, each indented as the
//! placeholder is). Anything else between `{{` and `}}` is an error at start-up.
//!
//! A module declares an argument as Grafana Alloy's language does: an `argument "NAME"`
//! block at the top level of its content (comments and strings are skipped; blocks nested
//! in other blocks are not the module's). The wrapping makes Alloy's modules of the
//! proposal for `module.kubernetes.configmaps`: each module a `declare` block named after
//! it, instantiated once with what it declares, so unused offered arguments are no error
//! and two modules' labels never meet. A template is plain text: for another language,
//! leave `{{arguments}}` out.
//!
//! A template with `{{arguments}}` is Alloy's, and the module is kept inside the block the
//! template puts it in by construction (`Template::refuses`): its text must be one body of
//! Alloy's grammar that closes nothing it did not open, and may not name a module (a
//! `declare` label or a component of the form `ident` gives, `NS_S_NAME`), so it cannot
//! reach the root's scope or another team's block. Refused text is rejected, alone, before
//! any validator runs, and never written.

use std::path::Path;

use sha2::{Digest as _, Sha256};

use crate::poll::hash::Hash;
use crate::poll::snapshot::split_id;
use crate::source::ModuleFile;

/// The bytes `concat` writes for a module: the files in key order, each ending in `\n`.
pub fn concat_bytes(files: &[ModuleFile]) -> Vec<u8> {
    let mut content = Vec::new();
    for f in files {
        let bytes = f.content.bytes();
        content.extend_from_slice(bytes);
        if !bytes.ends_with(b"\n") {
            content.push(b'\n');
        }
    }
    content
}

/// The bytes `--layout concat` writes for module `id` (and `--validate` stages as
/// `CMPOLL_MODULE_FILE`): its files joined, or through `template`.
pub fn concat(template: Option<&Template>, id: &str, files: &[ModuleFile]) -> Vec<u8> {
    match template {
        Some(t) => t.render(id, files),
        None => concat_bytes(files),
    }
}

/// A template and the offered arguments, read and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
    /// Offered arguments, in file order: (name, value).
    offered: Vec<(String, String)>,
    /// SHA-256 of the template and the arguments: a change rewrites every module.
    fingerprint: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Module,
    Namespace,
    Name,
    Ident,
    Hash,
    Content,
    /// With the indentation of its line.
    Arguments(String),
}

impl Template {
    /// Parses `text` (from `origin`, for messages) and the offered `arguments` (a file's
    /// text: `NAME = VALUE` lines; blank lines and `//` comments skipped).
    pub fn parse(
        text: &str,
        arguments: Option<(&str, &str)>,
        origin: &str,
    ) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            let (before, after) = rest.split_at(start);
            let end = after
                .find("}}")
                .ok_or_else(|| format!("{origin}: '{{{{' without '}}}}'"))?;
            let word = after[2..end].trim();
            let indent: String = before
                .rsplit('\n')
                .next()
                .unwrap_or("")
                .chars()
                .take_while(|c| *c == ' ' || *c == '\t')
                .collect();
            let line_is_blank = before.rsplit('\n').next().unwrap_or("").trim().is_empty();
            parts.push(Part::Text(before.to_string()));
            parts.push(match word {
                "module" => Part::Module,
                "namespace" => Part::Namespace,
                "name" => Part::Name,
                "ident" => Part::Ident,
                "hash" => Part::Hash,
                "content" => Part::Content,
                "arguments" => Part::Arguments(if line_is_blank { indent } else { String::new() }),
                other => {
                    return Err(format!(
                        "{origin}: unknown placeholder '{{{{{other}}}}}' (module, namespace, name, ident, hash, content, arguments)"
                    ));
                }
            });
            rest = &after[end + 2..];
        }
        parts.push(Part::Text(rest.to_string()));
        if !parts.contains(&Part::Content) {
            return Err(format!(
                "{origin}: no '{{{{content}}}}': the module itself would not be written"
            ));
        }
        let mut offered = Vec::new();
        if let Some((args, args_origin)) = arguments {
            if !parts.iter().any(|p| matches!(p, Part::Arguments(_))) {
                return Err(format!(
                    "{origin}: no '{{{{arguments}}}}', so the arguments of {args_origin} would reach no module"
                ));
            }
            offered = parse_arguments(args, args_origin)?;
        }
        let mut h = Sha256::new();
        h.update(text.as_bytes());
        for (k, v) in &offered {
            h.update([0]);
            h.update(k.as_bytes());
            h.update([0]);
            h.update(v.as_bytes());
        }
        Ok(Template {
            parts,
            offered,
            fingerprint: h.finalize().into(),
        })
    }

    /// Reads `--module-template` and `--offer-arguments` files.
    pub fn read(template: &Path, arguments: Option<&Path>) -> Result<Template, String> {
        let text = std::fs::read_to_string(template)
            .map_err(|e| format!("--module-template '{}': {e}", template.display()))?;
        let args = match arguments {
            Some(p) => Some((
                std::fs::read_to_string(p)
                    .map_err(|e| format!("--offer-arguments '{}': {e}", p.display()))?,
                format!("--offer-arguments '{}'", p.display()),
            )),
            None => None,
        };
        Template::parse(
            &text,
            args.as_ref().map(|(a, o)| (a.as_str(), o.as_str())),
            &format!("--module-template '{}'", template.display()),
        )
    }

    /// Whether this is an Alloy template (it has `{{arguments}}`): the content goes inside a
    /// block, and must stay there.
    pub fn is_alloy(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Arguments(_)))
    }

    /// Why module `files` may not go through this template, if they may not: with an Alloy
    /// template, text that is not one body of Alloy's grammar, closes the block it is put
    /// in, or names a module (`alloy_body_refused`). The module is rejected, alone.
    pub fn refuses(&self, files: &[ModuleFile]) -> Option<String> {
        if !self.is_alloy() {
            return None;
        }
        alloy_body_refused(files)
    }

    /// The bytes written for module `id` with `files` (`{{hash}}`: theirs).
    pub fn render(&self, id: &str, files: &[ModuleFile]) -> Vec<u8> {
        let hash = Hash::of(files.iter().map(|f| (f.key.as_str(), f.content.bytes())));
        let content = concat_bytes(files);
        let (namespace, name) = split_id(id);
        let mut out = Vec::with_capacity(content.len() + 256);
        for p in &self.parts {
            match p {
                Part::Text(t) => out.extend_from_slice(t.as_bytes()),
                Part::Module => out.extend_from_slice(id.as_bytes()),
                Part::Namespace => out.extend_from_slice(namespace.as_bytes()),
                Part::Name => out.extend_from_slice(name.as_bytes()),
                Part::Ident => out.extend_from_slice(ident(id).as_bytes()),
                Part::Hash => out.extend_from_slice(hash.to_string().as_bytes()),
                Part::Content => out.extend_from_slice(&content),
                Part::Arguments(indent) => {
                    let declared = declared_arguments(&String::from_utf8_lossy(&content));
                    let lines: Vec<String> = (self.offered.iter())
                        .filter(|(k, _)| declared.iter().any(|d| d == k))
                        .map(|(k, v)| format!("{k} = {v}"))
                        .collect();
                    // The placeholder's own indentation is in the text before it.
                    out.extend_from_slice(lines.join(&format!("\n{indent}")).as_bytes());
                }
            }
        }
        out
    }

    /// The hash recorded for a module written with this template: its content's hash and
    /// the template's, so that a new template or new arguments rewrite every module.
    pub fn recorded(&self, hash: &Hash) -> Hash {
        let fp = self.fingerprint;
        Hash::of([("template", &fp[..]), ("module", &hash.0[..])])
    }
}

/// `--offer-arguments`: `NAME = VALUE` lines.
fn parse_arguments(text: &str, origin: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with("//") || t.starts_with('#') {
            continue;
        }
        let at = |what: &str| format!("{origin}: line {}: {what}", n + 1);
        let (name, value) = t
            .split_once('=')
            .ok_or_else(|| at("expected NAME = VALUE"))?;
        let (name, value) = (name.trim(), value.trim());
        if !is_identifier(name) {
            return Err(at(&format!("'{name}' is not an identifier")));
        }
        if value.is_empty() {
            return Err(at(&format!("no value for '{name}'")));
        }
        if out.iter().any(|(k, _)| k == name) {
            return Err(at(&format!("'{name}' is offered twice")));
        }
        out.push((name.to_string(), value.to_string()));
    }
    Ok(out)
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A module id as an identifier (`[A-Za-z_][A-Za-z0-9_]*`), one to one: ids hold only
/// lowercase letters, digits, `-`, `.` and `/`, so `-` becomes `_`, `.` `_D_`, `/` `_S_`,
/// and an id that starts with a digit gets an `N` in front (no id has an uppercase letter
/// or `_`, so no two ids meet). `team-a/web.v2` → `team_a_S_web_D_v2`.
pub fn ident(id: &str) -> String {
    let mut out = String::with_capacity(id.len() + 8);
    if id.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('N');
    }
    for c in id.chars() {
        match c {
            '-' => out.push('_'),
            '.' => out.push_str("_D_"),
            '/' => out.push_str("_S_"),
            c => out.push(c),
        }
    }
    out
}

/// One token of Alloy's syntax, as far as cmpoll reads it (comments and spaces are
/// skipped): `Ident` holds a dotted name (`prometheus.scrape`), `Str` a string's bytes
/// between its quotes, escapes left as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token<'t> {
    Ident(&'t [u8]),
    Str(&'t [u8]),
    Raw,
    Open(u8),
    Close(u8),
    Other,
}

/// Alloy's scanner rules: `//` and `/* */` comments, `"…"` strings with `\` escapes on
/// one line, `` `…` `` raw strings over any lines, identifiers of letters, digits and `_`
/// (joined by `.` here). Each token with where it starts; an unterminated comment or
/// string is an error there, and ends the tokens.
struct Tokens<'t> {
    b: &'t [u8],
    i: usize,
}

fn tokens(b: &[u8]) -> Tokens<'_> {
    Tokens { b, i: 0 }
}

impl<'t> Iterator for Tokens<'t> {
    type Item = Result<(usize, Token<'t>), (usize, &'static str)>;

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.b;
        let fail = |me: &mut Tokens, at: usize, what| {
            me.i = b.len();
            Some(Err((at, what)))
        };
        loop {
            let start = self.i;
            let c = *b.get(start)?;
            match c {
                b'/' if b.get(start + 1) == Some(&b'/') => {
                    while self.i < b.len() && b[self.i] != b'\n' {
                        self.i += 1;
                    }
                }
                b'/' if b.get(start + 1) == Some(&b'*') => {
                    let Some(end) = b[start + 2..].windows(2).position(|w| w == b"*/") else {
                        return fail(self, start, "comment not terminated");
                    };
                    self.i = start + 2 + end + 2;
                }
                b'"' => {
                    let mut i = start + 1;
                    while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                    if b.get(i) != Some(&b'"') {
                        return fail(self, start, "string literal not terminated");
                    }
                    self.i = i + 1;
                    return Some(Ok((start, Token::Str(&b[start + 1..i]))));
                }
                b'`' => {
                    let Some(end) = b[start + 1..].iter().position(|&c| c == b'`') else {
                        return fail(self, start, "raw string literal not terminated");
                    };
                    self.i = start + 1 + end + 1;
                    return Some(Ok((start, Token::Raw)));
                }
                c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                    let word =
                        |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c >= 0x80;
                    let len = b[start..]
                        .iter()
                        .position(|&c| !word(c))
                        .unwrap_or(b.len() - start);
                    self.i = start + len;
                    return Some(Ok((start, Token::Ident(&b[start..self.i]))));
                }
                c if c.is_ascii_whitespace() => self.i += 1,
                c => {
                    self.i += 1;
                    let t = match c {
                        b'{' | b'[' | b'(' => Token::Open(c),
                        b'}' | b']' | b')' => Token::Close(c),
                        _ => Token::Other,
                    };
                    return Some(Ok((start, t)));
                }
            }
        }
    }
}

/// The names of the `argument "NAME" { … }` blocks at the top level of Alloy `text` (as
/// far as it scans: what follows an unterminated string or comment is not read).
pub fn declared_arguments(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    // The last tokens: `argument` at depth 0, then its label.
    let (mut prev, mut before) = (Token::Other, Token::Other);
    for (_, t) in tokens(text.as_bytes()).map_while(Result::ok) {
        match t {
            Token::Open(b'{') => {
                if depth == 0
                    && let (Token::Ident(b"argument"), Token::Str(label)) = (before, prev)
                {
                    names.push(String::from_utf8_lossy(label).into_owned());
                }
                depth += 1;
            }
            Token::Open(_) => depth += 1,
            Token::Close(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
        (before, prev) = (prev, t);
    }
    names
}

/// Why Alloy `files`, joined as `concat` joins them, cannot be the body of a block: the
/// text must be one body in Alloy's grammar that closes nothing it did not open (so it
/// stays inside the `declare` block it is put in), and it may not name a module: an
/// identifier or a `declare` label of the form `ident` gives modules (`NS_S_NAME`) is
/// another module's (or its own) declared component. The place is `KEY:LINE:COL`, as
/// Alloy names a place.
pub fn alloy_body_refused(files: &[ModuleFile]) -> Option<String> {
    let text = concat_bytes(files);
    // Where each file starts in `text`, for the place of a finding.
    let mut starts = Vec::with_capacity(files.len());
    let mut at = 0;
    for f in files {
        starts.push((at, f.key.as_str()));
        let n = f.content.bytes().len();
        at += n + usize::from(!f.content.bytes().ends_with(b"\n"));
    }
    let place = |i: usize| -> String {
        let (start, key) = (starts.iter().rev())
            .find(|(s, _)| *s <= i)
            .copied()
            .unwrap_or((0, "?"));
        let before = &text[start..i.min(text.len())];
        let line = 1 + before.iter().filter(|b| **b == b'\n').count();
        let col = 1 + before.iter().rev().take_while(|b| **b != b'\n').count();
        format!("{key}:{line}:{col}")
    };
    let mut open: Vec<(u8, usize)> = Vec::new();
    let mut prev = Token::Other;
    for t in tokens(&text) {
        let (i, t) = match t {
            Ok(t) => t,
            Err((i, what)) => return Some(format!("{}: {what}", place(i))),
        };
        match t {
            Token::Open(c) => open.push((c, i)),
            Token::Close(c) => match open.pop() {
                Some((o, _)) if closing(o) == c as char => {}
                Some((o, at)) => {
                    return Some(format!(
                        "{}: expected {} (for the {} at {}), got {}",
                        place(i),
                        closing(o),
                        o as char,
                        place(at),
                        c as char
                    ));
                }
                None => {
                    return Some(format!(
                        "{}: expected identifier, got {}: the module would close the block it is put in",
                        place(i),
                        c as char
                    ));
                }
            },
            Token::Ident(word) if names_a_module(word) => {
                return Some(format!(
                    "{}: '{}' is the name of a module's declare block; a module may not use another's",
                    place(i),
                    String::from_utf8_lossy(
                        (word.split(|&c| c == b'.'))
                            .find(|w| names_a_module(w))
                            .unwrap_or(word)
                    )
                ));
            }
            Token::Str(label) if prev == Token::Ident(b"declare") && names_a_module(label) => {
                return Some(format!(
                    "{}: declare \"{}\": the name of a module; a module may not declare one",
                    place(i),
                    String::from_utf8_lossy(label)
                ));
            }
            _ => {}
        }
        prev = t;
    }
    open.last().map(|&(o, at)| {
        format!(
            "{}: {} not closed: the module would take in what the template puts after it",
            place(at),
            o as char
        )
    })
}

fn closing(open: u8) -> char {
    match open {
        b'{' => '}',
        b'[' => ']',
        _ => ')',
    }
}

/// Whether `word` has the form `ident` gives a module id: `NS_S_NAME` (every id has a
/// `/`, so every ident has `_S_`; no other identifier needs one).
fn names_a_module(word: &[u8]) -> bool {
    word.windows(3).any(|w| w == b"_S_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Content;

    fn files(text: &str) -> Vec<ModuleFile> {
        vec![ModuleFile {
            key: "module.alloy".into(),
            content: Content::Text(text.into()),
        }]
    }

    #[test]
    fn idents_are_identifiers_and_one_to_one() {
        for (id, want) in [
            ("team-a/web", "team_a_S_web"),
            ("team-a/web.v2", "team_a_S_web_D_v2"),
            ("1team/x", "N1team_S_x"),
            ("configmap/ns/a", "configmap_S_ns_S_a"),
            ("a--b/c", "a__b_S_c"),
            ("a/b--c", "a_S_b__c"),
        ] {
            assert_eq!(ident(id), want, "{id}");
            assert!(is_identifier(&ident(id)), "{id}");
        }
        // Every pair of ids that differ makes two idents (a sample that tries to collide).
        let ids = [
            "a-b/c",
            "a/b-c",
            "a.b/c",
            "a/b.c",
            "a-/c",
            "a--b/c",
            "a/b--c",
            "ab/c",
            "a/bc",
            "a-b.c/d",
            "a.b-c/d",
            "secret/a/b",
            "configmap/a/b",
            "a/b",
            "0a/b",
            "n0a/b",
        ];
        let mut seen = std::collections::HashMap::new();
        for id in ids {
            if let Some(other) = seen.insert(ident(id), id) {
                panic!("{id} and {other} meet");
            }
        }
    }

    #[test]
    fn declared_arguments_are_the_top_level_argument_blocks() {
        let text = r#"
// argument "commented" { }
/* argument "also_commented" { } */
argument "receiver" {
  comment = "argument \"not_this\" { }"
}
argument "clustered" { optional = true }
declare "inner" {
  argument "nested" { }
}
prometheus.scrape "argument" {
  targets = []
}
x = `argument "raw" {`
argument "last" {}
"#;
        assert_eq!(declared_arguments(text), ["receiver", "clustered", "last"]);
        assert!(declared_arguments("argument \"open\" ").is_empty());
    }

    const ALLOY: &str = "// {{module}} ({{hash}})\ndeclare \"{{ident}}\" {\n{{content}}}\n\n{{ident}} \"module\" {\n  {{arguments}}\n}\n";

    #[test]
    fn a_module_is_wrapped_and_given_only_what_it_declares() {
        let t = Template::parse(
            ALLOY,
            Some((
                "// offered to every module\nreceiver = prometheus.remote_write.default.receiver\nclustered = true\n\nunused = \"x\"\n",
                "args",
            )),
            "tmpl",
        )
        .unwrap();
        let module =
            files("argument \"receiver\" { }\nargument \"clustered\" { optional = true }\n");
        let h = Hash::of(module.iter().map(|f| (f.key.as_str(), f.content.bytes())));
        let out = t.render("team-a/web", &module);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                "// team-a/web ({h})\ndeclare \"team_a_S_web\" {{\nargument \"receiver\" {{ }}\nargument \"clustered\" {{ optional = true }}\n}}\n\nteam_a_S_web \"module\" {{\n  receiver = prometheus.remote_write.default.receiver\n  clustered = true\n}}\n"
            )
        );
        // Declaring nothing: passed nothing.
        let out = String::from_utf8(t.render("b/x", &files("x = 1"))).unwrap();
        assert!(out.ends_with("b_S_x \"module\" {\n  \n}\n"), "{out}");
    }

    #[test]
    fn template_and_argument_mistakes_are_named() {
        for (tmpl, args, want) in [
            (
                "{{content}} {{nope}}",
                None,
                "unknown placeholder '{{nope}}'",
            ),
            ("{{content", None, "'{{' without '}}'"),
            ("{{module}}", None, "no '{{content}}'"),
            ("{{content}}", Some("a = 1"), "no '{{arguments}}'"),
            (
                "{{content}}{{arguments}}",
                Some("a 1"),
                "args: line 1: expected NAME = VALUE",
            ),
            (
                "{{content}}{{arguments}}",
                Some("\n9a = 1"),
                "args: line 2: '9a' is not an identifier",
            ),
            (
                "{{content}}{{arguments}}",
                Some("a = 1\na = 2"),
                "'a' is offered twice",
            ),
            ("{{content}}{{arguments}}", Some("a ="), "no value for 'a'"),
        ] {
            let e = Template::parse(tmpl, args.map(|a| (a, "args")), "tmpl").unwrap_err();
            assert!(e.contains(want), "{tmpl}: {e}");
        }
    }

    #[test]
    fn an_alloy_module_stays_in_its_block() {
        let t = Template::parse(ALLOY, Some(("r = 1", "a")), "t").unwrap();
        let ok = [
            "argument \"receiver\" { }\nprometheus.scrape \"default\" {\n  targets = [{\"__address__\" = \"a:1\"}]\n  forward_to = [argument.receiver.value]\n}\n",
            "x = \"}\" // }\n/* } */\ny = `}\n{`\nz = \"a\\\"}\"\n",
            "declare \"helper\" { }\nhelper \"h\" { }\n",
            "label = \"team_b_S_web\"\n",
        ];
        for text in ok {
            assert_eq!(t.refuses(&files(text)), None, "{text}");
        }
        for (text, want) in [
            (
                "argument \"r\" { }\n}\nprometheus.remote_write \"evil\" { }\ndeclare \"x\" {\n",
                "module.alloy:2:1: expected identifier, got }: the module would close the block it is put in",
            ),
            (
                "a = [1, 2}\n",
                "module.alloy:1:10: expected ] (for the [ at module.alloy:1:5), got }",
            ),
            ("a {\n", "module.alloy:1:3: { not closed"),
            (
                "a = \"}\n}\n",
                "module.alloy:1:5: string literal not terminated",
            ),
            ("/* }\n", "module.alloy:1:1: comment not terminated"),
            (
                "a = `x\n",
                "module.alloy:1:5: raw string literal not terminated",
            ),
            (
                "declare \"team_b_S_web\" { }\n",
                "module.alloy:1:9: declare \"team_b_S_web\": the name of a module",
            ),
            (
                "argument \"r\" { }\nteam_b_S_web \"x\" {\n  receiver = argument.r.value\n}\n",
                "module.alloy:2:1: 'team_b_S_web' is the name of a module's declare block",
            ),
            (
                "x = team_b_S_web.module.exports\n",
                "module.alloy:1:5: 'team_b_S_web'",
            ),
        ] {
            let why = t.refuses(&files(text)).unwrap_or_default();
            assert!(why.starts_with(want), "{text:?}: {why}");
        }
        // Across files: each place names its key and line there.
        let two = vec![
            ModuleFile {
                key: "a.alloy".into(),
                content: Content::Text("a {".into()),
            },
            ModuleFile {
                key: "b.alloy".into(),
                content: Content::Text("}\n}\n".into()),
            },
        ];
        let why = t.refuses(&two).unwrap_or_default();
        assert!(why.starts_with("b.alloy:2:1: expected identifier"), "{why}");
        // A template without `{{arguments}}` is plain text: nothing is refused.
        let plain = Template::parse("server {\n{{content}}}\n", None, "t").unwrap();
        assert_eq!(plain.refuses(&files("}\nevil {")), None);
    }

    #[test]
    fn a_new_template_or_new_arguments_change_what_is_recorded() {
        let h = Hash([2; 32]);
        let a = Template::parse(ALLOY, Some(("x = 1", "a")), "t").unwrap();
        let b = Template::parse(ALLOY, Some(("x = 2", "a")), "t").unwrap();
        let c = Template::parse(
            &ALLOY.replace("\"module\"", "\"m\""),
            Some(("x = 1", "a")),
            "t",
        )
        .unwrap();
        assert_ne!(a.recorded(&h), b.recorded(&h));
        assert_ne!(a.recorded(&h), c.recorded(&h));
        assert_eq!(a.recorded(&h), a.clone().recorded(&h));
        assert_ne!(a.recorded(&h), h);
    }
}
