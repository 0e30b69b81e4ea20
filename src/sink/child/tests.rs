//! Unit tests of the supervisor with fake agents: when it starts them, what they get on
//! stdin, how exits are handled under each `--restart`, backoff and its reset, recycling,
//! and which agent gets the reload signal. Time is passed in: nothing sleeps.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use super::*;
use crate::poll::snapshot::Snapshot;
use crate::poll::spool::Spool;

/// Everything the fake agents did, shared with the test.
#[derive(Default)]
struct World {
    spawned: usize,
    /// Per agent: how it ended (set by the test, or by a signal to its group).
    exits: BTreeMap<usize, Exit>,
    signals: Vec<(usize, Signal)>,
    group_signals: Vec<(usize, Signal)>,
    /// Per agent: what it read on stdin.
    stdin: BTreeMap<usize, Arc<Mutex<Vec<u8>>>>,
    /// Agents' stdin refuses every write (an agent that closed it).
    stdin_closed: bool,
}

type Shared = Arc<Mutex<World>>;

struct Fakes(Shared);

struct Fake {
    id: usize,
    world: Shared,
}

struct Pipe {
    read: Arc<Mutex<Vec<u8>>>,
    world: Shared,
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.world.lock().unwrap().stdin_closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        self.read.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Spawner for Fakes {
    fn spawn(&mut self, _argv: &[String], stdin: bool) -> io::Result<Box<dyn Agent>> {
        let mut w = self.0.lock().unwrap();
        w.spawned += 1;
        let id = w.spawned;
        if stdin {
            w.stdin.insert(id, Arc::default());
        }
        Ok(Box::new(Fake {
            id,
            world: self.0.clone(),
        }))
    }
}

impl Agent for Fake {
    fn pid(&self) -> i32 {
        self.id as i32
    }
    fn take_stdin(&mut self) -> Option<Box<dyn Write + Send>> {
        let read = self.world.lock().unwrap().stdin.get(&self.id)?.clone();
        Some(Box::new(Pipe {
            read,
            world: self.world.clone(),
        }))
    }
    fn try_wait(&mut self) -> Option<Exit> {
        self.world.lock().unwrap().exits.remove(&self.id)
    }
    fn signal(&mut self, sig: Signal) -> Result<(), String> {
        self.world.lock().unwrap().signals.push((self.id, sig));
        Ok(())
    }
    fn signal_group(&mut self, sig: Signal) -> Result<(), String> {
        let mut w = self.world.lock().unwrap();
        w.group_signals.push((self.id, sig));
        let killed = Exit {
            code: None,
            signal: Some(sig.0),
        };
        w.exits.insert(self.id, killed);
        Ok(())
    }
}

const CODE_3: Exit = Exit {
    code: Some(3),
    signal: None,
};
const CLEAN: Exit = Exit {
    code: Some(0),
    signal: None,
};

struct Setup {
    world: Shared,
    sup: Supervisor,
    spool: Spool,
    snapshot: Snapshot,
    restarts: Counter,
    t0: Instant,
}

impl Setup {
    fn new(restart: Restart, stdin: ChildStdin) -> Setup {
        let world = Shared::default();
        let restarts = Counter::default();
        let opts = Options {
            argv: vec!["agent".into()],
            stdin,
            reload_signal: Some(Signal::HUP),
            restart,
            grace: Duration::from_secs(1),
            feed_dir: None,
        };
        let sup = Supervisor::new(
            opts,
            Box::new(Fakes(world.clone())),
            restarts.clone(),
            ReloadResults::default(),
        );
        let mut s = Setup {
            world,
            sup,
            spool: Spool::memory(),
            snapshot: Snapshot::default(),
            restarts,
            t0: Instant::now(),
        };
        s.module("ns/m", "v1");
        s
    }

    fn module(&mut self, id: &str, v: &str) {
        let entry = crate::poll::testing::entry(&mut self.spool, v);
        self.snapshot.modules.insert(id, entry);
    }

    fn tick(&mut self, after: Duration) -> Control {
        let view = View {
            snapshot: &self.snapshot,
            spool: &self.spool,
            poll: 1,
        };
        self.sup.tick_at(Some(&view), self.t0 + after).unwrap()
    }

    /// A batch with one change (or none).
    fn apply(&mut self, changes: bool) {
        let events = if changes {
            let (id, entry) = self.snapshot.modules.iter().next().unwrap();
            vec![crate::batch::Event::new(
                crate::batch::Change::Updated,
                id,
                entry,
            )]
        } else {
            Vec::new()
        };
        let batch = Batch {
            events,
            synced: Synced::default(),
            spool: &self.spool,
            first: false,
        };
        self.sup.apply(&batch).unwrap();
    }

