//! Arbitrary bytes as a list response body, read in odd-sized chunks: the reader returns
//! items or an error, never panics, and read boundaries never change the outcome.
#![no_main]

use std::io::Read;

use cmpoll::poll::module::Module;
use cmpoll::source::{KeyFilter, Resource};
use cmpoll::source::reader::ListReader;
use libfuzzer_sys::fuzz_target;

/// Hands out the body `step` bytes at a time.
struct Chunks<'a>(&'a [u8], usize);

impl Read for Chunks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.1.min(buf.len()).min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// Reads every item in full; how many were read, and whether the whole list was good.
fn read_all(body: impl Read, keys: &KeyFilter, resource: Resource) -> (usize, bool) {
    let Ok(mut list) = ListReader::new(body) else {
        return (0, false);
    };
    let mut n = 0;
    loop {
        match list.next_item() {
            Ok(Some(raw)) => {
                let Ok(meta) = raw.meta() else { return (n, false) };
                let Ok(item) = raw.item(meta, keys, resource) else { return (n, false) };
                let _ = Module::from_item(item);
                n += 1;
            }
            Ok(None) => return (n, list.finish().is_ok()),
            Err(_) => return (n, false),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let step = 1 + data.first().copied().unwrap_or(0) as usize;
    let keys = KeyFilter::all();
    // ConfigMaps and (every other input) Secrets, whose `data` is base64.
    let resource = if step % 2 == 0 { Resource::Secrets } else { Resource::ConfigMaps };
    // Read boundaries never change the outcome.
    assert_eq!(
        read_all(data, &keys, resource),
        read_all(Chunks(data, step), &keys, resource)
    );
});
