//! The connection's state machine over a fake transport: every phase, its deadline, and
//! what a client that does not read costs.

use std::sync::{Arc, Mutex};

use super::inbox::{KEPT_ROOM, MAX_DROPPED};
use super::*;
use crate::https::handler::Pull;
use crate::https::http::Budget;
use crate::https::transport::fake::Fake;

fn bounds() -> Bounds {
    Bounds {
        request_deadline: Duration::from_secs(5),
        idle: Duration::from_secs(90),
        write_deadline: Duration::from_secs(10),
        max_head: http::MAX_HEAD,
        max_body: 1024,
        keep_alive: true,
        bodies: Bodies::All,
        budget: Budget::new(4096),
    }
}

fn conn(now: Instant) -> Conn<Fake> {
    Conn::new(Fake::default(), now, &bounds())
}

fn send(c: &mut Conn<Fake>, bytes: &[u8], now: Instant) -> Option<Dispatch> {
    c.io.incoming.extend_from_slice(bytes);
    c.ready(now, &bounds())
}

fn out(c: &mut Conn<Fake>) -> String {
    String::from_utf8(std::mem::take(&mut c.io.sent)).unwrap()
}

fn ok(body: &str) -> Reply {
    Reply::Answer(Answer::text(200, body))
}

/// A HEAD's answer is its head, the body's length said and the body not sent: the next
/// answer on the connection is the next request's.
#[test]
fn a_head_is_answered_with_the_head_alone() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    let d = send(
        &mut c,
        b"HEAD /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
        t,
    )
    .unwrap();
    let d = c.reply(d, ok("abc\n"), t, &b).unwrap();
    let wire = out(&mut c);
    assert!(
        wire.starts_with("HTTP/1.1 200 OK\r\n") && wire.contains("Content-Length: 4\r\n"),
        "{wire}"
    );
    assert!(wire.ends_with("\r\n\r\n"), "no body: {wire:?}");
    assert!(c.reply(d, ok("b\n"), t, &b).is_none());
    let wire = out(&mut c);
    assert!(
        wire.starts_with("HTTP/1.1 200 OK\r\n") && wire.ends_with("\r\n\r\nb\n"),
        "{wire:?}"
    );
}

#[test]
fn a_request_in_pieces_then_a_pipelined_one_on_a_kept_connection() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    assert!(send(&mut c, b"GET /a HT", t).is_none());
    assert_eq!(c.kind(), Kind::Reading);
    let d = send(&mut c, b"TP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n", t).unwrap();
    assert_eq!(
        (d.req.path.as_str(), d.wake, d.lane),
        ("/a", Wake::First, 0)
    );
    assert_eq!(c.kind(), Kind::Working);
    assert_eq!(c.deadline(), None, "a worker has it");
    // The answer goes out, and the pipelined request comes next.
    let d = c.reply(d, ok("a\n"), t, &b).unwrap();
    assert_eq!(d.req.path, "/b");
    let wire = out(&mut c);
    assert!(wire.starts_with("HTTP/1.1 200 OK\r\n"), "{wire}");
    assert!(wire.contains("Connection: keep-alive\r\n") && wire.ends_with("\r\n\r\na\n"));
    assert!(c.reply(d, ok("b\n"), t, &b).is_none());
    assert!(out(&mut c).ends_with("b\n"));
    // Idle: its deadline is the keep-alive's.
    assert_eq!(c.kind(), Kind::Reading);
    assert_eq!(c.deadline(), Some(t + b.idle));
    assert!(c.tick(t + b.idle, &b).is_none());
    assert!(c.done());
}

