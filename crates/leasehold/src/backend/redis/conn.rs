//! The command connection: either a [`ConnectionManager`] leasehold opened (and replaces when it goes silent), or a
//! connection the caller brought.
//!
//! redis-rs's `ConnectionManager` reconnects when the connection reports its end, but not when requests merely time
//! out. A flow that a NAT or load balancer forgot never reports its end: every request times out forever. So after
//! [`SILENT_AFTER`] consecutive timeouts with no reply in between, leasehold opens a new manager and swaps it in.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, ScriptInvocation, Value};

use crate::backend::redis::scripts::ScriptCall;
use crate::error::CLUSTER_NODE_CODE;

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::conn=debug`).
const TARGET: &str = "leasehold::conn";

/// Consecutive timed-out requests after which the connection is considered silently dead and replaced.
const SILENT_AFTER: u32 = 2;

/// Any connection the caller already has: [`redis::aio::MultiplexedConnection`], [`ConnectionManager`], or any
/// other cheaply cloneable [`ConnectionLike`] that multiplexes requests.
pub(crate) trait SharedConnection: ConnectionLike + Send + Sync {
    fn boxed_clone(&self) -> Box<dyn SharedConnection>;
}

impl<T> SharedConnection for T
where
    T: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn boxed_clone(&self) -> Box<dyn SharedConnection> {
        Box::new(self.clone())
    }
}

/// The connection every command of a client goes through. Cloning it is cheap (an `Arc` or a boxed handle), and
/// each request clones it, so concurrent requests pipeline on one socket.
pub(crate) enum Conn {
    Managed(Arc<Managed>),
    Shared(Box<dyn SharedConnection>),
    /// A Redis Cluster connection (leasehold's or the caller's), each request bounded by the timeout, and which slots
    /// its primaries serve (for [`Conn::invoke_by_node`]).
    Cluster(ClusterConnection, Duration, Arc<SlotOwners>),
    /// Another connection, with `WAIT` after each script (see [`Conn::invoke_acked`]).
    Acked(Arc<Acked>),
    /// The primary that the sentinels name, followed across failovers.
    Followed(Arc<crate::backend::redis::sentinel::Followed>),
}

/// A [`ConnectionManager`] that is replaced when it goes silent.
pub(crate) struct Managed {
    current: RwLock<ConnectionManager>,
    /// The URL that reaches this server as a cluster node, password hidden, for [`cluster_node`](crate::error::cluster_node).
    cluster_url: String,
    redis: redis::Client,
    config: ConnectionManagerConfig,
    timeouts: AtomicU32,
    replacing: AtomicBool,
}

impl Managed {
    fn current(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn observe<T>(self: &Arc<Self>, result: &RedisResult<T>) {
        match result {
            Err(err) if err.is_timeout() => {
                let silent = self.timeouts.fetch_add(1, Ordering::AcqRel) + 1 >= SILENT_AFTER;
                if silent && !self.replacing.swap(true, Ordering::AcqRel) {
                    self.replace();
                }
            }
            // Any reply, even an error reply, proves the flow alive.
            _ => self.timeouts.store(0, Ordering::Release),
        }
    }

    fn replace(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.replacing.store(false, Ordering::Release);
            return;
        };
        let this = Arc::clone(self);
        runtime.spawn(async move {
            tracing::warn!(target: TARGET, "redis connection timed out {SILENT_AFTER} times in a row; opening a new one");
            let fresh =
                ConnectionManager::new_with_config(this.redis.clone(), this.config.clone()).await;
            match fresh {
                Ok(fresh) => {
                    *this.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                    this.timeouts.store(0, Ordering::Release);
                }
                Err(err) => tracing::debug!(target: TARGET, error = %err, "new redis connection failed; next timeout retries"),
            }
            this.replacing.store(false, Ordering::Release);
        });
    }
}

impl Conn {
    /// Opens a managed connection.
    pub(crate) async fn managed(
        redis: redis::Client,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Conn> {
        let manager = ConnectionManager::new_with_config(redis.clone(), config.clone()).await?;
        Ok(Conn::Managed(Arc::new(Managed {
            current: RwLock::new(manager),
            cluster_url: crate::backend::redis::topology::cluster_url(redis.get_connection_info()),
            redis,
            config,
            timeouts: AtomicU32::new(0),
            replacing: AtomicBool::new(false),
        })))
    }

    /// A managed connection that connects on its first request (a quorum node that is down now must not keep the
    /// quorum from starting). Falls back to a connection opened now when the lazy kind cannot be made.
    pub(crate) fn lazy(redis: redis::Client, config: ConnectionManagerConfig) -> Conn {
        let manager = ConnectionManager::new_lazy_with_config(redis.clone(), config.clone());
        match manager {
            Ok(manager) => Conn::Managed(Arc::new(Managed {
                current: RwLock::new(manager),
                cluster_url: crate::backend::redis::topology::cluster_url(
                    redis.get_connection_info(),
                ),
                redis,
                config,
                timeouts: AtomicU32::new(0),
                replacing: AtomicBool::new(false),
            })),
            Err(_) => Conn::Shared(Box::new(Unreachable)),
        }
    }

    /// A cluster connection whose every request (with its redirections and retries) is given up after `timeout`:
    /// the cluster client's own timeouts were seen not to bound a request in every case (FIELD-NOTES).
    pub(crate) fn cluster(conn: ClusterConnection, timeout: Duration) -> Conn {
        Conn::Cluster(conn, timeout, Arc::new(SlotOwners::default()))
    }

    pub(crate) fn shared<C>(conn: C) -> Conn
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        Conn::Shared(Box::new(conn))
    }

    /// Runs an idempotent script, retried once on a fresh connection when the first try found its connection
    /// dropped (the first request after a Redis restart fails with a broken pipe, for example). Timeouts are not
    /// retried: the request may still be running, and callers bound their time.
    ///
    /// Only for scripts that are idempotent per token: the first try may have run before its connection died.
    pub(crate) async fn invoke_idempotent<T: redis::FromRedisValue + Send>(
        &self,
        invocation: &impl Invocation,
    ) -> RedisResult<T> {
        self.invoke_idempotent_tracked(invocation).await.0
    }

    /// [`Conn::invoke_idempotent`], and whether the script may have run on the server: `false` only when every try
    /// failed to reach Redis at all (the connection was refused), so that nothing was sent.
    pub(crate) async fn invoke_idempotent_tracked<T: redis::FromRedisValue + Send>(
        &self,
        invocation: &impl Invocation,
    ) -> (RedisResult<T>, bool) {
        match invocation.invoke_on(&mut self.clone()).await {
            Err(err) if is_dropped(&err) => {
                tracing::debug!(target: TARGET, error = %err, "connection dropped; retrying once");
                let first_sent = !err.is_connection_refusal();
                let result = invocation.invoke_on(&mut self.clone()).await;
                let sent = first_sent || !matches!(&result, Err(e) if e.is_connection_refusal());
                (result, sent)
            }
            Err(err) if err.is_connection_refusal() => (Err(err), false),
            result => (result, true),
        }
    }
}

/// A script call ready to send: a [`ScriptInvocation`], or a [`ScriptCall`] built straight into its command.
pub(crate) trait Invocation: Sync {
    /// Runs the script on `conn` (loading it first if the server does not have it).
    fn invoke_on<T: redis::FromRedisValue + Send>(
        &self,
        conn: &mut Conn,
    ) -> impl std::future::Future<Output = RedisResult<T>> + Send;
}

impl Invocation for ScriptInvocation<'_> {
    fn invoke_on<T: redis::FromRedisValue + Send>(
        &self,
        conn: &mut Conn,
    ) -> impl std::future::Future<Output = RedisResult<T>> + Send {
        self.invoke_async(conn)
    }
}

impl Invocation for ScriptCall {
    fn invoke_on<T: redis::FromRedisValue + Send>(
        &self,
        conn: &mut Conn,
    ) -> impl std::future::Future<Output = RedisResult<T>> + Send {
        self.invoke_async(conn)
    }
}

/// A client's requirement that grants and renewals be acknowledged by replicas before they count (see
/// [`Builder::replicas`](crate::Builder::replicas)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    /// How many replicas must acknowledge.
    pub(crate) count: u32,
    /// How long the server waits for them (`WAIT`'s timeout).
    pub(crate) timeout: Duration,
    /// Acknowledged means written to the append-only file, here and on `count` replicas (`WAITAOF 1 count`),
    /// rather than received by `count` replicas (`WAIT count`).
    pub(crate) on_disk: bool,
}

impl Conn {
    /// [`Conn::invoke_idempotent_tracked`], with `WAIT count timeout` pipelined after the script when `acks` is given:
    /// both in one round trip, on the script's node (on a cluster a pipeline goes where its first keyed command goes;
    /// a bare `WAIT` would go to every primary and answer the minimum). Returns the script's reply, whether it may have
    /// run, and how many replicas acknowledged its writes (`None` without `acks`, or when the call failed).
    pub(crate) async fn invoke_acked<T: redis::FromRedisValue + Send>(
        &self,
        invocation: &impl Invocation,
        acks: Option<ReplicaAcks>,
    ) -> (RedisResult<T>, bool, Option<u32>) {
        let Some(acks) = acks else {
            let (reply, sent) = self.invoke_idempotent_tracked(invocation).await;
            return (reply, sent, None);
        };
        let acked = Arc::new(std::sync::Mutex::new(None));
        let conn = Conn::Acked(Arc::new(Acked {
            conn: self.clone(),
            acks,
            acked: Arc::clone(&acked),
        }));
        let (reply, sent) = conn.invoke_idempotent_tracked(invocation).await;
        let acked = *acked.lock().unwrap_or_else(|e| e.into_inner());
        let acked = acked.filter(|_| reply.is_ok());
        (reply, sent, acked)
    }
}

/// One script call's result in [`Conn::invoke_by_node`], as [`Conn::invoke_acked`] gives it: the reply, whether the
/// call may have run, and how many replicas acknowledged it.
pub(crate) type Sent<T> = (RedisResult<T>, bool, Option<u32>);

impl Conn {
    /// Runs `calls` at once, each a script call whose keys share the hash slot paired with it, and returns their
    /// results in order. On a Redis Cluster the calls whose slots one primary serves travel to it as one pipeline:
    /// one round trip and one request through the cluster client per node, however many slots (a script's keys must
    /// share a slot, so each slot still costs the server a script call). Elsewhere, or when replica acknowledgements
    /// are required (each call then needs its own `WAIT`), the calls go separately, concurrently.
    ///
    /// A pipeline that meets a moved slot (resharding, failover) is given up as a whole by the cluster client after
    /// its retries; its calls are then sent one by one, each following its own redirection, and the map of slot
    /// owners is read again. That resends calls that may have run: only for scripts that are idempotent per token.
    pub(crate) async fn invoke_by_node<T: redis::FromRedisValue + Send>(
        &self,
        calls: &[(u16, ScriptCall)],
        acks: Option<ReplicaAcks>,
    ) -> Vec<Sent<T>> {
        let (conn, timeout, owners) = match self {
            Conn::Cluster(conn, timeout, owners) if acks.is_none() && calls.len() > 1 => {
                (conn, *timeout, owners)
            }
            _ => {
                return join_all(calls.iter().map(|(_, call)| self.invoke_acked(call, acks))).await;
            }
        };
        let groups = owners.group(calls.iter().map(|(slot, _)| *slot), conn, timeout);
        let results = join_all(groups.iter().map(|group| async move {
            let sent = self
                .pipeline_on_node(conn, timeout, owners, calls, group)
                .await;
            group.iter().copied().zip(sent).collect::<Vec<_>>()
        }))
        .await;
        let mut results: Vec<(usize, Sent<T>)> = results.into_iter().flatten().collect();
        results.sort_unstable_by_key(|(i, _)| *i);
        results.into_iter().map(|(_, sent)| sent).collect()
    }

    /// The calls `group` names (indexes into `calls`), all on one node, as one pipeline routed by the first one's
    /// slot; see [`Conn::invoke_by_node`].
    async fn pipeline_on_node<T: redis::FromRedisValue + Send>(
        &self,
        conn: &ClusterConnection,
        timeout: Duration,
        owners: &SlotOwners,
        calls: &[(u16, ScriptCall)],
        group: &[usize],
    ) -> Vec<Sent<T>> {
        let first = match group {
            [] => return Vec::new(),
            [only] => {
                owners.alone.fetch_add(1, Ordering::Relaxed);
                return vec![self.invoke_acked(&calls[*only].1, None).await];
            }
            [first, ..] => *first,
        };
        let mut pipeline = redis::pipe();
        for &i in group {
            pipeline.add_command(calls[i].1.cmd().clone());
        }
        let route =
            SingleNodeRoutingInfo::SpecificNode(Route::new(calls[first].0, SlotAddr::Master));
        owners.pipelines.fetch_add(1, Ordering::Relaxed);
        owners
            .pipelined
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        let reply = bounded(
            timeout,
            conn.clone().route_pipeline(pipeline, 0, group.len(), route),
        )
        .await;
        match reply {
            Ok(values) if values.len() == group.len() => {
                join_all(group.iter().zip(values).map(|(&i, value)| async move {
                    match value {
                        // A node that restarted lost its scripts; one whose slot moved answers a redirection that
                        // the cluster client did not follow (it follows only a pipeline's first): the call again on
                        // its own, which loads the script, or follows the redirection.
                        Value::ServerError(err)
                            if err.code() == "NOSCRIPT" || is_redirect_code(err.code()) =>
                        {
                            if is_redirect_code(err.code()) {
                                owners.forget();
                            }
                            self.invoke_acked(&calls[i].1, None).await
                        }
                        Value::ServerError(err) => (Err(err.into()), true, None),
                        value => (T::from_redis_value(value).map_err(Into::into), true, None),
                    }
                }))
                .await
            }
            // A timed-out pipeline may still run: not resent (callers bound their time, as for any call).
            Err(err) if err.is_timeout() => group
                .iter()
                .map(|_| (Err(err.clone()), true, None))
                .collect(),
            reply => {
                let reached = !matches!(&reply, Err(err) if err.is_connection_refusal());
                if let Err(err) = &reply {
                    tracing::debug!(target: TARGET, error = %err, calls = group.len(), "cluster pipeline failed; sending its calls one by one");
                }
                owners.forget();
                join_all(group.iter().map(|&i| async move {
                    let (reply, sent, acked) = self.invoke_acked(&calls[i].1, None).await;
                    (reply, sent || reached, acked)
                }))
                .await
            }
        }
    }
}

/// Slots a primary serves: the first, the last, and the primary's number.
type SlotRange = (u16, u16, usize);

/// Which primary serves each hash slot, as `CLUSTER SLOTS` last said: only to group calls by node
/// ([`Conn::invoke_by_node`]). Routing stays the cluster client's, so a stale map costs a pipeline its retries, never a
/// call its answer. Read on first use and again after a redirection, in the background; until then each call goes on
/// its own.
#[derive(Default)]
pub(crate) struct SlotOwners {
    ranges: RwLock<Option<Arc<Vec<SlotRange>>>>,
    reading: AtomicBool,
    /// Pipelines sent, the script calls they carried, and calls sent alone (for tests and diagnostics).
    pipelines: AtomicU64,
    pipelined: AtomicU64,
    alone: AtomicU64,
}

impl SlotOwners {
    /// The indexes of `slots` grouped by the node that serves them (each alone while the map is unknown).
    fn group(
        self: &Arc<Self>,
        slots: impl Iterator<Item = u16>,
        conn: &ClusterConnection,
        timeout: Duration,
    ) -> Vec<Vec<usize>> {
        let ranges = self
            .ranges
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(ranges) = ranges else {
            self.read(conn, timeout);
            return slots.enumerate().map(|(i, _)| vec![i]).collect();
        };
        let mut groups: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
        for (i, slot) in slots.enumerate() {
            let at = ranges.partition_point(|&(_, last, _)| last < slot);
            let node = ranges
                .get(at)
                .filter(|&&(first, _, _)| first <= slot)
                .map(|&(_, _, node)| node);
            match groups
                .iter_mut()
                .find(|(owner, _)| node.is_some() && *owner == node)
            {
                Some((_, group)) => group.push(i),
                None => groups.push((node, vec![i])),
            }
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }

    /// Pipelines sent so far, the script calls they carried, and the calls sent alone.
    pub(crate) fn pipelines(&self) -> (u64, u64, u64) {
        (
            self.pipelines.load(Ordering::Relaxed),
            self.pipelined.load(Ordering::Relaxed),
            self.alone.load(Ordering::Relaxed),
        )
    }

    /// Drops the map (a slot moved); the next use reads it again.
    fn forget(&self) {
        *self.ranges.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Reads the map in the background, unless a read is under way.
    fn read(self: &Arc<Self>, conn: &ClusterConnection, timeout: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.reading.swap(true, Ordering::AcqRel) {
            return;
        }
        let owners = Arc::clone(self);
        let mut conn = conn.clone();
        runtime.spawn(async move {
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
            let reply = bounded(
                timeout,
                conn.route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), routing),
            )
            .await;
            match reply.map(slot_ranges) {
                Ok(Some(ranges)) => {
                    *owners.ranges.write().unwrap_or_else(|e| e.into_inner()) =
                        Some(Arc::new(ranges));
                }
                Ok(None) => tracing::debug!(target: TARGET, "unexpected CLUSTER SLOTS reply; calls go one by one"),
                Err(err) => {
                    tracing::debug!(target: TARGET, error = %err, "CLUSTER SLOTS failed; calls go one by one")
                }
            }
            owners.reading.store(false, Ordering::Release);
        });
    }
}

/// `CLUSTER SLOTS`'s answer as sorted slot ranges with a number per primary (`None` when it is not such an answer):
/// each entry is the first slot, the last, then the primary's address and port, then its replicas'.
fn slot_ranges(reply: Value) -> Option<Vec<SlotRange>> {
    let Value::Array(entries) = reply else {
        return None;
    };
    let mut nodes: Vec<(Vec<u8>, i64)> = Vec::new();
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return None;
        };
        let [Value::Int(first), Value::Int(last), Value::Array(primary), ..] = fields.as_slice()
        else {
            return None;
        };
        let [Value::BulkString(host), Value::Int(port), ..] = primary.as_slice() else {
            return None;
        };
        let node = match nodes.iter().position(|(h, p)| h == host && p == port) {
            Some(node) => node,
            None => {
                nodes.push((host.clone(), *port));
                nodes.len() - 1
            }
        };
        ranges.push((
            u16::try_from(*first).ok()?,
            u16::try_from(*last).ok()?,
            node,
        ));
    }
    ranges.sort_unstable();
    Some(ranges)
}

/// A connection that sends `WAIT` after every script call (`EVALSHA`, `EVAL`) in the same pipeline, and keeps the
/// count it answered. Other commands (`SCRIPT LOAD` after `NOSCRIPT`) pass through.
pub(crate) struct Acked {
    conn: Conn,
    acks: ReplicaAcks,
    acked: Arc<std::sync::Mutex<Option<u32>>>,
}

impl Acked {
    async fn request(&self, cmd: &Cmd) -> RedisResult<Value> {
        let script = cmd
            .args_iter()
            .next()
            .is_some_and(|arg| matches!(arg, redis::Arg::Simple(name) if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL")));
        let mut conn = self.conn.clone();
        if !script {
            return conn.req_packed_command(cmd).await;
        }
        let mut pipeline = redis::pipe();
        pipeline.add_command(cmd.clone());
        pipeline.cmd("WAIT").arg(self.acks.count).arg(
            u64::try_from(self.acks.timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        let mut replies = conn.req_packed_commands(&pipeline, 0, 2).await?.into_iter();
        let (Some(reply), Some(acked)) = (replies.next(), replies.next()) else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "no reply to WAIT after a script",
            )));
        };
        if let Value::ServerError(err) = reply {
            return Err(err.into());
        }
        let acked = match acked {
            // WAIT: how many replicas have the writes.
            Value::Int(n) => u32::try_from(n).unwrap_or(0),
            // WAITAOF: [this server fsynced (0 or 1), how many replicas did]. Without the local fsync nothing counts.
            Value::Array(counts) => match counts.as_slice() {
                [Value::Int(local), Value::Int(replicas)] if *local >= 1 => {
                    u32::try_from(*replicas).unwrap_or(0)
                }
                _ => 0,
            },
            Value::ServerError(err) => return Err(err.into()),
            _ => 0,
        };
        *self.acked.lock().unwrap_or_else(|e| e.into_inner()) = Some(acked);
        Ok(reply)
    }
}

fn is_redirect_code(code: &str) -> bool {
    matches!(code, "MOVED" | "ASK")
}

/// `err`, or, when it is a cluster redirection (`MOVED`, `ASK`) met on a connection to one server, an error that says
/// so ([`cluster_node`](crate::error::cluster_node) reads it back, and [`Error::ClusterNode`](crate::Error::ClusterNode) is made of it). A
/// redirection there never passes by itself: the server is a cluster node, and the wait loops must not retry it as
/// they retry a redirection that a cluster connection could not follow yet.
fn redirected(err: redis::RedisError, cluster_url: &str) -> redis::RedisError {
    match err.code() {
        Some(code) if is_redirect_code(code) => {
            let answer = format!("{code} {}", err.detail().unwrap_or_default());
            redis::make_extension_error(
                CLUSTER_NODE_CODE.to_owned(),
                Some(format!("{cluster_url} {}", answer.trim_end())),
            )
        }
        _ => err,
    }
}

/// A connection that ended (reset, broken pipe, closed, refused while reconnecting), as opposed to a slow reply.
fn is_dropped(err: &redis::RedisError) -> bool {
    !err.is_timeout()
        && (err.is_connection_dropped() || err.is_connection_refusal() || err.is_io_error())
}

impl Clone for Conn {
    fn clone(&self) -> Self {
        match self {
            Conn::Managed(c) => Conn::Managed(Arc::clone(c)),
            Conn::Shared(c) => Conn::Shared(c.boxed_clone()),
            Conn::Cluster(c, timeout, owners) => {
                Conn::Cluster(c.clone(), *timeout, Arc::clone(owners))
            }
            Conn::Acked(c) => Conn::Acked(Arc::clone(c)),
            Conn::Followed(f) => Conn::Followed(Arc::clone(f)),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Managed(managed) => {
                let managed = Arc::clone(managed);
                Box::pin(async move {
                    let result = managed.current().req_packed_command(cmd).await;
                    managed.observe(&result);
                    match result {
                        // An error reply comes back as a value; the caller turns it into an error.
                        Ok(Value::ServerError(err)) if is_redirect_code(err.code()) => {
                            Err(redirected(err.into(), &managed.cluster_url))
                        }
                        result => result.map_err(|err| redirected(err, &managed.cluster_url)),
                    }
                })
            }
            Conn::Shared(c) => c.req_packed_command(cmd),
            Conn::Cluster(c, timeout, _) => {
                let timeout = *timeout;
                Box::pin(bounded(timeout, c.req_packed_command(cmd)))
            }
            Conn::Acked(c) => {
                let c = Arc::clone(c);
                Box::pin(async move { c.request(cmd).await })
            }
            Conn::Followed(f) => {
                let f = Arc::clone(f);
                Box::pin(async move {
                    let result = f.conn().req_packed_command(cmd).await;
                    f.observe(&result);
                    result
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Managed(managed) => {
                let managed = Arc::clone(managed);
                Box::pin(async move {
                    let result = managed
                        .current()
                        .req_packed_commands(pipeline, offset, count)
                        .await;
                    managed.observe(&result);
                    let redirect = result.as_ref().ok().and_then(|replies| {
                        replies.iter().find_map(|reply| match reply {
                            Value::ServerError(err) if is_redirect_code(err.code()) => {
                                Some(redis::RedisError::from(err.clone()))
                            }
                            _ => None,
                        })
                    });
                    match redirect {
                        Some(err) => Err(redirected(err, &managed.cluster_url)),
                        None => result.map_err(|err| redirected(err, &managed.cluster_url)),
                    }
                })
            }
            Conn::Shared(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c, timeout, _) => {
                let timeout = *timeout;
                Box::pin(bounded(
                    timeout,
                    c.req_packed_commands(pipeline, offset, count),
                ))
            }
            Conn::Acked(c) => {
                let mut conn = c.conn.clone();
                Box::pin(async move { conn.req_packed_commands(pipeline, offset, count).await })
            }
            Conn::Followed(f) => {
                let f = Arc::clone(f);
                Box::pin(async move {
                    let result = f.conn().req_packed_commands(pipeline, offset, count).await;
                    f.observe(&result);
                    result
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Managed(managed) => managed.current().get_db(),
            Conn::Shared(c) => c.get_db(),
            Conn::Cluster(c, _, _) => c.get_db(),
            Conn::Acked(c) => c.conn.get_db(),
            Conn::Followed(f) => f.conn().get_db(),
        }
    }
}

/// A node no connection could be made for: every request fails at once.
#[derive(Clone)]
struct Unreachable;

impl ConnectionLike for Unreachable {
    fn req_packed_command<'a>(&'a mut self, _cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async { Err(unreachable()) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async { Err(unreachable()) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

fn unreachable() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "no connection could be made to this node",
    ))
}

/// `request`, failed as timed out (an I/O error of kind `TimedOut`, which [`redis::RedisError::is_timeout`]
/// recognises) when it has not answered within `timeout`.
async fn bounded<T>(
    timeout: Duration,
    request: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no reply from the redis cluster within the response timeout",
        )
        .into()),
    }
}
