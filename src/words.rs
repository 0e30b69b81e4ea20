//! The words a flag takes for an enum (`--restart on-failure`): each type lists its words
//! once, and parsing, messages and descriptions all read that list, so a value is printed
//! as it is typed (never as its Rust name).

/// An enum spelled on the command line. The first word of a value is its name; later ones
/// are accepted aliases.
pub trait Words: Copy + PartialEq + 'static {
    const WORDS: &'static [(&'static str, Self)];
    /// Whether `INFO` is taken for `info`.
    const IGNORE_CASE: bool = false;

    /// The value's word, as a user types it.
    fn word(self) -> &'static str {
        Self::WORDS
            .iter()
            .find(|(_, v)| *v == self)
            .map(|(w, _)| *w)
            .unwrap_or("?")
    }

    /// The value `word` names, if any.
    fn from_word(word: &str) -> Option<Self> {
        let word = word.trim();
        Self::WORDS
            .iter()
            .find(|(w, _)| *w == word || (Self::IGNORE_CASE && w.eq_ignore_ascii_case(word)))
            .map(|(_, v)| *v)
    }

    /// `files, concat, flat`: the names, without aliases, for messages.
    fn names() -> String {
        let mut out: Vec<&str> = Vec::new();
        for (w, v) in Self::WORDS {
            if !Self::WORDS.iter().any(|(o, ov)| ov == v && out.contains(o)) {
                out.push(w);
            }
        }
        out.join(", ")
    }
}

impl Words for log::LevelFilter {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("error", log::LevelFilter::Error),
        ("warn", log::LevelFilter::Warn),
        ("info", log::LevelFilter::Info),
        ("debug", log::LevelFilter::Debug),
        ("trace", log::LevelFilter::Trace),
    ];
    const IGNORE_CASE: bool = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Kind {
        A,
        B,
    }

    impl Words for Kind {
        const WORDS: &'static [(&'static str, Self)] =
            &[("a-word", Kind::A), ("b", Kind::B), ("alias-of-a", Kind::A)];
    }

    #[test]
    fn words_and_aliases() {
        assert_eq!(Kind::A.word(), "a-word");
        assert_eq!(Kind::from_word(" alias-of-a "), Some(Kind::A));
        assert_eq!(Kind::from_word("A-WORD"), None);
        assert_eq!(Kind::names(), "a-word, b");
        assert_eq!(
            log::LevelFilter::from_word("DEBUG"),
            Some(log::LevelFilter::Debug)
        );
    }
}
