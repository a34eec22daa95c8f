//! What each store can do: [`Capability`], the one source that [`Client::supports`](crate::Client::supports) answers
//! from, that every refusal ([`Error::Unsupported`]) is decided by, and that the README's table of the stores is
//! rendered from (`stores_table.rs`, test-only, above the stores whose constants it shows). This file imports only
//! `error.rs`, so every layer can ask it.
//!
//! A refusal comes before anything is sent or taken: the operation asks [`Store::require`](crate::client::Store) the
//! same question a program can ask [`Client::supports`](crate::Client::supports) at start-up.

use std::fmt;

use crate::error::Error;

/// Something some store cannot do. Ask a client with [`Client::supports`](crate::Client::supports) (or list them
/// with [`Client::capabilities`](crate::Client::capabilities)) right after it connected, before taking any lock: the
/// operation a capability names is refused with [`Error::Unsupported`] on a client that does not support it, always
/// before anything is taken.
///
/// Every store does everything not listed here (every lock kind, waiting, fences, the loss signal, `inspect`).
/// Whether a store supports a capability is fixed by its kind, except [`ReplicasOnDisk`](Capability::ReplicasOnDisk)
/// on Redis, which depends on the server and is found out when the client connects. Tested on every store by the
/// conformance test `caps::supports_agrees_with_what_the_store_does`.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), leasehold::Error> {
/// use leasehold::Capability;
///
/// let locks = leasehold::Client::connect("etcd://127.0.0.1:2379").await?;
/// if locks.supports(Capability::Downgrade) {
///     let reading = locks.rw_lock("config").write().await?.downgrade().await?;
///     reading.release().await?;
/// } else {
///     // Write, release, then read: another writer may come in between.
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum Capability {
    /// A lease of fixed length, never renewed: [`Mutex::fixed_lease`](crate::Mutex::fixed_lease) and
    /// [`Mutex::wait_and_hold`](crate::Mutex::wait_and_hold). Redis only: elsewhere every grant lives as long as the
    /// client's session.
    FixedLease,
    /// Moving a grant's end by hand: [`Guard::extend`](crate::Guard::extend). Redis only.
    Extend,
    /// Several permits of a semaphore in one grant: [`Semaphore::acquire_many`](crate::Semaphore::acquire_many) (and
    /// its `try_` and `_timeout` forms) of more than one. Redis only: elsewhere one grant is one entry of one permit.
    SeveralPermitsAtOnce,
    /// A permit count stored with the semaphore: [`Semaphore::set_permits`](crate::Semaphore::set_permits). Redis
    /// only: elsewhere each holder's entry carries the count it was granted under.
    StoredPermits,
    /// A write lock turned into a read share in one step: [`WriteGuard::downgrade`](crate::WriteGuard::downgrade).
    /// Redis only.
    Downgrade,
    /// A nested hold by the token of a hold: [`ReentrantMutex::lock_as`](crate::ReentrantMutex::lock_as). Redis only.
    NestedHold,
    /// Grants counted only once replicas acknowledged them: [`Builder::replicas`](crate::Builder::replicas) (Redis's
    /// `WAIT`). Redis only: etcd and ZooKeeper commit every grant to a majority before they answer, and a database's
    /// own replication decides for PostgreSQL and MySQL.
    ReplicaAcks,
    /// Acknowledgements that mean "written to the append-only file":
    /// [`Builder::replicas_on_disk`](crate::Builder::replicas_on_disk) (`WAITAOF`). On Redis 7.2 or later with
    /// `appendonly yes` on every node, which the client reads when it connects (one `INFO`; a user that may not run
    /// `INFO` is taken as without); never on another store.
    ReplicasOnDisk,
    /// Writes to the ensemble committed only while the grant holds: `Guard::zookeeper_write` (feature `zookeeper`).
    /// ZooKeeper only.
    ZooKeeperWrite,
    /// Your PostgreSQL transaction committed only while the grant holds: `Guard::commit_postgres` (feature
    /// `postgres`). PostgreSQL only.
    PostgresTransaction,
    /// Your MySQL or MariaDB transaction committed only while the grant holds: `Guard::commit_mysql` (feature
    /// `mysql`). MySQL and MariaDB only.
    MysqlTransaction,
}

