//! The lock family on every store: read-write locks, semaphores, reentrant mutexes.

use std::time::Duration;

use crate::{waiters, Store, EVENT};

pub async fn readers_share_and_a_writer_excludes(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let (ra, rb) = (a.rw_lock("doc"), b.rw_lock("doc"));
    let r1 = ra.try_read().await.unwrap();
    let r2 = rb.try_read().await.unwrap();
    assert!(rb.try_write().await.unwrap_err().is_busy());
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = ra.try_write().await.unwrap();
    assert!(rb.try_read().await.unwrap_err().is_busy());
    assert!(rb.try_write().await.unwrap_err().is_busy());
    w.release().await.unwrap();
}

pub async fn a_waiting_writer_holds_back_later_readers(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b, c) = (
        store.client(&prefix).await,
        store.client(&prefix).await,
        store.client(&prefix).await,
    );
    let reader = a.rw_lock("cfg").read().await.unwrap();
    let writer = tokio::spawn(async move { b.rw_lock("cfg").write().await });
    waiters(&a, "cfg", 1).await;
    // A reader that comes after the waiting writer is not let past it.
    assert!(c.rw_lock("cfg").try_read().await.unwrap_err().is_busy());
    reader.release().await.unwrap();
    let written = tokio::time::timeout(EVENT, writer)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    written.release().await.unwrap();
}

pub async fn a_semaphore_admits_its_permits(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let clients = [
        store.client(&prefix).await,
        store.client(&prefix).await,
        store.client(&prefix).await,
    ];
    let first = clients[0].semaphore("pool", 2).try_acquire().await.unwrap();
    let second = clients[1].semaphore("pool", 2).try_acquire().await.unwrap();
    assert!(clients[2]
        .semaphore("pool", 2)
        .try_acquire()
        .await
        .unwrap_err()
        .is_busy());
    assert_eq!(
        clients[2]
            .semaphore("pool", 2)
            .available_permits()
            .await
            .unwrap(),
        0
    );
    let third = tokio::spawn({
        let client = clients[2].clone();
        async move { client.semaphore("pool", 2).acquire().await }
    });
    waiters(&clients[0], "pool", 1).await;
    first.release().await.unwrap();
    let third = tokio::time::timeout(EVENT, third)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    second.release().await.unwrap();
    third.release().await.unwrap();
}

pub async fn a_reentrant_mutex_reenters_and_excludes_others(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let outer = a.reentrant_mutex("tree").lock().await.unwrap();
    let inner = outer.reenter().unwrap();
    assert_eq!(inner.fence(), outer.fence());
    assert!(b
        .reentrant_mutex("tree")
        .try_lock()
        .await
        .unwrap_err()
        .is_busy());
    inner.release().await.unwrap();
    // Still held by the outer level.
    assert!(b
        .reentrant_mutex("tree")
        .try_lock()
        .await
        .unwrap_err()
        .is_busy());
    outer.release().await.unwrap();
    let other = b.reentrant_mutex("tree").try_lock().await.unwrap();
    other.release().await.unwrap();
}

pub async fn a_semaphore_refuses_a_count_that_disagrees_with_its_holders(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let clients = [
        store.client(&prefix).await,
        store.client(&prefix).await,
        store.client(&prefix).await,
    ];
    let first = clients[0].semaphore("sem", 2).try_acquire().await.unwrap();
    let second = clients[1].semaphore("sem", 2).try_acquire().await.unwrap();
    // Two holders of 2 permits: a third asking with 3 would make three at once. Refused, trying or waiting.
    let tried = clients[2]
        .semaphore("sem", 3)
        .try_acquire()
        .await
        .unwrap_err();
    assert!(tried.is_wrong_permits(), "{tried:?}");
    let waited = tokio::time::timeout(EVENT, clients[2].semaphore("sem", 3).acquire())
        .await
        .expect("refused at once, not left waiting")
        .unwrap_err();
    assert!(waited.is_wrong_permits(), "{waited:?}");
    assert!(
        matches!(
            waited,
            leasehold::Error::WrongPermits {
                asked: 3,
                stored: 2,
                ..
            }
        ),
        "{waited:?}"
    );
    // Nothing of the refused requests is left in the queue, and the holders keep their permits.
    waiters(&clients[0], "sem", 0).await;
    assert!(first.is_held() && second.is_held());
    assert!(clients[2]
        .semaphore("sem", 2)
        .try_acquire()
        .await
        .unwrap_err()
        .is_busy());
    first.release().await.unwrap();
    second.release().await.unwrap();
    // Free again, the semaphore takes the next count.
    let third = clients[2].semaphore("sem", 3).try_acquire().await.unwrap();
    third.release().await.unwrap();
}

pub async fn a_permit_is_not_granted_behind_an_exclusive_holder(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let held = a.mutex("mixed").lock().await.unwrap();
    // A semaphore of 3 on a name a mutex holds: one entry ahead, fewer than 3, but not a permit.
    let refused = b.semaphore("mixed", 3).try_acquire().await.unwrap_err();
    if store.has_sessions() {
        // The stores with sessions share a name between kinds: the permit waits.
        assert!(refused.is_busy(), "{refused:?}");
        let waited = b
            .semaphore("mixed", 3)
            .acquire_timeout(Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(waited.is_timeout(), "{waited:?}");
    } else {
        // Redis keeps a name to one kind.
        assert!(
            matches!(refused, leasehold::Error::WrongKind { .. }),
            "{refused:?}"
        );
    }
    assert!(held.is_held());
    held.release().await.unwrap();
}
