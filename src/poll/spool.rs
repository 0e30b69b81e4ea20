//! The spool: module contents kept on disk, not in memory.
//!
//! A poll streams the list item by item; each new or changed module's files are appended
//! here and the snapshot keeps only a `Loc` (offset and length). Sinks read a module back
//! when they need it, one at a time, so memory stays flat however large the cluster is.
//! The file is an unlinked temporary file in the output folder's `.cmpoll/` when there is
//! one, else in `$TMPDIR`, and it stays in that folder for the whole run (compaction makes
//! its new file there too). A spool that cannot be created is an error, never a silent
//! move into memory: in a pod with a read-only root and no `/tmp`, memory is exactly what
//! the operator did not plan for. Space of superseded contents is reclaimed by `compact`.

use std::fs::File as FsFile;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::source::{Content, ModuleFile};

/// Where a module's files are in the spool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loc {
    pub off: u64,
    pub len: u64,
}

enum Backing {
    /// Records are gathered in `pending` and written at `flushed` a few hundred KiB at a
    /// time: a write per module would cost a system call each. A record is always wholly
    /// in `pending` or wholly in the file.
    Disk {
        file: FsFile,
        pending: Vec<u8>,
        flushed: u64,
    },
    Memory(Vec<u8>),
}

/// How much `pending` may hold before it is written.
const FLUSH_AT: usize = 256 * 1024;

pub struct Spool {
    backing: Backing,
    /// Where the file lives (`None`: `$TMPDIR`); compaction stays there.
    dir: Option<std::path::PathBuf>,
    len: u64,
    /// Bytes that belong to no current module (superseded or removed contents).
    dead: u64,
}

impl Spool {
    /// A spool file in `dir` (or `$TMPDIR`); the error names the folder.
    pub fn new(dir: Option<&Path>) -> io::Result<Spool> {
        let file = match dir {
            Some(d) => tempfile::tempfile_in(d),
            None => tempfile::tempfile(),
        };
        let file = file.map_err(|e| {
            let (folder, hint) = match dir {
                Some(d) => (d.display().to_string(), ""),
                None => (
                    std::env::temp_dir().display().to_string(),
                    " (set TMPDIR to a writable folder, or use --out-dir)",
                ),
            };
            io::Error::new(
                e.kind(),
                format!("cannot create the spool file in '{folder}': {e}{hint}"),
            )
        })?;
        Ok(Spool {
            backing: Backing::Disk {
                file,
                pending: Vec::new(),
                flushed: 0,
            },
            dir: dir.map(Path::to_path_buf),
            len: 0,
            dead: 0,
        })
    }

