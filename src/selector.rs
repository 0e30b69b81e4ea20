//! Label and field selectors with the apiserver's grammar, semantics and error texts.
//!
//! `LabelSelector::parse` is a port of apimachinery's `labels.Parse` (lexer, parser and
//! `NewRequirement` validation), so a selector cmpoll accepts is one the apiserver accepts,
//! and a bad one is refused locally with the very message the apiserver would have sent.
//! `FieldSelector::parse` is `fields.ParseSelector` plus the ConfigMap field-label check
//! (only `metadata.name` and `metadata.namespace`). Both also match objects locally, for
//! `--manifests` and for checking what an apiserver returned. Depends only on
//! `crate::names`, so the test apiserver can include this file by path.

use crate::names;

/// The operator of one label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    In,
    NotIn,
    Equals,
    DoubleEquals,
    NotEquals,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

impl Op {
    /// apimachinery's `selection.Operator` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::In => "in",
            Op::NotIn => "notin",
            Op::Equals => "=",
            Op::DoubleEquals => "==",
            Op::NotEquals => "!=",
            Op::Exists => "exists",
            Op::DoesNotExist => "!",
            Op::GreaterThan => "gt",
            Op::LessThan => "lt",
        }
    }

    fn from_str(s: &str) -> Option<Op> {
        [
            Op::In,
            Op::NotIn,
            Op::Equals,
            Op::DoubleEquals,
            Op::NotEquals,
            Op::Exists,
            Op::DoesNotExist,
            Op::GreaterThan,
            Op::LessThan,
        ]
        .into_iter()
        .find(|op| op.as_str() == s)
    }
}

/// One `key op values` term of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
    pub values: Vec<String>,
}

impl Requirement {
    fn matches<'a>(&self, get: &impl Fn(&str) -> Option<&'a str>) -> bool {
        let value = get(&self.key);
        let has = |v: &str| self.values.iter().any(|x| x == v);
        match self.op {
            Op::In | Op::Equals | Op::DoubleEquals => value.is_some_and(has),
            Op::NotIn | Op::NotEquals => !value.is_some_and(has),
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
            Op::GreaterThan | Op::LessThan => {
                let (Some(v), [bound]) = (value, self.values.as_slice()) else {
                    return false;
                };
                match (v.parse::<i64>(), bound.parse::<i64>()) {
                    (Ok(v), Ok(b)) if self.op == Op::GreaterThan => v > b,
                    (Ok(v), Ok(b)) => v < b,
                    _ => false,
                }
            }
        }
    }
}

