//! Leases: stale owners, extension, the watchdog, and work cancelled on loss.

use std::time::Duration;

use leasehold::{Error, LossReason};
use leasehold_tests::RedisServer;
use tokio::time::Instant;

use crate::{connect, wait_for_busy_attempts, within};

#[tokio::test]
async fn a_stale_owner_cannot_release_the_new_owners_lock() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let stale = locks
        .mutex("handover")
        .ttl(Duration::from_millis(100))
        .fixed_lease()
        .try_lock()
        .await
        .unwrap();
    let lost = within(Duration::from_secs(2), "fixed lease end", stale.lost()).await;
    assert_eq!(lost, LossReason::Expired);

    let current = within(
        Duration::from_secs(2),
        "new owner",
        locks.mutex("handover").lock(),
    )
    .await
    .unwrap();
    assert!(current.fence() > stale.fence());
    // The lease had ended before the release: reported as lost, whatever the release then found.
    match stale.release().await {
        Err(Error::LeaseLost {
            name,
            reason: LossReason::Expired,
        }) => assert_eq!(name, "handover"),
        other => panic!("expected LeaseLost(Expired), got {other:?}"),
    }
    let info = locks.inspect("handover").await.unwrap();
    assert_eq!(
        info.holder.unwrap().token,
        current.token(),
        "the new owner's lock is untouched"
    );
    current.release().await.unwrap();
}

#[tokio::test]
async fn extend_moves_the_deadline_and_fails_after_the_lease_lapsed() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let guard = locks
        .mutex("extend")
        .ttl(Duration::from_millis(400))
        .fixed_lease()
        .try_lock()
        .await
        .unwrap();
    let before = guard.valid_until();
    guard.extend(Duration::from_secs(5)).await.unwrap();
    let after = guard.valid_until();
    assert!(
        after > before + Duration::from_secs(4),
        "deadline moved by {:?}",
        after - before
    );
    let remaining = locks
        .inspect("extend")
        .await
        .unwrap()
        .holder
        .unwrap()
        .remaining
        .unwrap();
    assert!(
        remaining > Duration::from_secs(4),
        "server expiry moved too: {remaining:?}"
    );

    // A short extension, then let it lapse: extending afterwards must fail and must not re-create the key.
    guard.extend(Duration::from_millis(50)).await.unwrap();
    within(Duration::from_secs(2), "lapse", guard.lost()).await;
    let err = guard.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    // The key may outlive the conservative deadline by the drift allowance, but it was not extended again.
    let left = locks
        .inspect("extend")
        .await
        .unwrap()
        .holder
        .and_then(|h| h.remaining);
    assert!(
        left.is_none_or(|l| l <= Duration::from_millis(50)),
        "extend moved a lapsed lease: {left:?}"
    );
}

#[tokio::test]
async fn extend_finds_a_lock_taken_by_another_owner() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let guard = locks.mutex("taken").try_lock().await.unwrap();
    locks.force_release("taken").await.unwrap();
    let thief = locks.mutex("taken").try_lock().await.unwrap();
    let err = guard.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(matches!(err, Error::NotOwner { .. }), "{err:?}");
    assert_eq!(guard.loss(), Some(LossReason::Taken));
    assert_eq!(
        locks.inspect("taken").await.unwrap().holder.unwrap().token,
        thief.token()
    );
    thief.release().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_keeps_a_short_lease_alive_past_many_ttls() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_millis(300);
    let guard = locks.mutex("kept").ttl(ttl).try_lock().await.unwrap();
    let until = Instant::now() + ttl * 5;
    // Hold for five leases while checking both sides each lease; the deadline keeps moving forward.
    let mut last_deadline = guard.valid_until();
    while Instant::now() < until {
        tokio::time::sleep(ttl).await;
        assert!(guard.is_held());
        assert!(guard.valid_until() > last_deadline);
        last_deadline = guard.valid_until();
        assert!(locks.mutex("kept").try_lock().await.unwrap_err().is_busy());
    }
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_renewal_that_finds_the_key_gone_ends_the_lease_at_once() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let guard = locks
        .mutex("vanish")
        .ttl(Duration::from_secs(3))
        .renew_every(Duration::from_millis(100))
        .try_lock()
        .await
        .unwrap();
    server.flushall();
    let reason = within(Duration::from_secs(2), "loss on renewal", guard.lost()).await;
    assert_eq!(reason, LossReason::Gone);
    // Long before the validity deadline: the renewal told us.
    assert!(Instant::now() < guard.valid_until());
    assert!(!guard.is_held());
}

