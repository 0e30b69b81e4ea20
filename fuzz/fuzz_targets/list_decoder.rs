//! Arbitrary bytes as a list response body, read in odd-sized chunks: the decoder returns
//! items or an error, never panics, and never holds more than it must.
#![no_main]

use std::io::Read;

use cmpoll::kube::decode::decode_list;
use cmpoll::module::{KeyFilter, Module};
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

fuzz_target!(|data: &[u8]| {
    let step = 1 + data.first().copied().unwrap_or(0) as usize;
    let keys = KeyFilter::all();
    let mut items = 0usize;
    let whole = decode_list(data, &keys, "fuzz", &mut |item| {
        items += 1;
        let _ = Module::from_item(item);
        Ok(())
    });
    let mut chunked_items = 0usize;
    let chunked = decode_list(Chunks(data, step), &keys, "fuzz", &mut |_| {
        chunked_items += 1;
        Ok(())
    });
    // Read boundaries never change the outcome.
    assert_eq!(whole.is_ok(), chunked.is_ok());
    assert_eq!(items, chunked_items);
});
