//! The volume a folder is on: its free space and where it is mounted, for messages that
//! tell an operator how much room a write needs and where (a `sizeLimit` emptyDir, a
//! small disk).

use std::path::{Path, PathBuf};

/// What a folder's volume has room for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// Bytes an unprivileged writer may still use (`f_bavail`).
    pub free: u64,
    /// Its mount point, as `/proc/self/mountinfo` names it (`None` if unknown).
    pub mount: Option<PathBuf>,
}

impl Volume {
    /// The volume `dir` is on; `None` if it cannot be asked.
    pub fn of(dir: &Path) -> Option<Volume> {
        let st = rustix::fs::statvfs(dir).ok()?;
        let dir = dir.canonicalize().ok()?;
        let mount = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|info| mount_point(&info, &dir));
        Some(Volume {
            free: st.f_bavail.saturating_mul(st.f_frsize),
            mount,
        })
    }

    /// `the volume at '/out' (1.2 MiB free)`.
    pub fn describe(&self) -> String {
        match &self.mount {
            Some(m) => format!(
                "the volume mounted at '{}' ({} free)",
                m.display(),
                size(self.free)
            ),
            None => format!("its volume ({} free)", size(self.free)),
        }
    }
}

/// The longest mount point in `mountinfo` (field 5, octal escapes) that holds `dir`.
fn mount_point(mountinfo: &str, dir: &Path) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape(m)))
        .filter(|m| dir.starts_with(m))
        .max_by_key(|m| m.as_os_str().len())
}

/// mountinfo's `\040`-style escapes (space, tab, newline, backslash).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Bytes for people: `812 B`, `4.0 KiB`, `1.9 MiB`, `2.3 GiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_mount_point_holding_the_folder_wins() {
        let info = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 0:40 / /out rw - tmpfs tmpfs rw,size=2048k
31 22 0:41 / /out2 rw - tmpfs tmpfs rw
32 22 0:42 / /with\\040space rw - tmpfs tmpfs rw
";
        let at = |d: &str| mount_point(info, Path::new(d));
        assert_eq!(at("/out/.cmpoll"), Some(PathBuf::from("/out")));
        assert_eq!(at("/out2"), Some(PathBuf::from("/out2")));
        assert_eq!(at("/outer"), Some(PathBuf::from("/")));
        assert_eq!(at("/with space/x"), Some(PathBuf::from("/with space")));
    }

    #[test]
    fn sizes_read_well() {
        for (n, want) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1_990_000, "1.9 MiB"),
            (5 << 30, "5.0 GiB"),
        ] {
            assert_eq!(size(n), want);
        }
    }

    #[test]
    fn a_real_folder_has_a_volume() {
        let d = tempfile::tempdir().unwrap();
        let v = Volume::of(d.path()).unwrap();
        assert!(v.mount.is_some(), "{v:?}");
        assert!(Volume::of(Path::new("/no/such/folder")).is_none());
    }
}
