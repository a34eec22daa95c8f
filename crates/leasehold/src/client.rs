//! The client: one command connection, one lease keeper and one subscriber per process (or per caller's choice).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManagerConfig};

use crate::backend::redis::batch::Coalescer;
use crate::backend::redis::checks::{check_keys, check_publish, server_warnings, ServerWarning};
use crate::backend::redis::conn::{Conn, ReplicaAcks};
use crate::backend::redis::keys::{check_prefix, LockKeys, DEFAULT_PREFIX};
use crate::backend::redis::orphans::Orphans;
use crate::backend::redis::scripts::{FORCE_RELEASE, INSPECT};
use crate::backend::redis::sentinel::Followed;
use crate::backend::redis::topology::{Cluster, Endpoint, Target};
use crate::backend::redis::wake::Wakeups;
use crate::engine::keeper::Keeper;
use crate::error::{require_runtime, Error, InvalidArgument};
use crate::fence::{description_of, new_token, Fence, TOKEN_PREFIX};
use crate::kinds::guard::ReleaseItem;
use crate::kinds::mutex::{AcquireItem, Mutex};

/// Default time allowed to open a connection to Redis.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time allowed for one Redis reply.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Default time a lock's fence counter outlives its last grant.
pub const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// A handle to one Redis server for taking locks. Cheap to clone; clones share the connection, the lease keeper
/// and the wake-up subscriber.
///
/// Create one per process (or per Redis server) and keep it: every client owns one multiplexed command
/// connection, one subscriber connection (opened on the first wait) and one renewal task (started with the first
/// kept lease).
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
    Redis(Arc<Inner>),
    /// An etcd cluster.
    #[cfg(feature = "etcd")]
    Etcd(Arc<crate::backend::etcd::store::EtcdStore>),
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    /// The server, or the cluster, the client talks to.
    pub(crate) target: Target,
    /// Replicas that must acknowledge every grant and renewal (`Builder::replicas`).
    pub(crate) replicas: Option<ReplicaAcks>,
    /// Acquire attempts and releases of this client's tasks, coalesced when calls are out (batch.rs).
    pub(crate) acquires: Coalescer<AcquireItem>,
    pub(crate) releases: Coalescer<ReleaseItem>,
    /// Acquire attempts of the queued kinds (fair mutex, read-write lock, semaphore).
    pub(crate) set_acquires: Coalescer<crate::kinds::queued::SetAcquireItem>,
    /// Numbers this client's waits of the queued kinds (each has its own queue entry).
    pub(crate) waits: std::sync::atomic::AtomicU64,
    pub(crate) prefix: String,
    pub(crate) fence_retention: Duration,
    pub(crate) keeper: Arc<Keeper>,
    pub(crate) wakeups: Wakeups,
    /// Releases that no runtime could finish (see [`crate::backend::redis::orphans`]); done when the client is dropped.
    pub(crate) orphans: Orphans,
    /// What the connect-time check found about the server.
    pub(crate) warnings: Vec<ServerWarning>,
}

impl crate::engine::keeper::Renews for Inner {
    fn by_slot(&self) -> bool {
        self.target.is_cluster()
    }

    fn renew<'a>(
        &'a self,
        leases: &'a [Arc<crate::engine::lease::LeaseShared>],
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = crate::engine::keeper::Renewed> + Send + 'a>,
    > {
        Box::pin(async move {
            let invocation = crate::backend::redis::scripts::renew_invocation(leases);
            let (reply, _, acked) = self.conn.invoke_acked(&invocation, self.replicas).await;
            self.renewed(reply, acked)
        })
    }

    /// On a cluster, the batches' calls in one pipeline per node.
    fn renew_each<'a>(
        &'a self,
        batches: &'a [Vec<Arc<crate::engine::lease::LeaseShared>>],
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Vec<crate::engine::keeper::Renewed>> + Send + 'a>,
    > {
        Box::pin(async move {
            let calls: Vec<(u16, crate::backend::redis::scripts::ScriptCall)> = batches
                .iter()
                .map(|leases| {
                    let slot = leases.first().map_or(0, |lease| lease.keys.slot());
                    (
                        slot,
                        crate::backend::redis::scripts::renew_invocation(leases),
                    )
                })
                .collect();
            let sent = self.conn.invoke_by_node(&calls, self.replicas).await;
            sent.into_iter()
                .map(|(reply, _, acked)| self.renewed(reply, acked))
                .collect()
        })
    }
}

