//! Operations: what cmpoll tells its operators and its supervisor (health and metrics — served
//! by `https::endpoints` —, sd_notify, logs), and the process plumbing the loop and the agent share
//! (signals, process groups). The bottom layer: nothing here knows about polls or sinks.

pub mod health;
pub mod logging;
pub mod malloc;
pub mod metrics;
pub mod process;
pub mod signals;
pub mod systemd;
pub mod volume;
