//! What an operator sees on every store: `inspect`, `held_locks`, `is_locked`.

use leasehold::{HoldMode, LockKind};

use crate::{waiters, Store};

pub async fn inspect_and_list_name_the_holder(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let free = a.inspect("orders:7").await.unwrap();
    assert!(free.holder.is_none() && free.kind.is_none(), "{free:?}");
    let held = a
        .mutex("orders:7")
        .describe("worker 7")
        .lock()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("orders:7").lock().await }
    });
    waiters(&a, "orders:7", 1).await;
    let info = b.inspect("orders:7").await.unwrap();
    assert_eq!(info.name, "orders:7");
    assert_eq!(info.kind, Some(LockKind::Mutex));
    let holder = info.holder.as_ref().expect("a holder");
    assert_eq!(holder.token, held.token());
    assert_eq!(holder.description.as_deref(), Some("worker 7"));
    assert_eq!(holder.mode, HoldMode::Exclusive);
    // ZooKeeper does not tell another client how long a session has left.
    if matches!(store, Store::ZooKeeper(_)) {
        assert_eq!(holder.remaining, None);
    } else {
        assert!(holder
            .remaining
            .is_some_and(|left| left > std::time::Duration::ZERO));
    }
    assert_eq!(info.last_fence, Some(held.fence()));
    assert_eq!(info.holders.len(), 1);
    assert!(b.mutex("orders:7").is_locked().await.unwrap());

    let reader = a.rw_lock("report").read().await.unwrap();
    let listed = b.held_locks("orders:*").await.unwrap();
    let names: Vec<&str> = listed.iter().map(|info| info.name.as_str()).collect();
    assert_eq!(names, ["orders:7"]);
    let all = b.held_locks("*").await.unwrap();
    let names: Vec<&str> = all.iter().map(|info| info.name.as_str()).collect();
    assert_eq!(names, ["orders:7", "report"]);
    let report = &all[1];
    assert_eq!(report.kind, Some(LockKind::ReadWrite));
    assert_eq!(report.holders[0].mode, HoldMode::Read);
    // The token without the hold's kind tag, as the guard reports it.
    assert_eq!(report.holders[0].token, reader.token());

    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    next.release().await.unwrap();
    reader.release().await.unwrap();
    assert!(b.held_locks("*").await.unwrap().is_empty());
}
