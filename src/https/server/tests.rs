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
/// must give way); anything else is 200.
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
                holder: Holder(req.query.trim_start_matches("h=").parse().unwrap_or(0)),
            },
            _ => Reply::Answer(Answer::text(200, "ok\n")),
        }
    }
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
