//! The guard of one grant: release, extend, and running work until the lease is lost.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{not_a_lock, Client, Inner};
use crate::error::Error;
use crate::keys::{check_ttl, millis, LockKeys};
use crate::lease::{Lease, LossReason};
use crate::scripts::{RELEASE, RENEW, RESERVATION};

/// Proof of holding a lock: one grant, with its fence and lease. Dereferences to its [`Lease`] for
/// [`fence`](Lease::fence), [`is_held`](Lease::is_held), [`lost`](Lease::lost) and the rest.
///
/// Give it back with [`release`](MutexGuard::release), which tells you whether the lock was still yours. Dropping
/// the guard instead releases in the background when a tokio runtime is running, and otherwise leaves the key to
/// expire after its lease; it never blocks and never panics.
#[must_use = "the lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct MutexGuard {
    lease: Lease,
    client: Client,
    /// The keeper's id for this lease, when the watchdog renews it.
    kept: Option<u64>,
    /// Set once Redis confirmed the release (or that the lock was no longer ours): then drop has nothing to do.
    settled: bool,
}

impl MutexGuard {
    pub(crate) fn new(client: Client, lease: Lease, kept: Option<u64>) -> MutexGuard {
        MutexGuard {
            lease,
            client,
            kept,
            settled: false,
        }
    }

    /// A cloneable view of the lease, to hand to tasks that need the fence or the loss signal.
    pub fn lease(&self) -> Lease {
        self.lease.clone()
    }

    /// Releases the lock: one script deletes the key only if this grant still owns it, and wakes the waiters.
    ///
    /// # Errors
    ///
    /// [`Error::NotOwner`] when the lock was no longer ours (the lease lapsed, or it was force-released and maybe
    /// taken since): nothing was changed. [`Error::Redis`] when Redis could not be asked; the release is then
    /// retried in the background, and at worst the key expires after its lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped before the reply, the guard's drop releases in the background.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: dlock::Client) -> Result<(), dlock::Error> {
    /// let guard = locks.mutex("invoices").lock().await?;
    /// // ... the critical section ...
    /// match guard.release().await {
    ///     Ok(()) => {}
    ///     // The lease ended before we let go: whatever we wrote may have raced another owner.
    ///     Err(e) if e.is_lost() => eprintln!("lost the lock before releasing it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<(), Error> {
        self.forget();
        let keys = &self.lease.shared.keys;
        let code = release_once(&self.client.inner, keys, &self.lease.shared.token).await?;
        self.settled = true;
        self.lease.shared.end(LossReason::Released);
        if code == 1 {
            Ok(())
        } else {
            Err(Error::NotOwner {
                name: keys.name().to_owned(),
            })
        }
    }

    /// Moves the lease end to `ttl` from now, if this grant still owns the lock. With the watchdog on, later
    /// renewals go back to the configured lease; use this mainly with [`Mutex::fixed_lease`](crate::Mutex::fixed_lease).
    ///
    /// A lease that already ended cannot be extended back to life: extend never re-acquires.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the lease already ended locally (deadline passed, or lost); [`Error::NotOwner`]
    /// when Redis says the key is gone or held by another owner (the lease then ends); [`Error::InvalidArgument`]
    /// for a TTL out of range; [`Error::Redis`] when Redis could not be asked (the lease is unchanged).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call may or may not have extended the key on the server, but the guard's deadline
    /// only moves on a confirmed reply, so it stays conservative.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: dlock::Client) -> Result<(), dlock::Error> {
    /// use std::time::Duration;
    ///
    /// // A fixed 10 s lease, extended by hand between steps of a long job.
    /// let guard = locks.mutex("migration").ttl(Duration::from_secs(10)).fixed_lease().lock().await?;
    /// for _step in 0..3 {
    ///     // ... one step ...
    ///     guard.extend(Duration::from_secs(10)).await?;
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self, ttl: Duration) -> Result<(), Error> {
        check_ttl(ttl)?;
        let shared = &self.lease.shared;
        if let Some(reason) = self.lease.loss() {
            return Err(Error::LeaseLost {
                name: shared.keys.name().to_owned(),
                reason,
            });
        }
        let mut invocation = RENEW.key(&shared.keys.lock);
        invocation.arg(&shared.token).arg(millis(ttl));
        let sent = Instant::now();
        let codes: Vec<i64> = invocation
            .invoke_async(&mut self.client.inner.conn.clone())
            .await
            .map_err(|e| not_a_lock(e, &shared.keys.lock))?;
        match codes.first() {
            Some(1) => {
                shared.confirm(sent, ttl);
                match self.lease.loss() {
                    None => Ok(()),
                    Some(reason) => Err(Error::LeaseLost {
                        name: shared.keys.name().to_owned(),
                        reason,
                    }),
                }
            }
            code => {
                shared.end(if code == Some(&0) {
                    LossReason::Gone
                } else {
                    LossReason::Taken
                });
                Err(Error::NotOwner {
                    name: shared.keys.name().to_owned(),
                })
            }
        }
    }

    /// Runs `work` while the lease holds, and drops it the moment the lease is lost.
    ///
    /// Dropping only cancels at the work's next `.await`; blocking code inside it runs on.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the lease ended before `work` finished (at the latest at the validity deadline).
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as `work` itself; the guard is unaffected.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn copy_rows(fence: dlock::Fence) -> usize { 0 }
    /// # async fn demo(locks: dlock::Client) -> Result<(), dlock::Error> {
    /// let guard = locks.mutex("export").lock().await?;
    /// let rows = guard.run_until_lost(copy_rows(guard.fence())).await?;
    /// guard.release().await?;
    /// println!("{rows} rows");
    /// # Ok(()) }
    /// ```
    pub async fn run_until_lost<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        let lost = self.lease.lost();
        tokio::select! {
            biased;
            reason = lost => Err(Error::LeaseLost {
                name: self.lease.name().to_owned(),
                reason,
            }),
            output = work => Ok(output),
        }
    }

    fn forget(&mut self) {
        if let Some(id) = self.kept.take() {
            self.client.inner.keeper.forget(id);
        }
    }
}

