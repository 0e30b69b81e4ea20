//! What one collector is sent: the root, then each module it gets wrapped in its own
//! `declare` (the root's `Template`: docs/alloy.md's wrapping and isolation checks), in the
//! order the hub holds them (`namespace/name`), as one text and its hash (SHA-256, hex).
//!
//! A module (`wrapped.rs`) goes to a collector when the collector may `list` ConfigMaps in
//! its namespace (the caller decides, `may_list`: asked before any module is wrapped, so a
//! namespace it may not list costs no wrapping) and, if the ConfigMap is annotated
//! `cmpoll.io/collectors: SELECTOR` (label-selector grammar), when the selector matches the
//! collector's attributes. The text is never empty: it starts with a comment.
//!
//! Work is kept: each module version is wrapped once per root and kept, bounded
//! (`wrapped::Modules`), and each distinct set of (module, version) under one root is
//! composed once (`Compositions`: `KEPT_COMPOSITIONS` and `MAX_COMPOSED_BYTES` at most, the
//! one asked for longest ago going first), so a poll that changes nothing costs a walk over the
//! view's keys and a lookup per module under the lock; the selectors are matched after it.
//! A set over `MAX_CONTENT` is refused from its length, never built, and the refusal kept
//! by digest (`REFUSALS_KEPT`), so asking again costs neither a text nor a budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use super::messages::{Attributes, get_config_response};
use super::root::Root;
use super::wrapped::{Modules, Wrapped};
use crate::https::http::Body;
use crate::locks::Recover;
use crate::serve::fleet::collected::{Version, Versions};
use crate::serve::held::{Held, HeldObject};
use crate::serve::kept::Budgets;
use crate::source::Resource;

/// The largest content sent: a composition over it is refused (`resource_exhausted`).
pub const MAX_CONTENT: usize = 4 << 20;

/// Compositions kept (distinct sets of modules: a view and a match of attributes each).
const KEPT_COMPOSITIONS: usize = 256;

/// What the compositions kept hold together, at most: each weighed as its content three
/// times (the text, its response, the response gzipped, which is smaller). Over it, or
/// over `KEPT_COMPOSITIONS`, the one asked for longest ago goes (a connection writing it
/// keeps it until written).
pub const MAX_COMPOSED_BYTES: usize = 128 << 20;

/// Refusals kept (sets of modules over `MAX_CONTENT`), by digest; when full, forgotten
/// all at once.
const REFUSALS_KEPT: usize = 256;

/// Compositions kept, by digest: each with its weight and when it was last asked for; and
/// the sets refused, by digest, with why.
struct Made {
    kept: HashMap<[u8; 32], (Arc<Composition>, usize, u64)>,
    bytes: usize,
    bound: usize,
    tick: u64,
    refused: HashMap<[u8; 32], String>,
}

impl Made {
    fn bounded(bound: usize) -> Made {
        Made {
            kept: HashMap::new(),
            bytes: 0,
            bound,
            tick: 0,
            refused: HashMap::new(),
        }
    }

    fn refuse(&mut self, digest: [u8; 32], why: &str) {
        if self.refused.len() >= REFUSALS_KEPT {
            self.refused.clear();
        }
        self.refused.insert(digest, why.to_string());
    }

    fn get(&mut self, digest: &[u8; 32]) -> Option<Arc<Composition>> {
        self.tick += 1;
        let (c, _, used) = self.kept.get_mut(digest)?;
        *used = self.tick;
        Some(c.clone())
    }

    fn insert(&mut self, digest: [u8; 32], c: Arc<Composition>) {
        self.tick += 1;
        let bytes = 256 + 3 * c.content.len();
        if let Some((_, old, _)) = self.kept.insert(digest, (c, bytes, self.tick)) {
            self.bytes -= old;
        }
        self.bytes += bytes;
        while self.bytes > self.bound || self.kept.len() > KEPT_COMPOSITIONS {
            let Some(oldest) = (self.kept.iter())
                .filter(|(d, _)| **d != digest)
                .min_by_key(|(_, (_, _, used))| *used)
                .map(|(d, _)| *d)
            else {
                break;
            };
            if let Some((_, freed, _)) = self.kept.remove(&oldest) {
                self.bytes -= freed;
            }
        }
    }
}

