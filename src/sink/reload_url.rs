//! `--reload-url URL`: tell an agent in another container that a batch landed.
//!
//! After each batch with changes (the first batch included) the URL is called with
//! `--reload-method` (default POST) and an empty body; a 2xx answer is success. Calls run on
//! their own thread, so later sinks never wait for them: a failure is retried with backoff
//! (1 s doubling up to 30 s) until a call succeeds, and a newer batch replaces a pending
//! retry (SPEC): an agent that takes minutes to start still gets its reload, and `/readyz`
//! recovers without waiting for a ConfigMap to change. Every `--reload-url` has its own
//! caller and retries; `--reload-header`s go to all (`@FILE` values read at each call);
//! `--reload-skip-first` skips the first batch; with `--once`, `finish` waits for every
//! URL to have answered. Each outcome is reported for `/readyz` and the metrics. The URL's userinfo is
//! sent as basic auth; neither it nor the query string appears in a log line or an error.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::backoff::{Backoff, Rng};
use crate::batch::{Batch, Fatal, Outcome, Sink};
use crate::http::tls::{self, Trust};
use crate::http::url;
use crate::sink::reloads::ReloadResults;
use base64::Engine as _;

use crate::locks::Recover;
use crate::secret::{Secret, SecretSource};

const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct Options {
    /// Every URL is called, each with its own retries.
    pub urls: Vec<String>,
    pub method: String,
    pub ca_file: Option<PathBuf>,
    /// Per call (`--reload-timeout`); with `--once`, also how long delivery may take.
    pub timeout: Duration,
    /// `--reload-header`, sent to every URL.
    pub headers: Vec<Header>,
    /// `--reload-skip-first`: not after the first batch (the agent read the folder when it
    /// started).
    pub skip_first: bool,
    /// A JSON body (`cmpoll sidecar`'s `REQ_PAYLOAD`), sent as `application/json`.
    pub body: Option<Vec<u8>>,
    /// Basic auth, read at each call (`REQ_USERNAME`, `REQ_PASSWORD` and their `_FILE`s);
    /// the URL's userinfo and an `Authorization` header win.
    pub basic: Option<(SecretSource, SecretSource)>,
    /// No TLS verification (`REQ_SKIP_TLS_VERIFY`).
    pub insecure: bool,
}

/// `--reload-header 'Name: value'`; `Name: @FILE` reads the value at each call.
#[derive(Clone, Debug)]
pub struct Header {
    pub name: String,
    pub value: SecretSource,
}

impl Header {
    /// Parses `Name: value` (a header name that HTTP allows; `@FILE` for a file).
    pub fn parse(text: &str) -> Result<Header, String> {
        let (name, value) = text.split_once(':').ok_or("expected 'Name: value'")?;
        let name = name.trim();
        ureq::http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("'{name}' is not an HTTP header name"))?;
        let value = value.trim();
        let value = match value.strip_prefix('@') {
            Some(path) if !path.is_empty() => SecretSource::File(PathBuf::from(path)),
            _ => SecretSource::Text(Secret::new(value)),
        };
        Ok(Header {
            name: name.to_string(),
            value,
        })
    }

    /// The value now: a file is read at each call, its trailing newline trimmed.
    fn value(&self) -> Result<Secret, String> {
        (self.value.read()).map_err(|e| format!("header {}: {e}", self.name))
    }
}

/// What one URL's caller has done: the newest batch handed to it, the newest delivered,
/// and the last failure. `--once` waits on it.
#[derive(Default)]
struct Progress {
    sent: u64,
    delivered: u64,
    last_error: Option<String>,
}

#[derive(Default)]
struct Calls {
    state: Mutex<Progress>,
    changed: Condvar,
}

impl Calls {
    fn sent(&self, batch: u64) {
        let mut s = self.state.lock().recover();
        s.sent = batch;
    }

    fn outcome(&self, batch: u64, result: &Result<(), String>) {
        let mut s = self.state.lock().recover();
        match result {
            Ok(()) => {
                s.delivered = s.delivered.max(batch);
                s.last_error = None;
            }
            Err(e) => s.last_error = Some(e.clone()),
        }
        self.changed.notify_all();
    }

    /// Waits until the newest batch sent is delivered, or `deadline`; the failure if not.
    fn wait(&self, deadline: Instant) -> Result<(), String> {
        let mut s = self.state.lock().recover();
        while s.delivered < s.sent {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err((s.last_error.clone()).unwrap_or_else(|| "no answer yet".into()));
            }
            s = self.changed.wait_timeout(s, left).recover().0;
        }
        Ok(())
    }
}

struct Caller {
    tx: Sender<u64>,
    delivery: Arc<Calls>,
    what: String,
}

pub struct ReloadUrl {
    callers: Vec<Caller>,
    skip_first: bool,
    timeout: Duration,
}

