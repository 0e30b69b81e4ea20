//! The output folder on a tight volume (issue 23.4): a tmpfs with a size limit, as a
//! `sizeLimit` emptyDir is, mounted in cmpoll's own mount namespace and looked at from
//! here through `/proc/PID/root`. Once the first batch is written, a volume that holds
//! the cluster's data once plus the changed modules twice is enough: the spool does not
//! keep a second copy of what the folder holds, and gives back what a poll took; when the
//! room is not there, the log and `/readyz` say how much is needed, and where.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use test_apiserver::TestApiserver;

use crate::util::tools::{curl, free_port};
use crate::util::{
    Cmpoll, Daemon, KillOnDrop, SOON, eventually, kinds, labelled, mount_namespace_available,
};

/// 200 KiB of text, different for every module and round.
fn content(i: usize, round: usize) -> String {
    format!("module {i} round {round}\n").repeat(200 * 1024 / 20)
}

/// A tmpfs of `size` in a mount namespace of its own, held by a `sleep`; cmpoll runs in
/// it through `nsenter`, and the test reads it through `/proc/PID/root`.
struct Volume {
    holder: KillOnDrop,
    /// Where it is mounted (the same path inside and, unmounted, outside).
    at: PathBuf,
}

impl Volume {
    fn mount(c: &Cmpoll, size: &str) -> Volume {
        let at = c.path("vol");
        fs::create_dir(&at).unwrap();
        let script = format!(
            "mount -t tmpfs -o size={size} tmpfs '{}' && exec sleep 600",
            at.display()
        );
        let holder = KillOnDrop(
            Command::new("unshare")
                .args(["--mount", "sh", "-c", &script])
                .spawn()
                .unwrap(),
        );
        let v = Volume { holder, at };
        eventually("the tmpfs", SOON, || {
            fs::read_to_string(format!("/proc/{}/mounts", v.holder.0.id()))
                .is_ok_and(|m| m.contains(&format!(" {} tmpfs ", v.at.display())))
        });
        v
    }

    /// `path` (under the mount point) as this process reaches it.
    fn inside(&self, path: &Path) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.holder.0.id()))
            .join(path.strip_prefix("/").unwrap())
    }

    /// Starts `cmpoll run args…` in the volume's mount namespace.
    fn daemon(&self, c: Cmpoll, args: &[&str]) -> Daemon {
        let target = self.holder.0.id().to_string();
        Daemon::start_wrapped(c, &["nsenter", "--target", &target, "--mount", "--"], args)
    }

    /// Free bytes on it.
    fn free(&self) -> u64 {
        let out = Command::new("stat")
            .args(["-f", "-c", "%a %S"])
            .arg(self.inside(&self.at))
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let v: Vec<u64> = text
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        v[0] * v[1]
    }
}

const MIB: u64 = 1 << 20;

#[test]
fn a_tight_volume_holds_the_data_once_plus_the_changes() {
    if !mount_namespace_available() {
        return;
    }
    let s = TestApiserver::start();
    // 1.6 MiB of modules on a 4 MiB volume: a spool that kept a copy of all of them
    // (3.2 MiB with the folder) has no room left for the 0.8 MiB of changes below, each
    // in the spool and in its new version; without that copy they fit (D + 2C = 3.2).
    for i in 0..8 {
        s.put(labelled("apps", &format!("m{i}")).data("k.conf", &content(i, 0)));
    }
    let c = Cmpoll::against(&s);
    let vol = Volume::mount(&c, "4m");
    let out = vol.at.join("out");
    let listen = format!("127.0.0.1:{}", free_port());
    let d = vol.daemon(
        c,
        &[
            "--interval",
            "100ms",
            "--out-dir",
            out.to_str().unwrap(),
            "--stdout-events",
            "--listen",
            &listen,
        ],
    );
    let read = |i: usize| fs::read_to_string(vol.inside(&out.join(format!("apps/m{i}/k.conf"))));
    let b = d.batch(SOON);
    assert_eq!(b.len(), 9, "{:?}", kinds(&b));
    assert_eq!(read(3).unwrap(), content(3, 0));
    // The spool gives back what the first batch took: the folder holds it.
    eventually("the spool's space back", SOON, || vol.free() > 2 * MIB);
    // Changes: each in the spool and in its new version, next to what the folder holds.
    for i in 0..4 {
        s.put(labelled("apps", &format!("m{i}")).data("k.conf", &content(i, 1)));
    }
    let b = d.batch(SOON);
    let updated = b.iter().filter(|e| e["type"] == "updated").count();
    assert_eq!(updated, 4, "{:?}\n{}", kinds(&b), d.stderr());
    for i in 0..4 {
        assert_eq!(read(i).unwrap(), content(i, 1));
    }
    // A module the volume has no room for: the poll fails and says how much it needs,
    // where; the spool gives back what it took; what is delivered stays.
    let before = vol.free();
    let big = "x".repeat((5 * MIB / 2) as usize);
    s.put(labelled("apps", "big").data("k.conf", &big));
    let want = format!("on the volume mounted at '{}'", vol.at.display());
    eventually("the poll to say what it needs", SOON, || {
        d.stderr().contains(&want)
    });
    let line = d
        .stderr()
        .lines()
        .find(|l| l.contains(&want))
        .unwrap()
        .to_string();
    assert!(
        line.contains("No space left on device") && line.contains("needs about 2.5 MiB"),
        "{line}"
    );
    eventually("the spool's space back after the failed poll", SOON, || {
        vol.free() + 64 * 1024 >= before
    });
    eventually("/readyz to say why", SOON, || {
        curl(&format!("http://{listen}/readyz"))
            .is_some_and(|(code, body)| code == 503 && body.contains(&want))
    });
    assert_eq!(read(0).unwrap(), content(0, 1));
    // Room again: it is delivered, and readiness comes back.
    s.delete("apps", "m7");
    s.put(labelled("apps", "big").data("k.conf", "small now"));
    let b = d.batch(SOON);
    assert!(
        b.iter().any(|e| e["module"] == "apps/big"),
        "{:?}",
        kinds(&b)
    );
    eventually("/readyz ready", SOON, || {
        curl(&format!("http://{listen}/readyz")).is_some_and(|(code, _)| code == 200)
    });
    d.stop();
}