/// The first line of every content.
const HEAD: &str =
    "// Served by cmpoll serve (--remotecfg): the root, then one declare block per module.\n";

/// What a collector is sent.
#[derive(Debug)]
pub struct Composition {
    pub content: String,
    /// SHA-256 of `content`, lowercase hex.
    pub hash: String,
    /// Its `GetConfigResponse`, plain and gzipped, made once for every collector that is
    /// sent it: one allocation however many connections write it (a fleet sharing one
    /// token is counted once for it, `https::server`'s shares).
    pub encoded: OnceLock<Body>,
    pub gzipped: OnceLock<Body>,
    /// Each module in it: `namespace/name` and its version (shared with the collectors
    /// that hold it: `collectors.rs`).
    pub modules: Versions,
    /// The lines of `content` each module's text takes, first and last (from 1, as Alloy
    /// numbers a diagnostic's line): what a collector's error points at.
    pub spans: Arc<[(usize, usize)]>,
}

/// Compositions made, by root and modules; and what each identity may have made.
pub struct Compositions {
    modules: Modules,
    made: Mutex<Made>,
    budgets: Mutex<Budgets<Box<str>>>,
}

/// Texts one identity may have made that no one asked before: a burst of `MADE_BURST`,
/// then `MADE_RATE` a second. A fleet makes a few after each change (one per view and
/// match of attributes); a client cycling its attributes through more sets of modules
/// than `KEPT_COMPOSITIONS` would otherwise have the hub make a text at every call.
const MADE_BURST: f64 = 16.0;
const MADE_RATE: f64 = 0.2;

/// Identities whose budgets are kept.
const BUDGETS_KEPT: usize = 16_384;

/// Why no text is sent.
#[derive(Debug, PartialEq, Eq)]
pub enum Unmade {
    /// Over `MAX_CONTENT`.
    TooLarge(String),
    /// Its identity made too many texts of late: again after this.
    Busy(Duration),
}

impl Default for Compositions {
    fn default() -> Compositions {
        Compositions {
            modules: Modules::default(),
            made: Mutex::new(Made::bounded(MAX_COMPOSED_BYTES)),
            budgets: Mutex::new(Budgets::new(MADE_RATE, MADE_BURST, BUDGETS_KEPT)),
        }
    }
}

impl Compositions {
    /// What a collector of `who` with `attributes`, allowed ConfigMaps of the namespaces
    /// `may_list` says, is sent of `view` under `root`; `may_list`'s error ends it.
    pub fn compose<E>(
        &self,
        root: &Root,
        view: &Held,
        (who, attributes): (&str, &Attributes),
        now: Instant,
        mut may_list: impl FnMut(&str) -> Result<bool, E>,
    ) -> Result<Result<Arc<Composition>, Unmade>, E> {
        // The modules of the namespaces it may list (each namespace asked once: keys are in
        // namespace order), before any is wrapped…
        let mut listed: Vec<(&str, &Arc<HeldObject>)> = Vec::new();
        let mut last_ns: Option<(&str, bool)> = None;
        for (key, o) in view.keyed(Resource::ConfigMaps) {
            let allowed = match last_ns {
                Some((ns, allowed)) if ns == o.namespace => allowed,
                _ => {
                    let allowed = may_list(&o.namespace)?;
                    last_ns = Some((&o.namespace, allowed));
                    allowed
                }
            };
            if allowed {
                listed.push((key, o));
            }
        }
        // …then wrapped (kept: `Modules`), and those for these attributes chosen, outside
        // any lock.
        let wrapped = self.modules.wrapped(root, &listed, now);
        let get = |k: &str| attributes.get(k).map(String::as_str);
        let chosen: Vec<(&str, &Arc<HeldObject>, Arc<Wrapped>)> = (listed.into_iter())
            .zip(wrapped)
            .filter(|(_, w)| {
                matches!(w.text, Ok(Some(_))) && w.only_for.as_ref().is_none_or(|s| s.matches(get))
            })
            .map(|((key, o), w)| (key, o, w))
            .collect();
        let mut h = Sha256::new();
        h.update(root.fingerprint);
        for (key, o, _) in &chosen {
            h.update(key.as_bytes());
            h.update([0]);
            h.update(o.hash.0);
        }
        let digest: [u8; 32] = h.finalize().into();
        {
            let mut made = self.made.lock().recover();
            if let Some(c) = made.get(&digest) {
                return Ok(Ok(c));
            }
            if let Some(why) = made.refused.get(&digest) {
                return Ok(Err(Unmade::TooLarge(why.clone())));
            }
        }
        if let Err(wait) = self.budgets.lock().recover().take(&Box::from(who), now) {
            return Ok(Err(Unmade::Busy(wait)));
        }
        let composed = compose(root, &chosen);
        let mut made = self.made.lock().recover();
        match &composed {
            Ok(c) => made.insert(digest, c.clone()),
            Err(why) => made.refuse(digest, why),
        }
        Ok(composed.map_err(Unmade::TooLarge))
    }
}

