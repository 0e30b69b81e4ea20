//! TLS handshakes off the server's thread. What a handshake costs is its crypto (the
//! server's signature, a key exchange: an RSA-2048 signature takes a millisecond, so a
//! thousand ClientHellos a second would fill one thread), and the server's thread must stay
//! free to answer the clients it already has. So that thread only reads and writes a
//! handshake's bytes, and a few workers of their own work out what the bytes say
//! (`ServerConnection::process_new_packets`), at a lower priority than the server's thread
//! (`nice` 10: when the CPU is short, the loop comes first).
//!
//! Handshake steps wait in a bounded queue, fair between client addresses: each address
//! has its own line, and the workers take one step from each line in turn, so that a
//! flood from a few addresses waits behind itself, and a client from elsewhere (the
//! kubelet's probe from its node, a follower from its pod) waits for at most one step of
//! each other address. When the queue is full, the address with the most steps waiting
//! gives up its newest (the newcomer itself, when its address has the most): that
//! connection is closed at once, cheaply (nothing was worked out for it). A step that
//! waited past its connection's deadline is not worked out.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use rustls::ServerConnection;

use super::lanes::Results;
use crate::locks::Recover;

/// How many handshake workers, and the steps that may wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub workers: usize,
    pub queue: usize,
}

/// A handshake step for a worker.
pub struct Step {
    /// The connection's key in the server's table.
    pub key: u64,
    /// The client's address: its line in the queue.
    pub from: IpAddr,
    pub tls: ServerConnection,
    /// Not worked out after this (the connection's deadline).
    pub until: Instant,
}

/// A step worked out.
pub struct Stepped {
    pub key: u64,
    pub tls: ServerConnection,
    /// What processing the bytes said: an error has its alert queued in `tls`; `None`: not
    /// processed (it waited past its deadline).
    pub result: Option<Result<(), rustls::Error>>,
}

/// The workers and their queue.
pub struct Handshakes {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Fair>,
    ready: Condvar,
    done: Mutex<Vec<Stepped>>,
    /// Wakes the server's loop.
    results: Arc<Results>,
    stop: AtomicBool,
}

impl Handshakes {
    /// Starts `sizes.workers` workers; what they did wakes the loop through `results`.
    pub fn start(sizes: Sizes, results: Arc<Results>) -> io::Result<Handshakes> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Fair::new(sizes.queue.max(1))),
            ready: Condvar::new(),
            done: Mutex::new(Vec::new()),
            results,
            stop: AtomicBool::new(false),
        });
        for n in 0..sizes.workers.max(1) {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("https-handshake-{n}"))
                .spawn(move || work(&shared))?;
        }
        Ok(Handshakes { shared })
    }

    /// Queues `step`; the step given up to make room, if any (`step` itself when its
    /// address has the most waiting): its connection is to be closed.
    pub fn give(&self, step: Step) -> Option<Step> {
        let dropped = lock(&self.shared.queue).push(step);
        self.shared.ready.notify_one();
        dropped
    }

    /// The steps worked out since the last take.
    pub fn take(&self) -> Vec<Stepped> {
        std::mem::take(&mut *lock(&self.shared.done))
    }
}

impl Drop for Handshakes {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.ready.notify_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().recover()
}

/// A worker: one step at a time, at a lower priority than the loop.
fn work(shared: &Shared) {
    // On Linux a thread's nice value is its own (setpriority(2), NOTES).
    if let Err(e) = rustix::process::setpriority_process(None, 10) {
        log::debug!("https: a handshake worker keeps its priority: {e}");
    }
    loop {
        let step = {
            let mut q = lock(&shared.queue);
            loop {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(s) = q.pop() {
                    break s;
                }
                q = (shared.ready.wait(q)).recover();
            }
        };
        let Step {
            key,
            mut tls,
            until,
            ..
        } = step;
        let result = (Instant::now() < until).then(|| tls.process_new_packets().map(|_| ()));
        lock(&shared.done).push(Stepped { key, tls, result });
        shared.results.poke();
    }
}

/// Steps waiting, a line per address, taken from each line in turn.
struct Fair {
    lines: HashMap<IpAddr, VecDeque<Step>>,
    /// Addresses with steps waiting, in the order they are served.
    turns: VecDeque<IpAddr>,
    len: usize,
    cap: usize,
}

impl Fair {
    fn new(cap: usize) -> Fair {
        Fair {
            lines: HashMap::new(),
            turns: VecDeque::new(),
            len: 0,
            cap,
        }
    }

