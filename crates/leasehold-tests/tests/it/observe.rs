//! What leasehold tells a `tracing` subscriber: a lock, its wait, its release and a loss, with the lock's name and
//! fence as fields.

use std::time::Duration;

use leasehold_tests::RedisServer;

use crate::{connect, within};

#[tokio::test]
async fn grants_waits_releases_and_losses_are_traced_with_name_and_fence() {
    let (captured, _default) = crate::capture_traces();

    let server = RedisServer::start();
    let locks = connect(&server).await;
    let guard = locks.mutex("traced").try_lock().await.unwrap();
    let fence = guard.fence().get();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.mutex("traced").lock().await.map(drop) })
    };
    within(Duration::from_secs(5), "queued", async {
        while locks.inspect("traced").await.unwrap().waiting_clients == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    guard.release().await.unwrap();
    within(Duration::from_secs(5), "waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    let short = locks
        .mutex("traced-short")
        .ttl(Duration::from_millis(50))
        .fixed_lease()
        .try_lock()
        .await
        .unwrap();
    within(Duration::from_secs(2), "loss", short.lost()).await;

    let text = captured.text();
    let has = |needle: &str| text.lines().any(|line| line.contains(needle));
    assert!(has(&format!("granted lock=traced fence={fence}")), "{text}");
    assert!(has("busy; waiting lock=traced"), "{text}");
    assert!(
        has(&format!("released lock=traced fence={fence}")),
        "{text}"
    );
    assert!(has("lease lost lock=traced-short"), "{text}");
    assert!(
        has("acquire{lock=traced}"),
        "the wait runs in an `acquire` span: {text}"
    );
}
