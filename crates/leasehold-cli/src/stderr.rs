//! `leasehold`'s own stderr: every line goes through a bounded queue to one writer thread, so that a stderr nobody
//! reads (a stalled log shipper, a pipe the program's own output filled) never blocks the thread that supervises the
//! program. With `RUST_LOG` set, the library's events are written from the runtime's one thread, the thread that also
//! runs the loss timer and sends the program its SIGTERM; a blocking write there once let a program run on beside the
//! next holder (issue 33).
//!
//! A line that finds the queue full is dropped and counted; the count is said in one last line at exit. At exit,
//! [`flush`] waits a bounded time for the queue to drain: a stderr that stays blocked cannot keep `leasehold` from
//! exiting either.

use std::collections::VecDeque;
use std::io::Write as _;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How many lines may wait for the writer. Only a stderr that is slower than `leasehold` writes (or blocked) fills it.
const QUEUE_LINES: usize = 1024;

/// How long [`flush`] waits at exit for the queue to drain.
pub const EXIT_FLUSH: Duration = Duration::from_secs(1);

struct Queue {
    state: Mutex<State>,
    /// Wakes the writer: a line was queued.
    queued: Condvar,
    /// Wakes [`flush`]: the writer went idle with nothing left to write.
    drained: Condvar,
}

#[derive(Default)]
struct State {
    chunks: VecDeque<Vec<u8>>,
    writing: bool,
    dropped: u64,
}

static QUEUE: OnceLock<Queue> = OnceLock::new();

/// The queue, with its writer thread started on first use. `None` when no thread could be started: then nothing can
/// be written without risking a block, and nothing is.
fn queue() -> Option<&'static Queue> {
    static STARTED: OnceLock<bool> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| Queue {
        state: Mutex::new(State::default()),
        queued: Condvar::new(),
        drained: Condvar::new(),
    });
    let started = *STARTED.get_or_init(|| {
        std::thread::Builder::new()
            .name("stderr".to_owned())
            .spawn(move || writer(queue))
            .is_ok()
    });
    started.then_some(queue)
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The writer thread: writes each queued chunk to stderr, blocking here (and only here) while stderr is full.
fn writer(queue: &'static Queue) {
    let mut err = std::io::stderr();
    loop {
        let chunk = {
            let mut state = queue.lock();
            loop {
                if let Some(chunk) = state.chunks.pop_front() {
                    state.writing = true;
                    break chunk;
                }
                state.writing = false;
                queue.drained.notify_all();
                state = queue.queued.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        };
        let _ = err.write_all(&chunk);
        let _ = err.flush();
    }
}

/// Queues `text` for stderr without ever blocking: when the queue is full the text is dropped and counted.
pub fn write(text: impl Into<Vec<u8>>) {
    let Some(queue) = queue() else {
        return;
    };
    let mut state = queue.lock();
    if state.chunks.len() >= QUEUE_LINES {
        state.dropped += 1;
        return;
    }
    state.chunks.push_back(text.into());
    drop(state);
    queue.queued.notify_one();
}

/// Waits up to `within` until everything queued was written, saying first how many lines were dropped, if any. True
/// when the queue drained in time.
pub fn flush(within: Duration) -> bool {
    let Some(queue) = QUEUE.get() else {
        return true;
    };
    let deadline = Instant::now() + within;
    let mut state = queue.lock();
    if state.dropped > 0 {
        let dropped = std::mem::take(&mut state.dropped);
        let line = format!(
            "leasehold: warning: {dropped} lines for stderr were dropped: it was not read fast enough\n"
        );
        state.chunks.push_back(line.into_bytes());
        queue.queued.notify_one();
    }
    while state.writing || !state.chunks.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        state = queue
            .drained
            .wait_timeout(state, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    true
}

/// A [`tracing_subscriber`] writer: one formatted event, queued whole when the writer is dropped.
#[derive(Default)]
pub struct Event(Vec<u8>);

impl std::io::Write for Event {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            write(std::mem::take(&mut self.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_returns_once_everything_queued_was_written() {
        write("");
        write(b"".to_vec());
        assert!(flush(Duration::from_secs(10)));
    }
}
