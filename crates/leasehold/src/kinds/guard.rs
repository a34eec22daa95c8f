//! The guard of one grant: release, extend, and running work until the lease is lost.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::redis::batch::{self, Coalescer, Failure, Item};
use crate::backend::redis::conn::{ReplicaAcks, Sent};
use crate::backend::redis::foreign::not_a_lock;
use crate::backend::redis::keys::{millis, LockKeys};
use crate::backend::redis::scripts::{Numbers, ScriptCall, RELEASE, RENEW};
use crate::backend::redis::store::RedisStore;
use crate::client::Client;
use crate::engine::lease::{Lease, LossReason};
use crate::error::{require_runtime, Error};

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::guard=debug`).
const TARGET: &str = "leasehold::guard";

/// The guard of a [`Mutex`](crate::Mutex) grant: a [`Guard`] (the name this crate used before the other kinds came).
pub type MutexGuard = Guard;

/// Proof of holding a lock: one grant of any lock kind (a [`Mutex`](crate::Mutex) or
/// [`FairMutex`](crate::FairMutex) lock, a read or write share of a [`RwLock`](crate::RwLock), permits of a
/// [`Semaphore`](crate::Semaphore)), with its fence and lease. Dereferences to its [`Lease`] for
/// [`fence`](Lease::fence), [`is_held`](Lease::is_held), [`lost`](Lease::lost) and the rest.
///
/// Give it back with [`release`](Guard::release), which tells you whether the lock was still yours. Dropping
/// the guard instead releases in the background when a tokio runtime is running, and otherwise leaves the key to
/// expire after its lease; it never blocks and never panics.
#[must_use = "the lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct Guard {
    lease: Lease,
    client: Client,
    /// The keeper's id for this lease, when the watchdog renews it.
    kept: Option<u64>,
    /// Set once Redis confirmed the release (or that the lock was no longer ours): then drop has nothing to do.
    settled: bool,
    /// For a grant a wait took through an attempt's reply: the token's route, kept until the grant ends so that a
    /// hand-off message still on its way is not mistaken for a grant nobody wants (see `wake.rs`).
    route: Option<u128>,
    /// For a grant on etcd: its key and session, which release it.
    #[cfg(feature = "etcd")]
    etcd: Option<crate::backend::etcd::store::EtcdHold>,
}

impl Guard {
    pub(crate) fn new(
        client: Client,
        lease: Lease,
        kept: Option<u64>,
        route: Option<u128>,
    ) -> Guard {
        Guard {
            lease,
            client,
            kept,
            settled: false,
            route,
            #[cfg(feature = "etcd")]
            etcd: None,
        }
    }

    /// The guard of a grant on etcd: its lease follows the session, which keeps it (no keeper entry).
    #[cfg(feature = "etcd")]
    pub(crate) fn etcd(
        client: Client,
        lease: Lease,
        hold: crate::backend::etcd::store::EtcdHold,
    ) -> Guard {
        Guard {
            lease,
            client,
            kept: None,
            settled: false,
            route: None,
            etcd: Some(hold),
        }
    }

    /// The client the grant was made through.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// A cloneable view of the lease, to hand to tasks that need the fence or the loss signal.
    pub fn lease(&self) -> Lease {
        self.lease.clone()
    }

    /// Lets go of the guard *without* releasing the lock: the watchdog stops renewing it and the key stays in Redis
    /// until its lease runs out there, so nobody (this process included) can take the lock before then. For fixed
    /// leases used as "at most once per interval" ([`Mutex::wait_and_hold`](crate::Mutex::wait_and_hold)). The
    /// lease ends locally at once (clones of the [`Lease`] read as not held, with [`LossReason::Released`]).
    pub fn leave_to_expire(mut self) {
        self.forget();
        self.lease.shared.end(LossReason::Released);
        self.settled = true;
    }

    /// Releases the lock: one script deletes the key only if this grant still owns it, and wakes the waiters.
    ///
    /// The lease ends *before* the request leaves: from the moment this is called, every clone of the [`Lease`]
    /// reads as not held and [`Lease::lost`] resolves with [`LossReason::Released`], so no part of the program can
    /// still act on the lock while the next owner is being granted it.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the lease had already ended before this call (its deadline passed, or a renewal
    /// found the lock gone): the lock was not held continuously, whatever the release then found (it still deletes
    /// the key if it is ours). [`Error::NotOwner`] when Redis says the lock was no longer ours (it expired, was
    /// force-released, or Redis lost it): nothing was changed. [`Error::Redis`] when Redis could not be asked, even
    /// after one retry on a fresh connection; the release is then retried in the background, and at worst the key
    /// expires after its lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped before the reply, the release goes on in the background.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
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
    #[doc(alias = "unlock")]
    pub async fn release(mut self) -> Result<(), Error> {
        // Outside a runtime the guard's drop records the release for the client's drop (see orphans.rs).
        require_runtime()?;
        self.forget();
        let shared = Arc::clone(&self.lease.shared);
        // Ended here, before anything is sent: the script frees the key and wakes the next owner as it runs.
        let earlier_loss = self.lease.loss();
        shared.end(LossReason::Released);
        let name = || shared.keys.name().to_owned();
        #[cfg(feature = "etcd")]
        if let Some(hold) = &self.etcd {
            // A grant of a lost session: etcd deletes its key with the session's lease, nothing to send.
            if let (Some(reason), true) = (earlier_loss, hold.session_lost()) {
                self.settled = true;
                return Err(Error::LeaseLost {
                    name: name(),
                    reason,
                });
            }
            // Kept in the guard until answered: a dropped call leaves the release to the drop.
            let ours = match hold.release().await {
                Ok(ours) => ours,
                // The lease had ended anyway: that is what the caller needs to know (the drop retries the
                // delete in the background).
                Err(_) if earlier_loss.is_some() => {
                    return Err(Error::LeaseLost {
                        name: name(),
                        reason: earlier_loss.unwrap_or(LossReason::Expired),
                    })
                }
                Err(e) => return Err(e),
            };
            self.settled = true;
            crate::engine::trace::kind_event!(crate::engine::trace::kind_of_hold(&shared.token), debug, lock = %shared.keys.name(), hold = %crate::engine::trace::words(&shared.token), fence = shared.fence.get(), ?earlier_loss, still_ours = ours, "released");
            return match (earlier_loss, ours) {
                (Some(reason), _) => Err(Error::LeaseLost {
                    name: name(),
                    reason,
                }),
                (None, true) => Ok(()),
                (None, false) => Err(Error::NotOwner { name: name() }),
            };
        }
        let inner = self.client.redis()?;
        let item = ReleaseItem {
            keys: Arc::clone(&shared.keys),
            token: shared.token.clone(),
        };
        // Coalesced with other tasks' releases when calls are out (batch.rs).
        let reply = batch::run(inner, item).await;
        // From here on, the drop has nothing left to do (on an error it retries in the background).
        self.settled = reply.is_ok();
        let code = match reply {
            Ok(-2) => {
                return Err(not_a_lock(
                    redis::RedisError::from((
                        redis::ErrorKind::Extension,
                        "WRONGTYPE",
                        String::new(),
                    )),
                    &shared.keys.lock,
                ))
            }
            Ok(code) => code,
            Err(failure) => return Err(not_a_lock(failure.err, &shared.keys.lock)),
        };
        crate::engine::trace::kind_event!(crate::engine::trace::kind_of_hold(&shared.token), debug, lock = %shared.keys.name(), hold = %crate::engine::trace::words(&shared.token), fence = shared.fence.get(), ?earlier_loss, still_ours = code == 1, "released");
        match (earlier_loss, code) {
            (Some(reason), _) => Err(Error::LeaseLost {
                name: name(),
                reason,
            }),
            (None, 1) => Ok(()),
            (None, _) => Err(Error::NotOwner { name: name() }),
        }
    }

    /// Moves the lease end to `ttl` from now, if this grant still owns the lock. With the watchdog on, later
    /// renewals go back to the configured lease (a shorter `ttl` makes the next renewal come early); use this mainly
    /// with [`Mutex::fixed_lease`](crate::Mutex::fixed_lease).
    ///
    /// A lease that already ended cannot be extended back to life: extend never re-acquires.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the lease already ended locally (deadline passed, or lost); [`Error::NotOwner`]
    /// when Redis says the key is gone or held by another owner (the lease then ends); [`Error::InvalidArgument`]
    /// for a TTL out of range; [`Error::Redis`] when Redis could not be asked; [`Error::NotReplicated`] when the
    /// client requires replica acknowledgements ([`Builder::replicas`](crate::Builder::replicas)) and too few came.
    /// After an error the extension may or may not have happened on the server, so the deadline assumes the worst: at most `ttl` from the call (when
    /// that is sooner than before), until a later renewal or extension is confirmed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, with the same rule: a dropped call may or may not have extended the key, so a shorter `ttl`
    /// lowers the deadline from the moment the request is sent, and only confirmed replies raise it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
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
        #[cfg(feature = "etcd")]
        if self.etcd.is_some() {
            return Err(Error::Unsupported {
                detail: format!(
                    "extending lock {:?}: on etcd a grant lives as long as the client's session (Builder::session_ttl), kept alive by the client",
                    self.lease.name()
                ),
            });
        }
        let request = self.lease.begin_extension(ttl)?;
        let shared = &self.lease.shared;
        let mut invocation = RENEW.key(&shared.keys.lock);
        invocation.arg(&shared.token).arg(millis(ttl));
        let inner = self.client.redis()?;
        let (reply, _, acked) = inner
            .conn
            .invoke_acked::<Vec<i64>>(&invocation, inner.replicas)
            .await;
        let reply = reply.map_err(|e| not_a_lock(e, &shared.keys.lock))?;
        // The keeper schedules renewals from the deadline: let it look again.
        inner.keeper.nudge();
        // An extension too few replicas acknowledged does not count, as a renewal: the request stays unconfirmed
        // (the deadline assumes the worst of it) until a later acknowledged one.
        if let (Some((acked, required)), [_, 1]) = (
            crate::kinds::mutex::short_of(inner.replicas, acked),
            reply.as_slice(),
        ) {
            return Err(Error::NotReplicated {
                name: shared.keys.name().to_owned(),
                acked,
                required,
            });
        }
        match reply.as_slice() {
            [run, 1] => self.lease.confirmed_extension(request, *run),
            [_, code] => {
                shared.end(crate::engine::lease::loss_reason(*code));
                Err(Error::NotOwner {
                    name: shared.keys.name().to_owned(),
                })
            }
            _ => Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply to a renewal",
            )))),
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
    /// # async fn copy_rows(fence: leasehold::Fence) -> usize { 0 }
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// let guard = locks.mutex("export").lock().await?;
    /// let rows = guard.run_until_lost(copy_rows(guard.fence())).await?;
    /// guard.release().await?;
    /// println!("{rows} rows");
    /// # Ok(()) }
    /// ```
    pub async fn run_until_lost<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        self.lease.run_until_lost(work).await
    }

    /// Ends this guard without releasing its hold, whose ownership passed to another guard (a downgrade): the keeper
    /// stops renewing it and clones of its lease read as released.
    pub(crate) fn converted(mut self) -> (Client, Arc<crate::engine::lease::LeaseShared>) {
        self.forget();
        self.lease.shared.end(LossReason::Released);
        self.settled = true;
        (self.client.clone(), Arc::clone(&self.lease.shared))
    }

    fn forget(&mut self) {
        let Ok(inner) = self.client.redis() else {
            return;
        };
        if let Some(id) = self.kept.take() {
            inner.keeper.forget(id);
        }
        if let Some(route) = self.route.take() {
            inner.wakeups.untake(route);
        }
    }
}

