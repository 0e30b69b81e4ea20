//! The server's loop over real sockets (plain HTTP): a handler that panics never costs a
//! worker, one identity never holds more than its bound, and a full server makes room
//! for a newcomer at the cost of the identity that holds the most.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicUsize;

use super::*;
use crate::https::http::{Answer, Request};
use crate::ops::metrics::ServerCounts;

/// `/panic` panics; `/wait?h=N` waits 30 s as holder N (a 304 when its time is up or it
/// must give way); `/big?h=N` is a 1 MB answer written for holder N, `/mine?h=N` a short
/// one; anything else is 200.
struct Test {
    asked: AtomicUsize,
}

impl Handler for Test {
    fn handle(&self, req: &Request, _peer: &Peer, call: Call) -> Reply {
        self.asked.fetch_add(1, Ordering::SeqCst);
        match req.path.as_str() {
            "/panic" => panic!("a handler's bug"),
            "/wait" if call.wake == Wake::Expired => Reply::Answer(Answer::text(304, "")),
            "/wait" => Reply::Wait {
                until: Instant::now() + Duration::from_secs(30),
                holder: holder(req),
            },
            // A list rendered for this request alone, written for its holder.
            "/big" => Reply::Held {
                answer: Answer::json(200, vec![b'x'; BIG]),
                holder: holder(req),
            },
            "/mine" => Reply::Held {
                answer: Answer::text(200, "ok\n"),
                holder: holder(req),
            },
            _ => Reply::Answer(Answer::text(200, "ok\n")),
        }
    }
}

/// `/big`'s body.
const BIG: usize = 1_000_000;

/// The holder a request names (`?h=N`).
fn holder(req: &Request) -> Holder {
    Holder(req.query.trim_start_matches("h=").parse().unwrap_or(0))
}

fn serve(limits: Limits) -> (SocketAddr, Handle, ServerCounts) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let counts = limits.counts.clone();
    let handler = Arc::new(Test {
        asked: AtomicUsize::new(0),
    });
    let (server, handle) = Server::new(listener, None, handler, limits).unwrap();
    let addr = server.local_addr().unwrap();
    std::thread::spawn(move || server.run(&AtomicBool::new(false)));
    (addr, handle, counts)
}

/// Sends a request on a new connection; the connection.
fn ask(addr: SocketAddr, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    s
}

/// The status code of the next answer on `s` (0: none, or closed).
fn status(s: &mut TcpStream) -> u16 {
    let mut head = [0u8; 12];
    match s.read_exact(&mut head) {
        Ok(()) => std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap(),
        Err(_) => 0,
    }
}

#[test]
fn a_handler_that_panics_costs_its_request_a_500_never_a_worker() {
    let limits = Limits {
        lanes: Limits::one_lane(1, 16, Answer::text(503, "busy\n")),
        ..Limits::default()
    };
    let (addr, _handle, counts) = serve(limits);
    for _ in 0..20 {
        assert_eq!(status(&mut ask(addr, "/panic")), 500);
        assert_eq!(status(&mut ask(addr, "/fine")), 200);
    }
    assert_eq!(counts.panics(), 20);
}

#[test]
fn one_identity_holds_no_more_than_its_bound() {
    let limits = Limits {
        max_held: 3,
        ..Limits::default()
    };
    let (addr, _handle, counts) = serve(limits);
    let mut first: Vec<TcpStream> = (0..3).map(|_| ask(addr, "/wait?h=1")).collect();
    let other = ask(addr, "/wait?h=2");
    std::thread::sleep(Duration::from_millis(300));
    // A fourth of holder 1: its oldest is answered now, and closed.
    let mut fourth = ask(addr, "/wait?h=1");
    assert_eq!(status(&mut first[0]), 304);
    let mut rest = Vec::new();
    assert!(
        first[0].read_to_end(&mut rest).is_ok(),
        "closed after its answer"
    );
    assert_eq!(counts.turned_away_for("held"), 1);
    // The others still wait.
    for s in first[1..].iter_mut().chain([&mut fourth]) {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert_eq!(status(s), 0, "still parked");
    }
    drop(other);
}

/// `ask`, closing after the answer.
fn ask_once(addr: SocketAddr, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    s
}