    /// Queues `step`; full, the longest line gives up its newest (`step` itself when its
    /// line would be the longest).
    fn push(&mut self, step: Step) -> Option<Step> {
        let mut dropped = None;
        if self.len >= self.cap {
            let mine = self.lines.get(&step.from).map_or(0, VecDeque::len);
            let longest = (self.lines.iter())
                .map(|(ip, line)| (line.len(), *ip))
                .max();
            match longest {
                Some((n, ip)) if n > mine => {
                    dropped = self.lines.get_mut(&ip).and_then(VecDeque::pop_back);
                    self.len -= 1;
                    if self.lines.get(&ip).is_some_and(VecDeque::is_empty) {
                        self.lines.remove(&ip);
                        self.turns.retain(|t| *t != ip);
                    }
                }
                _ => return Some(step),
            }
        }
        let line = self.lines.entry(step.from).or_default();
        if line.is_empty() {
            self.turns.push_back(step.from);
        }
        line.push_back(step);
        self.len += 1;
        dropped
    }

    /// The next step: the front of the next line in turn.
    fn pop(&mut self) -> Option<Step> {
        let ip = self.turns.pop_front()?;
        let line = self.lines.get_mut(&ip)?;
        let step = line.pop_front();
        if line.is_empty() {
            self.lines.remove(&ip);
        } else {
            self.turns.push_back(ip);
        }
        self.len -= usize::from(step.is_some());
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Arc<rustls::ServerConfig> {
        let c = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(c.signing_key.serialize_der()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![c.cert.der().clone()], key)
                .unwrap(),
        )
    }

    fn step(config: &Arc<rustls::ServerConfig>, key: u64, from: [u8; 4]) -> Step {
        Step {
            key,
            from: IpAddr::from(from),
            tls: ServerConnection::new(config.clone()).unwrap(),
            until: Instant::now() + std::time::Duration::from_secs(10),
        }
    }

    /// A flood from one address waits behind itself: another address's step is taken
    /// second, and when the queue is full the flood gives up its newest, never the
    /// other's, and a newcomer from the flood is the one given up.
    #[test]
    fn a_flood_from_one_address_waits_behind_itself() {
        let config = config();
        let mut q = Fair::new(4);
        for k in 0..3 {
            assert!(q.push(step(&config, k, [10, 0, 0, 1])).is_none());
        }
        assert!(q.push(step(&config, 100, [10, 0, 0, 2])).is_none());
        // Full: a newcomer from elsewhere takes the flood's newest place.
        let dropped = q.push(step(&config, 200, [10, 0, 0, 3])).unwrap();
        assert_eq!(dropped.key, 2);
        // Full: the flood's own newcomer is given up itself.
        assert_eq!(q.push(step(&config, 3, [10, 0, 0, 1])).unwrap().key, 3);
        let order: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|s| s.key).collect();
        assert_eq!(order, [0, 100, 200, 1]);
        assert_eq!(q.len, 0);
        assert!(q.lines.is_empty() && q.turns.is_empty());
    }

    /// A worker works out a ClientHello off the caller's thread (the server's flight is
    /// in the state it gives back), and a step past its deadline is not worked out.
    #[test]
    fn a_worker_works_out_a_step_and_skips_a_late_one() {
        let config = config();
        let wake = rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap();
        let results = Arc::new(Results::new(wake));
        let pool = Handshakes::start(
            Sizes {
                workers: 1,
                queue: 8,
            },
            results,
        )
        .unwrap();
        // A real ClientHello, from a rustls client.
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("x").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_config), name).unwrap();
        let mut hello = Vec::new();
        client.write_tls(&mut hello).unwrap();
        let mut s = step(&config, 1, [127, 0, 0, 1]);
        s.tls.read_tls(&mut hello.as_slice()).unwrap();
        assert!(pool.give(s).is_none());
        let mut late = step(&config, 2, [127, 0, 0, 1]);
        late.until = Instant::now();
        assert!(pool.give(late).is_none());
        let mut got = Vec::new();
        let t = Instant::now();
        while got.len() < 2 && t.elapsed() < std::time::Duration::from_secs(10) {
            got.extend(pool.take());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        got.sort_by_key(|s| s.key);
        assert!(matches!(got[0].result, Some(Ok(()))));
        assert!(got[0].tls.wants_write(), "the server's flight is ready");
        assert!(got[1].result.is_none(), "late: not worked out");
    }
}
