//! The client and its settings: `Client` (the handle every lock comes from), `Store` (the store it talks to, the one
//! enum the lock kinds' operations are dispatched on, see `kinds/store.rs`), `Builder` (every setting, and the store
//! chosen by the URL's scheme), and what `Client::inspect` reports (`LockInfo`, `Holder`, `HoldMode`, `LockKind`). Each store's own side lives under `backend/`: Redis's in `backend/redis/store.rs` and
//! `backend/redis/connect.rs`, etcd's in `backend/etcd/store.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::backend::redis::checks::ServerWarning;
use crate::backend::redis::conn::Conn;
use crate::backend::redis::store::RedisStore;
use crate::backend::redis::topology::{Cluster, Endpoint};
use crate::capability::{refusal, Capability, StoreKind, Support};
pub use crate::engine::info::{HoldMode, Holder, LockInfo, LockKind};
use crate::engine::keys::{check_prefix, LockKeys, DEFAULT_PREFIX};
use crate::error::{require_runtime, Error, InvalidArgument};

pub use crate::backend::{
    DEFAULT_CONNECTION_TIMEOUT, DEFAULT_FENCE_RETENTION, DEFAULT_RESPONSE_TIMEOUT,
};

/// A handle to one store for taking locks: a Redis server (or Cluster, or the primary Sentinel names), an etcd
/// cluster, a ZooKeeper ensemble, or a PostgreSQL or MySQL/MariaDB database. Cheap to clone; clones share the
/// connections, the lease keeper and the wake-up subscriber.
///
/// Create one per process (or per store) and keep it: on Redis every client owns one multiplexed command
/// connection, one subscriber connection (opened on the first wait) and one renewal task (started with the first
/// kept lease); on the other stores, its sessions and their keep-alive.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), leasehold::Error> {
/// let locks = leasehold::Client::connect("redis://127.0.0.1:6379").await?;
/// let guard = locks.mutex("orders:42").lock().await?;
/// // ... the critical section, passing guard.fence() to the store ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) store: Store,
}

/// The store a client talks to: the one place the kinds choose a backend (static dispatch, no boxing).
#[derive(Clone)]
pub(crate) enum Store {
    /// One Redis server, a Redis Cluster, or the primary the sentinels name.
    Redis(Arc<RedisStore>),
    /// An etcd cluster.
    #[cfg(feature = "etcd")]
    Etcd(Arc<crate::backend::etcd::store::EtcdStore>),
    /// A ZooKeeper ensemble.
    #[cfg(feature = "zookeeper")]
    ZooKeeper(Arc<crate::backend::zookeeper::store::ZkStore>),
    /// A PostgreSQL, MySQL or MariaDB database.
    #[cfg(sql_stores)]
    Sql(Arc<crate::backend::sql::store::SqlStore>),
}

/// What an election's observer waits on between its reads, where the store has it ([`Client::feed`]).
#[derive(Debug)]
pub(crate) enum Feed {
    /// A watch on the lock's prefix.
    #[cfg(feature = "etcd")]
    Etcd(Box<crate::backend::etcd::store::EtcdFeed>),
    /// One-shot watches on the lock's children and its holder's data.
    #[cfg(feature = "zookeeper")]
    ZooKeeper(crate::backend::zookeeper::store::ZkFeed),
}

impl Feed {
    /// Resolves when the lock may have changed (true), or when the feed ended (false: open another).
    pub(crate) async fn changed(&mut self) -> bool {
        match *self {
            #[cfg(feature = "etcd")]
            Feed::Etcd(ref mut feed) => feed.changed().await,
            #[cfg(feature = "zookeeper")]
            Feed::ZooKeeper(ref mut feed) => feed.changed().await,
        }
    }
}

impl Store {
    /// The Redis side of the store; an error on another store (never reached: the kinds pick the store first). The
    /// operations the kinds dispatch on the store are in `kinds/store.rs`.
    pub(crate) fn redis(&self) -> Result<&Arc<RedisStore>, Error> {
        match self {
            Store::Redis(inner) => Ok(inner),
            #[cfg(session_stores)]
            _ => Err(Error::Unsupported {
                detail: "a Redis operation on a client of another store".to_owned(),
            }),
        }
    }

    /// The kind of store, as the capabilities name it.
    pub(crate) fn kind(&self) -> StoreKind {
        match self {
            Store::Redis(_) => StoreKind::Redis,
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => StoreKind::Etcd,
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(_) => StoreKind::ZooKeeper,
            #[cfg(sql_stores)]
            Store::Sql(sql) => StoreKind::of_id(sql.store.db.name()).unwrap_or(StoreKind::Postgres),
        }
    }

    /// Whether this store supports `capability` ([`Client::supports`]).
    pub(crate) fn supports(&self, capability: Capability) -> bool {
        match (self.kind().support(capability), self) {
            (Support::Yes, _) => true,
            (Support::No(_), _) => false,
            (Support::Server(_), Store::Redis(inner)) => inner.waitaof.is_ok(),
            #[cfg(session_stores)]
            (Support::Server(_), _) => false,
        }
    }