impl Inner {
    /// A renewal call's outcome from its reply (`renew.lua`'s: the server's time, then a code per lease) and how many
    /// replicas acknowledged it.
    fn renewed(
        &self,
        reply: redis::RedisResult<Vec<i64>>,
        acked: Option<u32>,
    ) -> crate::engine::keeper::Renewed {
        // A renewal too few replicas acknowledged does not count: its leases keep their last acknowledged deadline
        // (the request stays unconfirmed, as after a timeout) and are retried until then.
        if let (Some((acked, required)), Ok(_)) =
            (crate::kinds::mutex::short_of(self.replicas, acked), &reply)
        {
            return Err(format!(
                "renewal not acknowledged by enough replicas ({acked} of {required})"
            ));
        }
        match reply {
            Ok(reply) => match reply.split_first() {
                Some((&run, codes)) => Ok(vec![Some((run, codes.to_vec()))]),
                None => Err("empty renewal reply".to_owned()),
            },
            Err(err) => Err(err.to_string()),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.keeper.close();
        self.orphans.release_all(self.wakeups.channel_prefix());
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
    /// Connects to the Redis server at `url` with default settings.
    ///
    /// Accepted URLs:
    /// - `redis://[user[:password]@]host[:port][/db]`, one server (`rediss://…` with the `tls` feature);
    /// - `unix:///path/to/socket` or `redis+unix:///path/to/socket`, one server on a Unix socket;
    /// - `redis+cluster://[user[:password]@]host:port,host:port,…`, a Redis Cluster through every seed node you know
    ///   (`rediss+cluster://` for TLS);
    /// - `redis+sentinel://[user[:password]@]host:port,host:port/service[/db]`, the primary that the sentinels name
    ///   for `service`, followed across failovers (`rediss+sentinel://` for TLS; the credentials are the data
    ///   nodes', see [`Builder::sentinel_auth`] for the sentinels' own).
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
    /// names the URL, password hidden); [`Error::NotPermitted`] when the Redis user lacks a permission leasehold needs.
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
    /// [`Error::InvalidArgument`] for a malformed URL.
    pub fn builder(url: &str) -> Result<Builder, Error> {
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
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => false,
        }
    }

    /// Which store the client talks to: `"redis"` (one server, a Cluster or Sentinel's primary) or `"etcd"`.
    pub fn store_name(&self) -> &'static str {
        match &self.store {
            Store::Redis(_) => "redis",
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => "etcd",
        }
    }

    /// The Redis side of the client; an error on another store (never reached: the kinds pick the store first).
    pub(crate) fn redis(&self) -> Result<&Arc<Inner>, Error> {
        match &self.store {
            Store::Redis(inner) => Ok(inner),
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => Err(Error::Unsupported {
                detail: "a Redis operation on a client of another store".to_owned(),
            }),
        }
    }

    /// The Redis side of the client for `what`, an operation on lock `name` that only Redis offers: on another store,
    /// [`Error::Unsupported`] saying so.
    pub(crate) fn redis_for(&self, what: &str, name: &str) -> Result<&Arc<Inner>, Error> {
        self.redis().map_err(|_| Error::Unsupported {
            detail: format!(
                "lock {name:?}: {what} is not available on {}",
                self.store_name()
            ),
        })
    }

    /// The etcd side of the client, when it talks to etcd.
    #[cfg(feature = "etcd")]
    pub(crate) fn etcd(&self) -> Option<&Arc<crate::backend::etcd::store::EtcdStore>> {
        match &self.store {
            Store::Etcd(etcd) => Some(etcd),
            Store::Redis(_) => None,
        }
    }

    /// A handle for the non-reentrant mutex called `name`. Creating it does no I/O; the name is checked by the
    /// first operation, which reports a bad name as [`Error::InvalidArgument`].
    pub fn mutex(&self, name: &str) -> Mutex {
        Mutex::new(self.clone(), name)
    }

    /// A handle to the strictly fair mutex called `name` (see [`FairMutex`](crate::FairMutex)). Cheap; nothing is sent until it is
    /// used.
    pub fn fair_mutex(&self, name: &str) -> crate::FairMutex {
        crate::FairMutex::new(self.clone(), name)
    }

    /// A handle to the reentrant mutex called `name` (see [`ReentrantMutex`](crate::ReentrantMutex)).
    pub fn reentrant_mutex(&self, name: &str) -> crate::ReentrantMutex {
        crate::ReentrantMutex::new(self.clone(), name)
    }

    /// A handle to the read-write lock called `name` (see [`RwLock`](crate::RwLock)).
    pub fn rw_lock(&self, name: &str) -> crate::RwLock {
        crate::RwLock::new(self.clone(), name)
    }

