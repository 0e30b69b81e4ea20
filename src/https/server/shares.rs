//! What the server counts each connection as, and for whom (`Shares`). A connection is its
//! owner's — the identity that last held it (`Holder`: a token the hub authenticated, a
//! client certificate the TLS layer verified) — or no one's (token-less: handshaking, not
//! yet authenticated, refused). What it holds (`Footprint`) counts toward its owner's
//! share, or toward what the token-less connections hold together; a shared body (a list
//! rendered once for a thousand followers) counts once per share however many of its
//! connections keep it alive, whole, since any one of them keeps all of it alive.
//!
//! The orders in which connections are let go, the least valuable first. For a place
//! (`room`): the token-less, silent for longest first, one that sent a whole TLS record
//! counted as silent a second less than it is (a stalled handshake goes before a client in
//! the middle of its own, however fast stalled ones come, and a newcomer, whose first
//! record is on its way, after every stalled handshake older than it); then connections of
//! identities that are open (idle, or writing an answer no one holds), silent for longest
//! first; then the held requests (parked, streaming, writing for their holder) of the
//! identity that holds the most, oldest first. For the token-less connections' bytes
//! (`oldest_loose`): the one silent for longest (a newcomer is never the one).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::https::conn::{Conn, Footprint, Kind};
use crate::https::handler::Holder;
use crate::https::transport::Transport;

/// How a connection was last counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Counted {
    pub owner: Option<Holder>,
    pub place: Place,
    pub footprint: Footprint,
}

impl Counted {
    pub fn of<T: Transport>(conn: &Conn<T>) -> Counted {
        let place = match conn.kind() {
            Kind::Reading | Kind::Writing => Place::Open {
                since: conn.since,
                started: conn.io.started(),
            },
            Kind::Held(_, at) => Place::Held(at),
            Kind::Working | Kind::Done => Place::Working,
        };
        Counted {
            owner: conn.owner,
            place,
            footprint: conn.footprint(),
        }
    }
}

/// Where a token-less connection silent since `since` stands in line for a place.
fn in_line(since: Instant, started: bool) -> Instant {
    match started {
        true => since + HEARD,
        false => since,
    }
}

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Handshaking, reading, idle, or writing an answer no one holds, silent since then
    /// (`started`: once it sent a whole TLS record): the first to give way.
    Open { since: Instant, started: bool },
    /// Parked, streaming or writing for its owner, since then.
    Held(Instant),
    /// With a worker: it stays.
    Working,
}

/// How much less silent than it is a connection that sent a whole TLS record counts, in
/// line for a place.
const HEARD: Duration = Duration::from_secs(1);

/// Bytes held by a group of connections: their own, and each shared body once.
#[derive(Debug, Default)]
struct Tally {
    own: usize,
    /// Shared bodies by address: length, and how many connections keep each.
    bodies: HashMap<usize, (usize, usize)>,
    shared: usize,
}

impl Tally {
    fn add(&mut self, f: &Footprint) {
        self.own += f.own;
        if let Some((addr, len)) = f.body {
            let e = self.bodies.entry(addr).or_insert((len, 0));
            if e.1 == 0 {
                self.shared += e.0;
            }
            e.1 += 1;
        }
    }

    fn remove(&mut self, f: &Footprint) {
        self.own = self.own.saturating_sub(f.own);
        if let Some((addr, _)) = f.body
            && let Some(e) = self.bodies.get_mut(&addr)
        {
            e.1 -= 1;
            if e.1 == 0 {
                self.shared = self.shared.saturating_sub(e.0);
                self.bodies.remove(&addr);
            }
        }
    }

    fn bytes(&self) -> usize {
        self.own + self.shared
    }
}

/// A share: its connections by place, and what they hold.
#[derive(Debug, Default)]
pub(super) struct Share {
    /// Open connections, silent for longest first.
    pub open: BTreeSet<(Instant, u64)>,
    /// Held requests, oldest first.
    pub held: BTreeSet<(Instant, u64)>,
    tally: Tally,
    connections: usize,
}

impl Share {
    pub fn bytes(&self) -> usize {
        self.tally.bytes()
    }
}

/// Every connection, counted.
#[derive(Debug, Default)]
pub(super) struct Shares {
    /// The token-less connections.
    pub loose: Share,
    /// Each identity's.
    pub identities: HashMap<Holder, Share>,
    /// Every identity's open connections, silent for longest first.
    owned_open: BTreeSet<(Instant, u64)>,
    /// The token-less in line for a place: silent for longest first, those that sent a
    /// whole TLS record counted `HEARD` less silent.
    loose_line: BTreeSet<(Instant, u64)>,
}

impl Shares {
    /// Counts connection `key` as `after` instead of `before`.
    pub fn recount(&mut self, key: u64, before: Option<&Counted>, after: Option<&Counted>) {
        if let Some(c) = before {
            self.take_out(key, c);
        }
        if let Some(c) = after {
            self.put_in(key, c);
        }
    }

