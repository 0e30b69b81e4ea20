//! A rollout's steps and a client's cohort (issue 60; /work's contract, docs/serve.md
//! "Rolling out a change"): `Steps`, what `--rollout` and the `cmpoll.io/rollout`
//! annotation say (`1%,10%,50%,100%`, or `none`), parsed strictly and refused with a reason
//! that quotes a bounded piece of what was written; `cohort`, where a client's name falls in
//! [0, 1); `Settings`, the flags as settings decided them. Nothing here serves or decides a
//! step: the rollout's own rooms do.

use std::fmt;
use std::time::Duration;

/// The annotation on a selected object whose value (`Steps`' grammar) overrides `--rollout`.
pub const ANNOTATION: &str = "cmpoll.io/rollout";

/// Steps at most.
pub const MAX_STEPS: usize = 10;

/// What is read of a value at most: ten steps of `100.000%` with room for spaces. A longer
/// value is refused before it is split.
const MAX_LEN: usize = 256;

/// Characters of the input a message quotes at most.
const QUOTED: usize = 24;

/// A step's percentage in thousandths of a percent: 100% is this.
const WHOLE: u32 = 100_000;

/// A rollout's steps: fractions of the fleet in (0, 1], strictly increasing, the last 1.0;
/// none (`none`: every version to every client at once) when empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Steps {
    /// Each step in thousandths of a percent (`1.5%` is 1500): exact, for `Display`.
    milli: Vec<u32>,
    /// The same as fractions of 1.
    fractions: Vec<f64>,
}

impl Steps {
    /// No steps: every version goes to every client at once.
    pub fn none() -> Steps {
        Steps::default()
    }

    /// `1%,10%,50%,100%` (each `N%` or `N.NNN%`, at most 3 decimals, strictly increasing,
    /// the last exactly `100%`, at most `MAX_STEPS`; spaces around each allowed), or
    /// `none`. The error says why, quoting at most a bounded piece of `s`.
    pub fn parse(s: &str) -> Result<Steps, String> {
        if s.len() > MAX_LEN {
            return Err(format!(
                "too long ({} bytes, at most {MAX_LEN}): {}",
                s.len(),
                EXAMPLE
            ));
        }
        let t = s.trim();
        if t.is_empty() {
            return Err(format!("empty: {EXAMPLE}"));
        }
        if t == "none" {
            return Ok(Steps::none());
        }
        let items: Vec<&str> = t.split(',').map(str::trim).collect();
        if items.len() > MAX_STEPS {
            return Err(format!(
                "{} steps: at most {MAX_STEPS} ({EXAMPLE})",
                items.len()
            ));
        }
        let mut milli: Vec<u32> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let m = step(item).map_err(|e| format!("step {}: {e}", i + 1))?;
            if let Some(&before) = milli.last()
                && m <= before
            {
                return Err(format!(
                    "step {}: {} is not above {} (steps are strictly increasing)",
                    i + 1,
                    Percent(m),
                    Percent(before)
                ));
            }
            milli.push(m);
        }
        if milli.last() != Some(&WHOLE) {
            return Err(format!(
                "the last step is {}, not 100% (every rollout ends with the whole fleet)",
                Percent(milli.last().map_or(0, |m| *m))
            ));
        }
        let fractions = milli
            .iter()
            .map(|m| f64::from(*m) / f64::from(WHOLE))
            .collect();
        Ok(Steps { milli, fractions })
    }

    /// No rollout: every version to every client at once.
    pub fn is_none(&self) -> bool {
        self.milli.is_empty()
    }

    /// The steps as fractions of the fleet, in (0, 1], strictly increasing, the last 1.0.
    pub fn fractions(&self) -> &[f64] {
        &self.fractions
    }
}

/// What a message suggests.
const EXAMPLE: &str = "give steps like 1%,10%,50%,100% or none";

