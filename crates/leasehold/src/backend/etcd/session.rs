//! The session: one etcd lease (a client has one per lease TTL: `backend/sessions.rs`), kept alive on one
//! `LeaseKeepAlive` stream, with a local deadline and a loss signal that fires at that deadline at the latest.
//!
//! The deadline follows the Redis keeper's rule (see [`crate::engine::ttl::drift`]): a keep-alive that etcd
//! acknowledged with TTL `t` renewed the lease at some instant after it was *sent*, so the server cannot expire the
//! lease before `send time + t`; the deadline is that, less the drift allowance, on the lease clock
//! ([`crate::engine::clock::now`], which counts suspended time). The keeper sends every TTL/3, so two keep-alives
//! can fail before the deadline comes near.
//!
//! What counts as loss: a keep-alive answered with TTL ≤ 0 (the lease is gone: revoked, or expired on the server), or
//! the deadline passing without a newer acknowledgement. The keep-alive *stream* ending is not loss by itself: the
//! lease lives in the Raft log, not in the stream, and a stream ends whenever its member dies, which in a cluster
//! would otherwise lose every session of the clients connected to the old leader. The keeper opens a new stream on
//! the next member instead, and the deadline bounds how long that may take.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::rpc::{self, LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::Instant;

use super::endpoints::{is_transient, Endpoints};
use super::EtcdError;
use crate::backend::session::{passed, Background, SessionState};
use crate::engine::clock;
use crate::engine::lease::{LeaseShared, LossReason};
use crate::engine::ttl::drift;

/// The shortest session TTL: etcd raises any shorter lease to its minimum, `ceil(1.5 × election timeout)`, which is
/// 2 s with the default 1 s election timeout, and grants whole seconds only. Asking for less would silently hold
/// keys longer than asked, so shorter TTLs are refused.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// The session TTL unless one is set: the default lease of every store ([`crate::DEFAULT_TTL`], 30 s), long enough to
/// ride out a leader election (about 1.3 s measured) many times over between keep-alives.
pub const DEFAULT_TTL: Duration = crate::kinds::mutex::DEFAULT_TTL;

/// How long the keeper waits before trying again after a failed keep-alive: a new leader is usually elected within
/// about 1.3 s, and a retry every so often reaches it well before the deadline.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Why a session's lease is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionLoss {
    /// The local deadline passed without a newer acknowledged keep-alive: the server may have expired the lease.
    Expired,
    /// etcd answered a keep-alive with TTL ≤ 0 (or "lease not found"): the lease was revoked or expired.
    Revoked,
    /// [`Session::close`] revoked it.
    Closed,
}

impl fmt::Display for SessionLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SessionLoss::Expired => "no keep-alive was acknowledged before the local deadline",
            SessionLoss::Revoked => "etcd reports the lease gone",
            SessionLoss::Closed => "the session was closed",
        })
    }
}

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
    /// Where the clean-ups of abandoned acquisitions run: the client's, shared by all its sessions.
    pub(crate) background: Arc<Background>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: DEFAULT_TTL,
            call_timeout: None,
            tls: super::endpoints::EtcdTls::default(),
            background: Arc::default(),
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

/// What the session and its keeper share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) endpoints: Endpoints,
    pub(crate) lease: i64,
    pub(crate) ttl: Duration,
    /// The deadline, the loss, and the grants that follow the session, each with its waiter key and revision.
    pub(crate) state: SessionState<SessionLoss, (Arc<str>, i64)>,
    /// Where the clean-ups of this session's abandoned acquisitions run.
    pub(crate) background: Arc<Background>,
}

impl Shared {
    /// Marks the lease lost (the first reason sticks), and ends the lease of every grant that follows it.
    fn lose(&self, reason: SessionLoss) {
        let ends_as = match reason {
            SessionLoss::Revoked => LossReason::Gone,
            SessionLoss::Expired | SessionLoss::Closed => LossReason::Expired,
        };
        if self.state.lose(reason, ends_as) {
            tracing::debug!(lease = format_args!("{:x}", self.lease), %reason, "etcd session lost");
        }
    }