    /// `Err(Unsupported)` unless this store supports `capability`, for the lock `lock`: the check every operation a
    /// capability names makes before it sends or takes anything.
    pub(crate) fn require(&self, capability: Capability, lock: &str) -> Result<(), Error> {
        if self.supports(capability) {
            return Ok(());
        }
        let why = match self {
            Store::Redis(inner) => inner.waitaof.as_ref().err().map(String::as_str),
            #[cfg(session_stores)]
            _ => None,
        };
        Err(refusal(capability, self.kind(), Some(lock), why))
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("store", &self.store_name())
            .field("prefix", &self.prefix())
            .field("kept_leases", &self.kept_leases())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the store at `url` (Redis, etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB) with default settings.
    ///
    /// Accepted URLs, on Redis:
    /// - `redis://[user[:password]@]host[:port][/db]`, one server (`rediss://…` with the `tls` feature);
    /// - `unix:///path/to/socket` or `redis+unix:///path/to/socket`, one server on a Unix socket;
    /// - `redis+cluster://[user[:password]@]host:port,host:port,…`, a Redis Cluster through every seed node you know
    ///   (`rediss+cluster://` for TLS);
    /// - `redis+sentinel://[user[:password]@]host:port,host:port/service[/db]`, the primary that the sentinels name
    ///   for `service`, followed across failovers (`rediss+sentinel://` for TLS; the credentials are the data
    ///   nodes', see [`Builder::sentinel_auth`] for the sentinels' own).
    ///
    /// and, with a store's cargo feature, `etcd://[user:password@]host:port[,host:port…]` (`etcds://` for TLS; feature
    /// `etcd`), `zk://[user:password@]host:port[,host:port…][/chroot]` (feature `zookeeper`),
    /// `postgres://user[:password]@host[:port]/db` or `postgresql://…` (`?sslmode=require` for TLS; feature
    /// `postgres`), and `mysql://…` or `mariadb://…` (feature `mysql`): see the crate docs' section on each store.
    ///
    /// A `redis://` or `rediss://` URL may name one node of a Redis Cluster: the client asks the server (`INFO
    /// cluster`, or `CLUSTER SLOTS` for a Redis user that may not run `INFO`), and for a cluster node it uses the
    /// cluster client with that node as its seed, logged at info level. The connection reconnects by itself after
    /// Redis restarts, and follows a cluster's failovers and slot migrations.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a malformed URL (saying what is wrong and listing the forms above), or a
    /// database other than 0 on a cluster node; [`Error::Connect`] when the server cannot be reached within the
    /// connection timeout, refuses the credentials or the TLS handshake, or does not answer as Redis does (the error
    /// names the URL, password hidden); [`Error::NotPermitted`] when the Redis user lacks a permission leasehold needs, or
    /// the PostgreSQL or MySQL user a right on the lease tables (or, when they are missing, the right to create them).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is left behind.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), leasehold::Error> {
    /// // One endpoint of a managed cluster: recognised as a cluster node when the client connects.
    /// let locks = leasehold::Client::connect("redis://app:secret@redis.internal:6379").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Client, Error> {
        Client::builder(url)?.connect().await
    }

    /// A [`Builder`] for the server at `url`, to change settings before connecting.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a malformed URL; [`InvalidArgument::UnknownScheme`] for a scheme leasehold does
    /// not know, listing those it does and naming the nearest (`postgress://` → `postgres://`; `http://`, as
    /// `etcdctl --endpoints` writes an etcd member, → `etcd://`).
    pub fn builder(url: &str) -> Result<Builder, Error> {
        crate::backend::scheme::check(url)?;
        if url.starts_with("etcd://") || url.starts_with("etcds://") {
            #[cfg(feature = "etcd")]
            {
                crate::backend::etcd::endpoints::parse_url(url)
                    .map_err(|e| InvalidArgument::BadUrl(e.to_string()))?;
                return Ok(Builder::to(Where::Etcd(url.to_owned())));
            }
            #[cfg(not(feature = "etcd"))]
            return Err(InvalidArgument::BadUrl(
                "etcd:// and etcds:// URLs need leasehold's `etcd` feature".to_owned(),
            )
            .into());
        }
        if url.starts_with("zk://") {
            #[cfg(feature = "zookeeper")]
            {
                crate::backend::zookeeper::url::parse_url(url)
                    .map_err(|e| InvalidArgument::BadUrl(e.to_string()))?;
                return Ok(Builder::to(Where::ZooKeeper(url.to_owned())));
            }
            #[cfg(not(feature = "zookeeper"))]
            return Err(InvalidArgument::BadUrl(
                "zk:// URLs need leasehold's `zookeeper` feature".to_owned(),
            )
            .into());
        }
        let sql_schemes = ["postgres://", "postgresql://", "mysql://", "mariadb://"];
        if let Some(scheme) = sql_schemes.iter().find(|s| url.starts_with(**s)) {
            let (feature, compiled) = if scheme.starts_with("postgres") {
                ("postgres", cfg!(feature = "postgres"))
            } else {
                ("mysql", cfg!(feature = "mysql"))
            };
            if !compiled {
                return Err(InvalidArgument::BadUrl(format!(
                    "{scheme} URLs need leasehold's `{feature}` feature"
                ))
                .into());
            }
            #[cfg(sql_stores)]
            return Ok(Builder::to(Where::Sql(url.to_owned())));
        }
        Ok(Builder::with_target(Endpoint::parse(url)?))
    }

