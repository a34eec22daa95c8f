//! A client's Redis side ([`RedisStore`]): the state behind a [`Client`](crate::Client) of one server, a Redis
//! Cluster or Sentinel's primary, the renewal of its kept leases (its [`Renews`](crate::engine::keeper::Renews)), and
//! what a client reads or deletes by name on Redis: [`Client::inspect`](crate::Client::inspect),
//! [`Client::held_locks`](crate::Client::held_locks) (a `SCAN` of every primary) and
//! [`Client::force_release`](crate::Client::force_release). How it connects is in `connect.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::redis::acquire::AcquireItem;
use crate::backend::redis::batch::Coalescer;
use crate::backend::redis::checks::ServerWarning;
use crate::backend::redis::conn::{Conn, ReplicaAcks};
use crate::backend::redis::foreign::{foreign, script_error};
use crate::backend::redis::grant::short_of;
use crate::backend::redis::orphans::Orphans;
use crate::backend::redis::queued::SetAcquireItem;
use crate::backend::redis::release::ReleaseItem;
use crate::backend::redis::scripts::{FORCE_RELEASE, INSPECT, PROCLAIM, TERM};
use crate::backend::redis::topology::Target;
use crate::backend::redis::wake::Wakeups;
use crate::backend::DEFAULT_RESPONSE_TIMEOUT;
use crate::engine::info::{HoldMode, Holder, LockInfo, LockKind};
use crate::engine::keeper::Keeper;
use crate::engine::keys::LockKeys;
use crate::error::Error;
use crate::fence::{description_of, Fence, TOKEN_PREFIX};

/// A client's Redis side: its command connection, where it reaches the server (one server, a Cluster, or the primary
/// that the sentinels name), its coalescers, its lease keeper, its wake-up subscriber, and the releases left to its
/// drop.
pub(crate) struct RedisStore {
    pub(crate) conn: Conn,
    /// The server, or the cluster, the client talks to.
    pub(crate) target: Target,
    /// Replicas that must acknowledge every grant and renewal (`Builder::replicas`).
    pub(crate) replicas: Option<ReplicaAcks>,
    /// Acquire attempts and releases of this client's tasks, coalesced when calls are out (batch.rs).
    pub(crate) acquires: Coalescer<AcquireItem>,
    pub(crate) releases: Coalescer<ReleaseItem>,
    /// Acquire attempts of the queued kinds (fair mutex, read-write lock, semaphore).
    pub(crate) set_acquires: Coalescer<SetAcquireItem>,
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
    /// Whether the server can run `WAITAOF` (`Capability::ReplicasOnDisk`), as the connect-time check found; `Err`
    /// says why not.
    pub(crate) waitaof: Result<(), String>,
}

impl crate::engine::keeper::Renews for RedisStore {
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

impl RedisStore {
    /// A renewal call's outcome from its reply (`renew.lua`'s: the server's time, then a code per lease) and how many
    /// replicas acknowledged it.
    fn renewed(
        &self,
        reply: redis::RedisResult<Vec<i64>>,
        acked: Option<u32>,
    ) -> crate::engine::keeper::Renewed {
        // A renewal too few replicas acknowledged does not count: its leases keep their last acknowledged deadline
        // (the request stays unconfirmed, as after a timeout) and are retried until then.
        if let (Some((acked, required)), Ok(_)) = (short_of(self.replicas, acked), &reply) {
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

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.keeper.close();
        self.orphans.release_all(self.wakeups.channel_prefix());
    }
}

impl RedisStore {
    /// Stores `value` as what the election leader holding the mutex `keys` with `token` (its grant's `fence`)
    /// proclaims (`proclaim.lua`): true when the grant still held the lock.
    pub(crate) async fn proclaim(
        &self,
        keys: &LockKeys,
        token: &str,
        fence: Fence,
        value: &str,
    ) -> Result<bool, Error> {
        let mut invocation = PROCLAIM.key(&keys.lock);
        invocation
            .key(keys.value())
            .key(keys.terms())
            .key(keys.fence())
            .arg(token)
            .arg(format!("{} {value}", fence.get()))
            .arg(crate::engine::keys::millis(self.fence_retention));
        match self.conn.invoke_idempotent::<i64>(&invocation).await {
            Ok(stored) => Ok(stored == 1),
            Err(err) => Err(script_error(&self.conn, &keys.lock, err).await),
        }
    }

    /// Counts the term of the election leader holding the mutex `keys` with `token` (its grant's `fence`), which
    /// publishes `value` (`term.lua`): the term's number, or `None` when the grant no longer held the lock.
    pub(crate) async fn begin_term(
        &self,
        keys: &LockKeys,
        token: &str,
        fence: Fence,
        value: &str,
    ) -> Result<Option<u64>, Error> {
        let mut invocation = TERM.key(&keys.lock);
        invocation
            .key(keys.value())
            .key(keys.terms())
            .arg(token)
            .arg(fence.get())
            .arg(value)
            .arg(crate::engine::keys::millis(self.fence_retention));
        match self.conn.invoke_idempotent::<u64>(&invocation).await {
            Ok(term) => Ok((term > 0).then_some(term)),
            Err(err) => Err(script_error(&self.conn, &keys.lock, err).await),
        }
    }

