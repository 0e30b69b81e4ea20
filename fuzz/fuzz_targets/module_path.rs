//! Module validation: whatever the apiserver sends as namespace, name and keys, a module
//! that is accepted names only paths inside the output folder.
#![no_main]

use std::path::{Component, Path};

use cmpoll::poll::module::Module;
use cmpoll::source::{Content, Item, ModuleFile};
use libfuzzer_sys::fuzz_target;

/// Exactly one normal path component, equal to `s`.
fn one_component(s: &str) -> bool {
    let mut c = Path::new(s).components();
    matches!((c.next(), c.next()), (Some(Component::Normal(n)), None) if n == s)
        && !s.contains('/')
        && !s.contains('\0')
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\u{1}');
    let namespace = parts.next().unwrap_or_default().to_string();
    let name = parts.next().unwrap_or_default().to_string();
    let files = parts
        .map(|k| ModuleFile {
            key: k.to_string(),
            content: Content::Text("x".into()),
        })
        .collect();
    let item = Item {
        namespace,
        name,
        files,
        ..Item::default()
    };
    if let Ok(m) = Module::from_item(item) {
        assert!(one_component(&m.namespace), "namespace {:?}", m.namespace);
        assert!(one_component(&m.name), "name {:?}", m.name);
        assert!(one_component(&format!("{}.{}.conf", m.namespace, m.name)));
        for f in &m.files {
            assert!(one_component(&f.key), "key {:?}", f.key);
        }
    }
});
