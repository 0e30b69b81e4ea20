//! `--remotecfg ROOT` and `--remotecfg-arguments FILE`: the platform's part of what every
//! collector runs. ROOT is Alloy text put first in each collector's content, as it is (the
//! components the offered arguments refer to: `prometheus.remote_write "default"`…); the
//! arguments file is `--offer-arguments`' `NAME = VALUE` lines, and with them the template
//! of docs/alloy.md (`MODULE_TEMPLATE`, k8s/alloy's `module.tmpl`) is made a
//! `template::Template`, the one that wraps and checks every module. Both files are read at
//! the start (unreadable: a usage error) and again when either changes (length or mtime,
//! looked at once a second at most); a file that cannot be read or parsed then keeps the
//! last good root, said once in the log. ROOT may instead be `configmap:NS/NAME`
//! (`configmap.rs`): read at the start likewise, then again after the hub's polls, every
//! 10 s at most (`refresh`, on the poll's thread: no collector's call waits for the
//! apiserver).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest as _, Sha256};

pub use self::configmap::Named;
use crate::locks::Recover;
use crate::template::Template;

pub mod configmap;

/// Each module's wrapping: k8s/alloy's `module.tmpl`, as docs/alloy.md shows it.
pub const MODULE_TEMPLATE: &str =
    "// {{module}}: the ConfigMap {{name}} of namespace {{namespace}}, delivered by cmpoll as a
// module of its own (content {{hash}}). Its components live in this declare block, so
// their labels never meet another module's; it is instantiated once, with the offered
// arguments it declares.
declare \"{{ident}}\" {
{{content}}}

{{ident}} \"module\" {
  {{arguments}}
}
";

/// How often the files are looked at, at most.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How often a ConfigMap's root is read again, at most (a GET of the apiserver on the
/// poll's thread, which it may hold up to `--timeout`).
const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// Where the root is: a file, or a ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    File(PathBuf),
    ConfigMap(Named),
}

/// `--remotecfg ROOT` and `--remotecfg-arguments FILE`, as settings decided them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    pub root: Location,
    pub arguments: Option<PathBuf>,
}

/// Reads a path of the apiserver (`accept`): the body, bounded; or why not.
pub type Fetch = Box<dyn Fn(&str, &str) -> Result<Vec<u8>, String> + Send + Sync>;

/// The root and the template, as read.
#[derive(Debug)]
pub struct Root {
    pub text: String,
    pub template: Template,
    /// SHA-256 of the root's text, the template and the offered arguments: a new one
    /// makes every module's wrapping and every composition again.
    pub fingerprint: [u8; 32],
}

/// Where the files are, and what was last read of them.
pub struct RootFiles {
    root: Source,
    arguments: Option<PathBuf>,
    state: Mutex<State>,
}

/// Where the root is read from.
enum Source {
    File(PathBuf),
    ConfigMap(Named, Fetch),
}

struct State {
    current: Arc<Root>,
    /// (length, mtime) of each file when last read.
    stamps: Vec<Option<(u64, SystemTime)>>,
    looked: Instant,
    /// The last failure said, not said again.
    said: Option<String>,
}

impl Root {
    /// `text` and the `NAME = VALUE` lines of `arguments` (from `origin`, for messages).
    pub fn parse(text: String, arguments: Option<(&str, &str)>) -> Result<Root, String> {
        let template = Template::parse(MODULE_TEMPLATE, arguments, "the module template")?;
        let mut h = Sha256::new();
        h.update(text.as_bytes());
        h.update([0]);
        h.update(template.recorded(&crate::poll::hash::Hash([0; 32])).0);
        Ok(Root {
            text,
            template,
            fingerprint: h.finalize().into(),
        })
    }
}

impl RootFiles {
    /// Reads both files: an error is a usage error, naming the flag. A ConfigMap is read
    /// with `fetch` (none given: an error).
    pub fn open(paths: Paths, fetch: Option<Fetch>) -> Result<RootFiles, String> {
        let Paths { root, arguments } = paths;
        let root = match (root, fetch) {
            (Location::File(p), _) => Source::File(p),
            (Location::ConfigMap(n), Some(f)) => Source::ConfigMap(n, f),
            (Location::ConfigMap(n), None) => {
                return Err(format!("{}: no apiserver to read it from", n.shown()));
            }
        };
        let current = root.read(arguments.as_deref())?;
        let stamps = root.stamps(arguments.as_deref());
        Ok(RootFiles {
            root,
            arguments,
            state: Mutex::new(State {
                current: Arc::new(current),
                stamps,
                looked: Instant::now(),
                said: None,
            }),
        })
    }

