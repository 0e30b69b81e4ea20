//! The output folder at scale (issue 29): `cmpoll run --once --out-dir` of N two-key
//! modules into an empty folder on a disk and on tmpfs, the sync calls a first start makes
//! (counted by `strace -c`), a restart with nothing changed, a restart with one module
//! changed, and the daemon's peak RSS with `--out-dir` after its first batch and a few
//! polls. With `--baseline PATH` every figure is also taken of that binary, in the same
//! run, and printed beside as a ratio.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use test_apiserver::{ConfigMap, Kubeconfig, Options, TestApiserver};

use super::{mib, run_measured, wait_lists};

/// What one binary did at one size.
#[derive(Default)]
struct Figures {
    disk_first: f64,
    tmpfs_first: f64,
    restart_same: f64,
    restart_one: f64,
    syncs: Option<u64>,
    daemon_peak_kib: u64,
}

/// The modules measured, and how they are written.
#[derive(Clone, Copy, Debug)]
pub struct Shape<'a> {
    /// Bytes of each of a module's keys (about).
    pub key_bytes: usize,
    /// Keys a module has (two by default).
    pub keys: usize,
    /// `--layout`.
    pub layout: &'a str,
}

/// N modules of `keys` keys (two by default) of `key_bytes` each (about: 512 by default)
/// in 20 namespaces.
fn load(server: &TestApiserver, n: usize, round: usize, shape: Shape) {
    for i in 0..n {
        let fill = "x".repeat(shape.key_bytes.saturating_sub(12));
        let body = |k: usize| format!("{fill}{round}-{i}-{k}\n");
        let mut cm = ConfigMap::new(&format!("ns-{:02}", i % 20), &format!("module-{i:06}"))
            .label("cmpoll.io/module", "true");
        for k in 0..shape.keys {
            cm = cm.data(&format!("{}.conf", (b'a' + k as u8) as char), &body(k));
        }
        server.put(cm);
    }
}

fn once(cmpoll: &Path, kubeconfig: &Path, out: &Path, layout: &str) -> Command {
    let mut c = Command::new(cmpoll);
    c.env("CMPOLL_LAYOUT", layout);
    c.args(["run", "--once", "--max-response-bytes", "1Gi", "--out-dir"])
        .arg(out)
        .args(["--old-version-ttl", "0s"])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn");
    c
}

