//! The module lists the collectors keep (`Lists`): a text's modules and their lines, shared
//! by every collector sent that text (one `Arc` however many hold it), counted once each
//! by its bytes, `MAX_LIST_BYTES` together at most. A list the collectors hold stays kept
//! after its text leaves the compositions' cache, so without this bound each such list
//! (up to 10,000 modules) was a collector's own, uncounted. A new list over the bound is
//! not kept: its collector keeps the text's hash alone, and a `FAILED` for that text
//! names no module (as Alloy's own fetch failing).

use std::collections::HashMap;
use std::sync::Arc;

use crate::serve::fleet::collected::Versions;

/// What the lists kept hold together, at most.
pub const MAX_LIST_BYTES: usize = 64 << 20;

/// A module's part of a list: its key's header and its hash, its span.
const PER_MODULE: usize = 16 + 32 + 8 + 16;

/// The lists kept: by address, their bytes and how many collectors' texts hold each.
#[derive(Default)]
pub struct Lists {
    held: HashMap<usize, (usize, usize)>,
    bytes: usize,
}

/// A list's address (its identity, shared by every clone).
fn address(modules: &Versions) -> usize {
    Arc::as_ptr(modules) as *const u8 as usize
}

/// A list's bytes.
pub fn bytes(modules: &Versions) -> usize {
    64 + (modules.iter())
        .map(|v| PER_MODULE + v.key.len())
        .sum::<usize>()
}

impl Lists {
    /// `modules` held once more, if kept or if it fits (`false`: not kept).
    pub fn take(&mut self, modules: &Versions) -> bool {
        let at = address(modules);
        if let Some((_, holders)) = self.held.get_mut(&at) {
            *holders += 1;
            return true;
        }
        let n = bytes(modules);
        if self.bytes + n > MAX_LIST_BYTES {
            return false;
        }
        self.held.insert(at, (n, 1));
        self.bytes += n;
        true
    }

    /// `modules` held once less (forgotten with its last holder).
    pub fn give_back(&mut self, modules: &Versions) {
        let at = address(modules);
        if let Some((n, holders)) = self.held.get_mut(&at) {
            *holders -= 1;
            if *holders == 0 {
                self.bytes -= *n;
                self.held.remove(&at);
            }
        }
    }

    /// The bytes kept.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