    /// A handle to the counting semaphore called `name` with `permits` permits (see [`Semaphore`](crate::Semaphore)).
    /// The count is checked by the first operation ([`InvalidArgument::BadPermits`](crate::InvalidArgument::BadPermits)).
    pub fn semaphore(&self, name: &str, permits: u64) -> crate::Semaphore {
        crate::Semaphore::new(self.clone(), name, permits)
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
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.etcd() {
            return etcd.inspect(keys.name()).await;
        }
        let inner = self.redis()?;
        let mut invocation = INSPECT.key(&keys.lock);
        invocation.key(keys.fence()).key(keys.waiters());
        let read: redis::RedisResult<Vec<redis::Value>> =
            inner.conn.invoke_idempotent(&invocation).await;
        let read = match read {
            Ok(read) => read,
            Err(err) => return Err(script_error(&inner.conn, &keys.lock, err).await),
        };
        let text = |v: &redis::Value| {
            redis::from_redis_value::<Option<String>>(v.clone())
                .ok()
                .flatten()
        };
        let int = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).unwrap_or(0);
        let (Some(kind), Some(fence), Some(waiting), Some(permits)) =
            (read.first(), read.get(1), read.get(2), read.get(3))
        else {
            return Err(Error::NotALock {
                key: keys.lock.clone(),
                detail: "unexpected reply to inspect".to_owned(),
            });
        };
        let kind = text(kind).unwrap_or_default();
        let mut holders = Vec::new();
        for pair in read[4..].chunks(2) {
            let [hold, ms] = pair else { continue };
            let Some(hold) = text(hold) else { continue };
            let remaining = u64::try_from(int(ms)).ok().map(Duration::from_millis);
            let token = crate::fence::token_of(&hold);
            if !token.starts_with(TOKEN_PREFIX) {
                return Err(foreign(&keys.lock, &hold));
            }
            holders.push(Holder {
                description: description_of(token).map(str::to_owned),
                mode: HoldMode::of(&hold),
                token: token.to_owned(),
                remaining,
            });
        }
        let kind = match kind.as_str() {
            "string" => Some(LockKind::Mutex),
            "zset" => holders.first().map(|h| h.mode.kind()),
            "none" => None,
            other => {
                return Err(Error::NotALock {
                    key: keys.lock.clone(),
                    detail: format!("it holds a Redis {other}, which leasehold does not write"),
                })
            }
        };
        let last_fence = match text(fence) {
            Some(raw) => Some(
                raw.parse::<u64>()
                    .map(Fence::new)
                    .map_err(|_| Error::NotALock {
                        key: keys.fence().to_string(),
                        detail: format!("fence counter holds {raw:?}"),
                    })?,
            ),
            None => None,
        };
        Ok(LockInfo {
            name: name.to_owned(),
            kind,
            holder: holders.first().cloned(),
            holders,
            last_fence,
            waiting_clients: u64::try_from(int(waiting)).unwrap_or(0),
            permits: redis::from_redis_value::<Option<u64>>(permits.clone())
                .ok()
                .flatten(),
        })
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
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.etcd() {
            return etcd.held_locks(pattern).await;
        }
        let inner = self.redis()?;
        let prefix = &inner.prefix;
        let glob = format!("{}:{{{pattern}}}", escape_glob(prefix));
        let head = prefix.len() + 2;
        let mut names = Vec::new();
        for keys in scan_all(&inner.conn, &glob).await? {
            names.extend(
                keys.into_iter()
                    .filter(|key| key.len() > head && key.ends_with('}'))
                    .map(|key| key[head..key.len() - 1].to_owned()),
            );
        }
        names.sort();
        names.dedup();
        let mut held = Vec::new();
        // Read in chunks, all of a chunk at once (the multiplexed connection pipelines them): one round trip per
        // chunk, not per lock.
        for chunk in names.chunks(HELD_LOCKS_CHUNK) {
            let infos =
                futures_util::future::join_all(chunk.iter().map(|name| self.inspect(name))).await;
            for info in infos {
                match info {
                    Ok(info) if info.holder.is_some() => held.push(info),
                    // Free by now, a name leasehold would refuse, or a key some other program wrote: not a held lock.
                    Ok(_) | Err(Error::InvalidArgument(_) | Error::NotALock { .. }) => {}
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(held)
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
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.etcd() {
            return etcd.force_release(keys.name()).await;
        }
        let inner = self.redis()?;
        let wakeups = &inner.wakeups;
        let removed: redis::RedisResult<Option<String>> = FORCE_RELEASE
            .key(&keys.lock)
            .key(keys.queue())
            .key(keys.waiters())
            .key(keys.fence())
            .arg(wakeups.channel_prefix())
            .arg(crate::engine::ttl::millis(inner.fence_retention))
            .invoke_async(&mut inner.conn.clone())
            .await;
        let removed = match removed {
            Ok(removed) => removed,
            Err(err) => return Err(script_error(&inner.conn, &keys.lock, err).await),
        };
        match removed {
            Some(token) if !token.starts_with(TOKEN_PREFIX) => Err(foreign(&keys.lock, &token)),
            removed => Ok(removed),
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
        }
    }

    /// What the client found, when it connected, that weakens the [safety contract](crate#safety-contract) on this
    /// server (each is also logged with `tracing::warn!`): today, a `maxmemory-policy` that may evict a held lock.
    /// Empty when all is well, or when the server would not say (an ACL user without `INFO`).
    pub fn server_warnings(&self) -> &[ServerWarning] {
        match &self.store {
            Store::Redis(inner) => &inner.warnings,
            #[cfg(feature = "etcd")]
            Store::Etcd(_) => &[],
        }
    }

    /// The key prefix of this client's locks (on etcd, lock `N` lives under `PREFIX/N/`).
    pub fn prefix(&self) -> &str {
        match &self.store {
            Store::Redis(inner) => &inner.prefix,
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => &etcd.prefix,
        }
    }

    pub(crate) fn keys(&self, name: &str) -> Result<Arc<LockKeys>, Error> {
        Ok(LockKeys::new(self.prefix(), name)?)
    }

    /// On a Redis Cluster, the per-node pipelines this client has sent for coalesced and renewal calls, the script
    /// calls they carried, and the calls of those kinds sent alone (`None` elsewhere).
    #[doc(hidden)]
    pub fn cluster_pipelines(&self) -> Option<(u64, u64, u64)> {
        match &self.redis().ok()?.conn {
            Conn::Cluster(_, _, owners) => Some(owners.pipelines()),
            _ => None,
        }
    }

    /// Leases the keeper renews right now (on etcd, the grants that follow the session).
    #[doc(hidden)]
    pub fn kept_leases(&self) -> usize {
        match &self.store {
            Store::Redis(inner) => inner.keeper.len(),
            #[cfg(feature = "etcd")]
            Store::Etcd(etcd) => etcd.kept_leases(),
        }
    }
}

/// What [`Client::inspect`] found.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// The kind of lock the name holds now, as its key shows it; `None` when nothing holds it.
    pub kind: Option<LockKind>,
    /// The current holder (for a queued kind, the hold whose lease ends first), or `None` when the lock is free.
    pub holder: Option<Holder>,
    /// Every current holder: one for a mutex, any number of readers or permit holders for the queued kinds.
    pub holders: Vec<Holder>,
    /// The fence of the most recent grant, when the counter still exists.
    pub last_fence: Option<Fence>,
    /// How many live waiters the lock has: waiting clients (processes, usually) for a [`Mutex`], waiting tasks for
    /// the queued kinds. A waiter counts while its queue entry is live, that is for 3 s after its last attempt (it
    /// makes one at least every second): one that gave up, was killed or froze stops counting then, even while its
    /// entry still sits in the queue for the next release to skip.
    pub waiting_clients: u64,
    /// A [`Semaphore`](crate::Semaphore)'s capacity, as it stores it while a permit is held (see its "The permit
    /// count" section); `None` for a free semaphore and for the other kinds.
    pub permits: Option<u64>,
}

/// The kinds of lock a name can hold.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum LockKind {
    /// [`Mutex`].
    Mutex,
    /// [`FairMutex`](crate::FairMutex).
    Fair,
    /// [`RwLock`](crate::RwLock).
    ReadWrite,
    /// [`Semaphore`](crate::Semaphore).
    Semaphore,
    /// [`ReentrantMutex`](crate::ReentrantMutex).
    Reentrant,
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LockKind::Mutex => "mutex",
            LockKind::Fair => "fair mutex",
            LockKind::ReadWrite => "read-write lock",
            LockKind::Semaphore => "semaphore",
            LockKind::Reentrant => "reentrant mutex",
        })
    }
}

