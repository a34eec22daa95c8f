//! The stores a lock lives in, one folder each: `redis` (one server, a Redis Cluster, or the primary that Sentinel
//! names), `quorum` (a majority of independent Redis primaries, Redlock) and `etcd` (feature `etcd`). Each depends on
//! the engine, never the other way round.
//!
//! This file is the seam the lock kinds reach a store through, and the only place they do: what a kind asks of a
//! store ([`Handle`], [`Ask`]), and the operations of [`Store`] (the enum in the client), each one `match` that hands
//! the call to the store's own code. The kinds never name a store's modules.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{Client, Store};
use crate::engine::lease::{Lease, LeaseShared, LossReason};
use crate::error::Error;
use crate::kinds::guard::Guard;

/// How many locks [`Client::held_locks`](crate::Client::held_locks) reads at once, on every store.
pub(crate) const HELD_LOCKS_CHUNK: usize = 100;

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod quorum;
pub(crate) mod redis;

/// A lock's checked name: every kind and every store names a lock by it (etcd by its [`name`](LockKeys::name)). It is
/// also Redis's key layout, which is why it lives there.
pub(crate) use self::redis::keys::LockKeys;

/// What a lock handle asks of each grant, whatever its kind: the client it was made from, the lease and how often the
/// keeper renews it (`None`: a fixed lease, never renewed), the holder's description, and whether a wait ends at the
/// first store error instead of riding it out.
#[derive(Clone, Copy)]
pub(crate) struct Handle<'a> {
    pub(crate) client: &'a Client,
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) description: Option<&'a str>,
    pub(crate) fail_fast: bool,
}

impl Handle<'_> {
    /// The lease a grant keeps, and how often it is renewed.
    pub(crate) fn lease(&self) -> (Duration, Option<Duration>) {
        (self.ttl, self.renew_every)
    }
}

/// What one acquisition of a queued kind asks for: its hold's tag (`x`, `r`, `w`, `s<k>`, `e`: see `set.lua`) and the
/// permit count it counts against (semaphores; 0 otherwise).
#[derive(Clone, Debug)]
pub(crate) struct Ask {
    pub(crate) tag: String,
    pub(crate) limit: u64,
}

impl Store {
    /// One try for the mutex `keys` ([`Mutex::try_lock`](crate::Mutex::try_lock)).
    pub(crate) async fn try_lock(
        &self,
        handle: &Handle<'_>,
        keys: Arc<LockKeys>,
    ) -> Result<Guard, Error> {
        match self {
            Store::Redis(_) => redis::acquire::try_lock(handle, keys).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => on_etcd(store, handle, keys, None, etcd::store::Wait::Try).await,
        }
    }

    /// Waits for the mutex `keys` until `deadline` (`None`: as long as it takes).
    pub(crate) async fn lock(
        &self,
        handle: &Handle<'_>,
        keys: Arc<LockKeys>,
        deadline: Option<Instant>,
    ) -> Result<Guard, Error> {
        match self {
            Store::Redis(_) => redis::acquire::lock(handle, keys, deadline).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => {
                on_etcd(
                    store,
                    handle,
                    keys,
                    None,
                    etcd::store::Wait::Until(deadline),
                )
                .await
            }
        }
    }

    /// One try for `ask` on the queued lock `keys`.
    pub(crate) async fn try_acquire(
        &self,
        handle: &Handle<'_>,
        keys: Arc<LockKeys>,
        ask: &Ask,
    ) -> Result<Guard, Error> {
        match self {
            Store::Redis(_) => redis::queued::try_acquire(handle, keys, ask).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => {
                on_etcd(store, handle, keys, Some(ask), etcd::store::Wait::Try).await
            }
        }
    }

    /// Waits for `ask` on the queued lock `keys` until `deadline` (`None`: as long as it takes).
    pub(crate) async fn acquire(
        &self,
        handle: &Handle<'_>,
        keys: Arc<LockKeys>,
        ask: &Ask,
        deadline: Option<Instant>,
    ) -> Result<Guard, Error> {
        match self {
            Store::Redis(_) => redis::queued::wait(handle, keys, ask, deadline).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => {
                on_etcd(
                    store,
                    handle,
                    keys,
                    Some(ask),
                    etcd::store::Wait::Until(deadline),
                )
                .await
            }
        }
    }

