//! HTTP for what cmpoll serves to other programs (`cmpoll webhook` to the apiserver,
//! `cmpoll serve` to a fleet, `--listen` to probes and scrapers): `tls.rs` (the serving
//! certificate, re-read when it changes; clients' certificates checked against
//! `--client-ca-file`), `http.rs` (HTTP/1.1 framing), `transport.rs` (TLS or plain bytes,
//! bounded), `handler.rs` (what a handler sees and replies), `conn.rs` (one connection's state
//! machine), `lanes.rs` (the workers, in lanes), `handshakes.rs` (the TLS handshakes'
//! workers), `server.rs` (one thread holding every connection with epoll; what each identity
//! holds, in bytes), `drain.rs` (the connections let go, spread, when it stops),
//! `endpoints.rs` (`--listen`: probes, metrics and `/status` in plain HTTP).

pub mod conn;
pub mod drain;
pub mod endpoints;
pub mod handler;
pub mod handshakes;
pub mod http;
pub mod lanes;
pub mod server;
pub mod tls;
pub mod transport;
