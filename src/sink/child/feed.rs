//! The agent's stdin feed: events appended to an unlinked file and streamed into the pipe
//! by a thread, so an agent that stops reading never blocks the loop and costs disk, not
//! memory. `lag` tells how far behind it is.

use crate::locks::Recover;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

/// How far past its first full state an agent may fall behind on stdin before a restart.
pub const FEED_SLACK: u64 = 8 << 20;

struct FeedState {
    appended: u64,
    written: u64,
    closed: bool,
}

/// Stdin events for one agent: appended to a file, streamed into the pipe by a thread.
pub struct Feed {
    shared: Arc<(Mutex<FeedState>, Condvar)>,
    file: Arc<File>,
    /// Bytes of the initial full state, plus `FEED_SLACK`: falling further behind restarts.
    pub bound: u64,
}

impl Feed {
    pub fn start(stdin: Box<dyn Write + Send>, dir: Option<&std::path::Path>) -> io::Result<Feed> {
        let file = Arc::new(match dir {
            Some(d) => tempfile::tempfile_in(d)?,
            None => tempfile::tempfile()?,
        });
        let state = FeedState {
            appended: 0,
            written: 0,
            closed: false,
        };
        let shared = Arc::new((Mutex::new(state), Condvar::new()));
        let (s, f) = (shared.clone(), file.clone());
        thread::Builder::new()
            .name("agent-stdin".into())
            .spawn(move || feed(stdin, &s, &f))?;
        Ok(Feed {
            shared,
            file,
            bound: FEED_SLACK,
        })
    }

    pub fn push(&self, bytes: &[u8]) -> io::Result<()> {
        let (lock, cv) = &*self.shared;
        let mut st = lock.lock().recover();
        self.file.write_all_at(bytes, st.appended)?;
        st.appended += bytes.len() as u64;
        cv.notify_all();
        Ok(())
    }

    /// Bytes appended but not yet taken by the agent.
    pub fn lag(&self) -> u64 {
        let st = self.shared.0.lock().recover();
        st.appended - st.written
    }

    pub fn close(&self) {
        let (lock, cv) = &*self.shared;
        lock.lock().recover().closed = true;
        cv.notify_all();
    }
}

fn feed(mut stdin: Box<dyn Write + Send>, shared: &(Mutex<FeedState>, Condvar), file: &File) {
    let (lock, cv) = shared;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let (from, to) = {
            let mut st = lock.lock().recover();
            while st.written == st.appended && !st.closed {
                st = cv.wait(st).recover();
            }
            if st.closed {
                return;
            }
            (st.written, st.appended)
        };
        let n = ((to - from) as usize).min(buf.len());
        let written = file
            .read_exact_at(&mut buf[..n], from)
            .and_then(|()| stdin.write_all(&buf[..n]))
            .and_then(|()| stdin.flush());
        if written.is_err() {
            // The agent closed its stdin: what it did not take counts as lag from now on.
            return;
        }
        let mut st = lock.lock().recover();
        st.written += n as u64;
        if st.written == st.appended && file.set_len(0).is_ok() {
            // Caught up: start the file over.
            st.written = 0;
            st.appended = 0;
        }
    }
}
