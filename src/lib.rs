//! cmpoll (work in progress)
pub mod manifests;
pub mod selector;
pub mod validation;
