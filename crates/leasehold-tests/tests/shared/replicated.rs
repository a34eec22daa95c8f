//! The tests that are the same on etcd's cluster and ZooKeeper's ensemble: included by `etcd_client` and
//! `zookeeper_client` (`#[path]`), where `crate::{client, fresh_prefix, renewed_after, waiters, EVENT}` are each
//! binary's own (its session length, its prefix).

use leasehold_tests::{EtcdCluster, EtcdServer, ZkEnsemble, ZkServer};
use tokio::time::Instant;

use crate::{client, fresh_prefix, renewed_after, waiters, EVENT};

/// Three servers that elect a leader, killed and restarted by index.
pub trait Replicated {
    /// The store's single server, for the tests that start one of their own.
    type Single: Single;
    fn url(&self) -> String;
    fn leader(&self) -> usize;
    fn kill(&mut self, i: usize);
    fn restart(&mut self, i: usize);
}

impl Replicated for EtcdCluster {
    type Single = EtcdServer;
    fn url(&self) -> String {
        EtcdCluster::url(self)
    }
    fn leader(&self) -> usize {
        EtcdCluster::leader(self)
    }
    fn kill(&mut self, i: usize) {
        EtcdCluster::kill(self, i);
    }
    fn restart(&mut self, i: usize) {
        EtcdCluster::restart(self, i);
    }
}

impl Replicated for ZkEnsemble {
    type Single = ZkServer;
    fn url(&self) -> String {
        ZkEnsemble::url(self)
    }
    fn leader(&self) -> usize {
        ZkEnsemble::leader(self)
    }
    fn kill(&mut self, i: usize) {
        ZkEnsemble::kill(self, i);
    }
    fn restart(&mut self, i: usize) {
        ZkEnsemble::restart(self, i);
    }
}

/// One server of the store, started, killed and restarted.
pub trait Single {
    fn start() -> Self;
    fn url(&self) -> String;
    fn kill(&mut self);
    fn restart(&mut self);
}

impl Single for EtcdServer {
    fn start() -> Self {
        EtcdServer::start()
    }
    fn url(&self) -> String {
        EtcdServer::url(self)
    }
    fn kill(&mut self) {
        EtcdServer::kill(self);
    }
    fn restart(&mut self) {
        EtcdServer::restart(self);
    }
}

impl Single for ZkServer {
    fn start() -> Self {
        ZkServer::start()
    }
    fn url(&self) -> String {
        ZkServer::url(self)
    }
    fn kill(&mut self) {
        ZkServer::kill(self);
    }
    fn restart(&mut self) {
        ZkServer::restart(self);
    }
}

/// A server of its own is killed and restarted under a held lock: the store keeps its data on disk (etcd its key
/// and lease, ZooKeeper its session and nodes), the client reconnects and its keep-alives resume, and the lock stays
/// held until released.
pub async fn a_restarted_server_keeps_the_session_and_its_grants<R: Replicated>(_servers: &mut R) {
    let mut server = tokio::task::block_in_place(R::Single::start);
    let prefix = fresh_prefix();
    let (a, b) = (
        client(&server.url(), &prefix).await,
        client(&server.url(), &prefix).await,
    );
    let held = a.mutex("ledger").lock().await.unwrap();
    let restarted_at = Instant::now();
    tokio::task::block_in_place(|| {
        server.kill();
        server.restart();
    });
    renewed_after(&held.lease(), restarted_at).await;
    assert!(b.mutex("ledger").try_lock().await.unwrap_err().is_busy());
    held.release().await.unwrap();
    b.mutex("ledger")
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// The leader is killed while a lock is held and waited for: the session lives on with the new leader (the
/// holder's keep-alives are answered again before its deadline), the waiter keeps its place and is granted at the
/// release with a higher fence.
pub async fn the_leader_killed_under_a_held_and_a_waited_lock<R: Replicated>(servers: &mut R) {
    let prefix = fresh_prefix();
    let url = servers.url();
    let (a, b) = (client(&url, &prefix).await, client(&url, &prefix).await);
    let held = a.mutex("stock").lock().await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("stock").lock().await }
    });
    waiters(&a, "stock", 1).await;
    let leader = tokio::task::block_in_place(|| servers.leader());
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| servers.kill(leader));
    let elected = tokio::task::block_in_place(|| servers.leader());
    assert_ne!(elected, leader);
    renewed_after(&held.lease(), killed_at).await;
    assert!(
        !waiter.is_finished(),
        "granted while held: {:?}",
        waiter.await
    );
    let fence = held.fence();
    held.release().await.unwrap();
    let next = tokio::time::timeout(EVENT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
    tokio::task::block_in_place(|| servers.restart(leader));
}