    /// A [`Builder`] for the Redis Cluster reached through `seeds`, one URL per node
    /// (`["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]`; `rediss://` with the `tls` feature). Name several:
    /// the client starts as long as one of them answers, and learns the rest of the cluster from it.
    /// [`Client::builder`] takes the same as one URL, `redis+cluster://10.0.0.1:7000,10.0.0.2:7000`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a malformed seed or an empty list.
    pub fn cluster_builder<I, U>(seeds: I) -> Result<Builder, Error>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        Ok(Builder::with_target(Endpoint::Cluster(Cluster::new(
            seeds,
        )?)))
    }

    /// Whether this client talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        match &self.store {
            Store::Redis(inner) => inner.target.is_cluster(),
            #[cfg(session_stores)]
            _ => false,
        }
    }

    /// Which store the client talks to: `"redis"` (one server, a Cluster or Sentinel's primary), `"etcd"`,
    /// `"zookeeper"`, `"postgres"` or `"mysql"` (MySQL or MariaDB).
    pub fn store_name(&self) -> &'static str {
        match &self.store {
            Store::Redis(_) => "redis",
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => "etcd",
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(_) => "zookeeper",
            #[cfg(sql_stores)]
            Store::Sql(sql) => sql.store.db.name(),
        }
    }

    /// Whether this client's store can do `capability`: known once the client connected, and the same answer its
    /// operations go by (one that is not supported is refused with [`Error::Unsupported`] before anything is taken).
    /// Fixed by the store's kind, except [`Capability::ReplicasOnDisk`] on Redis, which `connect` read from the
    /// server; see [`Capability`] for each. Tested on every store by the conformance test
    /// `caps::supports_agrees_with_what_the_store_does`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), leasehold::Error> {
    /// use leasehold::Capability;
    ///
    /// let locks = leasehold::Client::connect("zk://127.0.0.1:2181").await?;
    /// assert!(!locks.supports(Capability::Extend));
    /// assert!(locks.supports(Capability::ZooKeeperWrite));
    /// # Ok(()) }
    /// ```
    pub fn supports(&self, capability: Capability) -> bool {
        self.store.supports(capability)
    }

    /// Every [`Capability`] this client's store supports, in the order of [`Capability::ALL`] (see
    /// [`supports`](Client::supports)).
    pub fn capabilities(&self) -> impl Iterator<Item = Capability> + '_ {
        Capability::ALL
            .iter()
            .copied()
            .filter(|capability| self.supports(*capability))
    }

    /// The Redis side of the client; an error on another store (never reached: the kinds pick the store first).
    pub(crate) fn redis(&self) -> Result<&Arc<RedisStore>, Error> {
        self.store.redis()
    }

    /// Reads the state of the lock called `name` in one atomic step, without changing anything.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name, [`Error::NotALock`] when the key holds something leasehold did not
    /// write, [`Error::Redis`] on connection or server errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self, name: &str) -> Result<LockInfo, Error> {
        require_runtime()?;
        let keys = self.keys(name)?;
        match &self.store {
            Store::Redis(redis) => redis.inspect(&keys, name).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.inspect(keys.name()).await,
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => zk.inspect(keys.name()).await,
            #[cfg(sql_stores)]
            Store::Sql(sql) => sql.inspect(keys.name()).await,
        }
    }

    /// How many terms of the election `name` were counted ([`crate::Leadership::term`]): 0 when none.
    pub(crate) async fn term_count(&self, name: &str) -> Result<u64, Error> {
        require_runtime()?;
        let keys = self.keys(name)?;
        match &self.store {
            Store::Redis(redis) => redis.terms(&keys).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.terms(keys.name()).await,
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => zk.terms(keys.name()).await,
            #[cfg(sql_stores)]
            Store::Sql(sql) => sql.terms(keys.name()).await,
        }
    }

    /// A feed of changes to lock `name`, where the store has one to offer an observer (etcd's watch, ZooKeeper's
    /// watches); `None` on the others, whose observers read at their interval.
    pub(crate) async fn feed(&self, name: &str) -> Option<Feed> {
        let keys = self.keys(name).ok()?;
        match &self.store {
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd
                .feed(keys.name())
                .await
                .map(|f| Feed::Etcd(Box::new(f))),
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => zk.feed(keys.name()).await.map(Feed::ZooKeeper),
            _ => {
                let _ = keys;
                None
            }
        }
    }

    /// Where the count of the election `name`'s terms lives, on a store with sessions.
    #[cfg(session_stores)]
    pub(crate) fn term_record(&self, name: &str) -> Result<String, Error> {
        match &self.store {
            Store::Redis(_) => Err(Error::Unsupported {
                detail: format!("election {name:?}: Redis keeps its count in a key of the lock"),
            }),
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.term_record(name),
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => zk.term_record(name),
            #[cfg(sql_stores)]
            Store::Sql(sql) => sql.term_record(name),
        }
    }

    /// The locks held right now whose names match `pattern`, a Redis glob (`*` for every lock, `orders:*`,
    /// `job-?`, `[ab]*`; `\` escapes), each read as [`inspect`](Client::inspect) reads it, sorted by name. Free
    /// locks are left out.
    ///
    /// Walks the keyspace with `SCAN` (never `KEYS`, which blocks the server), so a lock granted or released during
    /// the walk may or may not be listed; each listed entry is consistent in itself. Keys under this client's
    /// prefix that are not leasehold locks are skipped. On a Redis Cluster every primary is walked (with a cluster
    /// connection of your own, given to [`Builder::connection`], one node only).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] on connection or server errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn held_locks(&self, pattern: &str) -> Result<Vec<LockInfo>, Error> {
        require_runtime()?;
        match &self.store {
            Store::Redis(redis) => redis.held_locks(pattern).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.held_locks(pattern).await,
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => zk.held_locks(pattern).await,
            #[cfg(sql_stores)]
            Store::Sql(sql) => sql.held_locks(pattern).await,
        }
    }

    /// Deletes the lock called `name` whoever holds it, and wakes its waiters. An operator's escape hatch for a
    /// lock whose holder is known to be dead: the holder, if alive, loses its lease at its next renewal.
    ///
    /// Returns the owner token that was removed, or `None` when the lock was free.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name, [`Error::NotALock`] when the key holds something leasehold did not
    /// write (it is left untouched), [`Error::Redis`] on connection or server errors.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a dropped call may still have deleted the lock.
    pub async fn force_release(&self, name: &str) -> Result<Option<String>, Error> {
        require_runtime()?;
        let keys = self.keys(name)?;
        match &self.store {
            Store::Redis(redis) => redis.force_release(&keys).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.force_release(keys.name()).await,
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => zk.force_release(keys.name()).await,
            #[cfg(sql_stores)]
            Store::Sql(sql) => sql.force_release(keys.name()).await,
        }
    }

    /// Waits, at most `timeout`, until every release running in the background has been answered by Redis (or given
    /// up): those of guards that were dropped instead of released, and those of acquires that were abandoned while
    /// their request was out (a grant that may have landed is given back). Returns whether none is left.
    ///
    /// Call it before a program ends its runtime on purpose (a signal handler's exit path, say): a runtime that
    /// shuts down drops these tasks, and what they had not done is then left to the client's drop (one more second
    /// at most, over a fresh connection) or, after an abnormal exit, to the leases' expiry.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn flush_releases(&self, timeout: Duration) -> bool {
        match &self.store {
            Store::Redis(inner) => tokio::time::timeout(timeout, inner.orphans.settle())
                .await
                .is_ok(),
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => tokio::time::timeout(timeout, etcd.settle()).await.is_ok(),
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => tokio::time::timeout(timeout, zk.settle()).await.is_ok(),
            #[cfg(sql_stores)]
            Store::Sql(sql) => tokio::time::timeout(timeout, sql.settle()).await.is_ok(),
        }
    }

    /// Ends the client's work with the store before a program exits, within `timeout`: on etcd, ZooKeeper and the
    /// SQL stores it closes every session of the client, one per lease TTL its locks asked for (etcd's leases
    /// revoked, ZooKeeper's sessions closed, the SQL session rows deleted), which deletes every entry the client still
    /// has at once, the entries of acquisitions that were
    /// given up or dropped included; then it waits for the releases running in the background, as
    /// [`flush_releases`](Self::flush_releases) does. On Redis it is `flush_releases`. Returns whether all of it was
    /// answered in time; what was not is left to the session's expiry (its TTL) or the leases'.
    ///
    /// Every guard of the client still held loses its lease (as [`LossReason::Expired`](crate::LossReason)). The
    /// client stays usable: the next acquisition opens a new session. The `leasehold` command calls it on every way
    /// out, so that a run that gave up waiting leaves nothing behind (tested by `conformance`
    /// `basics::a_waiter_that_gave_up_in_an_exited_process_blocks_nobody`,
    /// `ttl::closing_the_client_closes_the_session_of_every_ttl` and the CLI's
    /// `session_cleanup::a_waiter_that_gave_up_blocks_nobody_and_no_session_stays_on_*`).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the session open (the next acquisition uses a new one) or half closed; its
    /// expiry ends it.
    pub async fn close(&self, timeout: Duration) -> bool {
        let closed = async {
            match &self.store {
                Store::Redis(inner) => {
                    inner.orphans.settle().await;
                    true
                }
                #[cfg(feature = "etcd")]
                Store::Etcd(etcd) => etcd.close().await,
                #[cfg(feature = "zookeeper")]
                Store::ZooKeeper(zk) => zk.close().await,
                #[cfg(sql_stores)]
                Store::Sql(sql) => sql.close().await,
            }
        };
        tokio::time::timeout(timeout, closed).await.unwrap_or(false)
    }

    /// What the client found, when it connected, that weakens the [safety contract](crate#safety-contract) on this
    /// server (each is also logged with `tracing::warn!`): today, a `maxmemory-policy` that may evict a held lock.
    /// Empty when all is well, or when the server would not say (an ACL user without `INFO`).
    pub fn server_warnings(&self) -> &[ServerWarning] {
        match &self.store {
            Store::Redis(inner) => &inner.warnings,
            #[cfg(session_stores)]
            _ => &[],
        }
    }

    /// The key prefix of this client's locks (on etcd, lock `N` lives under `PREFIX/N/`; on ZooKeeper it is the node
    /// `/PREFIX/N`; on PostgreSQL and MySQL/MariaDB it names the lease tables).
    pub fn prefix(&self) -> &str {
        match &self.store {
            Store::Redis(inner) => &inner.prefix,
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => &etcd.store.prefix,
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => &zk.store.prefix,
            #[cfg(sql_stores)]
            Store::Sql(sql) => &sql.store.prefix,
        }
    }

    pub(crate) fn keys(&self, name: &str) -> Result<Arc<LockKeys>, Error> {
        Ok(LockKeys::new(self.prefix(), name)?)
    }

    /// On a Redis Cluster, the per-node pipelines this client has sent for coalesced and renewal calls, the script
    /// calls they carried, and the calls of those kinds sent alone (`None` elsewhere).
    #[doc(hidden)]
    pub fn cluster_pipelines(&self) -> Option<(u64, u64, u64)> {
        self.redis().ok()?.cluster_pipelines()
    }

    /// The lease of a lock that sets no [`ttl`](crate::Mutex::ttl): [`DEFAULT_TTL`](crate::DEFAULT_TTL) (30 s) on
    /// every store, unless [`Builder::session_ttl`] set another on a store with sessions.
    pub(crate) fn default_ttl(&self) -> Duration {
        match &self.store {
            Store::Redis(_) => crate::engine::ttl::DEFAULT_TTL,
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.default_ttl(),
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => zk.default_ttl(),
            #[cfg(sql_stores)]
            Store::Sql(sql) => sql.default_ttl(),
        }
    }

    /// Leases the keeper renews right now (on etcd, ZooKeeper, PostgreSQL and MySQL/MariaDB, the grants that follow
    /// the client's sessions).
    #[doc(hidden)]
    pub fn kept_leases(&self) -> usize {
        match &self.store {
            Store::Redis(inner) => inner.keeper.len(),
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.kept_leases(),
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper(zk) => zk.kept_leases(),
            #[cfg(sql_stores)]
            Store::Sql(sql) => sql.kept_leases(),
        }
    }
}

