//! Integration tests of the leasehold library against real `redis-server` processes (one binary, one module per
//! concern). Every test starts its own servers on private ports and kills them when it ends.

mod basics;
mod cancel;
mod coalesce;
mod connection;
mod deadlines;
mod exclusion;
mod family;
mod family_processes;
mod faults;
mod fences;
mod handoff;
mod holders;
mod inputs;
mod lease;
mod metrics;
mod observe;
mod outages;
mod permits;
mod queue;
mod quorum;
mod release;
mod renewal;
mod replicas;
mod server;
mod surface;
mod tls;
mod waiting;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_tests::{ChildGuard, RedisServer};

/// The fenced write the worker uses, so tests can play the "newer holder" side of it.
pub const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
";

pub async fn connect(server: &RedisServer) -> leasehold::Client {
    install_trace_capture();
    leasehold::Client::connect(&server.url()).await.unwrap()
}

/// Takes the lock `name` once and releases it (a warm-up, or a check that locking works).
pub async fn lock_and_release(locks: &leasehold::Client, name: &str) {
    locks
        .mutex(name)
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A plain async connection for test bookkeeping.
pub async fn redis_conn(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A plain async connection whose replies may take up to 10 s (`WAIT`, or commands sent during a `CLIENT PAUSE`).
/// Connecting may take as long: the handshake's `CLIENT SETINFO` is held by a pause too on the servers that know
/// it (Redis 7.2 and later, Valkey), where Redis 7.0 refuses it at once.
pub async fn patient_conn(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    server
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

/// Starts the worker binary with `args`, stdout piped.
pub fn worker(args: &[&str]) -> ChildGuard {
    let child = Command::new(env!("CARGO_BIN_EXE_leasehold-worker"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    ChildGuard::new(child)
}

/// Bounds a test step in time so a hang fails the test instead of stalling the suite.
pub async fn within<F: std::future::Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not happen within {limit:?}"),
    }
}

/// Waits until the acquire script has found a lock busy `n` times in all (each busy attempt calls PTTL once).
pub async fn wait_for_busy_attempts(server: &RedisServer, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.command_calls("pttl") < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waiters never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(5)).await; // polls a server counter: no event to await
    }
}

/// Holds every client's commands on the server for `ms` milliseconds (`CLIENT PAUSE`), from a connection of its own.
pub async fn pause(server: &RedisServer, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .query_async(&mut redis_conn(server).await)
        .await
        .unwrap();
}

/// Collects what the subscriber writes on one thread.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

thread_local! {
    /// Where this thread's traces go while a test captures them.
    static CAPTURE: std::cell::RefCell<Option<Captured>> = const { std::cell::RefCell::new(None) };
}

/// Writes into the calling thread's capture, or nowhere.
struct ThreadCapture;

impl Write for ThreadCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|capture| {
            if let Some(captured) = &*capture.borrow() {
                captured.0.lock().unwrap().extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Stops the capture of its thread when dropped.
pub struct CaptureGuard(());

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURE.with(|capture| capture.borrow_mut().take());
    }
}

/// Waits (at most 10 s) until the captured traces hold `needle`.
pub async fn traced(captured: &Captured, needle: &str) {
    within(Duration::from_secs(10), needle, async {
        while !captured.text().contains(needle) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Installs the global subscriber behind [`capture_traces`]. Also called by [`connect`], so that it is in place
/// before most tests trace anything (a call site first hit while it is being installed could miss it).
fn install_trace_capture() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(|| ThreadCapture)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
    });
}

/// Captures what leasehold traces (DEBUG and up) on this thread until the guard drops: use a current-thread runtime,
/// so that every task runs here.
///
/// One global subscriber serves every test and writes into the capture of the thread the event happens on. Scoped
/// per-thread subscribers would be simpler, but tracing caches each call site's interest across all of them, and
/// tests that set and drop their own subscribers in parallel can leave a call site switched off for another test.
pub fn capture_traces() -> (Captured, CaptureGuard) {
    install_trace_capture();
    let captured = Captured::default();
    CAPTURE.with(|capture| *capture.borrow_mut() = Some(captured.clone()));
    (captured, CaptureGuard(()))
}
