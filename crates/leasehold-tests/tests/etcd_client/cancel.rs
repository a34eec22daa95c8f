//! Cancel safety at random points: an acquisition dropped anywhere leaves no key that holds or queues.

use std::time::Duration;

use leasehold_tests::{EtcdCluster, XorShift};

use crate::{client, eventually, fresh_prefix, EVENT};

pub async fn acquisitions_dropped_at_random_points_leave_nothing_behind(cluster: &mut EtcdCluster) {
    let seed = leasehold_tests::monotonic_ns();
    println!("seed {seed}");
    let mut rng = XorShift::new(seed);
    let prefix = fresh_prefix();
    let url = cluster.url();
    let (a, b) = (client(&url, &prefix).await, client(&url, &prefix).await);
    for round in 0..40 {
        // Half the rounds the lock is held, so the dropped acquisition is queued; otherwise it may be granted.
        let held = if round % 2 == 0 {
            Some(a.mutex("race").lock().await.unwrap())
        } else {
            None
        };
        let after = Duration::from_micros(rng.below(20_000));
        let mutex = b.mutex("race");
        if let Ok(guard) = tokio::time::timeout(after, mutex.lock()).await {
            drop(guard.unwrap());
        }
        drop(held);
    }
    // Every grant and waiter key is gone once the background releases and clean-ups ran.
    eventually("no holder and no waiter", || async {
        let info = a.inspect("race").await.unwrap();
        info.holder.is_none() && info.waiting_clients == 0
    })
    .await;
    let guard = tokio::time::timeout(EVENT, a.mutex("race").try_lock())
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}