    /// The root now: read again when a file changed (a ConfigMap's: by `refresh`).
    pub fn current(&self, now: Instant) -> Arc<Root> {
        let mut s = self.state.lock().recover();
        if matches!(self.root, Source::ConfigMap(..))
            || now.saturating_duration_since(s.looked) < LOOK_EVERY
        {
            return s.current.clone();
        }
        s.looked = now;
        let stamps = self.root.stamps(self.arguments.as_deref());
        if stamps == s.stamps {
            return s.current.clone();
        }
        let read = self.root.read(self.arguments.as_deref());
        taken(&mut s, read, stamps);
        s.current.clone()
    }

    /// A ConfigMap's root read again (after a poll of the hub's, `REFRESH_EVERY` at
    /// most), outside the lock `current` takes; a file's is read by `current`.
    pub fn refresh(&self, now: Instant) {
        if let Source::File(_) = self.root {
            return;
        }
        {
            let mut s = self.state.lock().recover();
            if now.saturating_duration_since(s.looked) < REFRESH_EVERY {
                return;
            }
            s.looked = now;
        }
        let read = self.root.read(self.arguments.as_deref());
        let stamps = self.root.stamps(self.arguments.as_deref());
        let mut s = self.state.lock().recover();
        let same = matches!(&read, Ok(r) if r.fingerprint == s.current.fingerprint);
        if same {
            s.said = None;
            return;
        }
        taken(&mut s, read, stamps);
    }
}

/// `read` taken into `s`: a new root (said), or the error said once (the last root kept).
fn taken(s: &mut State, read: Result<Root, String>, stamps: Vec<Option<(u64, SystemTime)>>) {
    match read {
        Ok(r) => {
            log::info!("--remotecfg: read again ({} bytes of root)", r.text.len());
            s.current = Arc::new(r);
            s.stamps = stamps;
            s.said = None;
        }
        Err(e) => {
            if s.said.as_deref() != Some(&e) {
                log::warn!("{e}; the collectors are served the last root read");
                s.said = Some(e);
            }
        }
    }
}

