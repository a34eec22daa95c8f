//! The command connection: either a [`ConnectionManager`] leasehold opened (and replaces when it goes silent), or a
//! connection the caller brought.
//!
//! redis-rs's `ConnectionManager` reconnects when the connection reports its end, but not when requests merely time
//! out. A flow that a NAT or load balancer forgot never reports its end: every request times out forever. So after
//! [`SILENT_AFTER`] consecutive timeouts with no reply in between, leasehold opens a new manager and swaps it in.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, ScriptInvocation, Value};

use crate::scripts::ScriptCall;

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
    /// A Redis Cluster connection (leasehold's or the caller's), each request bounded by the timeout.
    Cluster(ClusterConnection, Duration),
    /// Another connection, with `WAIT` after each script (see [`Conn::invoke_acked`]).
    Acked(Arc<Acked>),
    /// The primary that the sentinels name, followed across failovers.
    Followed(Arc<crate::sentinel::Followed>),
}

/// A [`ConnectionManager`] that is replaced when it goes silent.
pub(crate) struct Managed {
    current: RwLock<ConnectionManager>,
    /// The URL that reaches this server as a cluster node, password hidden, for [`cluster_node`].
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
            tracing::warn!("redis connection timed out {SILENT_AFTER} times in a row; opening a new one");
            let fresh =
                ConnectionManager::new_with_config(this.redis.clone(), this.config.clone()).await;
            match fresh {
                Ok(fresh) => {
                    *this.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                    this.timeouts.store(0, Ordering::Release);
                }
                Err(err) => tracing::debug!(error = %err, "new redis connection failed; next timeout retries"),
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
            cluster_url: crate::topology::cluster_url(redis.get_connection_info()),
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
                cluster_url: crate::topology::cluster_url(redis.get_connection_info()),
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
        Conn::Cluster(conn, timeout)
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
                tracing::debug!(error = %err, "connection dropped; retrying once");
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

/// The code of the error a single-server connection returns for a cluster redirection (see [`redirected`]).
const CLUSTER_NODE_CODE: &str = "LEASEHOLD_CLUSTER_NODE";

fn is_redirect_code(code: &str) -> bool {
    matches!(code, "MOVED" | "ASK")
}

/// `err`, or, when it is a cluster redirection (`MOVED`, `ASK`) met on a connection to one server, an error that says
/// so ([`cluster_node`] reads it back, and [`Error::ClusterNode`](crate::Error::ClusterNode) is made of it). A
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

/// The URL to use and the server's answer, for an error made by [`redirected`].
pub(crate) fn cluster_node(err: &redis::RedisError) -> Option<(&str, &str)> {
    if err.code() != Some(CLUSTER_NODE_CODE) {
        return None;
    }
    err.detail()?.split_once(' ')
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
            Conn::Cluster(c, timeout) => Conn::Cluster(c.clone(), *timeout),
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
            Conn::Cluster(c, timeout) => {
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
            Conn::Cluster(c, timeout) => {
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
            Conn::Cluster(c, _) => c.get_db(),
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