    /// A spool in memory (for tests and small one-shot uses).
    pub fn memory() -> Spool {
        Spool {
            backing: Backing::Memory(Vec::new()),
            dir: None,
            len: 0,
            dead: 0,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a module's files.
    pub fn put(&mut self, files: &[ModuleFile]) -> io::Result<Loc> {
        let start = self.len;
        let buf = match &mut self.backing {
            Backing::Disk { pending, .. } => pending,
            Backing::Memory(m) => m,
        };
        let before = buf.len();
        buf.reserve(
            files
                .iter()
                .map(|f| 13 + f.key.len() + f.content.bytes().len())
                .sum(),
        );
        for f in files {
            buf.push(u8::from(f.content.is_binary()));
            buf.extend_from_slice(&(f.key.len() as u32).to_be_bytes());
            buf.extend_from_slice(f.key.as_bytes());
            let bytes = f.content.bytes();
            buf.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
            buf.extend_from_slice(bytes);
        }
        let loc = Loc {
            off: start,
            len: (buf.len() - before) as u64,
        };
        self.len += loc.len;
        if let Backing::Disk {
            file,
            pending,
            flushed,
        } = &mut self.backing
            && pending.len() >= FLUSH_AT
        {
            file.write_all_at(pending, *flushed)?;
            *flushed += pending.len() as u64;
            pending.clear();
        }
        Ok(loc)
    }

    /// Reads a module's files back.
    pub fn get(&self, loc: Loc) -> io::Result<Vec<ModuleFile>> {
        let in_memory = |m: &[u8], from: u64| -> io::Result<Vec<ModuleFile>> {
            let at = (loc.off - from) as usize;
            decode(
                m.get(at..at + loc.len as usize)
                    .ok_or_else(|| corrupt("location past the end"))?,
            )
        };
        match &self.backing {
            Backing::Disk {
                pending, flushed, ..
            } if loc.off >= *flushed => in_memory(pending, *flushed),
            Backing::Disk { file, .. } => {
                let mut buf = vec![0; loc.len as usize];
                file.read_exact_at(&mut buf, loc.off)?;
                decode(&buf)
            }
            Backing::Memory(m) => in_memory(m, 0),
        }
    }

    /// Forgets everything appended after `len` (the contents of a failed poll).
    pub fn truncate(&mut self, len: u64) -> io::Result<()> {
        if len >= self.len {
            return Ok(());
        }
        match &mut self.backing {
            Backing::Disk {
                pending, flushed, ..
            } if len >= *flushed => pending.truncate((len - *flushed) as usize),
            Backing::Disk {
                file,
                pending,
                flushed,
            } => {
                pending.clear();
                file.set_len(len)?;
                *flushed = len;
            }
            Backing::Memory(m) => m.truncate(len as usize),
        }
        self.len = len;
        Ok(())
    }

    /// Marks a module's old contents as no longer needed.
    pub fn release(&mut self, loc: Loc) {
        self.dead += loc.len;
    }

    /// Whether enough space is dead to be worth a compaction.
    pub fn wants_compaction(&self) -> bool {
        self.dead > 4 << 20 && self.dead > self.len - self.dead
    }

    /// Rewrites the live contents (`locs`, updated in place) into a fresh spool.
    pub fn compact<'a>(&mut self, locs: impl Iterator<Item = &'a mut Loc>) -> io::Result<()> {
        let mut next = match &self.backing {
            Backing::Disk { .. } => Spool::new(self.dir.as_deref())?,
            Backing::Memory(_) => Spool::memory(),
        };
        for loc in locs {
            let files = self.get(*loc)?;
            *loc = next.put(&files)?;
        }
        *self = next;
        Ok(())
    }
}

fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("spool: {what}"))
}