    /// How many terms of the election `keys` were counted (`term.lua`); 0 when none, or the count lapsed.
    pub(crate) async fn terms(&self, keys: &LockKeys) -> Result<u64, Error> {
        let mut conn = self.conn.clone();
        let key = keys.terms().to_string();
        let count: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(Error::Redis)?;
        match count {
            None => Ok(0),
            Some(count) => count.parse().map_err(|_| Error::NotALock {
                key,
                detail: format!("term count holds {count:?}"),
            }),
        }
    }

    /// The state of the lock `keys` (named `name`), read in one atomic step (`inspect.lua`), as
    /// [`Client::inspect`](crate::Client::inspect) returns it.
    pub(crate) async fn inspect(&self, keys: &LockKeys, name: &str) -> Result<LockInfo, Error> {
        let mut invocation = INSPECT.key(&keys.lock);
        invocation
            .key(keys.fence())
            .key(keys.waiters())
            .key(keys.value());
        let read: redis::RedisResult<Vec<redis::Value>> =
            self.conn.invoke_idempotent(&invocation).await;
        let read = match read {
            Ok(read) => read,
            Err(err) => return Err(script_error(&self.conn, &keys.lock, err).await),
        };
        let text = |v: &redis::Value| {
            redis::from_redis_value::<Option<String>>(v.clone())
                .ok()
                .flatten()
        };
        let int = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).unwrap_or(0);
        let (Some(kind), Some(fence), Some(waiting), Some(permits), Some(proclaimed)) = (
            read.first(),
            read.get(1),
            read.get(2),
            read.get(3),
            read.get(4),
        ) else {
            return Err(Error::NotALock {
                key: keys.lock.clone(),
                detail: "unexpected reply to inspect".to_owned(),
            });
        };
        let kind = text(kind).unwrap_or_default();
        let mut holders = Vec::new();
        for pair in read[5..].chunks(2) {
            let [hold, ms] = pair else { continue };
            let Some(hold) = text(hold) else { continue };
            let remaining = u64::try_from(int(ms)).ok().map(Duration::from_millis);
            let token = crate::fence::token_of(&hold);
            if !token.starts_with(TOKEN_PREFIX) {
                return Err(foreign(&keys.lock, &hold));
            }
            holders.push(Holder {
                description: description_of(token).map(str::to_owned),
                value: crate::fence::value_of(token).map(str::to_owned),
                term: None,
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
        // A value an election's leader proclaimed counts for the term whose fence it names, the holder's: the lock's
        // last fence (a mutex's fence is drawn when it is granted).
        if let (Some(holder), Some(proclaimed), Some(last)) =
            (holders.first_mut(), text(proclaimed), last_fence)
        {
            if let Some((fence, published)) = proclaimed.split_once(' ') {
                if holder.value.is_some() && fence.parse::<u64>().ok() == Some(last.get()) {
                    let (value, term) = crate::fence::value_and_term(published);
                    holder.value = Some(value.to_owned());
                    holder.term = term;
                }
            }
        }
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

    /// [`inspect`](RedisStore::inspect) of the lock called `name`, under this client's prefix.
    async fn inspect_name(&self, name: &str) -> Result<LockInfo, Error> {
        let keys = LockKeys::new(&self.prefix, name)?;
        self.inspect(&keys, name).await
    }

    /// The held locks whose names match the glob `pattern`, as [`Client::held_locks`](crate::Client::held_locks)
    /// returns them: a `SCAN` of every node walked, then each lock read as [`inspect`](RedisStore::inspect) reads it.
    pub(crate) async fn held_locks(&self, pattern: &str) -> Result<Vec<LockInfo>, Error> {
        let prefix = &self.prefix;
        let glob = format!("{}:{{{pattern}}}", escape_glob(prefix));
        let head = prefix.len() + 2;
        let mut names = Vec::new();
        for keys in scan_all(&self.conn, &glob).await? {
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
        for chunk in names.chunks(crate::backend::HELD_LOCKS_CHUNK) {
            let infos =
                futures_util::future::join_all(chunk.iter().map(|name| self.inspect_name(name)))
                    .await;
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

    /// Deletes the lock `keys` whoever holds it and wakes its waiters (`force_release.lua`): the token removed, if
    /// any.
    pub(crate) async fn force_release(&self, keys: &LockKeys) -> Result<Option<String>, Error> {
        let wakeups = &self.wakeups;
        let removed: redis::RedisResult<Option<String>> = FORCE_RELEASE
            .key(&keys.lock)
            .key(keys.queue())
            .key(keys.waiters())
            .key(keys.fence())
            .arg(wakeups.channel_prefix())
            .arg(crate::engine::ttl::millis(self.fence_retention))
            .invoke_async(&mut self.conn.clone())
            .await;
        let removed = match removed {
            Ok(removed) => removed,
            Err(err) => return Err(script_error(&self.conn, &keys.lock, err).await),
        };
        match removed {
            Some(token) if !token.starts_with(TOKEN_PREFIX) => Err(foreign(&keys.lock, &token)),
            removed => Ok(removed),
        }
    }

    /// On a Redis Cluster connection of leasehold's own, its per-node pipelines so far (see
    /// [`Client::cluster_pipelines`](crate::Client::cluster_pipelines)).
    pub(crate) fn cluster_pipelines(&self) -> Option<(u64, u64, u64)> {
        match &self.conn {
            Conn::Cluster(_, _, owners) => Some(owners.pipelines()),
            _ => None,
        }
    }
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
