//! Who gets in: the server accepts waiting connections a bounded number a round, makes
//! room when every place is taken (the least valuable connection: `Shares::room`), and
//! admits a connection (non-blocking, a bounded send buffer, TLS when configured,
//! registered once with epoll).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use rustix::event::epoll::{self, EventData, EventFlags};

use super::{Entry, MAX_LEAVING, Server, key_of};
use crate::https::conn::{Conn, Evict};
use crate::https::transport::{self, Io, Plain, Tls};

impl Server {
    /// Accepts waiting connections (a bounded number a round, so that a storm of new ones
    /// does not hold up the others).
    pub(super) fn accept_all(&mut self) {
        for _ in 0..512 {
            let (sock, addr) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock: all taken. Anything else (EMFILE…): again at the next wake.
                Err(_) => return,
            };
            let now = Instant::now();
            if self.open >= self.limits.max_connections && !self.make_room(now) {
                log::debug!("https: every connection is busy: closing {addr}'s");
                self.limits.counts.turned_away("connections");
                continue;
            }
            match self.admit(sock, addr, now) {
                Ok(()) => self.limits.counts.accepted(),
                Err(e) => log::debug!("https: {addr}: {e}"),
            }
        }
    }

    /// Frees a place: the least valuable connection (`Shares::room`). `false` when nothing
    /// can go.
    pub(super) fn make_room(&mut self, now: Instant) -> bool {
        if self.leaving >= MAX_LEAVING {
            return false;
        }
        let Some(key) = self.shares.room() else {
            return false;
        };
        log::debug!("https: {} connections: one gives way", self.open);
        self.limits.counts.turned_away("evicted");
        self.evict(key, now, Evict::Now);
        // It leaves once answered: the newcomer may come in meanwhile (within
        // `FILES_KEPT`).
        true
    }

    fn admit(&mut self, sock: TcpStream, addr: SocketAddr, now: Instant) -> io::Result<()> {
        sock.set_nonblocking(true)?;
        let _ = sock.set_nodelay(true);
        // What the kernel holds for a client that does not read: bounded (Linux doubles
        // it for its bookkeeping).
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&sock, transport::SEND_BUFFER);
        let io = match &self.config {
            Some(config) => Io::Tls(Box::new(Tls::new(sock, config.clone())?)),
            None => Io::Plain(Plain::new(sock)),
        };
        let i = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.epochs.push(0);
            self.slots.len() - 1
        });
        self.epochs[i] = self.epochs[i].wrapping_add(1);
        let epoch = self.epochs[i];
        let key = key_of(i, epoch);
        epoll::add(
            &self.epoll,
            io.sock(),
            EventData::new_u64(key),
            EventFlags::IN | EventFlags::OUT | EventFlags::RDHUP | EventFlags::ET,
        )?;
        self.slots[i] = Some(Entry {
            epoch,
            conn: Conn::new(io, now, &self.bounds),
            addr,
            armed: None,
            counted: None,
            looked: false,
            leaving: false,
        });
        self.open += 1;
        if let Some(d) = &mut self.draining {
            d.schedule(key, now);
        }
        self.settle(key, now);
        Ok(())
    }
}
