//! The tests that are the same on etcd's cluster and ZooKeeper's ensemble: included by `etcd_client` and
//! `zookeeper_client` (`#[path]`), where `crate::{client, fresh_prefix, renewed_after, waiters, EVENT}` are each
//! binary's own (its session length, its prefix). What differs by store is data of [`Replicated`] (which servers a
//! test pauses, how many grants it hangs on one session), not a copy of the test.

use std::net::SocketAddr;
use std::time::Duration;

use leasehold_tests::{EtcdCluster, EtcdServer, TcpProxy, ZkEnsemble, ZkServer};
use tokio::time::Instant;

use crate::{client, fresh_prefix, granted, renewed_after, waiters, EVENT};

/// Three servers that elect a leader, killed, restarted, paused and resumed by index.
pub trait Replicated {
    /// The store's single server, for the tests that start one of their own.
    type Single: Single;
    /// The URL scheme (`etcd`, `zk`).
    const SCHEME: &'static str;
    /// How many grants `many_grants_follow_one_session` hangs on one session, and that session's length.
    const MANY_GRANTS: (usize, Duration);
    /// How many rounds of cut, loss and next grant `a_cut_off_session_is_lost_before_the_next_grant_and_replaced`
    /// measures.
    const CUT_ROUNDS: usize;
    /// The part of a session of `session` a grant counts on after each answered keep-alive.
    fn validity(session: Duration) -> Duration;
    fn endpoints(&self) -> Vec<String>;
    fn url(&self) -> String;
    fn leader(&self) -> usize;
    fn pid(&self, i: usize) -> Option<u32>;
    fn kill(&mut self, i: usize);
    fn restart(&mut self, i: usize);
    fn pause(&mut self, i: usize);
    fn resume(&mut self, i: usize);
    /// The servers `a_paused_server_does_not_stall_the_lease` pauses, one after the other, the client naming the
    /// first of them first.
    fn to_pause(&self) -> Vec<usize>;

    /// The URL naming server `first` first, then the others in index order.
    fn url_from(&self, first: usize) -> String {
        let endpoints = self.endpoints();
        let mut order = vec![endpoints[first].clone()];
        order.extend(
            (0..endpoints.len())
                .filter(|&i| i != first)
                .map(|i| endpoints[i].clone()),
        );
        format!("{}://{}", Self::SCHEME, order.join(","))
    }

    /// After a failed test: every server running again, none paused.
    fn heal(&mut self) {
        for i in 0..3 {
            if self.pid(i).is_none() {
                self.restart(i);
            }
            self.resume(i);
        }
    }
}

impl Replicated for EtcdCluster {
    type Single = EtcdServer;
    const SCHEME: &'static str = "etcd";
    // The shortest session etcd grants: three keep-alives and ownership rounds per 2 s while 10,000 grants follow it.
    const MANY_GRANTS: (usize, Duration) = (10_000, Duration::from_secs(2));
    // The order of loss and next grant is etcd's lease expiry, the same every round: one is enough.
    const CUT_ROUNDS: usize = 1;
    fn validity(session: Duration) -> Duration {
        session
    }
    fn endpoints(&self) -> Vec<String> {
        EtcdCluster::endpoints(self)
    }
    fn url(&self) -> String {
        EtcdCluster::url(self)
    }
    fn leader(&self) -> usize {
        EtcdCluster::leader(self)
    }
    fn pid(&self, i: usize) -> Option<u32> {
        EtcdCluster::pid(self, i)
    }
    fn kill(&mut self, i: usize) {
        EtcdCluster::kill(self, i);
    }
    fn restart(&mut self, i: usize) {
        EtcdCluster::restart(self, i);
    }
    fn pause(&mut self, i: usize) {
        EtcdCluster::pause(self, i);
    }
    fn resume(&mut self, i: usize) {
        EtcdCluster::resume(self, i);
    }
    // The client starts on the member it names first: the leader, paused, answers nothing and closes nothing, and
    // the others elect another.
    fn to_pause(&self) -> Vec<usize> {
        vec![EtcdCluster::leader(self)]
    }
}

impl Replicated for ZkEnsemble {
    type Single = ZkServer;
    const SCHEME: &'static str = "zk";
    const MANY_GRANTS: (usize, Duration) = (1000, crate::SESSION);
    // Sessions expire at tick boundaries: each round's margin differs.
    const CUT_ROUNDS: usize = 3;
    fn validity(session: Duration) -> Duration {
        // Five eighths of the session (see the library's `zookeeper/session.rs`).
        session * 5 / 8
    }
    fn endpoints(&self) -> Vec<String> {
        ZkEnsemble::endpoints(self)
    }
    fn url(&self) -> String {
        ZkEnsemble::url(self)
    }
    fn leader(&self) -> usize {
        ZkEnsemble::leader(self)
    }
    fn pid(&self, i: usize) -> Option<u32> {
        ZkEnsemble::pid(self, i)
    }
    fn kill(&mut self, i: usize) {
        ZkEnsemble::kill(self, i);
    }
    fn restart(&mut self, i: usize) {
        ZkEnsemble::restart(self, i);
    }
    fn pause(&mut self, i: usize) {
        ZkEnsemble::pause(self, i);
    }
    fn resume(&mut self, i: usize) {
        ZkEnsemble::resume(self, i);
    }
    // The client sits on one of the three, chosen at random: each follower in turn is paused, so a client on either
    // moves to another server before its deadline. (A paused leader is an election, which the torture covers.)
    fn to_pause(&self) -> Vec<usize> {
        let leader = ZkEnsemble::leader(self);
        (0..3).filter(|&i| i != leader).collect()
    }
}

