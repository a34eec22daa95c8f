//! Integration tests of the dlock library against real `redis-server` processes (one binary, one module per
//! concern). Every test starts its own servers on private ports and kills them when it ends.

mod basics;
mod cancel;
mod exclusion;
mod faults;
mod inputs;
mod lease;
mod renewal;
mod waiting;

use std::process::{Command, Stdio};
use std::time::Duration;

use dlock_tests::{ChildGuard, RedisServer};

/// The fenced write the worker uses, so tests can play the "newer holder" side of it.
pub const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
";

pub async fn connect(server: &RedisServer) -> dlock::Client {
    dlock::Client::connect(&server.url()).await.unwrap()
}

/// A plain async connection for test bookkeeping.
pub async fn redis_conn(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Starts the worker binary with `args`, stdout piped.
pub fn worker(args: &[&str]) -> ChildGuard {
    let child = Command::new(env!("CARGO_BIN_EXE_dlock-worker"))
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
