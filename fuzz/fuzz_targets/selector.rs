//! The label- and field-selector parsers: never panic, and what parses prints back to
//! something that parses to the same requirements.
#![no_main]

use cmpoll::selector::{FieldSelector, LabelSelector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(sel) = LabelSelector::parse(text) {
        let again = LabelSelector::parse(sel.as_str()).expect("a parsed selector re-parses");
        assert_eq!(sel.requirements(), again.requirements());
        let _ = sel.matches(|k| (k.len() % 2 == 0).then_some("v"));
    }
    if let Ok(sel) = FieldSelector::parse(text) {
        let _ = sel.matches("default", "name");
    }
});