/// What one holder holds.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum HoldMode {
    /// The whole lock: a [`Mutex`] or [`FairMutex`](crate::FairMutex) grant.
    Exclusive,
    /// A read share of a [`RwLock`](crate::RwLock).
    Read,
    /// The write lock of a [`RwLock`](crate::RwLock).
    Write,
    /// This many permits of a [`Semaphore`](crate::Semaphore).
    Permits(u64),
    /// The root grant of a [`ReentrantMutex`](crate::ReentrantMutex).
    Reentrant,
    /// A nested hold of a [`ReentrantMutex`](crate::ReentrantMutex), taken with its holder's token.
    Nested,
}

impl HoldMode {
    /// The mode of a hold as stored: a mutex's bare token, or `"<tag> <token>"` (see `scripts/set.lua`).
    pub(crate) fn of(hold: &str) -> HoldMode {
        match hold.split_once(' ').map(|(tag, _)| tag) {
            Some("r") => HoldMode::Read,
            Some("w") => HoldMode::Write,
            Some("e") => HoldMode::Reentrant,
            Some("n") => HoldMode::Nested,
            Some(tag) if tag.starts_with('s') => tag[1..]
                .parse()
                .map_or(HoldMode::Exclusive, HoldMode::Permits),
            _ => HoldMode::Exclusive,
        }
    }

    pub(crate) fn kind(self) -> LockKind {
        match self {
            HoldMode::Exclusive => LockKind::Fair,
            HoldMode::Read | HoldMode::Write => LockKind::ReadWrite,
            HoldMode::Permits(_) => LockKind::Semaphore,
            HoldMode::Reentrant | HoldMode::Nested => LockKind::Reentrant,
        }
    }
}

impl fmt::Display for HoldMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldMode::Exclusive => f.write_str("exclusive"),
            HoldMode::Read => f.write_str("read"),
            HoldMode::Write => f.write_str("write"),
            HoldMode::Permits(1) => f.write_str("1 permit"),
            HoldMode::Permits(n) => write!(f, "{n} permits"),
            HoldMode::Reentrant => f.write_str("reentrant"),
            HoldMode::Nested => f.write_str("nested"),
        }
    }
}

