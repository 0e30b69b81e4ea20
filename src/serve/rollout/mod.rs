//! Rollouts on the hub (issue 60); see docs/serve.md

// Until the rollout core that uses them is merged (it replaces this file).
#![allow(dead_code)]

pub mod steps;
pub mod store;
