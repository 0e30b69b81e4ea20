//! `cmpoll list`: one poll, printed as a table or (`--json`) a JSON array of modules with
//! their files. Nothing is printed unless the whole poll succeeded.

use std::io::{self, Write};

use crate::batch::lines;
use crate::error::Error;
use crate::poll::Poller;
use crate::poll::snapshot::Snapshot;
use crate::poll::spool::Spool;

/// One poll, then print; a failed poll prints nothing and exits 1.
pub fn run(mut poller: Poller, json: bool) -> Result<(), Error> {
    let mut spool = Spool::new(None).map_err(|e| Error::Runtime(e.to_string()))?;
    let polled = poller
        .poll(&Snapshot::default(), &mut spool)
        .map_err(|e| Error::Runtime(e.to_string()))?;
    let stats = polled.stats;
    log::debug!(
        "{}: {} objects, {} modules, {} rejected, {} without selected keys",
        poller.describe(),
        stats.items,
        stats.modules,
        stats.invalid,
        stats.without_keys
    );
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let written = if json {
        self::json(&polled.snapshot, &spool, &mut out)
    } else {
        table(&polled.snapshot, &spool, &mut out)
    }
    .and_then(|()| out.flush());
    match written {
        Ok(()) => Ok(()),
        // `cmpoll list | head`: the reader left; that is not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Error::Runtime(format!("cannot write to stdout: {e}"))),
    }
}

/// Prints a table: module, number of files, bytes, hash prefix (the counts from each
/// module's spool record).
pub fn table(snapshot: &Snapshot, spool: &Spool, out: &mut dyn Write) -> io::Result<()> {
    let width = snapshot
        .modules
        .keys()
        .map(|k| k.len())
        .max()
        .unwrap_or(0)
        .max("MODULE".len());
    writeln!(
        out,
        "{:<width$}  {:>5}  {:>9}  HASH",
        "MODULE", "FILES", "BYTES"
    )?;
    for (id, e) in snapshot.modules.iter() {
        let m = spool.meta(e.loc)?;
        writeln!(
            out,
            "{id:<width$}  {:>5}  {:>9}  {}",
            m.files,
            m.bytes,
            e.hash.short(12)
        )?;
    }
    Ok(())
}

/// Prints a JSON array, one module object per line, contents read back from the spool (a
/// Secret's: its hash only).
pub fn json(snapshot: &Snapshot, spool: &Spool, out: &mut dyn Write) -> io::Result<()> {
    if snapshot.is_empty() {
        return out.write_all(b"[]\n");
    }
    out.write_all(b"[\n")?;
    for (i, (id, e)) in snapshot.modules.iter().enumerate() {
        if i > 0 {
            out.write_all(b",\n")?;
        }
        let meta = spool.meta(e.loc)?;
        let line = if meta.kind.shows_contents() {
            let files = spool.get(e.loc)?;
            lines::module(None, id, (&e.hash, &meta), Some(&files))
        } else {
            lines::module(None, id, (&e.hash, &meta), None)
        };
        out.write_all(&line)?;
    }
    out.write_all(b"\n]\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::hash::Hash;
    use crate::poll::snapshot::Entry;
    use crate::poll::spool::ObjectRef;
    use crate::source::{Content, ModuleFile};

    #[test]
    fn table_and_json() {
        let mut spool = Spool::memory();
        let files = vec![ModuleFile {
            key: "a.alloy".into(),
            content: Content::Text("x".into()),
        }];
        let loc = spool.put(&ObjectRef::configmap("u", "7"), &files).unwrap();
        let mut snap = Snapshot::default();
        snap.modules.insert(
            "monitoring/agent-module",
            Entry {
                hash: Hash::of([("a.alloy", &b"x"[..])]),
                loc,
                resource_version: "7".into(),
            },
        );
        let mut out = Vec::new();
        table(&snap, &spool, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("MODULE                   FILES      BYTES  HASH\n"),
            "{text}"
        );
        assert!(
            text.contains("monitoring/agent-module      1          1  sha256:"),
            "{text}"
        );
        let mut out = Vec::new();
        json(&snap, &spool, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v[0]["files"]["a.alloy"], "x");
        assert_eq!(v[0]["module"], "monitoring/agent-module");
        assert_eq!(
            (&v[0]["uid"], &v[0]["resourceVersion"]),
            (&"u".into(), &"7".into())
        );
        let mut out = Vec::new();
        json(&Snapshot::default(), &spool, &mut out).unwrap();
        assert_eq!(out, b"[]\n");
    }
}
