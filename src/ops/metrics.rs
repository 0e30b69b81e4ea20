//! Prometheus metrics (prometheus-client, OpenMetrics text).
//!
//! The loop sets the poll-level metrics; counters that other parts own are handed to them
//! as shared, atomic handles at construction (`ApiCounters` to the apiserver client,
//! `Reloads` to the reload paths, the restart counter to the agent's supervisor), so each
//! counts where it happens and nothing is relayed or worked back out of running totals.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

mod labels;
mod served;

use self::labels::{Labels, label};
pub use self::served::{Decisions, FLEET_STATES, Served, ServerCounts, TURNED_AWAY};
use self::served::{serve_metrics, server_metrics};

/// Apiserver requests by status code, and response bytes: the client's handle.
#[derive(Clone, Debug, Default)]
pub struct ApiCounters {
    requests: Family<Labels, Counter>,
    response_bytes: Counter,
}

impl ApiCounters {
    /// One request that got `code` (`"error"`: no answer).
    pub fn request(&self, code: &str) {
        self.requests.get_or_create(&label("code", code)).inc();
    }

    /// Response body bytes read (after gzip decoding).
    pub fn bytes(&self, n: u64) {
        self.response_bytes.inc_by(n);
    }
}

/// Reloads (signal deliveries, `--on-change` runs, reload URL calls) by result.
#[derive(Clone, Debug, Default)]
pub struct Reloads(Family<Labels, Counter>);

impl Reloads {
    pub fn record(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.0.get_or_create(&label("result", result)).inc();
    }
}

/// Outcomes of one kind of work by result (`cmpoll_event_reports_total{result}`,
/// `cmpoll_webhook_reviews_total{result}`, `cmpoll_hub_reports_total{result}`): the handle
/// the worker counts into.
#[derive(Clone, Debug, Default)]
pub struct Results(Family<Labels, Counter>);

impl Results {
    pub fn record(&self, result: &str) {
        self.0.get_or_create(&label("result", result)).inc();
    }

    /// Exports each of `results` at 0 from now on (`Metrics::expect`'s rule).
    pub fn expect(&self, results: &[&str]) {
        for result in results {
            let _ = self.0.get_or_create(&label("result", result));
        }
    }

    /// The count of `result` so far.
    pub fn get(&self, result: &str) -> u64 {
        self.0.get_or_create(&label("result", result)).get()
    }
}

/// The works counted by result, each by a worker of its own (one field of `Metrics`).
#[derive(Clone, Debug, Default)]
struct Works {
    event_reports: Results,
    webhook_reviews: Results,
    hub_reports: Results,
}

/// Registers the works' families in `r`.
fn works(r: &mut Registry) -> Works {
    let w = Works::default();
    r.register(
        "event_reports",
        "Kubernetes Events recorded with --report-events (API calls), by result (ok, error)",
        w.event_reports.0.clone(),
    );
    r.register(
        "webhook_reviews",
        "AdmissionReviews answered by cmpoll webhook, by result (allowed, denied, error)",
        w.webhook_reviews.0.clone(),
    );
    r.register(
        "hub_reports",
        "Reports of what a follower holds sent to its cmpoll serve hub, by result (ok: taken, error)",
        w.hub_reports.0.clone(),
    );
    w
}

/// The features whose metric families `Metrics::expect` exports at 0 from the start.
#[derive(Clone, Copy, Debug, Default)]
pub struct Features {
    /// The daemon's polls and batches (`cmpoll run`, `cmpoll sidecar`).
    pub polls: bool,
    /// A reload path: the agent's `--reload-signal`, `--on-change`, `--reload-url`.
    pub reloads: bool,
    /// `--validate`.
    pub validate: bool,
    /// `--report-events`.
    pub report_events: bool,
    /// `cmpoll webhook`.
    pub webhook: bool,
    /// `cmpoll serve`.
    pub serve: bool,
}

