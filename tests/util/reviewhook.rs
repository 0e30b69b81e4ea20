//! A token and authorization webhook for a real apiserver (its
//! `--authentication-token-webhook-config-file` and `--authorization-webhook-config-file`),
//! whose behaviour a test switches: it refuses (a TokenReview not authenticated, a
//! SubjectAccessReview with no opinion), fails (closes each connection unanswered: the
//! apiserver's review then carries `…: EOF`), or hangs (holds each request unanswered).
//! What a hub sees through the apiserver when the cluster's own webhooks are down.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Refuse = 0,
    Fail = 1,
    Hang = 2,
}

/// The webhook: its address and its mode.
pub struct ReviewHook {
    pub port: u16,
    mode: Arc<AtomicU8>,
    /// Requests it was sent.
    pub asked: Arc<AtomicUsize>,
}

impl ReviewHook {
    pub fn start() -> ReviewHook {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(Mode::Refuse as u8));
        let asked = Arc::new(AtomicUsize::new(0));
        let (m, a) = (mode.clone(), asked.clone());
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                let (m, a) = (m.clone(), a.clone());
                std::thread::spawn(move || serve(s, &m, &a));
            }
        });
        ReviewHook { port, mode, asked }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// A kubeconfig naming the webhook at `path` (`/authn`, `/authz`), written in `dir`.
    pub fn kubeconfig(&self, dir: &Path, path: &str) -> PathBuf {
        let file = dir.join(format!("webhook{}.kubeconfig", path.replace('/', "-")));
        std::fs::write(
            &file,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: w\n  cluster:\n    server: http://127.0.0.1:{}{path}\nusers:\n- name: apiserver\n  user: {{}}\ncontexts:\n- name: w\n  context: {{cluster: w, user: apiserver}}\ncurrent-context: w\n",
                self.port
            ),
        )
        .unwrap();
        file
    }

    /// The kube-apiserver flags that use it for tokens and authorization (after RBAC).
    pub fn apiserver_flags(&self, dir: &Path) -> Vec<String> {
        vec![
            format!(
                "--authentication-token-webhook-config-file={}",
                self.kubeconfig(dir, "/authn").display()
            ),
            "--authentication-token-webhook-version=v1".into(),
            "--authorization-mode=RBAC,Webhook".into(),
            format!(
                "--authorization-webhook-config-file={}",
                self.kubeconfig(dir, "/authz").display()
            ),
            "--authorization-webhook-version=v1".into(),
            "--authorization-webhook-cache-unauthorized-ttl=1s".into(),
        ]
    }
}

fn mode(m: &AtomicU8) -> Mode {
    match m.load(Ordering::SeqCst) {
        1 => Mode::Fail,
        2 => Mode::Hang,
        _ => Mode::Refuse,
    }
}

/// One connection: each request read whole, then answered, dropped or held.
fn serve(mut s: TcpStream, m: &AtomicU8, asked: &AtomicUsize) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
    loop {
        let Some((path, body)) = read_request(&mut s) else {
            return;
        };
        asked.fetch_add(1, Ordering::SeqCst);
        match mode(m) {
            Mode::Fail => return,
            Mode::Hang => {
                let until = Instant::now() + Duration::from_secs(60);
                while mode(m) == Mode::Hang && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(50));
                }
                return;
            }
            Mode::Refuse => {}
        }
        let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let answer = if path.starts_with("/authn") {
            serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "status": {"authenticated": false}})
        } else {
            serde_json::json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "status": {"allowed": false}})
        };
        let _ = review;
        let body = answer.to_string();
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    }
}

/// A request's path and body (framed by Content-Length), or `None` at the end.
fn read_request(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let path = head.split_whitespace().nth(1)?.to_string();
    let length: usize = (head.lines())
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).ok()?;
    Some((path, body))
}
