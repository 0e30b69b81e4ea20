//! The output folder's own names (`.cmpoll`, its record, journal and version folders) and
//! how a path inside it is looked at: what is there without following a symlink
//! (`found`), a folder reached part by part through real folders only (`folder_in`), a
//! path component checked to be one (`part`), the SHA-256 of a regular file. Nothing here
//! writes.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest as _, Sha256};

use super::record::component;
use super::written::Digest;

/// cmpoll's own folder inside the output folder: the record, the lock, version folders,
/// and the spool and agent feed files.
pub const META: &str = ".cmpoll";

pub(super) const VERSIONS: &str = "versions";

pub(super) const STATE: &str = "state.json";

/// The write-ahead journal of the batch under way (see `sync`).
pub(super) const JOURNAL: &str = "journal.jsonl";

pub(super) const DIR_MODE: u32 = 0o755;

/// `DIR/.cmpoll`.
pub fn meta_dir(dir: &Path) -> PathBuf {
    dir.join(META)
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(super) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// A checked path component (see `record::component`).
pub(super) fn part(s: &str) -> io::Result<&str> {
    component(s).map_err(invalid)
}

/// What is at a path, without following a symlink there.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found {
    Nothing,
    Dir,
    File,
    Link(PathBuf),
    Other,
}

pub(super) fn found(path: &Path) -> io::Result<Found> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Found::Nothing),
        Err(e) => Err(e),
        Ok(m) if m.is_symlink() => Ok(Found::Link(fs::read_link(path)?)),
        Ok(m) if m.is_dir() => Ok(Found::Dir),
        Ok(m) if m.is_file() => Ok(Found::File),
        Ok(_) => Ok(Found::Other),
    }
}

pub(super) fn not_a_folder(path: &Path) -> io::Error {
    io::Error::other(format!(
        "'{}' is not a folder cmpoll can write to (a file or a symlink it did not make)",
        path.display()
    ))
}

/// `DIR/FOLDER` (a module's folder in the `files` layout: `NS`, or `KIND/NS` for a
/// kind-qualified id) if every part of it is a real folder; `None` if a part is missing.
/// Anything else (a symlink, a file) is never reached through: an error.
pub(super) fn folder_in(dir: &Path, folder: &str) -> io::Result<Option<PathBuf>> {
    let mut path = dir.to_path_buf();
    for c in folder.split('/') {
        path.push(part(c)?);
        match found(&path)? {
            Found::Dir => {}
            Found::Nothing => return Ok(None),
            _ => return Err(not_a_folder(&path)),
        }
    }
    Ok(Some(path))
}

/// `.cmpoll/versions` as seen from `DIR/FOLDER/` (`../` once per part of FOLDER).
pub(super) fn versions_from(folder: &str) -> PathBuf {
    let mut p = PathBuf::new();
    for _ in folder.split('/') {
        p.push("..");
    }
    p.join(META).join(VERSIONS)
}

pub(super) fn not_ours(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "'{}' exists and cmpoll did not write it; leaving it alone",
            path.display()
        ),
    )
}

pub(super) fn digest(bytes: &[u8]) -> Digest {
    Digest(Sha256::digest(bytes).into())
}

/// The SHA-256 of a regular file (not through a symlink); `None` if it is not one.
pub(super) fn file_digest(path: &Path) -> io::Result<Option<Digest>> {
    if found(path)? != Found::File {
        return Ok(None);
    }
    Ok(Some(digest(&fs::read(path)?)))
}