/// The holder of a lock, as [`Client::inspect`] saw it.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Holder {
    /// The holder's owner token (with its description, when it gave one: see [`Mutex::describe`]).
    pub token: String,
    /// What the holder said about itself ([`Mutex::describe`]); the command gives host, pid, user, start time and
    /// program.
    pub description: Option<String>,
    /// What it holds.
    pub mode: HoldMode,
    /// The remaining lease on the server, when the key has an expiry.
    pub remaining: Option<Duration>,
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
    /// The etcd session's TTL, when set ([`Builder::session_ttl`]).
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
    #[cfg(feature = "tls")]
    tls: crate::backend::redis::tls::TlsSettings,
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
            #[cfg(feature = "tls")]
            tls: crate::backend::redis::tls::TlsSettings::default(),
        }
    }

    /// Trusts the CA certificate(s) in `pem` (PEM text, as in a `ca.crt` file) for the server's certificate,
    /// instead of the system's trust store. For `rediss://` and `etcds://` URLs only. Needs the `tls` feature.
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
    /// (`tls-auth-clients yes`, etcd's `--client-cert-auth`). For `rediss://` and `etcds://` URLs only. Needs the `tls` feature.
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

    /// The length of the etcd session's lease, which every grant of the client lives under: whole seconds, at least
    /// 2 s (etcd's shortest lease), 10 s by default. A crashed holder's locks are free this long after its last
    /// keep-alive; the client sends one every third of it. For `etcd://` URLs only (on Redis each lock handle has its
    /// own lease: [`Mutex::ttl`]); checked by [`connect`](Builder::connect).
    pub fn session_ttl(mut self, ttl: Duration) -> Builder {
        self.session_ttl = Some(ttl);
        self
    }

    /// The namespace of every key and channel: a lock `N` lives at `PREFIX:{N}` on Redis, under `PREFIX/N/` on etcd. Non-empty, at most 64 bytes, no
    /// braces. Defaults to `leasehold`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Builder {
        self.prefix = prefix.into();
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
    /// it was replicated. See the README's "Replicas, failover and what `WAIT` changes".
    pub fn replicas(mut self, count: u32) -> Builder {
        self.replicas = count;
        self
    }

    /// Makes an acknowledgement mean "written to the append-only file": the lock's primary and [`replicas`](
    /// Builder::replicas) of its replicas (0 for the primary alone) fsync every grant and renewal before it counts
    /// (`WAITAOF 1 n timeout` instead of `WAIT n timeout`), so that a restart of the primary, or of the replicas, does
    /// not lose an acknowledged grant. Needs Redis 7.2 or later with `appendonly yes` (and `appendfsync everysec` or
    /// `always`): [`connect`](Builder::connect) checks both and fails with [`Error::Unsupported`] otherwise. Defaults
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
    /// may not publish wake-ups (see the README's ACL rule); [`Error::ClusterNode`] when a connection given to
    /// [`Builder::connection`] reaches a cluster node that redirects the connect-time check.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is left behind.
    pub async fn connect(self) -> Result<Client, Error> {
        require_runtime()?;
        check_prefix(&self.prefix)?;
        check_timeout("connection timeout", self.connection_timeout)?;
        check_timeout("response timeout", self.response_timeout)?;
        // Without the `etcd` feature the match has one arm.
        #[allow(clippy::infallible_destructuring_match)]
        let target = match self.target {
            Where::Redis(endpoint) => endpoint,
            #[cfg(feature = "etcd")]
            Where::Etcd(ref url) => {
                let redis_only = [
                    (self.conn.is_some(), "a connection of its own"),
                    (
                        self.replicas != 0 || self.on_disk,
                        "replica acknowledgements",
                    ),
                    (self.sentinel_auth.is_some(), "sentinel credentials"),
                ];
                if let Some((_, what)) = redis_only.iter().find(|(set, _)| *set) {
                    return Err(InvalidArgument::BadUrl(format!(
                        "{what} was given for an etcd:// URL: it is a Redis setting"
                    ))
                    .into());
                }
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
        };
        if self.session_ttl.is_some() {
            return Err(InvalidArgument::BadUrl(
                "a session TTL was given for a Redis URL: it is an etcd setting (on Redis each lock has its own lease)"
                    .to_owned(),
            )
            .into());
        }
        if self.fence_retention < Duration::from_secs(1) {
            return Err(InvalidArgument::BadDuration {
                what: "fence retention",
                value: self.fence_retention,
                why: "must be at least 1s",
            }
            .into());
        }
        if self.sentinel_auth.is_some() && !matches!(target, Endpoint::Sentinel(_)) {
            return Err(InvalidArgument::BadUrl(
                "sentinel credentials were given for a URL that is not redis+sentinel://"
                    .to_owned(),
            )
            .into());
        }
        let replicas = match (self.replicas, self.on_disk) {
            (0, false) => None,
            (count, on_disk) => {
                let timeout = self.replica_timeout.unwrap_or(self.response_timeout / 4);
                if timeout.is_zero() || timeout >= self.response_timeout {
                    return Err(InvalidArgument::BadDuration {
                        what: "replica timeout",
                        value: timeout,
                        why: "must be above zero and below the response timeout",
                    }
                    .into());
                }
                Some(ReplicaAcks {
                    count,
                    timeout,
                    on_disk,
                })
            }
        };
        #[cfg(feature = "tls")]
        crate::backend::redis::tls::ensure_crypto_provider();
        let endpoint = match target {
            #[cfg(feature = "tls")]
            Endpoint::Single(redis) => {
                Endpoint::Single(crate::backend::redis::tls::apply(redis, &self.tls)?)
            }
            #[cfg(not(feature = "tls"))]
            Endpoint::Single(redis) => Endpoint::Single(redis),
            Endpoint::Cluster(mut cluster) => {
                cluster.connection_timeout = self.connection_timeout;
                cluster.response_timeout = self.response_timeout;
                #[cfg(feature = "tls")]
                {
                    cluster.certs =
                        crate::backend::redis::tls::checked(&self.tls, cluster.uses_tls())?;
                }
                Endpoint::Cluster(cluster)
            }
            // Resolved (and followed) below, with the connection.
            Endpoint::Sentinel(mut sentinel) => {
                if let Some((username, password)) = &self.sentinel_auth {
                    sentinel.authenticate(username.as_deref(), password);
                }
                Endpoint::Sentinel(sentinel)
            }
        };
        // Connection failures name the server (password hidden) and, when leasehold can tell, what they mean.
        let url = endpoint.redacted_url();
        let uses_tls = url.starts_with("rediss");
        let failed = |err: Error| match err {
            Error::Redis(source) => Error::Connect {
                hint: crate::backend::redis::checks::connect_hint(&source, uses_tls),
                url: url.clone(),
                source,
            },
            other => other,
        };
        // Few retries per (re)connect: a request that fails triggers the next reconnect anyway, and the first connect
        // should report a refused or unreachable server at once, with its real cause.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let target = match endpoint {
            Endpoint::Single(redis) => Target::Single(redis),
            Endpoint::Cluster(cluster) => Target::Cluster(cluster),
            Endpoint::Sentinel(sentinel) => {
                let followed = Followed::connect(sentinel, config.clone(), self.connection_timeout);
                Target::Followed(followed.await.map_err(|e| failed(e.into()))?)
            }
        };
        let within = self.connection_timeout.saturating_mul(2);
        let (conn, target) = match (self.conn, target) {
            (Some(conn), target) => (conn, target),
            (None, Target::Single(redis)) => {
                let db = redis.get_connection_info().redis_settings().db();
                let conn = match connect_single(&redis, config.clone(), within).await {
                    Ok(conn) => conn,
                    // The connection's SELECT was refused. Redis says "SELECT is not allowed in cluster mode"; Valkey
                    // (whose cluster may have more databases) says "DB index is out of range", as a single server
                    // does for a database it lacks: then database 0 tells whether this is a cluster node.
                    Err(Error::Redis(err)) if db != 0 => {
                        if err.to_string().contains("cluster mode")
                            || selects_on_a_cluster_node(&redis, config, within).await
                        {
                            return Err(not_in_cluster(&url, db).into());
                        }
                        return Err(failed(Error::Redis(err)));
                    }
                    Err(err) => return Err(failed(err)),
                };
                // A `redis://` URL may name one node of a Redis Cluster (a managed cluster behind one endpoint, say):
                // then the cluster client takes over, with that node as its seed.
                if crate::backend::redis::checks::is_cluster_node(&conn)
                    .await
                    .map_err(failed)?
                {
                    let info = redis.get_connection_info();
                    if db != 0 {
                        return Err(not_in_cluster(&url, db).into());
                    }
                    tracing::info!(
                        "{url} is a Redis Cluster node; connecting to the cluster with it as the seed"
                    );
                    #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
                    let mut cluster = Cluster::from_seed(
                        info.clone(),
                        self.connection_timeout,
                        self.response_timeout,
                    );
                    #[cfg(feature = "tls")]
                    {
                        cluster.certs =
                            crate::backend::redis::tls::checked(&self.tls, cluster.uses_tls())?;
                    }
                    let conn = connect_cluster(&cluster, within).await.map_err(failed)?;
                    (conn, Target::Cluster(cluster))
                } else {
                    (conn, Target::Single(redis))
                }
            }
            (None, Target::Cluster(cluster)) => {
                let conn = connect_cluster(&cluster, within).await.map_err(failed)?;
                (conn, Target::Cluster(cluster))
            }
            (None, Target::Followed(followed)) => (
                Conn::Followed(Arc::clone(&followed)),
                Target::Followed(followed),
            ),
        };
        // The checks below fail now, not at the first lock, when the server is unreachable or refuses us (the first
        // of them is the first request on the connection).
        // Identifies this client in lock queues; its wake-up channel is named after it.
        let client_id = new_token(None)?.split_off(crate::fence::TOKEN_PREFIX.len());
        check_publish(&conn, &target, &self.prefix, &client_id)
            .await
            .map_err(failed)?;
        check_keys(&conn, &self.prefix).await.map_err(failed)?;
        if replicas.is_some_and(|r| r.on_disk) {
            crate::backend::redis::checks::check_waitaof(&conn)
                .await
                .map_err(failed)?;
        }
        let warnings = server_warnings(&conn).await;
        let orphans = Orphans::new(
            target.clone(),
            self.connection_timeout,
            self.fence_retention,
        );
        let cluster = target.is_cluster();
        // The subscriber holds the client weakly: it releases grants that nobody here waits for any more.
        let inner = Arc::new_cyclic(|inner| Inner {
            wakeups: Wakeups::new(
                inner.clone(),
                target.clone(),
                &self.prefix,
                client_id,
                self.connection_timeout,
                self.response_timeout,
            ),
            conn,
            target,
            replicas,
            // On one server a call may cover any locks; on a cluster it must stay within one slot.
            acquires: Coalescer::new(cluster),
            releases: Coalescer::new(cluster),
            set_acquires: Coalescer::new(cluster),
            waits: std::sync::atomic::AtomicU64::new(0),
            prefix: self.prefix,
            fence_retention: self.fence_retention,
            keeper: Arc::new(Keeper::new()),
            orphans,
            warnings,
        });
        Ok(Client {
            store: Store::Redis(inner),
        })
    }
}

