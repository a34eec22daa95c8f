//! A grant's node deleted by someone else (`release --force`, `zkCli delete`): its holder is told, as `Gone`, well
//! within the session timeout, whatever happened to the node or to the holder's connection before.

use std::time::Duration;

use leasehold::LossReason;
use leasehold_tests::{TcpProxy, ZkEnsemble, ZkServer};

use crate::{client, eventually, fresh_prefix, TIMEOUT};

/// A plain ZooKeeper client of `endpoint`, which sets no watches.
async fn raw(endpoint: &str) -> zookeeper_client::Client {
    zookeeper_client::Client::connect(endpoint).await.unwrap()
}

/// The one child of `path`: the grant's node.
async fn only_child(raw: &zookeeper_client::Client, path: &str) -> String {
    let children = raw.list_children(path).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    format!("{path}/{}", children[0])
}

/// Waits for `lease` to be lost, for at most `within`; asserts it ends as `Gone`.
async fn told_gone(lease: leasehold::Lease, within: Duration, what: &str) {
    let reason = tokio::time::timeout(within, lease.lost())
        .await
        .unwrap_or_else(|_| panic!("{what}: the holder was not told within {within:?}"));
    assert_eq!(reason, LossReason::Gone, "{what}");
}

pub async fn a_set_on_the_grants_node_does_not_hide_its_delete(_ensemble: &mut ZkEnsemble) {
    // A server of its own: its watch count is the holder's watch alone.
    let zk = tokio::task::block_in_place(ZkServer::start);
    let prefix = fresh_prefix();
    let a = client(&zk.url(), &prefix).await;
    let raw = raw(&zk.endpoint()).await;
    let held = a.mutex("edited").lock().await.unwrap();
    let node = only_child(&raw, &format!("/{prefix}/edited")).await;
    eventually("the holder's watch on its node is set", || async {
        tokio::task::block_in_place(|| zk.watch_count()) >= 1
    })
    .await;
    // A `set` fires the holder's one-shot watch; the delete after it must still reach the holder.
    raw.set_data(&node, b"edited", None).await.unwrap();
    raw.delete(&node, None).await.unwrap();
    told_gone(held.lease(), TIMEOUT / 2, "a delete after a set").await;
}

pub async fn a_delete_while_the_holders_connection_is_reset_reaches_it(_ensemble: &mut ZkEnsemble) {
    let zk = tokio::task::block_in_place(ZkServer::start);
    let proxy = TcpProxy::start(zk.addr()).await;
    let prefix = fresh_prefix();
    // A session long enough that the client's connect through the delaying proxy (a round trip of 2 × DELAY) fits
    // its connection timeout (an eighth of the session).
    let session = Duration::from_secs(8);
    let a = leasehold::Client::builder(&format!("zk://{}", proxy.addr()))
        .unwrap()
        .prefix(&prefix)
        .session_ttl(session)
        .connect()
        .await
        .unwrap();
    let raw = raw(&zk.endpoint()).await;
    const DELAY: Duration = Duration::from_millis(250);
    proxy.delay(DELAY);
    let held = a.mutex("reset").lock().await.unwrap();
    // The holder sets its watch on the node at the grant; the answer takes 2 × DELAY through the proxy. Reset the
    // connection while that request is on its way (this pause is the fault's schedule, not a wait for an event).
    tokio::time::sleep(DELAY / 2).await;
    proxy.cut_all();
    let node = only_child(&raw, &format!("/{prefix}/reset")).await;
    raw.delete(&node, None).await.unwrap();
    told_gone(held.lease(), session / 2, "a delete after a reset").await;
}
