//! The integration test harness: run the real `cmpoll` binary with a scrubbed environment
//! and a fresh folder, against the test apiserver, and fail with everything needed to see
//! why (command, environment, stdout, stderr, the apiserver's request log).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_apiserver::{ConfigMap, Kubeconfig, TestApiserver};

pub mod fakehub;
pub mod flood;
pub mod http;
pub mod proxy;
pub mod reviewhook;
pub mod tools;

pub const BIN: &str = env!("CARGO_BIN_EXE_cmpoll");

/// How long a test waits for something that should happen at once (a batch, a file, an
/// answer) before it fails.
pub const SOON: Duration = Duration::from_secs(15);

/// The binary under test: `CMPOLL_TEST_BIN` (to run the suite against another build, for
/// example the commit before a fix, and see its regression tests fail), else this build's.
pub fn bin() -> String {
    std::env::var("CMPOLL_TEST_BIN").unwrap_or_else(|_| BIN.to_string())
}

/// Whether this run is CI's (`.ci/run` exports `CI=true`): a test that needs a tool or a
/// privilege fails there instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skips a test that cannot run here, loudly; under CI it fails instead.
pub fn skip_unless(available: bool, what: &str) -> bool {
    if available {
        return false;
    }
    assert!(
        !in_ci(),
        "{what} is needed and CI=true: this test must run here"
    );
    eprintln!("SKIPPED: {what} is not available here (under CI=true this fails)");
    true
}

/// A `cmpoll` invocation: a temp folder as HOME, only the variables a test sets.
pub struct Cmpoll {
    pub dir: tempfile::TempDir,
    args: Vec<String>,
    env: BTreeMap<String, String>,
}

/// What a finished run printed.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub described: String,
}

impl Run {
    pub fn success(self) -> Run {
        assert_eq!(self.code, Some(0), "expected success\n{}", self.described);
        self
    }

    pub fn failure(self, code: i32) -> Run {
        assert_eq!(
            self.code,
            Some(code),
            "expected exit {code}\n{}",
            self.described
        );
        self
    }

    /// The one `cmpoll: error: …` line.
    pub fn error_line(&self) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("cmpoll: error: "))
            .collect();
        assert_eq!(lines.len(), 1, "one error line\n{}", self.described);
        lines[0].trim_start_matches("cmpoll: error: ").to_string()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e})\n{}", self.described))
    }

    /// Module names of a `list --json` output.
    pub fn modules(&self) -> Vec<String> {
        self.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["module"].as_str().unwrap().to_string())
            .collect()
    }
}

impl Cmpoll {
    pub fn new() -> Cmpoll {
        let dir = tempfile::tempdir().unwrap();
        let mut env = BTreeMap::new();
        env.insert("PATH".into(), std::env::var("PATH").unwrap_or_default());
        env.insert("HOME".into(), dir.path().display().to_string());
        env.insert("RUST_LOG".into(), "info".into());
        Cmpoll {
            dir,
            args: Vec::new(),
            env,
        }
    }

    /// A run pointed at `server` through a kubeconfig with its default token.
    pub fn against(server: &TestApiserver) -> Cmpoll {
        Cmpoll::against_with(server, &Kubeconfig::token())
    }

