//! The surface every lock kind shares: `inspect`, `is_locked`, `force_release`, `run`, the semaphore's tokio-like
//! methods, and the time left on a grant.

use std::time::Duration;

use leasehold::{Error, HoldMode, LockKind};
use leasehold_tests::RedisServer;

use crate::{connect, within};

#[tokio::test]
async fn every_kind_inspects_reports_and_force_releases_itself() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let fair = locks.fair_mutex("fair");
    let rw = locks.rw_lock("rw");
    let sem = locks.semaphore("sem", 2);
    let reentrant = locks.reentrant_mutex("reentrant");
    assert!(!fair.is_locked().await.unwrap());
    assert!(!rw.is_locked().await.unwrap());
    assert!(!sem.is_locked().await.unwrap());
    assert!(!reentrant.is_locked().await.unwrap());

    let held = [
        (
            fair.lock().await.unwrap(),
            LockKind::Fair,
            HoldMode::Exclusive,
        ),
        (
            rw.read().await.unwrap(),
            LockKind::ReadWrite,
            HoldMode::Read,
        ),
        (
            sem.acquire().await.unwrap(),
            LockKind::Semaphore,
            HoldMode::Permits(1),
        ),
    ];
    let root = reentrant.lock().await.unwrap();
    assert!(fair.is_locked().await.unwrap());
    assert!(rw.is_locked().await.unwrap(), "a reader holds it");
    assert!(sem.is_locked().await.unwrap(), "one permit of two is held");
    assert!(reentrant.is_locked().await.unwrap());
    for ((guard, kind, mode), info) in held.iter().zip([
        fair.inspect().await.unwrap(),
        rw.inspect().await.unwrap(),
        sem.inspect().await.unwrap(),
    ]) {
        assert_eq!(info.name, guard.name());
        assert_eq!(info.kind, Some(*kind));
        assert_eq!(info.holders.len(), 1);
        assert_eq!(info.holders[0].mode, *mode);
        assert_eq!(info.holders[0].token, guard.token());
        assert_eq!(info.last_fence, Some(guard.fence()));
    }
    assert_eq!(sem.inspect().await.unwrap().permits, Some(2));
    assert_eq!(
        reentrant.inspect().await.unwrap().kind,
        Some(LockKind::Reentrant)
    );

    let removed = [
        fair.force_release().await.unwrap(),
        rw.force_release().await.unwrap(),
        sem.force_release().await.unwrap(),
    ];
    for ((guard, ..), removed) in held.iter().zip(removed) {
        assert_eq!(removed.as_deref(), Some(guard.token()));
    }
    assert_eq!(
        reentrant.force_release().await.unwrap().as_deref(),
        Some(root.token())
    );
    assert_eq!(fair.force_release().await.unwrap(), None, "free already");
    for free in [
        fair.is_locked().await.unwrap(),
        rw.is_locked().await.unwrap(),
        sem.is_locked().await.unwrap(),
        reentrant.is_locked().await.unwrap(),
    ] {
        assert!(!free);
    }
    for (guard, ..) in held {
        assert!(guard.release().await.unwrap_err().is_lost());
    }
    assert!(root.release().await.unwrap_err().is_lost());
}

#[tokio::test]
async fn run_holds_the_lock_for_the_work_and_releases_it_after() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let fair = locks.fair_mutex("fair");
    let rw = locks.rw_lock("rw");
    let sem = locks.semaphore("sem", 2);
    let reentrant = locks.reentrant_mutex("reentrant");

    let inside = fair
        .run(|lease| {
            let fair = fair.clone();
            async move {
                (
                    lease.is_held(),
                    fair.try_lock().await.unwrap_err().is_busy(),
                )
            }
        })
        .await
        .unwrap();
    assert_eq!(inside, (true, true));
    let readers = rw
        .run_read(|_| {
            let rw = rw.clone();
            async move {
                let other = rw.try_read().await.unwrap();
                let writer_busy = rw.try_write().await.unwrap_err().is_busy();
                other.release().await.unwrap();
                writer_busy
            }
        })
        .await
        .unwrap();
    assert!(readers, "a share held for the work");
    let alone = rw
        .run_write(|_| {
            let rw = rw.clone();
            async move { rw.try_read().await.unwrap_err().is_busy() }
        })
        .await
        .unwrap();
    assert!(alone, "the write lock held for the work");
    let free_inside = sem
        .run(|_| {
            let sem = sem.clone();
            async move { sem.available_permits().await.unwrap() }
        })
        .await
        .unwrap();
    assert_eq!(free_inside, 1, "run takes one permit");
    let nested = reentrant
        .run(|lease| {
            let reentrant = reentrant.clone();
            async move {
                let nested = reentrant.lock_as(lease.token()).await.unwrap();
                nested.release().await.unwrap();
            }
        })
        .await;
    assert!(nested.is_ok());
    for free in [
        fair.is_locked().await.unwrap(),
        rw.is_locked().await.unwrap(),
        sem.is_locked().await.unwrap(),
        reentrant.is_locked().await.unwrap(),
    ] {
        assert!(!free, "released after the work");
    }
}

