//! A semaphore's stored capacity: the count of its first holder, held while a permit is, enforced against every
//! request and waiter, changed with `set_permits`, and gone with the last permit.

use std::time::Duration;

use leasehold::Error;
use leasehold_tests::RedisServer;

use crate::family::wait_for_queue_len;
use crate::{connect, redis_conn, within};

/// The lock key, queue and waiters hash of the lock `name`: whether each exists.
async fn keys_exist(server: &RedisServer, name: &str) -> [bool; 3] {
    let mut conn = redis_conn(server).await;
    let mut found = [false; 3];
    for (slot, suffix) in found.iter_mut().zip(["", ":queue", ":waiters"]) {
        let n: i64 = redis::cmd("EXISTS")
            .arg(format!("leasehold:{{{name}}}{suffix}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        *slot = n == 1;
    }
    found
}

fn wrong_permits(err: &Error) -> (u64, u64) {
    match err {
        Error::WrongPermits { asked, stored, .. } => (*asked, *stored),
        other => panic!("expected WrongPermits, got {other:?}"),
    }
}

#[tokio::test]
async fn another_count_is_refused_while_held_and_the_error_names_both_counts() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let two = locks.semaphore("pool", 2);
    let a = two.acquire().await.unwrap();
    let b = two.acquire().await.unwrap();
    let three = locks.semaphore("pool", 3);
    // With its own count of 3, a third holder used to fit next to two permits in use.
    let err = three.try_acquire().await.unwrap_err();
    assert_eq!(wrong_permits(&err), (3, 2));
    assert!(err.is_wrong_permits());
    let text = err.to_string();
    assert!(
        text.contains("pool") && text.contains(" 2 ") && text.contains(" 3"),
        "{text}"
    );
    // A wait is refused too, at once, and leaves no queue entry behind.
    let err = within(Duration::from_secs(5), "a refused wait", three.acquire())
        .await
        .unwrap_err();
    assert_eq!(wrong_permits(&err), (3, 2));
    let err = three
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(wrong_permits(&err), (3, 2));
    assert_eq!(keys_exist(&server, "pool").await, [true, false, false]);
    let info = locks.inspect("pool").await.unwrap();
    assert_eq!(info.permits, Some(2));
    assert_eq!(info.holders.len(), 2, "nothing was granted");
    a.release().await.unwrap();
    b.release().await.unwrap();
}

#[tokio::test]
async fn the_capacity_goes_with_the_last_permit_and_the_next_count_wins() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let two = locks.semaphore("pool", 2);
    let a = two.try_acquire().await.unwrap();
    let b = two.try_acquire().await.unwrap();
    a.release().await.unwrap();
    assert_eq!(
        locks.inspect("pool").await.unwrap().permits,
        Some(2),
        "one permit still held"
    );
    b.release().await.unwrap();
    assert_eq!(
        keys_exist(&server, "pool").await,
        [false, false, false],
        "no key outlives the last permit"
    );
    assert_eq!(locks.inspect("pool").await.unwrap().permits, None);

    // Free again: another count is the semaphore's now.
    let three = locks.semaphore("pool", 3);
    let c = three.try_acquire_many(3).await.unwrap();
    assert_eq!(locks.inspect("pool").await.unwrap().permits, Some(3));
    assert_eq!(wrong_permits(&two.try_acquire().await.unwrap_err()), (2, 3));

    // A holder that crashes: its permits lapse with its lease, and the capacity with them.
    c.leave_to_expire();
    let short = locks
        .semaphore("crashed", 2)
        .ttl(Duration::from_millis(200));
    short.try_acquire().await.unwrap().leave_to_expire();
    let four = locks.semaphore("crashed", 4);
    let d = within(Duration::from_secs(5), "the crashed permit lapsed", async {
        loop {
            match four.try_acquire_many(4).await {
                Ok(guard) => return guard,
                Err(err) => assert_eq!(wrong_permits(&err), (4, 2)),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(locks.inspect("crashed").await.unwrap().permits, Some(4));
    d.release().await.unwrap();
    assert_eq!(keys_exist(&server, "crashed").await, [false, false, false]);
}

#[tokio::test]
async fn a_waiter_whose_count_disagrees_when_served_is_dropped_not_granted() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let three = locks.semaphore("pool", 3);
    let two_of_them = three.try_acquire_many(2).await.unwrap();
    let one = three.try_acquire().await.unwrap();
    let waiter = tokio::spawn({
        let three = three.clone();
        async move { three.acquire().await }
    });
    wait_for_queue_len(&server, "pool", 1).await;
    // The capacity goes down to 2 behind the queue's back (a hand edit, or a client of a version that did not keep
    // queued waiters' counts in step) while the waiter, counting 3, is queued.
    let _: () = redis::cmd("ZADD")
        .arg("leasehold:{pool}")
        .arg(-2)
        .arg("permits")
        .query_async(&mut redis_conn(&server).await)
        .await
        .unwrap();
    // One permit comes back: 2 are still held, so the stored 2 stays, and the waiter's 3 disagrees with it.
    one.release().await.unwrap();
    let err = within(Duration::from_secs(5), "the waiter told", waiter)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(wrong_permits(&err), (3, 2));
    assert_eq!(
        locks.inspect("pool").await.unwrap().holders.len(),
        1,
        "nothing granted"
    );
    two_of_them.release().await.unwrap();
    assert_eq!(keys_exist(&server, "pool").await, [false, false, false]);
}

#[tokio::test]
async fn set_permits_raises_and_lowers_the_capacity_of_a_semaphore_in_use() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let two = locks.semaphore("pool", 2);
    let three = locks.semaphore("pool", 3);
    assert_eq!(
        three.set_permits().await.unwrap(),
        None,
        "free: nothing stored"
    );
    let a = two.try_acquire().await.unwrap();
    let b = two.try_acquire().await.unwrap();
    assert!(two.try_acquire().await.unwrap_err().is_busy());

    // Raised: the third permit is there at once for the new count.
    assert_eq!(three.set_permits().await.unwrap(), Some(2));
    assert_eq!(locks.inspect("pool").await.unwrap().permits, Some(3));
    let c = three.try_acquire().await.unwrap();
    assert_eq!(wrong_permits(&two.try_acquire().await.unwrap_err()), (2, 3));

    // Lowered below the permits in use: nobody loses a permit, and nothing is granted until they are below it.
    let one = locks.semaphore("pool", 1);
    assert_eq!(one.set_permits().await.unwrap(), Some(3));
    assert!(a.is_held() && b.is_held() && c.is_held());
    assert_eq!(locks.inspect("pool").await.unwrap().holders.len(), 3);
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert!(one.try_acquire().await.unwrap_err().is_busy());
    c.release().await.unwrap();
    let d = one.try_acquire().await.unwrap();
    assert_eq!(locks.inspect("pool").await.unwrap().permits, Some(1));
    d.release().await.unwrap();
}

#[tokio::test]
async fn set_permits_on_another_kind_is_wrong_kind() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let fair = locks.fair_mutex("ledger").try_lock().await.unwrap();
    let err = locks
        .semaphore("ledger", 2)
        .set_permits()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongKind { .. }), "{err:?}");
    fair.release().await.unwrap();
}