#[test]
fn a_request_that_dribbles_is_cut_off_with_408_and_a_bad_one_with_its_code() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    let later = t + Duration::from_secs(100);
    // Idle keep-alive first: the deadline runs from the request's first byte.
    c.phase = Phase::Reading { started: false };
    assert!(send(&mut c, b"GET /slow", later).is_none());
    assert_eq!(c.deadline(), Some(later + b.request_deadline));
    c.tick(later + b.request_deadline, &b);
    assert!(out(&mut c).starts_with("HTTP/1.1 408 "));
    assert!(c.done());
    let mut c = conn(t);
    assert!(
        send(
            &mut c,
            b"GET / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 9\r\n\r\n",
            t
        )
        .is_none()
    );
    let wire = out(&mut c);
    assert!(
        wire.starts_with("HTTP/1.1 400 ") && wire.contains("Connection: close"),
        "{wire}"
    );
    // Closing: what may follow a bad head is dropped a moment, so that its answer is read.
    assert!(c.io.said_goodbye && c.io.shut && !c.done());
    c.tick(t + LINGER, &b);
    assert!(c.done());
}

#[test]
fn without_keep_alive_every_answer_closes() {
    let t = Instant::now();
    let b = Bounds {
        keep_alive: false,
        ..bounds()
    };
    let mut c = Conn::new(Fake::default(), t, &b);
    c.io.incoming.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
    let d = c.ready(t, &b).unwrap();
    c.reply(d, ok("x"), t, &b);
    assert!(out(&mut c).contains("Connection: close\r\n"));
    assert!(c.done());
}

#[test]
fn a_slow_reader_holds_what_the_wire_took_and_is_cut_off_at_its_write_deadline() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    let d = send(&mut c, b"GET / HTTP/1.1\r\n\r\n", t).unwrap();
    c.io.room = Some(100);
    let big = Answer::json(200, vec![b'x'; 100_000]);
    c.reply(d, Reply::Answer(big), t, &b);
    assert_eq!(c.io.sent.len(), 100);
    assert_eq!(c.kind(), Kind::Writing);
    assert_eq!(c.deadline(), Some(t + b.write_deadline));
    // It reads a little: more goes, the deadline stays.
    c.io.room = Some(1000);
    c.ready(t + Duration::from_secs(1), &b);
    assert_eq!(c.io.sent.len(), 1100);
    c.tick(t + b.write_deadline, &b);
    assert!(c.done());
}

/// A transport with a buffer of its own (rustls's) that is full takes nothing until it is
/// flushed; once it is, the rest must go too, though the socket never stopped being
/// writable (no writable edge will come). Found by the fleet simulator: lists of 1 MB
/// stopped at 64 KiB.
#[test]
fn an_answer_larger_than_the_transports_buffer_goes_out_whole() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    c.io.buffer = Some(64 * 1024);
    let d = send(&mut c, b"GET / HTTP/1.1\r\n\r\n", t).unwrap();
    // The wire is full when the answer comes: the transport's buffer fills.
    c.io.room = Some(0);
    let big = Answer::json(200, vec![b'x'; 1 << 20]);
    c.reply(d, Reply::Answer(big), t, &b);
    assert!(c.io.sent.is_empty());
    // The wire drains (a writable edge): everything goes, not one buffer's worth.
    c.io.room = None;
    c.ready(t, &b);
    assert!(c.io.sent.len() > 1 << 20, "{} bytes out", c.io.sent.len());
    assert_eq!(c.kind(), Kind::Reading, "written, idle");
}

#[test]
fn a_parked_request_is_asked_again_when_notified_and_at_its_first_deadline() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    let d = send(&mut c, b"GET /wait HTTP/1.1\r\n\r\n", t).unwrap();
    let until = t + Duration::from_secs(30);
    let wait = || Reply::Wait {
        until,
        holder: Holder(7),
    };
    assert!(c.reply(d, wait(), t, &b).is_none());
    assert_eq!(c.kind(), Kind::Held(Holder(7), t));
    assert_eq!(c.deadline(), Some(until));
    let t1 = t + Duration::from_secs(3);
    let d = c.notify(t1, &b).unwrap();
    assert_eq!(d.wake, Wake::Notified);
    assert_eq!(d.parked, Some(Parked { at: t, until }));
    // Asked to wait longer, it keeps its first deadline and its first moment.
    let longer = Reply::Wait {
        until: until + Duration::from_secs(60),
        holder: Holder(7),
    };
    c.reply(d, longer, t1, &b);
    assert_eq!(c.kind(), Kind::Held(Holder(7), t));
    assert_eq!(c.deadline(), Some(until));
    let d = c.tick(until, &b).unwrap();
    assert_eq!(d.wake, Wake::Expired);
    // A handler that would still wait is answered for.
    c.reply(d, wait(), until, &b);
    assert!(out(&mut c).starts_with("HTTP/1.1 503 "));
    assert_eq!(c.kind(), Kind::Reading);
}

