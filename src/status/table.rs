//! `cmpoll status`'s table: the answer as kubectl prints objects, left-aligned columns
//! three spaces apart, one line per sink and per module.

use super::answer::{Counts, State, StatusReport, first_line};
use crate::ops::health::thousands;

impl StatusReport {
    /// The kubectl-like table `cmpoll status` prints.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out += &format!("cmpoll {}: {}\n", self.version, self.source);
        out += &format!("selector: {}", self.selector);
        if let Some(i) = &self.interval {
            out += &format!(", every {i}");
        }
        out += "\n";
        match &self.last_poll {
            Some(p) => {
                out += &format!(
                    "last poll: #{} at {}, {} in {:.3}s",
                    p.number, p.time, p.result, p.duration_seconds
                );
                if let Some(e) = &p.error {
                    out += &format!(": {e}");
                }
                out += "\n";
            }
            None if self.interval.is_some() => out += "last poll: none finished yet\n",
            None => {}
        }
        if let Some(t) = &self.last_success {
            out += &format!("last successful poll: {t}\n");
        }
        out += &format!(
            "ready: {}\n",
            match &self.not_ready {
                None if self.ready => "yes".to_string(),
                None => "no".to_string(),
                Some(why) => format!("no ({why})"),
            }
        );
        let counts = self.counts.unwrap_or_else(|| Counts::of(&self.modules));
        out += &format!(
            "modules: {} ({} delivered, {} rejected, {} not written)\n",
            thousands(counts.total()),
            thousands(counts.delivered),
            thousands(counts.rejected),
            thousands(counts.unwritten)
        );
        if !self.sinks.is_empty() {
            out += "\n";
            let mut rows = vec![[
                "SINK".to_string(),
                "LAST DELIVERY".into(),
                "POLL".into(),
                "CHANGES".into(),
                "RELOAD".into(),
            ]];
            for s in &self.sinks {
                let (time, poll, changes) = match &s.last_delivery {
                    Some(d) => (
                        d.time.clone(),
                        d.poll.to_string(),
                        match d.unwritten {
                            0 => d.changes.to_string(),
                            n => format!("{} ({n} not written)", d.changes),
                        },
                    ),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                let reload = match s.reloads.as_slice() {
                    [] => "-".to_string(),
                    all => (all.iter())
                        .map(|r| match &r.error {
                            None => format!("{} ok", r.path),
                            Some(e) => format!("{} failed: {}", r.path, first_line(e)),
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                };
                rows.push([s.sink.clone(), time, poll, changes, reload]);
            }
            out += &columns(&rows);
        }
        out += "\n";
        let mut rows = vec![[
            "MODULE".to_string(),
            "KIND".into(),
            "STATE".into(),
            "HASH".into(),
            "RESOURCEVERSION".into(),
            "WHY".into(),
        ]];
        for m in &self.modules {
            let state = match m.state {
                State::Delivered => "delivered",
                State::Rejected => "rejected",
                State::Unwritten => "unwritten",
            };
            let why = m.reason.as_deref().or(m.error.as_deref()).unwrap_or("");
            let hash = match m.hash.get(..19) {
                Some(h) => h.to_string(),
                None => m.hash.clone(),
            };
            rows.push([
                m.module.clone(),
                match m.kind.as_str() {
                    "" => "-".to_string(),
                    k => k.to_string(),
                },
                state.into(),
                hash,
                m.resource_version.clone().unwrap_or_else(|| "-".into()),
                first_line(why).to_string(),
            ]);
        }
        if self.modules.is_empty() {
            out += match counts.total() {
                0 => "no modules\n",
                _ if counts.rejected + counts.unwritten == 0 => "every module is delivered\n",
                _ => "no module listed\n",
            };
        } else {
            out += &columns(&rows);
        }
        out
    }
}

/// Left-aligned columns three spaces apart, as kubectl prints them.
pub fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut width = [0usize; N];
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 < N {
                line += &format!("{c:<w$}   ", w = width[i]);
            } else {
                line += c;
            }
        }
        out += line.trim_end();
        out += "\n";
    }
    out
}