    fn put_in(&mut self, key: u64, c: &Counted) {
        let share = match c.owner {
            None => &mut self.loose,
            Some(h) => self.identities.entry(h).or_default(),
        };
        share.tally.add(&c.footprint);
        share.connections += 1;
        match c.place {
            Place::Open { since: t, started } => {
                share.open.insert((t, key));
                if c.owner.is_some() {
                    self.owned_open.insert((t, key));
                } else {
                    self.loose_line.insert((in_line(t, started), key));
                }
            }
            Place::Held(t) => {
                share.held.insert((t, key));
            }
            Place::Working => {}
        }
    }

    fn take_out(&mut self, key: u64, c: &Counted) {
        let share = match c.owner {
            None => &mut self.loose,
            Some(h) => match self.identities.get_mut(&h) {
                Some(s) => s,
                None => return,
            },
        };
        share.tally.remove(&c.footprint);
        share.connections = share.connections.saturating_sub(1);
        match c.place {
            Place::Open { since: t, started } => {
                share.open.remove(&(t, key));
                self.owned_open.remove(&(t, key));
                self.loose_line.remove(&(in_line(t, started), key));
            }
            Place::Held(t) => {
                share.held.remove(&(t, key));
            }
            Place::Working => {}
        }
        if let Some(h) = c.owner
            && self.identities.get(&h).is_some_and(|s| s.connections == 0)
        {
            self.identities.remove(&h);
        }
    }

    /// The held requests `h` holds.
    pub fn held(&self, h: Holder) -> usize {
        self.identities.get(&h).map_or(0, |s| s.held.len())
    }

    /// The oldest held request of `h`.
    pub fn oldest_held(&self, h: Holder) -> Option<u64> {
        let share = self.identities.get(&h)?;
        share.held.first().map(|(_, k)| *k)
    }

    /// Every held request.
    pub fn all_held(&self) -> Vec<u64> {
        (self.identities.values())
            .flat_map(|s| s.held.iter().map(|(_, k)| *k))
            .collect()
    }

    /// The token-less connection silent for longest that may give way.
    pub fn oldest_loose(&self) -> Option<u64> {
        self.loose.open.first().map(|(_, k)| *k)
    }

    /// Who gives way for a newcomer: the token-less one first in line (silent for longest,
    /// one that sent a whole TLS record counted `HEARD` less silent), else the open
    /// connection of an identity silent for longest, else the oldest held request of the
    /// identity that holds the most.
    pub fn room(&self) -> Option<u64> {
        if let Some((_, k)) = self.loose_line.first() {
            return Some(*k);
        }
        if let Some((_, k)) = self.owned_open.first() {
            return Some(*k);
        }
        (self.identities.values())
            .max_by_key(|s| s.held.len())
            .and_then(|s| s.held.first().map(|(_, k)| *k))
    }