impl Deref for MutexGuard {
    type Target = Lease;

    fn deref(&self) -> &Lease {
        &self.lease
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        self.forget();
        let shared = &self.lease.shared;
        shared.end(LossReason::Released);
        if !self.settled {
            release_in_background(
                Arc::clone(&self.client.inner),
                Arc::clone(&shared.keys),
                shared.token.clone(),
                shared.ttl,
            );
        }
    }
}

impl fmt::Debug for MutexGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexGuard")
            .field("lease", &self.lease)
            .field("watchdog", &self.kept.is_some())
            .finish()
    }
}

async fn release_once(inner: &Inner, keys: &LockKeys, token: &str) -> Result<i64, Error> {
    RELEASE
        .key(&keys.lock)
        .key(keys.queue())
        .arg(token)
        .arg(inner.wakeups.channel_prefix())
        .arg(millis(RESERVATION))
        .invoke_async(&mut inner.conn.clone())
        .await
        .map_err(|e| not_a_lock(e, &keys.lock))
}

/// Owner-checked release from a drop: spawned on the current tokio runtime if there is one, retried with backoff
/// for at most one lease (after that the key has expired anyway). Without a runtime it does nothing.
pub(crate) fn release_in_background(
    inner: Arc<Inner>,
    keys: Arc<LockKeys>,
    token: String,
    ttl: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let give_up = Instant::now() + ttl;
    runtime.spawn(async move {
        let mut backoff = Duration::from_millis(50);
        loop {
            match release_once(&inner, &keys, &token).await {
                Ok(_) => return,
                Err(err) if Instant::now() + backoff < give_up => {
                    tracing::debug!(lock = %keys.name(), error = %err, "background release failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(err) => {
                    tracing::warn!(lock = %keys.name(), error = %err, "background release gave up; the key expires with its lease");
                    return;
                }
            }
        }
    });
}
