//! Exclusion, fences, waiting and hand-over, cancel safety: what every store must do the same way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{waiters, Store, EVENT};

pub async fn a_try_excludes_and_a_release_frees(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let held = a.mutex("stock").try_lock().await.unwrap();
    assert!(held.is_held());
    let busy = b.mutex("stock").try_lock().await.unwrap_err();
    assert!(busy.is_busy(), "{busy:?}");
    // A second try from the holder's own client is refused as well: the mutex is not reentrant.
    assert!(a.mutex("stock").try_lock().await.unwrap_err().is_busy());
    held.release().await.unwrap();
    let next = b.mutex("stock").try_lock().await.unwrap();
    next.release().await.unwrap();
}

pub async fn fences_strictly_increase_across_holders(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let clients = [store.client(&prefix).await, store.client(&prefix).await];
    let mut last = None;
    for i in 0..6 {
        let guard = clients[i % 2].mutex("ledger").lock().await.unwrap();
        let fence = guard.fence();
        if let Some(last) = last {
            assert!(fence > last, "fence {fence} after {last}");
        }
        last = Some(fence);
        guard.release().await.unwrap();
    }
}

pub async fn a_waiter_is_granted_by_the_release(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let held = a.mutex("door").lock().await.unwrap();
    let first = held.fence();
    let waiter = tokio::spawn(async move { b.mutex("door").lock().await });
    waiters(&a, "door", 1).await;
    assert!(!waiter.is_finished(), "granted while held");
    held.release().await.unwrap();
    let granted = tokio::time::timeout(EVENT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(granted.fence() > first);
    granted.release().await.unwrap();
}

pub async fn fair_waiters_are_granted_in_fifo_order(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let a = store.client(&prefix).await;
    let held = a.fair_mutex("queue").lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4u64 {
        let client = store.client(&prefix).await;
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let guard = client.fair_mutex("queue").lock().await.unwrap();
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        // Each waiter is queued before the next one starts: the queue order is known.
        waiters(&a, "queue", i + 1).await;
    }
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(EVENT, task).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
}

pub async fn a_wait_times_out_while_the_lock_is_held(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let held = a.mutex("busy").lock().await.unwrap();
    let err = b
        .mutex("busy")
        .lock_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    // The abandoned wait leaves no waiter behind.
    waiters(&a, "busy", 0).await;
    assert!(held.is_held());
    held.release().await.unwrap();
}

pub async fn a_dropped_guard_frees_the_lock(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let held = a.mutex("dropped").lock().await.unwrap();
    let lease = held.lease();
    drop(held);
    assert!(!lease.is_held());
    assert_eq!(lease.loss(), Some(leasehold::LossReason::Released));
    let next = b.mutex("dropped").lock_timeout(EVENT).await.unwrap();
    next.release().await.unwrap();
}

pub async fn a_cancelled_wait_leaves_nothing_behind(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b, c) = (
        store.client(&prefix).await,
        store.client(&prefix).await,
        store.client(&prefix).await,
    );
    let held = a.mutex("cancel").lock().await.unwrap();
    // b's wait is dropped while it is queued.
    let mutex = b.mutex("cancel");
    let wait = mutex.lock();
    tokio::select! {
        _ = wait => panic!("granted while held"),
        () = waiters(&a, "cancel", 1) => {}
    }
    waiters(&a, "cancel", 0).await;
    held.release().await.unwrap();
    // Nobody holds or waits: a try succeeds at once.
    let next = c.mutex("cancel").try_lock().await.unwrap();
    next.release().await.unwrap();
    assert!(!b.mutex("cancel").is_locked().await.unwrap());
}

pub async fn run_hands_the_lease_to_the_work_and_releases(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let a = store.client(&prefix).await;
    let (fence, held) = a
        .mutex("job")
        .run(|lease| async move { (lease.fence(), lease.is_held()) })
        .await
        .unwrap();
    assert!(held);
    assert!(fence.get() > 0);
    assert!(!a.mutex("job").is_locked().await.unwrap());
}

/// A session long enough that a waiter's entry left behind would block the next waiter for far longer than
/// [`PROMPTLY`] (ZooKeeper clamps it to its own maximum, 10 s in the harness).
const LONG_SESSION: Duration = Duration::from_secs(30);

/// Well within every store's session, even clamped: the bound on what must happen at once after a release.
const PROMPTLY: Duration = Duration::from_secs(5);

pub async fn a_waiter_that_gave_up_in_an_exited_process_blocks_nobody(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let held = a.mutex("gate").lock().await.unwrap();
    // Another process waits a second, gives up, and exits (as `leasehold run --wait 1` does).
    let url = store.url_at(store.addr());
    let ttl = LONG_SESSION.as_millis().to_string();
    let worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold-worker"))
        .args(["give-up", &url, &prefix, "gate", &ttl, "1000"])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(EVENT, worker).await.unwrap().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "gave up");
    // Its entry is gone: the next waiter is the only one, and is granted at the release.
    let waiter = tokio::spawn(async move { b.mutex("gate").lock_timeout(EVENT).await });
    leasehold_tests::sequence::waiters(&a, "gate", 1, PROMPTLY).await;
    let released = tokio::time::Instant::now();
    held.release().await.unwrap();
    let granted = tokio::time::timeout(PROMPTLY, waiter)
        .await
        .unwrap_or_else(|_| panic!("not granted within {PROMPTLY:?} of the release"))
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < PROMPTLY);
    granted.release().await.unwrap();
}
