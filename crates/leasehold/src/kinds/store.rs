//! The seam the lock kinds reach a store through, and the only place they do: what a kind asks of a store
//! ([`Handle`](crate::backend::Handle) and [`Ask`](crate::backend::Ask), below the stores), the client's acquisitions
//! and the operations of [`Store`] (the enum in the client), each one `match` that hands the call to the store's own
//! code and makes the guard of the grant that comes back. The other kinds never name a store's
//! modules. It sits above `backend/`: the session stores return a grant (a lease and their hold), and this file makes
//! the guard of it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

#[cfg(feature = "etcd")]
use crate::backend::etcd;
use crate::backend::redis;
#[cfg(session_stores)]
use crate::backend::session::wait::{Terms, Wait};
#[cfg(sql_stores)]
use crate::backend::sql;
#[cfg(feature = "zookeeper")]
use crate::backend::zookeeper;
#[cfg(session_stores)]
use crate::backend::{admission, session};
use crate::backend::{Ask, Handle, LockKeys};
use crate::capability::Capability;
#[cfg(session_stores)]
use crate::capability::{refusal, StoreKind};
use crate::client::{Client, Store};
use crate::engine::lease::{Lease, LeaseShared, LossReason};
use crate::error::Error;
use crate::kinds::guard::Guard;

impl Client {
    /// One try for the mutex `keys` ([`Mutex::try_lock`](crate::Mutex::try_lock)).
    pub(crate) async fn try_lock(
        &self,
        handle: &Handle<'_>,
        keys: Arc<LockKeys>,
    ) -> Result<Guard, Error> {
        match &self.store {
            Store::Redis(inner) => redis::acquire::try_lock(inner, handle, keys)
                .await
                .map(|grant| self.redis_guard(grant)),
            #[cfg(session_stores)]
            _ => on_session_store(self, handle, keys, None, Wait::Try).await,
        }
    }

    /// Waits for the mutex `keys` until `deadline` (`None`: as long as it takes).
    pub(crate) async fn lock(
        &self,
        handle: &Handle<'_>,
        keys: Arc<LockKeys>,
        deadline: Option<Instant>,
    ) -> Result<Guard, Error> {
        match &self.store {
            Store::Redis(inner) => redis::acquire::lock(inner, handle, keys, deadline)
                .await
                .map(|grant| self.redis_guard(grant)),
            #[cfg(session_stores)]
            _ => on_session_store(self, handle, keys, None, Wait::Until(deadline)).await,
        }
    }

