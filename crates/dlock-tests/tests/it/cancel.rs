//! Cancel safety: acquire futures dropped at random points leave no lock behind.

use std::time::Duration;

use dlock_tests::RedisServer;
use tokio::time::Instant;

use crate::connect;

/// A small deterministic generator, so a failure can be replayed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_cut_off_at_random_points_leave_no_orphaned_lock() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_secs(30);
    let mut rng = XorShift(0x5eed_1234_abcd_ef01);
    let mut granted_then_dropped = 0;
    let mut cut_off = 0;
    // Rounds until some grant landed after its caller had given up (the case this test is about): grants counted
    // on the server exceed the guards the callers saw.
    for _round in 0..20 {
        let attempts: Vec<_> = (0..300)
            .map(|_| {
                // Few names, so many attempts contend and some are cut off while queued or subscribed.
                let name = format!("cancel:{}", rng.next() % 8);
                let cut = Duration::from_micros(rng.next() % 3000);
                let locks = locks.clone();
                tokio::spawn(async move {
                    let mutex = locks.mutex(&name).ttl(ttl);
                    tokio::time::timeout(cut, mutex.lock()).await
                })
            })
            .collect();
        for attempt in attempts {
            match attempt.await.unwrap() {
                Ok(guard) => {
                    drop(guard.unwrap());
                    granted_then_dropped += 1;
                }
                Err(_) => cut_off += 1,
            }
        }
        if server.command_calls("incr") > granted_then_dropped {
            break;
        }
    }
    assert!(
        server.command_calls("incr") > granted_then_dropped,
        "no grant ever landed after a cut-off; the test proves nothing"
    );

    // Every grant, seen or not, must be released by its background release long before the 30 s lease ends.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut held = Vec::new();
        for i in 0..8 {
            if locks
                .inspect(&format!("cancel:{i}"))
                .await
                .unwrap()
                .holder
                .is_some()
            {
                held.push(i);
            }
        }
        if held.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "orphaned locks {held:?} ({cut_off} cut off, {granted_then_dropped} dropped)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        locks.kept_leases(),
        0,
        "the keeper still renews leases nobody holds"
    );
}