/// Settings for a [`Client`]. Every setter says its default.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), leasehold::Error> {
/// use std::time::Duration;
///
/// let locks = leasehold::Client::builder("redis://user:secret@redis.internal:6379/0")?
///     .prefix("billing")
///     .response_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `connect` is called"]
pub struct Builder {
    target: Where,
    /// The default lease on a store with sessions, when set ([`Builder::session_ttl`]).
    session_ttl: Option<Duration>,
    conn: Option<Conn>,
    prefix: String,
    connection_timeout: Duration,
    response_timeout: Duration,
    fence_retention: Duration,
    replicas: u32,
    replica_timeout: Option<Duration>,
    on_disk: bool,
    sentinel_auth: Option<(Option<String>, String)>,
    read_only: bool,
    #[cfg(feature = "tls")]
    tls: crate::backend::tls::TlsSettings,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("prefix", &self.prefix)
            .field(
                "cluster",
                &matches!(self.target, Where::Redis(Endpoint::Cluster(_))),
            )
            .field("connection_timeout", &self.connection_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("fence_retention", &self.fence_retention)
            .field("replicas", &self.replicas)
            .field("own_connection", &self.conn.is_some())
            .finish()
    }
}

impl Builder {
    /// Settings for the server `redis` points at. Use this when you already build [`redis::Client`]s (for TLS
    /// certificates, say); [`Client::builder`] parses a URL instead.
    pub fn new(redis: redis::Client) -> Builder {
        Builder::with_target(Endpoint::Single(redis))
    }

