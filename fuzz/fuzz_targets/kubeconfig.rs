//! Kubeconfig YAML, then resolving its current context: errors, never panics.
#![no_main]

use cmpoll::kube::config::Config;
use cmpoll::kube::kubeconfig::Kubeconfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(kc) = Kubeconfig::from_yaml(text, std::path::Path::new("/fuzz/kubeconfig")) {
        let _ = Config::from_kubeconfig(&kc, None);
        let _ = kc.clone().merge(kc);
    }
});
