//! One complete poll: every item of every namespace and page becomes a module (or is
//! known not to be one) and the result is a new snapshot, or an error and nothing else.
//!
//! The source puts items into a `Collector` one at a time. A module whose hash equals the
//! previous snapshot's keeps its spooled contents; a new or changed one is appended to the
//! spool. If the poll fails anywhere, what it appended is truncated away and the caller
//! keeps its previous snapshot: a failed poll changes nothing. The poll's statistics are
//! counted at the end from what it collected.

pub mod hash;
pub mod module;
pub mod snapshot;
pub mod spool;
pub mod store;

use std::collections::HashMap;

use self::module::{Module, Naming, NotAModule};
use self::snapshot::{Entry, Modules, Rv, Snapshot};
use self::spool::{ObjectRef, Spool};
pub use crate::source::Error;
use crate::source::{Collect, Item, Mark, Previous, Source};

/// Counts of one poll, for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollStats {
    pub items: usize,
    pub modules: usize,
    /// Selected ConfigMaps that are not valid modules (names or keys the apiserver
    /// would not allow).
    pub invalid: usize,
    pub without_keys: usize,
    /// A `cmpoll serve` hub holds each poll until it has something newer: the next poll
    /// may start at once.
    pub hub_waits: bool,
}

/// What a poll produced.
#[derive(Debug)]
pub struct Polled {
    pub snapshot: Snapshot,
    pub stats: PollStats,
}

/// A ConfigMap that is not a module, as last seen: said once per version, not once per
/// poll, and (metadata-first) not fetched again until it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Noted {
    resource_version: String,
    /// Not valid (else: no key matched `--keys`).
    invalid: bool,
}

pub struct Poller {
    source: Box<dyn Source>,
    noted: HashMap<String, Noted>,
    naming: Naming,
}

impl Poller {
    pub fn new(source: Box<dyn Source>) -> Poller {
        Poller {
            source,
            noted: HashMap::new(),
            naming: Naming::default(),
        }
    }

    /// Names modules' files as `naming` says (the `flat` layout's options).
    pub fn naming(mut self, naming: Naming) -> Poller {
        self.naming = naming;
        self
    }

    pub fn describe(&self) -> String {
        self.source.describe()
    }

    /// A `cmpoll serve` hub answers (see `Source::hub_waits`).
    pub fn hub_waits(&self) -> bool {
        self.source.hub_waits()
    }

    /// Polls once; on success the new snapshot, whose new contents are in `spool`.
    pub fn poll(&mut self, prev: &Snapshot, spool: &mut Spool) -> Result<Polled, Error> {
        let start = spool.len();
        let last = Last {
            snapshot: prev,
            noted: &self.noted,
        };
        let mut c = Collector {
            last: &last,
            naming: &self.naming,
            spool,
            entries: Modules::default(),
            others: Vec::new(),
            full: None,
        };
        let result = self.source.list(&last, &mut c);
        let Collector {
            entries,
            others,
            full,
            ..
        } = c;
        let result = match (result, full) {
            (Ok(()), Some(full)) => Err(Error::Spool(full.error(spool, start))),
            (result, _) => result,
        };
        self.source.polled(result.is_ok());
        if let Err(e) = result {
            spool.truncate(start).map_err(Error::Spool)?;
            return Err(e);
        }
        let stats = PollStats {
            items: entries.len() + others.len(),
            modules: entries.len(),
            invalid: others.iter().filter(|(_, n)| n.invalid).count(),
            without_keys: others.iter().filter(|(_, n)| !n.invalid).count(),
            hub_waits: self.source.hub_waits(),
        };
        // What is remembered follows the cluster: ConfigMaps that are gone are forgotten.
        self.noted = others.into_iter().collect();
        Ok(Polled {
            snapshot: snapshot(entries),
            stats,
        })
    }
}

/// The snapshot of a poll's entries: the same vector, sorted in place (stably, so the
/// last of two entries for one ConfigMap wins).
fn snapshot(entries: Modules) -> Snapshot {
    Snapshot {
        modules: snapshot::sorted(entries),
    }
}

/// What the last poll had: its snapshot and the ConfigMaps it found not to be modules.
struct Last<'a> {
    snapshot: &'a Snapshot,
    noted: &'a HashMap<String, Noted>,
}

impl Previous for Last<'_> {
    fn has(&self, id: &str, resource_version: &str) -> bool {
        self.snapshot
            .modules
            .get(id)
            .is_some_and(|e| e.resource_version == resource_version)
            || self
                .noted
                .get(id)
                .is_some_and(|n| n.resource_version == resource_version)
    }
}

struct Collector<'a> {
    last: &'a Last<'a>,
    naming: &'a Naming,
    spool: &'a mut Spool,
    /// This poll's modules, in the order listed (sorted at the end).
    entries: Modules,
    /// This poll's ConfigMaps that are not modules.
    others: Vec<(String, Noted)>,
    /// The spool's volume is full: the poll will fail, and goes on only to count what it
    /// needed, so that the error can say how much.
    full: Option<Full>,
}