/// One item, trimmed: `N%` or `N.NNN%` with 1 to 3 digits before the point and 1 to 3
/// after it, in (0%, 100%]; in thousandths of a percent.
fn step(item: &str) -> Result<u32, String> {
    if item.is_empty() {
        return Err(format!("empty ({EXAMPLE})"));
    }
    let not = || format!("{} is not N% or N.NNN% (e.g. 1%, 0.5%)", quote(item));
    let number = item.strip_suffix('%').ok_or_else(not)?;
    let (whole, decimals) = match number.split_once('.') {
        Some((w, d)) => (w, d),
        None => (number, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let point = number.contains('.');
    if whole.is_empty() || whole.len() > 3 || !digits(whole) || !digits(decimals) {
        return Err(not());
    }
    if point && decimals.is_empty() {
        return Err(not());
    }
    if decimals.len() > 3 {
        return Err(format!("{}: at most 3 decimals", quote(item)));
    }
    // At most 3 + 3 digits: no overflow.
    let mut m: u32 = 0;
    for b in whole.bytes() {
        m = m * 10 + u32::from(b - b'0');
    }
    let mut scale = 1000;
    for b in decimals.bytes() {
        scale /= 10;
        m = m * 10 + u32::from(b - b'0');
    }
    let m = m * scale;
    if m == 0 || m > WHOLE {
        return Err(format!(
            "{} is not in (0%, 100%]: a step is more than none of the fleet and at most all of it",
            quote(item)
        ));
    }
    Ok(m)
}

/// `s` in quotes, cut to `QUOTED` characters, control characters escaped: what a message
/// shows of a value it refuses, whatever its length or bytes.
fn quote(s: &str) -> String {
    let mut q: String = s
        .chars()
        .take(QUOTED)
        .flat_map(char::escape_debug)
        .collect();
    if s.chars().nth(QUOTED).is_some() {
        q.push('…');
    }
    format!("'{q}'")
}

/// A step in thousandths of a percent, written back: `1%`, `0.5%`, `12.345%`.
struct Percent(u32);

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, rest) = (self.0 / 1000, self.0 % 1000);
        if rest == 0 {
            return write!(f, "{whole}%");
        }
        let decimals = format!("{rest:03}");
        write!(f, "{whole}.{}%", decimals.trim_end_matches('0'))
    }
}

impl fmt::Display for Steps {
    /// `1%,10%,50%,100%`, or `none`: what `parse` reads back to the same steps.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            return f.write_str("none");
        }
        for (i, m) in self.milli.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}", Percent(*m))?;
        }
        Ok(())
    }
}