    fn with_target(target: Endpoint) -> Builder {
        Builder::to(Where::Redis(target))
    }

    fn to(target: Where) -> Builder {
        Builder {
            target,
            session_ttl: None,
            conn: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            fence_retention: DEFAULT_FENCE_RETENTION,
            replicas: 0,
            replica_timeout: None,
            on_disk: false,
            sentinel_auth: None,
            read_only: false,
            #[cfg(feature = "tls")]
            tls: crate::backend::tls::TlsSettings::default(),
        }
    }

    /// Trusts the CA certificate(s) in `pem` (PEM text, as in a `ca.crt` file) for the server's certificate,
    /// instead of the system's trust store. For `rediss://`, `etcds://` and `postgres://…?sslmode=require` URLs only.
    /// Needs the `tls` feature.
    ///
    /// Checked by [`connect`](Builder::connect): a PEM with no readable certificate, or a URL without TLS, is
    /// [`InvalidArgument::BadTls`].
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Builder {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents this client certificate (chain) and private key, both PEM, for servers that require mutual TLS
    /// (`tls-auth-clients yes`, etcd's `--client-cert-auth`, a PostgreSQL `hostssl … cert` rule). For `rediss://`,
    /// `etcds://` and `postgres://…?sslmode=require` URLs only. Needs the `tls` feature.
    ///
    /// Checked by [`connect`](Builder::connect), as [`tls_ca_pem`](Builder::tls_ca_pem).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_identity_pem(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Builder {
        self.tls.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The default lease of the locks that set no [`ttl`](crate::Mutex::ttl), on etcd, ZooKeeper, PostgreSQL and
    /// MySQL/MariaDB: the TTL of the session their grants live under (a lock that sets its own TTL lives under the
    /// client's session of that TTL, one per distinct TTL: see [`Mutex::ttl`](crate::Mutex::ttl)). 30 s by default ([`DEFAULT_TTL`](crate::DEFAULT_TTL)),
    /// as on Redis. A crashed holder's locks are free this long after its last keep-alive. On etcd, the lease's TTL:
    /// whole seconds, at least 2 s (etcd's shortest lease); the client sends a keep-alive every third of it. On
    /// ZooKeeper, the session timeout asked for: at least 1 s, at most 24 days; the ensemble clamps it to its bounds
    /// (by default 2 to 20 ticks) and the negotiated value counts. On PostgreSQL and MySQL/MariaDB, the session row's
    /// TTL: at least 1 s, renewed every quarter of it. Checked by [`connect`](Builder::connect).
    ///
    /// Not for Redis URLs, where [`connect`](Builder::connect) refuses it ([`InvalidArgument::BadUrl`]): there each
    /// lock's lease is its own [`Mutex::ttl`](crate::Mutex::ttl), 30 s unless set.
    pub fn session_ttl(mut self, ttl: Duration) -> Builder {
        self.session_ttl = Some(ttl);
        self
    }

    /// The namespace of every key and channel: a lock `N` lives at `PREFIX:{N}` on Redis, under `PREFIX/N/` on etcd,
    /// at the node `/PREFIX/N` on ZooKeeper, and in the tables `PREFIX_session`, `PREFIX_lock` and `PREFIX_entry` on
    /// PostgreSQL and MySQL/MariaDB. Non-empty, at most 64 bytes, no braces; on the SQL stores it names tables, so
    /// ASCII letters, digits and `_`, not starting with a digit, at most 40 bytes. Defaults to `leasehold`. A prefix
    /// the store refuses is [`InvalidArgument::BadPrefix`], which states that store's rule.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Builder {
        self.prefix = prefix.into();
        self
    }