#[test]
fn a_parked_request_made_to_give_way_is_answered_then_closed() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    let d = send(&mut c, b"GET /wait HTTP/1.1\r\n\r\n", t).unwrap();
    let wait = Reply::Wait {
        until: t + Duration::from_secs(30),
        holder: Holder(1),
    };
    c.reply(d, wait, t, &b);
    let d = c.evict(t, &b, Evict::Now).unwrap();
    assert_eq!(d.wake, Wake::Expired);
    let not_modified = Reply::Answer(Answer::text(304, ""));
    c.reply(d, not_modified, t, &b);
    let wire = out(&mut c);
    assert!(
        wire.starts_with("HTTP/1.1 304 ") && wire.contains("Connection: close"),
        "{wire}"
    );
    assert!(c.done() && c.io.said_goodbye);
    // A client that goes away while parked is dropped.
    let mut c = conn(t);
    let d = send(&mut c, b"GET /wait HTTP/1.1\r\n\r\n", t).unwrap();
    let wait = Reply::Wait {
        until: t + Duration::from_secs(30),
        holder: Holder(1),
    };
    c.reply(d, wait, t, &b);
    c.io.closed = true;
    c.ready(t, &b);
    assert!(c.done());
}

/// Hands out `events` one at a time (each `size` bytes), asked again on each notify.
struct Events {
    left: Vec<Body>,
    pulls: Arc<Mutex<usize>>,
    end: bool,
}

impl Stream for Events {
    fn pull(&mut self, now: Instant, room: usize) -> Pull {
        *self.pulls.lock().unwrap() += 1;
        let mut chunks = Vec::new();
        let mut size = 0;
        while size < room && !self.left.is_empty() {
            let c = self.left.remove(0);
            size += c.len();
            chunks.push(c);
        }
        let next = if self.end && self.left.is_empty() {
            Next::End
        } else {
            // Asked again at the next notify (long before this).
            Next::At(now + std::time::Duration::from_secs(3600))
        };
        Pull { chunks, next }
    }
}

fn stream(c: &mut Conn<Fake>, events: Vec<Body>, end: bool, t: Instant) -> Arc<Mutex<usize>> {
    let d = send(c, b"GET /watch HTTP/1.1\r\n\r\n", t).unwrap();
    let pulls = Arc::new(Mutex::new(0));
    let s = Events {
        left: events,
        pulls: pulls.clone(),
        end,
    };
    let reply = Reply::Stream {
        head: Answer::json(200, Vec::new()),
        stream: Box::new(s),
        holder: Holder(3),
    };
    assert!(c.reply(d, reply, t, &bounds()).is_none());
    pulls
}

#[test]
fn a_stream_goes_out_in_chunks_and_its_end_keeps_the_connection() {
    let t = Instant::now();
    let mut c = conn(t);
    let events = vec![
        Body::from(&b"{\"a\":1}\n"[..]),
        Body::from(&b"{\"b\":2}\n"[..]),
    ];
    stream(&mut c, events, true, t);
    let wire = out(&mut c);
    assert!(wire.starts_with("HTTP/1.1 200 OK\r\n"), "{wire}");
    assert!(wire.contains("Transfer-Encoding: chunked\r\n") && !wire.contains("Content-Length"));
    assert!(
        wire.ends_with("\r\n\r\n8\r\n{\"a\":1}\n\r\n8\r\n{\"b\":2}\n\r\n0\r\n\r\n"),
        "{wire}"
    );
    assert_eq!(c.kind(), Kind::Reading, "kept for the next request");
}