/// `--rollout`, `--rollout-wait` and `--rollout-state` as settings decided them.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `--rollout`: the hub's steps (`none`: only an object's annotation asks for any).
    pub steps: Steps,
    /// `--rollout-wait`: the least time each step is held before the next.
    pub wait: Duration,
    /// `--rollout-state`: the Secret holding the rollouts' state.
    pub state_namespace: String,
    pub state_name: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn steps_parse_and_print_back() {
        for (written, fractions, printed) in [
            (
                "1%,10%,50%,100%",
                &[0.01, 0.1, 0.5, 1.0][..],
                "1%,10%,50%,100%",
            ),
            (
                " 0.5% , 2.25%,\t100.000% ",
                &[0.005, 0.0225, 1.0],
                "0.5%,2.25%,100%",
            ),
            ("100%", &[1.0], "100%"),
            ("0.001%,100%", &[0.00001, 1.0], "0.001%,100%"),
            (
                "12.345%,99.999%,100%",
                &[0.12345, 0.99999, 1.0],
                "12.345%,99.999%,100%",
            ),
            ("05%,100%", &[0.05, 1.0], "5%,100%"),
            (
                "1%,2%,3%,4%,5%,6%,7%,8%,9%,100%",
                &[0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 1.0],
                "1%,2%,3%,4%,5%,6%,7%,8%,9%,100%",
            ),
        ] {
            let s = Steps::parse(written).unwrap();
            assert_eq!(s.fractions(), fractions, "{written}");
            assert_eq!(s.fractions().len(), fractions.len());
            assert!(!s.is_none());
            assert_eq!(s.to_string(), printed);
            assert_eq!(Steps::parse(printed).unwrap(), s, "reads back");
        }
        assert_eq!(
            *Steps::parse("100%").unwrap().fractions().last().unwrap(),
            1.0
        );
    }

    #[test]
    fn none_is_no_steps() {
        for written in ["none", "  none\n"] {
            let s = Steps::parse(written).unwrap();
            assert!(s.is_none());
            assert!(s.fractions().is_empty());
            assert_eq!(s.to_string(), "none");
        }
        assert_eq!(Steps::none(), Steps::parse("none").unwrap());
    }

    #[test]
    fn what_is_refused_and_why() {
        for (written, says) in [
            ("", "empty"),
            ("  ", "empty"),
            ("None", "'None' is not N%"),
            ("1%,,100%", "step 2: empty"),
            ("1%,100%,", "step 3: empty"),
            ("0%,100%", "step 1: '0%' is not in (0%, 100%]"),
            ("0.000%,100%", "'0.000%' is not in (0%, 100%]"),
            ("150%", "'150%' is not in (0%, 100%]"),
            ("100.001%", "is not in (0%, 100%]"),
            ("-1%,100%", "'-1%' is not N%"),
            ("+1%,100%", "'+1%' is not N%"),
            ("1e3%", "'1e3%' is not N%"),
            ("NaN%", "'NaN%' is not N%"),
            ("inf%", "'inf%' is not N%"),
            ("1", "'1' is not N%"),
            ("1 %,100%", "'1 %' is not N%"),
            ("1.%,100%", "'1.%' is not N%"),
            (".5%,100%", "'.5%' is not N%"),
            ("1.2.3%,100%", "'1.2.3%' is not N%"),
            ("1000%", "'1000%' is not N%"),
            ("１%,100%", "is not N%"),
            ("0.0001%,100%", "'0.0001%': at most 3 decimals"),
            ("10%,10%,100%", "step 2: 10% is not above 10%"),
            ("50%,10%,100%", "step 2: 10% is not above 50%"),
            ("100%,100%", "step 2: 100% is not above 100%"),
            ("1%,50%", "the last step is 50%, not 100%"),
            (
                "1%,2%,3%,4%,5%,6%,7%,8%,9%,10%,100%",
                "11 steps: at most 10",
            ),
            ("none,100%", "'none' is not N%"),
        ] {
            let e = Steps::parse(written).unwrap_err();
            assert!(e.contains(says), "{written:?}: {e}");
        }
    }

    /// However long or strange the input, the reason is short and shows no raw control
    /// character.
    #[test]
    fn hostile_input_gets_a_bounded_reason() {
        let long = "9".repeat(1 << 20);
        let e = Steps::parse(&long).unwrap_err();
        assert!(e.starts_with("too long (1048576 bytes"), "{e}");
        assert!(e.len() < 100, "{e}");
        let item = format!("{}%,100%", "x".repeat(200));
        let e = Steps::parse(&item).unwrap_err();
        assert!(e.contains(&format!("'{}…'", "x".repeat(24))), "{e}");
        assert!(e.len() < 100, "{e}");
        let e = Steps::parse("\u{1b}[31mred\n%,100%").unwrap_err();
        assert!(!e.contains('\u{1b}') && !e.contains('\n'), "{e}");
        assert!(e.contains("\\u{1b}[31mred\\n"), "{e}");
        let e = Steps::parse(&",".repeat(200)).unwrap_err();
        assert!(e.starts_with("201 steps: at most 10"), "{e}");
        // A cut inside a multi-byte character is no panic.
        let e = Steps::parse(&"é".repeat(100)).unwrap_err();
        assert!(e.contains('…'), "{e}");
    }
}