/// One server of the store, started, killed and restarted.
pub trait Single {
    fn start() -> Self;
    fn url(&self) -> String;
    /// Its client address, for a proxy in front of it.
    fn addr(&self) -> SocketAddr;
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
    fn addr(&self) -> SocketAddr {
        EtcdServer::addr(self)
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
    fn addr(&self) -> SocketAddr {
        ZkServer::addr(self)
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
    let next = granted(waiter).await;
    assert!(next.fence() > fence);
    next.release().await.unwrap();
    tokio::task::block_in_place(|| servers.restart(leader));
}

/// The client's server is paused (`SIGSTOP`: it answers nothing and closes nothing): the client moves to another
/// before its deadline, and the lease is renewed throughout.
pub async fn a_paused_server_does_not_stall_the_lease<R: Replicated>(servers: &mut R) {
    let prefix = fresh_prefix();
    let paused = tokio::task::block_in_place(|| servers.to_pause());
    let a = client(&servers.url_from(paused[0]), &prefix).await;
    let held = a.mutex("stall").lock().await.unwrap();
    for i in paused {
        let paused_at = Instant::now();
        tokio::task::block_in_place(|| servers.pause(i));
        renewed_after(&held.lease(), paused_at).await;
        tokio::task::block_in_place(|| servers.resume(i));
    }
    held.release().await.unwrap();
}

/// Many grants (`R::MANY_GRANTS`) follow one session: each is renewed by its keep-alives, and all are released.
pub async fn many_grants_follow_one_session<R: Replicated>(servers: &mut R) {
    let prefix = fresh_prefix();
    let (count, session) = R::MANY_GRANTS;
    let locks = leasehold_tests::sequence::session_client(&servers.url(), &prefix, session).await;
    let mut guards = Vec::new();
    for batch in 0..count / 100 {
        let mutexes: Vec<_> = (0..100)
            .map(|i| locks.mutex(&format!("many:{batch}:{i}")))
            .collect();
        // A wait, not a try: each lock is free, and a wait rides out a call that times out on a busy machine (a
        // ZooKeeper create under 100 at once, 1 s per call on a 4 s session), where a try reports it.
        let acquired =
            futures_util::future::join_all(mutexes.iter().map(|m| m.lock_timeout(EVENT))).await;
        guards.extend(acquired.into_iter().map(Result::unwrap));
    }
    assert_eq!(locks.kept_leases(), count);
    // Every grant is renewed by keep-alives sent after this instant.
    let now = Instant::now();
    for guard in &guards {
        leasehold_tests::sequence::renewed_after(&guard.lease(), now, R::validity(session), EVENT)
            .await;
    }
    while !guards.is_empty() {
        let batch: Vec<_> = guards.drain(..guards.len().min(100)).collect();
        for released in futures_util::future::join_all(batch.into_iter().map(|g| g.release())).await
        {
            released.unwrap();
        }
    }
    crate::eventually("every grant released", || async {
        locks.held_locks("many:*").await.unwrap().is_empty()
    })
    .await;
}

/// A holder cut off from a server of its own (its proxy blackholed: nothing closed, nothing answered) is told of its
/// loss (`Expired`) before the waiter behind it is granted, which only the server's expiry of the session lets in; once
/// the cut is healed, the holder's client is granted again on a new session. `R::CUT_ROUNDS` rounds, each ordered and
/// measured.
pub async fn a_cut_off_session_is_lost_before_the_next_grant_and_replaced<R: Replicated>(
    _servers: &mut R,
) {
    let server = tokio::task::block_in_place(R::Single::start);
    let proxy = TcpProxy::start(server.addr()).await;
    let prefix = fresh_prefix();
    // A short session, so the expiry comes soon: ZooKeeper grants 1 s to 10 s with the harness's 500 ms tick, etcd's
    // shortest lease is 2 s.
    let through_proxy = format!("{}://{}", R::SCHEME, proxy.addr());
    let a =
        leasehold_tests::sequence::session_client(&through_proxy, &prefix, Duration::from_secs(2))
            .await;
    let b = client(&server.url(), &prefix).await;
    for round in 0..R::CUT_ROUNDS {
        let held = a.mutex("expiry").lock().await.unwrap();
        let lost = tokio::spawn({
            let lease = held.lease();
            async move {
                let reason = lease.lost().await;
                (reason, Instant::now())
            }
        });
        let next = tokio::spawn({
            let b = b.clone();
            async move {
                let guard = b.mutex("expiry").lock().await.unwrap();
                (guard, Instant::now())
            }
        });
        waiters(&b, "expiry", 1).await;
        let cut_at = Instant::now();
        proxy.blackhole();
        let (reason, lost_at) = tokio::time::timeout(EVENT, lost).await.unwrap().unwrap();
        assert_eq!(reason, leasehold::LossReason::Expired);
        let (next, granted_at) = tokio::time::timeout(EVENT, next).await.unwrap().unwrap();
        assert!(
            lost_at < granted_at,
            "round {round}: the waiter was granted {:?} before the holder was told",
            lost_at - granted_at
        );
        assert!(next.fence() > held.fence());
        println!(
            "round {round}: cut at 0, loss signal at {:?}, next grant at {:?} (margin {:?})",
            lost_at - cut_at,
            granted_at - cut_at,
            granted_at - lost_at
        );
        assert!(held.release().await.unwrap_err().is_lost());
        next.release().await.unwrap();
        // Healed: the next round's acquisition is granted on a new session.
        proxy.restore();
    }
    let again = tokio::time::timeout(EVENT, a.mutex("expiry").lock())
        .await
        .unwrap()
        .unwrap();
    assert!(again.is_held());
    again.release().await.unwrap();
}