/// What a [`Builder`] connects to. Built once per client: the size of the Redis variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Where {
    Redis(Endpoint),
    /// An etcd cluster: the `etcd://host:port[,host:port…]` URL.
    #[cfg(feature = "etcd")]
    Etcd(String),
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

/// A managed connection to one server, opened within `within`.
async fn connect_single(
    redis: &redis::Client,
    config: ConnectionManagerConfig,
    within: Duration,
) -> Result<Conn, Error> {
    match tokio::time::timeout(within, Conn::managed(redis.clone(), config)).await {
        Ok(conn) => Ok(conn?),
        Err(_) => Err(gave_up().into()),
    }
}

/// leasehold's own connection to `cluster`, opened within `within`.
async fn connect_cluster(cluster: &Cluster, within: Duration) -> Result<Conn, Error> {
    let client = cluster.client(None)?;
    match tokio::time::timeout(within, client.get_async_connection()).await {
        Ok(connection) => Ok(Conn::cluster(connection?, cluster.response_timeout)),
        Err(_) => Err(gave_up().into()),
    }
}

/// Whether the server `redis` names, reached on database 0, is a Redis Cluster node: after its database was refused.
async fn selects_on_a_cluster_node(
    redis: &redis::Client,
    config: ConnectionManagerConfig,
    within: Duration,
) -> bool {
    let info = redis.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_db(0);
    let Ok(first) = redis::Client::open(info.set_redis_settings(settings)) else {
        return false;
    };
    match connect_single(&first, config, within).await {
        Ok(conn) => crate::backend::redis::checks::is_cluster_node(&conn)
            .await
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// The error for a database other than 0 in the URL of a cluster node.
fn not_in_cluster(url: &str, db: i64) -> InvalidArgument {
    InvalidArgument::BadUrl(format!(
        "{url} is a Redis Cluster node, and a cluster has database 0 only: drop /{db} from the URL"
    ))
}

fn gave_up() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "timed out connecting to redis"))
}