    /// A run pointed at `server` through a kubeconfig written from `spec`.
    pub fn against_with(server: &TestApiserver, spec: &Kubeconfig) -> Cmpoll {
        let c = Cmpoll::new();
        let kc = server.write_kubeconfig(&c.path("kubeconfig"), spec);
        c.env("KUBECONFIG", kc.to_str().unwrap())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `FOLDER/out`, where tests point `--out-dir`.
    pub fn out(&self) -> PathBuf {
        self.path("out")
    }

    /// Starts `cmpoll run ARGS` in the background (see `Daemon::start`).
    pub fn daemon(self, args: &[&str]) -> Daemon {
        Daemon::start(self, args)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Cmpoll {
        self.args
            .extend(args.iter().map(|a| a.as_ref().to_string()));
        self
    }

    /// The same folder and environment with other arguments (the folder lives on in `self`).
    pub fn with_args<S: AsRef<str>>(&self, args: &[S]) -> Invocation<'_> {
        Invocation {
            base: self,
            args: args.iter().map(|a| a.as_ref().to_string()).collect(),
        }
    }

    pub fn env(mut self, k: &str, v: &str) -> Cmpoll {
        self.env.insert(k.into(), v.into());
        self
    }

    pub fn unset(mut self, k: &str) -> Cmpoll {
        self.env.remove(k);
        self
    }

    pub fn command(&self) -> Command {
        self.command_with(&self.args)
    }

    /// `wrapper… cmpoll args…` (for example under `unshare`), same folder and environment.
    pub fn wrapped(&self, wrapper: &[&str], args: &[&str]) -> Command {
        let mut cmd = Command::new(wrapper[0]);
        cmd.args(&wrapper[1..])
            .arg(bin())
            .args(args)
            .env_clear()
            .envs(&self.env)
            .current_dir(self.dir.path());
        cmd
    }

    fn command_with(&self, args: &[String]) -> Command {
        let mut cmd = Command::new(bin());
        cmd.args(args)
            .env_clear()
            .envs(&self.env)
            .current_dir(self.dir.path());
        cmd
    }

    pub fn describe(&self) -> String {
        format!("env: {:?}\nfolder: {}", self.env, self.dir.path().display())
    }

    pub fn run(&self) -> Run {
        self.run_with(&self.args)
    }

    fn run_with(&self, args: &[String]) -> Run {
        let out = bounded(self.command_with(args), RUN_LIMIT).unwrap_or_else(|| {
            panic!(
                "cmpoll {} did not exit within {RUN_LIMIT:?}; killed it\n{}",
                args.join(" "),
                self.describe()
            )
        });
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let described = format!(
            "command: cmpoll {}\n{}\nexit: {:?}\nstdout:\n{}\nstderr:\n{}",
            args.join(" "),
            self.describe(),
            out.status.code(),
            truncate(&stdout),
            stderr
        );
        Run {
            code: out.status.code(),
            stdout,
            stderr,
            described,
        }
    }

    /// Starts cmpoll in the background with piped stdout/stderr.
    pub fn spawn(&self) -> Child {
        self.command()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cmpoll")
    }
}

/// A run with other arguments in the same folder and environment.
pub struct Invocation<'a> {
    base: &'a Cmpoll,
    args: Vec<String>,
}

impl Invocation<'_> {
    pub fn run(&self) -> Run {
        self.base.run_with(&self.args)
    }

    /// Starts it in the background, output discarded.
    pub fn spawn(&self) -> Child {
        self.base
            .command_with(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn cmpoll")
    }
}

/// How long any one `cmpoll` run a test waits for may take: a run that hangs (the very
/// bug some tests look for) fails its test instead of hanging the suite.
pub const RUN_LIMIT: Duration = Duration::from_secs(120);

