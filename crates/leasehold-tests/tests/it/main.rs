//! Integration tests of the leasehold library against real `redis-server` processes (one binary, one module per
//! concern). Every test starts its own servers on private ports and kills them when it ends.

mod basics;
mod cancel;
mod connection;
mod deadlines;
mod exclusion;
mod faults;
mod fences;
mod holders;
mod inputs;
mod lease;
mod observe;
mod outages;
mod queue;
mod release;
mod renewal;
mod server;
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
    leasehold::Client::connect(&server.url()).await.unwrap()
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
pub async fn patient_conn(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
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

/// Holds every client's commands on the server for `ms` milliseconds (`CLIENT PAUSE`), from a connection of its own.
pub async fn pause(server: &RedisServer, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .query_async(&mut redis_conn(server).await)
        .await
        .unwrap();
}

/// Collects what the subscriber writes.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Captures what leasehold traces (DEBUG and up) on this thread until the guard drops: use a current-thread runtime,
/// so that every task runs here.
pub fn capture_traces() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}
