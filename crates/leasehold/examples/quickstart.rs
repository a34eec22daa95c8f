//! The quickstart: take a lock, use its fence, release it; try once; wait a bounded time; run work under a lock.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p leasehold --example quickstart
//! ```
//!
//! Any store's URL works with its feature on (`etcd://…` with `--features etcd`, `zk://…`, `postgres://…`,
//! `mysql://…`), with the same lease.

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), leasehold::Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let locks = leasehold::Client::connect(&url).await?;

    // Wait for the lock; the 30 s lease (the default on every store) is kept alive while the guard lives: renewed every
    // 10 s on Redis, by the keep-alives of the client's 30 s session on the other stores.
    let guard = locks.mutex("examples:orders:42").lock().await?;
    println!("holding orders:42 with fence {}", guard.fence());
    guard.release().await?;

    // Try once, or wait a bounded time.
    match locks.mutex("examples:report").try_lock().await {
        Ok(guard) => guard.release().await?,
        Err(e) if e.is_busy() => println!("someone else is on the report"),
        Err(e) => return Err(e),
    }
    let guard = locks
        .mutex("examples:report")
        .lock_timeout(Duration::from_secs(5))
        .await?;
    drop(guard); // released in the background (and at the latest when `locks` is dropped)

    // Run work under the lock; it is dropped the moment the lease is lost.
    let rows = locks
        .mutex("examples:nightly")
        .run(|lease| async move {
            println!("nightly job under fence {}", lease.fence());
            42
        })
        .await?;
    println!("the nightly job wrote {rows} rows");
    Ok(())
}
