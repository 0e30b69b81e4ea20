//! One module as collectors are sent it (`Wrapped`): a selected ConfigMap's `*.alloy` keys,
//! joined in key order as `--layout concat` joins them, wrapped in its own `declare` by the
//! root's `Template` (docs/alloy.md's wrapping and isolation checks), with its
//! `cmpoll.io/collectors` selector read; or why it goes to no one (not one Alloy body,
//! naming a module, not UTF-8, a selector that does not parse), said once in the log when
//! its version is first wrapped.
//!
//! Wrappings are kept (`Modules`) under one root (another root drops them all), by key
//! and version — the module's hash and the object's resourceVersion, so an edit of only its
//! annotation (which the hash leaves out) is read again — `KEPT_VERSIONS` of a key at most
//! (a rollout serves two or three at once). What they hold together is bounded
//! (`MAX_WRAPPED_BYTES`, each weighed by its text and words): over it, those used longest
//! ago go, down to three quarters of it; a view whose modules hold more is wrapped again,
//! in part, at each call that needs them. A wrapping no call has used for `IDLE` (its
//! object gone from every view, or its version replaced) goes at the next sweep, made once
//! every `SWEEP_EVERY` at most. The lock is held for lookups and insertions only: wrapping
//! is done outside it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::root::Root;
use crate::locks::Recover;
use crate::poll::hash::Hash;
use crate::selector::LabelSelector;
use crate::serve::held::HeldObject;
use crate::source::reader::{ReadError, read_object};
use crate::source::{Content, KeyFilter, ModuleFile, Resource};

/// The annotation that narrows a module to some collectors.
pub const COLLECTORS: &str = "cmpoll.io/collectors";

/// What the wrappings kept hold together, at most.
pub const MAX_WRAPPED_BYTES: usize = 64 << 20;

/// Versions of one module kept wrapped.
const KEPT_VERSIONS: usize = 4;

/// A wrapping unused this long goes at the next sweep.
pub const IDLE: Duration = Duration::from_secs(600);

/// Sweeps, at most this often.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A wrapping's fixed part, counted in its weight.
const ENTRY: usize = 256;

/// One module version, wrapped for collectors (or refused).
#[derive(Debug)]
pub struct Wrapped {
    /// `cmpoll.io/collectors`, read.
    pub only_for: Option<LabelSelector>,
    /// The declare block and its instance; `Err`: why it goes to no one; `Ok(None)`: it has
    /// no `*.alloy` key.
    pub text: Result<Option<String>, String>,
}

/// Module `key` wrapped under `root`.
fn wrap(root: &Root, key: &str, o: &HeldObject) -> Wrapped {
    let refused = |why: String| Wrapped {
        only_for: None,
        text: Err(why),
    };
    let alloy = match KeyFilter::new(&["*.alloy".to_string()]) {
        Ok(k) => k,
        Err(e) => return refused(e),
    };
    let read = read_object(
        &o.raw.json[..],
        &alloy,
        Resource::ConfigMaps,
        Some(COLLECTORS),
        false,
    );
    let item = match read {
        Ok((_, _, item)) => item,
        Err(ReadError::Bad(why)) => return refused(format!("cannot be read: {why}")),
        Err(ReadError::Io(e)) => return refused(format!("cannot be read: {e}")),
    };
    if let Some(p) = item.problems.first() {
        return refused(p.clone());
    }
    let only_for = match item.folder.as_deref().map(LabelSelector::parse) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => return refused(format!("its annotation {COLLECTORS}: {e}")),
    };
    let mut files: Vec<ModuleFile> = item.files;
    files.sort_by(|a, b| a.key.cmp(&b.key));
    if files.is_empty() {
        return Wrapped {
            only_for,
            text: Ok(None),
        };
    }
    if let Some(f) = files
        .iter()
        .find(|f| matches!(f.content, Content::Binary(_)))
    {
        return refused(format!("{}: binary data, not Alloy text", f.key));
    }
    if let Some(why) = root.template.refuses(&files) {
        return refused(why);
    }
    match String::from_utf8(root.template.render(key, &files)) {
        Ok(text) => Wrapped {
            only_for,
            text: Ok(Some(text)),
        },
        Err(_) => refused("not UTF-8".into()),
    }
}

/// One version kept.
struct Version {
    hash: Hash,
    resource_version: Box<str>,
    wrapped: Arc<Wrapped>,
    /// Its weight, and when a call last used it (and in which order: `tick`).
    bytes: usize,
    used: Instant,
    tick: u64,
}

/// Wrappings kept under one root.
struct Kept {
    root: [u8; 32],
    versions: HashMap<Box<str>, Vec<Version>>,
    bytes: usize,
    bound: usize,
    tick: u64,
    swept: Option<Instant>,
}

/// Modules wrapped, kept (see the file's head).
pub struct Modules {
    kept: Mutex<Kept>,
}

impl Default for Modules {
    fn default() -> Modules {
        Modules::bounded(MAX_WRAPPED_BYTES)
    }
}

impl Modules {
    /// Kept up to `bound` bytes.
    pub fn bounded(bound: usize) -> Modules {
        Modules {
            kept: Mutex::new(Kept {
                root: [0; 32],
                versions: HashMap::new(),
                bytes: 0,
                bound,
                tick: 0,
                swept: None,
            }),
        }
    }

