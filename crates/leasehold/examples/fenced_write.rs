//! A fenced write: the store refuses a write whose fence is lower than the highest it has accepted, so a holder that
//! was paused past its lease cannot overwrite the next holder's work.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p leasehold --example fenced_write
//! ```
//!
//! Here the store is a Redis hash written by a script; in SQL it is
//! `UPDATE … SET …, fence = $f WHERE id = $id AND fence <= $f`.

use leasehold::redis;

/// KEYS[1] the record; ARGV[1] the writer's fence; ARGV[2] the new value. Returns 1 when written, 0 when a newer
/// fence has written already.
const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'stock', ARGV[2])
return 1
";

#[tokio::main]
async fn main() -> Result<(), leasehold::Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let locks = leasehold::Client::connect(&url).await?;
    let mut store = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let write = redis::Script::new(FENCED_WRITE);

    // An earlier holder, whose fence we keep to replay its write late.
    let stale = locks.mutex("examples:stock").lock().await?;
    let stale_fence = stale.fence();
    stale.release().await?;

    // The current holder writes with its (higher) fence.
    let current = locks.mutex("examples:stock").lock().await?;
    let written: i64 = write
        .key("examples:stock:sku-1")
        .arg(current.fence().get())
        .arg(99)
        .invoke_async(&mut store)
        .await?;
    println!(
        "current holder (fence {}): written={written}",
        current.fence()
    );

    // The earlier holder wakes up from a pause and tries its write: the store refuses it.
    let late: i64 = write
        .key("examples:stock:sku-1")
        .arg(stale_fence.get())
        .arg(100)
        .invoke_async(&mut store)
        .await?;
    println!("late writer (fence {stale_fence}): written={late}");
    assert_eq!(
        (written, late),
        (1, 0),
        "the fence must refuse the late write"
    );
    current.release().await?;
    Ok(())
}
