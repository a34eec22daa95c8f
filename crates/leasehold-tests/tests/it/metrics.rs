//! What leasehold reports through the `metrics` facade: acquisitions, busy answers, timeouts, wait and hold times,
//! renewals, renewal failures and losses by reason.

use std::collections::HashMap;
use std::time::Duration;

use leasehold_tests::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use crate::within;

/// Everything recorded so far (a snapshot drains the recorder, so the totals are kept here).
#[derive(Default)]
struct Totals {
    counters: HashMap<String, u64>,
    histograms: HashMap<String, Vec<f64>>,
}

impl Totals {
    fn absorb(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let mut name = key.name().to_owned();
            for label in key.labels() {
                name.push_str(&format!("{{{}={}}}", label.key(), label.value()));
            }
            match value {
                DebugValue::Counter(n) => *self.counters.entry(name).or_default() += n,
                DebugValue::Histogram(values) => self
                    .histograms
                    .entry(name)
                    .or_default()
                    .extend(values.into_iter().map(f64::from)),
                DebugValue::Gauge(_) => {}
            }
        }
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    fn samples(&self, name: &str) -> &[f64] {
        self.histograms.get(name).map_or(&[], Vec::as_slice)
    }
}

#[test]
fn lock_activity_is_counted_and_timed() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The recorder is local to this thread; a current-thread runtime runs every task (the keeper too) here.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut totals = Totals::default();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let mut server = RedisServer::start();
            let locks = crate::connect(&server).await;
            let other = crate::connect(&server).await;

            let held = locks.mutex("m").try_lock().await.unwrap();
            assert!(other.mutex("m").try_lock().await.unwrap_err().is_busy());
            let err = other
                .mutex("m")
                .lock_timeout(Duration::from_millis(100))
                .await
                .unwrap_err();
            assert!(err.is_timeout(), "{err:?}");
            held.release().await.unwrap();
            totals.absorb(&snapshotter);
            assert_eq!(totals.counter("leasehold_acquisitions_total"), 1);
            assert!(totals.counter("leasehold_busy_total") >= 2);
            assert_eq!(totals.counter("leasehold_acquire_timeouts_total"), 1);
            assert_eq!(totals.samples("leasehold_wait_seconds").len(), 1);
            assert_eq!(totals.samples("leasehold_hold_seconds").len(), 1);

            // A fixed lease that runs out: one loss, reason "expired".
            let short = locks
                .mutex("short")
                .wait_and_hold(Duration::ZERO, Duration::from_millis(50))
                .await
                .unwrap();
            within(Duration::from_secs(2), "the loss", short.lost()).await;
            totals.absorb(&snapshotter);
            assert_eq!(totals.counter("leasehold_losses_total{reason=expired}"), 1);

            // A kept lease: renewals are counted; with the server gone, renewal failures are.
            let kept = locks
                .mutex("kept")
                .ttl(Duration::from_millis(600))
                .renew_every(Duration::from_millis(100))
                .try_lock()
                .await
                .unwrap();
            within(Duration::from_secs(5), "a renewal", async {
                loop {
                    totals.absorb(&snapshotter);
                    if totals.counter("leasehold_renewals_total") > 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            server.kill();
            within(Duration::from_secs(5), "the loss", kept.lost()).await;
            totals.absorb(&snapshotter);
            assert!(totals.counter("leasehold_renewal_failures_total") > 0);
            assert_eq!(totals.counter("leasehold_losses_total{reason=expired}"), 2);
            assert_eq!(totals.counter("leasehold_acquisitions_total"), 3);
            assert!(totals
                .samples("leasehold_hold_seconds")
                .iter()
                .all(|&s| (0.0..10.0).contains(&s)));
        });
    });
}