    /// Turns the live write grant `guard` of the read-write lock `keys` into a read share keeping `lease`
    /// ([`WriteGuard::downgrade`](crate::WriteGuard::downgrade)). Refused before anything changes on a store that
    /// cannot (the write grant is then released as the guard drops).
    pub(crate) async fn downgrade(
        &self,
        guard: Guard,
        keys: Arc<LockKeys>,
        lease: (Duration, Option<Duration>),
    ) -> Result<Guard, Error> {
        match self {
            Store::Redis(_) => redis::kinds::downgrade(guard, keys, lease).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => Err(not_on_etcd(
                "an atomic downgrade (one key per grant, ordered by creation)",
                keys.name(),
            )),
        }
    }

    /// A nested hold of the reentrant mutex `keys` by the token of a hold of its group
    /// ([`ReentrantMutex::lock_as`](crate::ReentrantMutex::lock_as)).
    pub(crate) async fn lock_as(
        &self,
        handle: &Handle<'_>,
        keys: Arc<LockKeys>,
        token: &str,
    ) -> Result<Guard, Error> {
        match self {
            Store::Redis(inner) => redis::kinds::lock_as(inner, handle, keys, token).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => Err(not_on_etcd(
                "a nested hold by token (`lock_as`)",
                keys.name(),
            )),
        }
    }

    /// Stores `permits` as the capacity of the semaphore `keys` ([`Semaphore::set_permits`](crate::Semaphore::set_permits)).
    pub(crate) async fn set_permits(
        &self,
        keys: &LockKeys,
        permits: u64,
    ) -> Result<Option<u64>, Error> {
        match self {
            Store::Redis(inner) => redis::kinds::set_permits(inner, keys, permits).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => Err(not_on_etcd(
                "a stored permit count (each holder's key carries the count it was granted under)",
                keys.name(),
            )),
        }
    }

    /// Releases a guard's grant `shared`, whose lease has just ended ([`Guard::release`]); `settled` is set once the
    /// store answered. A guard of an etcd grant releases its key itself and never comes here.
    pub(crate) async fn release(
        &self,
        shared: &LeaseShared,
        earlier_loss: Option<LossReason>,
        settled: &mut bool,
    ) -> Result<(), Error> {
        redis::release::release(self.redis()?, shared, earlier_loss, settled).await
    }

    /// Moves `lease`'s end to `ttl` from now ([`Guard::extend`]). Etcd refuses it before this.
    pub(crate) async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<(), Error> {
        redis::release::extend(self.redis()?, lease, ttl).await
    }

    /// Lets go of a guard's keeper entry and hand-off route (an etcd grant has neither: its lease follows the session).
    pub(crate) fn forget(&self, kept: &mut Option<u64>, route: &mut Option<u128>) {
        let Ok(inner) = self.redis() else {
            return;
        };
        redis::release::forget(inner, kept, route);
    }

    /// Releases, in the background, the grant of a guard dropped unreleased. A guard of an etcd grant releases its
    /// key itself and never comes here.
    pub(crate) fn release_dropped(&self, shared: &LeaseShared) {
        if let Ok(inner) = self.redis() {
            redis::release::release_in_background(
                Arc::clone(inner),
                Arc::clone(&shared.keys),
                shared.token.clone(),
                shared.ttl,
            );
        }
    }
}

/// The refusal of `what` on the lock `name` by etcd.
#[cfg(feature = "etcd")]
fn not_on_etcd(what: &str, name: &str) -> Error {
    Error::Unsupported {
        detail: format!("lock {name:?}: {what} is not available on etcd"),
    }
}

/// An acquisition on etcd: a mutex's (no `ask`) is an exclusive waiter key whose value is the token; a queued kind's a
/// waiter key of the kind its `ask` maps to, whose value is the hold (`<tag> <token>`, as on Redis).
#[cfg(feature = "etcd")]
async fn on_etcd(
    store: &etcd::store::EtcdStore,
    handle: &Handle<'_>,
    keys: Arc<LockKeys>,
    ask: Option<&Ask>,
    wait: etcd::store::Wait,
) -> Result<Guard, Error> {
    if handle.renew_every.is_none() {
        return Err(etcd::store::no_fixed_lease(keys.name()));
    }
    let token = crate::fence::new_token(handle.description)?;
    let (kind, hold) = match ask {
        None => (etcd::Kind::Exclusive, token),
        Some(ask) => (
            etcd::store::kind_of_tag(&ask.tag, ask.limit, keys.name())?,
            format!("{} {token}", ask.tag),
        ),
    };
    store
        .acquire(handle.client, keys, kind, hold, wait, handle.fail_fast)
        .await
}