/// Sync calls (fsync, fdatasync, syncfs, sync_file_range) of a first start, from
/// `strace -c`; `None` without strace.
fn count_syncs(cmpoll: &Path, kubeconfig: &Path, out: &Path, layout: &str) -> Option<u64> {
    let report = out.with_extension("strace");
    let mut c = Command::new("strace");
    c.env("CMPOLL_LAYOUT", layout)
        .args(["-f", "-c", "-o"])
        .arg(&report)
        .args(["-e", "trace=fsync,fdatasync,syncfs,sync_file_range"])
        .arg(cmpoll)
        .args(["run", "--once", "--max-response-bytes", "1Gi", "--out-dir"])
        .arg(out)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let status = c.status().ok()?;
    if !status.success() {
        return None;
    }
    let text = std::fs::read_to_string(&report).ok()?;
    let _ = std::fs::remove_file(&report);
    // The summary's last line: "100.00  0.5  …  calls  errors total".
    text.lines()
        .find(|l| l.trim_end().ends_with("total"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|calls| calls.parse().ok())
}

fn disk_dir() -> PathBuf {
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-outdir");
    std::fs::create_dir_all(&target).unwrap();
    target
}

/// A fresh ext4 filesystem on a loop device (an image file on the disk), for one binary at
/// one size: a first start on a disk is timed by ext4's inode allocator as much as by
/// cmpoll, and on a filesystem where earlier runs deleted many inodes the allocator skips
/// them one by one (`recently_deleted`), several-fold slower and different in every run.
/// Needs root, mkfs.ext4 and loop devices; `None` where they are not (the bench then uses
/// a folder on the disk as it is, and says so).
struct FreshFs {
    image: PathBuf,
    mount: tempfile::TempDir,
}

impl FreshFs {
    fn new(n: usize) -> Option<FreshFs> {
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let image = disk_dir().join(format!("fresh-{}-{n}.img", std::process::id()));
        // A version folder and two files of one block each per module, with room to spare.
        let bytes = (n as u64 * 16 * 1024).max(1 << 30) + (256 << 20);
        std::fs::File::create(&image).ok()?.set_len(bytes).ok()?;
        let inodes = (n * 4 + 10_000).to_string();
        let ok = |c: &mut Command| {
            c.stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let mount = tempfile::tempdir().ok()?;
        let made = ok(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-N", &inodes])
            .arg(&image))
            && ok(Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(mount.path()));
        if !made {
            let _ = std::fs::remove_file(&image);
            return None;
        }
        Some(FreshFs { image, mount })
    }

    fn path(&self) -> &Path {
        self.mount.path()
    }
}

impl Drop for FreshFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mount.path()).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// One binary at one size. The first start on a disk runs on a fresh filesystem where it
/// can (`FreshFs`); the other folders live on in `keep` until the part ends: deleting
/// hundreds of thousands of inodes just before a first start makes ext4's inode
/// allocator skip the recently deleted ones one by one (`recently_deleted` in a profile),
/// which would time the filesystem, not cmpoll.
fn measure(cmpoll: &Path, n: usize, shape: Shape, keep: &mut Vec<tempfile::TempDir>) -> Figures {
    let server = TestApiserver::start_with(Options {
        plain_http: true,
        ..Options::default()
    });
    load(&server, n, 0, shape);
    let kc_dir = tempfile::tempdir().unwrap();
    let kc = server.write_kubeconfig(&kc_dir.path().join("kubeconfig"), &Kubeconfig::token());
    let mut f = Figures::default();
    let fresh = FreshFs::new(n);
    let disk = tempfile::tempdir_in(
        fresh
            .as_ref()
            .map_or(disk_dir(), |f| f.path().to_path_buf()),
    )
    .unwrap();
    let out = disk.path().join("out");
    f.disk_first = run_measured(&mut once(cmpoll, &kc, &out, shape.layout)).wall;
    f.restart_same = run_measured(&mut once(cmpoll, &kc, &out, shape.layout)).wall;
    let changed = ConfigMap::new("ns-07", "module-000007")
        .label("cmpoll.io/module", "true")
        .data("a.conf", "changed\n")
        .data("b.conf", "changed too\n");
    server.put(changed);
    f.restart_one = run_measured(&mut once(cmpoll, &kc, &out, shape.layout)).wall;
    let shm = Path::new("/dev/shm");
    let tmpfs = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    f.tmpfs_first = run_measured(&mut once(
        cmpoll,
        &kc,
        &tmpfs.path().join("out"),
        shape.layout,
    ))
    .wall;
    drop(tmpfs);
    drop(disk);
    drop(fresh);
    if n <= 10_000 {
        let counted = tempfile::tempdir_in(disk_dir()).unwrap();
        f.syncs = count_syncs(cmpoll, &kc, &counted.path().join("out"), shape.layout);
        keep.push(counted);
    }
    // The daemon into an empty folder: its first batch, then five more polls.
    let daemon_dir = tempfile::tempdir_in(disk_dir()).unwrap();
    let lists = super::lists_so_far(&server);
    let mut child = Command::new(cmpoll)
        .env("CMPOLL_LAYOUT", shape.layout)
        .args(["run", "--interval", "500ms", "--jitter", "0"])
        .args(["--max-response-bytes", "1Gi", "--out-dir"])
        .arg(daemon_dir.path().join("out"))
        .env("KUBECONFIG", &kc)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_lists(&server, lists + 6);
    f.daemon_peak_kib = test_apiserver::proc_status_kib(child.id(), "VmHWM");
    let _ = child.kill();
    let _ = child.wait();
    keep.push(daemon_dir);
    f
}

/// Runs the part: every size, this build and the baseline.
pub fn run(cmpoll: &Path, baseline: Option<&Path>, sizes: &[usize], shape: Shape) {
    let fresh = FreshFs::new(1).is_some();
    println!(
        "output folder: `run --once --out-dir --layout {}` of N {}-key modules ({} x {} B), wall seconds; disk = {}",
        shape.layout,
        shape.keys,
        shape.keys,
        shape.key_bytes,
        if fresh {
            format!(
                "a fresh ext4 on a loop device per binary and size, its image in {}",
                disk_dir().display()
            )
        } else {
            format!(
                "{} ({}; not fresh: run as root for a fresh ext4 per measurement)",
                disk_dir().display(),
                fs_type(&disk_dir())
            )
        }
    );
    println!(
        "  {:<10} {:>10} {:>10} {:>12} {:>12} {:>10} {:>14}",
        "binary", "disk", "tmpfs", "restart", "1 changed", "syncs", "daemon peak"
    );
    let mut keep = Vec::new();
    for &n in sizes {
        println!("  {n} modules:");
        let now = measure(cmpoll, n, shape, &mut keep);
        print_row("this", &now);
        if let Some(before) = baseline {
            let then = measure(before, n, shape, &mut keep);
            print_row("baseline", &then);
            println!(
                "  {:<10} {:>9.1}x {:>9.1}x {:>11.1}x {:>11.1}x {:>10} {:>13.2}x",
                "speed-up",
                then.disk_first / now.disk_first,
                then.tmpfs_first / now.tmpfs_first,
                then.restart_same / now.restart_same,
                then.restart_one / now.restart_one,
                match (then.syncs, now.syncs) {
                    (Some(t), Some(n)) => format!("{t} -> {n}"),
                    _ => "-".into(),
                },
                now.daemon_peak_kib as f64 / then.daemon_peak_kib.max(1) as f64,
            );
        }
    }
}

fn print_row(name: &str, f: &Figures) {
    println!(
        "  {:<10} {:>9.2}s {:>9.2}s {:>11.2}s {:>11.2}s {:>10} {:>14}",
        name,
        f.disk_first,
        f.tmpfs_first,
        f.restart_same,
        f.restart_one,
        f.syncs.map_or("-".into(), |s| s.to_string()),
        mib(f.daemon_peak_kib),
    );
}

/// The filesystem type of the mount holding `path`, from /proc/mounts (longest prefix).
fn fs_type(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && path.starts_with(f[1])).then(|| (f[1].len(), f[2].to_string()))
        })
        .max()
        .map(|(_, t)| t)
        .unwrap_or_else(|| "?".into())
}
