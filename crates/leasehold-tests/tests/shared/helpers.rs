//! The helpers of the session stores' own test binaries (`etcd_client`, `zookeeper_client`, `sql_client`), included
//! by each (`#[path]`) over its own `crate::{EVENT, PREFIX, SESSION, VALIDITY}`.

use leasehold::{Client, Guard, Lease};

use crate::{EVENT, PREFIX, SESSION, VALIDITY};

/// A prefix no other test of the binary uses.
pub fn fresh_prefix() -> String {
    leasehold_tests::sequence::fresh_prefix(PREFIX)
}

/// A client of `url` under `prefix` with a session of `SESSION`.
pub async fn client(url: &str, prefix: &str) -> Client {
    leasehold_tests::sequence::session_client(url, prefix, SESSION).await
}

/// Polls `check` until it holds, for at most `EVENT` (see `leasehold_tests::sequence::eventually`).
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    leasehold_tests::sequence::eventually(what, EVENT, check).await;
}

/// Waits until `lease` was renewed by a keep-alive sent after `after`: its deadline moved past `after + VALIDITY`
/// less the drift allowance. Asserts it stayed held all along.
pub async fn renewed_after(lease: &Lease, after: tokio::time::Instant) {
    leasehold_tests::sequence::renewed_after(lease, after, VALIDITY, EVENT).await;
}

/// Waits until lock `name` has `n` waiters, as `inspect` counts them.
pub async fn waiters(client: &Client, name: &str, n: u64) {
    leasehold_tests::sequence::waiters(client, name, n, EVENT).await;
}

/// The guard a spawned acquisition was granted, within `EVENT`.
pub async fn granted(
    acquisition: tokio::task::JoinHandle<Result<Guard, leasehold::Error>>,
) -> Guard {
    tokio::time::timeout(EVENT, acquisition)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}