#[test]
fn a_watcher_that_does_not_read_holds_at_most_the_watermark_and_is_cut_off() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    c.io.room = Some(0);
    let events: Vec<Body> = (0..1000).map(|_| Body::from(vec![b'e'; 1000])).collect();
    let pulls = stream(&mut c, events, false, t);
    assert_eq!(c.kind(), Kind::Held(Holder(3), t));
    // Nothing went out; what it queued is bounded by the watermark.
    assert!(
        c.outbox.queued() <= WATERMARK + 1000 + 64,
        "{}",
        c.outbox.queued()
    );
    let asked = *pulls.lock().unwrap();
    for i in 1..20 {
        c.notify(t + Duration::from_millis(i), &b);
    }
    assert_eq!(
        *pulls.lock().unwrap(),
        asked,
        "not asked while its queue is full"
    );
    assert!(c.outbox.queued() <= WATERMARK + 1000 + 64);
    // It reads: more is pulled as room comes.
    c.io.room = Some(200_000);
    c.ready(t + Duration::from_secs(1), &b);
    assert!(*pulls.lock().unwrap() > asked);
    assert!(c.io.sent.len() > 100_000);
    // Then it stops reading again, for longer than a write may wait: cut off.
    c.io.room = Some(0);
    c.notify(t + Duration::from_secs(2), &b);
    let stall = c.deadline().unwrap();
    assert!(
        stall <= t + Duration::from_secs(2) + b.write_deadline,
        "{stall:?}"
    );
    c.tick(stall, &b);
    assert!(c.done());
}

#[test]
fn a_stream_made_to_give_way_ends_and_closes() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    stream(&mut c, vec![Body::from(&b"x\n"[..])], false, t);
    out(&mut c);
    assert!(c.evict(t, &b, Evict::Politely).is_none());
    assert_eq!(out(&mut c), "0\r\n\r\n");
    assert!(c.done() && c.io.said_goodbye);
}

/// `POST /p` with a body of `n` bytes, its head and its first `sent` bytes.
fn post(path: &str, n: usize, sent: usize) -> Vec<u8> {
    let mut wire = format!("POST {path} HTTP/1.1\r\nContent-Length: {n}\r\n\r\n").into_bytes();
    wire.extend(std::iter::repeat_n(b'x', sent));
    wire
}

/// Issue 56.4: a server that needs no body (the hub serves GETs) never keeps one: the
/// request is answered from its head (a 401, a 405), what arrives of its body is dropped
/// as it comes, and the connection closes after the answer.
#[test]
fn a_body_not_needed_is_never_kept() {
    let t = Instant::now();
    let b = Bounds {
        bodies: Bodies::None,
        max_body: 1 << 20,
        ..bounds()
    };
    let mut c = Conn::new(Fake::default(), t, &b);
    c.io.incoming = post("/api/v1/configmaps", 600_000, 30_000);
    let d = c.ready(t, &b).unwrap();
    assert!(d.req.body.is_empty() && d.req.close, "{:?}", d.req);
    assert_eq!(c.inbox.capacity(), 0);
    // More of it comes while the handler answers: read, and dropped.
    c.io.incoming = vec![b'x'; 200_000];
    c.ready(t, &b);
    assert!(c.io.incoming.is_empty() && c.inbox.capacity() == 0);
    assert_eq!(c.footprint().own, CONN_COST);
    c.reply(d, Reply::Answer(Answer::text(405, "no\n")), t, &b);
    let wire = out(&mut c);
    assert!(
        wire.starts_with("HTTP/1.1 405 ") && wire.contains("Connection: close"),
        "{wire}"
    );
    // A lingering close: its side ended, what still comes dropped until the client
    // closes (a close with bytes unread would reset the connection, and the client could
    // lose the answer), or a moment passes.
    assert!(c.io.said_goodbye && c.io.shut && !c.done());
    assert_eq!(c.kind(), Kind::Writing);
    assert_eq!(c.deadline(), Some(t + LINGER));
    c.io.incoming = vec![b'x'; 100_000];
    c.io.closed = true;
    c.ready(t, &b);
    assert!(c.done() && c.io.incoming.is_empty());
    let mut late = Conn::new(Fake::default(), t, &b);
    late.io.incoming = post("/", 10, 0);
    let d = late.ready(t, &b).unwrap();
    late.reply(d, ok("x"), t, &b);
    late.tick(t + LINGER, &b);
    assert!(late.done(), "not past its moment");
}