/// A parsed label selector. The text is kept as given: it is what goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    text: String,
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses `text` as the apiserver does; the error is the apiserver's message.
    pub fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut requirements = Parser::new(text).parse()?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            text: text.to_string(),
            requirements,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The selector as apimachinery prints a parsed one (`internalSelector.String()`):
    /// requirements by key, spaces gone, values in order.
    pub fn canonical(&self) -> String {
        let parts: Vec<String> = self.requirements.iter().map(|r| r.to_string()).collect();
        parts.join(",")
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// True when every requirement holds for the labels `get` looks up.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches(&get))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Error,
    End,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn keyword(s: &[u8]) -> Option<Token> {
    Some(match s {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"in" => Token::In,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"notin" => Token::NotIn,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(c: u8) -> bool {
    matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// apimachinery's lexer. Like Go's, it treats a NUL byte as the end of the input.
struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    fn read(&mut self) -> u8 {
        match self.s.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos -= 1;
    }

    fn lex(&mut self) -> (Token, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        if ch == 0 {
            return (Token::End, String::new());
        }
        self.unread();
        if is_special(ch) {
            self.scan_special()
        } else {
            self.scan_identifier()
        }
    }

    fn scan_identifier(&mut self) -> (Token, String) {
        let mut buf = Vec::new();
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if is_special(ch) || is_whitespace(ch) {
                self.unread();
                break;
            }
            buf.push(ch);
        }
        let lit = String::from_utf8_lossy(&buf).into_owned();
        (keyword(&buf).unwrap_or(Token::Identifier), lit)
    }

    fn scan_special(&mut self) -> (Token, String) {
        let mut buf = Vec::new();
        let mut last: Option<(Token, String)> = None;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if !is_special(ch) {
                self.unread();
                break;
            }
            buf.push(ch);
            match keyword(&buf) {
                Some(tok) => last = Some((tok, String::from_utf8_lossy(&buf).into_owned())),
                None if last.is_some() => {
                    self.unread();
                    break;
                }
                None => {}
            }
        }
        last.unwrap_or_else(|| {
            (
                Token::Error,
                format!(
                    "error expected: keyword found '{}'",
                    String::from_utf8_lossy(&buf)
                ),
            )
        })
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    items: Vec<(Token, String)>,
    pos: usize,
}

impl Parser {
    fn new(text: &str) -> Parser {
        let mut lexer = Lexer {
            s: text.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let item = lexer.lex();
            let end = item.0 == Token::End;
            items.push(item);
            if end {
                break;
            }
        }
        Parser { items, pos: 0 }
    }

    fn in_context(tok: Token, ctx: Context) -> Token {
        match tok {
            Token::In | Token::NotIn if ctx == Context::Values => Token::Identifier,
            t => t,
        }
    }

    fn lookahead(&self, ctx: Context) -> (Token, String) {
        let (tok, lit) = &self.items[self.pos.min(self.items.len() - 1)];
        (Self::in_context(*tok, ctx), lit.clone())
    }

    fn consume(&mut self, ctx: Context) -> (Token, String) {
        let item = self.lookahead(ctx);
        self.pos += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut reqs = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Context::Values);
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    reqs.push(r);
                    let (t, l) = self.consume(Context::Values);
                    match t {
                        Token::End => return Ok(reqs),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(format!(
                                    "found '{l2}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => return Err(format!("found '{l}', expected: ',' or 'end of string'")),
                    }
                }
                Token::End => return Ok(reqs),
                _ => {
                    return Err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, inferred) = self.parse_key_and_infer_operator()?;
        if let Some(op) = inferred {
            return new_requirement(&key, op.as_str(), Vec::new());
        }
        let op = self.parse_operator()?;
        let values = match op {
            Op::In | Op::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(&key, op.as_str(), values)
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Op>), String> {
        let mut op = None;
        let (mut tok, mut lit) = self.consume(Context::Values);
        if tok == Token::DoesNotExist {
            op = Some(Op::DoesNotExist);
            (tok, lit) = self.consume(Context::Values);
        }
        if tok != Token::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        let errs = names::label_key(&lit);
        if !errs.is_empty() {
            return Err(invalid("<nil>", &lit, &errs));
        }
        let (next, _) = self.lookahead(Context::Values);
        if (next == Token::End || next == Token::Comma) && op.is_none() {
            op = Some(Op::Exists);
        }
        Ok((lit, op))
    }

    fn parse_operator(&mut self) -> Result<Op, String> {
        let (tok, lit) = self.consume(Context::KeyAndOperator);
        Ok(match tok {
            Token::In => Op::In,
            Token::Equals => Op::Equals,
            Token::DoubleEquals => Op::DoubleEquals,
            Token::GreaterThan => Op::GreaterThan,
            Token::LessThan => Op::LessThan,
            Token::NotIn => Op::NotIn,
            Token::NotEquals => Op::NotEquals,
            _ => {
                return Err(format!(
                    "found '{lit}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        })
    }

    fn parse_values(&mut self) -> Result<Vec<String>, String> {
        let (tok, lit) = self.consume(Context::Values);
        if tok != Token::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Context::Values);
        match tok {
            Token::Identifier | Token::Comma => {
                let set = self.parse_identifiers_list()?;
                if self.consume(Context::Values).0 != Token::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(set)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    /// A sorted set, as Go's `sets.String.List()` returns it.
    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, String> {
        let mut set = std::collections::BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Context::Values);
            match tok {
                Token::Identifier => {
                    set.insert(lit);
                    let (t2, l2) = self.lookahead(Context::Values);
                    match t2 {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(set.into_iter().collect()),
                        _ => return Err(format!("found '{l2}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    let (t2, _) = self.lookahead(Context::Values);
                    if t2 == Token::ClosedPar {
                        set.insert(String::new());
                        return Ok(set.into_iter().collect());
                    }
                    if t2 == Token::Comma {
                        // ",,": an empty value (v0.35 no longer consumes the second comma
                        // here, so `(a,,)` parses).
                        set.insert(String::new());
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<Vec<String>, String> {
        let (tok, _) = self.lookahead(Context::Values);
        if tok == Token::End || tok == Token::Comma {
            return Ok(vec![String::new()]);
        }
        let (tok, lit) = self.consume(Context::Values);
        if tok == Token::Identifier {
            Ok(vec![lit])
        } else {
            Err(format!("found '{lit}', expected: identifier"))
        }
    }
}

/// `field.Invalid(path, value, detail).Error()`.
fn invalid(path: &str, value: &str, errs: &[String]) -> String {
    format!(
        "{path}: Invalid value: {}: {}",
        names::go_quote(value),
        errs.join("; ")
    )
}

/// Go's `%#v` of a `[]string`, as `field.Invalid` shows a list of values.
fn go_list(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| names::go_quote(v)).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

/// `NewRequirement`, with `op` as apimachinery's operator string: every check, each error
/// as `field.Error` prints it, aggregated as `ErrorList.ToAggregate` does (duplicates once,
/// several in brackets).
pub fn new_requirement(key: &str, op: &str, values: Vec<String>) -> Result<Requirement, String> {
    let mut errs: Vec<String> = Vec::new();
    let key_errs = names::label_key(key);
    if !key_errs.is_empty() {
        errs.push(invalid("key", key, &key_errs));
    }
    let list = |detail: &str| format!("values: Invalid value: {}: {detail}", go_list(&values));
    let parsed = Op::from_str(op);
    match parsed {
        Some(Op::In | Op::NotIn) if values.is_empty() => {
            errs.push(list("for 'in', 'notin' operators, values set can't be empty"))
        }
        Some(Op::Equals | Op::DoubleEquals | Op::NotEquals) if values.len() != 1 => {
            errs.push(list("exact-match compatibility requires one single value"))
        }
        Some(Op::Exists | Op::DoesNotExist) if !values.is_empty() => {
            errs.push(list("values set must be empty for exists and does not exist"))
        }
        Some(Op::GreaterThan | Op::LessThan) => {
            if values.len() != 1 {
                errs.push(list("for 'Gt', 'Lt' operators, exactly one value is required"));
            }
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errs.push(invalid(
                        &format!("values[{i}]"),
                        v,
                        &["for 'Gt', 'Lt' operators, the value must be an integer".to_string()],
                    ));
                }
            }
        }
        Some(_) => {}
        None => errs.push(format!(
            "operator: Unsupported value: {}: supported values: \"in\", \"notin\", \"=\", \"==\", \"!=\", \"gt\", \"lt\", \"exists\", \"!\"",
            names::go_quote(op)
        )),
    }
    for (i, v) in values.iter().enumerate() {
        let v_errs = names::label_value(v);
        if !v_errs.is_empty() {
            errs.push(invalid(&format!("values[{i}][{key}]"), v, &v_errs));
        }
    }
    let mut seen = std::collections::HashSet::new();
    errs.retain(|e| seen.insert(e.clone()));
    match (errs.len(), parsed) {
        (0, Some(op)) => Ok(Requirement {
            key: key.to_string(),
            op,
            values,
        }),
        (1, _) => Err(errs.remove(0)),
        _ => Err(format!("[{}]", errs.join(", "))),
    }
}

impl std::fmt::Display for Requirement {
    /// `Requirement.String()`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.op == Op::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.op {
            Op::Equals => "=",
            Op::DoubleEquals => "==",
            Op::NotEquals => "!=",
            Op::In => " in ",
            Op::NotIn => " notin ",
            Op::GreaterThan => ">",
            Op::LessThan => "<",
            Op::Exists | Op::DoesNotExist => return Ok(()),
        };
        f.write_str(op)?;
        let paren = matches!(self.op, Op::In | Op::NotIn);
        if paren {
            f.write_str("(")?;
        }
        let mut values = self.values.clone();
        values.sort();
        f.write_str(&values.join(","))?;
        if paren {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// The two field labels every resource supports, and the only ones ConfigMaps have.
const FIELD_NAME: &str = "metadata.name";
const FIELD_NAMESPACE: &str = "metadata.namespace";

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: String,
    value: String,
    negate: bool,
}

/// A parsed field selector over a ConfigMap's name and namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    text: String,
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// Parses `text` as the apiserver does for ConfigMaps; the error is its message.
    pub fn parse(text: &str) -> Result<FieldSelector, String> {
        let selector = FieldSelector::parse_syntax(text)?;
        for t in &selector.terms {
            if t.field != FIELD_NAME && t.field != FIELD_NAMESPACE {
                return Err(format!(
                    "{} is not a known field selector: only \"{FIELD_NAME}\", \"{FIELD_NAMESPACE}\"",
                    names::go_quote(&t.field)
                ));
            }
        }
        Ok(selector)
    }

    /// `metadata.name=NAME`, as apimachinery's `fields.OneTermEqualSelector` (the
    /// selector the apiserver gives a request about one name).
    pub fn name(name: &str) -> FieldSelector {
        let escaped = (name.replace('\\', "\\\\"))
            .replace(',', "\\,")
            .replace('=', "\\=");
        FieldSelector {
            text: format!("{FIELD_NAME}={escaped}"),
            terms: vec![FieldTerm {
                field: FIELD_NAME.to_string(),
                value: name.to_string(),
                negate: false,
            }],
        }
    }

    /// Parses `text` as `fields.ParseSelector` does: its syntax only, whatever fields it
    /// names (the apiserver's request-info resolver reads a request's name so, before
    /// the handler checks the fields the kind has).
    pub fn parse_syntax(text: &str) -> Result<FieldSelector, String> {
        let mut parts = split_terms(text);
        parts.sort();
        let mut terms = Vec::new();
        for part in parts.iter().filter(|p| !p.is_empty()) {
            let Some((lhs, op, rhs)) = split_term(part) else {
                return Err(format!(
                    "invalid selector: '{text}'; can't understand '{part}'"
                ));
            };
            terms.push(FieldTerm {
                field: lhs.to_string(),
                value: unescape_value(rhs)?,
                negate: op == "!=",
            });
        }
        Ok(FieldSelector {
            text: text.to_string(),
            terms,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The name it requires (`metadata.name=NAME`), as apimachinery's
    /// `RequiresExactMatch("metadata.name")` reads it for the request's authorization.
    pub fn exact_name(&self) -> Option<&str> {
        (self.terms.iter())
            .find(|t| t.field == FIELD_NAME && !t.negate)
            .map(|t| t.value.as_str())
    }

    /// True when every term holds for an object with this namespace and name.
    pub fn matches(&self, namespace: &str, name: &str) -> bool {
        self.terms.iter().all(|t| {
            let actual = if t.field == FIELD_NAME {
                name
            } else {
                namespace
            };
            (actual == t.value) != t.negate
        })
    }
}

/// Splits on commas that are not escaped with a backslash (the backslash stays).
fn split_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let (mut start, mut in_slash) = (0, false);
    for (i, c) in s.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

fn split_term(term: &str) -> Option<(&str, &str, &str)> {
    for (i, _) in term.char_indices() {
        for op in ["!=", "==", "="] {
            if term[i..].starts_with(op) {
                return Some((&term[..i], op, &term[i + op.len()..]));
            }
        }
    }
    None
}

fn unescape_value(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                ));
            }
            out.push(c);
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' || c == '=' {
            return Err(format!(
                "invalid field selector: unescaped character in value: {c}"
            ));
        } else {
            out.push(c);
        }
    }
    if in_slash {
        return Err("invalid field selector: invalid escape sequence: \\".to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn matches(sel: &str, pairs: &[(&str, &str)]) -> bool {
        let l = labels(pairs);
        LabelSelector::parse(sel)
            .unwrap()
            .matches(|k| l.get(k).map(String::as_str))
    }

    #[test]
    fn parses_the_whole_grammar() {
        type Want<'a> = &'a [(&'a str, Op, &'a [&'a str])];
        let cases: &[(&str, Want)] = &[
            ("", &[]),
            ("a", &[("a", Op::Exists, &[])]),
            ("!a", &[("a", Op::DoesNotExist, &[])]),
            ("a=b", &[("a", Op::Equals, &["b"])]),
            ("a==b", &[("a", Op::DoubleEquals, &["b"])]),
            ("a!=b", &[("a", Op::NotEquals, &["b"])]),
            ("a=", &[("a", Op::Equals, &[""])]),
            ("a = b", &[("a", Op::Equals, &["b"])]),
            ("x in (b,a)", &[("x", Op::In, &["a", "b"])]),
            ("x in ()", &[("x", Op::In, &[""])]),
            ("x notin (a,,b)", &[("x", Op::NotIn, &["", "a", "b"])]),
            ("x in (,a)", &[("x", Op::In, &["", "a"])]),
            ("x in (in)", &[("x", Op::In, &["in"])]),
            ("a>1", &[("a", Op::GreaterThan, &["1"])]),
            ("a<10", &[("a", Op::LessThan, &["10"])]),
            (
                "z,a in (x, y),!b",
                &[
                    ("a", Op::In, &["x", "y"]),
                    ("b", Op::DoesNotExist, &[]),
                    ("z", Op::Exists, &[]),
                ],
            ),
            (
                "\tapp.kubernetes.io/name = web ,\ntier",
                &[
                    ("app.kubernetes.io/name", Op::Equals, &["web"]),
                    ("tier", Op::Exists, &[]),
                ],
            ),
        ];
        for (text, want) in cases {
            let sel = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let got: Vec<_> = sel
                .requirements()
                .iter()
                .map(|r| (r.key.as_str(), r.op, r.values.clone()))
                .collect();
            let want: Vec<_> = want
                .iter()
                .map(|(k, op, v)| (*k, *op, v.iter().map(|s| s.to_string()).collect()))
                .collect();
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn errors_are_the_apiservers() {
        let cases = [
            ("a=b b", "found 'b', expected: ',' or 'end of string'"),
            ("a,", "found '', expected: identifier after ','"),
            ("a,,b", "found ',', expected: identifier after ','"),
            (
                "=a",
                "found '=', expected: !, identifier, or 'end of string'",
            ),
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "x in a",
                "unable to parse requirement: found 'a' expected: '('",
            ),
            (
                "x in (a b)",
                "unable to parse requirement: found 'b', expected: ',' or ')'",
            ),
            (
                "x in (=)",
                "unable to parse requirement: found '=', expected: ',', ')' or identifier",
            ),
            (
                "x in (a",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "a<-1",
                "unable to parse requirement: values[0][a]: Invalid value: \"-1\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            ),
            (
                "a=(",
                "unable to parse requirement: found '(', expected: identifier",
            ),
            (
                "!",
                "unable to parse requirement: found '', expected: identifier",
            ),
            (
                "app:web",
                "unable to parse requirement: <nil>: Invalid value: \"app:web\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            ),
            (
                "a>b",
                "unable to parse requirement: values[0]: Invalid value: \"b\": for 'Gt', 'Lt' operators, the value must be an integer",
            ),
            (
                "a=b:c",
                "unable to parse requirement: values[0][a]: Invalid value: \"b:c\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(LabelSelector::parse(text).unwrap_err(), want, "{text}");
        }
    }

    #[test]
    fn matching_follows_apimachinery() {
        let l = &[("a", "x"), ("n", "5")];
        assert!(matches("a", l));
        assert!(!matches("!a", l));
        assert!(matches("a in (x,y)", l));
        assert!(!matches("b in (x)", l));
        assert!(matches("b notin (x)", l), "notin holds for a missing key");
        assert!(matches("a!=y", l));
        assert!(matches("b!=y", l), "!= holds for a missing key");
        assert!(matches("n>4,n<6", l));
        assert!(!matches("a>1", l), "a non-integer label never compares");
        assert!(matches("", &[]));
        assert!(!matches("a=", l));
        assert!(matches("a=", &[("a", "")]));
    }

    #[test]
    fn nul_is_read_like_go() {
        // Go's lexer reads a NUL as "no character": it ends the input at the start of a
        // token, and only ends the token inside one.
        assert!(
            LabelSelector::parse("\0a")
                .unwrap()
                .requirements()
                .is_empty()
        );
        assert_eq!(
            LabelSelector::parse("a\0b").unwrap_err(),
            LabelSelector::parse("a b").unwrap_err()
        );
    }

    #[test]
    fn field_selectors() {
        let ok = FieldSelector::parse("metadata.name=a,metadata.namespace!=b").unwrap();
        assert!(ok.matches("x", "a"));
        assert!(!ok.matches("b", "a"));
        assert!(!ok.matches("x", "c"));
        assert!(FieldSelector::parse("").unwrap().matches("x", "y"));
        assert!(
            FieldSelector::parse("metadata.name==a\\,b")
                .unwrap()
                .matches("x", "a,b")
        );
        let cases = [
            (
                "data.foo=x",
                "\"data.foo\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
            ),
            ("name", "invalid selector: 'name'; can't understand 'name'"),
            (
                "metadata.name=a=b",
                "invalid field selector: unescaped character in value: =",
            ),
            (
                "metadata.name=a\\x",
                "invalid field selector: invalid escape sequence: \\x",
            ),
            (
                "metadata.name=a\\",
                "invalid field selector: invalid escape sequence: \\",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(FieldSelector::parse(text).unwrap_err(), want, "{text}");
        }
    }

    // ---------------------------------------------------------------------------------
    // apimachinery's own tables, the authority for both cmpoll and the test apiserver
    // (which includes this file): `pkg/labels/selector_test.go` at v0.36.3
    // (github.com/kubernetes/apimachinery), ported as data. Each test names its origin.
    // ---------------------------------------------------------------------------------

    /// `Set` of the Go tests.
    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        labels(pairs)
    }

    fn sel_matches(sel: &LabelSelector, ls: &BTreeMap<String, String>) -> bool {
        sel.matches(|k| ls.get(k).map(String::as_str))
    }

    /// `getRequirement`: a requirement that must construct.
    fn req(key: &str, op: Op, vals: &[&str]) -> Requirement {
        let mut vals: Vec<String> = vals.iter().map(|v| v.to_string()).collect();
        vals.sort();
        vals.dedup();
        new_requirement(key, op.as_str(), vals).unwrap()
    }

    /// upstream TestSelectorParse.
    #[test]
    fn upstream_selector_parse() {
        let good = [
            "x=a,y=b,z=c",
            "",
            "x!=a,y=b",
            "x=",
            "x= ",
            "x=,z= ",
            "x= ,z= ",
            "!x",
            "x>1",
            "x>1,z<5",
        ];
        for text in good {
            let sel = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(sel.canonical(), text.replace(' ', ""), "{text} restring");
        }
        for text in ["x=a||y=b", "x==a==b", "!x=a", "x<a"] {
            assert!(LabelSelector::parse(text).is_err(), "{text}");
        }
    }

    /// upstream TestDeterministicParse.
    #[test]
    fn upstream_deterministic_parse() {
        let a = LabelSelector::parse("x=a,a=x").unwrap();
        let b = LabelSelector::parse("a=x,x=a").unwrap();
        assert_eq!(a.canonical(), b.canonical());
    }

    /// upstream TestEverything, TestSelectorMatches and TestSetMatches (`SelectorFromSet`
    /// is a selector of `key=value` requirements).
    #[test]
    fn upstream_selector_matches() {
        let yes = |text: &str, ls: &[(&str, &str)]| {
            let sel = LabelSelector::parse(text).unwrap();
            assert!(sel_matches(&sel, &set(ls)), "{text} should match {ls:?}");
        };
        let no = |text: &str, ls: &[(&str, &str)]| {
            let sel = LabelSelector::parse(text).unwrap();
            assert!(
                !sel_matches(&sel, &set(ls)),
                "{text} should not match {ls:?}"
            );
        };
        yes("", &[("x", "y")]);
        yes("x=y", &[("x", "y")]);
        yes("x=y,z=w", &[("x", "y"), ("z", "w")]);
        yes("x!=y,z!=w", &[("x", "z"), ("z", "a")]);
        yes("notin=in", &[("notin", "in")]);
        yes("x", &[("x", "z")]);
        yes("!x", &[("y", "z")]);
        yes("x>1", &[("x", "2")]);
        yes("x<1", &[("x", "0")]);
        no("x=z", &[]);
        no("x=y", &[("x", "z")]);
        no("x=y,z=w", &[("x", "w"), ("z", "w")]);
        no("x!=y,z!=w", &[("x", "z"), ("z", "w")]);
        no("x", &[("y", "z")]);
        no("!x", &[("x", "z")]);
        no("x>1", &[("x", "0")]);
        no("x<1", &[("x", "2")]);
        let labelset = [("foo", "bar"), ("baz", "blah")];
        yes("foo=bar", &labelset);
        yes("baz=blah", &labelset);
        yes("foo=bar,baz=blah", &labelset);
        no("foo=blah", &labelset);
        no("baz=bar", &labelset);
        no("foo=bar,foobar=bar,baz=blah", &labelset);
        // TestSetMatches: SelectorFromSet(Set{...}).Matches(labelset).
        for from_set in ["", "foo=bar", "baz=blah", "foo=bar,baz=blah"] {
            yes(from_set, &labelset);
        }
    }

    /// upstream TestLexer.
    #[test]
    fn upstream_lexer() {
        let cases = [
            ("", Token::End),
            (",", Token::Comma),
            ("notin", Token::NotIn),
            ("in", Token::In),
            ("=", Token::Equals),
            ("==", Token::DoubleEquals),
            (">", Token::GreaterThan),
            ("<", Token::LessThan),
            ("!", Token::DoesNotExist),
            ("!=", Token::NotEquals),
            ("(", Token::OpenPar),
            (")", Token::ClosedPar),
            ("~", Token::Identifier),
            ("||", Token::Identifier),
        ];
        for (text, want) in cases {
            let mut l = Lexer {
                s: text.as_bytes(),
                pos: 0,
            };
            let (tok, lit) = l.lex();
            assert_eq!(tok, want, "{text:?}");
            assert_eq!(lit, text, "{text:?}");
        }
    }

    const SEQUENCES: &[(&str, &[Token])] = &[
        (
            "key in ( value )",
            &[
                Token::Identifier,
                Token::In,
                Token::OpenPar,
                Token::Identifier,
                Token::ClosedPar,
            ],
        ),
        (
            "key notin ( value )",
            &[
                Token::Identifier,
                Token::NotIn,
                Token::OpenPar,
                Token::Identifier,
                Token::ClosedPar,
            ],
        ),
        (
            "key in ( value1, value2 )",
            &[
                Token::Identifier,
                Token::In,
                Token::OpenPar,
                Token::Identifier,
                Token::Comma,
                Token::Identifier,
                Token::ClosedPar,
            ],
        ),
        ("key", &[Token::Identifier]),
        ("!key", &[Token::DoesNotExist, Token::Identifier]),
        ("()", &[Token::OpenPar, Token::ClosedPar]),
        (
            "x in (),y",
            &[
                Token::Identifier,
                Token::In,
                Token::OpenPar,
                Token::ClosedPar,
                Token::Comma,
                Token::Identifier,
            ],
        ),
        (
            "== != (), = notin",
            &[
                Token::DoubleEquals,
                Token::NotEquals,
                Token::OpenPar,
                Token::ClosedPar,
                Token::Comma,
                Token::Equals,
                Token::NotIn,
            ],
        ),
        (
            "key>2",
            &[Token::Identifier, Token::GreaterThan, Token::Identifier],
        ),
        (
            "key<1",
            &[Token::Identifier, Token::LessThan, Token::Identifier],
        ),
    ];

    /// upstream TestLexerSequence.
    #[test]
    fn upstream_lexer_sequence() {
        for (text, want) in SEQUENCES {
            let mut l = Lexer {
                s: text.as_bytes(),
                pos: 0,
            };
            let mut got = Vec::new();
            loop {
                let (tok, _) = l.lex();
                if tok == Token::End {
                    break;
                }
                got.push(tok);
            }
            assert_eq!(&got, want, "{text}");
        }
    }

    /// upstream TestParserLookahead (its table is TestLexerSequence's with the end token,
    /// plus "").
    #[test]
    fn upstream_parser_lookahead() {
        let mut cases: Vec<(&str, Vec<Token>)> = SEQUENCES
            .iter()
            .map(|(t, toks)| (*t, toks.iter().copied().chain([Token::End]).collect()))
            .collect();
        cases.push(("", vec![Token::End]));
        for (text, want) in cases {
            let mut p = Parser::new(text);
            assert_eq!(p.items.len(), want.len(), "{text}");
            loop {
                let (tok, lit) = p.lookahead(Context::KeyAndOperator);
                let (tok2, lit2) = p.consume(Context::KeyAndOperator);
                if tok == Token::End {
                    break;
                }
                assert_eq!((tok, lit), (tok2, lit2), "{text}");
            }
        }
    }

    /// upstream TestParseOperator.
    #[test]
    fn upstream_parse_operator() {
        let expected = "in, notin, =, ==, !=, gt, lt";
        for (token, err) in [
            ("in", None),
            ("=", None),
            ("==", None),
            (">", None),
            ("<", None),
            ("notin", None),
            ("!=", None),
            ("!", Some("!")),
            ("exists", Some("exists")),
            ("(", Some("(")),
        ] {
            let got = Parser::new(token).parse_operator();
            match err {
                None => assert!(got.is_ok(), "{token}: {got:?}"),
                Some(found) => assert_eq!(
                    got.unwrap_err(),
                    format!("found '{found}', expected: {expected}"),
                    "{token}"
                ),
            }
        }
    }

    /// upstream TestRequirementConstructor: which constructions fail, and each error's
    /// field, type and bad value (Go's test ignores the detail).
    #[test]
    fn upstream_requirement_constructor() {
        let long = "a".repeat(254);
        let cases: Vec<(&str, &str, Vec<&str>, Option<String>)> = vec![
            (
                "x1",
                "in",
                vec![],
                Some("values: Invalid value: []string{}".into()),
            ),
            (
                "x2",
                "notin",
                vec![],
                Some("values: Invalid value: []string{}".into()),
            ),
            ("x3", "in", vec!["foo"], None),
            ("x4", "notin", vec!["foo"], None),
            (
                "x5",
                "=",
                vec!["bar", "foo"],
                Some(r#"values: Invalid value: []string{"bar", "foo"}"#.into()),
            ),
            ("x6", "exists", vec![], None),
            ("x7", "!", vec![], None),
            (
                "x8",
                "exists",
                vec!["foo"],
                Some(r#"values: Invalid value: []string{"foo"}"#.into()),
            ),
            ("x9", "in", vec!["bar"], None),
            ("x10", "in", vec!["bar"], None),
            ("x11", "gt", vec!["1"], None),
            ("x12", "lt", vec!["6"], None),
            (
                "x13",
                "gt",
                vec![],
                Some("values: Invalid value: []string{}".into()),
            ),
            (
                "x14",
                "gt",
                vec!["bar"],
                Some(r#"values[0]: Invalid value: "bar""#.into()),
            ),
            (
                "x15",
                "lt",
                vec!["bar"],
                Some(r#"values[0]: Invalid value: "bar""#.into()),
            ),
            (
                &long,
                "exists",
                vec![],
                Some(format!(r#"key: Invalid value: "{long}""#)),
            ),
            (
                "x16",
                "=",
                vec![&long],
                Some(format!(r#"values[0][x16]: Invalid value: "{long}""#)),
            ),
            (
                "x17",
                "=",
                vec!["a b"],
                Some(r#"values[0][x17]: Invalid value: "a b""#.into()),
            ),
            (
                "x18",
                "unsupportedOp",
                vec![],
                Some(r#"operator: Unsupported value: "unsupportedOp""#.into()),
            ),
        ];
        for (key, op, vals, want) in cases {
            let vals: Vec<String> = vals.iter().map(|v| v.to_string()).collect();
            let got = new_requirement(key, op, vals);
            match want {
                None => assert!(got.is_ok(), "{key}: {got:?}"),
                Some(prefix) => {
                    let e = got.unwrap_err();
                    assert!(e.starts_with(&format!("{prefix}: ")), "{key}: {e}");
                    assert!(!e.starts_with('['), "{key}: one error: {e}");
                }
            }
        }
    }

    /// upstream TestToString. `None` is Go's zero `Requirement`, which prints as nothing.
    #[test]
    fn upstream_to_string() {
        let show = |reqs: &[Option<Requirement>]| -> String {
            let parts: Vec<String> = reqs
                .iter()
                .map(|r| r.as_ref().map(|r| r.to_string()).unwrap_or_default())
                .collect();
            parts.join(",")
        };
        let cases: Vec<(Vec<Option<Requirement>>, &str)> = vec![
            (
                vec![
                    Some(req("x", Op::In, &["abc", "def"])),
                    Some(req("y", Op::NotIn, &["jkl"])),
                    Some(req("z", Op::Exists, &[])),
                ],
                "x in (abc,def),y notin (jkl),z",
            ),
            (
                vec![
                    Some(req("x", Op::NotIn, &["abc", "def"])),
                    Some(req("y", Op::NotEquals, &["jkl"])),
                    Some(req("z", Op::DoesNotExist, &[])),
                ],
                "x notin (abc,def),y!=jkl,!z",
            ),
            (
                vec![Some(req("x", Op::In, &["abc", "def"])), None],
                "x in (abc,def),",
            ),
            (
                vec![
                    Some(req("x", Op::NotIn, &["abc"])),
                    Some(req("y", Op::In, &["jkl", "mno"])),
                    Some(req("z", Op::NotIn, &[""])),
                ],
                "x notin (abc),y in (jkl,mno),z notin ()",
            ),
            (
                vec![
                    Some(req("x", Op::Equals, &["abc"])),
                    Some(req("y", Op::DoubleEquals, &["jkl"])),
                    Some(req("z", Op::NotEquals, &["a"])),
                    Some(req("z", Op::Exists, &[])),
                ],
                "x=abc,y==jkl,z!=a,z",
            ),
            (
                vec![
                    Some(req("x", Op::GreaterThan, &["2"])),
                    Some(req("y", Op::LessThan, &["8"])),
                    Some(req("z", Op::Exists, &[])),
                ],
                "x>2,y<8,z",
            ),
        ];
        for (reqs, want) in cases {
            assert_eq!(show(&reqs), want);
        }
    }

    /// upstream TestRequirementSelectorMatching. `None` is Go's zero `Requirement`, which
    /// matches nothing.
    #[test]
    fn upstream_requirement_selector_matching() {
        /// (labels, requirements, whether they match)
        type Case<'a> = (&'a [(&'a str, &'a str)], Vec<Option<Requirement>>, bool);
        let cases: Vec<Case> = vec![
            (&[("x", "foo"), ("y", "baz")], vec![None], false),
            (
                &[("x", "foo"), ("y", "baz")],
                vec![
                    Some(req("x", Op::In, &["foo"])),
                    Some(req("y", Op::NotIn, &["alpha"])),
                ],
                true,
            ),
            (
                &[("x", "foo"), ("y", "baz")],
                vec![
                    Some(req("x", Op::In, &["foo"])),
                    Some(req("y", Op::In, &["alpha"])),
                ],
                false,
            ),
            (
                &[("y", "")],
                vec![
                    Some(req("x", Op::NotIn, &[""])),
                    Some(req("y", Op::Exists, &[])),
                ],
                true,
            ),
            (
                &[("y", "")],
                vec![
                    Some(req("x", Op::DoesNotExist, &[])),
                    Some(req("y", Op::Exists, &[])),
                ],
                true,
            ),
            (
                &[("y", "")],
                vec![
                    Some(req("x", Op::NotIn, &[""])),
                    Some(req("y", Op::DoesNotExist, &[])),
                ],
                false,
            ),
            (&[("y", "baz")], vec![Some(req("x", Op::In, &[""]))], false),
            (
                &[("z", "2")],
                vec![Some(req("z", Op::GreaterThan, &["1"]))],
                true,
            ),
            (
                &[("z", "v2")],
                vec![Some(req("z", Op::GreaterThan, &["1"]))],
                false,
            ),
        ];
        for (ls, reqs, want) in cases {
            let ls = set(ls);
            let got = reqs.iter().all(|r| match r {
                Some(r) => r.matches(&|k| ls.get(k).map(String::as_str)),
                None => false,
            });
            assert_eq!(got, want, "{reqs:?} on {ls:?}");
        }
    }

    /// upstream TestSetSelectorParser: (input, expected requirements, compare them, valid).
    #[test]
    fn upstream_set_selector_parser() {
        type Case = (&'static str, Vec<Requirement>, bool, bool);
        let cases: Vec<Case> = vec![
            ("", vec![], true, true),
            ("\rx", vec![req("x", Op::Exists, &[])], true, true),
            (
                "this-is-a-dns.domain.com/key-with-dash",
                vec![req(
                    "this-is-a-dns.domain.com/key-with-dash",
                    Op::Exists,
                    &[],
                )],
                true,
                true,
            ),
            (
                "this-is-another-dns.domain.com/key-with-dash in (so,what)",
                vec![req(
                    "this-is-another-dns.domain.com/key-with-dash",
                    Op::In,
                    &["so", "what"],
                )],
                true,
                true,
            ),
            (
                "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
                vec![req(
                    "0.1.2.domain/99",
                    Op::NotIn,
                    &["10.10.100.1", "tick.tack.clock"],
                )],
                true,
                true,
            ),
            (
                "foo  in\t (abc)",
                vec![req("foo", Op::In, &["abc"])],
                true,
                true,
            ),
            (
                "x notin\n (abc)",
                vec![req("x", Op::NotIn, &["abc"])],
                true,
                true,
            ),
            (
                "x  notin\t\t\t(abc,def)",
                vec![req("x", Op::NotIn, &["abc", "def"])],
                true,
                true,
            ),
            (
                "x in (abc,def)",
                vec![req("x", Op::In, &["abc", "def"])],
                true,
                true,
            ),
            (
                "x in (abc,)",
                vec![req("x", Op::In, &["abc", ""])],
                true,
                true,
            ),
            (
                "x in (abc,abc)",
                vec![req("x", Op::In, &["abc"])],
                true,
                true,
            ),
            ("x in ()", vec![req("x", Op::In, &[""])], true, true),
            ("x in (a,,)", vec![req("x", Op::In, &["a", ""])], true, true),
            (
                "x in (a,,,)",
                vec![req("x", Op::In, &["a", ""])],
                true,
                true,
            ),
            (
                "x in (a,,,,,,)",
                vec![req("x", Op::In, &["a", ""])],
                true,
                true,
            ),
            (
                "x in (a,,a,,a,,a,,)",
                vec![req("x", Op::In, &["a", ""])],
                true,
                true,
            ),
            (
                "x notin (abc,,def),bar,z in (),w",
                vec![
                    req("bar", Op::Exists, &[]),
                    req("w", Op::Exists, &[]),
                    req("x", Op::NotIn, &["abc", "", "def"]),
                    req("z", Op::In, &[""]),
                ],
                true,
                true,
            ),
            (
                "x,y in (a)",
                vec![req("y", Op::In, &["a"]), req("x", Op::Exists, &[])],
                false,
                true,
            ),
            ("x=a", vec![req("x", Op::Equals, &["a"])], true, true),
            ("x>1", vec![req("x", Op::GreaterThan, &["1"])], true, true),
            ("x<7", vec![req("x", Op::LessThan, &["7"])], true, true),
            (
                "x=a,y!=b",
                vec![
                    req("x", Op::Equals, &["a"]),
                    req("y", Op::NotEquals, &["b"]),
                ],
                true,
                true,
            ),
            (
                "x=a,y!=b,z in (h,i,j)",
                vec![
                    req("x", Op::Equals, &["a"]),
                    req("y", Op::NotEquals, &["b"]),
                    req("z", Op::In, &["h", "i", "j"]),
                ],
                true,
                true,
            ),
            ("x=a||y=b", vec![], false, false),
            ("x,,y", vec![], true, false),
            (",x,y", vec![], true, false),
            ("x nott in (y)", vec![], true, false),
            ("x notin ( )", vec![req("x", Op::NotIn, &[""])], true, true),
            (
                "x notin (, a)",
                vec![req("x", Op::NotIn, &["", "a"])],
                true,
                true,
            ),
            ("a in (xyz),", vec![], true, false),
            ("a in (xyz)b notin ()", vec![], true, false),
            ("a ", vec![req("a", Op::Exists, &[])], true, true),
            (
                "a in (x,y,notin, z,in)",
                vec![req("a", Op::In, &["in", "notin", "x", "y", "z"])],
                true,
                true,
            ),
            ("a in (xyz abc)", vec![], false, false),
            ("a notin(", vec![], true, false),
            ("a (", vec![], false, false),
            ("(", vec![], false, false),
        ];
        for (text, want, compare, valid) in cases {
            match LabelSelector::parse(text) {
                Err(e) => assert!(!valid, "{text:?}: {e}"),
                Ok(sel) => {
                    assert!(valid, "{text:?} should not parse");
                    if compare {
                        assert_eq!(sel.requirements(), &want[..], "{text:?}");
                    }
                }
            }
        }
    }
}