/// The `run` of every lock kind, once it holds `guard`: runs `work` with the grant's [`Lease`], drops it the moment
/// the lease is lost ([`Error::LeaseLost`]), and releases the grant after it ([`Error::NotOwner`] when the release
/// finds it no longer ours: the output is then discarded, since the work ran without the lock for some time).
pub(crate) async fn run_held<F, Fut>(guard: Guard, work: F) -> Result<Fut::Output, Error>
where
    F: FnOnce(Lease) -> Fut,
    Fut: Future,
{
    let output = guard.run_until_lost(work(guard.lease())).await?;
    guard.release().await?;
    Ok(output)
}

impl Deref for Guard {
    type Target = Lease;

    fn deref(&self) -> &Lease {
        &self.lease
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.forget();
        let shared = &self.lease.shared;
        // Ended before the release is even scheduled, as in `release`.
        shared.end(LossReason::Released);
        if self.settled {
            return;
        }
        #[cfg(feature = "etcd")]
        if let Some(hold) = self.etcd.take() {
            hold.release_in_background();
            return;
        }
        if let Ok(inner) = self.client.redis() {
            release_in_background(
                Arc::clone(inner),
                Arc::clone(&shared.keys),
                shared.token.clone(),
                shared.ttl,
            );
        }
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("lease", &self.lease)
            .field("watchdog", &self.kept.is_some())
            .finish()
    }
}

