//! Prometheus metrics (prometheus-client, OpenMetrics text). Only the main loop updates
//! them; counters owned by other threads (apiserver requests, agent restarts, reloads) are
//! taken from their running totals, so nothing is counted twice or lost.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

fn label(k: &str, v: &str) -> Labels {
    vec![(k.to_string(), v.to_string())]
}

pub struct Metrics {
    registry: Registry,
    polls: Family<Labels, Counter>,
    poll_duration: Histogram,
    modules: Gauge,
    rejected: Gauge,
    events: Family<Labels, Counter>,
    last_success: Gauge<f64, AtomicU64>,
    requests: Family<Labels, Counter>,
    response_bytes: Counter,
    reloads: Family<Labels, Counter>,
    child_restarts: Counter,
    write_failures: Gauge,
    /// Running totals already counted, by source.
    seen: BTreeMap<String, u64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("cmpoll");
        let polls = Family::<Labels, Counter>::default();
        registry.register(
            "polls",
            "Polls, by result (success or error)",
            polls.clone(),
        );
        let poll_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "poll_duration_seconds",
            "Time to list, decode and hash one poll",
            poll_duration.clone(),
        );
        let modules = Gauge::default();
        registry.register(
            "modules",
            "Modules in the last complete poll",
            modules.clone(),
        );
        let rejected = Gauge::default();
        registry.register(
            "rejected_configmaps",
            "Selected ConfigMaps rejected in the last complete poll (invalid names or keys)",
            rejected.clone(),
        );
        let events = Family::<Labels, Counter>::default();
        registry.register("events", "Events emitted, by type", events.clone());
        let last_success = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "last_success_timestamp_seconds",
            "Unix time of the last successful poll",
            last_success.clone(),
        );
        let requests = Family::<Labels, Counter>::default();
        registry.register(
            "apiserver_requests",
            "Requests to the apiserver, by HTTP status code (error: no answer)",
            requests.clone(),
        );
        let response_bytes = Counter::default();
        registry.register(
            "apiserver_response_bytes",
            "Body bytes read from the apiserver (after gzip decoding)",
            response_bytes.clone(),
        );
        let reloads = Family::<Labels, Counter>::default();
        registry.register(
            "reloads",
            "Reloads (signal deliveries and reload URL calls), by result",
            reloads.clone(),
        );
        let child_restarts = Counter::default();
        registry.register(
            "child_restarts",
            "Restarts of the supervised agent",
            child_restarts.clone(),
        );
        let write_failures = Gauge::default();
        registry.register(
            "module_write_failures",
            "Modules the output directory could not write in the last batch",
            write_failures.clone(),
        );
        let info = Family::<Labels, Gauge>::default();
        registry.register("build_info", "cmpoll's version", info.clone());
        info.get_or_create(&label("version", env!("CARGO_PKG_VERSION")))
            .set(1);
        Metrics {
            registry,
            polls,
            poll_duration,
            modules,
            rejected,
            events,
            last_success,
            requests,
            response_bytes,
            reloads,
            child_restarts,
            write_failures,
            seen: BTreeMap::new(),
        }
    }

    pub fn poll_failed(&self, took: Duration) {
        self.polls.get_or_create(&label("result", "error")).inc();
        self.poll_duration.observe(took.as_secs_f64());
    }

    pub fn poll_succeeded(&self, took: Duration, modules: usize, rejected: usize) {
        self.polls.get_or_create(&label("result", "success")).inc();
        self.poll_duration.observe(took.as_secs_f64());
        self.modules.set(modules as i64);
        self.rejected.set(rejected as i64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.last_success.set(now);
    }

    /// Modules a sink could not write in the last poll (every poll retries them, so a poll
    /// without changes has none).
    pub fn write_failures(&self, n: usize) {
        self.write_failures.set(n as i64);
    }

    pub fn events(&self, added: usize, updated: usize, removed: usize) {
        for (t, n) in [("added", added), ("updated", updated), ("removed", removed)] {
            self.events
                .get_or_create(&label("type", t))
                .inc_by(n as u64);
        }
    }

    /// Counts what a running total grew by since the last call.
    fn delta(&mut self, key: String, total: u64) -> u64 {
        let seen = self.seen.entry(key).or_default();
        let d = total.saturating_sub(*seen);
        *seen = total;
        d
    }

    /// Takes the client's running totals (requests by code, response bytes).
    pub fn apiserver(&mut self, requests: &BTreeMap<String, u64>, bytes: u64) {
        for (code, total) in requests {
            let d = self.delta(format!("requests/{code}"), *total);
            self.requests.get_or_create(&label("code", code)).inc_by(d);
        }
        let d = self.delta("bytes".into(), bytes);
        self.response_bytes.inc_by(d);
    }

    /// Takes a reload source's running totals (`source` keeps signal and URL apart).
    pub fn reloads(&mut self, source: &str, successes: u64, failures: u64) {
        let d = self.delta(format!("reload-ok/{source}"), successes);
        self.reloads
            .get_or_create(&label("result", "success"))
            .inc_by(d);
        let d = self.delta(format!("reload-fail/{source}"), failures);
        self.reloads
            .get_or_create(&label("result", "failure"))
            .inc_by(d);
    }

    pub fn child_restarts(&mut self, total: u64) {
        let d = self.delta("restarts".into(), total);
        self.child_restarts.inc_by(d);
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_with_help_and_type() {
        let mut m = Metrics::new();
        m.poll_succeeded(Duration::from_millis(12), 3, 1);
        m.poll_failed(Duration::from_millis(5));
        m.events(2, 1, 0);
        m.apiserver(
            &BTreeMap::from([("200".into(), 5), ("500".into(), 1)]),
            1000,
        );
        m.apiserver(
            &BTreeMap::from([("200".into(), 7), ("500".into(), 1)]),
            1500,
        );
        m.reloads("url", 2, 1);
        m.child_restarts(3);
        let text = m.render();
        for line in [
            "# TYPE cmpoll_polls counter",
            "cmpoll_polls_total{result=\"success\"} 1",
            "cmpoll_polls_total{result=\"error\"} 1",
            "# TYPE cmpoll_poll_duration_seconds histogram",
            "cmpoll_poll_duration_seconds_count 2",
            "cmpoll_modules 3",
            "cmpoll_rejected_configmaps 1",
            "cmpoll_events_total{type=\"added\"} 2",
            "cmpoll_apiserver_requests_total{code=\"200\"} 7",
            "cmpoll_apiserver_requests_total{code=\"500\"} 1",
            "cmpoll_apiserver_response_bytes_total 1500",
            "cmpoll_reloads_total{result=\"failure\"} 1",
            "cmpoll_child_restarts_total 3",
            "# HELP cmpoll_last_success_timestamp_seconds Unix time of the last successful poll.",
            "cmpoll_build_info{version=",
            "# EOF",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
