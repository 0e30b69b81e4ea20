//! `cmpoll serve --remotecfg ROOT`: the hub answers grafana's `collector.v1.CollectorService`
//! (Alloy's `remotecfg` block; docs/alloy.md, "Without a sidecar: Alloy's remotecfg"), so an
//! Alloy with only that block runs the root and every selected module, each in its own
//! `declare`, as a sidecar's folder would hold them.
//!
//! The rooms: `wire.rs` (Protocol Buffers' binary format, bounded), `messages.rs` (the
//! service's messages), `connect.rs` (the Connect protocol's unary calls and errors),
//! `root.rs` (the root and offered arguments, read again when they change), `wrapped.rs`
//! (each module in its `declare`, kept), `compose.rs`
//! (what a collector is sent, made once per distinct set of modules), `collectors.rs`
//! (what is kept of each collector), `listable.rs` (the namespaces each user may list,
//! kept) and `service.rs` (the procedures). The hub's handler
//! (`serve::hub`) authenticates and authorizes each call and picks the collector's view.

pub mod collectors;
pub mod compose;
pub mod connect;
pub mod listable;
pub mod messages;
pub mod root;
pub mod service;
pub mod wire;
pub mod wrapped;