/// The owner-checked release of one token, handing the lock to the next waiting client (see `scripts/release.lua`).
pub(crate) fn release_invocation(
    keys: &LockKeys,
    token: &str,
    channel_prefix: &str,
    fence_retention: Duration,
) -> ScriptCall {
    releases([(keys, token)], channel_prefix, fence_retention)
}

/// The owner-checked releases of `locks` (keys and token each) in one `release.lua` call.
fn releases<'a>(
    locks: impl IntoIterator<Item = (&'a LockKeys, &'a str)> + Clone,
    channel_prefix: &str,
    fence_retention: Duration,
) -> ScriptCall {
    let mut invocation = ScriptCall::new(&RELEASE, 5 * locks.clone().into_iter().count());
    for (keys, _) in locks.clone() {
        add_lock_keys(&mut invocation, keys);
    }
    invocation.arg(channel_prefix).arg(millis(fence_retention));
    for (_, token) in locks {
        invocation.arg(token);
    }
    invocation
}

/// Adds the keys a release touches, in the order `release.lua` and `leave.lua` take them: lock, queue, waiters,
/// released, fence.
pub(crate) fn add_lock_keys(invocation: &mut ScriptCall, keys: &LockKeys) {
    invocation
        .key(&keys.lock)
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.released())
        .key(keys.fence());
}

