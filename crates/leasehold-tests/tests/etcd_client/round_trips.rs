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

/// The `Txn` and `Range` requests served since `before` (a [`requests`] count).
fn since(etcd: &EtcdServer, before: (u64, u64)) -> (u64, u64) {
    let now = requests(etcd);
    (now.0 - before.0, now.1 - before.1)
}

/// A member of the test's own (its counters are the test's alone) and two quiet clients of it.
async fn member_and_two_clients() -> (EtcdServer, Client, Client) {
    let etcd = tokio::task::block_in_place(EtcdServer::start);
    let prefix = fresh_prefix();
    let one = quiet_client(&etcd, &prefix).await;
    let two = quiet_client(&etcd, &prefix).await;
    (etcd, one, two)
}

/// A waiter's enqueue reads the keys ahead in its own transaction, so it watches after that one request; its watch
/// follows every key of the lock, so the holder's release is the only request between the release and the waiter's
/// grant (before: a read of the keys ahead after the enqueue, and another after the watch heard the delete).
pub async fn a_waiter_is_granted_by_the_release_alone(_cluster: &mut EtcdCluster) {
    let (etcd, holder, waiter) = member_and_two_clients().await;
    let held = holder.mutex("hand-off").lock().await.unwrap();
    let before = requests(&etcd);
    let waiting = tokio::spawn(async move { waiter.mutex("hand-off").lock().await });
    eventually("the waiter watches", || async {
        tokio::task::block_in_place(|| etcd.watchers()) == 1
    })
    .await;
    assert_eq!(
        since(&etcd, before),
        (1, 0),
        "Txn and Range requests before the waiter watched"
    );
    let watching = requests(&etcd);
    assert!(
        !waiting.is_finished(),
        "the waiter was granted while the holder held the lock"
    );
    let fence = held.fence();
    held.release().await.unwrap();
    let guard = granted(waiting).await;
    assert_eq!(
        since(&etcd, watching),
        (1, 0),
        "Txn and Range requests from the release to the grant"
    );
    assert!(guard.fence() > fence);
    guard.release().await.unwrap();
}

/// A reader behind a reader is admitted by the keys its enqueue read: one request (before: two, the enqueue answered
/// only whether its key was the oldest).
pub async fn a_reader_behind_a_reader_is_granted_in_one_request(_cluster: &mut EtcdCluster) {
    let (etcd, first, second) = member_and_two_clients().await;
    let reading = first.rw_lock("shared").read().await.unwrap();
    let before = requests(&etcd);
    let also = second.rw_lock("shared").read().await.unwrap();
    assert_eq!(since(&etcd, before), (1, 0));
    assert!(reading.is_held() && also.is_held());
    also.release().await.unwrap();
    reading.release().await.unwrap();
}

/// An election's observer on etcd waits on a watch of the lock's prefix, not on its interval.
pub async fn an_observer_is_woken_by_the_watch_not_its_interval(_cluster: &mut EtcdCluster) {
    let (_etcd, leader, observing) = member_and_two_clients().await;
    leasehold_tests::sequence::an_observer_is_woken_by_its_feed(&leader, &observing, crate::EVENT)
        .await;
}
