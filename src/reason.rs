//! Why a module is kept from the agent. It is **rejected** (`Rejection`: by the validator, a
//! failed `.url` fetch, a sink's refusal such as a `flat` name clash, or the agent's answer
//! to `--confirm`) or **unwritten** (`Unwritten`: a sink could not write it). A reason is
//! at most `MAX_REASON` bytes, cut on a character boundary with a mark where text was left
//! out (`cut`, which other bounded messages use too); a Kubernetes Secret's module shows
//! only the validator's exit status, never its output, which may quote the Secret
//! (`redacted`).

use std::borrow::Cow;

/// A module kept from the agent as it is, and why (the `rejected` event's `reason`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub module: String,
    pub reason: String,
}

impl Rejection {
    pub fn new(module: impl Into<String>, reason: impl Into<String>) -> Rejection {
        Rejection {
            module: module.into(),
            reason: reason.into(),
        }
    }
}

/// A module a sink could not write, and the sink's error (it keeps its previous version and
/// is tried again at the next poll).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unwritten {
    pub module: String,
    pub error: String,
}

impl Unwritten {
    pub fn new(module: impl Into<String>, error: impl ToString) -> Unwritten {
        Unwritten {
            module: module.into(),
            error: error.to_string(),
        }
    }
}

/// The most bytes of a `rejected` event's reason (SPEC: "at most 4 KiB in all").
pub const MAX_REASON: usize = 4096;

/// The cut that marks where text was left out.
const ELLIPSIS: &str = "…";

/// `text` in at most `max` bytes: as it is when it fits, else cut on a character boundary
/// and ended with `…` (the mark counted in `max`).
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mark = if max >= ELLIPSIS.len() { ELLIPSIS } else { "" };
    let mut end = max - mark.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{mark}", &text[..end]))
}

/// `text` as a log line or a terminal may take it from someone else: each control
/// character (a newline that would forge a line, an escape that would start a colour) and
/// each bidirectional override written as its Rust escape (`\n`, `\u{1b}`), the rest as
/// it is.
pub fn printable(text: &str) -> Cow<'_, str> {
    let hidden = |c: char| {
        c.is_control()
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
    };
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match hidden(c) {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `printable(text)`, then `cut` to `max` bytes.
pub fn shown(text: &str, max: usize) -> String {
    cut(&printable(text), max).into_owned()
}

/// A rejection's reason as a Secret's may be shown (a `Rejected` Event's note, `/status`,
/// a stdout event, a log line): the validator's exit status (the last line of a
/// validator's reason, `(validator exited with status 1)`), never its output, which may
/// quote the Secret; nor the agent's words on a module it refused (`--confirm`,
/// `REFUSED`). A reason that is not a validator's (a name clash names keys and modules
/// only) is kept.
pub fn redacted(reason: &str) -> String {
    if reason.starts_with(REFUSED) {
        return format!("{REFUSED}(a Secret's agent output is not shown)");
    }
    let last = reason.lines().last().unwrap_or("");
    if let Some(status) = last
        .strip_prefix("(validator ")
        .and_then(|s| s.strip_suffix(')'))
    {
        return format!("validator {status}");
    }
    if let Some(rest) = reason.strip_prefix("validator cannot run: ") {
        let status = rest.split(": ").next().unwrap_or(rest);
        return format!("validator cannot run: {status}");
    }
    if reason.starts_with("validator ") && !reason.contains('\n') {
        return reason.to_string();
    }
    if reason.contains("validator") || reason.contains('\n') {
        return "rejected by --validate (a Secret's validator output is not shown)".into();
    }
    reason.to_string()
}

/// How the reason of a module the agent refused after delivery (`--confirm`) begins.
pub const REFUSED: &str = "refused by the agent: ";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_refusal_of_a_secret_is_not_shown() {
        assert_eq!(
            redacted("refused by the agent: password=hunter2 is not valid"),
            "refused by the agent: (a Secret's agent output is not shown)"
        );
    }

    #[test]
    fn printable_escapes_what_would_forge_a_line_or_colour_a_terminal() {
        assert_eq!(printable("plain: ünïcode"), "plain: ünïcode");
        assert_eq!(
            printable("a\nb\r\u{1b}[31mc\u{202e}d\te"),
            "a\\nb\\r\\u{1b}[31mc\\u{202e}d\\te"
        );
        assert_eq!(shown("ab\ncd", 6), "ab\\ncd");
        assert_eq!(shown("ab\ncd", 5), "ab…");
    }

    #[test]
    fn cut_keeps_what_fits_and_cuts_on_a_character_boundary() {
        for (text, max, want) in [
            ("short", 10, "short"),
            ("exactly", 7, "exactly"),
            ("abcdefgh", 7, "abcd…"),
            ("aééé", 6, "aé…"),
            ("aéééé", 8, "aéé…"),
            ("aéééé", 7, "aé…"),
            ("éé", 2, "é"),
            ("éé", 1, ""),
        ] {
            let got = cut(text, max);
            assert_eq!(got, want, "{text:?} in {max}");
            assert!(got.len() <= max);
        }
    }
}
