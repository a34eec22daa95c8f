//! etcd's session primitives: one etcd lease (a client has one per lease TTL), granted, kept alive on one
//! `LeaseKeepAlive` stream, read back, revoked. The engine (`backend/session/`) runs its life.
//!
//! The deadline is the engine's rule: a keep-alive that etcd acknowledged with TTL `t` renewed the lease at some
//! instant after it was *sent*, so the server cannot expire the lease before `send time + t`. The keeper sends every
//! TTL/3, so two keep-alives can fail before the deadline comes near, and one 100 ms after a keep-alive that got no
//! answer (on the next member).
//!
//! What counts as loss: a keep-alive answered with TTL ≤ 0 (the lease is gone: revoked, or expired on the server), or
//! the deadline passing without a newer acknowledgement. The keep-alive *stream* ending is not loss by itself: the
//! lease lives in the Raft log, not in the stream, and a stream ends whenever its member dies, which in a cluster
//! would otherwise lose every session of the clients connected to the old leader. The keeper opens a new stream on
//! the next member instead, and the deadline bounds how long that may take.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::endpoints::{is_transient, Endpoints};
use super::kind::FreeKeys;
use super::rpc::{self, LeaseKeepAliveStream, LeaseKeeper};
use super::store::Etcd;
use super::EtcdError;
use crate::backend::session::{self as engine, Background, Opened, Renewal, SessionLoss};
use crate::engine::clock;

/// The shortest session TTL: etcd raises any shorter lease to its minimum, `ceil(1.5 × election timeout)`, which is
/// 2 s with the default 1 s election timeout, and grants whole seconds only. Asking for less would silently hold
/// keys longer than asked, so shorter TTLs are refused.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// The session TTL unless one is set: the default lease of every store ([`crate::DEFAULT_TTL`], 30 s), long enough to
/// ride out a leader election (about 1.3 s measured) many times over between keep-alives.
pub const DEFAULT_TTL: Duration = crate::engine::ttl::DEFAULT_TTL;

/// How long the keeper waits before trying again after a failed keep-alive: a new leader is usually elected within
/// about 1.3 s, and a retry every so often reaches it well before the deadline.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Options of [`Session::connect`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SessionOptions {
    /// The lease TTL: whole seconds, at least [`MIN_TTL`]. Defaults to [`DEFAULT_TTL`].
    pub ttl: Duration,
    /// The deadline of each try of each request. Defaults to a third of the TTL, at most 2 s: a call to a dead
    /// leader then gives up, and moves on to the next member, long before the lease could run out.
    pub call_timeout: Option<Duration>,
    /// For `etcds://` URLs: the CA to trust instead of the system's, and a client identity.
    pub(crate) tls: super::endpoints::EtcdTls,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: DEFAULT_TTL,
            call_timeout: None,
            tls: super::endpoints::EtcdTls::default(),
        }
    }
}

impl SessionOptions {
    /// Sets the lease TTL. Defaults to [`DEFAULT_TTL`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the per-call deadline. Defaults to a third of the TTL, at most 2 s.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }
}

/// What an etcd session holds: its connection to the members, its lease, and the keep-alive stream.
pub(crate) struct Conn {
    pub(crate) endpoints: Endpoints,
    pub(crate) lease: i64,
    /// The keep-alive stream and the member it is open on; one keep-alive at a time uses it.
    stream: tokio::sync::Mutex<Option<(usize, LeaseKeeper, LeaseKeepAliveStream)>>,
    /// Waiter keys this session may write again (see [`FreeKeys`]).
    pub(crate) free_keys: std::sync::Mutex<FreeKeys>,
}

