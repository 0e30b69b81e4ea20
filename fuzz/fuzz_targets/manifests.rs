//! Manifest files (YAML and JSON, multi-document, lists): errors, never panics.
#![no_main]

use std::path::Path;

use cmpoll::source::manifests::files::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut out = Vec::new();
    let _ = parse(Path::new("fuzz.yaml"), text, &mut out);
    let _ = parse(Path::new("fuzz.json"), text, &mut out);
});