/// A restart finds the folder holding the modules: they are read back from it, not
/// spooled again (a second copy of the data would not fit here).
#[test]
fn a_restart_on_a_tight_volume_reads_the_folder_back() {
    if !mount_namespace_available() {
        return;
    }
    let s = TestApiserver::start();
    for i in 0..6 {
        s.put(labelled("apps", &format!("m{i}")).data("k.conf", &content(i, 0)));
    }
    let c = Cmpoll::against(&s);
    let vol = Volume::mount(&c, "4m");
    let out = vol.at.join("out");
    let args = [
        "--interval",
        "100ms",
        "--out-dir",
        out.to_str().unwrap(),
        "--stdout-events",
    ];
    let again = || Cmpoll::against(&s);
    let d = vol.daemon(again(), &args);
    assert_eq!(d.batch(SOON).len(), 7);
    // Grown to 2.4 MiB two modules at a time: each step needs the data once plus twice
    // the two new ones.
    for step in 0..3 {
        for i in [6 + 2 * step, 7 + 2 * step] {
            s.put(labelled("apps", &format!("m{i}")).data("k.conf", &content(i, 0)));
        }
        let b = d.batch(SOON);
        assert_eq!(b.len(), 3, "step {step}: {:?}\n{}", kinds(&b), d.stderr());
    }
    d.stop();
    // 2.4 MiB in the folder, 1.6 MiB free: a restart that spooled every module again
    // would not fit.
    assert!(vol.free() < 2 * MIB, "{} free", vol.free());
    let d = vol.daemon(again(), &args);
    let b = d.batch(SOON);
    assert_eq!(b.len(), 13, "{:?}\n{}", kinds(&b), d.stderr());
    for e in &b[..12] {
        let i: usize = e["name"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(e["files"]["k.conf"].as_str().unwrap(), content(i, 0));
    }
    assert!(!d.stderr().contains("No space left"), "{}", d.stderr());
    d.stop();
}

/// Issue 42.1: a changed module that fits in the spool but not in the folder is left
/// unwritten; the poll succeeds, so before this only the log and `cmpoll status` said so.
/// `/readyz` now answers 503 naming the module, the volume's mount point, the room the
/// write needed and what is free, and `/status?state=unwritten` lists it; once the module
/// fits again it is written and `/readyz` is 200 by itself.
#[test]
fn a_module_the_folder_has_no_room_for_is_not_ready_until_it_is_written() {
    if !mount_namespace_available() {
        return;
    }
    let s = TestApiserver::start();
    for i in 0..8 {
        s.put(labelled("apps", &format!("m{i}")).data("k.conf", &content(i, 0)));
    }
    let c = Cmpoll::against(&s);
    let vol = Volume::mount(&c, "4m");
    let out = vol.at.join("out");
    let listen = format!("127.0.0.1:{}", free_port());
    let d = vol.daemon(
        c,
        &[
            "--interval",
            "100ms",
            "--out-dir",
            out.to_str().unwrap(),
            "--stdout-events",
            "--listen",
            &listen,
        ],
    );
    assert_eq!(d.batch(SOON).len(), 9);
    eventually("the spool's space back", SOON, || vol.free() > 2 * MIB);
    let readyz = || curl(&format!("http://{listen}/readyz")).unwrap();
    // Health hears of a poll after its sinks do.
    eventually("ready", SOON, || readyz().0 == 200);
    // 1.5 MiB: the poll spools it (the volume has about 2.3 MiB free), the folder then has
    // no room for its new version beside the old one.
    let big = "y".repeat((3 * MIB / 2) as usize);
    s.put(labelled("apps", "m0").data("k.conf", &big));
    let mount = format!("the volume mounted at '{}'", vol.at.display());
    eventually("/readyz to name the module and the volume", SOON, || {
        let (code, body) = readyz();
        code == 503 && body.contains("apps/m0 unwritten") && body.contains(&mount)
    });
    let (_, body) = readyz();
    assert!(
        body.contains("No space left on device")
            && body.contains("it needs about 1.5 MiB")
            && body.contains(" free"),
        "{body}"
    );
    let (code, status) = curl(&format!("http://{listen}/status?state=unwritten")).unwrap();
    assert_eq!(code, 200, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["modules"].as_array().unwrap().len(), 1, "{status}");
    assert_eq!(status["modules"][0]["module"], "apps/m0");
    assert_eq!(status["counts"]["unwritten"], 1);
    assert_eq!(status["counts"]["delivered"], 7);
    let metrics = curl(&format!("http://{listen}/metrics")).unwrap().1;
    assert!(
        metrics.contains("cmpoll_module_write_failures 1"),
        "{metrics}"
    );
    // Room again: written, ready again, by itself.
    s.put(labelled("apps", "m0").data("k.conf", "small again"));
    eventually("/readyz ready again", SOON, || readyz().0 == 200);
    assert_eq!(
        fs::read_to_string(vol.inside(&out.join("apps/m0/k.conf"))).unwrap(),
        "small again"
    );
    assert!(d.stderr().contains("apps/m0"), "{}", d.stderr());
    d.stop();
}

/// Issue 42.5: modules that grow until the volume is full never stop the daemon, in the
/// concat layout with a validator staging every module on the same volume (the spool, its
/// compaction, the journal, the record, the staging folder all meet a full volume on the
/// way); `/healthz` answers throughout, and once room is back the folder converges to the
/// cluster with nothing left over.
#[test]
fn a_full_volume_never_stops_the_daemon() {
    if !mount_namespace_available() {
        return;
    }
    let s = TestApiserver::start();
    let module = |i: usize, kib: usize| {
        labelled("apps", &format!("m{i}")).data("k.conf", &format!("{i}").repeat(kib * 1024))
    };
    for i in 0..8 {
        s.put(module(i, 16));
    }
    let c = Cmpoll::against(&s);
    let vol = Volume::mount(&c, "4m");
    let out = vol.at.join("out");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut d = vol.daemon(
        c,
        &[
            "--interval",
            "50ms",
            "--out-dir",
            out.to_str().unwrap(),
            "--layout",
            "concat",
            "--validate",
            "true",
            "--listen",
            &listen,
        ],
    );
    let healthz = || curl(&format!("http://{listen}/healthz")).map(|(code, _)| code);
    eventually("the first batch", SOON, || healthz() == Some(200));
    // 16 KiB to 1 MiB each: past 4 MiB in all from 512 KiB on.
    for kib in [32, 64, 128, 256, 512, 1024, 1024, 512] {
        for i in 0..8 {
            s.put(module(i, kib));
        }
        for _ in 0..6 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(
                d.is_running(),
                "at {kib} KiB a module the daemon stopped:\n{}",
                d.stderr()
            );
            assert_eq!(healthz(), Some(200), "at {kib} KiB\n{}", d.stderr());
        }
    }
    assert!(
        d.stderr().contains("No space left on device"),
        "the volume was full at some point:\n{}",
        d.stderr()
    );
    // Room again: the folder converges to the cluster.
    for i in 0..8 {
        s.put(module(i, 4));
    }
    let want: std::collections::BTreeMap<String, String> = (0..8)
        .map(|i| (format!("apps.m{i}"), format!("{i}").repeat(4096) + "\n"))
        .collect();
    eventually("the folder to equal the cluster", SOON, || {
        crate::util::tree(&vol.inside(&out)) == want
    });
    eventually("/readyz ready", SOON, || {
        curl(&format!("http://{listen}/readyz")).is_some_and(|(code, _)| code == 200)
    });
    assert!(crate::util::leftovers(&vol.inside(&out)).is_empty());
    d.stop();
}
