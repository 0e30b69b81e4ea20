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
//!
//! With a `Shelf` (the output folder, in a layout that keeps each file as it is), a module
//! that folder already holds is not kept twice on its volume: once delivered, or found
//! there when a run starts, the spool keeps only its keys, and `get` reads the files back
//! from the folder, checked against the module's hash. A record is *shelved* only after
//! its bytes were read back and found equal.

use std::fs::File as FsFile;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

mod record;

pub use self::record::{Meta, ObjectRef};
use self::record::{
    PLAIN, SHELVED, corrupt, decode, decode_head, decode_heads, encode_files, encode_head, file,
    take,
};
use super::hash::Hash;
use crate::source::ModuleFile;

/// The output folder as a place to read a module's files back from.
pub trait Shelf: Send + Sync {
    /// The bytes of file `key` of module `id` as the folder holds them now; more than
    /// `limit` bytes, or anything but a regular file, is an error.
    fn read(&self, id: &str, key: &str, limit: u64) -> io::Result<Vec<u8>>;
    /// The folder, for messages.
    fn dir(&self) -> &Path;
    /// Whether the folder holds exactly `files` (with `hash`) for `id`, known without
    /// reading them back; `None` if only reading them back can tell.
    fn holds(&self, _id: &str, _hash: &Hash, _files: &[ModuleFile]) -> Option<bool> {
        None
    }
    /// The first batch is done: what was kept to answer `holds` may go.
    fn settled(&mut self) {}
}

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
    /// Where delivered modules are read back from, if anywhere.
    shelf: Option<Box<dyn Shelf>>,
    /// Until the first batch is committed: a module put is looked for on the shelf first
    /// (a restart finds the folder already holding most of them).
    look_on_shelf: bool,
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
            shelf: None,
            look_on_shelf: false,
        })
    }

    /// Reads delivered modules back from `shelf` instead of keeping them here.
    pub fn with_shelf(mut self, shelf: Box<dyn Shelf>) -> Spool {
        self.shelf = Some(shelf);
        self.look_on_shelf = true;
        self
    }

    /// The first batch is committed: from now on the shelf holds only what was delivered.
    pub fn first_batch_done(&mut self) {
        self.look_on_shelf = false;
        if let Some(shelf) = &mut self.shelf {
            shelf.settled();
        }
    }

    /// The folder the spool file is in (`None`: `$TMPDIR` or memory).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Bytes of live records (what a compaction copies).
    pub fn live(&self) -> u64 {
        self.len - self.dead
    }

    /// A spool in memory (for tests and small one-shot uses).
    pub fn memory() -> Spool {
        Spool {
            backing: Backing::Memory(Vec::new()),
            dir: None,
            len: 0,
            dead: 0,
            shelf: None,
            look_on_shelf: false,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes `put` appends for a module.
    pub fn record_len(object: &ObjectRef, files: &[ModuleFile]) -> u64 {
        let head = 22 + object.uid.len() as u64 + object.resource_version.len() as u64;
        let files: u64 = (files.iter())
            .map(|f| 13 + f.key.len() as u64 + f.content.bytes().len() as u64)
            .sum();
        head + files
    }

    /// Appends a module's files, with the object they came from.
    pub fn put(&mut self, object: &ObjectRef, files: &[ModuleFile]) -> io::Result<Loc> {
        self.append(|buf| {
            buf.reserve(Self::record_len(object, files) as usize);
            encode_head(buf, PLAIN, object, files);
            encode_files(buf, files, true);
        })
    }

    /// Appends module `id`'s files (see `put`), or only their keys when the shelf already
    /// holds these very bytes (before the first batch is committed).
    pub fn put_module(
        &mut self,
        id: &str,
        hash: &Hash,
        object: &ObjectRef,
        files: &[ModuleFile],
    ) -> io::Result<Loc> {
        if self.look_on_shelf {
            let held = (self.shelf.as_ref()).and_then(|s| s.holds(id, hash, files));
            if held.unwrap_or_else(|| self.on_shelf(id, files)) {
                return self.put_shelved(id, object, files);
            }
        }
        self.put(object, files)
    }

    /// Keeps only the keys of module `id` (at `loc`) when the shelf holds its
    /// files byte for byte, and releases the full record; `None` if it does not (the
    /// record stays as it is).
    pub fn shelve(&mut self, id: &str, loc: Loc) -> io::Result<Option<Loc>> {
        if self.shelf.is_none() || self.is_shelved(loc)? {
            return Ok(None);
        }
        let (meta, files) = self.read(loc)?;
        if !self.on_shelf(id, &files) {
            return Ok(None);
        }
        let start = self.len;
        let object = ObjectRef::new(meta.kind, &meta.uid, &meta.resource_version);
        match self.put_shelved(id, &object, &files) {
            Ok(shelved) => {
                self.release(loc);
                Ok(Some(shelved))
            }
            Err(e) => {
                // Gathered but not written (a full volume): nobody's; the full record stays.
                self.release(Loc {
                    off: start,
                    len: self.len - start,
                });
                Err(e)
            }
        }
    }

    /// Whether the shelf holds exactly `files` for `id`.
    fn on_shelf(&self, id: &str, files: &[ModuleFile]) -> bool {
        let Some(shelf) = &self.shelf else {
            return false;
        };
        files.iter().all(|f| {
            let bytes = f.content.bytes();
            shelf
                .read(id, &f.key, bytes.len() as u64)
                .is_ok_and(|b| b == bytes)
        })
    }

    /// Appends only the keys of module `id`'s files, with the digest of their contents
    /// (what the shelf must give back: not always the module's hash, which for a fetched
    /// `.url` key covers the URL, not the body).
    fn put_shelved(
        &mut self,
        id: &str,
        object: &ObjectRef,
        files: &[ModuleFile],
    ) -> io::Result<Loc> {
        let digest = Hash::of(files.iter().map(|f| (f.key.as_str(), f.content.bytes())));
        self.append(|buf| {
            encode_head(buf, SHELVED, object, files);
            buf.extend_from_slice(&(id.len() as u32).to_be_bytes());
            buf.extend_from_slice(id.as_bytes());
            buf.extend_from_slice(&digest.0);
            encode_files(buf, files, false);
        })
    }

    fn is_shelved(&self, loc: Loc) -> io::Result<bool> {
        if loc.len == 0 {
            return Ok(false);
        }
        let first = self.raw(Loc {
            off: loc.off,
            len: 1,
        })?;
        Ok(first.first() == Some(&SHELVED))
    }

    /// Appends one record that `fill` writes.
    fn append(&mut self, fill: impl FnOnce(&mut Vec<u8>)) -> io::Result<Loc> {
        let start = self.len;
        let buf = match &mut self.backing {
            Backing::Disk { pending, .. } => pending,
            Backing::Memory(m) => m,
        };
        let before = buf.len();
        fill(buf);
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
            if let Err(e) = file.write_all_at(pending, *flushed) {
                // What a write that failed part-way (a full volume) allocated goes back
                // at once; the record stays gathered, and a failed poll truncates it.
                let _ = file.set_len(*flushed);
                return Err(e);
            }
            *flushed += pending.len() as u64;
            pending.clear();
        }
        Ok(loc)
    }

    /// Reads a module's files back (a shelved one's from the shelf, checked by hash).
    pub fn get(&self, loc: Loc) -> io::Result<Vec<ModuleFile>> {
        Ok(self.read(loc)?.1)
    }

    /// Reads a module back: what its record says of it, and its files.
    pub fn read(&self, loc: Loc) -> io::Result<(Meta, Vec<ModuleFile>)> {
        let raw = self.raw(loc)?;
        let mut rest = &raw[..];
        let (kind, meta) = decode_head(&mut rest)?;
        let files = match kind {
            SHELVED => self.read_shelved(rest)?,
            _ => decode(rest)?,
        };
        Ok((meta, files))
    }

    /// What a module's record says of it, without reading its files.
    pub fn meta(&self, loc: Loc) -> io::Result<Meta> {
        // The head is a few dozen bytes: read that much first, and the rest only for an
        // object whose uid and resourceVersion are long texts.
        let first = self.raw(Loc {
            off: loc.off,
            len: loc.len.min(256),
        })?;
        match decode_head(&mut &first[..]) {
            Ok((_, meta)) => Ok(meta),
            Err(_) if loc.len > 256 => Ok(decode_head(&mut &self.raw(loc)?[..])?.1),
            Err(e) => Err(e),
        }
    }

    /// A record's bytes.
    fn raw(&self, loc: Loc) -> io::Result<Vec<u8>> {
        let in_memory = |m: &[u8], from: u64| -> io::Result<Vec<u8>> {
            let at = (loc.off - from) as usize;
            m.get(at..at + loc.len as usize)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| corrupt("location past the end"))
        };
        match &self.backing {
            Backing::Disk {
                pending, flushed, ..
            } if loc.off >= *flushed => in_memory(pending, *flushed),
            Backing::Disk { file, .. } => {
                let mut buf = vec![0; loc.len as usize];
                file.read_exact_at(&mut buf, loc.off)?;
                Ok(buf)
            }
            Backing::Memory(m) => in_memory(m, 0),
        }
    }

    /// A shelved record's files, read from the shelf; the error says when the folder no
    /// longer holds what cmpoll wrote.
    fn read_shelved(&self, mut rest: &[u8]) -> io::Result<Vec<ModuleFile>> {
        let shelf = (self.shelf.as_ref()).ok_or_else(|| corrupt("a shelved record, no shelf"))?;
        let idlen = u32::from_be_bytes(take(&mut rest, 4)?.try_into().expect("4 bytes")) as usize;
        let id = std::str::from_utf8(take(&mut rest, idlen)?)
            .map_err(|_| corrupt("id is not UTF-8"))?
            .to_string();
        let hash = Hash(take(&mut rest, 32)?.try_into().expect("32 bytes"));
        let heads = decode_heads(rest)?;
        let mut read = Vec::with_capacity(heads.len());
        for (_, key, len) in &heads {
            let bytes = shelf.read(&id, key, *len as u64).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot read {id} back from '{}': {e}",
                        shelf.dir().display()
                    ),
                )
            })?;
            read.push(bytes);
        }
        let got = Hash::of(
            heads
                .iter()
                .zip(&read)
                .map(|((_, k, _), b)| (k.as_str(), &b[..])),
        );
        if got != hash {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "'{}' no longer holds what cmpoll wrote for {id} (changed by someone else)",
                    shelf.dir().display()
                ),
            ));
        }
        let files = heads.into_iter().zip(read);
        files
            .map(|((binary, key, _), bytes)| file(binary, key, bytes))
            .collect()
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

    /// Whether enough space is dead to be worth a compaction: more than is live, and more
    /// than 64 KiB. A compaction copies what is live, so its cost is bounded by what was
    /// written since the last one; with a shelf, what is live is mostly keys, and the
    /// space of delivered contents goes back to the volume after the batch.
    pub fn wants_compaction(&self) -> bool {
        self.dead > self.live().max(64 << 10)
    }

    /// Rewrites the live records (`locs`, updated in place) into a fresh spool, as they
    /// are (a shelved one stays shelved). All or nothing: if any record cannot be copied
    /// (a full volume), every loc still points into this spool, which is left as it was.
    pub fn compact<'a>(&mut self, locs: impl Iterator<Item = &'a mut Loc>) -> io::Result<()> {
        let mut next = match &self.backing {
            Backing::Disk { .. } => Spool::new(self.dir.as_deref())?,
            Backing::Memory(_) => Spool::memory(),
        };
        next.shelf = self.shelf.take();
        next.look_on_shelf = self.look_on_shelf;
        let mut locs: Vec<&mut Loc> = locs.collect();
        let copied = (|| {
            let mut moved = Vec::with_capacity(locs.len());
            for loc in &locs {
                let raw = self.raw(**loc)?;
                moved.push(next.append(|buf| buf.extend_from_slice(&raw))?);
            }
            Ok::<_, io::Error>(moved)
        })();
        match copied {
            Ok(moved) => {
                for (loc, at) in locs.iter_mut().zip(moved) {
                    **loc = at;
                }
                *self = next;
                Ok(())
            }
            Err(e) => {
                self.shelf = next.shelf.take();
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{Content, Resource};

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
            let a = s.put(&ObjectRef::configmap("u", "1"), &files(1)).unwrap();
            let b = s.put(&ObjectRef::configmap("u", "1"), &files(2)).unwrap();
            assert_eq!(s.get(b).unwrap(), files(2));
            assert_eq!(s.get(a).unwrap(), files(1));
            let mark = s.len();
            s.put(&ObjectRef::configmap("u", "1"), &files(3)).unwrap();
            s.truncate(mark).unwrap();
            assert_eq!(s.len(), mark);
            let empty = s.put(&ObjectRef::configmap("u", "1"), &[]).unwrap();
            assert_eq!(s.get(empty).unwrap(), vec![]);
            // The uid and resourceVersion (of any length) come back, with the counts.
            let long = "v".repeat(300);
            for (uid, rv) in [
                ("6f1c2d3e-8a9b-4c5d-9e0f-1a2b3c4d5e6f", "184467120"),
                ("", &long[..]),
            ] {
                let at = s
                    .put(&ObjectRef::new(Resource::Secrets, uid, rv), &files(4))
                    .unwrap();
                let want = Meta {
                    kind: Resource::Secrets,
                    uid: uid.into(),
                    resource_version: rv.into(),
                    files: 2,
                    bytes: 7,
                };
                assert_eq!(s.meta(at).unwrap(), want);
                assert_eq!(s.read(at).unwrap(), (want, files(4)));
            }
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
        let locs: Vec<Loc> = (0..20)
            .map(|i| s.put(&ObjectRef::configmap("u", "1"), &big(i)).unwrap())
            .collect();
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
        let again = s.put(&ObjectRef::configmap("u", "1"), &big(7)).unwrap();
        assert_eq!(again.off, locs[2].off);
        assert_eq!(s.get(again).unwrap(), big(7));
        assert_eq!(s.get(locs[1]).unwrap(), big(1));
        let more: Vec<Loc> = (0..10)
            .map(|i| s.put(&ObjectRef::configmap("u", "1"), &big(i)).unwrap())
            .collect();
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
            let loc = s.put(&ObjectRef::configmap("u", "1"), &files(i)).unwrap();
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
        let loc = s.put(&ObjectRef::configmap("u", "1"), &files(1)).unwrap();
        std::fs::remove_dir(&gone).unwrap();
        let mut locs = [loc];
        let e = s.compact(locs.iter_mut()).unwrap_err();
        assert!(
            e.to_string().contains("cannot create the spool file in"),
            "{e}"
        );
        assert!(Spool::new(Some(Path::new("/proc"))).is_err());
    }

    /// Issue 42.5: a compaction that fails half-way (here a record it cannot read back;
    /// on a full volume, a write of the new spool) changes nothing: every location still
    /// reads what it did, so the daemon goes on with the spool as it was.
    #[test]
    fn a_compaction_that_fails_half_way_changes_no_location() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::new(Some(dir.path())).unwrap();
        let mut live = Vec::new();
        for i in 0..6 {
            let loc = s.put(&ObjectRef::configmap("u", "1"), &files(i)).unwrap();
            if i % 2 == 0 {
                live.push(loc);
            } else {
                s.release(loc);
            }
        }
        let before = live.clone();
        // The last location is past the end: copying it fails after the others.
        let mut locs = live.clone();
        locs.push(Loc {
            off: s.len() + 10,
            len: 5,
        });
        assert!(s.compact(locs.iter_mut()).is_err());
        assert_eq!(&locs[..3], &before[..], "no location moved");
        for (loc, i) in before.iter().zip([0, 2, 4]) {
            assert_eq!(s.get(*loc).unwrap(), files(i), "still readable");
        }
        // And a compaction that can run still does.
        s.compact(live.iter_mut()).unwrap();
        for (loc, i) in live.iter().zip([0, 2, 4]) {
            assert_eq!(s.get(*loc).unwrap(), files(i));
        }
    }

    /// A shelf in memory: (id, key) → bytes, changeable by the test.
    type Held = std::collections::HashMap<(String, String), Vec<u8>>;
    #[derive(Clone, Default)]
    struct Memory(std::sync::Arc<std::sync::Mutex<Held>>);

    impl Memory {
        fn hold(&self, id: &str, files: &[ModuleFile]) {
            let mut m = self.0.lock().unwrap();
            for f in files {
                m.insert((id.into(), f.key.clone()), f.content.bytes().to_vec());
            }
        }
    }

    impl Shelf for Memory {
        fn read(&self, id: &str, key: &str, limit: u64) -> io::Result<Vec<u8>> {
            let m = self.0.lock().unwrap();
            let b = m
                .get(&(id.to_string(), key.to_string()))
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
            if b.len() as u64 > limit {
                return Err(io::Error::from(io::ErrorKind::InvalidData));
            }
            Ok(b.clone())
        }

        fn dir(&self) -> &Path {
            Path::new("/out")
        }
    }

    fn hash(files: &[ModuleFile]) -> Hash {
        Hash::of(files.iter().map(|f| (f.key.as_str(), f.content.bytes())))
    }

    /// Issue 23.4: what the folder holds is not kept twice.
    #[test]
    fn delivered_modules_are_read_back_from_the_shelf_checked_by_hash() {
        let shelf = Memory::default();
        let mut s = Spool::new(None)
            .unwrap()
            .with_shelf(Box::new(shelf.clone()));
        // A start: the folder already holds m1, not m2.
        shelf.hold("ns/m1", &files(1));
        let m1 = s
            .put_module(
                "ns/m1",
                &hash(&files(1)),
                &ObjectRef::configmap("u", "1"),
                &files(1),
            )
            .unwrap();
        let m2 = s
            .put_module(
                "ns/m2",
                &hash(&files(2)),
                &ObjectRef::configmap("u", "1"),
                &files(2),
            )
            .unwrap();
        assert!(s.is_shelved(m1).unwrap(), "only keys kept for m1");
        assert!(!s.is_shelved(m2).unwrap());
        assert_eq!(s.get(m1).unwrap(), files(1), "binary and text as they were");
        assert_eq!(s.get(m2).unwrap(), files(2));
        s.first_batch_done();
        // After the first batch, a put is kept whole; once delivered, it is shelved.
        shelf.hold("ns/m3", &files(3));
        let m3 = s
            .put_module(
                "ns/m3",
                &hash(&files(3)),
                &ObjectRef::configmap("u", "1"),
                &files(3),
            )
            .unwrap();
        assert!(!s.is_shelved(m3).unwrap());
        assert_eq!(
            m3.len,
            Spool::record_len(&ObjectRef::configmap("u", "1"), &files(3))
        );
        let dead = s.dead;
        let shelved = s.shelve("ns/m3", m3).unwrap().unwrap();
        assert_eq!(s.dead, dead + m3.len, "the full record is released");
        assert_eq!(s.get(shelved).unwrap(), files(3));
        assert_eq!(s.shelve("ns/m3", shelved).unwrap(), None);
        // Not what the folder holds: it stays whole.
        assert_eq!(s.shelve("ns/m2", m2).unwrap(), None);
        // Someone changed the file: reading it back says so.
        let mut changed = files(3);
        changed[1].content = Content::Binary(vec![0, 255, 9]);
        shelf.hold("ns/m3", &changed);
        let e = s.get(shelved).unwrap_err();
        assert!(
            e.to_string()
                .contains("no longer holds what cmpoll wrote for ns/m3"),
            "{e}"
        );
        // Compaction keeps a shelved record shelved, and a whole one whole.
        shelf.hold("ns/m3", &files(3));
        let mut locs = [shelved, m2];
        s.compact(locs.iter_mut()).unwrap();
        assert_eq!(locs[0].len, shelved.len);
        assert_eq!(s.get(locs[0]).unwrap(), files(3));
        assert_eq!(s.get(locs[1]).unwrap(), files(2));
    }

    #[test]
    fn without_a_shelf_nothing_is_shelved() {
        let mut s = Spool::memory();
        let loc = s
            .put_module(
                "ns/m",
                &hash(&files(1)),
                &ObjectRef::configmap("u", "1"),
                &files(1),
            )
            .unwrap();
        assert_eq!(s.shelve("ns/m", loc).unwrap(), None);
        assert_eq!(s.get(loc).unwrap(), files(1));
    }

    /// A compaction is worth it once more is dead than live (and over 64 KiB): with a
    /// shelf, what is live is small, so delivered contents go back after a batch.
    #[test]
    fn dead_space_is_reclaimed_once_it_outweighs_the_live() {
        let mut s = Spool::memory();
        let big = vec![ModuleFile {
            key: "k".into(),
            content: Content::Text("x".repeat(100_000)),
        }];
        let a = s.put(&ObjectRef::configmap("u", "1"), &big).unwrap();
        let _small = s.put(&ObjectRef::configmap("u", "1"), &files(1)).unwrap();
        assert!(!s.wants_compaction());
        s.release(a);
        assert!(s.wants_compaction());
    }

    #[test]
    fn corrupt_records_are_errors_not_panics() {
        assert!(decode(&[0, 0, 0, 0, 9]).is_err());
        assert!(decode(&[0]).is_err());
    }
}
