//! The validity deadline never outruns the server's expiry, whatever requests that shorten the key do, and every
//! bounded call ends on time.

use std::time::Duration;

use leasehold::{Error, LossReason};
use leasehold_tests::RedisServer;
use tokio::time::Instant;

use crate::{patient_conn, pause, within};

async fn client_with_timeout(server: &RedisServer, timeout: Duration) -> leasehold::Client {
    leasehold::Client::builder(&server.url())
        .unwrap()
        .response_timeout(timeout)
        .connect()
        .await
        .unwrap()
}

async fn server_pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut patient_conn(server).await)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_shortening_extend_whose_reply_timed_out_still_lowers_the_deadline() {
    let server = RedisServer::start();
    let locks = client_with_timeout(&server, Duration::from_millis(200)).await;
    let guard = locks
        .mutex("short")
        .ttl(Duration::from_secs(30))
        .fixed_lease()
        .try_lock()
        .await
        .unwrap();
    // Loads the renewal script, so that the request below runs as soon as the server resumes.
    guard.extend(Duration::from_secs(30)).await.unwrap();
    // The extension waits in the paused server past the client's timeout, then runs: the key gets 2 s.
    pause(&server, 500).await;
    let called = Instant::now();
    let err = guard.extend(Duration::from_secs(2)).await.unwrap_err();
    assert!(err.is_redis(), "{err:?}");
    assert!(
        guard.valid_until() <= called + Duration::from_secs(2),
        "the deadline ignores an extension that may have shortened the key: {:?} left",
        guard.valid_until() - Instant::now()
    );
    // It did run: the key now expires within 2 s of the call, and the holder is told no later than that.
    within(Duration::from_secs(2), "the extension ran", async {
        while server_pttl(&server, "leasehold:{short}").await > 2_000 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let reason = within(Duration::from_secs(3), "loss", guard.lost()).await;
    assert_eq!(reason, LossReason::Expired);
    let lost_at = Instant::now();
    assert!(lost_at <= called + Duration::from_secs(2));
    assert!(
        server_pttl(&server, "leasehold:{short}").await > 0,
        "the holder learnt of the loss only after the key was gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_after_a_longer_extend_lowers_the_deadline_while_unconfirmed() {
    let server = RedisServer::start();
    let locks = client_with_timeout(&server, Duration::from_millis(200)).await;
    let ttl = Duration::from_secs(3);
    let guard = locks
        .mutex("back")
        .ttl(ttl)
        .renew_every(Duration::from_secs(1))
        .try_lock()
        .await
        .unwrap();
    guard.extend(Duration::from_secs(60)).await.unwrap();
    let extended = Instant::now();
    assert!(guard.valid_until() > extended + Duration::from_secs(50));
    // The next watchdog renewal (due 1 s after the extension) is sent into a paused server: it will run later and
    // set the key back to 3 s, and until its reply comes the holder must assume it did.
    pause(&server, 3_000).await;
    // Checked while the server is still paused: the renewal (due 1 s after the grant) is out, unconfirmed.
    within(Duration::from_millis(2_000), "renewal sent", async {
        while guard.valid_until() > extended + Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(guard.is_held(), "the lease itself still holds");
    // After the pause the renewals run and are confirmed: the deadline follows the 3 s lease, not the 60 s one.
    within(Duration::from_secs(5), "renewals confirmed", async {
        loop {
            let left = server_pttl(&server, "leasehold:{back}").await;
            if (0..=3_000).contains(&left) && guard.is_held() {
                let local = guard
                    .valid_until()
                    .saturating_duration_since(Instant::now());
                assert!(
                    local <= Duration::from_millis(u64::try_from(left).unwrap() + 50),
                    "local {local:?} > server {left} ms"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    guard.release().await.unwrap();
}

#[tokio::test]
async fn lock_timeout_ends_on_time_against_a_paused_server() {
    let server = RedisServer::start();
    let locks = client_with_timeout(&server, Duration::from_secs(1)).await;
    // Warm up the connection and the scripts.
    crate::lock_and_release(&locks, "warm").await;
    pause(&server, 2_000).await;
    let started = Instant::now();
    let err = locks
        .mutex("paused")
        .lock_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    // A few ms of scheduling on a loaded CI machine, far from the response timeout (1 s) it used to wait out.
    assert!(
        took < Duration::from_millis(250),
        "took {took:?} for a 100 ms bound"
    );
}
