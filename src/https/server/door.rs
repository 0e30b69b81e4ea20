//! Where connections come in (`Door`): the listener, non-blocking with a long queue of
//! connections not yet accepted, and what a connection accepted is made into: a
//! non-blocking socket with a bounded send buffer, under TLS when the server has a
//! config (none: plain HTTP).

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;

use rustls::ServerConfig;

use crate::https::transport::{self, Io, Plain, Tls};

/// The listener and the TLS config.
pub(super) struct Door {
    listener: TcpListener,
    config: Option<Arc<ServerConfig>>,
}

impl Door {
    pub fn open(listener: TcpListener, config: Option<Arc<ServerConfig>>) -> io::Result<Door> {
        listener.set_nonblocking(true)?;
        // A longer queue of connections not yet accepted than std's 128 (the kernel caps
        // it at net.core.somaxconn): in a storm of new connections a SYN that finds it
        // full is dropped, and its client retries only a second later.
        let _ = rustix::net::listen(&listener, 4096);
        Ok(Door { listener, config })
    }

    /// The listener, to wait on.
    pub fn listener(&self) -> &TcpListener {
        &self.listener
    }

    /// Connections are under TLS.
    pub fn tls(&self) -> bool {
        self.config.is_some()
    }

    /// The next connection waiting.
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        self.listener.accept()
    }

    /// A connection accepted, made ready to serve.
    pub fn io(&self, sock: TcpStream) -> io::Result<Io> {
        sock.set_nonblocking(true)?;
        let _ = sock.set_nodelay(true);
        // What the kernel holds for a client that does not read: bounded (Linux doubles
        // it for its bookkeeping).
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&sock, transport::SEND_BUFFER);
        Ok(match &self.config {
            Some(config) => Io::Tls(Box::new(Tls::new(sock, config.clone())?)),
            None => Io::Plain(Plain::new(sock)),
        })
    }
}
