//! `--out-dir DIR`: modules as files, switched atomically, with a record of what was written.
//!
//! `files` layout: `DIR/NS/NAME` is a symlink to `DIR/.cmpoll/versions/NS.NAME.SEQ/`, a
//! complete, fsynced folder of the module's files; an update writes a new version folder and
//! swaps the symlink with `rename(2)` (kubelet's AtomicWriter), so a reader that resolves
//! the module path once reads one consistent version. Replaced versions stay readable for
//! `--old-version-ttl` before they are deleted. `concat` layout: `DIR/NS.NAME{EXT}`, the
//! files concatenated, written to a temporary file, fsynced and renamed.
//!
//! `DIR/.cmpoll/state.json` records every path cmpoll wrote, and, before each batch, the
//! writes it is about to make (a write-ahead record), so after a crash a restart knows
//! exactly which leftovers are its own. cmpoll deletes only paths recorded there; a file or
//! symlink it finds where it wants to write, but did not write, is left alone and that
//! module fails. The first batch after a start reconciles the folder with the cluster:
//! modules removed meanwhile are removed, unchanged ones are not touched (same inode and
//! mtime). `DIR/.cmpoll/lock` keeps a second cmpoll out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::atomic::{self, create_dir, fsync_dir, remove_dir_if_empty, remove_if_exists};
use super::{Batch, Fatal, Outcome, Sink};
use crate::module::File as ModuleFile;
use crate::settings::Layout;
use crate::snapshot::{Change, Entry, split_id};

const META: &str = ".cmpoll";
const VERSIONS: &str = "versions";
const STATE: &str = "state.json";
const DIR_MODE: u32 = 0o755;

/// What cmpoll wrote for one module.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Written {
    hash: String,
    mode: u32,
    /// `files` layout: the version folder under `.cmpoll/versions`, and its files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    files: Vec<String>,
    /// `concat` layout: the file, relative to DIR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

/// A write about to be made (recorded before it is made).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Pending {
    module: String,
    hash: String,
    mode: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    files: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    /// The temporary name used on the way (a symlink or a file), relative to DIR.
    tmp: String,
}

/// A version folder no longer in use, deleted once it is older than the TTL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Retired {
    version: String,
    files: Vec<String>,
    /// Unix seconds when it was replaced.
    since: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct State {
    version: u32,
    seq: u64,
    modules: BTreeMap<String, Written>,
    /// Namespace folders cmpoll created (and may remove once empty).
    namespaces: BTreeSet<String>,
    pending: Vec<Pending>,
    retired: Vec<Retired>,
}

pub struct OutDir {
    dir: PathBuf,
    layout: Layout,
    ext: String,
    mode: u32,
    ttl: Duration,
    state: State,
    reconciled: bool,
    _lock: File,
}

/// A path component that stays inside its folder (module validation already guarantees
/// this; checked again before any path is built).
fn component(s: &str) -> io::Result<&str> {
    if s.is_empty() || s == "." || s == ".." || s.contains('/') || s.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{s}' is not a safe file name"),
        ));
    }
    Ok(s)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether `path` is a real folder (not a symlink to one).
