//! One validation: the module's files staged in a fresh folder (one file per key) plus their
//! concatenation (as `--layout concat` writes it), and `/bin/sh -c CMD` run there with
//! `CMPOLL_MODULE`, `CMPOLL_MODULE_DIR`, `CMPOLL_MODULE_FILE` and `CMPOLL_HASH`, stdin from
//! /dev/null, stdout and stderr kept together (the first 4 KiB), in its own process group,
//! killed with it at `--validate-timeout`. The staged files go when it is done.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::ops::process;
use crate::poll::hash::Hash;
use crate::poll::snapshot::{STEM_MAX, stem};
use crate::reason::{MAX_REASON, REFUSED, Rejection, cut};
use crate::source::{ModuleFile, Resources};
use crate::template;

/// The output kept of a validator (stdout and stderr together).
pub const KEEP: usize = 4096;

#[derive(Clone, Debug)]
pub struct Options {
    pub command: String,
    pub timeout: Duration,
    /// Validations run at once.
    pub jobs: usize,
    /// `DIR/.cmpoll` with `--out-dir` (staging and the record of rejections), else `None`:
    /// a private folder under `$TMPDIR`, and rejections kept in memory only.
    pub meta_dir: Option<PathBuf>,
    /// `--ext` (concat), for `CMPOLL_MODULE_FILE`'s name.
    pub ext: String,
    /// `--module-template` (concat): `CMPOLL_MODULE_FILE` is the module as it will be
    /// written.
    pub template: Option<std::sync::Arc<crate::template::Template>>,
    /// What is listed: a remembered module's kind follows from its id.
    pub kinds: Resources,
    /// `--confirm CMD`: after delivery, the agent says which modules it refused.
    pub confirm: Option<String>,
    /// `--out-dir`, for `CMPOLL_OUT_DIR` (absolute).
    pub out_dir: Option<PathBuf>,
}

/// What a confirmation may keep of the command's stdout: one line per refused module.
const CONFIRM_KEEP: usize = 256 * 1024;

/// Runs `--confirm CMD` for `modules` (delivered, added or updated): the modules it
/// refused, each with the rest of its line (or why it refused with no word), or why the
/// agent could not be asked (a non-zero exit, a signal, the timeout). Lines naming a
/// module not asked about are ignored; stderr goes to the log.
pub fn confirm(o: &Options, command: &str, modules: &[&str]) -> Result<Vec<Rejection>, Unasked> {
    let mut cmd = std::process::Command::new("/bin/sh");
    let mut list = modules.join("\n");
    list.push('\n');
    cmd.arg("-c").arg(command).env("CMPOLL_MODULES", list);
    if let Some(dir) = &o.out_dir {
        cmd.env(
            "CMPOLL_OUT_DIR",
            std::path::absolute(dir).unwrap_or_else(|_| dir.clone()),
        );
    }
    let stderr: process::Lines = Box::new(|line: &[u8]| {
        log::info!("--confirm: {}", String::from_utf8_lossy(line).trim_end());
    });
    let done = process::run_bounded(
        cmd,
        o.timeout,
        process::Capture::Split(CONFIRM_KEEP, stderr),
    )
    .map_err(|e| Unasked::CannotRun(format!("/bin/sh: {e}")))?;
    match done.exit {
        Some(exit) if exit.success() => {}
        Some(exit) => return Err(Unasked::Failed(exit.to_string())),
        None => return Err(Unasked::TimedOut(o.timeout)),
    }
    let out = String::from_utf8_lossy(&done.output);
    let mut refused: Vec<Rejection> = Vec::new();
    for line in out.lines() {
        let line = line.trim();
        let (id, why) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        if !modules.contains(&id) || refused.iter().any(|r| r.module == id) {
            continue;
        }
        let why = why.trim();
        let why = if why.is_empty() {
            "(no reason given)"
        } else {
            why
        };
        let why = format!("{REFUSED}{why}");
        refused.push(Rejection::new(id, cut(&why, MAX_REASON)));
    }
    Ok(refused)
}

/// Why the agent could not be asked (`--confirm`): typed for the caller, which tells
/// readiness the reason without the flag's name, and the log with it (`Display`: today's
/// one-line message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unasked {
    /// The command could not be started.
    CannotRun(String),
    /// It ended with a failure (a non-zero exit, a signal): how.
    Failed(String),
    /// It ran past `--validate-timeout` and was killed.
    TimedOut(std::time::Duration),
}