    /// When `h`'s connections hold more than `max` bytes beyond its largest one (`size`
    /// of each), the connection to let go: its oldest open one, else its oldest held one,
    /// never its largest (an identity may always have one answer of any size).
    pub fn over(&self, h: Holder, max: usize, size: impl Fn(u64) -> usize) -> Option<u64> {
        let share = self.identities.get(&h)?;
        if share.bytes() <= max {
            return None;
        }
        let all = || (share.open.iter().map(|(_, k)| *k)).chain(share.held.iter().map(|(_, k)| *k));
        let (largest, n) = all().map(|k| (k, size(k))).max_by_key(|(_, n)| *n)?;
        if share.bytes().saturating_sub(n) <= max {
            return None;
        }
        all().find(|k| *k != largest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(since: Instant) -> Place {
        Place::Open {
            since,
            started: true,
        }
    }

    fn counted(
        owner: Option<u64>,
        place: Place,
        own: usize,
        body: Option<(usize, usize)>,
    ) -> Counted {
        Counted {
            owner: owner.map(Holder),
            place,
            footprint: Footprint { own, body },
        }
    }

    /// A body that several connections of one identity keep alive counts once for it, and
    /// once again for another identity; what a connection no longer holds is counted no
    /// more.
    #[test]
    fn a_shared_body_counts_once_per_share() {
        let t = Instant::now();
        let mut s = Shares::default();
        let list = Some((0x1000, 4_000_000));
        for key in 0..150 {
            let c = counted(Some(1), Place::Held(t), 100, list);
            s.recount(key, None, Some(&c));
        }
        assert_eq!(s.identities[&Holder(1)].bytes(), 150 * 100 + 4_000_000);
        s.recount(
            1000,
            None,
            Some(&counted(Some(2), Place::Held(t), 100, list)),
        );
        assert_eq!(s.identities[&Holder(2)].bytes(), 100 + 4_000_000);
        // Its answers written: idle, holding only its own.
        for key in 0..150 {
            let before = counted(Some(1), Place::Held(t), 100, list);
            let after = counted(Some(1), open(t), 50, None);
            s.recount(key, Some(&before), Some(&after));
        }
        assert_eq!(s.identities[&Holder(1)].bytes(), 150 * 50);
        for key in 0..150 {
            s.recount(key, Some(&counted(Some(1), open(t), 50, None)), None);
        }
        assert!(!s.identities.contains_key(&Holder(1)), "gone with its last");
        assert_eq!(s.loose.bytes(), 0);
    }

    /// Who gives way for a newcomer: token-less first, then identities' open connections,
    /// then the held requests of the identity that holds the most; oldest first in each.
    #[test]
    fn room_is_made_by_the_least_valuable_first() {
        let t = Instant::now();
        let at = |s: u64| t + Duration::from_secs(s);
        let mut s = Shares::default();
        s.recount(
            1,
            None,
            Some(&counted(Some(7), Place::Held(at(1)), 10, None)),
        );
        s.recount(
            2,
            None,
            Some(&counted(Some(8), Place::Held(at(0)), 10, None)),
        );
        s.recount(
            3,
            None,
            Some(&counted(Some(7), Place::Held(at(2)), 10, None)),
        );
        assert_eq!(s.room(), Some(1), "7 holds the most: its oldest");
        s.recount(4, None, Some(&counted(Some(8), open(at(5)), 10, None)));
        assert_eq!(s.room(), Some(4), "an identity's open connection");
        s.recount(5, None, Some(&counted(None, open(at(9)), 10, None)));
        s.recount(6, None, Some(&counted(None, open(at(8)), 10, None)));
        s.recount(7, None, Some(&counted(None, Place::Working, 10, None)));
        assert_eq!(s.room(), Some(6), "the token-less one silent for longest");
        let stalled = Place::Open {
            since: at(20),
            started: false,
        };
        s.recount(9, None, Some(&counted(None, stalled, 10, None)));
        assert_eq!(s.room(), Some(6), "silent for longest, though heard");
        let heard = |since| Place::Open {
            since,
            started: true,
        };
        s.recount(9, Some(&counted(None, stalled, 10, None)), None);
        s.recount(5, Some(&counted(None, open(at(9)), 10, None)), None);
        s.recount(6, Some(&counted(None, open(at(8)), 10, None)), None);
        s.recount(5, None, Some(&counted(None, heard(at(20)), 10, None)));
        s.recount(9, None, Some(&counted(None, stalled, 10, None)));
        assert_eq!(s.room(), Some(9), "not heard: a second more silent");
        s.recount(6, None, Some(&counted(None, heard(at(18)), 10, None)));
        assert_eq!(s.room(), Some(6), "heard, but silent two seconds longer");
        s.recount(6, Some(&counted(None, heard(at(18)), 10, None)), None);
        s.recount(5, Some(&counted(None, heard(at(20)), 10, None)), None);
        s.recount(5, None, Some(&counted(None, open(at(9)), 10, None)));
        s.recount(6, None, Some(&counted(None, open(at(8)), 10, None)));
        assert_eq!(
            s.oldest_loose(),
            Some(6),
            "for bytes: the one silent for longest"
        );
        s.recount(9, Some(&counted(None, stalled, 10, None)), None);
        assert_eq!(s.loose.bytes(), 30, "one at a worker counts, and stays");
        assert_eq!((s.held(Holder(7)), s.oldest_held(Holder(7))), (2, Some(1)));
    }

    /// An identity over its bytes lets its oldest go, never its largest: one answer of any
    /// size is always its own.
    #[test]
    fn an_identity_over_its_bytes_keeps_its_largest() {
        let t = Instant::now();
        let at = |s: u64| t + Duration::from_secs(s);
        let mut s = Shares::default();
        let sizes: HashMap<u64, usize> = [(1, 1_000), (2, 50_000), (3, 2_000)].into();
        s.recount(
            1,
            None,
            Some(&counted(Some(1), Place::Held(at(1)), 1_000, None)),
        );
        assert_eq!(s.over(Holder(1), 100, |k| sizes[&k]), None, "one alone");
        s.recount(
            2,
            None,
            Some(&counted(Some(1), Place::Held(at(0)), 0, Some((9, 50_000)))),
        );
        assert_eq!(
            s.over(Holder(1), 1_000, |k| sizes[&k]),
            None,
            "within, beyond the largest"
        );
        s.recount(3, None, Some(&counted(Some(1), open(at(2)), 2_000, None)));
        assert_eq!(
            s.over(Holder(1), 1_000, |k| sizes[&k]),
            Some(3),
            "open first"
        );
        assert_eq!(s.over(Holder(1), 10_000, |k| sizes[&k]), None);
        s.recount(3, Some(&counted(Some(1), open(at(2)), 2_000, None)), None);
        assert_eq!(
            s.over(Holder(1), 500, |k| sizes[&k]),
            Some(1),
            "then held, not 2"
        );
    }
}