impl Conn {
    /// The waiter keys this session may write again.
    pub(crate) fn free_keys(&self) -> std::sync::MutexGuard<'_, FreeKeys> {
        self.free_keys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a session and its keeper share, on etcd.
pub(crate) type Shared = engine::Shared<Etcd>;

/// Connects to the members of `url` and grants a lease of `options.ttl` (whole seconds, at least [`MIN_TTL`]).
pub(crate) async fn open(url: &str, options: &SessionOptions) -> Result<Opened<Conn>, EtcdError> {
    let ttl = options.ttl;
    if ttl < MIN_TTL || ttl.subsec_nanos() != 0 {
        return Err(EtcdError::InvalidTtl(ttl));
    }
    let call_timeout = options
        .call_timeout
        .unwrap_or_else(|| (ttl / 3).min(Duration::from_secs(2)));
    let endpoints = Endpoints::connect(url, call_timeout, &options.tls).await?;
    let ttl_s = i64::try_from(ttl.as_secs()).map_err(|_| EtcdError::InvalidTtl(ttl))?;
    let sent = clock::now();
    // A retried grant may leave the first lease unused; it expires on its own.
    let granted = endpoints
        .call("lease grant", |mut c| async move {
            c.lease_grant(ttl_s, None).await
        })
        .await?;
    if !granted.error().is_empty() {
        return Err(EtcdError::Protocol("lease grant"));
    }
    let granted_ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
    Ok(Opened {
        conn: Conn {
            endpoints,
            lease: granted.id(),
            stream: tokio::sync::Mutex::new(None),
            free_keys: std::sync::Mutex::default(),
        },
        sent,
        ttl: granted_ttl,
        validity: granted_ttl,
        renew_every: granted_ttl / 3,
        retry_after: RETRY_PAUSE,
    })
}

/// Revokes the session's lease, which deletes every key of the session; a lease already gone is as good.
pub(crate) async fn revoke(shared: &Shared) -> Result<(), EtcdError> {
    let lease = shared.conn.lease;
    let revoked = shared
        .conn
        .endpoints
        .call("lease revoke", |mut c| async move {
            c.lease_revoke(lease).await
        })
        .await;
    match revoked {
        // Already gone (expired, or a retried revoke): what was asked.
        Err(EtcdError::Etcd {
            source: rpc::Error::GRpcStatus(status),
            ..
        }) if status.code() == tonic::Code::NotFound => Ok(()),
        other => other.map(drop),
    }
}

/// One keep-alive on the session's stream, opening the stream first if there is none (opening sends one). A
/// keep-alive that gets no answer drops the stream and marks its member failed: the next one opens a stream on the
/// next member.
pub(crate) async fn renew(shared: &Shared) -> Renewal<(Arc<str>, i64)> {
    let conn = &shared.conn;
    let timeout = conn.endpoints.call_timeout();
    let mut stream = conn.stream.lock().await;
    let renewed = |ttl| Renewal::Renewed {
        validity: ttl,
        entries: None,
    };
    let Some((i, keeper, responses)) = &mut *stream else {
        let (i, mut client) = conn.endpoints.current();
        return match tokio::time::timeout(timeout, client.lease_keep_alive(conn.lease)).await {
            Ok(Ok((keeper, responses))) => {
                *stream = Some((i, keeper, responses));
                // The client read the first answer and checked its TTL > 0; the TTL is the granted one.
                renewed(shared.ttl)
            }
            Ok(Err(rpc::Error::LeaseKeepAliveError(_))) => Renewal::Ended,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "opening the etcd keep-alive stream failed");
                conn.endpoints.failed(i);
                Renewal::Failed
            }
            Err(_) => {
                conn.endpoints.failed(i);
                Renewal::Failed
            }
        };
    };
    let exchange = async {
        keeper.keep_alive().await?;
        responses.message().await
    };
    let answer = tokio::time::timeout(timeout, exchange).await;
    match answer {
        Ok(Ok(Some(response))) if response.ttl() > 0 => {
            renewed(Duration::from_secs(response.ttl().unsigned_abs()))
        }
        Ok(Ok(Some(_))) => Renewal::Ended,
        failed => {
            if let Ok(Err(e)) = &failed {
                tracing::debug!(error = %e, transient = is_transient(e), "etcd keep-alive failed");
            }
            // The stream ended, broke, or gave no answer in time: the next keep-alive opens one on the next member.
            let i = *i;
            *stream = None;
            conn.endpoints.failed(i);
            Renewal::Failed
        }
    }
}