    /// Each of `listed` (`namespace/name`, object) wrapped under `root`, in its order: those
    /// kept looked up under the lock, the others wrapped after it, then kept.
    pub fn wrapped(
        &self,
        root: &Root,
        listed: &[(&str, &Arc<HeldObject>)],
        now: Instant,
    ) -> Vec<Arc<Wrapped>> {
        let found: Vec<Option<Arc<Wrapped>>> = {
            let mut kept = self.kept.lock().recover();
            if kept.root != root.fingerprint {
                kept.clear(root.fingerprint);
            }
            (listed.iter())
                .map(|(key, o)| kept.find(key, o, now))
                .collect()
        };
        let mut made = Vec::new();
        let out = (listed.iter().zip(found))
            .map(|((key, o), w)| match w {
                Some(w) => w,
                None => {
                    let w = Arc::new(wrap(root, key, o));
                    if let Err(why) = &w.text {
                        log::warn!("{}", sent_to_no_one(key, why));
                    }
                    made.push((*key, o, w.clone()));
                    w
                }
            })
            .collect();
        let mut kept = self.kept.lock().recover();
        if kept.root == root.fingerprint {
            for (key, o, w) in made {
                kept.insert(key, o, w, now);
            }
            kept.shrink();
        }
        kept.sweep(now);
        out
    }

    /// The bytes the wrappings kept hold.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.kept.lock().recover().bytes
    }

    /// Whether a version of `key` is kept.
    #[cfg(test)]
    pub fn holds(&self, key: &str) -> bool {
        self.kept.lock().recover().versions.contains_key(key)
    }
}

impl Kept {
    fn clear(&mut self, root: [u8; 32]) {
        self.root = root;
        self.versions.clear();
        self.bytes = 0;
    }

    /// `o`'s version of `key`, if kept: used now.
    fn find(&mut self, key: &str, o: &HeldObject, now: Instant) -> Option<Arc<Wrapped>> {
        self.tick += 1;
        let tick = self.tick;
        let v = (self.versions.get_mut(key)?.iter_mut())
            .find(|v| v.hash == o.hash && *v.resource_version == *o.resource_version)?;
        (v.used, v.tick) = (now, tick);
        Some(v.wrapped.clone())
    }

    fn insert(&mut self, key: &str, o: &HeldObject, wrapped: Arc<Wrapped>, now: Instant) {
        if self.find(key, o, now).is_some() {
            // Another call wrapped it meanwhile.
            return;
        }
        let text = match &wrapped.text {
            Ok(t) => t.as_ref().map_or(0, String::len),
            Err(why) => why.len(),
        };
        let bytes = ENTRY + 2 * key.len() + o.resource_version.len() + text;
        self.bytes += bytes;
        let versions = self.versions.entry(Box::from(key)).or_default();
        versions.insert(
            0,
            Version {
                hash: o.hash,
                resource_version: o.resource_version.as_str().into(),
                wrapped,
                bytes,
                used: now,
                tick: self.tick,
            },
        );
        for old in versions.drain(KEPT_VERSIONS.min(versions.len())..) {
            self.bytes -= old.bytes;
        }
    }

    /// Over the bound: those used longest ago go, down to three quarters of it.
    fn shrink(&mut self) {
        if self.bytes <= self.bound {
            return;
        }
        let mut order: Vec<(u64, Box<str>)> = (self.versions.iter())
            .flat_map(|(k, vs)| vs.iter().map(move |v| (v.tick, k.clone())))
            .collect();
        order.sort_unstable();
        let goal = self.bound / 4 * 3;
        for (tick, key) in order {
            if self.bytes <= goal {
                break;
            }
            self.forget(&key, |v| v.tick == tick);
        }
    }

    /// Those unused for `IDLE` go, once every `SWEEP_EVERY` at most.
    fn sweep(&mut self, now: Instant) {
        if (self.swept).is_some_and(|t| now.saturating_duration_since(t) < SWEEP_EVERY) {
            return;
        }
        self.swept = Some(now);
        let keys: Vec<Box<str>> = self.versions.keys().cloned().collect();
        for key in keys {
            self.forget(&key, |v| now.saturating_duration_since(v.used) >= IDLE);
        }
    }

    /// The versions of `key` that `gone` takes are forgotten.
    fn forget(&mut self, key: &str, gone: impl Fn(&Version) -> bool) {
        let Some(versions) = self.versions.get_mut(key) else {
            return;
        };
        let mut freed = 0;
        versions.retain(|v| match gone(v) {
            true => {
                freed += v.bytes;
                false
            }
            false => true,
        });
        self.bytes -= freed;
        if versions.is_empty() {
            self.versions.remove(key);
        }
    }
}

/// The log line of a module sent to no collector: `why` quotes what the ConfigMap's author
/// wrote (an annotation, a block's name), made `printable` and cut so that it forges no
/// line and colours no terminal, as every other word of a client's in the log.
fn sent_to_no_one(key: &str, why: &str) -> String {
    format!(
        "--remotecfg: {}: sent to no collector: {}",
        crate::reason::shown(key, 256),
        crate::reason::shown(why, 1024)
    )
}

#[cfg(test)]
mod tests {
    /// Review 61 (second), finding 6: a reason quoting a ConfigMap author's escape or
    /// bidirectional override is logged escaped.
    #[test]
    fn a_refused_modules_line_is_printable() {
        let line =
            super::sent_to_no_one("ns/m", "its annotation: bad \u{1b}[31mred\u{202e}\nforged");
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{line:?}"
        );
        assert!(line.contains("\\u{1b}[31mred\\u{202e}\\nforged"), "{line}");
        assert!(super::sent_to_no_one("ns/m", &"x".repeat(10_000)).len() < 1200);
    }
}
