//! sd_notify: tell systemd (`Type=notify`) where cmpoll is. `READY=1` after the first batch,
//! `WATCHDOG=1` from the loop at half of `WATCHDOG_USEC`, `STATUS=` with the module count
//! and last error, `STOPPING=1` on shutdown. Without `NOTIFY_SOCKET` everything is a no-op.
//! A datagram to a path or an abstract (`@…`) socket: a few lines, no crate needed.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// From `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` as `env` shows them.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Notifier {
        let target = env("NOTIFY_SOCKET")
            .filter(|s| !s.is_empty())
            .and_then(|path| {
                let addr = match path.strip_prefix('@') {
                    Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
                    None => SocketAddr::from_pathname(&path),
                };
                match (UnixDatagram::unbound(), addr) {
                    (Ok(sock), Ok(addr)) => Some((sock, addr)),
                    (Err(e), _) | (_, Err(e)) => {
                        log::warn!("NOTIFY_SOCKET '{path}': {e}; not notifying systemd");
                        None
                    }
                }
            });
        let for_us = env("WATCHDOG_PID")
            .is_none_or(|p| p.trim().parse::<u32>().ok() == Some(std::process::id()));
        let watchdog = env("WATCHDOG_USEC")
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|u| *u > 0 && for_us)
            .map(|u| Duration::from_micros(u) / 2);
        Notifier { target, watchdog }
    }

    /// How often to send `WATCHDOG=1` (half of `WATCHDOG_USEC`), if systemd asks for it.
    pub fn watchdog_every(&self) -> Option<Duration> {
        self.target.as_ref().and(self.watchdog)
    }

    pub fn send(&self, message: &str) {
        if let Some((sock, addr)) = &self.target
            && let Err(e) = sock.send_to_addr(message.as_bytes(), addr)
        {
            log::debug!("sd_notify: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_socket_and_halves_the_watchdog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let p = path.to_str().unwrap().to_string();
        let env = move |k: &str| match k {
            "NOTIFY_SOCKET" => Some(p.clone()),
            "WATCHDOG_USEC" => Some("2000000".into()),
            _ => None,
        };
        let n = Notifier::from_env(&env);
        assert_eq!(n.watchdog_every(), Some(Duration::from_secs(1)));
        n.send("READY=1\nSTATUS=3 modules");
        let mut buf = [0u8; 64];
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=3 modules");
    }

    #[test]
    fn without_a_socket_nothing_happens_and_a_foreign_watchdog_is_ignored() {
        let n = Notifier::from_env(&|_| None);
        assert_eq!(n.watchdog_every(), None);
        n.send("READY=1");
        let env = |k: &str| match k {
            "NOTIFY_SOCKET" => Some("@cmpoll-test-none".into()),
            "WATCHDOG_USEC" => Some("1000000".into()),
            "WATCHDOG_PID" => Some("1".into()),
            _ => None,
        };
        assert_eq!(
            Notifier::from_env(&env).watchdog_every(),
            None,
            "another process's watchdog"
        );
    }
}