#[tokio::test]
async fn waiters_queued_when_the_count_changes_keep_their_place_under_the_new_count() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    // Raised: a waiter counting the old 2 is granted at once by the new 3.
    let two = locks.semaphore("raised", 2);
    let held = two.try_acquire_many(2).await.unwrap();
    let waiter = tokio::spawn({
        let two = two.clone();
        async move { two.acquire().await }
    });
    wait_for_queue_len(&server, "raised", 1).await;
    assert_eq!(
        locks.semaphore("raised", 3).set_permits().await.unwrap(),
        Some(2)
    );
    let granted = within(Duration::from_secs(5), "the waiter granted", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(held.is_held());
    granted.release().await.unwrap();
    held.release().await.unwrap();

    // Lowered: a waiter counting the old 3 waits on through its heartbeats (each attempt carries its handle's 3), and
    // is granted once the holders are below the new 2.
    let three = locks.semaphore("lowered", 3);
    let all = three.try_acquire_many(3).await.unwrap();
    let waiter = tokio::spawn({
        let three = three.clone();
        async move { three.acquire().await }
    });
    wait_for_queue_len(&server, "lowered", 1).await;
    assert_eq!(
        locks.semaphore("lowered", 2).set_permits().await.unwrap(),
        Some(3)
    );
    // Two heartbeats of the waiter later (each writes its queue entry: HSET), it is still waiting, not refused.
    let written = server.command_calls("hset");
    within(Duration::from_secs(5), "two heartbeats", async {
        while server.command_calls("hset") < written + 2 {
            tokio::time::sleep(Duration::from_millis(5)).await; // polls a server counter: no event to await
        }
    })
    .await;
    assert!(
        !waiter.is_finished(),
        "the waiter's heartbeat was refused: {:?}",
        waiter.await
    );
    all.release().await.unwrap();
    let granted = within(Duration::from_secs(5), "the waiter granted", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(locks.inspect("lowered").await.unwrap().permits, Some(2));
    granted.release().await.unwrap();
}
