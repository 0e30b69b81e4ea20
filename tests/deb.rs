//! The Debian package for the systemd shape (`packaging/deb/build.sh`): lintian finds
//! nothing in it; installed with `dpkg -i` it has the binary, the unit (which
//! `systemd-analyze verify` accepts, with the agent drop-in example applied to an agent's
//! unit), the user, folders and conffile; `dpkg -r` keeps the conffile, `dpkg -P` leaves
//! nothing behind but `/var/lib/cmpoll`, where the operator's modules live.
//!
//! It installs into this machine's own root, seen through an overlay in a private mount
//! namespace: the real dpkg, maintainer scripts, systemd-sysusers and systemd-tmpfiles run
//! as on a host, the host is left as it was, and the overlay's upper folder is exactly what
//! the package changed, so "nothing left behind" is read from it, not guessed.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::util::tools::tool;
use crate::util::{bin, root, skip_unless};

/// A private mount namespace in which `/` is an overlay of the host's root (`merged`),
/// kept open by a sleeping process.
struct Overlay {
    holder: Child,
    dir: tempfile::TempDir,
}

impl Overlay {
    fn new(deb_dir: &Path) -> Overlay {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let script = format!(
            "set -e; mkdir -p {d}/u {d}/w {d}/m
mount -t overlay overlay -o lowerdir=/,upperdir={d}/u,workdir={d}/w {d}/m
for m in proc dev sys; do mount --rbind /$m {d}/m/$m; done
mkdir -p {d}/m/run/pkg && mount --bind {deb} {d}/m/run/pkg
echo mounted; exec sleep 3600",
            deb = deb_dir.display()
        );
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(holder.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "mounted", "the overlay could not be mounted");
        Overlay { holder, dir }
    }

