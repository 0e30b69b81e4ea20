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
        // Userinfo becomes basic auth here; ureq never sees it (it would not send it).
        let (bare, basic) = split_userinfo(url);
        let mut request = ureq::http::Request::builder().method(method).uri(&bare);
        if let Some(b) = &basic {
            request = request.header("Authorization", b.expose());
        }
        let request = request.body(()).map_err(|e| {
            format!(
                "--reload-url '{}': {e}",
                crate::kube::proxy::redact_url(url)
            )
        })?;
        let (tx, rx) = mpsc::channel();
        let status = Arc::new(Mutex::new(ReloadStatus::default()));
        let st = status.clone();
        let shown = crate::kube::proxy::redact_url(url);
        let secret_parts = secret_parts(url);
        let method = method.to_string();
        thread::Builder::new()
            .name("reload-url".into())
            .spawn(move || {
                let call = || -> Result<(), String> {
                    let resp = agent
                        .run(request.clone())
                        .map_err(|e| scrub(&e.to_string(), &secret_parts))?;
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
                caller(&rx, &st, call, &format!("{method} {shown}"));
            })
            .map_err(|e| format!("--reload-url: cannot start its thread: {e}"))?;
        Ok(ReloadUrl { tx, status })
    }

    pub fn status(&self) -> Arc<Mutex<ReloadStatus>> {
        self.status.clone()
    }
}

/// The URL without its userinfo, and the userinfo as a basic-auth header value (both
/// halves percent-decoded, as browsers and curl read them).
fn split_userinfo(url: &str) -> (String, Option<crate::secret::Secret>) {
    use base64::Engine as _;
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return (url.to_string(), None);
    };
    let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let raw = format!("{}:{}", percent_decode(user), percent_decode(pass));
    let header = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    );
    (
        format!("{scheme}://{host}{tail}"),
        Some(crate::secret::Secret::new(header)),
    )
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let hex = |c: u8| char::from(c).to_digit(16);
    while i < b.len() {
        if b[i] == b'%'
            && i + 3 <= b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The parts of a URL that must never reach a log line: its userinfo and query string.
fn secret_parts(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let mut parts = Vec::new();
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        parts.extend(userinfo.split(':').map(str::to_string));
        parts.push(userinfo.to_string());
    }
    if let Some((_, q)) = rest.split_once('?') {
        parts.push(q.split('#').next().unwrap_or("").to_string());
    }
    parts.retain(|p| !p.is_empty());
    // Longest first, so a whole userinfo goes before its halves.
    parts.sort_by_key(|p| std::cmp::Reverse(p.len()));
    parts
}

/// An error text with every secret part of the URL replaced.
fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets {
        out = out.replace(s.as_str(), "[REDACTED]");
    }
    out
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

    #[test]
    fn userinfo_becomes_basic_auth_and_never_shows() {
        let (bare, auth) = split_userinfo("http://admin:s%40cret@h:9/-/reload?x=1");
        assert_eq!(bare, "http://h:9/-/reload?x=1");
        // printf 'admin:s@cret' | base64
        assert_eq!(auth.unwrap().expose(), "Basic YWRtaW46c0BjcmV0");
        assert_eq!(split_userinfo("http://h/a@b").1, None);
        let parts = secret_parts("http://admin:secret@h/p?token=t0k");
        let scrubbed = scrub("POST http://admin:secret@h/p?token=t0k: refused", &parts);
        assert!(
            !scrubbed.contains("secret") && !scrubbed.contains("t0k"),
            "{scrubbed}"
        );
    }
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
