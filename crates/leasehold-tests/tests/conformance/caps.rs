//! Each store's column of the contract: what it refuses, with a typed error, and what it offers.

use std::time::Duration;

use crate::Store;

pub async fn the_capabilities_column_holds(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let a = store.client(&prefix).await;
    assert_eq!(a.store_name(), store.name());
    let fixed = a
        .mutex("fixed")
        .wait_and_hold(Duration::ZERO, Duration::from_secs(5))
        .await;
    let many = a.semaphore("pool", 3).try_acquire_many(2).await;
    let writer = a.rw_lock("doc").write().await.unwrap();
    let downgraded = writer.downgrade().await;
    if store.has_sessions() {
        // Leases follow the session: no fixed lease, no extension; one entry per grant: no atomic multi-permit grant
        // or downgrade.
        for outcome in [fixed.map(drop), many.map(drop), downgraded.map(drop)] {
            assert!(
                matches!(outcome, Err(leasehold::Error::Unsupported { .. })),
                "{outcome:?}"
            );
        }
        let guard = a.mutex("extend").lock().await.unwrap();
        assert!(matches!(
            guard.extend(Duration::from_secs(5)).await,
            Err(leasehold::Error::Unsupported { .. })
        ));
        guard.release().await.unwrap();
        // Nothing was left held by the refused calls, once the write grant the refused downgrade dropped is released
        // (in the background, as every dropped guard's).
        assert!(a.flush_releases(crate::EVENT).await);
        assert!(a.held_locks("*").await.unwrap().is_empty());
    } else {
        let fixed = fixed.unwrap();
        assert!(fixed.remaining() <= Duration::from_secs(5));
        fixed.release().await.unwrap();
        many.unwrap().release().await.unwrap();
        downgraded.unwrap().release().await.unwrap();
    }
}
