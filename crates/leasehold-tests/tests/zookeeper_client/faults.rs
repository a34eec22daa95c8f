//! ZooKeeper's own faults: creates whose answers are lost, an unreachable ensemble, the loss within six eighths of
//! the session after a cut, a lock node reaped and re-created. (Servers killed, paused and restarted, a session cut
//! off until the server expires it, and many grants on one session are the same on etcd: `shared/replicated.rs`.)

use std::time::Duration;

use leasehold_tests::{TcpProxy, XorShift, ZkEnsemble, ZkServer};
use tokio::time::Instant;

use crate::{client, fresh_prefix, granted, EVENT};

pub async fn creates_whose_answer_is_lost_leave_one_node_each(_ensemble: &mut ZkEnsemble) {
    let zk = tokio::task::block_in_place(ZkServer::start);
    let proxy = TcpProxy::start(zk.addr()).await;
    let prefix = fresh_prefix();
    let a = client(&format!("zk://{}", proxy.addr()), &prefix).await;
    let b = client(&zk.url(), &prefix).await;
    let mut rng = XorShift::new(0x2f6b_c11e);
    for i in 0..20 {
        let name = format!("create:{i}");
        let acquire = tokio::spawn({
            let (a, name) = (a.clone(), name.clone());
            async move { a.mutex(&name).lock().await }
        });
        // Every connection through the proxy is reset somewhere between sending the create and reading its answer
        // (or before or after: the point is random).
        tokio::time::sleep(rng.between(Duration::ZERO, Duration::from_millis(8))).await;
        proxy.cut_all();
        let guard = granted(acquire).await;
        // One node per grant: a second one would be a waiter behind the first.
        let info = b.inspect(&name).await.unwrap();
        assert_eq!(
            (info.holders.len(), info.waiting_clients),
            (1, 0),
            "{name}: {info:?}"
        );
        assert_eq!(info.last_fence, Some(guard.fence()));
        guard.release().await.unwrap();
        let info = b.inspect(&name).await.unwrap();
        assert!(
            info.holder.is_none() && info.waiting_clients == 0,
            "{name}: {info:?}"
        );
    }
    // Nothing of the client's session is left on the server.
    let left = tokio::task::block_in_place(|| zk.ephemerals());
    assert!(!left.contains("create:"), "{left}");
}

pub async fn an_unreachable_ensemble_fails_the_connect_at_once(_ensemble: &mut ZkEnsemble) {
    // Nothing listens on these ports: each server is tried once, not until the (long) session timeout is up.
    let closed = || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("zk://127.0.0.1:{},127.0.0.1:{}", closed(), closed());
    let started = Instant::now();
    let refused = leasehold::Client::builder(&url)
        .unwrap()
        .session_ttl(Duration::from_secs(30))
        .connect()
        .await
        .unwrap_err();
    assert!(refused.is_store(), "{refused:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failed after {:?}",
        started.elapsed()
    );
}

pub async fn the_loss_signal_fires_within_six_eighths_of_the_session_after_a_cut(
    _ensemble: &mut ZkEnsemble,
) {
    // The deadline is 5t/8 after the send of the last answered keep-alive (see `session.rs`), which left at most t/8
    // before the cut: the loss comes by 6t/8 after it. Counting on all of `t` would bring it at 7t/8 to t.
    let zk = tokio::task::block_in_place(ZkServer::start);
    let proxy = TcpProxy::start(zk.addr()).await;
    let prefix = fresh_prefix();
    let session = crate::TIMEOUT;
    let a = client(&format!("zk://{}", proxy.addr()), &prefix).await;
    for round in 0..2 {
        // A lock of its own each round: the last round's node waits for the server to expire its session.
        let held = a.mutex(&format!("cut:{round}")).lock().await.unwrap();
        proxy.blackhole();
        let cut_at = Instant::now();
        let reason = tokio::time::timeout(EVENT, held.lease().lost())
            .await
            .unwrap();
        let after = cut_at.elapsed();
        assert_eq!(reason, leasehold::LossReason::Expired);
        println!("round {round}: loss signal {after:?} after the cut");
        assert!(
            after <= session * 6 / 8,
            "round {round}: the loss came {after:?} after the cut, later than 6/8 of the {session:?} session"
        );
        proxy.restore();
    }
}

pub async fn fences_grow_across_a_reaped_and_recreated_lock_node(ensemble: &mut ZkEnsemble) {
    let prefix = fresh_prefix();
    let a = client(&ensemble.url(), &prefix).await;
    let raw = zookeeper_client::Client::connect(&ensemble.endpoints().join(","))
        .await
        .unwrap();
    let path = format!("/{prefix}/reaped");
    let mut last = None;
    for round in 0..3 {
        for _ in 0..3 {
            let guard = a.mutex("reaped").lock().await.unwrap();
            assert!(
                Some(guard.fence()) > last,
                "round {round}: fence {:?} after {last:?}",
                guard.fence()
            );
            last = Some(guard.fence());
            guard.release().await.unwrap();
        }
        // The lock's node deleted, as ZooKeeper reaps an empty container (or `zkCli deleteall` does): the next
        // grant's node is created in a new one, whose sequence starts again at 0.
        match raw.delete(&path, None).await {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
            Err(e) => panic!("deleting {path}: {e}"),
        }
    }
}
