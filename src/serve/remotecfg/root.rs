//! `--remotecfg ROOT` and `--remotecfg-arguments FILE`: the platform's part of what every
//! collector runs. ROOT is Alloy text put first in each collector's content, as it is (the
//! components the offered arguments refer to: `prometheus.remote_write "default"`…); the
//! arguments file is `--offer-arguments`' `NAME = VALUE` lines, and with them the template
//! of docs/alloy.md (`MODULE_TEMPLATE`, k8s/alloy's `module.tmpl`) is made a
//! `template::Template`, the one that wraps and checks every module. Both files are read at
//! the start (unreadable: a usage error) and again when either changes (length or mtime,
//! looked at once a second at most); a file that cannot be read or parsed then keeps the
//! last good root, said once in the log.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest as _, Sha256};

use crate::locks::Recover;
use crate::template::Template;

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

/// `--remotecfg ROOT` and `--remotecfg-arguments FILE`, as settings decided them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    pub root: PathBuf,
    pub arguments: Option<PathBuf>,
}

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
    root: PathBuf,
    arguments: Option<PathBuf>,
    state: Mutex<State>,
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
    /// Reads both files: an error is a usage error, naming the flag.
    pub fn open(paths: Paths) -> Result<RootFiles, String> {
        let Paths { root, arguments } = paths;
        let current = read(&root, arguments.as_deref())?;
        let stamps = stamps(&root, arguments.as_deref());
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

    /// The root now: read again when a file changed.
    pub fn current(&self, now: Instant) -> Arc<Root> {
        let mut s = self.state.lock().recover();
        if now.saturating_duration_since(s.looked) < LOOK_EVERY {
            return s.current.clone();
        }
        s.looked = now;
        let stamps = stamps(&self.root, self.arguments.as_deref());
        if stamps == s.stamps {
            return s.current.clone();
        }
        match read(&self.root, self.arguments.as_deref()) {
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
        s.current.clone()
    }
}

fn stamps(root: &Path, arguments: Option<&Path>) -> Vec<Option<(u64, SystemTime)>> {
    let stamp = |p: &Path| {
        let m = std::fs::metadata(p).ok()?;
        Some((m.len(), m.modified().ok()?))
    };
    std::iter::once(root).chain(arguments).map(stamp).collect()
}

fn read(root: &Path, arguments: Option<&Path>) -> Result<Root, String> {
    let text = std::fs::read_to_string(root)
        .map_err(|e| format!("--remotecfg '{}': {e}", root.display()))?;
    let args = match arguments {
        Some(p) => Some((
            std::fs::read_to_string(p)
                .map_err(|e| format!("--remotecfg-arguments '{}': {e}", p.display()))?,
            format!("--remotecfg-arguments '{}'", p.display()),
        )),
        None => None,
    };
    Root::parse(text, args.as_ref().map(|(a, o)| (a.as_str(), o.as_str())))
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

    #[test]
    fn the_files_are_read_again_when_they_change() {
        let dir = std::env::temp_dir().join(format!("cmpoll-rc-root-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (root, args) = (dir.join("root.alloy"), dir.join("args"));
        std::fs::write(&root, "// one\n").unwrap();
        std::fs::write(&args, "receiver = x.y\n").unwrap();
        let f = RootFiles::open(Paths {
            root: root.clone(),
            arguments: Some(args.clone()),
        })
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
        let e = RootFiles::open(Paths {
            root,
            arguments: None,
        })
        .err()
        .unwrap();
        assert!(e.starts_with("--remotecfg '"), "{e}");
    }
}
