//! `--stdout-events`: the batch as JSON lines on stdout, flushed once per batch. When the
//! reader goes away (EPIPE), the daemon stops cleanly with a message instead of panicking.

use std::io::Write;

use crate::batch::{Batch, Fatal, Outcome, Sink, lines};

pub struct StdoutSink<W: Write> {
    out: W,
}

impl<W: Write> StdoutSink<W> {
    pub fn new(out: W) -> StdoutSink<W> {
        StdoutSink { out }
    }
}

impl<W: Write> Sink for StdoutSink<W> {
    fn name(&self) -> &'static str {
        "stdout"
    }

    fn apply(&mut self, batch: &Batch) -> Result<Outcome, Fatal> {
        lines::write(batch, &mut self.out, false)
            .and_then(|()| self.out.flush())
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::BrokenPipe => {
                    Fatal("stdout was closed (its reader went away); stopping".into())
                }
                _ => Fatal(format!("cannot write events to stdout: {e}")),
            })?;
        Ok(Outcome::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::event::Synced;
    use crate::batch::event::{Change, Event};
    use crate::poll::hash::Hash;
    use crate::poll::snapshot::Entry;
    use crate::poll::spool::{ObjectRef, Spool};
    use crate::source::{Content, ModuleFile, Resource};

    #[test]
    fn writes_one_line_per_event_and_synced_last() {
        let mut spool = Spool::memory();
        let files = [ModuleFile {
            key: "k".into(),
            content: Content::Text("v".into()),
        }];
        let mut entry = |kind| Entry {
            resource_version: "1".into(),
            hash: Hash([1; 32]),
            loc: spool.put(&ObjectRef::new(kind, "u", "1"), &files).unwrap(),
        };
        let (cm, secret) = (entry(Resource::ConfigMaps), entry(Resource::Secrets));
        let batch = Batch {
            events: vec![
                Event::new(Change::Removed, "a/old", &cm),
                Event::new(Change::Added, "a/new", &cm),
                Event::new(Change::Added, "a/secret", &secret),
            ],
            synced: Synced {
                modules: 1,
                added: 1,
                updated: 0,
                removed: 1,
                rejected: 0,
                poll: 3,
            },
            spool: &spool,
            first: false,
        };
        let mut sink = StdoutSink::new(Vec::new());
        sink.apply(&batch).unwrap();
        let text = String::from_utf8(sink.out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with(r#"{"type":"removed","module":"a/old","kind":"ConfigMap""#));
        assert!(
            lines[1].contains(r#""kind":"ConfigMap""#) && lines[1].contains(r#""files":{"k":"v"}"#)
        );
        assert!(lines[2].contains(r#""kind":"Secret""#) && lines[2].contains("sha256:"));
        assert!(
            !lines[2].contains("files"),
            "a Secret's contents stay off stdout: {}",
            lines[2]
        );
        assert_eq!(
            lines[3],
            r#"{"type":"synced","modules":1,"added":1,"updated":0,"removed":1,"rejected":0,"poll":3}"#
        );
        assert!(text.ends_with('\n'));
        // An agent's stdin carries a Secret's contents.
        let mut lines = Vec::new();
        crate::batch::lines::write(&batch, &mut lines, true).unwrap();
        assert_eq!(
            String::from_utf8(lines)
                .unwrap()
                .matches(r#""files":{"k":"v"}"#)
                .count(),
            2
        );
    }

    struct Closed;
    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_reader_is_a_clean_fatal_stop() {
        let spool = Spool::memory();
        let batch = Batch {
            events: vec![],
            synced: Synced::default(),
            spool: &spool,
            first: false,
        };
        let err = StdoutSink::new(Closed).apply(&batch).unwrap_err();
        assert!(err.0.contains("reader went away"), "{}", err.0);
    }
}