#[tokio::test]
async fn a_renewal_that_finds_another_owner_ends_the_lease_as_taken() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let thief_client = connect(&server).await;
    let guard = locks
        .mutex("stolen")
        .ttl(Duration::from_secs(3))
        .renew_every(Duration::from_millis(100))
        .try_lock()
        .await
        .unwrap();
    let thief = tokio::spawn({
        let mutex = thief_client.mutex("stolen");
        async move { mutex.lock().await.unwrap() }
    });
    // The first attempt, then the subscribed one: the thief is queued for a hand-off.
    wait_for_busy_attempts(&server, 2).await;
    // The force release hands the lock to the queued thief in the same script, so the key goes from one owner to the
    // other at once and the holder's next renewal finds another owner, never an empty key.
    thief_client.force_release("stolen").await.unwrap();
    let thief = within(Duration::from_secs(5), "the thief's grant", thief)
        .await
        .unwrap();
    // A renewal is due every 100 ms; the 3 s lease alone would keep the guard "held" for seconds more.
    let reason = within(Duration::from_millis(1500), "loss on renewal", guard.lost()).await;
    assert_eq!(reason, LossReason::Taken);
    assert!(!guard.is_held());
    assert!(Instant::now() < guard.valid_until(), "told by the renewal");
    assert_eq!(
        locks.inspect("stolen").await.unwrap().holder.unwrap().token,
        thief.token(),
        "the thief's lock is untouched"
    );
    thief.release().await.unwrap();
}

#[tokio::test]
async fn run_drops_the_work_when_the_lease_is_lost() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
    struct SignalOnDrop(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for SignalOnDrop {
        fn drop(&mut self) {
            let _ = self.0.take().map(|tx| tx.send(()));
        }
    }
    let locks2 = locks.clone();
    let result = within(
        Duration::from_secs(5),
        "run ends on loss",
        locks
            .mutex("job")
            .ttl(Duration::from_secs(3))
            .renew_every(Duration::from_millis(100))
            .run(|lease| async move {
                let _signal = SignalOnDrop(Some(dropped_tx));
                assert!(lease.is_held());
                locks2.force_release("job").await.unwrap();
                std::future::pending::<()>().await;
            }),
    )
    .await;
    match result {
        Err(Error::LeaseLost {
            reason: LossReason::Gone,
            ..
        }) => {}
        other => panic!("expected LeaseLost(Gone), got {other:?}"),
    }
    within(Duration::from_secs(1), "work dropped", dropped_rx)
        .await
        .unwrap();
}

#[tokio::test]
async fn run_returns_the_output_and_releases() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let fence = locks
        .mutex("job")
        .run(|lease| async move { lease.fence() })
        .await
        .unwrap();
    let info = locks.inspect("job").await.unwrap();
    assert!(info.holder.is_none(), "released after the work");
    assert_eq!(info.last_fence, Some(fence));
}

#[tokio::test]
async fn wait_and_hold_takes_a_fixed_lease_that_can_be_left_to_expire() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let hold = Duration::from_millis(300);
    let guard = locks
        .mutex("once")
        .wait_and_hold(Duration::ZERO, hold)
        .await
        .unwrap();
    // Not renewed: the keeper does not know it.
    assert_eq!(locks.kept_leases(), 0);
    let remaining = locks
        .inspect("once")
        .await
        .unwrap()
        .holder
        .unwrap()
        .remaining
        .unwrap();
    assert!(remaining <= hold, "{remaining:?}");

    // Left to expire: the key stays, so nobody gets the lock before the lease ends in Redis.
    let lease = guard.lease();
    guard.leave_to_expire();
    assert!(!lease.is_held());
    assert!(locks.inspect("once").await.unwrap().holder.is_some());
    let err = locks
        .mutex("once")
        .wait_and_hold(Duration::ZERO, hold)
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err:?}");
    let err = locks
        .mutex("once")
        .wait_and_hold(Duration::from_millis(50), hold)
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    // A bounded wait longer than what is left gets it once Redis expires the key.
    let next = locks
        .mutex("once")
        .wait_and_hold(Duration::from_secs(5), hold)
        .await
        .unwrap();
    assert!(next.fence() > lease.fence());
    next.release().await.unwrap();
}