/// The keys matching `glob`, per node walked: every primary of a cluster (reached through leasehold's own cluster
/// connection), or the one server.
async fn scan_all(conn: &Conn, glob: &str) -> Result<Vec<Vec<String>>, Error> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let scan = |cursor: u64| {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(glob)
            .arg("COUNT")
            .arg(1000);
        cmd
    };
    let Conn::Cluster(cluster, _, _) = conn else {
        let mut conn = conn.clone();
        let mut cursor = 0u64;
        let mut found = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = scan(cursor).query_async(&mut conn).await?;
            found.extend(keys);
            cursor = next;
            if cursor == 0 {
                return Ok(vec![found]);
            }
        }
    };
    // Every primary, as `CLUSTER SLOTS` lists them: [[start, end, [host, port, id, …], replicas…], …].
    let slots: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn.clone())
        .await?;
    let mut primaries: Vec<(String, u16)> = slots
        .iter()
        .filter_map(|range| {
            let node: Vec<redis::Value> = redis::from_redis_value(range.get(2)?.clone()).ok()?;
            let host: String = redis::from_redis_value(node.first()?.clone()).ok()?;
            let port: u16 = redis::from_redis_value(node.get(1)?.clone()).ok()?;
            Some((host, port))
        })
        .collect();
    primaries.sort();
    primaries.dedup();
    let mut per_node = Vec::new();
    for (host, port) in primaries {
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.clone(),
            port,
        });
        let mut cursor = 0u64;
        let mut found = Vec::new();
        loop {
            let mut cluster = cluster.clone();
            let reply = tokio::time::timeout(
                DEFAULT_RESPONSE_TIMEOUT.max(Duration::from_secs(5)),
                cluster.route_command(scan(cursor), route.clone()),
            )
            .await
            .map_err(|_| {
                redis::RedisError::from((redis::ErrorKind::Io, "SCAN timed out on a cluster node"))
            })??;
            let (next, keys): (u64, Vec<String>) =
                redis::from_redis_value(reply).map_err(redis::RedisError::from)?;
            found.extend(keys);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        per_node.push(found);
    }
    Ok(per_node)
}