/// A body not read, sent without end on a request held open (a watch, a long poll): past
/// `MAX_DROPPED` it is no longer read (the client meets its own TCP window, not the
/// server's loop), and once the answer is out what waits is dropped as the close lingers.
#[test]
fn a_body_not_read_is_dropped_a_bounded_amount_while_its_request_is_held() {
    let t = Instant::now();
    let b = Bounds {
        bodies: Bodies::None,
        max_body: 1 << 30,
        ..bounds()
    };
    let mut c = Conn::new(Fake::default(), t, &b);
    let mut wire =
        b"GET /api/v1/configmaps?watch=1 HTTP/1.1\r\nContent-Length: 1000000000\r\n\r\n".to_vec();
    wire.extend(vec![b'x'; 100_000]);
    c.io.incoming = wire;
    let d = c.ready(t, &b).unwrap();
    for _ in 0..3 {
        c.io.incoming = vec![b'x'; 100_000];
        c.ready(t, &b);
    }
    // Read while under the bound (the third read passes it).
    assert_eq!((c.inbox.dropped(), c.io.incoming.len()), (300_000, 0));
    assert!(c.inbox.dropped() >= MAX_DROPPED);
    c.io.incoming = vec![b'x'; 100_000];
    c.ready(t, &b);
    assert_eq!(c.io.incoming.len(), 100_000, "no longer read");
    c.io.incoming.extend(vec![b'x'; 100_000]);
    c.ready(t, &b);
    assert_eq!(c.io.incoming.len(), 200_000, "still not read");
    c.reply(d, ok("x"), t, &b);
    assert!(out(&mut c).starts_with("HTTP/1.1 200 "));
    assert_eq!(c.deadline(), Some(t + LINGER));
    assert!(c.io.incoming.is_empty(), "dropped as the close lingers");
}

/// A request refused from its head (a 413: too large a body) is answered, and what
/// follows is dropped as the close lingers, so that the client reads its answer.
#[test]
fn a_refused_head_lingers_so_that_its_answer_is_read() {
    let t = Instant::now();
    let mut c = conn(t);
    c.io.incoming = post("/validate", 1 << 20, 5_000);
    assert!(c.ready(t, &bounds()).is_none());
    let wire = out(&mut c);
    assert!(wire.starts_with("HTTP/1.1 413 "), "{wire}");
    assert!(!c.done() && c.io.shut);
    assert_eq!(c.deadline(), Some(t + LINGER));
    c.io.incoming = vec![b'x'; 10_000];
    c.io.closed = true;
    c.ready(t, &bounds());
    assert!(c.done() && c.io.incoming.is_empty());
}