    /// Says the client will only read ([`Client::inspect`], [`Client::held_locks`]: the command's `status` and
    /// `list`). On PostgreSQL and MySQL/MariaDB, [`connect`](Builder::connect) then checks only the right to read the
    /// lease tables (`SELECT`) instead of every right a lock needs, so that a reader's user needs no more; a lock or
    /// [`Client::force_release`] made anyway checks the rest first and is refused with [`Error::NotPermitted`] if one
    /// is missing. No effect on the other stores. Defaults to `false`.
    pub fn read_only(mut self, read_only: bool) -> Builder {
        self.read_only = read_only;
        self
    }

    /// How long opening a connection (and each reconnect attempt) may take. Defaults to 2 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Builder {
        self.connection_timeout = timeout;
        self
    }

    /// How long one Redis reply may take before the request fails. Defaults to 1 s. Keep it well below the
    /// renewal interval so a slow reply leaves time for a retry before the lease runs out.
    pub fn response_timeout(mut self, timeout: Duration) -> Builder {
        self.response_timeout = timeout;
        self
    }

    /// How long a lock's fence counter lives after it was seeded, so that one-off lock names (one per order, say)
    /// do not leak memory. After it expires the next grant seeds it again from the server clock (in µs), which
    /// still exceeds every earlier fence unless that clock stepped back. Defaults to 24 h.
    pub fn fence_retention(mut self, retention: Duration) -> Builder {
        self.fence_retention = retention;
        self
    }

    /// Requires every grant and every renewal to be acknowledged by `count` replicas of the lock's primary before it
    /// counts. Each acquire and renewal call is followed, in the same round trip on the same node, by
    /// `WAIT count timeout`. A grant that fewer replicas acknowledge is released and reported as
    /// [`Error::NotReplicated`] (with the count that did); a renewal that fewer acknowledge does not extend the lease,
    /// which then ends at its last acknowledged deadline unless a later renewal is acknowledged (the holder is told
    /// before that deadline, as for any renewal failure). A lock a release hands to this client's waiter is confirmed
    /// by one acknowledged attempt before the waiter starts. Defaults to 0 (no waiting).
    ///
    /// What it buys: a grant acknowledged this way is on `count` replicas when the caller starts, so a failover that
    /// promotes one of them keeps it, and a primary cut off from its replicas (the split-brain case: a paused or
    /// partitioned primary while Sentinel or the cluster promotes another) cannot grant at all. What it does not buy:
    /// `WAIT` is not consensus. The replicas hold the grant in memory, not on disk, a failover may still promote a
    /// replica that did not acknowledge, and a grant that a replica acknowledged after the timeout is released although
    /// it was replicated. See DESIGN.md, "Failover on Redis: what a held lock survives".
    ///
    /// Redis only ([`Capability::ReplicaAcks`]): on another store [`connect`](Builder::connect) refuses a count above 0
    /// with [`Error::Unsupported`].
    pub fn replicas(mut self, count: u32) -> Builder {
        self.replicas = count;
        self
    }

    /// Makes an acknowledgement mean "written to the append-only file": the lock's primary and [`replicas`](
    /// Builder::replicas) of its replicas (0 for the primary alone) fsync every grant and renewal before it counts
    /// (`WAITAOF 1 n timeout` instead of `WAIT n timeout`), so that a restart of the primary, or of the replicas, does
    /// not lose an acknowledged grant. Needs Redis 7.2 or later with `appendonly yes` (and `appendfsync everysec` or
    /// `always`): [`connect`](Builder::connect) checks both and fails with [`Error::Unsupported`] otherwise, as
    /// [`Client::supports`]`(`[`Capability::ReplicasOnDisk`]`)` answers on a client connected without it. Defaults
    /// to off.
    ///
    /// Not exercised by leasehold's own tests beyond that check: the Redis they run (Debian's 7.0.15) has no
    /// `WAITAOF`.
    pub fn replicas_on_disk(mut self, on: bool) -> Builder {
        self.on_disk = on;
        self
    }

    /// How long the server waits for the replicas' acknowledgements ([`Builder::replicas`]) before answering with the
    /// count it has. Must be below the response timeout. Defaults to a quarter of the response timeout.
    pub fn replica_timeout(mut self, timeout: Duration) -> Builder {
        self.replica_timeout = Some(timeout);
        self
    }

    /// The credentials of the sentinels themselves (`requirepass` or an ACL user in their configuration), for a
    /// `redis+sentinel://` URL, whose own credentials are the data nodes'. Without it the sentinels are asked
    /// without credentials.
    ///
    /// Checked by [`connect`](Builder::connect): for a URL that is not `redis+sentinel://`, it is
    /// [`InvalidArgument::BadUrl`].
    pub fn sentinel_auth(mut self, username: Option<&str>, password: &str) -> Builder {
        self.sentinel_auth = Some((username.map(str::to_owned), password.to_owned()));
        self
    }

    /// Sends commands over a connection you already have instead of opening one: a
    /// [`redis::aio::MultiplexedConnection`], a [`redis::aio::ConnectionManager`] or anything cheaply cloneable that
    /// multiplexes. Its own timeouts and reconnect behaviour then apply (leasehold does not replace it when it goes
    /// silent, as it does its own). Wake-ups for waiters still use a separate subscriber connection to the server
    /// given to [`Builder::new`], because a subscribed connection cannot carry commands.
    ///
    /// For a Redis Cluster, start from [`Client::cluster_builder`] and pass a
    /// [`redis::cluster_async::ClusterConnection`] to the same cluster: the client then groups its calls per slot and
    /// waits on sharded channels, as with a connection of its own.
    ///
    /// The connection must run one client's requests in the order they are sent, as a multiplexed connection does.
    /// A pool does not: the lease deadlines stay correct (they order replies by server time), but the release of a
    /// dropped acquire may then run before the acquire itself, leaving that grant held until its lease ends.
    pub fn connection<C>(mut self, conn: C) -> Builder
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        self.conn = Some(Conn::shared(conn));
        self
    }

    /// Checks the settings and connects.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad prefix, a zero or absurd timeout, unusable TLS settings, or a database
    /// other than 0 on a cluster node; [`Error::Connect`] when the server cannot be reached within the connection
    /// timeout, refuses the credentials, or does not answer as Redis does; [`Error::NotPermitted`] when the Redis user
    /// may not publish wake-ups (see the README's ACL rule), or the PostgreSQL or MySQL user lacks a right on the
    /// lease tables ([`Builder::read_only`]: `SELECT` only), or may not create them when they are missing (the error
    /// names each missing right and the `GRANT` to run); [`Error::ClusterNode`] when a connection given to
    /// [`Builder::connection`] reaches a cluster node that redirects the connect-time check; [`Error::Unsupported`]
    /// for replica acknowledgements the store cannot give ([`Capability::ReplicaAcks`],
    /// [`Capability::ReplicasOnDisk`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is left behind.
    pub async fn connect(self) -> Result<Client, Error> {
        require_runtime()?;
        // The SQL rule first: it is the narrower one, and the one a refused prefix must be told.
        #[cfg(sql_stores)]
        if matches!(self.target, Where::Sql(_)) {
            crate::backend::sql::check_prefix(&self.prefix)?;
        }
        check_prefix(&self.prefix)?;
        check_timeout("connection timeout", self.connection_timeout)?;
        check_timeout("response timeout", self.response_timeout)?;
        // Without the `etcd` and `zookeeper` features the match has one arm.
        #[allow(clippy::infallible_destructuring_match)]
        let target = match self.target {
            Where::Redis(endpoint) => endpoint,
            #[cfg(feature = "etcd")]
            Where::Etcd(ref url) => {
                self.refuse_redis_settings("an etcd:// URL", StoreKind::Etcd)?;
                let mut options = crate::backend::etcd::SessionOptions::default();
                #[cfg(feature = "tls")]
                if !self.tls.is_empty() {
                    if !url.starts_with("etcds://") {
                        return Err(InvalidArgument::BadTls(
                            "TLS material was given for an etcd:// URL: use etcds://".to_owned(),
                        )
                        .into());
                    }
                    options.tls = crate::backend::etcd::endpoints::EtcdTls {
                        ca: self.tls.ca.clone(),
                        identity: self.tls.identity.clone(),
                    };
                }
                if let Some(ttl) = self.session_ttl {
                    options = options.ttl(ttl);
                }
                if options.ttl < crate::backend::etcd::MIN_TTL
                    || options.ttl.subsec_nanos() != 0
                    || options.ttl > crate::engine::ttl::MAX_TTL
                {
                    return Err(InvalidArgument::BadDuration {
                        what: "session TTL",
                        value: options.ttl,
                        why: "must be whole seconds, at least 2s (etcd's shortest lease)",
                    }
                    .into());
                }
                let store =
                    crate::backend::etcd::store::EtcdStore::connect(url, self.prefix, options)
                        .await?;
                return Ok(Client {
                    store: Store::Etcd(Arc::new(store)),
                });
            }
            #[cfg(feature = "zookeeper")]
            Where::ZooKeeper(ref url) => {
                self.refuse_redis_settings("a zk:// URL", StoreKind::ZooKeeper)?;
                #[cfg(feature = "tls")]
                if !self.tls.is_empty() {
                    return Err(InvalidArgument::BadTls(
                        "TLS material was given for a zk:// URL: leasehold speaks to ZooKeeper in the clear only"
                            .to_owned(),
                    )
                    .into());
                }
                let mut options = crate::backend::zookeeper::store::Options {
                    connection_timeout: self.connection_timeout,
                    ..Default::default()
                };
                if let Some(timeout) = self.session_ttl {
                    options.timeout = timeout;
                }
                if options.timeout < crate::backend::zookeeper::session::MIN_TIMEOUT
                    || options.timeout > crate::backend::zookeeper::session::MAX_TIMEOUT
                {
                    return Err(InvalidArgument::BadDuration {
                        what: "session timeout",
                        value: options.timeout,
                        why: "must be at least 1s and at most 24 days (ZooKeeper counts it in 32-bit milliseconds)",
                    }
                    .into());
                }
                let store =
                    crate::backend::zookeeper::store::ZkStore::connect(url, self.prefix, options)
                        .await?;
                return Ok(Client {
                    store: Store::ZooKeeper(Arc::new(store)),
                });
            }
            #[cfg(sql_stores)]
            Where::Sql(ref url) => {
                let kind = StoreKind::of_id(crate::backend::sql::store::db_name(url))
                    .unwrap_or(StoreKind::Postgres);
                self.refuse_redis_settings("a SQL URL", kind)?;
                #[cfg(feature = "tls")]
                let tls = self.tls.clone();
                #[cfg(not(feature = "tls"))]
                let tls = ();
                let ttl = self
                    .session_ttl
                    .unwrap_or(crate::backend::sql::session::DEFAULT_TTL);
                if ttl < crate::backend::sql::session::MIN_TTL || ttl > crate::engine::ttl::MAX_TTL
                {
                    return Err(InvalidArgument::BadDuration {
                        what: "session TTL",
                        value: ttl,
                        why: "must be at least 1s",
                    }
                    .into());
                }
                let store = crate::backend::sql::store::SqlStore::connect(
                    url,
                    self.prefix,
                    ttl,
                    self.connection_timeout,
                    &tls,
                    self.read_only,
                )
                .await?;
                return Ok(Client {
                    store: Store::Sql(Arc::new(store)),
                });
            }
        };
        if self.session_ttl.is_some() {
            return Err(InvalidArgument::BadUrl(
                "a session TTL was given for a Redis URL: it is a setting of the stores with sessions: etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB (on Redis each lock has its own lease)"
                    .to_owned(),
            )
            .into());
        }
        let settings = crate::backend::redis::connect::Settings {
            conn: self.conn,
            prefix: self.prefix,
            connection_timeout: self.connection_timeout,
            response_timeout: self.response_timeout,
            fence_retention: self.fence_retention,
            replicas: self.replicas,
            replica_timeout: self.replica_timeout,
            on_disk: self.on_disk,
            sentinel_auth: self.sentinel_auth,
            #[cfg(feature = "tls")]
            tls: self.tls,
        };
        let inner = crate::backend::redis::connect::connect(target, settings).await?;
        Ok(Client {
            store: Store::Redis(inner),
        })
    }
}