/// A poll that ran out of room in the spool.
struct Full {
    error: std::io::Error,
    /// Bytes of the records after the one that did not fit.
    unspooled: u64,
}

impl Full {
    /// The error, with how much this poll needs on which volume.
    fn error(self, spool: &Spool, start: u64) -> std::io::Error {
        let need = crate::ops::volume::size(spool.len() - start + self.unspooled);
        let volume = spool.dir().and_then(crate::ops::volume::Volume::of);
        let place = match (spool.dir(), volume) {
            (Some(d), Some(v)) => format!(" in '{}', on {}", d.display(), v.describe()),
            (Some(d), None) => format!(" in '{}'", d.display()),
            (None, _) => String::new(),
        };
        std::io::Error::new(
            self.error.kind(),
            format!(
                "{}: this poll needs about {need} for its new and changed modules{place}; writing them into the output folder needs about as much again",
                self.error
            ),
        )
    }
}

impl Collector<'_> {
    /// Keeps a ConfigMap that is not a module; logs about it once per version.
    fn not_a_module(&mut self, id: String, resource_version: String, keys: usize, why: NotAModule) {
        let new = (self.last.noted.get(&id)).is_none_or(|n| n.resource_version != resource_version);
        let invalid = matches!(why, NotAModule::Invalid(_));
        if new {
            match why {
                NotAModule::NoMatchingKey => log::info!(
                    "configmap {id}: none of its {keys} keys matches --keys; not a module"
                ),
                NotAModule::Invalid(why) => log::warn!("configmap {id} rejected: {why}"),
            }
        }
        let noted = Noted {
            resource_version,
            invalid,
        };
        self.others.push((id, noted));
    }
}

impl Collect for Collector<'_> {
    fn mark(&self) -> Mark {
        Mark {
            modules: self.entries.len(),
            others: self.others.len(),
            spool: self.spool.len(),
        }
    }

    fn item(&mut self, item: Item) -> Result<(), Error> {
        let (id, rv, keys) = (item.id(), item.resource_version.clone(), item.keys_seen);
        let module = match Module::from_item(item, self.naming) {
            Ok(m) => m,
            Err(why) => {
                self.not_a_module(id, rv, keys, why);
                return Ok(());
            }
        };
        if let Some(full) = &mut self.full {
            let object = ObjectRef::new(module.kind, &module.uid, &module.resource_version);
            full.unspooled += Spool::record_len(&object, &module.files);
            return Ok(());
        }
        let loc = match self.last.snapshot.modules.get(&id) {
            Some(old) if old.hash == module.hash => old.loc,
            _ => match self.spool.put_module(
                &id,
                &module.hash,
                &ObjectRef::new(module.kind, &module.uid, &module.resource_version),
                &module.files,
            ) {
                Ok(loc) => loc,
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                    // The record that did not fit is in the spool's length already
                    // (gathered, its write failed): what comes after it is counted.
                    self.full = Some(Full {
                        error: e,
                        unspooled: 0,
                    });
                    return Ok(());
                }
                Err(e) => return Err(Error::Spool(e)),
            },
        };
        self.entries.push_unsorted(
            &id,
            Entry {
                hash: module.hash,
                loc,
                resource_version: Rv::new(&module.resource_version),
            },
        );
        Ok(())
    }

    fn unchanged(&mut self, id: &str) {
        if let Some(old) = self.last.snapshot.modules.get(id) {
            self.entries.push_unsorted(id, old.clone());
        } else if let Some(n) = self.last.noted.get(id) {
            self.others.push((id.to_string(), n.clone()));
        }
    }

    fn rewind(&mut self, to: Mark) -> Result<(), Error> {
        self.entries.truncate(to.modules);
        self.others.truncate(to.others);
        self.spool.truncate(to.spool).map_err(Error::Spool)
    }
}

#[cfg(test)]
mod tests;

/// For unit tests of this layer and the ones above.
#[cfg(test)]
pub(crate) mod testing {
    use super::hash::Hash;
    use super::snapshot::Entry;
    use super::spool::{ObjectRef, Spool};
    use crate::source::{Content, ModuleFile};

    /// A module of one file, `k`, holding `v`: its contents put in `spool`, its entry as a
    /// poll would make it (uid `u`, resourceVersion `1`).
    pub fn entry(spool: &mut Spool, v: &str) -> Entry {
        let files = vec![ModuleFile {
            key: "k".into(),
            content: Content::Text(v.into()),
        }];
        Entry {
            hash: Hash::of([("k", v.as_bytes())]),
            loc: spool
                .put(&ObjectRef::configmap("u", "1"), &files)
                .expect("a spool in memory"),
            resource_version: "1".into(),
        }
    }
}