/// The webhook's rule: a body is read only for `POST /validate`, and only from a client
/// that presented a certificate; every other request is answered without its body.
#[test]
fn a_body_is_read_only_where_the_rule_says() {
    let t = Instant::now();
    let b = Bounds {
        bodies: Bodies::Post(vec![Post {
            path: "/validate",
            cert: true,
            close: false,
            max: 16,
            budget: None,
        }]),
        ..bounds()
    };
    let asked = |path: &str, cert: bool| {
        let mut c = Conn::new(Fake::default(), t, &b);
        c.io.cert = cert;
        c.io.incoming = post(path, 10, 10);
        c.ready(t, &b).unwrap().req.body.len()
    };
    assert_eq!(asked("/validate", true), 10);
    assert_eq!(asked("/validate", false), 0, "no certificate");
    assert_eq!(asked("/metrics", true), 0, "another path");
    // Over the path's own bound (the server's is 1024): a 413 from its head.
    let mut c = Conn::new(Fake::default(), t, &b);
    c.io.cert = true;
    c.io.incoming = post("/validate", 17, 17);
    assert!(c.ready(t, &b).is_none());
    let wire = out(&mut c);
    assert!(wire.starts_with("HTTP/1.1 413 "), "{wire}");
    let mut c = Conn::new(Fake::default(), t, &b);
    c.io.cert = true;
    c.io.incoming = b"PUT /validate HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc".to_vec();
    assert!(
        c.ready(t, &b).unwrap().req.body.is_empty(),
        "another method"
    );
}

/// A hub's reports (`Post { close: true }`): the answer to a report closes its connection;
/// any other request's keeps it, a body read on another path (`close: false`) too.
#[test]
fn a_read_body_closes_its_connection_where_the_rule_says() {
    let t = Instant::now();
    let b = Bounds {
        bodies: Bodies::Post(vec![
            Post {
                path: "/report",
                cert: false,
                close: true,
                max: 1024,
                budget: None,
            },
            Post {
                path: "/kept",
                cert: false,
                close: false,
                max: 1024,
                budget: None,
            },
        ]),
        ..bounds()
    };
    let answered = |wire: Vec<u8>| {
        let mut c = Conn::new(Fake::default(), t, &b);
        c.io.incoming = wire;
        let d = c.ready(t, &b).unwrap();
        c.reply(d, ok("x"), t, &b);
        (out(&mut c), c.done())
    };
    let (wire, done) = answered(post("/report", 10, 10));
    assert!(wire.contains("Connection: close\r\n") && done, "{wire}");
    let (wire, done) = answered(b"GET /report HTTP/1.1\r\n\r\n".to_vec());
    assert!(!wire.contains("Connection: close") && !done, "{wire}");
    let (wire, done) = answered(post("/kept", 10, 10));
    assert!(!wire.contains("Connection: close") && !done, "{wire}");
    // A request pipelined behind a report: dropped a moment, so that closing at once
    // (bytes unread: a reset) does not cost the client the report's answer.
    let mut wire = post("/report", 10, 10);
    wire.extend_from_slice(b"GET /x HTTP/1.1\r\n\r\n");
    let (answer, done) = answered(wire);
    assert!(
        answer.contains("Connection: close\r\n") && !done,
        "{answer}"
    );
}

/// Issue 56.4: the bodies read take from the server's budget from their head until their
/// request is dropped; one that does not fit is a 503 that closes its connection, its
/// body never read.
#[test]
fn bodies_take_from_the_budget_as_they_arrive_and_one_that_does_not_fit_waits_for_none() {
    let t = Instant::now();
    let b = Bounds {
        max_body: 4096,
        ..bounds()
    };
    let mut first = Conn::new(Fake::default(), t, &b);
    first.io.incoming = post("/v", 1000, 400);
    assert!(first.ready(t, &b).is_none(), "its body is still coming");
    assert_eq!(b.budget.used(), 400, "what arrived of it");
    // Heads that announce the most a body may be and stall take nothing.
    let mut stalled: Vec<Conn<Fake>> = (0..10)
        .map(|_| {
            let mut c = Conn::new(Fake::default(), t, &b);
            c.io.incoming = post("/v", 4096, 0);
            assert!(c.ready(t, &b).is_none());
            c
        })
        .collect();
    assert_eq!(b.budget.used(), 400);
    let mut second = Conn::new(Fake::default(), t, &b);
    second.io.incoming = post("/v", 3800, 3800);
    assert!(second.ready(t, &b).is_none());
    let wire = out(&mut second);
    assert!(
        wire.starts_with("HTTP/1.1 503 ") && wire.contains("Retry-After: 1"),
        "{wire}"
    );
    assert!(
        second.io.said_goodbye && second.io.shut,
        "closing, the rest of its body not read"
    );
    assert_eq!(b.budget.used(), 400, "what it took given back");
    first.io.incoming = vec![b'x'; 600];
    let d = first.ready(t, &b).unwrap();
    assert_eq!(d.req.body.len(), 1000);
    assert_eq!(b.budget.used(), 1000, "while its request lives");
    first.reply(d, ok("done\n"), t, &b);
    assert_eq!(b.budget.used(), 0, "given back once answered");
    stalled[0].io.incoming = vec![b'x'; 4096];
    assert!(stalled[0].ready(t, &b).is_some(), "a whole body fits now");
}

