//! The session: one ZooKeeper session (a client has one per lease TTL: `backend/sessions.rs`), every grant an
//! ephemeral node of it, and a local deadline after which the session may have expired on the server, with a loss
//! signal that fires at that deadline at the latest.
//!
//! # The deadline
//!
//! ZooKeeper expires a session a negotiated timeout `t` after the leader last heard of it. A request the client sends
//! reaches one server, which notes the session's activity; a follower passes that on to the leader in its answer to
//! the leader's next ping, and the leader pings every half tick. So an answered request proves less than it seems:
//! the follower may lose the leader right after answering, and the leader's last news of the session may then be up
//! to half a tick older than the request.
//!
//! The keeper sends a `sync` every `t/8`, without waiting for the one before (a `sync` passes through the leader, so
//! its answer also proves the follower still had one). For the answer to a `sync` sent at `S`, the leader had heard
//! of the session at `S − t/8 − tick/2` at the latest (the `sync` before it, passed on with the following ping).
//! A tick is at most `t/2` (the server's smallest session timeout is two ticks), so the deadline is
//!
//! ```text
//! S + t − t/8 − t/4 − drift = S + 5t/8 − drift        (drift: 1 % + 2 ms of 5t/8, as for every lease)
//! ```
//!
//! on the lease clock. A session that reconnects to another server is revalidated by the leader itself, which only
//! moves the server's expiry later. The keeper's own timer, the server's `Expired` (the session is gone, and every
//! node with it) and the client's terminal states end the session; the grants that follow it end at the same
//! moment.
//!
//! What this asks of the server: the default `minSessionTimeout` of two ticks (so a tick is at most `t/2`). An
//! ensemble configured with a smaller minimum may expire sessions sooner than this deadline.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;
use zookeeper_client::{MultiReadResult, StateWatcher};

use super::ZkError;
use crate::backend::session::{passed, Background, SessionState};
use crate::engine::clock;
use crate::engine::lease::LossReason;
use crate::engine::ttl::drift;

/// The session timeout asked for unless one is set: the default lease of every store ([`crate::DEFAULT_TTL`], 30 s).
/// ZooKeeper clamps it to its bounds (by default 2 to 20 ticks: 4 s to 40 s with the usual 2 s tick); the negotiated
/// one is what counts.
pub(crate) const DEFAULT_TIMEOUT: Duration = crate::kinds::mutex::DEFAULT_TTL;

/// The shortest session timeout accepted: below a second the keeper's `sync`s (every eighth of it) would be a load
/// of their own, and ZooKeeper's own ticks are rarely shorter than 500 ms anyway.
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest session timeout accepted: the protocol carries it as 32-bit milliseconds (24.8 days).
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 24 * 3600);

/// The longest a request waits for its answer: a request to a server that died without a word is given up on this
/// soon, long before the deadline, and the client moves to another server.
const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a session is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum SessionLoss {
    /// The local deadline passed without a newer answered `sync`: the server may have expired the session.
    Expired,
    /// ZooKeeper said the session expired (or refused its credentials): its nodes are gone.
    ExpiredOnServer,
    /// The session was closed by its client.
    Closed,
}

impl fmt::Display for SessionLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SessionLoss::Expired => "no keep-alive was answered before the local deadline",
            SessionLoss::ExpiredOnServer => "ZooKeeper expired the session",
            SessionLoss::Closed => "the session was closed",
        })
    }
}

/// What the session, its keeper and its grants share.
pub(crate) struct Shared {
    /// The ZooKeeper client, until the session is lost: then it is dropped, which closes the session on the server
    /// (and deletes its nodes) once the requests still out with clones of it are done, instead of letting the client
    /// keep a session alive that nobody counts on any more.
    client: std::sync::RwLock<Option<zookeeper_client::Client>>,
    /// The session id: the `ephemeralOwner` of every node of the session.
    pub(crate) id: i64,
    /// The negotiated session timeout.
    pub(crate) timeout: Duration,
    /// The part of it a grant counts on after each answered `sync` (see the module docs): `5t/8`.
    pub(crate) validity: Duration,
    /// The deadline of each request.
    pub(crate) call_timeout: Duration,
    /// The deadline, the loss, and the grants that follow the session, each with its node and the node's `czxid`.
    pub(crate) state: SessionState<SessionLoss, (Arc<str>, i64)>,
    /// Where the clean-ups of this session's abandoned acquisitions run: the client's.
    pub(crate) background: Arc<Background>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("id", &format_args!("{:x}", self.id))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Marks the session lost (the first reason sticks), and ends the lease of every grant that follows it.
    pub(crate) fn lose(&self, reason: SessionLoss) {
        let ends_as = match reason {
            SessionLoss::ExpiredOnServer => LossReason::Gone,
            SessionLoss::Expired | SessionLoss::Closed => LossReason::Expired,
        };
        if self.state.lose(reason, ends_as) {
            tracing::debug!(session = format_args!("{:x}", self.id), %reason, "ZooKeeper session lost");
        }
        let closed = self
            .client
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(closed);
    }