/// One release, as the coalescer carries it.
pub(crate) struct ReleaseItem {
    keys: Arc<LockKeys>,
    token: String,
}

impl Item for ReleaseItem {
    /// `release.lua`'s code for the lock.
    type Outcome = i64;

    fn coalescer(inner: &RedisStore) -> &Coalescer<Self> {
        &inner.releases
    }

    fn slot(&self) -> u16 {
        self.keys.slot()
    }

    fn script(inner: &RedisStore, items: &[Self]) -> ScriptCall {
        releases(
            items.iter().map(|item| (&*item.keys, item.token.as_str())),
            inner.wakeups.channel_prefix(),
            inner.fence_retention,
        )
    }

    fn acks(_: &RedisStore) -> Option<ReplicaAcks> {
        None // a release needs no acknowledgement: losing it on a failover only lets the lock expire
    }

    fn outcomes(
        items: &[Self],
        (reply, reached, _): Sent<Numbers>,
        _: &RedisStore,
    ) -> Result<Vec<i64>, Failure> {
        match reply {
            Ok(Numbers(codes)) if codes.len() == items.len() => Ok(codes),
            Ok(_) => Err(Failure {
                err: redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "unexpected reply to a release",
                )),
                reached: true,
            }),
            Err(err) => Err(Failure { err, reached }),
        }
    }

    fn orphaned(self, _: &Arc<RedisStore>, _: Option<i64>) {
        // The caller was `release`, whose guard's drop releases again in the background (harmless: idempotent).
    }
}

/// Owner-checked release from a drop: spawned on the current tokio runtime if there is one, retried with backoff
/// for at most one lease (after that the key has expired anyway). Without a runtime, or when the runtime drops the
/// task before it is done (it is shutting down), the release is left to the client's drop (see `orphans.rs`).
pub(crate) fn release_in_background(
    inner: Arc<RedisStore>,
    keys: Arc<LockKeys>,
    token: String,
    ttl: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        inner.orphans.push(keys, token);
        return;
    };
    let give_up = Instant::now() + ttl;
    inner.orphans.started();
    let task = Orphan {
        inner,
        keys,
        token,
        done: false,
    };
    runtime.spawn(async move {
        let mut backoff = crate::engine::backoff::Backoff::new();
        loop {
            let invocation = release_invocation(
                &task.keys,
                &task.token,
                task.inner.wakeups.channel_prefix(),
                task.inner.fence_retention,
            );
            let reply: redis::RedisResult<Numbers> =
                task.inner.conn.invoke_idempotent(&invocation).await;
            match reply {
                Ok(_) => break,
                Err(err) if Instant::now() + backoff.peek() < give_up => {
                    tracing::debug!(target: TARGET, lock = %task.keys.name(), error = %err, "background release failed; retrying");
                    tokio::time::sleep(backoff.next()).await;
                }
                Err(err) => {
                    tracing::warn!(target: TARGET, lock = %task.keys.name(), error = %err, "background release gave up; the key expires with its lease");
                    break;
                }
            }
        }
        task.finish();
    });
}

/// Holds that a request may have left in Redis: released in the background if the request ends without a reply (an
/// error, or its future dropped), forgotten once [`Undo::disarm`] says the reply told what Redis has.
pub(crate) struct Undo {
    inner: Arc<RedisStore>,
    keys: Arc<LockKeys>,
    holds: Vec<String>,
    ttl: Duration,
}

impl Undo {
    pub(crate) fn new(
        inner: &Arc<RedisStore>,
        keys: &Arc<LockKeys>,
        holds: Vec<String>,
        ttl: Duration,
    ) -> Undo {
        Undo {
            inner: Arc::clone(inner),
            keys: Arc::clone(keys),
            holds,
            ttl,
        }
    }

    pub(crate) fn disarm(mut self) {
        self.holds.clear();
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        for hold in self.holds.drain(..) {
            release_in_background(
                Arc::clone(&self.inner),
                Arc::clone(&self.keys),
                hold,
                self.ttl,
            );
        }
    }
}

/// A background release in progress; if its task is dropped unfinished, the release is recorded as an orphan.
struct Orphan {
    inner: Arc<RedisStore>,
    keys: Arc<LockKeys>,
    token: String,
    done: bool,
}

impl Orphan {
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for Orphan {
    fn drop(&mut self) {
        if !self.done {
            self.inner
                .orphans
                .push(Arc::clone(&self.keys), std::mem::take(&mut self.token));
        }
        self.inner.orphans.finished();
    }
}