impl Unasked {
    /// Why, without the flag's name (as readiness words every reload path's failure).
    pub fn reason(&self) -> String {
        match self {
            Unasked::CannotRun(why) => why.clone(),
            Unasked::Failed(exit) => format!("the agent could not be asked: it {exit}"),
            Unasked::TimedOut(t) => format!(
                "killed after --validate-timeout {}",
                humantime::format_duration(*t)
            ),
        }
    }
}

impl std::fmt::Display for Unasked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "--confirm: {}", self.reason())
    }
}

/// What the validator said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// A non-zero exit, a signal, the timeout: the content is refused (its output, or why).
    Fail(String),
    /// Exit 126/127, or it could not be started: the validator cannot run.
    Error(String),
}

/// How a reason says the validator ran out of time.
const KILLED: &str = "validator killed after --validate-timeout";

/// Whether a `Fail` reason is the timeout's (the webhook fails open on it).
pub fn timed_out(reason: &str) -> bool {
    reason.lines().last().is_some_and(|l| l.contains(KILLED))
}

/// The staging folder: `DIR/.cmpoll/stage`, else a private folder under `$TMPDIR`.
pub struct Stage {
    dir: PathBuf,
    seq: AtomicU64,
    _tmp: Option<tempfile::TempDir>,
}