#[test]
fn a_full_server_makes_room_at_the_cost_of_who_holds_the_most() {
    let limits = Limits {
        max_connections: 6,
        ..Limits::default()
    };
    let (addr, _handle, counts) = serve(limits);
    // An idle keep-alive connection, then holder 1 parks four requests and holder 2 one.
    let mut idle = ask(addr, "/fine");
    assert_eq!(status(&mut idle), 200);
    let mut hog: Vec<TcpStream> = (0..4).map(|_| ask(addr, "/wait?h=1")).collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut modest = ask(addr, "/wait?h=2");
    std::thread::sleep(Duration::from_millis(300));
    // Full: a newcomer takes the idle one's place first.
    let mut newcomer = ask_once(addr, "/fine");
    assert_eq!(status(&mut newcomer), 200);
    let mut rest = Vec::new();
    assert!(idle.read_to_end(&mut rest).is_ok(), "the idle one closed");
    assert!(
        !String::from_utf8_lossy(&rest).contains("HTTP/1.1"),
        "no second answer"
    );
    // Full again, nothing idle (the newcomer closed, a third holder parks): the next takes
    // the place of holder 1's oldest request, answered now; the others keep theirs.
    let mut third = ask(addr, "/wait?h=3");
    std::thread::sleep(Duration::from_millis(200));
    let mut next = ask_once(addr, "/fine");
    assert_eq!(status(&mut next), 200);
    assert_eq!(status(&mut hog[0]), 304);
    for s in hog[1..].iter_mut().chain([&mut modest, &mut third]) {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert_eq!(status(s), 0, "still parked");
    }
    assert_eq!(counts.turned_away_for("evicted"), 2);
}

/// A connection whose receive buffer is 4 KiB (set before it connects, so that the kernel
/// never grows it): a client that does not read holds next to nothing of what the server
/// writes it.
fn narrow(addr: SocketAddr) -> TcpStream {
    use rustix::net::{AddressFamily, SocketType, connect, socket, sockopt};
    let fd = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    sockopt::set_socket_recv_buffer_size(&fd, 4096).unwrap();
    connect(&fd, &addr).unwrap();
    let s = TcpStream::from(fd);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Whether the server closed `s` (`false`: it is open, nothing more came for 300 ms). What
/// the server had queued before it closed may still be on its way: it is read first.
fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// Issue 56.4: one identity's connections that never read their answers hold a bounded
/// number of bytes: each answer of 1 MB is written for holder 1, and past 3.5 MB beyond
/// its largest the oldest are cut off; the newest four stay, and another identity's
/// answer goes out whole meanwhile. (Before, writing connections counted toward no one:
/// twenty of them held 20 MB.)
#[test]
fn one_identity_pins_a_bounded_number_of_bytes() {
    let limits = Limits {
        max_pinned: 3_500_000,
        ..Limits::default()
    };
    let (addr, _handle, counts) = serve(limits);
    let mut hog: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = narrow(addr);
            write!(s, "GET /big?h=1 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            // One at a time: each answer is written (and counted) before the next.
            std::thread::sleep(Duration::from_millis(20));
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut other = ask_once(addr, "/big?h=2");
    let mut whole = Vec::new();
    other.read_to_end(&mut whole).ok();
    assert!(
        whole.len() > BIG,
        "the other identity's answer: {} bytes",
        whole.len()
    );
    let cut: Vec<bool> = hog.iter_mut().map(closed).collect();
    assert_eq!(cut.iter().filter(|c| **c).count(), 16, "cut off: {cut:?}");
    // The oldest first (a server that lags may take requests 20 ms apart together, in any
    // order: only the first half is sure to be older than the four that stay).
    assert!(cut[..10].iter().all(|c| *c), "the oldest first: {cut:?}");
    assert_eq!(counts.turned_away_for("memory"), 16);
}

/// Issue 56.4: connections no identity holds (here: each stalled halfway through a 12 KiB
/// head) hold a bounded number of bytes together: past the bound the oldest of them is
/// let go, never a connection an identity holds (an idle keep-alive one), and a newcomer
/// is answered.
#[test]
fn token_less_connections_hold_a_bounded_number_of_bytes_together() {
    use crate::https::conn::CONN_COST;
    let limits = Limits {
        max_loose: 20 * CONN_COST,
        ..Limits::default()
    };
    let (addr, _handle, counts) = serve(limits);
    let mut owned = ask(addr, "/mine?h=5");
    assert_eq!(status(&mut owned), 200);
    let mut rest = [0u8; 21];
    owned.read_exact(&mut rest).unwrap();
    let half = format!("GET /x HTTP/1.1\r\nX-Pad: {}", "p".repeat(12_000));
    let mut stalled: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(half.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(10));
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let gone: Vec<bool> = stalled.iter_mut().map(closed).collect();
    let open = gone.iter().filter(|g| !**g).count();
    // Each holds its state and 12 KiB of head (in a buffer of 16): fewer than 20 stay.
    assert!((5..20).contains(&open), "{open} open: {gone:?}");
    assert!(
        gone[..40 - open].iter().all(|g| *g),
        "the oldest first: {gone:?}"
    );
    assert_eq!(counts.turned_away_for("memory"), (40 - open) as u64);
    assert!(!closed(&mut owned), "an identity's idle connection stays");
    let mut newcomer = ask_once(addr, "/fine");
    assert_eq!(status(&mut newcomer), 200);
}