/// Issue 56.4: a receive buffer gives its room back once a request is out of it: a
/// connection idle after a large body holds what an idle one holds.
#[test]
fn a_receive_buffer_gives_its_room_back() {
    let t = Instant::now();
    let b = Bounds {
        max_body: 100_000,
        budget: Budget::new(100_000),
        ..bounds()
    };
    let mut c = Conn::new(Fake::default(), t, &b);
    c.io.incoming = post("/v", 60_000, 60_000);
    let d = c.ready(t, &b).unwrap();
    assert_eq!(d.req.body.len(), 60_000);
    assert!(
        c.footprint().own <= CONN_COST + KEPT_ROOM,
        "{:?}",
        c.footprint()
    );
    c.reply(d, ok("ok\n"), t, &b);
    out(&mut c);
    assert_eq!(c.kind(), Kind::Reading);
    assert_eq!(c.footprint().bytes(), CONN_COST);
    // A large head, no body: its room given back too.
    let head = format!("GET / HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "p".repeat(12_000));
    c.io.incoming = head.into_bytes();
    let d = c.ready(t, &b).unwrap();
    c.reply(d, ok("ok\n"), t, &b);
    out(&mut c);
    assert_eq!(
        c.footprint(),
        Footprint {
            own: CONN_COST,
            body: None
        }
    );
}

/// An answer written for a holder makes the connection the holder's, and what it holds
/// is counted: its own bytes, and the shared body once, by its address.
#[test]
fn an_answer_held_for_an_identity_counts_its_body() {
    let t = Instant::now();
    let b = bounds();
    let mut c = conn(t);
    let d = send(&mut c, b"GET /list HTTP/1.1\r\n\r\n", t).unwrap();
    c.io.room = Some(100);
    let list = Body::from(vec![b'x'; 100_000]);
    let held = Reply::Held {
        answer: Answer::json(200, list.clone()),
        holder: Holder(9),
    };
    c.reply(d, held, t, &b);
    assert_eq!(c.kind(), Kind::Held(Holder(9), t));
    assert_eq!(c.owner, Some(Holder(9)));
    let f = c.footprint();
    assert_eq!(f.body, Some((list.addr(), 100_000)));
    assert!(f.own >= CONN_COST && f.own < CONN_COST + 1024, "{f:?}");
    // Written: idle, still the holder's, holding nothing but itself.
    c.io.room = None;
    c.ready(t, &b);
    assert_eq!((c.kind(), c.owner), (Kind::Reading, Some(Holder(9))));
    assert_eq!(c.footprint().bytes(), CONN_COST);
    // Made to go while its answer is written: cut off at once (its memory is needed).
    let d = send(&mut c, b"GET /list HTTP/1.1\r\n\r\n", t).unwrap();
    c.io.room = Some(0);
    let held = Reply::Held {
        answer: Answer::json(200, list),
        holder: Holder(9),
    };
    c.reply(d, held, t, &b);
    assert!(c.evict(t, &b, Evict::Now).is_none());
    assert!(c.done());
}

/// A connection in its handshake counts what rustls may hold of it (a ClientHello of up to
/// 64 KiB joined across records), not its state alone.
#[test]
fn a_handshake_counts_what_it_was_sent() {
    let t = Instant::now();
    let mut c = conn(t);
    assert_eq!(c.footprint().own, CONN_COST);
    c.io.handshake = 60_000;
    assert_eq!(c.footprint().own, CONN_COST + 60_000);
    c.io.handshake = 10 << 20;
    assert_eq!(c.footprint().own, CONN_COST + HANDSHAKE_HELD);
}

/// A path with a budget of its own (a hub's remotecfg calls, read before their token is
/// checked): its bodies take from it alone, so filling it leaves the server's budget (the
/// followers' reports') whole, and a body over it is a 503 while another path's is read.
#[test]
fn a_path_with_its_own_budget_takes_from_it_alone() {
    let t = Instant::now();
    let own = Budget::new(1500);
    let b = Bounds {
        bodies: Bodies::Post(vec![
            Post {
                path: "/report",
                cert: false,
                close: true,
                max: 1024,
                budget: None,
            },
            Post {
                path: "/call",
                cert: false,
                close: false,
                max: 1024,
                budget: Some(own.clone()),
            },
        ]),
        ..bounds()
    };
    let mut first = Conn::new(Fake::default(), t, &b);
    first.io.incoming = post("/call", 1000, 1000);
    let held = first.ready(t, &b).unwrap();
    assert_eq!((own.used(), b.budget.used()), (1000, 0));
    let mut second = Conn::new(Fake::default(), t, &b);
    second.io.incoming = post("/call", 1000, 1000);
    assert!(second.ready(t, &b).is_none());
    assert!(
        out(&mut second).starts_with("HTTP/1.1 503 "),
        "its own budget is full"
    );
    let mut report = Conn::new(Fake::default(), t, &b);
    report.io.incoming = post("/report", 1000, 1000);
    let read = report.ready(t, &b).unwrap();
    assert_eq!((read.req.body.len(), b.budget.used()), (1000, 1000));
    drop(held);
    assert_eq!(own.used(), 0);
}

/// Review 61 (second), finding 1: clients that announce the largest calls on a path with a
/// budget of its own, send all but their last byte and stall hold none of that budget —
/// their bytes are their connections' own, where the server's shares let the silent go —
/// so another client's small call is read and dispatched, never a 503.
#[test]
fn stalled_bodies_hold_nothing_of_their_paths_budget() {
    let t = Instant::now();
    let own = Budget::new(1500);
    let b = Bounds {
        bodies: Bodies::Post(vec![Post {
            path: "/call",
            cert: false,
            close: false,
            max: 1024,
            budget: Some(own.clone()),
        }]),
        ..bounds()
    };
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let mut c = Conn::new(Fake::default(), t, &b);
        c.io.incoming = post("/call", 1000, 999);
        assert!(c.ready(t, &b).is_none());
        assert!(out(&mut c).is_empty(), "still reading");
        assert!(
            c.footprint().own >= CONN_COST + 999,
            "its bytes are its own"
        );
        stalled.push(c);
    }
    assert_eq!(own.used(), 0);
    let mut small = Conn::new(Fake::default(), t, &b);
    small.io.incoming = post("/call", 100, 100);
    let d = small.ready(t, &b).expect("read, not refused");
    assert_eq!((d.req.body.len(), own.used()), (100, 100));
    assert!(out(&mut small).is_empty(), "no 503");
    // A whole body takes from the budget; one that does not fit then is refused.
    stalled[0].io.incoming = b"x".to_vec();
    let whole = stalled[0].ready(t, &b).unwrap();
    assert_eq!(own.used(), 1100);
    stalled[1].io.incoming = b"x".to_vec();
    assert!(stalled[1].ready(t, &b).is_none());
    assert!(out(&mut stalled[1]).starts_with("HTTP/1.1 503 "));
    drop((whole, d));
    assert_eq!(own.used(), 0);
}