impl Builder {
    /// An error naming the first Redis-only setting that was given for `url` (a store of kind `store`): replica
    /// acknowledgements are refused as the capabilities say ([`Error::Unsupported`]), the others as settings of
    /// another URL.
    #[cfg(session_stores)]
    fn refuse_redis_settings(&self, url: &str, store: StoreKind) -> Result<(), Error> {
        for (asked, capability) in [
            (self.replicas != 0, Capability::ReplicaAcks),
            (self.on_disk, Capability::ReplicasOnDisk),
        ] {
            if asked && store.support(capability) != Support::Yes {
                return Err(refusal(capability, store, None, None));
            }
        }
        let redis_only = [
            (self.conn.is_some(), "a connection of its own"),
            (self.sentinel_auth.is_some(), "sentinel credentials"),
        ];
        match redis_only.iter().find(|(set, _)| *set) {
            Some((_, what)) => Err(InvalidArgument::BadUrl(format!(
                "{what} was given for {url}: it is a Redis setting"
            ))
            .into()),
            None => Ok(()),
        }
    }
}

/// What a [`Builder`] connects to. Built once per client: the size of the Redis variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Where {
    Redis(Endpoint),
    /// An etcd cluster: the `etcd://host:port[,host:port…]` URL.
    #[cfg(feature = "etcd")]
    Etcd(String),
    /// A ZooKeeper ensemble: the `zk://host:port[,host:port…][/chroot]` URL.
    #[cfg(feature = "zookeeper")]
    ZooKeeper(String),
    /// A SQL database: the `postgres://`, `postgresql://`, `mysql://` or `mariadb://` URL.
    #[cfg(sql_stores)]
    Sql(String),
}