    fn spawned(&self) -> usize {
        self.world.lock().unwrap().spawned
    }

    fn exit(&self, agent: usize, how: Exit) {
        self.world.lock().unwrap().exits.insert(agent, how);
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn starts_after_the_first_batch_with_the_full_state() {
    let mut s = Setup::new(Restart::Always, ChildStdin::Events);
    s.tick(secs(0));
    assert_eq!(s.spawned(), 0, "not before the first batch");
    s.apply(true);
    s.tick(secs(0));
    assert_eq!(s.spawned(), 1);
    let read = s.world.lock().unwrap().stdin[&1].clone();
    let start = Instant::now();
    while !String::from_utf8_lossy(&read.lock().unwrap()).contains("synced") {
        assert!(start.elapsed() < secs(10), "the feed thread delivers");
        thread::yield_now();
    }
    let text = String::from_utf8(read.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with(r#"{"type":"added","module":"ns/m""#));
    assert!(lines[1].starts_with(r#"{"type":"synced","modules":1,"added":1"#));
    assert!(
        s.world.lock().unwrap().signals.is_empty(),
        "no signal for the batch it started with"
    );
}

#[test]
fn always_restarts_with_a_doubling_backoff_reset_by_a_stable_run() {
    let mut s = Setup::new(Restart::Always, ChildStdin::Null);
    s.apply(false);
    s.tick(secs(0));
    s.exit(1, CODE_3);
    assert_eq!(s.tick(secs(1)), Control::Continue);
    s.tick(secs(1) + Duration::from_millis(999));
    assert_eq!(s.spawned(), 1, "waits its 1 s");
    s.tick(secs(2));
    assert_eq!(s.spawned(), 2);
    s.exit(2, CODE_3);
    s.tick(secs(2));
    s.tick(secs(3));
    assert_eq!(s.spawned(), 2, "then 2 s");
    s.tick(secs(4));
    assert_eq!(s.spawned(), 3);
    // A minute of running counts as stable: the next wait is 1 s again.
    s.exit(3, CODE_3);
    s.tick(secs(70));
    s.tick(secs(71));
    assert_eq!(s.spawned(), 4);
    assert_eq!(s.restarts.get(), 3);
}

#[test]
fn on_failure_and_never_end_cmpoll_with_the_agents_status() {
    let mut s = Setup::new(Restart::OnFailure, ChildStdin::Null);
    s.apply(false);
    s.tick(secs(0));
    let killed = Exit {
        code: None,
        signal: Some(9),
    };
    s.exit(1, killed);
    assert_eq!(s.tick(secs(0)), Control::Continue, "a signal is a failure");
    s.tick(secs(1));
    assert_eq!(s.spawned(), 2);
    s.exit(2, CLEAN);
    assert_eq!(
        s.tick(secs(2)),
        Control::Exit(0),
        "a clean exit ends cmpoll"
    );
    let mut s = Setup::new(Restart::Never, ChildStdin::Null);
    s.apply(false);
    s.tick(secs(0));
    s.exit(1, killed);
    assert_eq!(s.tick(secs(0)), Control::Exit(137), "128 + SIGKILL");
}

#[test]
fn a_signal_goes_only_after_batches_with_changes_to_a_running_agent() {
    let mut s = Setup::new(Restart::Always, ChildStdin::Null);
    s.apply(true);
    s.tick(secs(0));
    s.apply(false);
    s.apply(true);
    assert_eq!(s.world.lock().unwrap().signals, [(1, Signal::HUP)]);
    s.exit(1, CODE_3);
    s.tick(secs(0));
    s.apply(true);
    assert_eq!(
        s.world.lock().unwrap().signals.len(),
        1,
        "no agent runs: no signal"
    );
}

#[test]
fn an_agent_that_stops_reading_is_recycled_at_once_whatever_the_policy() {
    let mut s = Setup::new(Restart::Never, ChildStdin::Events);
    s.apply(false);
    s.tick(secs(0));
    s.world.lock().unwrap().stdin_closed = true;
    // More than FEED_SLACK of events it never takes.
    s.module("ns/m", &"x".repeat(FEED_SLACK as usize + 1024));
    s.apply(true);
    assert_eq!(
        s.world.lock().unwrap().group_signals,
        [(1, Signal::TERM)],
        "stopped on purpose"
    );
    s.world.lock().unwrap().stdin_closed = false;
    assert_eq!(
        s.tick(secs(0)),
        Control::Continue,
        "not the end under never"
    );
    s.tick(secs(0));
    assert_eq!(s.spawned(), 2, "restarted at once, without backoff");
}