impl Composition {
    /// Its `GetConfigResponse` (the text and its hash), encoded once.
    pub fn response(&self) -> Body {
        (self.encoded)
            .get_or_init(|| get_config_response(&self.content, &self.hash, false).into())
            .clone()
    }

    /// `response`, gzipped once.
    pub fn response_gzipped(&self) -> Body {
        (self.gzipped)
            .get_or_init(|| crate::serve::render::gzip(&self.response()).into())
            .clone()
    }
}

/// The length of the text of the root and `chosen` modules, as `compose` makes it,
/// counted without making it.
fn length(root: &Root, chosen: &[(&str, &Arc<HeldObject>, Arc<Wrapped>)]) -> usize {
    let mut len = HEAD.len() + root.text.len();
    let mut ended = root.text.ends_with('\n') || root.text.is_empty();
    for (_, _, w) in chosen {
        if let Ok(Some(text)) = &w.text {
            len += usize::from(!ended) + 1 + text.len();
            ended = text.ends_with('\n') || text.is_empty();
        }
    }
    len
}

/// The root and `chosen` modules as one text, or why it cannot be sent (counted before
/// any of it is made: a text over `MAX_CONTENT` is never built).
fn compose(
    root: &Root,
    chosen: &[(&str, &Arc<HeldObject>, Arc<Wrapped>)],
) -> Result<Arc<Composition>, String> {
    let len = length(root, chosen);
    if len > MAX_CONTENT {
        return Err(format!(
            "the root and its {} modules are {len} bytes, more than {MAX_CONTENT}",
            chosen.len(),
        ));
    }
    let mut content = String::with_capacity(len);
    content.push_str(HEAD);
    content.push_str(&root.text);
    let mut modules = Vec::with_capacity(chosen.len());
    let mut spans = Vec::with_capacity(chosen.len());
    // Lines ended so far: a module's text starts on the line after them.
    let mut ended = content.matches('\n').count();
    for (key, o, w) in chosen {
        if let Ok(Some(text)) = &w.text {
            if !content.ends_with('\n') {
                content.push('\n');
                ended += 1;
            }
            content.push('\n');
            ended += 1;
            let first = ended + 1;
            content.push_str(text);
            let breaks = text.matches('\n').count();
            ended += breaks;
            let last = first + text.trim_end_matches('\n').matches('\n').count();
            modules.push(Version {
                key: Box::from(*key),
                hash: o.hash,
                rv: o.resource_version.parse().unwrap_or(0),
            });
            spans.push((first, last));
        }
    }
    debug_assert_eq!(content.len(), len);
    let hash = Sha256::digest(content.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(Arc::new(Composition {
        content,
        hash,
        encoded: OnceLock::new(),
        gzipped: OnceLock::new(),
        modules: modules.into(),
        spans: spans.into(),
    }))
}

#[cfg(test)]
mod tests;