    /// One try for `ask` on the queued lock `keys`.
    pub(crate) async fn try_acquire(
        &self,
        handle: &Handle<'_>,
        keys: Arc<LockKeys>,
        ask: &Ask,
    ) -> Result<Guard, Error> {
        match &self.store {
            Store::Redis(inner) => redis::queued::try_acquire(inner, handle, keys, ask)
                .await
                .map(|grant| self.redis_guard(grant)),
            #[cfg(session_stores)]
            _ => on_session_store(self, handle, keys, Some(ask), Wait::Try).await,
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
        match &self.store {
            Store::Redis(inner) => redis::queued::wait(inner, handle, keys, ask, deadline)
                .await
                .map(|grant| self.redis_guard(grant)),
            #[cfg(session_stores)]
            _ => on_session_store(self, handle, keys, Some(ask), Wait::Until(deadline)).await,
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
        self.store.require(Capability::NestedHold, keys.name())?;
        match &self.store {
            Store::Redis(inner) => redis::kinds::lock_as(inner, handle, keys, token)
                .await
                .map(|grant| self.redis_guard(grant)),
            #[cfg(session_stores)]
            _ => Err(refusal(
                Capability::NestedHold,
                self.store.kind(),
                Some(keys.name()),
                None,
            )),
        }
    }

    /// The guard of a Redis grant.
    fn redis_guard(&self, grant: redis::grant::Grant) -> Guard {
        let hold = StoreHold::Redis {
            kept: grant.kept,
            route: grant.route,
        };
        Guard::new(self.clone(), grant.lease, hold)
    }
}

impl Store {
    /// Turns the live write grant `guard` of the read-write lock `keys` into a read share keeping `lease`
    /// ([`WriteGuard::downgrade`](crate::WriteGuard::downgrade), which refuses it first on a store without
    /// [`Capability::Downgrade`]).
    pub(crate) async fn downgrade(
        &self,
        guard: Guard,
        keys: Arc<LockKeys>,
        lease: (Duration, Option<Duration>),
    ) -> Result<Guard, Error> {
        match self {
            Store::Redis(inner) => {
                let fence = guard.fence();
                let (client, shared) = guard.converted();
                let grant = redis::kinds::downgrade(inner, shared, fence, keys, lease).await?;
                Ok(client.redis_guard(grant))
            }
            #[cfg(session_stores)]
            _ => Err(refusal(
                Capability::Downgrade,
                self.kind(),
                Some(keys.name()),
                None,
            )),
        }
    }

    /// Stores `permits` as the capacity of the semaphore `keys` ([`Semaphore::set_permits`](crate::Semaphore::set_permits)).
    pub(crate) async fn set_permits(
        &self,
        keys: &LockKeys,
        permits: u64,
    ) -> Result<Option<u64>, Error> {
        self.require(Capability::StoredPermits, keys.name())?;
        match self {
            Store::Redis(inner) => redis::kinds::set_permits(inner, keys, permits).await,
            #[cfg(session_stores)]
            _ => Err(refusal(
                Capability::StoredPermits,
                self.kind(),
                Some(keys.name()),
                None,
            )),
        }
    }

    /// Releases a guard's grant `shared`, whose lease has just ended ([`Guard::release`]); `settled` is set once the
    /// store answered. A guard of a grant on a store with sessions releases it itself and never comes here.
    pub(crate) async fn release(
        &self,
        shared: &LeaseShared,
        earlier_loss: Option<LossReason>,
        settled: &mut bool,
    ) -> Result<(), Error> {
        redis::release::release(self.redis()?, shared, earlier_loss, settled).await
    }

    /// Moves `lease`'s end to `ttl` from now ([`Guard::extend`]). The stores with sessions refuse it before this.
    pub(crate) async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<(), Error> {
        redis::release::extend(self.redis()?, lease, ttl).await
    }

    /// Lets go of a guard's keeper entry and hand-off route (a grant on a store with sessions has neither: its lease follows the session).
    pub(crate) fn forget(&self, kept: &mut Option<u64>, route: &mut Option<u128>) {
        let Ok(inner) = self.redis() else {
            return;
        };
        redis::release::forget(inner, kept, route);
    }

    /// Releases, in the background, the grant of a guard dropped unreleased. A guard of a grant on a store with
    /// sessions releases it itself and never comes here.
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

/// The kind a queued kind's tag asks for on a store with sessions (`x`, `r`, `w`, `s<k>`, `e`; see `set.lua`), with
/// `permits` the semaphore's count; an error for what its recipe cannot do (the refusal of the capability it lacks).
#[cfg(session_stores)]
fn kind_of_tag(
    store: StoreKind,
    tag: &str,
    permits: u64,
    name: &str,
) -> Result<admission::Kind, Error> {
    use admission::Kind;
    match tag {
        "x" | "w" | "e" => Ok(Kind::Exclusive),
        "r" => Ok(Kind::Shared),
        "s1" => u32::try_from(permits)
            .ok()
            .and_then(std::num::NonZeroU32::new)
            .map(Kind::Permits)
            .ok_or_else(|| Error::Unsupported {
                detail: format!(
                    "lock {name:?}: a semaphore of more than {} permits is not available on {}",
                    u32::MAX,
                    store.label()
                ),
            }),
        tag if tag.starts_with('s') => Err(refusal(
            Capability::SeveralPermitsAtOnce,
            store,
            Some(name),
            None,
        )),
        _ => Err(refusal(Capability::NestedHold, store, Some(name), None)),
    }
}

/// An acquisition on a store with sessions: a mutex's (no `ask`) is an exclusive entry whose value is the token; a
/// queued kind's an entry of the kind its `ask` maps to, whose value is the hold (`<tag> <token>`, as on Redis).
#[cfg(session_stores)]
async fn on_session_store(
    client: &Client,
    handle: &Handle<'_>,
    keys: Arc<LockKeys>,
    ask: Option<&Ask>,
    wait: Wait,
) -> Result<Guard, Error> {
    let store = &client.store;
    if handle.renew_every.is_none() {
        store.require(Capability::FixedLease, keys.name())?;
    }
    let token = crate::fence::new_token(handle.description)?;
    let (kind, hold) = match ask {
        None => (admission::Kind::Exclusive, token),
        Some(ask) => (
            kind_of_tag(store.kind(), &ask.tag, ask.limit, keys.name())?,
            format!("{} {token}", ask.tag),
        ),
    };
    // The lock's TTL chooses the session its grant lives under (`sessions.rs`).
    let terms = Terms {
        ttl: handle.ttl,
        wait,
        fail_fast: handle.fail_fast,
    };
    let (lease, hold) = match store {
        #[cfg(feature = "etcd")]
        Store::Etcd(etcd) => {
            let granted = etcd.acquire(keys, kind, hold, terms).await?;
            (granted.lease, SessionHold::Etcd(granted.hold))
        }
        #[cfg(feature = "zookeeper")]
        Store::ZooKeeper(zk) => {
            let granted = zk.acquire(keys, kind, hold, terms).await?;
            (granted.lease, SessionHold::ZooKeeper(granted.hold))
        }
        #[cfg(sql_stores)]
        Store::Sql(sql) => {
            let granted = sql.acquire(keys, kind, hold, terms).await?;
            (granted.lease, SessionHold::Sql(granted.hold))
        }
        Store::Redis(_) => {
            return Err(Error::Unsupported {
                detail: format!("lock {:?}: Redis has no session", keys.name()),
            })
        }
    };
    Ok(Guard::new(client.clone(), lease, StoreHold::Session(hold)))
}

/// What a guard holds in its store, to keep and release its grant: one variant per kind of store.
pub(crate) enum StoreHold {
    /// A Redis grant: the keeper's id for its lease, when the keeper renews it, and, for a grant a wait took through an
    /// attempt's reply, the token's route, kept until the grant ends so that a hand-off message still on its way is
    /// not mistaken for a grant nobody wants (see `wake.rs`).
    Redis {
        kept: Option<u64>,
        route: Option<u128>,
    },
    /// A grant on a store with sessions (etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB): its entry and session, which
    /// release it. Without those stores, never made (and `SessionHold` has no variants).
    #[cfg_attr(not(session_stores), allow(dead_code))]
    Session(SessionHold),
    /// What a dropped guard's session hold leaves behind once taken to be released in the background.
    Dropped,
}

/// What a guard of a grant on a store with sessions holds to release it: the session its entry lives in, and the
/// grant. Without those stores, an enum without variants (a guard never has one).
pub(crate) enum SessionHold {
    #[cfg(feature = "etcd")]
    Etcd(session::Hold<etcd::store::Etcd>),
    #[cfg(feature = "zookeeper")]
    ZooKeeper(session::Hold<zookeeper::store::ZooKeeper>),
    #[cfg(sql_stores)]
    Sql(session::Hold<sql::store::Sql>),
}

impl SessionHold {
    /// Whether the session the grant's entry lives in is lost (its entry is gone, or goes with the session).
    pub(crate) fn session_lost(&self) -> bool {
        match *self {
            #[cfg(feature = "etcd")]
            SessionHold::Etcd(ref hold) => hold.session_lost(),
            #[cfg(feature = "zookeeper")]
            SessionHold::ZooKeeper(ref hold) => hold.session_lost(),
            #[cfg(sql_stores)]
            SessionHold::Sql(ref hold) => hold.session_lost(),
        }
    }

    /// Deletes the grant's entry if it is still the grant's: true when it was.
    pub(crate) async fn release(&self) -> Result<bool, Error> {
        match *self {
            #[cfg(feature = "etcd")]
            SessionHold::Etcd(ref hold) => hold.release().await,
            #[cfg(feature = "zookeeper")]
            SessionHold::ZooKeeper(ref hold) => hold.release().await,
            #[cfg(sql_stores)]
            SessionHold::Sql(ref hold) => hold.release().await,
        }
    }

    /// Stores `hold` as the grant's entry's hold if the entry is still the grant's: true when it was.
    #[cfg(session_stores)]
    pub(crate) async fn rewrite(&self, hold: &str) -> Result<bool, Error> {
        match *self {
            #[cfg(feature = "etcd")]
            SessionHold::Etcd(ref held) => held.rewrite(hold).await,
            #[cfg(feature = "zookeeper")]
            SessionHold::ZooKeeper(ref held) => held.rewrite(hold).await,
            #[cfg(sql_stores)]
            SessionHold::Sql(ref held) => held.rewrite(hold).await,
        }
    }

    /// Counts the grant's term in the election's count at `record`, storing `hold` and the count as its hold: the
    /// term's number, or `None` when the entry was gone.
    #[cfg(session_stores)]
    pub(crate) async fn begin_term(&self, record: &str, hold: &str) -> Result<Option<u64>, Error> {
        match *self {
            #[cfg(feature = "etcd")]
            SessionHold::Etcd(ref held) => held.begin_term(record, hold).await,
            #[cfg(feature = "zookeeper")]
            SessionHold::ZooKeeper(ref held) => held.begin_term(record, hold).await,
            #[cfg(sql_stores)]
            SessionHold::Sql(ref held) => held.begin_term(record, hold).await,
        }
    }

    /// Releases in the background (a dropped guard).
    pub(crate) fn release_in_background(self) {
        match self {
            #[cfg(feature = "etcd")]
            SessionHold::Etcd(hold) => hold.release_in_background(),
            #[cfg(feature = "zookeeper")]
            SessionHold::ZooKeeper(hold) => hold.release_in_background(),
            #[cfg(sql_stores)]
            SessionHold::Sql(hold) => hold.release_in_background(),
        }
    }
}

#[cfg(all(test, session_stores))]
mod tests {
    use super::*;

    #[test]
    fn tags_map_to_the_recipes_rules() {
        use admission::Kind;
        let etcd = StoreKind::Etcd;
        assert_eq!(kind_of_tag(etcd, "x", 0, "l").unwrap(), Kind::Exclusive);
        assert_eq!(kind_of_tag(etcd, "r", 0, "l").unwrap(), Kind::Shared);
        assert!(
            matches!(kind_of_tag(etcd, "s1", 3, "l").unwrap(), Kind::Permits(n) if n.get() == 3)
        );
        for (tag, capability) in [
            ("s2", Capability::SeveralPermitsAtOnce),
            ("n", Capability::NestedHold),
        ] {
            match kind_of_tag(StoreKind::ZooKeeper, tag, 3, "l") {
                Err(Error::Unsupported { detail }) => {
                    assert!(
                        detail.contains(capability.describe())
                            && detail.contains("not available on ZooKeeper"),
                        "{detail}"
                    )
                }
                other => panic!("{tag}: {other:?}"),
            }
        }
    }
}