fn real_dir(path: &Path) -> io::Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(m) => Ok(m.is_dir()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

impl OutDir {
    /// Opens (creating if needed) and locks the folder, then recovers from an interrupted
    /// run. Errors are start-up errors naming the folder.
    pub fn open(
        dir: &Path,
        layout: Layout,
        ext: &str,
        mode: u32,
        ttl: Duration,
    ) -> Result<OutDir, String> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!("--out-dir '{}': {what}: {e}", dir.display())
        };
        fs::create_dir_all(dir).map_err(|e| fail("cannot create it", &e))?;
        if !dir.is_dir() {
            return Err(fail("not a folder", &"it is a file"));
        }
        let meta = dir.join(META);
        for d in [meta.clone(), meta.join(VERSIONS)] {
            if !real_dir(&d).map_err(|e| fail("cannot inspect it", &e))? {
                if fs::symlink_metadata(&d).is_ok() {
                    return Err(fail(
                        &format!("'{}' is not a folder cmpoll made", d.display()),
                        &"refusing to use it",
                    ));
                }
                create_dir(&d, DIR_MODE).map_err(|e| fail("cannot write to it", &e))?;
            }
        }
        // Writable where modules go, not only in .cmpoll.
        tempfile::tempfile_in(dir).map_err(|e| fail("cannot write to it", &e))?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(meta.join("lock"))
            .map_err(|e| fail("cannot write to it", &e))?;
        lock.try_lock()
            .map_err(|_| fail("locked", &"another cmpoll is writing to this folder"))?;
        let state = match fs::read(meta.join(STATE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                fail(
                    &format!("unreadable record '{META}/{STATE}' (remove it to start afresh; cmpoll will then leave what it wrote before alone)"),
                    &e,
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => State {
                version: 1,
                ..State::default()
            },
            Err(e) => return Err(fail(&format!("cannot read '{META}/{STATE}'"), &e)),
        };
        let mut out = OutDir {
            dir: dir.to_path_buf(),
            layout,
            ext: ext.to_string(),
            mode,
            ttl,
            state,
            reconciled: false,
            _lock: lock,
        };
        out.recover()
            .map_err(|e| fail("cannot recover from the last run", &e))?;
        Ok(out)
    }

    fn meta(&self) -> PathBuf {
        self.dir.join(META)
    }

    fn versions(&self) -> PathBuf {
        self.meta().join(VERSIONS)
    }

    /// The symlink target of a version, relative to `DIR/NS/`.
    fn link_target(version: &str) -> PathBuf {
        Path::new("..").join(META).join(VERSIONS).join(version)
    }

    fn save(&mut self) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(&self.state).map_err(io::Error::other)?;
        let meta = self.meta();
        remove_if_exists(&meta.join(".state.json.tmp"))?;
        atomic::replace_file(&meta, STATE, ".state.json.tmp", &bytes, 0o644)
    }

    fn next_seq(&mut self) -> u64 {
        self.state.seq += 1;
        self.state.seq
    }

    /// Finishes or undoes the writes an interrupted run had recorded as pending.
    fn recover(&mut self) -> io::Result<()> {
        let pending = std::mem::take(&mut self.state.pending);
        if pending.is_empty() {
            return self.expire(true);
        }
        log::info!(
            "--out-dir: recovering {} interrupted write(s)",
            pending.len()
        );
        for p in pending {
            remove_if_exists(&self.dir.join(&p.tmp))?;
            if let Some(version) = &p.version {
                let (ns, name) = split_id(&p.module);
                let link = self.dir.join(ns).join(name);
                if fs::read_link(&link).ok() == Some(Self::link_target(version)) {
                    // The switch happened: the new version is the module now.
                    let written = Written {
                        hash: p.hash.clone(),
                        mode: p.mode,
                        version: Some(version.clone()),
                        files: p.files.clone(),
                        file: None,
                    };
                    if let Some(old) = self.state.modules.insert(p.module.clone(), written) {
                        self.retire(old);
                    }
                } else {
                    self.delete_version(version, &p.files)?;
                }
            } else if let Some(file) = &p.file
                && self.dir.join(file).exists()
            {
                // Maybe renamed into place: ours, but of unknown content (rewritten next).
                let old = self.state.modules.insert(
                    p.module.clone(),
                    Written {
                        hash: String::new(),
                        mode: p.mode,
                        file: Some(file.clone()),
                        ..Written::default()
                    },
                );
                if let Some(old_file) = old.and_then(|o| o.file).filter(|f| f != file) {
                    remove_if_exists(&self.dir.join(old_file))?;
                }
            }
        }
        self.expire(true)?;
        self.save()
    }

    fn retire(&mut self, w: Written) {
        if let Some(version) = w.version {
            self.state.retired.push(Retired {
                version,
                files: w.files,
                since: now_secs(),
            });
        }
    }

    /// Deletes a version folder: its recorded files, then the folder if that left it empty.
    fn delete_version(&self, version: &str, files: &[String]) -> io::Result<()> {
        let vdir = self.versions().join(component(version)?);
        for f in files {
            remove_if_exists(&vdir.join(component(f)?))?;
        }
        if !remove_dir_if_empty(&vdir)? && vdir.exists() {
            log::warn!(
                "--out-dir: '{}' holds files cmpoll did not write; leaving it",
                vdir.display()
            );
        }
        Ok(())
    }

    /// Deletes retired versions older than the TTL, and saves the record if that changed
    /// it (at start the caller saves).
    fn expire(&mut self, at_start: bool) -> io::Result<()> {
        let now = now_secs();
        let ttl = self.ttl.as_secs();
        let (due, keep): (Vec<Retired>, Vec<Retired>) = std::mem::take(&mut self.state.retired)
            .into_iter()
            .partition(|r| now.saturating_sub(r.since) >= ttl);
        self.state.retired = keep;
        let changed = !due.is_empty();
        for r in due {
            if let Err(e) = self.delete_version(&r.version, &r.files) {
                log::warn!("--out-dir: cannot delete old version {}: {e}", r.version);
                self.state.retired.push(r);
            }
        }
        if changed {
            fsync_dir(&self.versions())?;
            if !at_start {
                self.save()?;
            }
        }
        Ok(())
    }

    fn concat_name(&self, id: &str) -> io::Result<String> {
        let (ns, name) = split_id(id);
        component(&format!(
            "{}.{}{}",
            component(ns)?,
            component(name)?,
            self.ext
        ))
        .map(str::to_string)
    }

    /// What writing `id` will create, recorded before it is created.
    fn plan(&mut self, id: &str, entry: &Entry, files: &[ModuleFile]) -> io::Result<Pending> {
        let seq = self.next_seq();
        let (ns, name) = split_id(id);
        let mut p = Pending {
            module: id.to_string(),
            hash: entry.hash.to_string(),
            mode: self.mode,
            version: None,
            files: files.iter().map(|f| f.key.clone()).collect(),
            file: None,
            tmp: String::new(),
        };
        match self.layout {
            Layout::Files => {
                p.version = Some(format!("{}.{}.{seq:x}", component(ns)?, component(name)?));
                p.tmp = format!("{ns}/.cmpoll-tmp.{seq:x}");
            }
            Layout::Concat => {
                p.file = Some(self.concat_name(id)?);
                p.files.clear();
                p.tmp = format!(".cmpoll-tmp.{seq:x}");
            }
        }
        Ok(p)
    }

    /// Refuses a path that exists but is not recorded as this module's.
    fn check_ours(
        &self,
        path: &Path,
        id: &str,
        is_ours: impl Fn(&Written) -> bool,
    ) -> io::Result<()> {
        match fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
            Ok(_) if self.state.modules.get(id).is_some_and(is_ours) => Ok(()),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "'{}' exists and cmpoll did not write it; leaving it alone",
                    path.display()
                ),
            )),
        }
    }

    fn write(&mut self, p: &Pending, files: &[ModuleFile]) -> io::Result<Written> {
        match &p.version {
            Some(version) => self.write_version(p, version, files),
            None => self.write_concat(p, files),
        }
    }

    fn write_version(
        &mut self,
        p: &Pending,
        version: &str,
        files: &[ModuleFile],
    ) -> io::Result<Written> {
        let (ns, name) = split_id(&p.module);
        let ns_dir = self.dir.join(component(ns)?);
        if !real_dir(&ns_dir)? {
            if fs::symlink_metadata(&ns_dir).is_ok() {
                return Err(io::Error::other(format!(
                    "'{}' is not a folder cmpoll can write to (a file or a symlink it did not make)",
                    ns_dir.display()
                )));
            }
            create_dir(&ns_dir, DIR_MODE)?;
            fsync_dir(&self.dir)?;
            self.state.namespaces.insert(ns.to_string());
        }
        let link = ns_dir.join(component(name)?);
        self.check_ours(&link, &p.module, |w| w.version.is_some())?;
        let vdir = self.versions().join(version);
        create_dir(&vdir, DIR_MODE)?;
        let written = (|| {
            for f in files {
                atomic::write_new(&vdir.join(component(&f.key)?), f.content.bytes(), self.mode)?;
            }
            fsync_dir(&vdir)?;
            fsync_dir(&self.versions())?;
            let tmp = p.tmp.rsplit('/').next().unwrap_or(&p.tmp);
            atomic::swap_symlink(&ns_dir, name, tmp, &Self::link_target(version))
        })();
        if let Err(e) = written {
            let _ = self.delete_version(version, &p.files);
            return Err(e);
        }
        Ok(Written {
            hash: p.hash.clone(),
            mode: p.mode,
            version: Some(version.to_string()),
            files: p.files.clone(),
            file: None,
        })
    }

    fn write_concat(&mut self, p: &Pending, files: &[ModuleFile]) -> io::Result<Written> {
        let name = p.file.clone().unwrap_or_default();
        self.check_ours(&self.dir.join(&name), &p.module, |w| {
            w.file.as_deref() == Some(&name)
        })?;
        let mut content = Vec::new();
        for f in files {
            let bytes = f.content.bytes();
            content.extend_from_slice(bytes);
            if !bytes.ends_with(b"\n") {
                content.push(b'\n');
            }
        }
        atomic::replace_file(&self.dir, &name, &p.tmp, &content, self.mode)?;
        Ok(Written {
            hash: p.hash.clone(),
            mode: p.mode,
            file: Some(name),
            ..Written::default()
        })
    }

    /// Removes what cmpoll wrote for `id` (and an emptied namespace folder it created).
    fn remove(&mut self, id: &str) -> io::Result<()> {
        let Some(w) = self.state.modules.get(id).cloned() else {
            return Ok(());
        };
        let (ns, name) = split_id(id);
        if let Some(version) = &w.version {
            let ns_dir = self.dir.join(component(ns)?);
            let link = ns_dir.join(component(name)?);
            match fs::read_link(&link) {
                Ok(t) if t == Self::link_target(version) => {
                    fs::remove_file(&link)?;
                    fsync_dir(&ns_dir)?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                _ => log::warn!(
                    "--out-dir: '{}' is no longer the link cmpoll made; leaving it",
                    link.display()
                ),
            }
            if self.state.namespaces.contains(ns) && remove_dir_if_empty(&ns_dir)? {
                self.state.namespaces.remove(ns);
                fsync_dir(&self.dir)?;
            }
        }
        if let Some(file) = &w.file {
            remove_if_exists(&self.dir.join(component(file)?))?;
            fsync_dir(&self.dir)?;
        }
        if let Some(w) = self.state.modules.remove(id) {
            self.retire(w);
        }
        Ok(())
    }

    /// Whether `id` is on disk as recorded, with `hash`, in this layout and mode.
    fn unchanged(&self, id: &str, entry: &Entry) -> bool {
        let Some(w) = self.state.modules.get(id) else {
            return false;
        };
        if w.hash != entry.hash.to_string() || w.mode != self.mode {
            return false;
        }
        let (ns, name) = split_id(id);
        match (self.layout, &w.version, &w.file) {
            (Layout::Files, Some(v), _) => {
                fs::read_link(self.dir.join(ns).join(name)).ok() == Some(Self::link_target(v))
                    && w.files
                        .iter()
                        .all(|f| self.versions().join(v).join(f).exists())
            }
            (Layout::Concat, _, Some(f)) => {
                self.concat_name(id).ok().as_deref() == Some(f) && self.dir.join(f).exists()
            }
            _ => false,
        }
    }

    /// Applies the writes and removals; returns the modules that failed.
    fn sync(
        &mut self,
        batch: &Batch,
        writes: Vec<&crate::snapshot::Event>,
        removals: Vec<String>,
    ) -> Result<Vec<String>, Fatal> {
        let mut failed = Vec::new();
        let mut planned = Vec::new();
        for e in writes {
            let files = match batch.files(e) {
                Ok(f) => f,
                Err(err) => {
                    log::warn!("--out-dir: {}: cannot read its contents back: {err}", e.id);
                    failed.push(e.id.clone());
                    continue;
                }
            };
            match self.plan(&e.id, &e.entry, &files) {
                Ok(p) => planned.push((p, files)),
                Err(err) => {
                    log::warn!("--out-dir: {}: {err}", e.id);
                    failed.push(e.id.clone());
                }
            }
        }
        self.state.pending = planned.iter().map(|(p, _)| p.clone()).collect();
        if let Err(e) = self.save() {
            // Without the record nothing may be written: the whole batch waits.
            log::warn!("--out-dir: cannot record the writes to come: {e}");
            self.state.pending.clear();
            let mut all: Vec<String> = planned.into_iter().map(|(p, _)| p.module).collect();
            all.extend(removals);
            all.extend(failed);
            return Ok(all);
        }
        for id in removals {
            if let Err(e) = self.remove(&id) {
                log::warn!("--out-dir: cannot remove {id}: {e}");
                failed.push(id);
            }
        }
        for (p, files) in planned {
            match self.write(&p, &files) {
                Ok(w) => {
                    if let Some(old) = self.state.modules.insert(p.module.clone(), w.clone()) {
                        if let Some(old_file) =
                            old.file.as_ref().filter(|f| Some(*f) != w.file.as_ref())
                        {
                            let _ = remove_if_exists(&self.dir.join(old_file));
                        }
                        if old.version != w.version {
                            self.retire(old);
                        }
                    }
                }
                Err(e) => {
                    log::warn!(
                        "--out-dir: cannot write {}: {e}; keeping the previous version, retrying next poll",
                        p.module
                    );
                    failed.push(p.module.clone());
                }
            }
        }
        self.state.pending.clear();
        if let Err(e) = self.expire(true) {
            log::warn!("--out-dir: cannot delete old versions: {e}");
        }
        self.save()
            .map_err(|e| Fatal(format!("--out-dir: cannot save '{META}/{STATE}': {e}")))?;
        Ok(failed)
    }
}