/// Runs `cmd` to completion with its output captured, or kills it after `limit` (`None`).
pub fn bounded(mut cmd: Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cmpoll");
    let read = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = read(Box::new(child.stdout.take().expect("piped")));
    let err = read(Box::new(child.stderr.take().expect("piped")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Some(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

fn truncate(s: &str) -> &str {
    let mut end = s.len().min(4000);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The module hash, computed independently of cmpoll's code: SPEC's framing over SHA-256.
pub fn spec_hash(files: &[(&str, &[u8])]) -> String {
    use sha2::{Digest, Sha256};
    let mut sorted: Vec<&(&str, &[u8])> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut h = Sha256::new();
    for (k, v) in sorted {
        let mut frame = Vec::new();
        frame.extend_from_slice(k.as_bytes());
        frame.push(0);
        frame.extend_from_slice(&(v.len() as u64).to_be_bytes());
        frame.extend_from_slice(v);
        h.update(&frame);
    }
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A running `cmpoll run` whose stdout events are read as they come.
pub struct Daemon {
    pub child: Child,
    pub cmd: Cmpoll,
    events: std::sync::mpsc::Receiver<serde_json::Value>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Daemon {
    /// The invocation it was started from (its folder and environment).
    pub fn cmd(&self) -> &Cmpoll {
        &self.cmd
    }

    /// Starts `cmpoll run` with `args` after `run`.
    pub fn start(cmd: Cmpoll, args: &[&str]) -> Daemon {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        let cmd = cmd.args(&all);
        let child = cmd.spawn();
        Daemon::attach(cmd, child)
    }

    /// Starts `cmpoll sidecar` (configured by the environment alone).
    pub fn sidecar(cmd: Cmpoll) -> Daemon {
        let cmd = cmd.args(&["sidecar"]);
        let child = cmd.spawn();
        Daemon::attach(cmd, child)
    }

    /// Starts `cmpoll webhook` (configured by `cmd`'s arguments and environment).
    pub fn webhook(cmd: Cmpoll, args: &[&str]) -> Daemon {
        let mut all = vec!["webhook"];
        all.extend_from_slice(args);
        let cmd = cmd.args(&all);
        let child = cmd.spawn();
        Daemon::attach(cmd, child)
    }

    /// Starts `cmpoll serve` (configured by `cmd`'s arguments and environment).
    pub fn serve(cmd: Cmpoll, args: &[&str]) -> Daemon {
        let mut all = vec!["serve"];
        all.extend_from_slice(args);
        let cmd = cmd.args(&all);
        let child = cmd.spawn();
        Daemon::attach(cmd, child)
    }

    /// Starts `wrapper… cmpoll run args…` (for example in a mount namespace).
    pub fn start_wrapped(cmd: Cmpoll, wrapper: &[&str], args: &[&str]) -> Daemon {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        Daemon::wrapped(cmd, wrapper, &all)
    }

    /// Starts `wrapper… cmpoll args…` (`args` name the command).
    pub fn wrapped(cmd: Cmpoll, wrapper: &[&str], all: &[&str]) -> Daemon {
        let child = cmd
            .wrapped(wrapper, all)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Daemon::attach(cmd, child)
    }

    fn attach(cmd: Cmpoll, mut child: Child) -> Daemon {
        let (tx, events) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let v: serde_json::Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { return };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Daemon {
            child,
            cmd,
            events,
            stderr,
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn context(&self) -> String {
        format!("{}\nstderr so far:\n{}", self.cmd.describe(), self.stderr())
    }

    /// The next event, or a panic after `within`.
    pub fn event(&self, within: std::time::Duration) -> serde_json::Value {
        self.events
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("no event within {within:?}\n{}", self.context()))
    }

    /// The events read so far and not yet taken, without waiting.
    pub fn events_so_far(&self) -> Vec<serde_json::Value> {
        self.events.try_iter().collect()
    }

    /// The events up to and including the next `synced`.
    pub fn batch(&self, within: std::time::Duration) -> Vec<serde_json::Value> {
        let deadline = std::time::Instant::now() + within;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let e = self.event(left.max(std::time::Duration::from_millis(1)));
            let done = e["type"] == "synced";
            out.push(e);
            if done {
                return out;
            }
        }
    }

    /// Asserts that nothing was emitted while `server` served `polls` more polls: proves
    /// the moment passed before it checks. The daemon applies a poll's batch before it
    /// starts the next poll, so once the apiserver has seen the first list of the poll
    /// after those, their events are on the pipe; a short grace lets the reader take them.
    /// `lists_per_poll`: the lists that start a scope (not continued pages) in one poll: 1,
    /// or the number of `--namespace` scopes, more where a poll lists a scope again.
    pub fn quiet_through(&self, server: &TestApiserver, polls: usize, lists_per_poll: usize) {
        let lists = || {
            server
                .requests()
                .iter()
                .filter(|r| r.is_list() && r.param("continue").is_none())
                .count()
        };
        let want = lists() + (polls + 1) * lists_per_poll;
        let start = Instant::now();
        while lists() < want {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the daemon stopped polling ({} of {want} lists)\n{}",
                lists(),
                self.context()
            );
            if let Ok(e) = self.events.try_recv() {
                panic!("unexpected event {e}\n{}", self.context());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Ok(e) = self.events.recv_timeout(Duration::from_millis(100)) {
            panic!("unexpected event {e}\n{}", self.context());
        }
    }

    /// The process started (a wrapper's, where there is one).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([format!("-{sig}"), self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Waits for the process to exit; its exit code (None if killed by a signal).
    pub fn wait(&mut self, within: std::time::Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("cmpoll did not exit within {within:?}\n{}", self.context());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// SIGTERM, then the exit code, which must be 0 (SPEC: a clean stop).
    pub fn stop(mut self) -> Option<i32> {
        self.signal("TERM");
        let code = self.wait(std::time::Duration::from_secs(10));
        assert_eq!(
            code,
            Some(0),
            "cmpoll did not stop cleanly\n{}",
            self.context()
        );
        code
    }

    /// SIGTERM, then the exit code, whatever it is.
    pub fn stop_with_code(mut self) -> Option<i32> {
        self.signal("TERM");
        self.wait(std::time::Duration::from_secs(10))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes an executable script.
pub fn script(c: &Cmpoll, name: &str, body: &str) -> PathBuf {
    let p = c.write(name, &format!("#!/bin/sh\n{body}"));
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// An agent that records what it hears, in `$LOGDIR` (see `agent_env`): `agent.log` has
/// `start PID` at each start, `hup CONTENT` at each SIGHUP (what `$OUT/ns/m/k` held
/// then) and `term` at SIGTERM; `hup.log` a line per SIGHUP; `stdin.log` a
/// `{"type":"start"}` line at each start, then what came on its stdin (`heard` leaves the
/// start lines out). It runs until told to stop or until cmpoll is gone, so a failed test
/// leaves nothing behind. (dash gives a background job /dev/null as stdin, hence the copy
/// to fd 3 first.)
const RECORDING_AGENT: &str = r#"
log="$LOGDIR/agent.log"
echo "start $$" >> "$log"
echo '{"type":"start"}' >> "$LOGDIR/stdin.log"
trap 'echo hup >> "$LOGDIR/hup.log"; echo "hup $(cat "$OUT/ns/m/k" 2>/dev/null)" >> "$log"' HUP
trap 'echo "term" >> "$log"; exit 0' TERM
exec 3<&0
cat <&3 >> "$LOGDIR/stdin.log" &
while kill -0 $PPID 2>/dev/null; do sleep 0.02; done
"#;

/// An agent that never reads its stdin, logging each start (`start PID`) to `agent.log`.
const DEAF_AGENT: &str = r#"
echo "start $$" >> "$LOGDIR/agent.log"
while kill -0 $PPID 2>/dev/null; do sleep 0.05; done
"#;

/// `c` with what the test agents need: `LOGDIR` (its `logs/`, made) and `OUT` (its output
/// folder).
pub fn agent_env(c: Cmpoll) -> Cmpoll {
    let logdir = c.path("logs");
    std::fs::create_dir_all(&logdir).unwrap();
    let out = c.out();
    c.env("LOGDIR", logdir.to_str().unwrap())
        .env("OUT", out.to_str().unwrap())
}

/// The recording agent (`RECORDING_AGENT`) in `c`'s folder.
pub fn recording_agent(c: &Cmpoll) -> PathBuf {
    script(c, "agent.sh", RECORDING_AGENT)
}

/// The deaf agent (`DEAF_AGENT`) in `c`'s folder.
pub fn deaf_agent(c: &Cmpoll) -> PathBuf {
    script(c, "deaf.sh", DEAF_AGENT)
}

/// What the recording agent heard on its stdin: `stdin.log` without its start lines.
pub fn heard(stdin_log: &Path) -> Vec<String> {
    (lines(stdin_log).into_iter())
        .filter(|l| l != r#"{"type":"start"}"#)
        .collect()
}

/// Lines of a log file (empty if it does not exist yet).
pub fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until `f` holds, or panics with `what`.
pub fn eventually(what: &str, within: Duration, f: impl FnMut() -> bool) {
    eventually_explained(what, within, f, String::new);
}

/// `eventually`, with `explain()` (logs, state) in the panic message.
pub fn eventually_explained(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> bool,
    explain: impl Fn() -> String,
) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < within,
            "timed out waiting: {what}\n{}",
            explain()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child process killed (and waited for) when it goes out of scope, so a test that fails
/// half-way leaves nothing running.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A ConfigMap with the default selector's label and no data yet.
pub fn labelled(ns: &str, name: &str) -> ConfigMap {
    ConfigMap::new(ns, name).label("cmpoll.io/module", "true")
}

/// A module ConfigMap: the default selector's label and one key `k`.
pub fn module(ns: &str, name: &str, v: &str) -> ConfigMap {
    labelled(ns, name).data("k", v)
}

/// A test apiserver holding `modules` (namespace, name, value of key `k`), and a `cmpoll`
/// pointed at it: the usual start of a test.
pub fn cluster(modules: &[(&str, &str, &str)]) -> (TestApiserver, Cmpoll) {
    let s = TestApiserver::start();
    for (ns, name, v) in modules {
        s.put(module(ns, name, v));
    }
    let c = Cmpoll::against(&s);
    (s, c)
}

/// Whether this machine lets a test make a PID namespace (`unshare --pid --fork`); under
/// CI a machine that cannot fails the test instead.
pub fn unshare_available() -> bool {
    let probe = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child", "true"])
        .status();
    !skip_unless(
        probe.is_ok_and(|s| s.success()),
        "unshare --pid --fork (a PID namespace)",
    )
}

/// Whether this machine lets a test make a mount namespace with a tmpfs in it.
pub fn mount_namespace_available() -> bool {
    let probe = std::process::Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k tmpfs /mnt",
        ])
        .status();
    !skip_unless(
        probe.is_ok_and(|s| s.success()),
        "unshare --mount with a tmpfs (root)",
    )
}

/// How many writes an output folder's record says were under way: the pending entries of
/// `state.json` plus the complete lines of the batch's journal (`journal.jsonl`).
pub fn pending_writes(out: &Path) -> usize {
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(".cmpoll/state.json")).unwrap_or_default())
            .unwrap_or_default();
    let in_record = record["pending"].as_array().map_or(0, Vec::len);
    let journal = std::fs::read(out.join(".cmpoll/journal.jsonl")).unwrap_or_default();
    in_record + journal.iter().filter(|b| **b == b'\n').count()
}

/// Every regular file under an output folder (following the module symlinks), except
/// `.cmpoll/`: relative path → contents. Read while cmpoll may be writing, what vanishes in
/// between is left out.
pub fn tree(dir: &Path) -> BTreeMap<String, String> {
    walk(dir, false)
}

/// `tree`, plus every symlink as `-> target`: what a reader resolving paths sees.
pub fn tree_with_links(dir: &Path) -> BTreeMap<String, String> {
    walk(dir, true)
}

fn walk(root: &Path, links: bool) -> BTreeMap<String, String> {
    fn visit(root: &Path, dir: &Path, links: bool, out: &mut BTreeMap<String, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            if rel == ".cmpoll" {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.file_type().is_symlink()
                && links
                && let Ok(target) = std::fs::read_link(&p)
            {
                out.insert(rel.clone(), format!("-> {}", target.display()));
            }
            if p.is_dir() {
                visit(root, &p, links, out);
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.insert(rel, String::from_utf8_lossy(&bytes).into_owned());
            }
        }
    }
    let mut out = BTreeMap::new();
    visit(root, root, links, &mut out);
    out
}

/// Every temporary name (`.cmpoll-tmp…`, `*.tmp`) left anywhere under a folder.
pub fn leftovers(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains("cmpoll-tmp") || name.ends_with(".tmp") {
                found.push(e.path().display().to_string());
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    found
}

/// `[(path, contents)]` as the map `tree` returns.
pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A batch's events as (type, module) pairs (`""` for `synced`).
pub fn kinds(batch: &[serde_json::Value]) -> Vec<(&str, &str)> {
    batch
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or(""),
                e["module"].as_str().unwrap_or(""),
            )
        })
        .collect()
}