    /// The ZooKeeper client of the session (a clone: the requests made with it keep it alive until they end); the
    /// session's loss once it is lost.
    pub(crate) fn client(&self) -> Result<zookeeper_client::Client, ZkError> {
        let client = self.client.read().unwrap_or_else(|e| e.into_inner());
        match &*client {
            Some(client) if self.loss().is_none() => Ok(client.clone()),
            _ => Err(ZkError::SessionLost(
                self.loss().unwrap_or(SessionLoss::Closed),
            )),
        }
    }

    /// Records a `sync` sent at `sent`, number `round`, as answered.
    fn extend(&self, sent: Instant, round: i64) {
        self.state
            .extend(sent, round, sent + self.validity - drift(self.validity));
    }

    /// Why the session is lost, or `None` while it holds.
    pub(crate) fn loss(&self) -> Option<SessionLoss> {
        self.state.loss()
    }

    /// `Ok` while the session holds; the loss as an error otherwise.
    pub(crate) fn check_alive(&self) -> Result<(), ZkError> {
        self.loss()
            .map_or(Ok(()), |loss| Err(ZkError::SessionLost(loss)))
    }

    /// Resolves when the session is lost, at the deadline at the latest.
    pub(crate) async fn lost(&self) -> SessionLoss {
        self.state.lost().await
    }

    /// Runs `request` under the per-call deadline; `op` names it in errors.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        request: impl std::future::Future<Output = Result<T, zookeeper_client::Error>>,
    ) -> Result<T, ZkError> {
        match tokio::time::timeout(self.call_timeout, request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(zookeeper_client::Error::SessionExpired)) => {
                self.lose(SessionLoss::ExpiredOnServer);
                Err(ZkError::SessionLost(SessionLoss::ExpiredOnServer))
            }
            Ok(Err(source)) => Err(ZkError::ZooKeeper { op, source }),
            Err(_) => Err(ZkError::Timeout {
                op,
                after: self.call_timeout,
            }),
        }
    }
}

/// One ZooKeeper session, kept alive in the background; every grant of the client is an ephemeral node of it.
///
/// Dropping it stops the keeper and marks the session closed; the session closes on the server when the last clone
/// of its ZooKeeper client is gone (which
/// deletes its nodes at once), or expires on the server a session timeout later.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) shared: Arc<Shared>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Session {
    /// Opens a session on the servers of `connect` (ZooKeeper's connect string), asking for `timeout`, with digest
    /// credentials when given; its abandoned acquisitions are cleaned up in `background`.
    pub(crate) async fn connect(
        connect: &str,
        timeout: Duration,
        digest: Option<&[u8]>,
        connection_timeout: Duration,
        background: Arc<Background>,
    ) -> Result<Session, ZkError> {
        // The client gives up on a connection that has been silent this long, and on a connection attempt that takes
        // this long, and moves to the next server: an eighth of the session at most, so that leaving a server that
        // stopped answering, and trying one more that does not answer either, fits well inside the deadline (5/8 of
        // the session after the last answered keep-alive, which left up to 1/8 before).
        // Each server is tried once, not round and round until the session timeout: an unreachable ensemble fails the
        // connect at once (later reconnects go on trying).
        let mut connector = zookeeper_client::Client::connector()
            .with_session_timeout(timeout)
            .with_connection_timeout(connection_timeout.min(timeout / 8))
            .with_fail_eagerly();
        if let Some(credentials) = digest {
            connector = connector.with_auth("digest", credentials);
        }
        let sent = clock::now();
        let client = tokio::time::timeout(timeout, connector.connect(connect))
            .await
            .map_err(|_| ZkError::Timeout {
                op: "connect",
                after: timeout,
            })?
            .map_err(|source| ZkError::ZooKeeper {
                op: "connect",
                source,
            })?;
        let negotiated = client.session_timeout();
        let validity = negotiated * 5 / 8;
        let shared = Arc::new(Shared {
            id: client.session_id().0,
            timeout: negotiated,
            validity,
            call_timeout: (negotiated / 4).min(MAX_CALL_TIMEOUT),
            state: SessionState::new(
                sent,
                sent + validity - drift(validity),
                SessionLoss::Expired,
            ),
            client: std::sync::RwLock::new(Some(client.clone())),
            background,
        });
        let states = client.state_watcher();
        drop(client);
        let keeper = tokio::spawn(keep(Arc::downgrade(&shared), states));
        Ok(Session { shared, keeper })
    }

    /// The session id.
    pub(crate) fn id(&self) -> i64 {
        self.shared.id
    }

    /// The negotiated session timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Why the session is lost, or `None` while it holds.
    pub(crate) fn loss(&self) -> Option<SessionLoss> {
        self.shared.loss()
    }

    /// Closes the session: stops the keeper, ends every grant, drops the client, and waits until the client has told
    /// the server (which deletes every node of the session at once). Clones of the client still out (a watch on a
    /// node still held) keep the session open until they end; call it under a deadline.
    pub(crate) async fn close(&self) {
        self.keeper.abort();
        let states = self.shared.client().ok().map(|c| c.state_watcher());
        self.shared.lose(SessionLoss::Closed);
        let Some(mut states) = states else {
            // Already lost: the client was dropped then.
            return;
        };
        while !states.peek_state().is_terminated() {
            states.changed().await;
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keeper.abort();
        self.shared.lose(SessionLoss::Closed);
    }
}

