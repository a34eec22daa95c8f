//! A leader loop: one process at a time does the leader's work; a leader that loses its lease steps down at once
//! (before another can be elected) and goes back to waiting.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p leasehold --example leader -- 3
//! ```
//!
//! The argument is how many terms to serve before exiting (default: forever). Start several copies: exactly one
//! leads at any time. Any store's URL works with its feature on (`etcd://…` with `--features etcd`, `zk://…`,
//! `postgres://…`, `mysql://…`): the lock's 3 s lease is honoured on each (on etcd, ZooKeeper and SQL the client opens
//! a 3 s session for it).

use std::time::Duration;

use leasehold::Error;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let terms: u64 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    let locks = leasehold::Client::connect(&url).await?;
    // A short lease, so a crashed leader is replaced about 3 s after its last renewal, on every store. (ZooKeeper
    // negotiates a session timeout within its bounds: with its default 2 s tick, at least 4 s.)
    let election = locks.mutex("examples:leader").ttl(Duration::from_secs(3));
    for term in 0..terms {
        let guard = election.lock().await?;
        println!("term {term}: leading with fence {}", guard.fence());
        // The leader's work, dropped the moment the lease is lost.
        let outcome = guard.run_until_lost(lead(guard.lease())).await;
        match outcome {
            Ok(()) => guard.release().await?,
            Err(Error::LeaseLost { reason, .. }) => {
                println!("term {term}: stepped down ({reason})")
            }
            Err(other) => return Err(other),
        }
    }
    Ok(())
}

/// A term of leadership: a few ticks of work, each carrying the fence to whatever it writes.
async fn lead(lease: leasehold::Lease) {
    for tick in 0..3 {
        println!("  tick {tick} as leader (fence {})", lease.fence());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