impl ReloadUrl {
    /// Builds one client (TLS from the CA file or the platform) and one caller thread per
    /// URL.
    pub fn new(
        o: &Options,
        results: ReloadResults,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ReloadUrl, String> {
        // One client for every URL: the CA file is read once.
        let agent = http_agent(o, env)?;
        let mut callers = Vec::new();
        for u in &o.urls {
            callers.push(caller_for(u, o, agent.clone(), results.clone())?);
        }
        Ok(ReloadUrl {
            callers,
            skip_first: o.skip_first,
            timeout: o.timeout,
        })
    }
}

/// The HTTP client of the reload URLs: TLS from `--reload-ca-file` or the platform's CAs.
/// Whether a request of `method` carries a body (an empty one is then sent as
/// `Content-Length: 0`), as Go's client decides for POST, PUT and PATCH.
fn carries_body(method: &str) -> bool {
    ["POST", "PUT", "PATCH"].contains(&method.to_ascii_uppercase().as_str())
}

fn http_agent(o: &Options, env: &dyn Fn(&str) -> Option<String>) -> Result<ureq::Agent, String> {
    let trust = match &o.ca_file {
        Some(p) => Trust::Pem {
            pem: std::fs::read(p)
                .map_err(|e| format!("--reload-ca-file: cannot read '{}': {e}", p.display()))?,
            origin: format!("--reload-ca-file '{}'", p.display()),
        },
        None => Trust::Platform,
    };
    // Plain http needs no TLS, but the connector wants a config; never used.
    let trust = if o.urls.iter().any(|u| u.starts_with("https://")) && !o.insecure {
        trust
    } else {
        Trust::Insecure
    };
    let tls = tls::client_config(&trust, None, env).map_err(|e| format!("--reload-url: {e}"))?;
    Ok(crate::http::agent(crate::http::AgentOptions {
        tls,
        server_name: None,
        timeout: o.timeout,
        disable_compression: true,
        proxy: None,
        keep_idle: crate::http::SHORT_IDLE,
    }))
}

fn caller_for(
    target: &str,
    o: &Options,
    agent: ureq::Agent,
    results: ReloadResults,
) -> Result<Caller, String> {
    let shown = url::redact(target);
    // Userinfo becomes basic auth here (ureq never sees it); an explicit Authorization
    // header wins.
    let (bare, basic) = url::split_userinfo(target);
    let explicit_auth = o
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("authorization"));
    let basic = basic.filter(|_| !explicit_auth);
    let from_files = o
        .basic
        .clone()
        .filter(|_| !explicit_auth && basic.is_none());
    let body = o.body.clone();
    let method = o.method.clone();
    let headers = o.headers.clone();
    // A check at start-up: the URL and method make a request.
    ureq::http::Request::builder()
        .method(method.as_str())
        .uri(&bare)
        .body(())
        .map_err(|e| format!("--reload-url '{shown}': {e}"))?;
    let mut secrets = url::secret_parts(target);
    secrets.extend(o.headers.iter().filter_map(|h| match &h.value {
        SecretSource::Text(s) => Some(s.expose().to_string()).filter(|v| v.len() >= 4),
        SecretSource::File(_) => None,
    }));
    let what = format!("{} {shown}", o.method);
    let call = move || -> Result<(), String> {
        let mut request = ureq::http::Request::builder()
            .method(method.as_str())
            .uri(&bare);
        if let Some(b) = &basic {
            request = request.header("Authorization", b.expose());
        }
        if let Some((user, password)) = &from_files {
            let (user, password) = (user.read()?, password.read()?);
            let raw = format!("{}:{}", user.expose(), password.expose());
            let encoded = base64::engine::general_purpose::STANDARD.encode(raw);
            request = request.header("Authorization", format!("Basic {encoded}"));
        }
        for h in &headers {
            request = request.header(h.name.as_str(), h.value()?.expose());
        }
        let resp = match &body {
            Some(b) => {
                let request = (request.header("Content-Type", "application/json"))
                    .body(b.clone())
                    .map_err(|_| "a header value is not valid in HTTP".to_string())?;
                agent.run(request)
            }
            // No body: `Content-Length: 0` where the method carries one, as Go's client
            // and Python's requests send it (an empty body sent chunked leaves a
            // terminator that simple reload endpoints never read; closing on it resets
            // the connection, and the reload they made looks failed).
            None if carries_body(&method) => {
                let request = request
                    .body(Vec::<u8>::new())
                    .map_err(|_| "a header value is not valid in HTTP".to_string())?;
                agent.run(request)
            }
            None => {
                let request = request
                    .body(())
                    .map_err(|_| "a header value is not valid in HTTP".to_string())?;
                agent.run(request)
            }
        }
        .map_err(|e| url::scrub(&e.to_string(), &secrets))?;
        let status = resp.status();
        if status.is_success() {
            Ok(())
        } else {
            let phrase = status.canonical_reason().unwrap_or("");
            Err(format!("{} {phrase}", status.as_u16()))
        }
    };
    let (tx, rx) = mpsc::channel();
    let delivery = Arc::new(Calls::default());
    let (d, w) = (delivery.clone(), what.clone());
    thread::Builder::new()
        .name("reload-url".into())
        .spawn(move || {
            let backoff = Backoff::new(FIRST_RETRY, MAX_RETRY, 0.0, Rng::new(0));
            caller(&rx, &results, call, &w, backoff, &d)
        })
        .map_err(|e| format!("--reload-url: cannot start its thread: {e}"))?;
    Ok(Caller { tx, delivery, what })
}

