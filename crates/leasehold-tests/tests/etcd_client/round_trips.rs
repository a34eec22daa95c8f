//! What an acquisition costs in requests on etcd, counted by a member of the test's own (its
//! `grpc_server_started_total`, which HTTP/2 pings and window updates do not move).

use std::time::Duration;

use leasehold::Client;
use leasehold_tests::{EtcdCluster, EtcdServer};

use crate::{eventually, fresh_prefix, granted};

/// A client of sessions of a minute: the keeper renews every 20 s and reads its grants' keys back after each renewal
/// (a `Txn`), never in the middle of what a test counts.
async fn quiet_client(etcd: &EtcdServer, prefix: &str) -> Client {
    Client::builder(&etcd.url())
        .unwrap()
        .prefix(prefix)
        .session_ttl(Duration::from_secs(60))
        .connect()
        .await
        .unwrap()
}

/// The `Txn` and `Range` requests the member has served so far.
fn requests(etcd: &EtcdServer) -> (u64, u64) {
    tokio::task::block_in_place(|| (etcd.requests("Txn"), etcd.requests("Range")))
}

/// A waiter's enqueue reads the keys ahead in its own transaction, so it watches after that one request; its watch
/// follows every key of the lock, so the holder's release is the only request between the release and the waiter's
/// grant (before: a read of the keys ahead after the enqueue, and another after the watch heard the delete).
pub async fn a_waiter_is_granted_by_the_release_alone(_cluster: &mut EtcdCluster) {
    let etcd = tokio::task::block_in_place(EtcdServer::start);
    let prefix = fresh_prefix();
    let holder = quiet_client(&etcd, &prefix).await;
    let waiter = quiet_client(&etcd, &prefix).await;
    let held = holder.mutex("hand-off").lock().await.unwrap();
    let before = requests(&etcd);
    let waiting = tokio::spawn(async move { waiter.mutex("hand-off").lock().await });
    eventually("the waiter watches", || async {
        tokio::task::block_in_place(|| etcd.watchers()) == 1
    })
    .await;
    let watching = requests(&etcd);
    assert_eq!(
        (watching.0 - before.0, watching.1 - before.1),
        (1, 0),
        "Txn and Range requests before the waiter watched"
    );
    assert!(
        !waiting.is_finished(),
        "the waiter was granted while the holder held the lock"
    );
    let fence = held.fence();
    held.release().await.unwrap();
    let guard = granted(waiting).await;
    let after = requests(&etcd);
    assert_eq!(
        (after.0 - watching.0, after.1 - watching.1),
        (1, 0),
        "Txn and Range requests from the release to the grant"
    );
    assert!(guard.fence() > fence);
    guard.release().await.unwrap();
}

/// A reader behind a reader is admitted by the keys its enqueue read: one request (before: two, the enqueue answered
/// only whether its key was the oldest).
pub async fn a_reader_behind_a_reader_is_granted_in_one_request(_cluster: &mut EtcdCluster) {
    let etcd = tokio::task::block_in_place(EtcdServer::start);
    let prefix = fresh_prefix();
    let first = quiet_client(&etcd, &prefix).await;
    let second = quiet_client(&etcd, &prefix).await;
    let reading = first.rw_lock("shared").read().await.unwrap();
    let before = requests(&etcd);
    let also = second.rw_lock("shared").read().await.unwrap();
    let after = requests(&etcd);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 0));
    assert!(reading.is_held() && also.is_held());
    also.release().await.unwrap();
    reading.release().await.unwrap();
}
