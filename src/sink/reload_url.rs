//! `--reload-url URL`: tell an agent in another container that a batch landed.
//!
//! After each batch with changes (the first batch included) the URL is called with
//! `--reload-method` (default POST) and an empty body; a 2xx answer is success. Calls run on
//! their own thread, so later sinks never wait for them: a failure is retried with backoff
//! (1 s doubling up to 30 s) until a call succeeds, and a newer batch replaces a pending
//! retry (SPEC): an agent that takes minutes to start still gets its reload, and `/readyz`
//! recovers without waiting for a ConfigMap to change. Each outcome is reported for `/readyz` and the metrics. The URL's userinfo is
//! sent as basic auth; neither it nor the query string appears in a log line or an error.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::Duration;

use super::{Batch, Fatal, Outcome, ReloadReport, Sink};
use crate::backoff::{Backoff, Rng};
use crate::http::tls::{self, Trust};
use crate::http::url;

const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct Options {
    pub url: String,
    pub method: String,
    pub ca_file: Option<PathBuf>,
    /// Per call.
    pub timeout: Duration,
}

pub struct ReloadUrl {
    tx: Sender<u64>,
}

impl ReloadUrl {
    /// Builds the client (TLS from the CA file or the platform) and starts the caller
    /// thread.
    pub fn new(
        o: &Options,
        report: ReloadReport,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ReloadUrl, String> {
        let shown = url::redact(&o.url);
        let trust = match &o.ca_file {
            Some(p) => Trust::Pem {
                pem: std::fs::read(p)
                    .map_err(|e| format!("--reload-ca-file: cannot read '{}': {e}", p.display()))?,
                origin: format!("--reload-ca-file '{}'", p.display()),
            },
            None => Trust::Platform,
        };
        // Plain http needs no TLS, but the connector wants a config; never used.
        let trust = if o.url.starts_with("https://") {
            trust
        } else {
            Trust::Insecure
        };
        let tls =
            tls::client_config(&trust, None, env).map_err(|e| format!("--reload-url: {e}"))?;
        let agent = crate::http::agent(crate::http::AgentOptions {
            tls,
            server_name: None,
            timeout: o.timeout,
            disable_compression: true,
            proxy: None,
        });
        // Userinfo becomes basic auth here; ureq never sees it.
        let (bare, basic) = url::split_userinfo(&o.url);
        let mut request = ureq::http::Request::builder()
            .method(o.method.as_str())
            .uri(&bare);
        if let Some(b) = &basic {
            request = request.header("Authorization", b.expose());
        }
        let request = request
            .body(())
            .map_err(|e| format!("--reload-url '{shown}': {e}"))?;
        let secrets = url::secret_parts(&o.url);
        let what = format!("{} {shown}", o.method);
        let call = move || -> Result<(), String> {
            let resp = agent
                .run(request.clone())
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
        thread::Builder::new()
            .name("reload-url".into())
            .spawn(move || {
                let backoff = Backoff::new(FIRST_RETRY, MAX_RETRY, 0.0, Rng::new(0));
                caller(&rx, &report, call, &what, backoff)
            })
            .map_err(|e| format!("--reload-url: cannot start its thread: {e}"))?;
        Ok(ReloadUrl { tx })
    }
}

/// The caller loop: one batch number at a time, the newest wins; retried until it works.
fn caller(
    rx: &Receiver<u64>,
    report: &ReloadReport,
    call: impl Fn() -> Result<(), String>,
    what: &str,
    mut backoff: Backoff,
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
        report.report(what, result);
    }
}

impl Sink for ReloadUrl {
    fn apply(&mut self, batch: &Batch) -> Result<Outcome, Fatal> {
        if batch.has_changes() || batch.first {
            let _ = self.tx.send(batch.synced.poll);
        }
        Ok(Outcome::default())
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
        let report = ReloadReport {
            counter: metrics.reloads(),
            ..ReloadReport::default()
        };
        let calls = Arc::new(AtomicU32::new(0));
        let (r, c) = (report.clone(), calls.clone());
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
        let report = ReloadReport::default();
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let t = thread::spawn(move || {
            caller(
                &rx,
                &report,
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
