//! What an acquisition costs in round trips, counted by a proxy that slows every chunk by [`DELAY`] and counts, per
//! connection, the times the client spoke after hearing the server (`TcpProxy::turns`): requests written back to back
//! are one turn, a request sent only once another was answered is a turn of its own.
//!
//! The session's keeper sends a `sync` every eighth of the session (1.25 s here) on the same connection, which may take
//! a turn of its own inside a measured window: each count is taken over [`ROUNDS`] rounds, and the least is checked
//! (a `sync` can only add turns).

use std::time::Duration;

use leasehold::Client;
use leasehold_tests::{TcpProxy, ZkEnsemble, ZkServer};

use crate::{eventually, fresh_prefix, granted};

/// What the proxy holds every chunk for.
const DELAY: Duration = Duration::from_millis(20);

/// How many times each count is taken.
const ROUNDS: usize = 5;

/// The longest session the harness's servers grant (20 ticks of 500 ms): the keeper's `sync`s as rare as they get.
const SESSION: Duration = Duration::from_secs(10);

/// A client of the server at `addr` (the proxy's, or the server's own).
async fn client_of(addr: std::net::SocketAddr, prefix: &str) -> Client {
    leasehold_tests::sequence::session_client(&format!("zk://{addr}"), prefix, SESSION).await
}