pub struct Metrics {
    registry: Registry,
    polls: Family<Labels, Counter>,
    poll_duration: Histogram,
    modules: Gauge,
    invalid_configmaps: Gauge,
    events: Family<Labels, Counter>,
    last_success: Gauge<f64, AtomicU64>,
    unwritten: Gauge,
    rejected_modules: Gauge,
    validations: Family<Labels, Counter>,
    api: ApiCounters,
    reloads: Reloads,
    child_restarts: Counter,
    /// The works a worker of its own counts by result.
    results: Works,
    decisions: Decisions,
    served: Served,
    server: ServerCounts,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("cmpoll");
        let polls = Family::<Labels, Counter>::default();
        r.register(
            "polls",
            "Polls, by result (success or error)",
            polls.clone(),
        );
        let poll_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        r.register(
            "poll_duration_seconds",
            "Time to list, decode and hash one poll",
            poll_duration.clone(),
        );
        let modules = Gauge::default();
        r.register(
            "modules",
            "Modules in the last complete poll",
            modules.clone(),
        );
        let invalid_configmaps = Gauge::default();
        r.register(
            "rejected_configmaps",
            "Selected ConfigMaps rejected in the last complete poll (invalid names or keys)",
            invalid_configmaps.clone(),
        );
        let events = Family::<Labels, Counter>::default();
        r.register("events", "Events emitted, by type", events.clone());
        let last_success = Gauge::<f64, AtomicU64>::default();
        r.register(
            "last_success_timestamp_seconds",
            "Unix time of the last successful poll",
            last_success.clone(),
        );
        let api = ApiCounters::default();
        r.register(
            "apiserver_requests",
            "Requests to the apiserver, by HTTP status code (error: no answer)",
            api.requests.clone(),
        );
        r.register(
            "apiserver_response_bytes",
            "Body bytes read from the apiserver (after gzip decoding)",
            api.response_bytes.clone(),
        );
        let reloads = Reloads::default();
        r.register(
            "reloads",
            "Reloads (signal deliveries, on-change commands and reload URL calls), by result",
            reloads.0.clone(),
        );
        let child_restarts = Counter::default();
        r.register(
            "child_restarts",
            "Restarts of the supervised agent",
            child_restarts.clone(),
        );
        let unwritten = Gauge::default();
        r.register(
            "module_write_failures",
            "Modules left unwritten in the last batch: the output directory could not write them (they keep their last version)",
            unwritten.clone(),
        );
        let rejected_modules = Gauge::default();
        r.register(
            "rejected_modules",
            "Modules rejected now (a failed --validate, a --layout flat name clash, a failed .url fetch); the sinks keep their last good version",
            rejected_modules.clone(),
        );
        let validations = Family::<Labels, Counter>::default();
        r.register(
            "validations",
            "--validate runs, by result (pass, fail, error: the validator could not run)",
            validations.clone(),
        );
        let results = works(&mut r);
        let (decisions, served) = serve_metrics(&mut r);
        let server = server_metrics(&mut r, &served);
        let info = Family::<Labels, Gauge>::default();
        r.register("build_info", "cmpoll's version", info.clone());
        info.get_or_create(&label("version", env!("CARGO_PKG_VERSION")))
            .set(1);
        Metrics {
            registry: r,
            polls,
            poll_duration,
            modules,
            invalid_configmaps,
            events,
            last_success,
            unwritten,
            rejected_modules,
            validations,
            api,
            reloads,
            child_restarts,
            results,
            decisions,
            served,
            server,
        }
    }

    /// Exports every label value known in advance at 0, so that a panel or an alert on
    /// `increase(…{result="failure"}[5m])` reads 0 on a healthy daemon rather than no
    /// data (Prometheus's guidance): the families of the features `on` switches on. An
    /// apiserver's status codes come as they come.
    pub fn expect(&self, on: &Features) {
        if on.polls {
            for result in ["success", "error"] {
                let _ = self.polls.get_or_create(&label("result", result));
            }
            for t in ["added", "updated", "removed", "rejected"] {
                let _ = self.events.get_or_create(&label("type", t));
            }
        }
        if on.reloads {
            for result in ["success", "failure"] {
                let _ = self.reloads.0.get_or_create(&label("result", result));
            }
        }
        if on.validate {
            for result in ["pass", "fail", "error"] {
                let _ = self.validations.get_or_create(&label("result", result));
            }
        }
        if on.report_events {
            for result in ["ok", "error"] {
                let _ = (self.results.event_reports.0).get_or_create(&label("result", result));
            }
        }
        if on.serve {
            served::expect(&self.decisions, &self.served, &self.server);
        }
        if on.webhook {
            for result in ["allowed", "denied", "error"] {
                let _ = (self.results.webhook_reviews.0).get_or_create(&label("result", result));
            }
        }
    }

    /// `--report-events`' handle.
    pub fn event_reports(&self) -> Results {
        self.results.event_reports.clone()
    }

    /// A follower's reports to its hub: their handle.
    pub fn hub_reports(&self) -> Results {
        self.results.hub_reports.clone()
    }

    /// `cmpoll serve`'s handles.
    pub fn decisions(&self) -> Decisions {
        self.decisions.clone()
    }

    pub fn served(&self) -> Served {
        self.served.clone()
    }

    /// The HTTPS server's own counts (`cmpoll serve`, `cmpoll webhook`).
    pub fn server(&self) -> ServerCounts {
        self.server.clone()
    }

    /// `cmpoll webhook`'s handle.
    pub fn webhook_reviews(&self) -> Results {
        self.results.webhook_reviews.clone()
    }

    /// The apiserver client's handle.
    pub fn api(&self) -> ApiCounters {
        self.api.clone()
    }

    /// The reload paths' handle.
    pub fn reloads(&self) -> Reloads {
        self.reloads.clone()
    }

    /// The agent supervisor's handle.
    pub fn child_restarts(&self) -> Counter {
        self.child_restarts.clone()
    }

    pub fn poll_failed(&self, took: Duration) {
        self.polls.get_or_create(&label("result", "error")).inc();
        self.poll_duration.observe(took.as_secs_f64());
    }

    pub fn poll_succeeded(&self, took: Duration, modules: usize, invalid: usize) {
        self.polls.get_or_create(&label("result", "success")).inc();
        self.poll_duration.observe(took.as_secs_f64());
        self.modules.set(modules as i64);
        self.invalid_configmaps.set(invalid as i64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.last_success.set(now);
    }

    /// Modules a sink could not write in the last poll (every poll retries them, so a poll
    /// without changes has none).
    pub fn unwritten(&self, n: usize) {
        self.unwritten.set(n as i64);
    }

    /// Modules rejected now.
    pub fn rejected_modules(&self, n: usize) {
        self.rejected_modules.set(n as i64);
    }

    /// One validator run: `pass`, `fail` or `error`.
    pub fn validation(&self, result: &str) {
        self.validations
            .get_or_create(&label("result", result))
            .inc();
    }

    /// Events of one batch, by type (`added`, `updated`, `removed`, `rejected`).
    pub fn events(&self, counts: &[(&str, usize)]) {
        for &(t, n) in counts {
            self.events
                .get_or_create(&label("type", t))
                .inc_by(n as u64);
        }
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

    /// Issue 42.2: the families of the features switched on are there from the start,
    /// at 0, and only those.
    #[test]
    fn known_label_values_are_exported_at_zero_for_the_features_on() {
        let m = Metrics::new();
        let before = m.render();
        assert!(!before.contains("cmpoll_reloads_total{"), "{before}");
        m.expect(&Features {
            polls: true,
            reloads: true,
            validate: true,
            report_events: false,
            webhook: false,
            serve: false,
        });
        let text = m.render();
        for line in [
            "cmpoll_polls_total{result=\"error\"} 0",
            "cmpoll_events_total{type=\"rejected\"} 0",
            "cmpoll_reloads_total{result=\"failure\"} 0",
            "cmpoll_validations_total{result=\"fail\"} 0",
            "cmpoll_validations_total{result=\"error\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("cmpoll_event_reports_total{"), "off: {text}");
        assert!(
            !text.contains("cmpoll_webhook_reviews_total{"),
            "off: {text}"
        );
    }

    #[test]
    fn renders_every_metric_with_help_and_type() {
        let m = Metrics::new();
        m.poll_succeeded(Duration::from_millis(12), 3, 1);
        m.poll_failed(Duration::from_millis(5));
        m.events(&[("added", 2), ("updated", 1), ("rejected", 1)]);
        m.rejected_modules(1);
        m.validation("pass");
        // Handles count into the same registry from wherever they were handed.
        let api = m.api();
        for code in ["200", "200", "500", "200", "200", "200", "200", "200"] {
            api.request(code);
        }
        api.bytes(1000);
        m.api().bytes(500);
        let reloads = m.reloads();
        reloads.record(true);
        reloads.record(true);
        reloads.record(false);
        m.child_restarts().inc_by(3);
        m.event_reports().record("ok");
        m.webhook_reviews().record("denied");
        m.hub_reports().record("ok");
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
            "cmpoll_events_total{type=\"rejected\"} 1",
            "cmpoll_rejected_modules 1",
            "cmpoll_validations_total{result=\"pass\"} 1",
            "cmpoll_apiserver_requests_total{code=\"200\"} 7",
            "cmpoll_apiserver_requests_total{code=\"500\"} 1",
            "cmpoll_apiserver_response_bytes_total 1500",
            "cmpoll_reloads_total{result=\"failure\"} 1",
            "cmpoll_child_restarts_total 3",
            "cmpoll_event_reports_total{result=\"ok\"} 1",
            "cmpoll_webhook_reviews_total{result=\"denied\"} 1",
            "cmpoll_hub_reports_total{result=\"ok\"} 1",
            "# HELP cmpoll_last_success_timestamp_seconds Unix time of the last successful poll.",
            "cmpoll_build_info{version=",
            "# EOF",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}

#[cfg(test)]
mod documented {
    use super::*;

    /// Every family a hub exports is in docs/operations.md's table (tests/docs.rs holds a
    /// `cmpoll run`'s /metrics to it, which has none of the hub's).
    #[test]
    fn a_hubs_families_are_documented() {
        let m = Metrics::new();
        m.expect(&Features {
            serve: true,
            ..Features::default()
        });
        let text = m.render();
        let ops = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md");
        let ops = std::fs::read_to_string(ops).unwrap_or_default();
        let mut families = 0;
        for t in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let (name, kind) = t.split_once(' ').unwrap_or((t, ""));
            let sample = match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            };
            assert!(
                ops.contains(&format!("| `{sample}")),
                "{sample} is not in docs/operations.md"
            );
            families += 1;
        }
        assert!(families > 16, "{text}");
    }
}
