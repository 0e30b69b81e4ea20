//! What `cmpoll serve` counts besides the poll's: its server's answers and the connections
//! it turned away (`ServerCounts`, the HTTPS server's handle), its authentication and
//! authorization decisions (`Decisions`), and what it served — waits, watches, the fleet's
//! followers and reports (`Served`, the hub's handle).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::{Labels, label};

/// `cmpoll serve`'s authentication and authorization decisions, by check
/// (`authentication`, `authorization`), result (`allowed`, `denied`, `error`) and cache
/// (`hit`, `miss`; `none`: no credential to review).
#[derive(Clone, Debug, Default)]
pub struct Decisions(Family<Labels, Counter>);

impl Decisions {
    pub fn record(&self, check: &str, result: &str, cache: &str) {
        self.0.get_or_create(&decision(check, result, cache)).inc();
    }

    /// The count so far.
    pub fn get(&self, check: &str, result: &str, cache: &str) -> u64 {
        self.0.get_or_create(&decision(check, result, cache)).get()
    }
}

fn decision(check: &str, result: &str, cache: &str) -> Labels {
    vec![
        ("check".to_string(), check.to_string()),
        ("result".to_string(), result.to_string()),
        ("cache".to_string(), cache.to_string()),
    ]
}

/// What the HTTPS server does itself (`cmpoll serve`, `cmpoll webhook`): its answers
/// counted with the hub's.
pub(super) fn server_metrics(r: &mut Registry, served: &Served) -> ServerCounts {
    let server = ServerCounts {
        answered: served.requests.clone(),
        ..ServerCounts::default()
    };
    r.register(
        "handler_panics",
        "Requests to cmpoll serve or cmpoll webhook whose handler panicked: each was answered 500 and the server went on",
        server.panics.clone(),
    );
    r.register(
        "serve_connections",
        "Connections cmpoll serve (or cmpoll webhook) accepted: each a TLS handshake; a client that keeps its connection makes one",
        server.connections.clone(),
    );
    r.register(
        "serve_turned_away",
        "Connections and requests cmpoll serve turned away or cut short to keep room for others, by why: connections (full, nothing to make room), evicted (made room), handshakes (a ClientHello over the handshake workers' queue), held (over one identity's bound), memory (over one identity's bytes, or the token-less connections'), queue (a lane's queue full), renewals (over the renewal rate), reviews (over the review rate of unknown tokens), signed (over the review rate of tokens the cluster signed), access (a user over its access-review rate), access_all (over the access-review rate of all users)",
        server.turned_away.clone(),
    );
    server
}

/// `cmpoll serve`'s families, registered in `r`.
pub(super) fn serve_metrics(r: &mut Registry) -> (Decisions, Served) {
    let decisions = Decisions::default();
    r.register(
        "serve_decisions",
        "cmpoll serve's authentication (TokenReview) and authorization (SubjectAccessReview) decisions, by check, result (allowed, denied, error) and cache (hit, miss; local: a token for --token-audience verified by the hub)",
        decisions.0.clone(),
    );
    let served = Served::default();
    r.register(
        "serve_requests",
        "Requests answered by cmpoll serve, by HTTP status code",
        served.requests.clone(),
    );
    r.register(
        "serve_waits",
        "Follower lists cmpoll serve held until it had a newer poll, by how they ended (newer, not_modified)",
        served.waits.clone(),
    );
    r.register(
        "serve_watches",
        "Watches cmpoll serve started, by who: follower (a cmpoll follower's, ending at its first change) or stream (any other client's)",
        served.watches.clone(),
    );
    r.register(
        "fleet_followers",
        "The followers of cmpoll serve by state (current, updating, behind, refused, gone), each counted once by its worst state over the objects it holds (docs/serve.md, The fleet's state); set when /metrics is read",
        served.fleet_followers.clone(),
    );
    r.register(
        "fleet_reports",
        "Reports from followers to cmpoll serve, by result: accepted, invalid (400), forbidden (403), limited (429)",
        served.fleet_reports.clone(),
    );
    r.register(
        "rollouts",
        "Objects cmpoll serve rolls out (--rollout), by state: rolling (a version reaching its clients step by step), refused (a version a follower refused during its rollout: every client is served the last good version)",
        served.rollouts.clone(),
    );
    r.register(
        "rollout_steps",
        "Rollout decisions this cmpoll serve wrote into the rollouts' state, by what: started, advanced (to the next step), completed, refused, ended (the object gone, or written back to its last good version)",
        served.rollout_steps.clone(),
    );
    (decisions, served)
}