/// The second check: reads the waiter keys of `keys` (each with the create revision of its grant) in one
/// transaction; a key is still its grant's when it exists, was created at that revision, and is under this session's
/// lease (not deleted by `release --force` or `etcdctl del`, nor re-created). `None` when unanswered.
pub(crate) async fn read_keys(shared: &Shared, keys: &[(Arc<str>, i64)]) -> Option<Vec<bool>> {
    let read = shared
        .conn
        .endpoints
        .call("ownership read", |mut c| {
            let txn = rpc::Txn::new().and_then(
                keys.iter()
                    .map(|(key, _)| {
                        rpc::TxnOp::get(&**key, Some(rpc::GetOptions::new().with_keys_only()))
                    })
                    .collect::<Vec<_>>(),
            );
            async move { c.txn(txn).await }
        })
        .await
        .ok()?;
    let verdicts = keys
        .iter()
        .zip(read.op_responses())
        .map(|((_, revision), response)| match response {
            rpc::TxnOpResponse::Get(get) => get.kvs().first().is_some_and(|kv| {
                kv.create_revision() == *revision && kv.lease() == shared.conn.lease
            }),
            // Not a read's answer: no verdict against the grant.
            _ => true,
        })
        .collect();
    Some(verdicts)
}

/// One etcd lease, kept alive in the background, under which every waiter key of this client lives: the recipe on
/// its own, for leasehold's tests of it (a [`crate::Client`] on etcd runs the same sessions through its engine).
///
/// Dropping the session stops the keeper and revokes the lease in the background (when a runtime is there to run
/// it), which deletes every key of the session at once; [`close`](Self::close) does the same and waits for it.
#[derive(Debug)]
pub struct Session {
    pub(crate) inner: engine::life::Session<Etcd>,
}

impl Session {
    /// Connects to the members of `url` (`etcd://host:port[,host:port…]`), grants a lease of `options.ttl` and
    /// starts keeping it alive.
    ///
    /// # Errors
    ///
    /// [`EtcdError::InvalidUrl`], [`EtcdError::InvalidTtl`]; [`EtcdError::Timeout`] or [`EtcdError::Etcd`] when no
    /// member grants the lease.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the grant was sent leaves an unused lease, which etcd expires after its TTL; no
    /// key is ever written under it.
    pub async fn connect(url: &str, options: SessionOptions) -> Result<Session, EtcdError> {
        let ttl = options.ttl;
        let store = Etcd::new(url, String::new(), options);
        let inner =
            engine::life::Session::open(&store, ttl, &Arc::new(Background::default())).await?;
        Ok(Session { inner })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// The lease id. Waiter keys carry it in hex, as `etcdctl lock` does.
    pub fn lease_id(&self) -> i64 {
        self.inner.shared.conn.lease
    }

    /// The TTL etcd granted (at least what was asked).
    pub fn ttl(&self) -> Duration {
        self.inner.shared.ttl
    }

    /// The per-call deadline of every request this session makes.
    pub fn call_timeout(&self) -> Duration {
        self.inner.shared.conn.endpoints.call_timeout()
    }

    /// The local deadline, on the lease clock: the send time of the last acknowledged keep-alive plus the TTL, less
    /// the drift allowance. etcd cannot expire the lease before it.
    pub fn deadline(&self) -> Instant {
        self.inner.shared.state.deadline()
    }

    /// Why the lease is lost, or `None` while it is held (the deadline not yet passed and no loss reported).
    pub fn loss(&self) -> Option<SessionLoss> {
        self.inner.loss()
    }

    /// Resolves when the lease is lost, at the deadline at the latest.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> SessionLoss {
        self.inner.shared.lost().await
    }

    /// Stops the keeper and revokes the lease, which deletes every key of the session.
    ///
    /// # Errors
    ///
    /// [`EtcdError::Timeout`] or [`EtcdError::Etcd`] when no member revoked it; the lease then expires after its TTL.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the revoke to the session's drop, in the background.
    pub async fn close(self) -> Result<(), EtcdError> {
        self.inner.close().await
    }
}
