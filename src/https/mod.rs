//! HTTPS for what cmpoll serves to other programs (`cmpoll webhook` to the apiserver,
//! `cmpoll serve` to a fleet): `tls.rs` (the serving certificate, re-read when it changes;
//! clients' certificates checked against `--client-ca-file`), `http.rs` (HTTP/1.1
//! framing), `server.rs` (one thread holding every connection within its deadlines, a
//! pool of workers answering, long polls parked until notified).

pub mod http;
pub mod server;
pub mod tls;