impl Sink for OutDir {
    fn name(&self) -> &'static str {
        "out-dir"
    }

    fn apply(&mut self, batch: &Batch) -> Result<Outcome, Fatal> {
        let (writes, removals) = if self.reconciled {
            let writes = batch
                .events
                .iter()
                .filter(|e| e.change != Change::Removed)
                .collect();
            let removals = batch
                .events
                .iter()
                .filter(|e| e.change == Change::Removed)
                .map(|e| e.id.clone())
                .collect();
            (writes, removals)
        } else {
            // The first batch after a start: every module is "added"; the folder may
            // already hold some of them, and some it holds may be gone from the cluster.
            let wanted: BTreeSet<&str> = batch.events.iter().map(|e| e.id.as_str()).collect();
            let removals = self
                .state
                .modules
                .keys()
                .filter(|id| !wanted.contains(id.as_str()))
                .cloned()
                .collect();
            let writes = batch
                .events
                .iter()
                .filter(|e| !self.unchanged(&e.id, &e.entry))
                .collect();
            (writes, removals)
        };
        let failed = self.sync(batch, writes, removals)?;
        self.reconciled = true;
        Ok(Outcome { failed })
    }

    fn tick(&mut self, _view: Option<&super::View>) -> Result<super::Control, Fatal> {
        if let Err(e) = self.expire(false) {
            log::warn!("--out-dir: cannot delete old versions: {e}");
        }
        Ok(super::Control::Continue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Synced;
    use crate::hash::Hash;
    use crate::module::Content;
    use crate::snapshot::Event;
    use crate::spool::Spool;

    struct Fixture {
        dir: tempfile::TempDir,
        spool: Spool,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture {
                dir: tempfile::tempdir().unwrap(),
                spool: Spool::memory(),
            }
        }

        fn open(&self, layout: Layout) -> OutDir {
            OutDir::open(self.dir.path(), layout, ".conf", 0o644, Duration::ZERO).unwrap()
        }

        fn event(&mut self, change: Change, id: &str, files: &[(&str, &str)]) -> Event {
            let files: Vec<ModuleFile> = files
                .iter()
                .map(|(k, v)| ModuleFile {
                    key: k.to_string(),
                    content: Content::Text(v.to_string()),
                })
                .collect();
            let loc = self.spool.put(&files).unwrap();
            Event {
                change,
                id: id.into(),
                entry: Entry {
                    uid: "u".into(),
                    resource_version: "1".into(),
                    hash: Hash::of(files.iter().map(|f| (f.key.as_str(), f.content.bytes()))),
                    loc,
                    files: files.len() as u32,
                    bytes: 0,
                },
            }
        }

        fn apply(&self, out: &mut OutDir, events: Vec<Event>) -> Vec<String> {
            let batch = Batch {
                events,
                synced: Synced::default(),
                spool: &self.spool,
                first: false,
            };
            out.apply(&batch).unwrap().failed
        }

        fn path(&self, p: &str) -> PathBuf {
            self.dir.path().join(p)
        }
    }

    #[test]
    fn files_layout_switches_a_symlink_and_records_it() {
        let mut f = Fixture::new();
        let mut out = f.open(Layout::Files);
        let e = f.event(Change::Added, "ns/m", &[("a.conf", "1"), ("b.conf", "2")]);
        assert!(f.apply(&mut out, vec![e]).is_empty());
        assert_eq!(fs::read_to_string(f.path("ns/m/a.conf")).unwrap(), "1");
        let first = fs::read_link(f.path("ns/m")).unwrap();
        assert!(first.starts_with("../.cmpoll/versions"), "{first:?}");
        let e = f.event(Change::Updated, "ns/m", &[("a.conf", "3")]);
        f.apply(&mut out, vec![e]);
        assert_ne!(fs::read_link(f.path("ns/m")).unwrap(), first);
        assert!(!f.path("ns/m/b.conf").exists());
        out.tick(None).unwrap();
        assert_eq!(
            fs::read_dir(f.path(".cmpoll/versions")).unwrap().count(),
            1,
            "old version gone"
        );
        let state: State =
            serde_json::from_slice(&fs::read(f.path(".cmpoll/state.json")).unwrap()).unwrap();
        assert!(state.pending.is_empty());
        assert_eq!(state.modules["ns/m"].files, ["a.conf"]);
        let e = f.event(Change::Removed, "ns/m", &[]);
        f.apply(&mut out, vec![e]);
        assert!(
            !f.path("ns").exists(),
            "an emptied namespace folder cmpoll made goes"
        );
    }

    #[test]
    fn concat_layout_and_newlines() {
        let mut f = Fixture::new();
        let mut out = f.open(Layout::Concat);
        let e = f.event(
            Change::Added,
            "ns/m",
            &[("a", "x"), ("b", "y\n"), ("c", "")],
        );
        f.apply(&mut out, vec![e]);
        assert_eq!(fs::read_to_string(f.path("ns.m.conf")).unwrap(), "x\ny\n\n");
        let e = f.event(Change::Removed, "ns/m", &[]);
        f.apply(&mut out, vec![e]);
        assert!(!f.path("ns.m.conf").exists());
    }

    #[test]
    fn foreign_files_are_never_replaced_or_removed() {
        let mut f = Fixture::new();
        fs::create_dir_all(f.path("ns")).unwrap();
        fs::write(f.path("ns/m"), "mine, not cmpoll's").unwrap();
        fs::write(f.path("ns/notes.txt"), "keep").unwrap();
        let mut out = f.open(Layout::Files);
        let bad = f.event(Change::Added, "ns/m", &[("a", "1")]);
        let good = f.event(Change::Added, "ns/n", &[("a", "1")]);
        assert_eq!(f.apply(&mut out, vec![bad, good]), ["ns/m"]);
        assert_eq!(
            fs::read_to_string(f.path("ns/m")).unwrap(),
            "mine, not cmpoll's"
        );
        let gone = f.event(Change::Removed, "ns/n", &[]);
        f.apply(&mut out, vec![gone]);
        assert!(
            f.path("ns/notes.txt").exists(),
            "a folder cmpoll did not make stays"
        );
        assert!(!f.path("ns/n").exists());
    }

    #[test]
    fn a_second_cmpoll_is_locked_out() {
        let f = Fixture::new();
        let _first = f.open(Layout::Files);
        let e = OutDir::open(f.dir.path(), Layout::Files, "", 0o644, Duration::ZERO)
            .err()
            .unwrap();
        assert!(
            e.contains("another cmpoll is writing to this folder"),
            "{e}"
        );
    }

    #[test]
    fn recovery_adopts_a_finished_switch_and_drops_an_unfinished_one() {
        let mut f = Fixture::new();
        {
            let mut out = f.open(Layout::Files);
            let e = f.event(Change::Added, "ns/done", &[("a", "1")]);
            let files = f.spool.get(e.entry.loc).unwrap();
            let done = out.plan("ns/done", &e.entry, &files).unwrap();
            let half = out.plan("ns/half", &e.entry, &files).unwrap();
            out.state.pending = vec![done.clone(), half.clone()];
            out.save().unwrap();
            // A crash after the first switch, in the middle of the second write.
            out.write(&done, &files).unwrap();
            let vdir = out.versions().join(half.version.as_ref().unwrap());
            fs::create_dir(&vdir).unwrap();
            fs::write(vdir.join("a"), "1").unwrap();
        }
        let out = f.open(Layout::Files);
        assert!(out.state.modules.contains_key("ns/done"));
        assert!(!out.state.modules.contains_key("ns/half"));
        assert_eq!(fs::read_dir(f.path(".cmpoll/versions")).unwrap().count(), 1);
        assert!(out.state.pending.is_empty());
    }
}
