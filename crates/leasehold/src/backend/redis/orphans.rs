//! Releases that no runtime could finish: a guard dropped outside a runtime, or a background release whose runtime
//! shut down first (a guard dropped as `main` returns: the runtime ends right after, and drops the release task).
//!
//! Each one is recorded here, and the client does them when it is dropped, over a fresh blocking connection on a
//! helper thread, for at most [`BUDGET`] in all. The ordinary end of a program therefore releases its locks: the
//! guard drops, the release task is dropped with the runtime (recording its lock), the last handle to the client
//! goes, and the client's drop releases what is recorded before `main` finishes returning. Abnormal exits (a
//! signal, `std::process::exit`, an abort) run no drops: those locks lapse after their lease.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::backend::redis::release::release_invocation;
use crate::backend::redis::scripts::Numbers;
use crate::backend::redis::topology::Target;
use crate::engine::keys::LockKeys;

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::orphans=debug`).
const TARGET: &str = "leasehold::orphans";

/// The most a client's drop waits for its outstanding releases.
const BUDGET: Duration = Duration::from_secs(1);

pub(crate) struct Orphans {
    list: Mutex<Vec<(Arc<LockKeys>, String)>>,
    /// Background releases started and not yet finished (answered, given up, or recorded here).
    in_flight: AtomicUsize,
    /// Notified whenever `in_flight` drops.
    settled: Notify,
    target: Target,
    connect_timeout: Duration,
    fence_retention: Duration,
}

impl Orphans {
    pub(crate) fn new(
        target: Target,
        connect_timeout: Duration,
        fence_retention: Duration,
    ) -> Orphans {
        Orphans {
            list: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            settled: Notify::new(),
            target,
            connect_timeout,
            fence_retention,
        }
    }

    /// A background release starts.
    pub(crate) fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A background release ended (answered, given up, or recorded with [`Orphans::push`]).
    pub(crate) fn finished(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.settled.notify_waiters();
    }

    /// Waits until no background release is running. Cancel safe.
    pub(crate) async fn settle(&self) {
        loop {
            // Registered before the count is read, so a release that finishes in between still wakes us.
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            settled.await;
        }
    }

    /// Records a release to do when the client is dropped.
    pub(crate) fn push(&self, keys: Arc<LockKeys>, token: String) {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((keys, token));
    }

    /// Does every recorded release, blocking for at most [`BUDGET`]; whatever is left lapses with its lease.
    pub(crate) fn release_all(&self, channel_prefix: &str) {
        let orphans = std::mem::take(&mut *self.list.lock().unwrap_or_else(|e| e.into_inner()));
        if orphans.is_empty() {
            return;
        }
        let deadline = Instant::now() + BUDGET;
        let target = self.target.clone();
        let connect_timeout = self.connect_timeout.min(BUDGET);
        let channel_prefix = channel_prefix.to_owned();
        let retention = self.fence_retention;
        let (done, finished) = mpsc::channel();
        // A thread of its own: this may run inside a runtime that is shutting down, where nothing async can run.
        let spawned = std::thread::Builder::new()
            .name("leasehold-release".into())
            .spawn(move || {
                let released = release_blocking(
                    &target,
                    connect_timeout,
                    deadline,
                    &orphans,
                    &channel_prefix,
                    retention,
                );
                let _ = done.send(released);
            });
        if spawned.is_err() {
            tracing::warn!(target: TARGET, "no thread for the final releases; the locks lapse with their leases");
            return;
        }
        match finished.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Ok(n)) => {
                tracing::debug!(target: TARGET, released = n, "released the locks left at shutdown")
            }
            Ok(Err(err)) => {
                tracing::warn!(target: TARGET, error = %err, "final releases failed; the locks lapse with their leases")
            }
            Err(_) => {
                tracing::warn!(target: TARGET, "final releases took too long; the rest lapse with their leases")
            }
        }
    }
}

fn release_blocking(
    target: &Target,
    connect_timeout: Duration,
    deadline: Instant,
    orphans: &[(Arc<LockKeys>, String)],
    channel_prefix: &str,
    fence_retention: Duration,
) -> redis::RedisResult<usize> {
    let mut released = 0;
    let followed;
    let target = match target {
        // The primary the sentinels named last.
        Target::Followed(f) => {
            followed = Target::Single(f.client());
            &followed
        }
        other => other,
    };
    match target {
        Target::Single(redis) => {
            let mut con = redis.get_connection_with_timeout(connect_timeout)?;
            for (keys, token) in orphans {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                con.set_read_timeout(Some(left))?;
                con.set_write_timeout(Some(left))?;
                let _: Numbers = release_invocation(keys, token, channel_prefix, fence_retention)
                    .invoke(&mut con)?;
                released += 1;
            }
        }
        Target::Cluster(cluster) => {
            // The blocking cluster connection, with the time left as its timeouts (it routes each release to the
            // lock's node).
            let mut cluster = cluster.clone();
            cluster.connection_timeout = connect_timeout;
            cluster.response_timeout = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let mut con = cluster.client(None)?.get_connection()?;
            for (keys, token) in orphans {
                if Instant::now() >= deadline {
                    break;
                }
                let _: Numbers = release_invocation(keys, token, channel_prefix, fence_retention)
                    .invoke(&mut con)?;
                released += 1;
            }
        }
        // Turned into `Single` above.
        Target::Followed(_) => {}
    }
    Ok(released)
}
