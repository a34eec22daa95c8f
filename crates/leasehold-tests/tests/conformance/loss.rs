//! The loss signal on every store: it fires when the lock is taken away, and before anyone else could be granted it.

use std::time::Instant;

use leasehold::LossReason;

use crate::{Store, EVENT, SHORT};

pub async fn a_force_release_ends_the_holders_lease(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let held = a.mutex("stuck").ttl(SHORT).lock().await.unwrap();
    let removed = b
        .force_release("stuck")
        .await
        .unwrap()
        .expect("a holder to remove");
    assert!(
        removed.contains(held.token()),
        "{removed} is not {}",
        held.token()
    );
    let reason = tokio::time::timeout(EVENT, held.lost()).await.unwrap();
    assert_eq!(reason, LossReason::Gone);
    let err = held.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    // The name is free again.
    b.mutex("stuck")
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

pub async fn a_cut_off_holder_is_told_before_another_is_granted(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, proxy) = store.client_through_proxy(&prefix).await;
    let b = store.client(&prefix).await;
    let held = a.mutex("stock").ttl(SHORT).lock().await.unwrap();
    let lease = held.lease();
    let watcher = tokio::spawn(async move {
        let reason = lease.lost().await;
        (reason, Instant::now())
    });
    proxy.blackhole();
    let next = b
        .mutex("stock")
        .ttl(SHORT)
        .lock_timeout(EVENT)
        .await
        .unwrap();
    let granted_at = Instant::now();
    let (reason, lost_at) = tokio::time::timeout(EVENT, watcher).await.unwrap().unwrap();
    assert_eq!(reason, LossReason::Expired);
    assert!(
        lost_at <= granted_at,
        "the holder learnt of its loss {:?} after the next grant",
        lost_at - granted_at
    );
    assert!(next.fence() > held.fence());
    next.release().await.unwrap();
    drop(held);
}

pub async fn run_drops_the_work_when_the_lease_is_lost(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, proxy) = store.client_through_proxy(&prefix).await;
    let outcome = tokio::time::timeout(
        EVENT,
        a.mutex("work").ttl(SHORT).run(|lease| {
            let proxy = &proxy;
            async move {
                assert!(lease.is_held());
                proxy.blackhole();
                std::future::pending::<()>().await;
            }
        }),
    )
    .await
    .unwrap();
    let err = outcome.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
}
