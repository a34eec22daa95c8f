//! The guard of one grant: release, extend, and running work until the lease is lost. What a release or an extension
//! sends is its store's (`backend/redis/release.rs` on Redis; on etcd, ZooKeeper, PostgreSQL and MySQL/MariaDB a grant's
//! entry is deleted through its session).

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::capability::Capability;
use crate::client::Client;
use crate::engine::lease::{Lease, LossReason};
use crate::error::{require_runtime, Error};
#[cfg(any(feature = "zookeeper", sql_stores))]
use crate::kinds::store::SessionHold;
use crate::kinds::store::StoreHold;

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
    /// Set once the store confirmed the release (or that the lock was no longer ours): then drop has nothing to do.
    settled: bool,
    /// What the grant holds in its store, to keep and release it.
    hold: StoreHold,
}

impl Guard {
    /// The guard of a grant made through `client`, keeping `lease`, that holds `hold` in its store.
    pub(crate) fn new(client: Client, lease: Lease, hold: StoreHold) -> Guard {
        Guard {
            lease,
            client,
            settled: false,
            hold,
        }
    }

    /// What a grant on a store with sessions holds to release it.
    #[cfg(sql_stores)]
    pub(crate) fn session_hold(&self) -> Option<&SessionHold> {
        match &self.hold {
            StoreHold::Session(hold) => Some(hold),
            _ => None,
        }
    }

    /// Stores `value` as what this grant publishes (an election's leader, [`crate::Leadership::proclaim`]): in the
    /// grant's own entry on the stores with sessions, in the lock's value key on Redis. False when the grant no
    /// longer holds the lock (nothing was written).
    pub(crate) async fn proclaim(&self, value: &str) -> Result<bool, Error> {
        require_runtime()?;
        let shared = &self.lease.shared;
        match &self.hold {
            #[cfg(session_stores)]
            StoreHold::Session(hold) => {
                hold.rewrite(&crate::fence::with_value(&shared.token, value))
                    .await
            }
            _ => {
                self.client
                    .store
                    .redis()?
                    .proclaim(&shared.keys, &shared.token, shared.fence, value)
                    .await
            }
        }
    }

    /// Counts this grant's term of the election it leads, publishing `value` with the term's number: the election's
    /// term count goes up by one in the same step that checks the grant still holds the lock. The term's number, or
    /// `None` when the grant no longer holds the lock (nothing was written).
    pub(crate) async fn begin_term(&self, value: &str) -> Result<Option<u64>, Error> {
        require_runtime()?;
        let shared = &self.lease.shared;
        match &self.hold {
            #[cfg(session_stores)]
            StoreHold::Session(hold) => {
                let record = self.client.term_record(self.lease.name())?;
                let text = crate::fence::with_value(
                    &shared.token,
                    &format!("{value}{}", crate::fence::VALUE_SEPARATOR),
                );
                hold.begin_term(&record, &text).await
            }
            _ => {
                self.client
                    .store
                    .redis()?
                    .begin_term(&shared.keys, &shared.token, shared.fence, value)
                    .await
            }
        }
    }

    /// On Redis, keeps what this election leader publishes (`published`, its value and term number, as the last
    /// proclamation wrote it) in the lock's value key while the grant lasts: the key, and the election's term count,
    /// live [`fence_retention`](crate::Builder::fence_retention) from their last write, which a term may outlast. A
    /// task proclaims it again every third of that, and ends with the lease. Nothing on the stores with sessions,
    /// whose entries keep it as long as the grant.
    pub(crate) fn keep_published(&self, published: std::sync::Arc<tokio::sync::Mutex<String>>) {
        let Ok(redis) = self.client.store.redis() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let (redis, shared, lease) = (
            std::sync::Arc::clone(redis),
            std::sync::Arc::clone(&self.lease.shared),
            self.lease.clone(),
        );
        let every = redis.fence_retention / 3;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = lease.lost() => return,
                    () = tokio::time::sleep(every) => {}
                }
                // Held across the write, so that a proclamation never lands before an older text.
                let text = published.lock().await;
                match redis
                    .proclaim(&shared.keys, &shared.token, shared.fence, &text)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(err) => {
                        tracing::debug!(target: "leasehold::election", lock = %shared.keys.name(), error = %err, "keeping a leader's value failed; trying again later");
                    }
                }
            }
        });
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
        if let StoreHold::Session(hold) = &self.hold {
            let name = || shared.keys.name().to_owned();
            // A grant of a lost session: its entry goes with the session, nothing to send.
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
        self.client
            .store
            .release(&shared, earlier_loss, &mut self.settled)
            .await
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
    /// client requires replica acknowledgements ([`Builder::replicas`](crate::Builder::replicas)) and too few came;
    /// [`Error::Unsupported`] first, on every store but Redis ([`Capability::Extend`](crate::Capability::Extend)).
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
        self.client
            .store
            .require(Capability::Extend, self.lease.name())?;
        self.client.store.extend(&self.lease, ttl).await
    }

    /// Commits `writes` inside ZooKeeper only while this grant holds there: one transaction that first checks the
    /// grant's node exists, so a holder whose session expired, or whose lock was force-released, is refused by
    /// ZooKeeper itself (feature `zookeeper`). The store's own fenced write, for data that lives in the same
    /// ensemble; the [`fence`](Lease::fence) is for data elsewhere.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] (reason [`LossReason::Gone`]) when the grant's node is gone, or the lease already ended
    /// here; [`Error::Store`] when ZooKeeper refused one of the writes (nothing was committed) or did not answer in
    /// time (it may have committed); [`Error::Unsupported`] on any other store
    /// ([`Capability::ZooKeeperWrite`](crate::Capability::ZooKeeperWrite)).
    ///
    /// # Cancel safety
    ///
    /// The transaction may or may not commit when the future is dropped after it was sent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), leasehold::Error> {
    /// use leasehold::ZkWrite;
    ///
    /// let locks = leasehold::Client::connect("zk://127.0.0.1:2181").await?;
    /// let guard = locks.mutex("config").lock().await?;
    /// guard
    ///     .zookeeper_write(&[ZkWrite::SetData {
    ///         path: "/app/config".to_owned(),
    ///         data: b"v2".to_vec(),
    ///     }])
    ///     .await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "zookeeper")]
    pub async fn zookeeper_write(&self, writes: &[crate::ZkWrite]) -> Result<(), Error> {
        require_runtime()?;
        let name = self.lease.name();
        self.client
            .store
            .require(Capability::ZooKeeperWrite, name)?;
        let StoreHold::Session(SessionHold::ZooKeeper(hold)) = &self.hold else {
            return Err(crate::capability::refusal(
                Capability::ZooKeeperWrite,
                self.client.store.kind(),
                Some(name),
                None,
            ));
        };
        if let Some(reason) = self.lease.loss() {
            return Err(Error::LeaseLost {
                name: name.to_owned(),
                reason,
            });
        }
        hold.write(name, writes).await
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
        if let StoreHold::Redis { kept, route } = &mut self.hold {
            self.client.store.forget(kept, route);
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
        if let StoreHold::Session(_) = self.hold {
            if let StoreHold::Session(hold) = std::mem::replace(&mut self.hold, StoreHold::Dropped)
            {
                hold.release_in_background();
            }
            return;
        }
        self.client.store.release_dropped(shared);
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("lease", &self.lease)
            .field(
                "watchdog",
                &matches!(self.hold, StoreHold::Redis { kept: Some(_), .. }),
            )
            .finish()
    }
}