fn check_timeout(what: &'static str, value: Duration) -> Result<(), InvalidArgument> {
    if value.is_zero() || value > Duration::from_secs(3600) {
        return Err(InvalidArgument::BadDuration {
            what,
            value,
            why: "must be above zero and at most 1h",
        });
    }
    Ok(())
}

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
    use super::*;
    use crate::{Fence, LossReason, ServerWarning};

    fn round_trip<T>(value: &T) -> T
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let text = serde_json::to_string(value).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn plain_data_round_trips_through_json() {
        let holder = Holder {
            token: "lh1-abc host=h pid=1".to_owned(),
            description: Some("host=h pid=1".to_owned()),
            value: None,
            term: None,
            mode: HoldMode::Permits(3),
            remaining: Some(Duration::from_millis(2500)),
        };
        let info = LockInfo {
            name: "orders:42".to_owned(),
            kind: Some(LockKind::Semaphore),
            holder: Some(holder.clone()),
            holders: vec![holder],
            last_fence: Some(Fence::new(7)),
            waiting_clients: 2,
            permits: Some(3),
        };
        assert_eq!(round_trip(&info), info);
        // A fence is its number on the wire.
        assert_eq!(serde_json::to_string(&Fence::new(7)).unwrap(), "7");
        for reason in [
            LossReason::Expired,
            LossReason::Gone,
            LossReason::Taken,
            LossReason::Released,
        ] {
            assert_eq!(round_trip(&reason), reason);
        }
        for mode in [HoldMode::Exclusive, HoldMode::Read, HoldMode::Nested] {
            assert_eq!(round_trip(&mode), mode);
        }
        let warning = ServerWarning::Eviction {
            policy: "allkeys-lru".to_owned(),
            maxmemory: 1 << 30,
        };
        assert_eq!(round_trip(&warning), warning);
    }
}