/// The keeper: a `sync` every eighth of the session timeout, each on its own (an answer moves the deadline from its
/// own send time); ends when the session is dropped (it holds only a `Weak`) or lost.
async fn keep(shared: Weak<Shared>, mut states: StateWatcher) {
    let Some(every) = shared.upgrade().map(|s| s.timeout / 8) else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = FuturesUnordered::new();
    let mut round = 0;
    loop {
        let Some(deadline) = shared.upgrade().map(|s| s.state.deadline()) else {
            return;
        };
        tokio::select! {
            _ = tick.tick() => {
                let Some(session) = shared.upgrade() else { return };
                round += 1;
                let sent = clock::now();
                // Registered with each grant before the `sync` leaves, as the Redis keeper registers a renewal.
                let begun = session.state.begin_round(session.validity);
                let Ok(client) = session.client() else { return };
                let call_timeout = session.call_timeout;
                let this_round = round;
                in_flight.push(async move {
                    let answer = tokio::time::timeout(call_timeout, client.sync("/")).await;
                    (sent, this_round, begun, answer)
                });
            }
            Some((sent, round, begun, answer)) = in_flight.next() => {
                let Some(session) = shared.upgrade() else { return };
                match answer {
                    Ok(Ok(())) => {
                        session.extend(sent, round);
                        for (lease, request, _) in &begun {
                            lease.confirm(*request, round);
                        }
                        let reader = Arc::clone(&session);
                        session.state.check_entries(&begun, move |nodes| {
                            let session = Arc::clone(&reader);
                            async move { read_nodes(&session, &nodes).await }
                        });
                    }
                    Ok(Err(zookeeper_client::Error::SessionExpired | zookeeper_client::Error::AuthFailed)) => {
                        session.lose(SessionLoss::ExpiredOnServer);
                        return;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "ZooKeeper keep-alive failed"),
                    Err(_) => tracing::debug!("ZooKeeper keep-alive unanswered"),
                }
            }
            state = states.changed() => {
                use zookeeper_client::SessionState as Zk;
                if matches!(state, Zk::Expired | Zk::AuthFailed | Zk::Closed) {
                    if let Some(session) = shared.upgrade() {
                        session.lose(SessionLoss::ExpiredOnServer);
                    }
                    return;
                }
            }
            () = passed(deadline) => {
                if let Some(session) = shared.upgrade() {
                    session.lose(SessionLoss::Expired);
                }
                return;
            }
        }
    }
}

/// The second check ([`SessionState::check_entries`]): reads the grants' `nodes` (each with its `czxid`) in one
/// multi-read; a node is still its grant's when it exists with that `czxid` (not deleted by `release --force` or
/// `zkCli delete`, nor re-created). The deletion watch on each node tells sooner; this catches what a watch can miss.
/// `None` when unanswered.
async fn read_nodes(session: &Shared, nodes: &[(Arc<str>, i64)]) -> Option<Vec<bool>> {
    let client = session.client().ok()?;
    let mut reader = client.new_multi_reader();
    for (node, _) in nodes {
        reader.add_get_data(node).ok()?;
    }
    let results = session.call("existence read", reader.commit()).await.ok()?;
    let verdicts = nodes
        .iter()
        .zip(results)
        .map(|((_, czxid), result)| match result {
            MultiReadResult::Data { stat, .. } => stat.czxid == *czxid,
            MultiReadResult::Error {
                err: zookeeper_client::Error::NoNode,
            } => false,
            // Another error is no verdict against the grant.
            _ => true,
        })
        .collect();
    Some(verdicts)
}