/// How many locks [`Client::held_locks`] reads at once.
const HELD_LOCKS_CHUNK: usize = 100;

/// `text` with the glob characters of Redis's `MATCH` escaped.
fn escape_glob(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Maps a `WRONGTYPE` reply (the key is a hash, list, …) to [`Error::NotALock`].
pub(crate) fn not_a_lock(err: redis::RedisError, key: &str) -> Error {
    let wrong_type = err.code() == Some("WRONGTYPE") || err.to_string().contains("WRONGTYPE");
    if wrong_type {
        Error::NotALock {
            key: key.to_owned(),
            detail: "it holds another Redis type, which leasehold did not write".to_owned(),
        }
    } else {
        err.into()
    }
}

pub(crate) fn foreign(key: &str, value: &str) -> Error {
    Error::NotALock {
        key: key.to_owned(),
        detail: format!(
            "it holds the string {}, which leasehold did not write",
            excerpt(value.as_bytes())
        ),
    }
}

/// A failed script call on the lock at `key`: [`Error::NotALock`] (saying what the key holds) for `WRONGTYPE`,
/// [`Error::Redis`] otherwise.
pub(crate) async fn script_error(conn: &Conn, key: &str, err: redis::RedisError) -> Error {
    explain_foreign(conn, key, not_a_lock(err, key)).await
}

/// `err` with a [`Error::NotALock`] about `key` made precise: the key's Redis type, and for a string the start of
/// its value (read now, on this error path only). Any other error, or a failed read, is returned as it is.
pub(crate) async fn explain_foreign(conn: &Conn, key: &str, err: Error) -> Error {
    let Error::NotALock { key: bad, .. } = &err else {
        return err;
    };
    if bad != key {
        return err;
    }
    let mut conn = conn.clone();
    let Ok(kind) = redis::cmd("TYPE")
        .arg(key)
        .query_async::<String>(&mut conn)
        .await
    else {
        return err;
    };
    let detail = match kind.as_str() {
        "string" => match redis::cmd("GETRANGE")
            .arg(key)
            .arg(0)
            .arg(EXCERPT_BYTES)
            .query_async::<Vec<u8>>(&mut conn)
            .await
        {
            Ok(value) if value.starts_with(TOKEN_PREFIX.as_bytes()) => {
                return wrong_kind(key, LockKind::Mutex);
            }
            Ok(value) => format!(
                "it holds the string {}, which leasehold did not write",
                excerpt(&value)
            ),
            Err(_) => return err,
        },
        // The first hold by score: from 0 up, past a semaphore's capacity member (a negative score, see set.lua).
        "zset" => match redis::cmd("ZRANGEBYSCORE")
            .arg(key)
            .arg(0)
            .arg("+inf")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async::<Vec<String>>(&mut conn)
            .await
        {
            Ok(first) if first.first().is_some_and(|h| h.contains(TOKEN_PREFIX)) => {
                return wrong_kind(key, HoldMode::of(&first[0]).kind());
            }
            Ok(_) => "it holds a Redis zset, which leasehold did not write".to_owned(),
            Err(_) => return err,
        },
        // Gone (or changed) between the failed call and this read: say what was seen.
        "none" => return err,
        other => format!("it holds a Redis {other}, which leasehold did not write"),
    };
    Error::NotALock {
        key: key.to_owned(),
        detail,
    }
}

/// The error for the lock key `key` holding a lock of kind `found`.
fn wrong_kind(key: &str, found: LockKind) -> Error {
    let name = key
        .split_once(":{")
        .and_then(|(_, rest)| rest.strip_suffix('}'))
        .unwrap_or(key);
    Error::WrongKind {
        name: name.to_owned(),
        found,
    }
}

/// How much of a foreign string value an error shows.
const EXCERPT_BYTES: usize = 40;

/// The first [`EXCERPT_BYTES`] of `value`, quoted, with `…` when there is more (invalid UTF-8 shown lossily).
fn excerpt(value: &[u8]) -> String {
    let cut = value.len() > EXCERPT_BYTES;
    let text = String::from_utf8_lossy(&value[..value.len().min(EXCERPT_BYTES)]);
    let mut shown = format!("{text:?}");
    if cut {
        shown.push('…');
    }
    shown
}

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
    use super::*;
    use crate::{LossReason, ServerWarning};

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
