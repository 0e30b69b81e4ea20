//! Signal names and numbers: `HUP`, `SIGHUP`, `hup` and `1` are the same signal.

use std::fmt;
use std::io;
use std::str::FromStr;
use std::thread;

use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};

/// A Linux signal number with its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal(pub i32);

const NAMES: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ABRT", 6),
    ("KILL", 9),
    ("USR1", 10),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("CHLD", 17),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("WINCH", 28),
];

impl Signal {
    pub const HUP: Signal = Signal(1);
    pub const INT: Signal = Signal(2);
    pub const KILL: Signal = Signal(9);
    pub const TERM: Signal = Signal(15);
    pub const CHLD: Signal = Signal(17);

    pub fn name(self) -> Option<&'static str> {
        NAMES.iter().find(|(_, n)| *n == self.0).map(|(s, _)| *s)
    }

    /// The signal as rustix sends it (`None` for real-time signals, which cmpoll does not
    /// send).
    pub fn to_rustix(self) -> Option<rustix::process::Signal> {
        rustix::process::Signal::from_named_raw(self.0)
    }
}

impl FromStr for Signal {
    type Err = String;

    fn from_str(s: &str) -> Result<Signal, String> {
        let t = s.trim();
        if let Ok(n) = t.parse::<i32>() {
            return if (1..=64).contains(&n) {
                Ok(Signal(n))
            } else {
                Err(format!("'{s}' is not a signal number (1-64)"))
            };
        }
        let upper = t.to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, num)| Signal(*num))
            .ok_or_else(|| {
                format!("unknown signal '{s}' (use a name like HUP or USR1, or a number)")
            })
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "SIG{n}"),
            None => write!(f, "signal {}", self.0),
        }
    }
}

/// Forwards SIGTERM, SIGINT, SIGHUP and SIGCHLD to `on_signal` from a background thread
/// (nothing runs in the signal handler itself). A second SIGTERM or SIGINT calls `on_abort`
/// and exits at once, status 1: the operator insists.
pub fn forward(
    on_signal: impl Fn(Signal) + Send + 'static,
    on_abort: impl Fn() + Send + 'static,
) -> io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGCHLD])?;
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stops = 0;
            for sig in signals.forever() {
                if sig == SIGTERM || sig == SIGINT {
                    stops += 1;
                    if stops > 1 {
                        log::warn!("{}: stopping at once", Signal(sig));
                        on_abort();
                        std::process::exit(1);
                    }
                }
                on_signal(Signal(sig));
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        for (input, want) in [
            ("HUP", 1),
            ("SIGHUP", 1),
            ("hup", 1),
            ("1", 1),
            ("USR1", 10),
            ("sigterm", 15),
            ("34", 34),
        ] {
            assert_eq!(input.parse::<Signal>(), Ok(Signal(want)), "{input}");
        }
        for bad in ["", "0", "65", "BOGUS", "SIG"] {
            assert!(bad.parse::<Signal>().is_err(), "{bad}");
        }
        assert_eq!(Signal::HUP.to_string(), "SIGHUP");
        assert_eq!(Signal(40).to_string(), "signal 40");
    }
}
