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
    // A renewal round is traced by the keeper, under the target it has always had (the file moved).
    let renewed = locks
        .mutex("traced-renewed")
        .ttl(Duration::from_millis(300))
        .try_lock()
        .await
        .unwrap();
    within(Duration::from_secs(2), "a renewal round", async {
        while !captured.text().contains("leasehold::keeper: renewal batch") {
            tokio::task::yield_now().await;
        }
    })
    .await;
    renewed.release().await.unwrap();

    let text = captured.text();
    let has = |needle: &str| text.lines().any(|line| line.contains(needle));
    assert!(
        has(&format!(
            "leasehold::mutex: granted lock=traced hold=exclusive fence={fence}"
        )),
        "{text}"
    );
    assert!(has("leasehold::mutex: busy; waiting lock=traced"), "{text}");
    assert!(
        has(&format!(
            "released lock=traced hold=exclusive fence={fence}"
        )),
        "{text}"
    );
    assert!(has("lease lost lock=traced-short hold=exclusive"), "{text}");
    assert!(
        has("acquire{lock=traced}"),
        "the wait runs in an `acquire` span: {text}"
    );
}

#[tokio::test]
async fn each_kind_traces_under_its_own_target_and_names_its_hold_in_words() {
    let (captured, _default) = crate::capture_traces();

    let server = RedisServer::start();
    let locks = connect(&server).await;
    let permits = locks
        .semaphore("traced-permits", 3)
        .acquire_many(2)
        .await
        .unwrap();
    let fence = permits.fence().get();
    permits.release().await.unwrap();
    let read = locks.rw_lock("traced-rw").read().await.unwrap();
    read.release().await.unwrap();
    let fair = locks.fair_mutex("traced-fair").lock().await.unwrap();
    fair.release().await.unwrap();

    let text = captured.text();
    let has = |needle: &str| text.lines().any(|line| line.contains(needle));
    assert!(
        has(&format!(
            "leasehold::semaphore: granted lock=traced-permits hold=2 permits fence={fence}"
        )),
        "{text}"
    );
    assert!(
        has("acquire{lock=traced-permits hold=2 permits}"),
        "the wait's span names the hold in words: {text}"
    );
    assert!(
        has("leasehold::semaphore: released lock=traced-permits hold=2 permits"),
        "{text}"
    );
    assert!(
        has("leasehold::rw_lock: granted lock=traced-rw hold=read share"),
        "{text}"
    );
    assert!(
        has("leasehold::fair_mutex: granted lock=traced-fair hold=exclusive"),
        "{text}"
    );
}