/// The caller loop: one batch number at a time, the newest wins; retried until it works.
fn caller(
    rx: &Receiver<u64>,
    results: &ReloadResults,
    call: impl Fn() -> Result<(), String>,
    what: &str,
    mut backoff: Backoff,
    delivery: &Calls,
) {
    let mut current: Option<u64> = None;
    let mut attempts = 0_u64;
    let mut wait = Duration::ZERO;
    loop {
        let next = match current {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(_) => rx.recv_timeout(wait),
        };
        match next {
            Ok(n) => current = Some(n),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(n) = rx.try_recv() {
            current = Some(n);
        }
        if next.is_ok() {
            attempts = 0;
            backoff.reset();
        }
        let Some(batch) = current else { continue };
        let result = call();
        attempts += 1;
        match &result {
            Ok(()) => {
                log::debug!("{what}: reloaded (poll {batch})");
                current = None;
            }
            Err(e) => {
                wait = backoff.after_failure(None);
                // One warning per doubling, then one every tenth attempt at the cap.
                if attempts <= 6 || attempts.is_multiple_of(10) {
                    log::warn!(
                        "{what} failed: {e}; retrying in {} (attempt {attempts} for poll {batch})",
                        humantime::format_duration(wait)
                    );
                }
            }
        }
        delivery.outcome(batch, &result);
        results.done(what, result);
    }
}

impl Sink for ReloadUrl {
    fn name(&self) -> &'static str {
        "reload-url"
    }

    fn apply(&mut self, batch: &Batch) -> Result<Outcome, Fatal> {
        let wanted = if batch.first {
            !self.skip_first
        } else {
            batch.has_changes()
        };
        if wanted {
            for c in &self.callers {
                c.delivery.sent(batch.synced.poll);
                let _ = c.tx.send(batch.synced.poll);
            }
        }
        Ok(Outcome::default())
    }

    /// `--once`: every URL must have answered 2xx for the batch, retried with backoff
    /// for at most `--reload-timeout` in all.
    fn finish(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + self.timeout;
        let failed: Vec<String> = self
            .callers
            .iter()
            .filter_map(|c| {
                c.delivery
                    .wait(deadline)
                    .err()
                    .map(|e| format!("{}: {e}", c.what))
            })
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!("not delivered: {}", failed.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn failures_are_retried_and_a_newer_batch_replaces_the_retry() {
        let (tx, rx) = mpsc::channel();
        let metrics = crate::ops::metrics::Metrics::new();
        let results = ReloadResults {
            counter: metrics.reloads(),
            ..ReloadResults::default()
        };
        let calls = Arc::new(AtomicU32::new(0));
        let (r, c) = (results.clone(), calls.clone());
        let t = thread::spawn(move || {
            caller(
                &rx,
                &r,
                || {
                    // Fails twice, then works.
                    if c.fetch_add(1, Ordering::SeqCst) < 2 {
                        Err("503 Service Unavailable".into())
                    } else {
                        Ok(())
                    }
                },
                "POST http://x",
                Backoff::new(FIRST_RETRY, MAX_RETRY, 0.0, Rng::new(0)),
                &Calls::default(),
            )
        });
        let wait_calls = |n: u32| {
            let start = std::time::Instant::now();
            while calls.load(Ordering::SeqCst) < n {
                assert!(start.elapsed() < Duration::from_secs(10), "call {n}");
                thread::sleep(Duration::from_millis(5));
            }
        };
        tx.send(1).unwrap();
        wait_calls(1);
        // A newer batch does not wait for the retry.
        tx.send(2).unwrap();
        wait_calls(2);
        // The retry of batch 2 comes after a second and succeeds.
        wait_calls(3);
        drop(tx);
        t.join().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let text = metrics.render();
        assert!(
            text.contains("cmpoll_reloads_total{result=\"failure\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("cmpoll_reloads_total{result=\"success\"} 1"),
            "{text}"
        );
    }

    /// SPEC: retried until it succeeds, however many attempts that takes.
    #[test]
    fn a_failing_call_is_retried_until_it_succeeds() {
        let (tx, rx) = mpsc::channel();
        let results = ReloadResults::default();
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let t = thread::spawn(move || {
            caller(
                &rx,
                &results,
                || {
                    // An agent that answers only on the twelfth call.
                    if c.fetch_add(1, Ordering::SeqCst) < 11 {
                        Err("connection refused".into())
                    } else {
                        Ok(())
                    }
                },
                "POST http://x",
                Backoff::new(
                    Duration::from_millis(1),
                    Duration::from_millis(4),
                    0.0,
                    Rng::new(0),
                ),
                &Calls::default(),
            )
        });
        tx.send(1).unwrap();
        let start = std::time::Instant::now();
        while calls.load(Ordering::SeqCst) < 12 {
            assert!(start.elapsed() < Duration::from_secs(10), "retries stopped");
            thread::sleep(Duration::from_millis(2));
        }
        drop(tx);
        t.join().unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            12,
            "no call after the success"
        );
    }
}
