//! Label and field selectors with the apiserver's grammar, semantics and error texts.
//!
//! `LabelSelector::parse` is a port of apimachinery's `labels.Parse` (lexer, parser and
//! `NewRequirement` validation), so a selector cmpoll accepts is one the apiserver accepts,
//! and a bad one is refused locally with the very message the apiserver would have sent.
//! `FieldSelector::parse` is `fields.ParseSelector` plus the ConfigMap field-label check
//! (only `metadata.name` and `metadata.namespace`). Both also match objects locally, for
//! `--manifests` and for checking what an apiserver returned. Depends only on
//! `crate::validation`, so the test apiserver can include this file by path.

use crate::validation;

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
            return new_requirement(key, op, Vec::new());
        }
        let op = self.parse_operator()?;
        let values = match op {
            Op::In | Op::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(key, op, values)
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
        let errs = validation::qualified_name(&lit);
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
                        self.consume(Context::Values);
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
        validation::go_quote(value),
        errs.join("; ")
    )
}

/// `NewRequirement`: the checks the parser's output can still fail, aggregated as Go does.
fn new_requirement(key: String, op: Op, values: Vec<String>) -> Result<Requirement, String> {
    let mut errs: Vec<String> = Vec::new();
    if matches!(op, Op::GreaterThan | Op::LessThan) {
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
    for (i, v) in values.iter().enumerate() {
        let v_errs = validation::label_value(v);
        if !v_errs.is_empty() {
            errs.push(invalid(&format!("values[{i}][{key}]"), v, &v_errs));
        }
    }
    errs.dedup();
    match errs.len() {
        0 => Ok(Requirement { key, op, values }),
        1 => Err(errs.remove(0)),
        _ => Err(format!("[{}]", errs.join(", "))),
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
        for t in &terms {
            if t.field != FIELD_NAME && t.field != FIELD_NAMESPACE {
                return Err(format!(
                    "{} is not a known field selector: only \"{FIELD_NAME}\", \"{FIELD_NAMESPACE}\"",
                    validation::go_quote(&t.field)
                ));
            }
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
}