/// `cmpoll serve`'s answers by status code, its followers' waits by how they ended, and
/// the watches it started.
#[derive(Clone, Debug, Default)]
pub struct Served {
    requests: Family<Labels, Counter>,
    waits: Family<Labels, Counter>,
    watches: Family<Labels, Counter>,
    fleet_followers: Family<Labels, Gauge>,
    fleet_reports: Family<Labels, Counter>,
    rollouts: Family<Labels, Gauge>,
    rollout_steps: Family<Labels, Counter>,
}

impl Served {
    /// How many objects roll out in `state` now.
    pub fn rollouts(&self, state: &str, n: usize) {
        (self.rollouts.get_or_create(&label("state", state))).set(n as i64);
    }

    /// One rollout decision written: `started`, `advanced`, `completed`, `refused`, `ended`.
    pub fn rollout_step(&self, what: &str) {
        self.rollout_steps.get_or_create(&label("what", what)).inc();
    }

    /// One answer with `code`.
    pub fn answered(&self, code: u16) {
        self.requests
            .get_or_create(&label("code", &code.to_string()))
            .inc();
    }

    /// One wait that ended: `newer` (something changed) or `not_modified`.
    pub fn waited(&self, result: &str) {
        self.waits.get_or_create(&label("result", result)).inc();
    }

    /// One watch started: `follower` (a cmpoll follower's, held or ending at its first
    /// change) or `stream` (any other client's).
    pub fn watched(&self, by: &str) {
        self.watches.get_or_create(&label("by", by)).inc();
    }

    /// How many followers are in `state` now.
    pub fn fleet_followers(&self, state: &str, n: usize) {
        (self.fleet_followers.get_or_create(&label("state", state))).set(n as i64);
    }

    /// One report answered: `accepted`, `invalid`, `forbidden`, `limited`.
    pub fn fleet_report(&self, result: &str) {
        self.fleet_reports
            .get_or_create(&label("result", result))
            .inc();
    }

    /// The count of reports with `result` so far.
    pub fn fleet_reports(&self, result: &str) -> u64 {
        self.fleet_reports
            .get_or_create(&label("result", result))
            .get()
    }
}

/// What an HTTPS server (`cmpoll serve`, `cmpoll webhook`) did itself: the answers it
/// gave without a handler (400, 408, 413, 431, a lane's busy answer), the connections and
/// requests it turned away or cut short to keep room for others, and handlers that
/// panicked. The hub's answers share `cmpoll_serve_requests_total`.
#[derive(Clone, Debug, Default)]
pub struct ServerCounts {
    answered: Family<Labels, Counter>,
    turned_away: Family<Labels, Counter>,
    panics: Counter,
    connections: Counter,
}

impl ServerCounts {
    /// One answer the server gave itself.
    pub fn answered(&self, code: u16) {
        self.answered
            .get_or_create(&label("code", &code.to_string()))
            .inc();
    }

    /// One connection or request turned away or cut short, and why.
    pub fn turned_away(&self, why: &str) {
        self.turned_away.get_or_create(&label("why", why)).inc();
    }

    /// One connection accepted.
    pub fn accepted(&self) {
        self.connections.inc();
    }

    pub fn panicked(&self) {
        self.panics.inc();
    }

    /// Handlers that panicked so far.
    pub fn panics(&self) -> u64 {
        self.panics.get()
    }

    /// The count for `why` so far.
    pub fn turned_away_for(&self, why: &str) -> u64 {
        self.turned_away.get_or_create(&label("why", why)).get()
    }
}

/// Why a server turns a connection or request away (`ServerCounts::turned_away`).
pub const TURNED_AWAY: [&str; 11] = [
    "access",
    "access_all",
    "connections",
    "evicted",
    "handshakes",
    "held",
    "memory",
    "queue",
    "renewals",
    "reviews",
    "signed",
];

/// A follower's states (`cmpoll_fleet_followers{state}`).
pub const FLEET_STATES: [&str; 5] = ["current", "updating", "behind", "refused", "gone"];

/// Its families' known label values, exported at 0 from the start (`Metrics::expect`).
pub(super) fn expect(decisions: &Decisions, served: &Served, server: &ServerCounts) {
    for check in ["authentication", "authorization"] {
        for result in ["allowed", "denied", "error"] {
            for cache in ["hit", "miss"] {
                let _ = decisions.0.get_or_create(&decision(check, result, cache));
            }
        }
    }
    for result in ["newer", "not_modified"] {
        let _ = served.waits.get_or_create(&label("result", result));
    }
    for by in ["follower", "stream"] {
        let _ = served.watches.get_or_create(&label("by", by));
    }
    for state in FLEET_STATES {
        let _ = (served.fleet_followers).get_or_create(&label("state", state));
    }
    for result in ["accepted", "invalid", "forbidden", "limited"] {
        let _ = (served.fleet_reports).get_or_create(&label("result", result));
    }
    for why in TURNED_AWAY {
        let _ = server.turned_away.get_or_create(&label("why", why));
    }
}