    /// `sh -c CMD` chrooted into the overlay: (success, stdout and stderr).
    fn sh(&self, cmd: &str) -> (bool, String) {
        let out = Command::new("nsenter")
            .arg("-t")
            .arg(self.holder.id().to_string())
            .args(["-m", "chroot"])
            .arg(self.merged())
            .args(["sh", "-c", cmd])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn ok(&self, cmd: &str) -> String {
        let (ok, out) = self.sh(cmd);
        assert!(ok, "{cmd}: {out}");
        out
    }

    /// Whether `path` is there, as the overlay's root sees it.
    fn exists(&self, path: &str) -> bool {
        self.sh(&format!("test -e {path} || test -L {path}")).0
    }

    fn merged(&self) -> PathBuf {
        self.dir.path().join("m")
    }

    fn upper(&self) -> PathBuf {
        self.dir.path().join("u")
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Every path under `dir`, relative to it, with its metadata.
fn walk(dir: &Path, under: &Path, out: &mut Vec<(PathBuf, std::fs::Metadata)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let meta = std::fs::symlink_metadata(e.path()).unwrap();
        let rel = under.join(e.file_name());
        if meta.is_dir() {
            walk(&e.path(), &rel, out);
        }
        out.push((rel, meta));
    }
}

#[test]
fn the_debian_package_installs_verifies_and_purges_cleanly() {
    let root_user = rustix::process::geteuid().is_root();
    let tools = [
        "dpkg-deb",
        "dpkg",
        "lintian",
        "systemd-analyze",
        "unshare",
        "nsenter",
        "chroot",
    ];
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| tool(t).is_none())
        .collect();
    if skip_unless(
        root_user && missing.is_empty(),
        &format!("root and {tools:?} (missing: {missing:?}; root: {root_user})"),
    ) {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let built = Command::new(root().join("packaging/deb/build.sh"))
        .arg(bin())
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let deb = PathBuf::from(String::from_utf8(built.stdout).unwrap().trim());
    let name = deb.file_name().unwrap().to_str().unwrap().to_string();

    // Debian's own checker, warnings and notes included (the overrides say why).
    let lint = Command::new("lintian")
        .args(["--fail-on", "error,warning,info", "--no-tag-display-limit"])
        .arg(&deb)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&lint.stdout).to_string();
    assert!(
        lint.status.success() && said.trim().is_empty(),
        "lintian: {said}"
    );

    let o = Overlay::new(out.path());
    let (installed, _) = o.sh("dpkg -s cmpoll");
    assert!(!installed, "a cmpoll package is installed on this machine");
    o.ok(&format!("dpkg -i /run/pkg/{name}"));
    assert_eq!(
        o.ok("cmpoll --version").trim(),
        format!("cmpoll {}", env!("CARGO_PKG_VERSION"))
    );
    o.ok("systemd-analyze verify /usr/lib/systemd/system/cmpoll.service");
    assert!(
        o.ok("grep ^ExecStart= /usr/lib/systemd/system/cmpoll.service")
            .starts_with("ExecStart=/usr/bin/cmpoll run")
    );
    assert!(o.ok("getent passwd cmpoll").contains(":/var/lib/cmpoll:"));
    assert_eq!(
        o.ok("stat -c '%a %U %G' /var/lib/cmpoll /var/lib/cmpoll/modules /etc/cmpoll/cmpoll.env"),
        "750 cmpoll cmpoll\n750 cmpoll cmpoll\n640 root cmpoll\n"
    );
    assert_eq!(
        o.ok("dpkg-query -W -f '${Conffiles}' cmpoll")
            .split_whitespace()
            .next(),
        Some("/etc/cmpoll/cmpoll.env")
    );
    // The agent drop-in example, applied to an agent's unit, is a unit systemd accepts,
    // and gives the agent the group.
    o.ok("mkdir -p /etc/systemd/system/agent.service.d && printf '[Service]\\nExecStart=/bin/true\\n' > /etc/systemd/system/agent.service && cp /usr/share/doc/cmpoll/examples/agent-dropin.conf /etc/systemd/system/agent.service.d/cmpoll.conf");
    o.ok("systemd-analyze verify /etc/systemd/system/agent.service");
    assert!(o.ok("systemctl cat agent.service 2>/dev/null || cat /etc/systemd/system/agent.service.d/cmpoll.conf").contains("SupplementaryGroups=cmpoll"));
    o.ok("rm -r /etc/systemd/system/agent.service /etc/systemd/system/agent.service.d");
    // The operator's data: a module cmpoll wrote.
    o.ok(
        "mkdir -p /var/lib/cmpoll/modules/ns/m && echo rules > /var/lib/cmpoll/modules/ns/m/a.yaml",
    );

    // Removed: the binary goes, the conffile stays.
    o.ok("dpkg -r cmpoll");
    assert!(!o.exists("/usr/bin/cmpoll"));
    assert!(o.exists("/etc/cmpoll/cmpoll.env"));
    // Purged: nothing of the package is left but the operator's state.
    o.ok("dpkg -P cmpoll");
    assert!(!o.exists("/etc/cmpoll"));
    assert_eq!(o.ok("cat /var/lib/cmpoll/modules/ns/m/a.yaml"), "rules\n");

    // What the overlay holds now is what the package changed on the host.
    let mut changed = Vec::new();
    walk(&o.upper(), Path::new("/"), &mut changed);
    let mut left = Vec::new();
    for (path, meta) in &changed {
        let whiteout = meta.file_type().is_char_device() && meta.rdev() == 0;
        let on_host = std::fs::symlink_metadata(path).is_ok();
        let p = path.to_str().unwrap();
        let state = p == "/var/lib/cmpoll" || p.starts_with("/var/lib/cmpoll/");
        // dpkg's own records and log, and the user database systemd-sysusers wrote to.
        // /run is a tmpfs on a host (systemd-analyze leaves its units-load stamp there).
        let records =
            p.starts_with("/var/lib/dpkg/") || p == "/var/log/dpkg.log" || p.starts_with("/run/");
        let users = [
            "/etc/passwd",
            "/etc/group",
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/.pwd.lock",
        ]
        .iter()
        .any(|u| p == *u || p.strip_prefix(u) == Some("-"));
        if whiteout || state || records || users || (meta.is_dir() && on_host) {
            continue;
        }
        left.push(format!(
            "{p} ({}, mode {:o})",
            if on_host { "changed" } else { "new" },
            meta.permissions().mode()
        ));
    }
    assert!(left.is_empty(), "the purged package left behind: {left:#?}");
}