    /// Records an acknowledged keep-alive: sent at `sent`, number `round`, TTL `ttl`.
    fn extend(&self, sent: Instant, round: i64, ttl: Duration) {
        self.state.extend(sent, round, sent + ttl - drift(ttl));
    }

    /// Makes `lease` (a grant of the waiter key `key`, created at `revision`) follow the session: each later
    /// keep-alive renews it as a renewal renews a Redis lease, the loss of the session ends it, and a key found gone
    /// ends it as [`LossReason::Gone`]. False (and the lease ended) when the session is already lost.
    pub(crate) fn follow(&self, lease: &Arc<LeaseShared>, key: &str, revision: i64) -> bool {
        self.state.follow(lease, (key.into(), revision))
    }

    pub(crate) fn loss(&self) -> Option<SessionLoss> {
        self.state.loss()
    }

    /// `Ok` while the lease is held; the loss as an error otherwise.
    pub(crate) fn check_alive(&self) -> Result<(), EtcdError> {
        self.loss()
            .map_or(Ok(()), |loss| Err(EtcdError::SessionLost(loss)))
    }

    /// Resolves when the lease is lost: on the keeper's word, or when the deadline passes, whichever is first, even
    /// if the keeper is stuck.
    pub(crate) async fn lost(&self) -> SessionLoss {
        self.state.lost().await
    }
}

/// One etcd lease, kept alive in the background, under which every waiter key of this client lives.
///
/// Dropping the session stops the keeper and revokes the lease in the background (when a runtime is there to run
/// it), which deletes every key of the session at once; [`close`](Self::close) does the same and waits for it.
#[derive(Debug)]
pub struct Session {
    pub(crate) shared: Arc<Shared>,
    keeper: tokio::task::JoinHandle<()>,
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
        let shared = Arc::new(Shared {
            endpoints,
            lease: granted.id(),
            ttl: granted_ttl,
            state: SessionState::new(
                sent,
                sent + granted_ttl - drift(granted_ttl),
                SessionLoss::Expired,
            ),
            background: options.background,
        });
        let keeper = tokio::spawn(keep(Arc::downgrade(&shared)));
        Ok(Session { shared, keeper })
    }

    /// The lease id. Waiter keys carry it in hex, as `etcdctl lock` does.
    pub fn lease_id(&self) -> i64 {
        self.shared.lease
    }

    /// The TTL etcd granted (at least what was asked).
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The per-call deadline of every request this session makes.
    pub fn call_timeout(&self) -> Duration {
        self.shared.endpoints.call_timeout()
    }

    /// The local deadline, on the lease clock: the send time of the last acknowledged keep-alive plus the TTL, less
    /// the drift allowance. etcd cannot expire the lease before it.
    pub fn deadline(&self) -> Instant {
        self.shared.state.deadline()
    }

    /// Why the lease is lost, or `None` while it is held (the deadline not yet passed and no loss reported).
    pub fn loss(&self) -> Option<SessionLoss> {
        self.shared.loss()
    }

    /// Resolves when the lease is lost, at the deadline at the latest.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> SessionLoss {
        self.shared.lost().await
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
        self.revoke().await
    }

    /// [`close`](Self::close) for a session others may still share (a client's, which its guards hold too): every
    /// grant of the session ends.
    pub(crate) async fn revoke(&self) -> Result<(), EtcdError> {
        self.keeper.abort();
        self.shared.lose(SessionLoss::Closed);
        revoke(&self.shared).await
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keeper.abort();
        if self.shared.state.recorded_loss() == Some(SessionLoss::Closed) {
            return;
        }
        self.shared.lose(SessionLoss::Closed);
        let shared = Arc::clone(&self.shared);
        self.shared.background.spawn(async move {
            if let Err(e) = revoke(&shared).await {
                tracing::debug!(error = %e, "revoking a dropped etcd session failed; its lease expires after its TTL");
            }
        });
    }
}