impl Stage {
    pub fn new(meta_dir: Option<&Path>) -> Result<Stage, String> {
        let (dir, tmp) = match meta_dir {
            Some(meta) => {
                let dir = meta.join("stage");
                // What an earlier run staged and did not clean up (a crash): cmpoll's own.
                if dir.is_dir() && !dir.is_symlink() {
                    fs::remove_dir_all(&dir).map_err(|e| {
                        format!("--validate: cannot clear '{}': {e}", dir.display())
                    })?;
                }
                crate::atomic::create_dir(&dir, 0o700)
                    .map_err(|e| format!("--validate: cannot create '{}': {e}", dir.display()))?;
                (dir, None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("cmpoll-validate-")
                    .tempdir()
                    .map_err(|e| {
                        format!("--validate: cannot create a staging folder in $TMPDIR: {e}")
                    })?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        Ok(Stage {
            dir,
            seq: AtomicU64::new(0),
            _tmp: tmp,
        })
    }

    /// Stages `files` of module `id` and runs the validator on them.
    pub fn validate(&self, o: &Options, id: &str, hash: &Hash, files: &[ModuleFile]) -> Verdict {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        // Beside the folder: `NAME{EXT}` (`--ext`), else `NAME.concat`; both names fit
        // in a path element however long the module's name.
        let ext = if o.ext.is_empty() { ".concat" } else { &o.ext };
        let room = STEM_MAX.saturating_sub(ext.len()).max(32);
        let name = format!("{}.{n:x}", stem(id, room));
        let dir = self.dir.join(&name);
        let file = self.dir.join(format!("{name}{ext}"));
        let joined = template::concat(o.template.as_deref(), id, files);
        let verdict = stage(&dir, &file, files, &joined)
            .map_err(|e| Verdict::Error(format!("cannot stage its files: {e}")))
            .map(|()| run(o, id, hash, &dir, &file));
        let _ = fs::remove_dir_all(&dir);
        let _ = fs::remove_file(&file);
        // Text the template refuses (an Alloy module that would leave its block) is
        // refused even when the validator, which sees it wrapped, lets it pass; when
        // both refuse, the validator's words (the agent's own) are kept.
        match verdict.unwrap_or_else(|v| v) {
            Verdict::Pass => match o.template.as_deref().and_then(|t| t.refuses(files)) {
                Some(why) => Verdict::Fail(why),
                None => Verdict::Pass,
            },
            other => other,
        }
    }
}

fn stage(dir: &Path, file: &Path, files: &[ModuleFile], joined: &[u8]) -> std::io::Result<()> {
    crate::atomic::create_dir(dir, 0o700)?;
    for f in files {
        // Keys were checked (a single path component) when the module was made.
        fs::write(dir.join(&f.key), f.content.bytes())?;
    }
    fs::write(file, joined)
}

fn run(o: &Options, id: &str, hash: &Hash, dir: &Path, file: &Path) -> Verdict {
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(&o.command)
        .current_dir(dir)
        .env("CMPOLL_MODULE", id)
        .env("CMPOLL_MODULE_DIR", dir)
        .env("CMPOLL_MODULE_FILE", file)
        .env("CMPOLL_HASH", hash.to_string());
    let done = match process::run_bounded(cmd, o.timeout, process::Capture::Merged(KEEP)) {
        Ok(d) => d,
        Err(e) => return Verdict::Error(format!("/bin/sh: {e}")),
    };
    let output = String::from_utf8_lossy(&done.output);
    let output = output.trim_end();
    // The output, cut so that it and what happened fit a reason's 4 KiB together: the
    // exit status is never the part that is lost.
    let with = |what: String| {
        if output.is_empty() {
            what
        } else {
            let room = MAX_REASON.saturating_sub(what.len() + "\n()".len());
            format!("{}\n({what})", cut(output, room))
        }
    };
    match done.exit {
        Some(exit) if exit.success() => Verdict::Pass,
        Some(exit) if matches!(exit.code, Some(126 | 127)) => {
            let what = format!("validator cannot run: it {exit}: ");
            let room = MAX_REASON.saturating_sub(what.len());
            Verdict::Error(format!("{what}{}", cut(output, room)))
        }
        Some(exit) => Verdict::Fail(with(format!("validator {exit}"))),
        None => Verdict::Fail(with(format!(
            "{KILLED} {}",
            humantime::format_duration(o.timeout)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Content;

    fn opts(command: &str) -> Options {
        Options {
            command: command.into(),
            timeout: std::time::Duration::from_secs(10),
            jobs: 1,
            meta_dir: None,
            ext: ".yaml".into(),
            template: None,
            kinds: Default::default(),
            confirm: None,
            out_dir: None,
        }
    }

    fn files() -> Vec<ModuleFile> {
        ["a.yaml", "b.yaml"]
            .iter()
            .map(|k| ModuleFile {
                key: k.to_string(),
                content: Content::Text(format!("{k} here")),
            })
            .collect()
    }

    #[test]
    fn the_validator_sees_the_staged_module_and_its_environment() {
        let stage = Stage::new(None).unwrap();
        let h = Hash([7; 32]);
        let script = r#"test "$PWD" = "$CMPOLL_MODULE_DIR" && test "$(ls)" = "a.yaml
b.yaml" && test "$CMPOLL_MODULE" = ns/m && test "$CMPOLL_HASH" = "sha256:0707070707070707070707070707070707070707070707070707070707070707" && case "$CMPOLL_MODULE_FILE" in *.yaml) ;; *) exit 1;; esac && test "$(cat "$CMPOLL_MODULE_FILE")" = "a.yaml here
b.yaml here" && ! read x"#;
        assert_eq!(
            stage.validate(&opts(script), "ns/m", &h, &files()),
            Verdict::Pass
        );
        match stage.validate(
            &opts("echo bad line 3; echo oops >&2; exit 1"),
            "ns/m",
            &h,
            &files(),
        ) {
            Verdict::Fail(why) => {
                assert_eq!(why, "bad line 3\noops\n(validator exited with status 1)")
            }
            v => panic!("{v:?}"),
        }
        match stage.validate(&opts("no-such-validator-xyz"), "ns/m", &h, &files()) {
            Verdict::Error(why) => {
                assert!(why.contains("cannot run") && why.contains("127"), "{why}")
            }
            v => panic!("{v:?}"),
        }
        let mut no_ext = opts(
            "case \"$CMPOLL_MODULE_FILE\" in *.concat) test -f \"$CMPOLL_MODULE_FILE\";; *) exit 1;; esac",
        );
        no_ext.ext = String::new();
        assert_eq!(stage.validate(&no_ext, "ns/m", &h, &files()), Verdict::Pass);
        let long = stage.validate(
            &opts("yes x | head -c 100000; exit 2"),
            "ns/m",
            &h,
            &files(),
        );
        let Verdict::Fail(why) = long else { panic!() };
        assert!(why.len() <= MAX_REASON, "{}", why.len());
        assert!(why.ends_with("(validator exited with status 2)"), "{why}");
        assert!(!timed_out(&why));
        let mut quick = opts("echo started; sleep 5");
        quick.timeout = std::time::Duration::from_millis(200);
        let Verdict::Fail(why) = stage.validate(&quick, "ns/m", &h, &files()) else {
            panic!()
        };
        assert!(timed_out(&why), "{why}");
        assert_eq!(
            fs::read_dir(&stage.dir).unwrap().count(),
            0,
            "staged files are removed"
        );
    }
}
