//! Fences on one lock: strictly increasing, and never trusted to a sequence's order across connections.

use std::sync::{Arc, Mutex};

use leasehold::{Fence, Lease};

use crate::{client, Db, EVENT};

/// Clients enqueuing on one lock at once, each on connections (PostgreSQL backends) of its own.
const CLIENTS: usize = 6;

/// Grants each of them takes in turn.
const ROUNDS: usize = 30;

pub async fn a_cached_fence_sequence_still_gives_one_holder_and_rising_fences(db: &mut Db) {
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let first = client(&url, &prefix).await;
    if let Db::Postgres(_) = db {
        // Routine tuning of a hot sequence: each backend then draws from a block of 20 numbers of its own, so the
        // sequence's numbers no longer follow the order they were drawn in across backends.
        db.sql(&format!("ALTER SEQUENCE \"{prefix}_fence\" CACHE 20"));
    }
    let mut clients = vec![first];
    for _ in 1..CLIENTS {
        clients.push(client(&url, &prefix).await);
    }
    // The holder's lease until it releases (to tell a second holder from one granted after a loss), and the last fence.
    let last: Arc<Mutex<(Option<Lease>, Option<Fence>)>> = Arc::default();
    let runs: Vec<_> = clients
        .into_iter()
        .map(|c| {
            let last = Arc::clone(&last);
            tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let held = c.mutex("hot").lock_timeout(EVENT).await.unwrap();
                    {
                        let (holder, fence) = &mut *last.lock().unwrap();
                        if let Some(holder) = holder {
                            assert!(
                                !holder.is_held(),
                                "round {round}: two holders, fences {:?} and {:?}",
                                holder.fence(),
                                held.fence()
                            );
                        }
                        if let Some(fence) = fence {
                            assert!(
                                held.fence() > *fence,
                                "round {round}: the fence went from {fence:?} back to {:?}",
                                held.fence()
                            );
                        }
                        (*holder, *fence) = (Some(held.lease()), Some(held.fence()));
                    }
                    tokio::task::yield_now().await;
                    last.lock().unwrap().0 = None;
                    held.release().await.unwrap();
                }
            })
        })
        .collect();
    for run in runs {
        run.await.unwrap();
    }
}