#[tokio::test]
async fn run_drops_the_work_the_moment_the_lease_is_lost() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_millis(300);
    let fair = locks.fair_mutex("fair").ttl(ttl);
    let rw = locks.rw_lock("rw").ttl(ttl);
    let sem = locks.semaphore("sem", 1).ttl(ttl);
    let reentrant = locks.reentrant_mutex("reentrant").ttl(ttl);
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let work = move |_: leasehold::Lease| {
        let started = started_tx.clone();
        async move {
            started.send(()).unwrap();
            std::future::pending::<()>().await
        }
    };
    let runs = [
        tokio::spawn({
            let (fair, work) = (fair.clone(), work.clone());
            async move { fair.run(work).await }
        }),
        tokio::spawn({
            let (rw, work) = (rw.clone(), work.clone());
            async move { rw.run_write(work).await }
        }),
        tokio::spawn({
            let (sem, work) = (sem.clone(), work.clone());
            async move { sem.run(work).await }
        }),
        tokio::spawn({
            let (reentrant, work) = (reentrant.clone(), work.clone());
            async move { reentrant.run(work).await }
        }),
    ];
    for _ in 0..runs.len() {
        within(
            Duration::from_secs(5),
            "the work started",
            started_rx.recv(),
        )
        .await;
    }
    // An operator takes every lock away: each holder's next renewal finds its hold gone.
    fair.force_release().await.unwrap();
    rw.force_release().await.unwrap();
    sem.force_release().await.unwrap();
    reentrant.force_release().await.unwrap();
    for run in runs {
        let err = within(Duration::from_secs(5), "the work dropped", run)
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn the_semaphore_reads_like_tokio() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let sem = locks.semaphore("pool", 3);
    assert_eq!(
        sem.available_permits().await.unwrap(),
        3,
        "free: the handle's count"
    );
    let one = sem.try_acquire().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 2);
    let two = sem.acquire_many(2).await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    assert!(sem.try_acquire().await.unwrap_err().is_busy());
    assert!(sem.try_acquire_many(2).await.unwrap_err().is_busy());
    let short = Duration::from_millis(50);
    assert!(sem.acquire_timeout(short).await.unwrap_err().is_timeout());
    assert!(sem
        .acquire_many_timeout(2, short)
        .await
        .unwrap_err()
        .is_timeout());
    two.release().await.unwrap();
    let again = sem
        .acquire_many_timeout(2, Duration::from_secs(5))
        .await
        .unwrap();
    // Lowered below what is held: nothing is free until the holders are below it.
    assert_eq!(
        locks.semaphore("pool", 2).set_permits().await.unwrap(),
        Some(3)
    );
    assert_eq!(
        locks
            .semaphore("pool", 2)
            .available_permits()
            .await
            .unwrap(),
        0
    );
    one.release().await.unwrap();
    again.release().await.unwrap();
    let timed = sem.acquire_timeout(Duration::from_secs(5)).await.unwrap();
    timed.release().await.unwrap();
    let bad = locks
        .semaphore("pool", 0)
        .available_permits()
        .await
        .unwrap_err();
    assert!(bad.is_invalid_argument(), "{bad:?}");
    let fair = locks.fair_mutex("ledger").lock().await.unwrap();
    let other = locks
        .semaphore("ledger", 2)
        .available_permits()
        .await
        .unwrap_err();
    assert!(
        matches!(
            other,
            Error::WrongKind {
                found: LockKind::Fair,
                ..
            }
        ),
        "{other:?}"
    );
    fair.release().await.unwrap();
}

#[tokio::test]
async fn the_time_left_on_a_grant_counts_down_and_is_zero_once_it_ended() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_secs(5);
    let guard = locks
        .mutex("m")
        .ttl(ttl)
        .fixed_lease()
        .lock()
        .await
        .unwrap();
    let lease = guard.lease();
    let left = guard.remaining();
    assert!(left > Duration::from_secs(4) && left <= ttl, "{left:?}");
    assert_eq!(
        lease.remaining().saturating_sub(left),
        Duration::ZERO,
        "it only goes down"
    );
    let writer = locks.rw_lock("rw").ttl(ttl).write().await.unwrap();
    let reentrant = locks.reentrant_mutex("r").ttl(ttl).lock().await.unwrap();
    let permit = locks.semaphore("s", 1).ttl(ttl).acquire().await.unwrap();
    for left in [
        writer.remaining(),
        reentrant.remaining(),
        permit.remaining(),
    ] {
        assert!(left > Duration::from_secs(4) && left <= ttl, "{left:?}");
    }
    guard.release().await.unwrap();
    assert_eq!(lease.remaining(), Duration::ZERO, "released");
    let short = locks
        .mutex("short")
        .ttl(Duration::from_millis(100))
        .fixed_lease()
        .lock()
        .await
        .unwrap();
    let lost = short.lease();
    within(
        Duration::from_secs(5),
        "the fixed lease ran out",
        lost.lost(),
    )
    .await;
    assert_eq!(short.remaining(), Duration::ZERO);
    for guard in [writer.into_guard(), permit] {
        guard.release().await.unwrap();
    }
    reentrant.release().await.unwrap();
}
