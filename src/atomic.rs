//! Durable, atomic file operations (afterburn's `write_file_atomic`, plus the fsyncs it
//! lacks): a file is written under a temporary name, fsynced, given its mode, renamed over
//! its final name, and its folder fsynced, so after a crash either the old or the new
//! content is there, whole. A symlink is swapped the same way. Nothing here follows a
//! symlink it did not just create: new files are created with `O_EXCL`.
//!
//! For many files at once (a batch), the same steps come unsynced (`create_new`,
//! `place_symlink`, `place_file`) and the caller makes them durable together with one
//! `sync_volume` between the writes and the renames, and one after the renames: the order
//! that matters after a power loss (contents before the names that point at them) is kept
//! with two syncs, however many files.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates a folder with exactly `mode` (not reduced by the umask).
pub fn create_dir(path: &Path, mode: u32) -> io::Result<()> {
    DirBuilder::new().mode(mode).create(path)?;
    fs::set_permissions(path, Permissions::from_mode(mode))
}

/// Creates a new file (never an existing one, and never through a symlink: `O_CREAT|O_EXCL`
/// fails on a symlink at the last component), writes it, sets exactly `mode`, fsyncs it.
#[cfg(test)]
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_new_with(path, mode, |w| w.write_all(bytes))
}

/// `write_new`, the content streamed by `write` (through a buffer) instead of held whole.
pub fn write_new_with(
    path: &Path,
    mode: u32,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    create_new_with(path, mode, write)?.sync_all()
}

/// `write_new` without the fsync: durable only after a `sync_volume`.
pub fn create_new(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    create_new_with(path, mode, |w| w.write_all(bytes)).map(drop)
}

fn create_new_with(
    path: &Path,
    mode: u32,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<File> {
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let mut w = io::BufWriter::with_capacity(64 * 1024, f);
    write(&mut w)?;
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.set_permissions(Permissions::from_mode(mode))?;
    Ok(f)
}

/// Makes everything written so far on `path`'s filesystem durable: one `syncfs(2)`, for
/// a batch of files written with `create_new` and renamed with `place_*`.
pub fn sync_volume(path: &Path) -> io::Result<()> {
    rustix::fs::syncfs(File::open(path)?).map_err(io::Error::from)
}

/// Makes a folder's entries (creations, renames, removals) durable.
pub fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// Replaces `dir/name` with `bytes` atomically, through `dir/tmp`.
pub fn replace_file(dir: &Path, name: &str, tmp: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace_file_with(dir, name, tmp, mode, |w| w.write_all(bytes))
}

/// `replace_file`, the content streamed by `write`. If `write` fails, the temporary file
/// is removed and `dir/name` is untouched.
pub fn replace_file_with(
    dir: &Path,
    name: &str,
    tmp: &str,
    mode: u32,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let tmp_path = dir.join(tmp);
    if let Err(e) = write_new_with(&tmp_path, mode, write) {
        if e.kind() != io::ErrorKind::AlreadyExists {
            let _ = fs::remove_file(&tmp_path);
        }
        return Err(e);
    }
    if let Err(e) = fs::rename(&tmp_path, dir.join(name)) {
        let _ = fs::remove_file(&tmp_path);
        return Err(e);
    }
    fsync_dir(dir)
}

/// Points `dir/name` at `target` atomically, through a symlink at `dir/tmp`.
#[cfg(test)]
pub fn swap_symlink(dir: &Path, name: &str, tmp: &str, target: &Path) -> io::Result<()> {
    place_symlink(dir, name, tmp, target)?;
    fsync_dir(dir)
}

/// `swap_symlink` without the fsync of `dir`.
pub fn place_symlink(dir: &Path, name: &str, tmp: &str, target: &Path) -> io::Result<()> {
    let tmp_path = dir.join(tmp);
    std::os::unix::fs::symlink(target, &tmp_path)?;
    place_file(dir, name, tmp)
}

/// Renames `dir/tmp` over `dir/name`, unsynced; on failure `dir/tmp` is removed.
pub fn place_file(dir: &Path, name: &str, tmp: &str) -> io::Result<()> {
    let tmp_path = dir.join(tmp);
    if let Err(e) = fs::rename(&tmp_path, dir.join(name)) {
        let _ = fs::remove_file(&tmp_path);
        return Err(e);
    }
    Ok(())
}

/// Removes a file if it exists.
pub fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Removes an empty folder if it exists; a folder that is not empty is left alone.
pub fn remove_dir_if_empty(path: &Path) -> io::Result<bool> {
    match fs::remove_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn files_get_exact_modes_and_never_overwrite() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        write_new(&p, b"x", 0o640).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
        assert_eq!(
            write_new(&p, b"y", 0o644).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("link")).unwrap();
        assert!(
            write_new(&d.path().join("link"), b"y", 0o644).is_err(),
            "never through a symlink"
        );
        create_dir(&d.path().join("sub"), 0o755).unwrap();
        assert_eq!(
            fs::metadata(d.path().join("sub")).unwrap().mode() & 0o7777,
            0o755
        );
    }

    #[test]
    fn replace_and_swap_are_atomic_renames() {
        let d = tempfile::tempdir().unwrap();
        replace_file(d.path(), "c", ".tmp1", b"one", 0o644).unwrap();
        let ino = fs::metadata(d.path().join("c")).unwrap().ino();
        replace_file(d.path(), "c", ".tmp2", b"two", 0o644).unwrap();
        assert_eq!(fs::read(d.path().join("c")).unwrap(), b"two");
        assert_ne!(
            fs::metadata(d.path().join("c")).unwrap().ino(),
            ino,
            "a new file"
        );
        swap_symlink(d.path(), "l", ".tmp3", Path::new("a")).unwrap();
        swap_symlink(d.path(), "l", ".tmp4", Path::new("b")).unwrap();
        assert_eq!(fs::read_link(d.path().join("l")).unwrap(), Path::new("b"));
        let names: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "no temporary names left: {names:?}");
    }

    #[test]
    fn removal_helpers_leave_what_is_not_theirs() {
        let d = tempfile::tempdir().unwrap();
        remove_if_exists(&d.path().join("nope")).unwrap();
        fs::create_dir(d.path().join("full")).unwrap();
        fs::write(d.path().join("full/foreign"), "x").unwrap();
        assert!(!remove_dir_if_empty(&d.path().join("full")).unwrap());
        assert!(d.path().join("full/foreign").exists());
        fs::create_dir(d.path().join("empty")).unwrap();
        assert!(remove_dir_if_empty(&d.path().join("empty")).unwrap());
    }
}