impl Capability {
    /// Every capability, in the order the README's table lists them.
    pub const ALL: &'static [Capability] = &[
        Capability::FixedLease,
        Capability::Extend,
        Capability::SeveralPermitsAtOnce,
        Capability::StoredPermits,
        Capability::Downgrade,
        Capability::NestedHold,
        Capability::ReplicaAcks,
        Capability::ReplicasOnDisk,
        Capability::ZooKeeperWrite,
        Capability::PostgresTransaction,
        Capability::MysqlTransaction,
    ];

    /// What it is, as refusals and the README's table say it ("a fixed lease (`Mutex::fixed_lease`)").
    pub fn describe(self) -> &'static str {
        match self {
            Capability::FixedLease => {
                "a fixed lease (`Mutex::fixed_lease`, `Mutex::wait_and_hold`)"
            }
            Capability::Extend => "extending a grant by hand (`Guard::extend`)",
            Capability::SeveralPermitsAtOnce => {
                "several permits in one grant (`Semaphore::acquire_many` of more than 1)"
            }
            Capability::StoredPermits => "a stored permit count (`Semaphore::set_permits`)",
            Capability::Downgrade => "an atomic downgrade (`WriteGuard::downgrade`)",
            Capability::NestedHold => "a nested hold by token (`ReentrantMutex::lock_as`)",
            Capability::ReplicaAcks => "replica acknowledgements (`Builder::replicas`)",
            Capability::ReplicasOnDisk => {
                "acknowledgements on disk (`Builder::replicas_on_disk`, `WAITAOF`)"
            }
            Capability::ZooKeeperWrite => "a fenced ZooKeeper write (`Guard::zookeeper_write`)",
            Capability::PostgresTransaction => {
                "a fenced PostgreSQL transaction (`Guard::commit_postgres`)"
            }
            Capability::MysqlTransaction => "a fenced MySQL transaction (`Guard::commit_mysql`)",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A store, as the table's columns and [`Client::store_name`](crate::Client::store_name) name them: known for every
/// store whatever the build's features, so that the table and the command can speak of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    Redis,
    Etcd,
    ZooKeeper,
    Postgres,
    MySql,
}

/// Whether a kind of store supports a capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Support {
    Yes,
    /// No, and why not (after "not available on STORE: ").
    No(&'static str),
    /// As the server the client connected to allows: the condition, for the table.
    Server(&'static str),
}

impl StoreKind {
    /// The five, in the table's order.
    pub(crate) const ALL: [StoreKind; 5] = [
        StoreKind::Redis,
        StoreKind::Etcd,
        StoreKind::ZooKeeper,
        StoreKind::Postgres,
        StoreKind::MySql,
    ];

    /// [`Client::store_name`](crate::Client::store_name)'s name for it.
    pub(crate) fn id(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
            StoreKind::Etcd => "etcd",
            StoreKind::ZooKeeper => "zookeeper",
            StoreKind::Postgres => "postgres",
            StoreKind::MySql => "mysql",
        }
    }

    /// The kind whose [`id`](Self::id) is `id`.
    pub(crate) fn of_id(id: &str) -> Option<StoreKind> {
        StoreKind::ALL.into_iter().find(|kind| kind.id() == id)
    }

    /// The store as messages and the table name it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            StoreKind::Redis => "Redis",
            StoreKind::Etcd => "etcd",
            StoreKind::ZooKeeper => "ZooKeeper",
            StoreKind::Postgres => "PostgreSQL",
            StoreKind::MySql => "MySQL/MariaDB",
        }
    }

    /// Whether this kind of store supports `capability`: the one answer every refusal, `Client::supports` and the
    /// README's table come from.
    pub(crate) fn support(self, capability: Capability) -> Support {
        use Capability as C;
        use StoreKind as K;
        let session = self != K::Redis;
        match capability {
            C::FixedLease | C::Extend if session => Support::No(
                "every grant lives as long as the client's session (Builder::session_ttl), kept alive by the client",
            ),
            C::SeveralPermitsAtOnce if session => {
                Support::No("one grant is one entry of one permit: take them one by one")
            }
            C::StoredPermits if session => Support::No(
                "no count is stored: each holder's entry carries the count it was granted under",
            ),
            C::Downgrade if session => Support::No(
                "one entry per grant, ordered by creation: an entry cannot change kind in place",
            ),
            C::NestedHold if session => {
                Support::No("a hold is one entry of one session: there is no token to hold by")
            }
            C::ReplicaAcks | C::ReplicasOnDisk => match self {
                K::Redis if capability == C::ReplicasOnDisk => {
                    Support::Server("Redis 7.2 or later with `appendonly yes` on every node")
                }
                K::Redis => Support::Yes,
                K::Etcd => Support::No(
                    "etcd commits every grant to a majority of its members before it answers",
                ),
                K::ZooKeeper => Support::No(
                    "ZooKeeper commits every write to a majority of the ensemble before it answers",
                ),
                K::Postgres | K::MySql => Support::No(
                    "the database's own replication decides (synchronous replication keeps a grant through a \
                     failover)",
                ),
            },
            C::ZooKeeperWrite if self != K::ZooKeeper => {
                Support::No("it writes to the ZooKeeper ensemble the lock is in")
            }
            C::PostgresTransaction if self != K::Postgres => {
                Support::No("the lock and the transaction must be in one PostgreSQL database")
            }
            C::MysqlTransaction if self != K::MySql => {
                Support::No("the lock and the transaction must be in one MySQL or MariaDB database")
            }
            _ => Support::Yes,
        }
    }
}