impl Source {
    /// (length, mtime) of each file read.
    fn stamps(&self, arguments: Option<&Path>) -> Vec<Option<(u64, SystemTime)>> {
        let stamp = |p: &Path| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.len(), m.modified().ok()?))
        };
        let root = match self {
            Source::File(p) => Some(p.as_path()),
            Source::ConfigMap(..) => None,
        };
        root.into_iter().chain(arguments).map(stamp).collect()
    }

    /// The root, with the arguments of `arguments` (else a ConfigMap's own).
    fn read(&self, arguments: Option<&Path>) -> Result<Root, String> {
        let (text, theirs, origin) = match self {
            Source::File(root) => {
                let text = std::fs::read_to_string(root)
                    .map_err(|e| format!("--remotecfg '{}': {e}", root.display()))?;
                (text, None, String::new())
            }
            Source::ConfigMap(n, fetch) => {
                let answer = fetch(&n.path(), "application/json")
                    .map_err(|e| format!("{}: {e}", n.shown()))?;
                let (text, args) = n.read(&answer)?;
                (
                    text,
                    args,
                    format!("{}'s key {}", n.shown(), configmap::ARGUMENTS_KEY),
                )
            }
        };
        let args = match arguments {
            Some(p) => Some((
                std::fs::read_to_string(p)
                    .map_err(|e| format!("--remotecfg-arguments '{}': {e}", p.display()))?,
                format!("--remotecfg-arguments '{}'", p.display()),
            )),
            None => theirs.map(|a| (a, origin)),
        };
        Root::parse(text, args.as_ref().map(|(a, o)| (a.as_str(), o.as_str())))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The wrapping is k8s/alloy's, byte for byte: what docs/alloy.md shows is served.
    #[test]
    fn the_template_is_k8s_alloys() {
        let shipped = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/alloy/module.tmpl"),
        )
        .unwrap();
        assert_eq!(MODULE_TEMPLATE, shipped);
    }

    /// `configmap:NS/NAME`: read at the start (unreadable: the error naming it), its
    /// `arguments` key offered, read again by `refresh` alone (never by a collector's
    /// call), the last good root kept while an answer cannot be read.
    #[test]
    fn a_configmaps_root_is_read_again_after_each_poll() {
        let answer = Arc::new(Mutex::new(Err::<String, String>("403 forbidden".into())));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let fetch = |answer: &Arc<Mutex<Result<String, String>>>| -> Fetch {
            let (answer, asked) = (answer.clone(), asked.clone());
            Box::new(move |path: &str, _: &str| {
                asked.lock().unwrap().push(path.to_string());
                answer.lock().unwrap().clone().map(String::into_bytes)
            })
        };
        let cm = |root: &str, args: &str| {
            serde_json::json!({"kind": "ConfigMap",
                "metadata": {"name": "root", "namespace": "ops"},
                "data": {"root.alloy": root, "arguments": args}})
            .to_string()
        };
        let paths = Paths {
            root: Location::ConfigMap(Named::parse("configmap:ops/root").unwrap().unwrap()),
            arguments: None,
        };
        let e = RootFiles::open(paths.clone(), Some(fetch(&answer)))
            .err()
            .unwrap();
        assert_eq!(e, "--remotecfg configmap:ops/root: 403 forbidden");
        *answer.lock().unwrap() = Ok(cm("// one\n", "receiver = x.y\n"));
        let f = RootFiles::open(paths, Some(fetch(&answer))).unwrap();
        let t = Instant::now();
        let first = f.current(t);
        assert_eq!(first.text, "// one\n");
        let with = |args| Root::parse("// one\n".into(), args).unwrap().fingerprint;
        assert_eq!(
            first.fingerprint,
            with(Some(("receiver = x.y\n", "the key")))
        );
        assert_ne!(first.fingerprint, with(None), "its arguments key offered");
        *answer.lock().unwrap() = Ok(cm("// two\n", "receiver = x.y\n"));
        let n = asked.lock().unwrap().len();
        assert_eq!(f.current(t + 10 * LOOK_EVERY).text, "// one\n");
        assert_eq!(
            asked.lock().unwrap().len(),
            n,
            "no call reads the apiserver"
        );
        f.refresh(t);
        assert_eq!(f.current(t).text, "// one\n", "not read again within 10 s");
        let t = t + REFRESH_EVERY;
        f.refresh(t);
        assert_eq!(f.current(t).text, "// two\n");
        assert_eq!(
            asked.lock().unwrap().last().unwrap(),
            "/api/v1/namespaces/ops/configmaps/root"
        );
        *answer.lock().unwrap() = Err("503".into());
        f.refresh(t + REFRESH_EVERY);
        *answer.lock().unwrap() = Ok(cm("// three\n", "not an argument line\n"));
        f.refresh(t + 2 * REFRESH_EVERY);
        assert_eq!(f.current(t).text, "// two\n", "the last good root kept");
    }

    #[test]
    fn the_files_are_read_again_when_they_change() {
        let dir = std::env::temp_dir().join(format!("cmpoll-rc-root-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (root, args) = (dir.join("root.alloy"), dir.join("args"));
        std::fs::write(&root, "// one\n").unwrap();
        std::fs::write(&args, "receiver = x.y\n").unwrap();
        let f = RootFiles::open(
            Paths {
                root: Location::File(root.clone()),
                arguments: Some(args.clone()),
            },
            None,
        )
        .unwrap();
        let t = Instant::now();
        let first = f.current(t);
        assert_eq!(first.text, "// one\n");
        std::fs::write(&root, "// two, longer\n").unwrap();
        assert_eq!(
            f.current(t).text,
            "// one\n",
            "not looked at within a second"
        );
        let later = t + LOOK_EVERY;
        assert_eq!(f.current(later).text, "// two, longer\n");
        assert_ne!(f.current(later).fingerprint, first.fingerprint);
        // A bad arguments file keeps the last good root.
        std::fs::write(&args, "not an argument line\n").unwrap();
        let kept = f.current(later + LOOK_EVERY);
        assert_eq!(kept.text, "// two, longer\n");
        std::fs::remove_dir_all(&dir).unwrap();
        let e = RootFiles::open(
            Paths {
                root: Location::File(root),
                arguments: None,
            },
            None,
        )
        .err()
        .unwrap();
        assert!(e.starts_with("--remotecfg '"), "{e}");
    }
}