fn decode(mut buf: &[u8]) -> io::Result<Vec<ModuleFile>> {
    fn take<'a>(buf: &mut &'a [u8], n: usize) -> io::Result<&'a [u8]> {
        if buf.len() < n {
            return Err(corrupt("truncated record"));
        }
        let (head, rest) = buf.split_at(n);
        *buf = rest;
        Ok(head)
    }
    let mut files = Vec::new();
    while !buf.is_empty() {
        let binary = take(&mut buf, 1)?[0] == 1;
        let klen = u32::from_be_bytes(take(&mut buf, 4)?.try_into().expect("4 bytes")) as usize;
        let key = String::from_utf8(take(&mut buf, klen)?.to_vec())
            .map_err(|_| corrupt("key is not UTF-8"))?;
        let clen = u64::from_be_bytes(take(&mut buf, 8)?.try_into().expect("8 bytes")) as usize;
        let bytes = take(&mut buf, clen)?.to_vec();
        let content = if binary {
            Content::Binary(bytes)
        } else {
            Content::Text(String::from_utf8(bytes).map_err(|_| corrupt("text is not UTF-8"))?)
        };
        files.push(ModuleFile { key, content });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(n: u8) -> Vec<ModuleFile> {
        vec![
            ModuleFile {
                key: format!("a{n}"),
                content: Content::Text("x".repeat(n as usize)),
            },
            ModuleFile {
                key: "b.bin".into(),
                content: Content::Binary(vec![0, 255, n]),
            },
        ]
    }

    #[test]
    fn round_trips_on_disk_and_in_memory() {
        for mut s in [Spool::new(None).unwrap(), Spool::memory()] {
            let a = s.put(&files(1)).unwrap();
            let b = s.put(&files(2)).unwrap();
            assert_eq!(s.get(b).unwrap(), files(2));
            assert_eq!(s.get(a).unwrap(), files(1));
            let mark = s.len();
            s.put(&files(3)).unwrap();
            s.truncate(mark).unwrap();
            assert_eq!(s.len(), mark);
            let empty = s.put(&[]).unwrap();
            assert_eq!(s.get(empty).unwrap(), vec![]);
        }
    }

    #[test]
    fn writes_are_gathered_and_truncation_works_on_both_sides_of_a_flush() {
        let big = |n: u8| {
            vec![ModuleFile {
                key: format!("k{n}"),
                content: Content::Text(char::from(b'a' + n % 26).to_string().repeat(40_000)),
            }]
        };
        let mut s = Spool::new(None).unwrap();
        let locs: Vec<Loc> = (0..20).map(|i| s.put(&big(i)).unwrap()).collect();
        let Backing::Disk { file, flushed, .. } = &s.backing else {
            panic!("a disk spool")
        };
        let on_disk = file.metadata().unwrap().len();
        assert!(*flushed > 0 && on_disk == *flushed, "written in batches");
        assert!(*flushed < s.len(), "the tail is still gathered");
        for (i, loc) in locs.iter().enumerate() {
            assert_eq!(s.get(*loc).unwrap(), big(i as u8), "record {i}");
        }
        // Back into the gathered tail, then back into what was written.
        s.truncate(locs[18].off).unwrap();
        assert_eq!(s.get(locs[17]).unwrap(), big(17));
        s.truncate(locs[2].off).unwrap();
        assert_eq!(s.len(), locs[2].off);
        let again = s.put(&big(7)).unwrap();
        assert_eq!(again.off, locs[2].off);
        assert_eq!(s.get(again).unwrap(), big(7));
        assert_eq!(s.get(locs[1]).unwrap(), big(1));
        let more: Vec<Loc> = (0..10).map(|i| s.put(&big(i)).unwrap()).collect();
        for (i, loc) in more.iter().enumerate() {
            assert_eq!(s.get(*loc).unwrap(), big(i as u8));
        }
    }

    #[test]
    fn compaction_keeps_only_live_contents_in_the_same_folder() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::new(Some(dir.path())).unwrap();
        let mut live = Vec::new();
        for i in 0..10 {
            let loc = s.put(&files(i)).unwrap();
            if i % 2 == 0 {
                live.push((i, loc));
            } else {
                s.release(loc);
            }
        }
        let before = s.len();
        s.compact(live.iter_mut().map(|(_, l)| l)).unwrap();
        assert!(s.len() < before);
        for (i, loc) in live {
            assert_eq!(s.get(loc).unwrap(), files(i));
        }
        assert_eq!(
            s.dir.as_deref(),
            Some(dir.path()),
            "r13: stays where it started"
        );
        // A folder that went away is an error, not a silent move into memory.
        let gone = dir.path().join("gone");
        std::fs::create_dir(&gone).unwrap();
        let mut s = Spool::new(Some(&gone)).unwrap();
        let loc = s.put(&files(1)).unwrap();
        std::fs::remove_dir(&gone).unwrap();
        let mut locs = [loc];
        let e = s.compact(locs.iter_mut()).unwrap_err();
        assert!(
            e.to_string().contains("cannot create the spool file in"),
            "{e}"
        );
        assert!(Spool::new(Some(Path::new("/proc"))).is_err());
    }

    #[test]
    fn corrupt_records_are_errors_not_panics() {
        assert!(decode(&[0, 0, 0, 0, 9]).is_err());
        assert!(decode(&[0]).is_err());
    }
}