/// The refusal of `capability` by `store` (for the lock `lock`, when a lock asked), saying why: `why` for what the
/// server decides, the store's reason otherwise.
pub(crate) fn refusal(
    capability: Capability,
    store: StoreKind,
    lock: Option<&str>,
    why: Option<&str>,
) -> Error {
    let why = match (why, store.support(capability)) {
        (Some(why), _) => why,
        (None, Support::No(why)) => why,
        (None, Support::Server(condition)) => condition,
        (None, Support::Yes) => "",
    };
    let what = capability.describe();
    let label = store.label();
    Error::Unsupported {
        detail: match lock {
            Some(name) => format!("lock {name:?}: {what} is not available on {label}: {why}"),
            None => format!("{what} is not available on {label}: {why}"),
        },
    }
}

/// Not a public interface: whether the store called `store` (as [`Client::store_name`](crate::Client::store_name)
/// names it) supports `capability`, for the command's checks before it connects. `None` for an unknown name, or for
/// what the server decides ([`Capability::ReplicasOnDisk`] on Redis).
#[doc(hidden)]
pub fn store_supports(store: &str, capability: Capability) -> Option<bool> {
    match StoreKind::of_id(store)?.support(capability) {
        Support::Yes => Some(true),
        Support::No(_) => Some(false),
        Support::Server(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_capability_is_listed_once_and_redis_lacks_only_the_other_stores_own() {
        for (i, capability) in Capability::ALL.iter().enumerate() {
            assert!(!Capability::ALL[..i].contains(capability), "{capability:?}");
        }
        for capability in Capability::ALL {
            let redis = StoreKind::Redis.support(*capability);
            let own = [
                Capability::ZooKeeperWrite,
                Capability::PostgresTransaction,
                Capability::MysqlTransaction,
            ];
            assert_eq!(
                matches!(redis, Support::No(_)),
                own.contains(capability),
                "{capability:?}"
            );
        }
        for kind in StoreKind::ALL {
            assert_eq!(StoreKind::of_id(kind.id()), Some(kind));
        }
        assert_eq!(
            store_supports("etcd", Capability::StoredPermits),
            Some(false)
        );
        assert_eq!(store_supports("redis", Capability::ReplicasOnDisk), None);
        assert_eq!(store_supports("memcached", Capability::Extend), None);
    }

    #[test]
    fn a_refusal_names_the_lock_the_capability_the_store_and_why() {
        match refusal(
            Capability::SeveralPermitsAtOnce,
            StoreKind::ZooKeeper,
            Some("pool"),
            None,
        ) {
            Error::Unsupported { detail } => assert_eq!(
                detail,
                "lock \"pool\": several permits in one grant (`Semaphore::acquire_many` of more than 1) is not \
                 available on ZooKeeper: one grant is one entry of one permit: take them one by one"
            ),
            other => panic!("{other:?}"),
        }
    }
}
