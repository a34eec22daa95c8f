//! Several locks at once (`MultiLock`) on every store: all or nothing, no deadlock between sets that name their
//! members in opposite orders, one deadline for the whole set, one loss signal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::{InvalidArgument, LossReason};

use crate::{waiters, Store, EVENT, SHORT};

/// Takes and frees `name`'s mutex through `client`: it was free.
async fn free(client: &leasehold::Client, name: &str) {
    client
        .mutex(name)
        .try_lock()
        .await
        .unwrap_or_else(|err| panic!("{name} is not free: {err:?}"))
        .release()
        .await
        .unwrap();
}

pub async fn a_set_is_taken_whole_or_not_at_all(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let blocker = b.mutex("paris").try_lock().await.unwrap();
    let set = a.multi_lock().mutex("paris").mutex("berlin");
    let err = set.try_lock().await.unwrap_err();
    assert!(
        matches!(&err, leasehold::Error::Busy { name, .. } if name == "paris"),
        "{err:?}"
    );
    // "berlin" comes first in name order and was taken: it was given back.
    free(&b, "berlin").await;
    blocker.release().await.unwrap();

    let held = set.try_lock().await.unwrap();
    let names: Vec<&str> = held.guards().iter().map(|guard| guard.name()).collect();
    assert_eq!(
        names,
        ["paris", "berlin"],
        "the order the members were added in"
    );
    assert!(held.is_held());
    for name in ["paris", "berlin"] {
        assert!(b.mutex(name).try_lock().await.unwrap_err().is_busy());
        assert!(held.fence(name).is_some());
    }
    held.release().await.unwrap();
    free(&b, "paris").await;
    free(&b, "berlin").await;

    // The set's own checks, before anything is sent.
    let empty = a.multi_lock().try_lock().await.unwrap_err();
    assert!(
        matches!(
            empty,
            leasehold::Error::InvalidArgument(InvalidArgument::EmptySet)
        ),
        "{empty:?}"
    );
    let twice = a
        .multi_lock()
        .mutex("x")
        .read("x")
        .lock()
        .await
        .unwrap_err();
    assert!(
        matches!(&twice, leasehold::Error::InvalidArgument(InvalidArgument::DuplicateName { name }) if name == "x"),
        "{twice:?}"
    );
}

pub async fn sets_in_opposite_orders_never_deadlock_or_overlap(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let clients = [
        store.client(&prefix).await,
        store.client(&prefix).await,
        store.client(&prefix).await,
    ];
    // Who is inside, per name: a second holder of a name finds its flag set.
    let inside: Arc<[AtomicBool; 2]> = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    const ROUNDS: usize = 15;
    let mut tasks = Vec::new();
    for (client, names) in [
        (clients[0].clone(), vec!["a", "b"]),
        (clients[1].clone(), vec!["b", "a"]),
        // A set of one is its member's own grant: a plain mutex on "a".
        (clients[2].clone(), vec!["a"]),
    ] {
        let inside = Arc::clone(&inside);
        tasks.push(tokio::spawn(async move {
            let mut set = client.multi_lock();
            for name in &names {
                set = set.mutex(name);
            }
            for _ in 0..ROUNDS {
                // A deadlock would end here, with the timeout.
                let held = set.lock_timeout(EVENT).await.unwrap();
                for name in &names {
                    let flag = &inside[usize::from(*name == "b")];
                    assert!(!flag.swap(true, Ordering::SeqCst), "{name} held twice");
                }
                tokio::task::yield_now().await;
                for name in &names {
                    inside[usize::from(*name == "b")].store(false, Ordering::SeqCst);
                }
                held.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

pub async fn a_set_waits_in_each_queue_and_times_out_as_a_whole(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let blocker = b.mutex("y").try_lock().await.unwrap();
    let set = a.multi_lock().mutex("y").mutex("x");
    let waited = Duration::from_millis(300);
    let err = set.lock_timeout(waited).await.unwrap_err();
    assert!(
        matches!(&err, leasehold::Error::Timeout { name, waited: w } if name == "y" && *w == waited),
        "{err:?}"
    );
    // "x" was given back (a Redis mutex's queue entry for "y" lapses within 3 s: not waited for here).
    free(&b, "x").await;

    // A set that waits is granted by the member's release.
    let waiting = tokio::spawn({
        let set = set.clone();
        async move { set.lock().await }
    });
    waiters(&b, "y", 1).await;
    assert!(!waiting.is_finished());
    blocker.release().await.unwrap();
    let held = tokio::time::timeout(EVENT, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(held.is_held());
    held.release().await.unwrap();
}

pub async fn a_members_loss_ends_the_set(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let held = a
        .multi_lock()
        .ttl(SHORT)
        .mutex("left")
        .mutex("right")
        .lock_timeout(EVENT)
        .await
        .unwrap();
    let lost = held.lost();
    b.force_release("right")
        .await
        .unwrap()
        .expect("a holder to remove");
    let (name, reason) = tokio::time::timeout(EVENT, lost).await.unwrap();
    assert_eq!((name.as_str(), reason), ("right", LossReason::Gone));
    assert!(!held.is_held());
    assert_eq!(held.loss().map(|(name, _)| name).as_deref(), Some("right"));
    let err = held.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    // The member still held was given back with the rest.
    free(&b, "left").await;
}

pub async fn a_set_mixes_kinds(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let held = a
        .multi_lock()
        .write("doc")
        .read("cfg")
        .permits("pool", 2, 1)
        .lock_timeout(EVENT)
        .await
        .unwrap();
    assert!(b.rw_lock("doc").try_read().await.unwrap_err().is_busy());
    let reader = b.rw_lock("cfg").try_read().await.unwrap();
    assert!(b.rw_lock("cfg").try_write().await.unwrap_err().is_busy());
    let permit = b.semaphore("pool", 2).try_acquire().await.unwrap();
    assert!(b
        .semaphore("pool", 2)
        .try_acquire()
        .await
        .unwrap_err()
        .is_busy());
    held.release().await.unwrap();
    reader.release().await.unwrap();
    permit.release().await.unwrap();
    b.rw_lock("doc")
        .try_write()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let pool = b.semaphore("pool", 2);
    let (one, two) = (
        pool.try_acquire().await.unwrap(),
        pool.try_acquire().await.unwrap(),
    );
    one.release().await.unwrap();
    two.release().await.unwrap();
}
