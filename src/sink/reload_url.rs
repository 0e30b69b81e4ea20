//! `--reload-url URL`: tell an agent in another container that a batch landed.
//!
//! After each batch with changes (the first batch included) the URL is called with
//! `--reload-method` (default POST) and an empty body; a 2xx answer is success. Calls run on
//! their own thread, so later sinks never wait for them: a failure is retried with backoff
//! (1 s doubling, at most `ATTEMPTS` tries per batch) and a newer batch replaces a pending
//! retry. The outcome of the last attempt is kept for `/readyz` and the metrics.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::{Batch, Fatal, Outcome, Sink};
use crate::kube::tls::{self, Trust};

/// Tries per batch before giving up until the next batch.
pub const ATTEMPTS: u32 = 5;
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// What health and metrics read.
#[derive(Clone, Debug, Default)]
pub struct ReloadStatus {
    /// The last attempt: `None` before any.
    pub last: Option<Result<(), String>>,
    pub successes: u64,
    pub failures: u64,
}

pub struct ReloadUrl {
    tx: Sender<u64>,
    status: Arc<Mutex<ReloadStatus>>,
}

impl ReloadUrl {
    /// Builds the client (TLS from `ca_file` or the platform) and starts the caller thread.
    pub fn new(
        url: &str,
        method: &str,
        ca_file: Option<&Path>,
        timeout: Duration,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ReloadUrl, String> {
        let trust = match ca_file {
            Some(p) => Trust::Pem {
                pem: std::fs::read(p)
                    .map_err(|e| format!("--reload-ca-file: cannot read '{}': {e}", p.display()))?,
                origin: format!("--reload-ca-file '{}'", p.display()),
            },
            None => Trust::Platform,
        };
        let tls_config = if url.starts_with("https://") {
            tls::client_config(&trust, None, env).map_err(|e| format!("--reload-url: {e}"))?
        } else {
            // Plain http needs no TLS, but the connector wants a config; never used.
            tls::client_config(&Trust::Insecure, None, env)
                .map_err(|e| format!("--reload-url: {e}"))?
        };
        let agent = crate::kube::client::agent(tls_config, None, timeout, true, None);
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(url)
            .body(())
            .map_err(|e| format!("--reload-url: {e}"))?;
        let (tx, rx) = mpsc::channel();
        let status = Arc::new(Mutex::new(ReloadStatus::default()));
        let st = status.clone();
        let (url, method) = (url.to_string(), method.to_string());
        thread::Builder::new()
            .name("reload-url".into())
            .spawn(move || {
                let call = || -> Result<(), String> {
                    let resp = agent.run(request.clone()).map_err(|e| e.to_string())?;
                    let code = resp.status().as_u16();
                    if (200..300).contains(&code) {
                        Ok(())
                    } else {
                        Err(format!(
                            "{code} {}",
                            resp.status().canonical_reason().unwrap_or("")
                        ))
                    }
                };
                caller(&rx, &st, call, &format!("{method} {url}"));
            })
            .map_err(|e| format!("--reload-url: cannot start its thread: {e}"))?;
        Ok(ReloadUrl { tx, status })
    }

    pub fn status(&self) -> Arc<Mutex<ReloadStatus>> {
        self.status.clone()
    }
}

/// The caller loop: one batch number at a time, the newest wins.
fn caller(
    rx: &Receiver<u64>,
    status: &Mutex<ReloadStatus>,
    call: impl Fn() -> Result<(), String>,
    what: &str,
) {
    let mut current: Option<u64> = None;
    let mut attempts = 0;
    // The wait before the pending retry, and the one after it.
    let (mut wait, mut next_wait) = (FIRST_RETRY, FIRST_RETRY);
    loop {
        let next = match current {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(_) => rx.recv_timeout(wait),
        };
        match next {
            Ok(n) => {
                current = Some(n);
                attempts = 0;
                next_wait = FIRST_RETRY;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(n) = rx.try_recv() {
            current = Some(n);
            attempts = 0;
            next_wait = FIRST_RETRY;
        }
        let Some(batch) = current else { continue };
        let result = call();
        attempts += 1;
        let mut st = status.lock().unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(()) => {
                st.successes += 1;
                log::debug!("{what}: reloaded (poll {batch})");
                current = None;
            }
            Err(e) => {
                st.failures += 1;
                if attempts >= ATTEMPTS {
                    log::warn!(
                        "{what} failed: {e}; giving up on poll {batch} after {attempts} attempts"
                    );
                    current = None;
                } else {
                    wait = next_wait;
                    next_wait = (next_wait * 2).min(MAX_RETRY);
                    log::warn!(
                        "{what} failed: {e}; retrying in {}",
                        humantime::format_duration(wait)
                    );
                }
            }
        }
        st.last = Some(result);
    }
}

impl Sink for ReloadUrl {
    fn name(&self) -> &'static str {
        "reload-url"
    }

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
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn failures_are_retried_and_a_newer_batch_replaces_the_retry() {
        let (tx, rx) = mpsc::channel();
        let status = Arc::new(Mutex::new(ReloadStatus::default()));
        let calls = Arc::new(AtomicU32::new(0));
        let (st, c) = (status.clone(), calls.clone());
        let t = thread::spawn(move || {
            caller(
                &rx,
                &st,
                || {
                    // Fails twice, then works.
                    if c.fetch_add(1, Ordering::SeqCst) < 2 {
                        Err("503 Service Unavailable".into())
                    } else {
                        Ok(())
                    }
                },
                "POST http://x",
            )
        });
        tx.send(1).unwrap();
        thread::sleep(Duration::from_millis(200));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(matches!(status.lock().unwrap().last, Some(Err(_))));
        // A newer batch does not wait for the retry.
        tx.send(2).unwrap();
        thread::sleep(Duration::from_millis(200));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        thread::sleep(Duration::from_millis(1200));
        let st = status.lock().unwrap().clone();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!((st.successes, st.failures), (1, 2));
        assert_eq!(st.last, Some(Ok(())));
        drop(tx);
        t.join().unwrap();
    }
}