/// Makes the lock's node (the first acquisition of a name creates it), so that the acquisitions counted after it
/// are the steady ones.
async fn made(client: &Client, name: &str) {
    client
        .mutex(name)
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// The turns the one connection through `proxy` took from `before`.
fn taken(proxy: &TcpProxy, before: &[u64]) -> u64 {
    let after = proxy.turns();
    assert_eq!(
        after.len(),
        1,
        "one connection through the proxy: {after:?}"
    );
    after[0] - before.first().copied().unwrap_or(0)
}

/// An uncontended acquisition is one round trip (the create, and the listing of the lock's children sent right behind
/// it, which grants it), and its release one more (the delete): the two a bare node's create and delete take. Without
/// the listing sent with the create, the acquisition took two; a watch set on the grant's node after the grant, a
/// third on its way.
pub async fn an_uncontended_cycle_is_two_round_trips(_ensemble: &mut ZkEnsemble) {
    let zk = tokio::task::block_in_place(ZkServer::start);
    let proxy = TcpProxy::start(zk.addr()).await;
    let prefix = fresh_prefix();
    let client = client_of(proxy.addr(), &prefix).await;
    made(&client, "trips").await;
    proxy.delay(DELAY);
    let mut locks = Vec::new();
    let mut releases = Vec::new();
    for _ in 0..ROUNDS {
        let before = proxy.turns();
        let guard = client.mutex("trips").lock().await.unwrap();
        locks.push(taken(&proxy, &before));
        let before = proxy.turns();
        guard.release().await.unwrap();
        releases.push(taken(&proxy, &before));
    }
    let least = |turns: &[u64]| turns.iter().copied().min();
    assert_eq!(least(&locks), Some(1), "turns per acquisition: {locks:?}");
    assert_eq!(least(&releases), Some(1), "turns per release: {releases:?}");
}

/// A waiter behind one holder takes two round trips in all: its create with the listing, then the watches on the
/// holder's node and on its own. The holder's release wakes it, and it is granted without another: its own node's
/// watch has not fired, so its node was still there when the holder's went. Without that, the waiter listed the
/// children again once woken (four: create, listing, watch, listing).
pub async fn a_woken_waiter_is_granted_without_another_round_trip(_ensemble: &mut ZkEnsemble) {
    // A server of its own: its watches are this test's alone.
    let zk = tokio::task::block_in_place(ZkServer::start);
    let watches = || tokio::task::block_in_place(|| zk.watch_count());
    let proxy = TcpProxy::start(zk.addr()).await;
    let prefix = fresh_prefix();
    let holder = client_of(zk.addr(), &prefix).await;
    let waiter = client_of(proxy.addr(), &prefix).await;
    made(&waiter, "handoff").await;
    proxy.delay(DELAY);
    let mut turns = Vec::new();
    for _ in 0..ROUNDS {
        let held = holder.mutex("handoff").lock().await.unwrap();
        // The holder's watch alone (the last round's have all fired, at the releases).
        eventually("the holder's watch alone", || async { watches() == 1 }).await;
        let before = proxy.turns();
        let waits = waiter.clone();
        let acquisition = tokio::spawn(async move { waits.mutex("handoff").lock().await });
        // The waiter waits: it spoke twice (the create, then what it sends once it read the lock), and the server
        // holds a watch of its (set only once the holder's node was read to be there).
        eventually("the waiter waits", || {
            let before = before.clone();
            let proxy = &proxy;
            async move { taken(proxy, &before) >= 2 && watches() >= 2 }
        })
        .await;
        assert!(
            !acquisition.is_finished(),
            "the waiter was granted while the holder held the lock"
        );
        held.release().await.unwrap();
        let guard = granted(acquisition).await;
        turns.push(taken(&proxy, &before));
        guard.release().await.unwrap();
    }
    assert_eq!(
        turns.iter().copied().min(),
        Some(2),
        "the waiter's turns, create to grant: {turns:?}"
    );
}

/// A waiter whose node is deleted while it waits (`release --force`, `zkCli delete`) is not granted on it when the
/// holder's node goes next: its own node's watch fired first, so it lists the children, finds its node gone, and
/// queues again with a new node. The grant is on a node that exists, whose `czxid` is its fence.
pub async fn a_waiter_whose_node_was_deleted_is_granted_only_on_a_new_one(
    _ensemble: &mut ZkEnsemble,
) {
    let zk = tokio::task::block_in_place(ZkServer::start);
    let prefix = fresh_prefix();
    let holder = client_of(zk.addr(), &prefix).await;
    let waiter = client_of(zk.addr(), &prefix).await;
    let raw = zookeeper_client::Client::connect(&zk.endpoint())
        .await
        .unwrap();
    let path = format!("/{prefix}/deleted");
    let held = holder.mutex("deleted").lock().await.unwrap();
    let watches = tokio::task::block_in_place(|| zk.watch_count());
    let waits = waiter.clone();
    let acquisition = tokio::spawn(async move { waits.mutex("deleted").lock().await });
    // The waiter's watches are set: on the lock's children (its listing's), on its own node and on the holder's.
    // (The holder's watch on the children fired at the waiter's create, and the holder watches its node instead.)
    eventually("the waiter watches its node and the holder's", || async {
        tokio::task::block_in_place(|| zk.watch_count()) >= watches + 3
    })
    .await;
    let children = raw.list_children(&path).await.unwrap();
    assert_eq!(children.len(), 2, "{children:?}");
    let queued = children.iter().max_by_key(|c| &c[c.len() - 10..]).unwrap();
    raw.delete(&format!("{path}/{queued}"), None).await.unwrap();
    held.release().await.unwrap();
    let guard = granted(acquisition).await;
    let children = raw.list_children(&path).await.unwrap();
    assert_eq!(
        children.len(),
        1,
        "the waiter's new node alone: {children:?}"
    );
    assert_ne!(&children[0], queued, "granted on its deleted node");
    let (_, stat) = raw
        .get_data(&format!("{path}/{}", children[0]))
        .await
        .unwrap();
    assert_eq!(guard.lease().fence().get(), stat.czxid.unsigned_abs());
    guard.release().await.unwrap();
}

/// An election's observer on ZooKeeper waits on watches of the lock's children and its holder's data, not on its
/// interval.
pub async fn an_observer_is_woken_by_watches_not_its_interval(ensemble: &mut ZkEnsemble) {
    let prefix = fresh_prefix();
    let leader = crate::client(&ensemble.url(), &prefix).await;
    let observing = crate::client(&ensemble.url(), &prefix).await;
    leasehold_tests::sequence::an_observer_is_woken_by_its_feed(&leader, &observing, crate::EVENT)
        .await;
}