async fn revoke(shared: &Shared) -> Result<(), EtcdError> {
    let lease = shared.lease;
    let revoked = shared
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

/// The outcome of one keep-alive.
enum Ack {
    /// Acknowledged with this TTL.
    Renewed(Duration),
    /// etcd says the lease is gone.
    Gone,
    /// No answer, or the stream broke: try again, on the next member.
    Failed,
}

/// The keeper: a keep-alive every TTL/3 on one stream, which it reopens on the next member when it breaks; ends when
/// the session is dropped (it holds only a `Weak`) or the lease is lost.
async fn keep(shared: Weak<Shared>) {
    let mut stream: Option<(usize, LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut round = 0;
    loop {
        let Some(session) = shared.upgrade() else {
            return;
        };
        let deadline = session.state.deadline();
        round += 1;
        let sent = clock::now();
        // Registered with each grant before the keep-alive leaves, as the Redis keeper registers a renewal.
        let begun = session.state.begin_round(session.ttl);
        let ack = tokio::select! {
            ack = keep_alive_once(&session, &mut stream) => ack,
            () = passed(deadline) => {
                session.lose(SessionLoss::Expired);
                return;
            }
        };
        let pause = match ack {
            Ack::Renewed(ttl) => {
                session.extend(sent, round, ttl);
                if ttl >= session.ttl {
                    for (lease, request, _) in &begun {
                        lease.confirm(*request, round);
                    }
                }
                let reader = Arc::clone(&session);
                session.state.check_entries(&begun, move |keys| {
                    let session = Arc::clone(&reader);
                    async move { read_keys(&session, &keys).await }
                });
                session.ttl / 3
            }
            Ack::Gone => {
                session.lose(SessionLoss::Revoked);
                return;
            }
            Ack::Failed => {
                if let Some((i, _, _)) = stream.take() {
                    session.endpoints.failed(i);
                }
                RETRY_PAUSE
            }
        };
        let deadline = session.state.deadline();
        drop(session);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = passed(deadline) => {
                if let Some(session) = shared.upgrade() {
                    session.lose(SessionLoss::Expired);
                }
                return;
            }
        }
    }
}

/// The second check ([`SessionState::check_entries`]): reads the waiter keys of `keys` (each with the create
/// revision of its grant) in one transaction; a key is still its grant's when it exists, was created at that
/// revision, and is under this session's lease (not deleted by `release --force` or `etcdctl del`, nor re-created).
/// `None` when unanswered.
async fn read_keys(session: &Shared, keys: &[(Arc<str>, i64)]) -> Option<Vec<bool>> {
    let read = session
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
    let verdicts =
        keys.iter()
            .zip(read.op_responses())
            .map(|((_, revision), response)| match response {
                rpc::TxnOpResponse::Get(get) => get.kvs().first().is_some_and(|kv| {
                    kv.create_revision() == *revision && kv.lease() == session.lease
                }),
                // Not a read's answer: no verdict against the grant.
                _ => true,
            })
            .collect();
    Some(verdicts)
}

/// Sends one keep-alive and reads its answer, opening the stream first if there is none (opening sends one).
async fn keep_alive_once(
    session: &Shared,
    stream: &mut Option<(usize, LeaseKeeper, LeaseKeepAliveStream)>,
) -> Ack {
    let timeout = session.endpoints.call_timeout();
    let Some((_, keeper, responses)) = stream else {
        let (i, mut client) = session.endpoints.current();
        return match tokio::time::timeout(timeout, client.lease_keep_alive(session.lease)).await {
            Ok(Ok((keeper, responses))) => {
                *stream = Some((i, keeper, responses));
                // The crate read the first answer and checked its TTL > 0; the TTL is the granted one.
                Ack::Renewed(session.ttl)
            }
            Ok(Err(rpc::Error::LeaseKeepAliveError(_))) => Ack::Gone,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "opening the etcd keep-alive stream failed");
                session.endpoints.failed(i);
                Ack::Failed
            }
            Err(_) => {
                session.endpoints.failed(i);
                Ack::Failed
            }
        };
    };
    let exchange = async {
        keeper.keep_alive().await?;
        responses.message().await
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(Some(response))) if response.ttl() > 0 => {
            Ack::Renewed(Duration::from_secs(response.ttl().unsigned_abs()))
        }
        Ok(Ok(Some(_))) => Ack::Gone,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, transient = is_transient(&e), "etcd keep-alive failed");
            Ack::Failed
        }
        // The stream ended, or no answer in time.
        Ok(Ok(None)) | Err(_) => Ack::Failed,
    }
}
