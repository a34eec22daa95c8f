//! ZooKeeper's session primitives: one ZooKeeper session (a client has one per lease TTL), every grant an ephemeral
//! node of it, opened, kept alive with `sync`s, read back and closed; the engine (`backend/session/`) runs its life.
//! What is ZooKeeper's own is the deadline: how much of the timeout a grant can count on after an answered `sync`.
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

use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{MultiReadResult, StateWatcher};

use super::store::ZooKeeper;
use super::ZkError;
use crate::backend::session::{self as engine, Opened, Renewal, SessionLoss, StoreError};
use crate::engine::clock;

/// The session timeout asked for unless one is set: the default lease of every store ([`crate::DEFAULT_TTL`], 30 s).
/// ZooKeeper clamps it to its bounds (by default 2 to 20 ticks: 4 s to 40 s with the usual 2 s tick); the negotiated
/// one is what counts.
pub(crate) const DEFAULT_TIMEOUT: Duration = crate::engine::ttl::DEFAULT_TTL;

/// The shortest session timeout accepted: below a second the keeper's `sync`s (every eighth of it) would be a load
/// of their own, and ZooKeeper's own ticks are rarely shorter than 500 ms anyway.
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest session timeout accepted: the protocol carries it as 32-bit milliseconds (24.8 days).
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 24 * 3600);

/// The longest a request waits for its answer: a request to a server that died without a word is given up on this
/// soon, long before the deadline, and the client moves to another server.
const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What a ZooKeeper session holds.
pub(crate) struct Conn {
    /// The ZooKeeper client, until the session is lost: then it is dropped, which closes the session on the server
    /// (and deletes its nodes) once the requests still out with clones of it are done, instead of letting the client
    /// keep a session alive that nobody counts on any more.
    client: std::sync::RwLock<Option<zookeeper_client::Client>>,
    /// The client's session states: terminal once the session is closed or expired.
    states: StateWatcher,
    /// The session id: the `ephemeralOwner` of every node of the session.
    pub(crate) id: i64,
    /// The deadline of each request.
    call_timeout: Duration,
}

/// What a session, its keeper and its grants share, on ZooKeeper.
pub(crate) type Shared = engine::Shared<ZooKeeper>;

impl Shared {
    /// The ZooKeeper client of the session (a clone: the requests made with it keep it alive until they end); the
    /// session's loss once it is lost.
    pub(crate) fn client(&self) -> Result<zookeeper_client::Client, ZkError> {
        let client = self.conn.client.read().unwrap_or_else(|e| e.into_inner());
        match &*client {
            Some(client) if self.loss().is_none() => Ok(client.clone()),
            _ => Err(ZkError::session_lost(
                self.loss().unwrap_or(SessionLoss::Closed),
            )),
        }
    }

    /// The client's session states from now on: [`StateWatcher::changed`] answers at once once the state changed
    /// (a connection lost, one re-established, the session ended) after this call.
    pub(crate) fn states(&self) -> StateWatcher {
        let mut states = self.conn.states.clone();
        states.state();
        states
    }

    /// The session id.
    pub(crate) fn id(&self) -> i64 {
        self.conn.id
    }

    /// The deadline of each request.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.conn.call_timeout
    }

    /// Runs `request` under the per-call deadline; `op` names it in errors. An answer that the session expired loses
    /// the session.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        request: impl std::future::Future<Output = Result<T, zookeeper_client::Error>>,
    ) -> Result<T, ZkError> {
        match tokio::time::timeout(self.conn.call_timeout, request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(zookeeper_client::Error::SessionExpired)) => {
                self.lose(SessionLoss::Ended);
                Err(ZkError::session_lost(SessionLoss::Ended))
            }
            Ok(Err(source)) => Err(ZkError::ZooKeeper { op, source }),
            Err(_) => Err(ZkError::Timeout {
                op,
                after: self.conn.call_timeout,
            }),
        }
    }
}

/// Drops the client of a lost session (see [`Conn::client`]).
pub(crate) fn drop_client(conn: &Conn) {
    let closed = conn
        .client
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    drop(closed);
}

/// Opens a session on the servers of `connect` (ZooKeeper's connect string), asking for `timeout`, with digest
/// credentials when given.
pub(crate) async fn open(
    connect: &str,
    timeout: Duration,
    digest: Option<&[u8]>,
    connection_timeout: Duration,
) -> Result<Opened<Conn>, ZkError> {
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
    let every = negotiated / 8;
    Ok(Opened {
        conn: Conn {
            id: client.session_id().0,
            call_timeout: (negotiated / 4).min(MAX_CALL_TIMEOUT),
            states: client.state_watcher(),
            client: std::sync::RwLock::new(Some(client)),
        },
        sent,
        ttl: negotiated,
        validity: negotiated * 5 / 8,
        renew_every: every,
        retry_after: every,
    })
}

/// Resolves when the client says the session is over on the server (expired, refused its credentials, closed).
pub(crate) fn ended(conn: &Conn) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut states = conn.states.clone();
    async move {
        use zookeeper_client::SessionState as Zk;
        loop {
            if matches!(
                states.changed().await,
                Zk::Expired | Zk::AuthFailed | Zk::Closed
            ) {
                return;
            }
        }
    }
}

/// One keep-alive: a `sync`, which passes through the leader (see the module docs).
pub(crate) async fn renew(shared: &Shared) -> Renewal<(Arc<str>, i64)> {
    let Ok(client) = shared.client() else {
        return Renewal::Failed;
    };
    match tokio::time::timeout(shared.conn.call_timeout, client.sync("/")).await {
        Ok(Ok(())) => Renewal::Renewed {
            validity: shared.validity,
            entries: None,
        },
        Ok(Err(zookeeper_client::Error::SessionExpired | zookeeper_client::Error::AuthFailed)) => {
            Renewal::Ended
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "ZooKeeper keep-alive failed");
            Renewal::Failed
        }
        Err(_) => Renewal::Failed,
    }
}

/// Closes the session: the client is dropped (the session was lost first), and this waits until the client has told
/// the server (which deletes every node of the session at once), for two call timeouts at most. Clones of the client
/// still out keep the session open until they end.
pub(crate) async fn close(shared: &Shared) -> Result<(), ZkError> {
    drop_client(&shared.conn);
    let mut states = shared.conn.states.clone();
    let after = 2 * shared.conn.call_timeout;
    tokio::time::timeout(after, async {
        while !states.peek_state().is_terminated() {
            states.changed().await;
        }
    })
    .await
    .map_err(|_| ZkError::Timeout {
        op: "close session",
        after,
    })
}

/// The second check: reads the grants' `nodes` (each with its `czxid`) in one
/// multi-read; a node is still its grant's when it exists with that `czxid` (not deleted by `release --force` or
/// `zkCli delete`, nor re-created). The deletion watch on each node tells sooner; this catches what a watch can miss.
/// `None` when unanswered.
pub(crate) async fn read_nodes(session: &Shared, nodes: &[(Arc<str>, i64)]) -> Option<Vec<bool>> {
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
