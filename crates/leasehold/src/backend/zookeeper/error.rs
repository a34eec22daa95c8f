//! The ZooKeeper recipe's own error type; the store turns it into the crate's [`Error::Store`](crate::Error::Store).

use std::time::Duration;

use crate::backend::session::SessionLoss;

/// What can go wrong in the ZooKeeper recipe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ZkError {
    /// The URL is not `zk://[user:password@]host:port[,host:port…][/chroot]`.
    #[error("invalid ZooKeeper URL {url:?}: {why}")]
    InvalidUrl {
        /// The URL as given, password hidden.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },

    /// The request was not answered within its per-call deadline.
    #[error("ZooKeeper {op} did not answer within {after:?}")]
    Timeout {
        /// Which request.
        op: &'static str,
        /// The per-call deadline.
        after: Duration,
    },

    /// ZooKeeper refused the request, or the client failed in a way a retry does not mend.
    #[error("ZooKeeper {op} failed")]
    ZooKeeper {
        /// Which request.
        op: &'static str,
        /// What the client reported.
        #[source]
        source: zookeeper_client::Error,
    },

    /// The session ended (or may have ended, by the local deadline): every node of the session is gone, or about
    /// to be.
    #[error("the ZooKeeper session is lost: {0}")]
    SessionLost(SessionLoss),

    /// The check after a wait found the grant's node gone: deleted by someone else (`release --force`) while it
    /// waited.
    #[error("the lock node {node} was gone when its turn came")]
    LostWhileWaiting {
        /// The node's path.
        node: String,
    },

    /// Operation `index` (from 0) of a guarded write was refused; nothing of the write was committed.
    #[error("ZooKeeper refused write {index} of a guarded write")]
    Write {
        /// Which write.
        index: usize,
        /// What ZooKeeper said.
        #[source]
        source: zookeeper_client::Error,
    },

    /// A permit request whose count differs from that of a permit node ahead of it. Its node is deleted.
    #[error("the semaphore is in use with {stored} permits")]
    WrongPermits {
        /// The count of the oldest permit node ahead.
        stored: u32,
    },

    /// The OS had no randomness for a grant id.
    #[error("no randomness for a grant id: {0}")]
    Entropy(String),
}

impl ZkError {
    /// Whether the caller held or queued something and lost it.
    pub(crate) fn is_lost(&self) -> bool {
        matches!(
            self,
            ZkError::SessionLost(_) | ZkError::LostWhileWaiting { .. }
        )
    }

    /// Whether ZooKeeper did not answer, or answered that it cannot answer now: what a wait rides out.
    pub(crate) fn passes(&self) -> bool {
        match self {
            ZkError::Timeout { .. } => true,
            ZkError::ZooKeeper { source, .. } => is_transient(source),
            e => e.is_lost(),
        }
    }
}

/// Errors that say nothing about the request itself: the connection, or the server's load. The client reports a
/// connection that broke under a request (reset, closed, silent past its timeout) as a custom error carrying the
/// I/O error.
pub(crate) fn is_transient(e: &zookeeper_client::Error) -> bool {
    use zookeeper_client::Error as E;
    matches!(
        e,
        E::ConnectionLoss | E::Timeout | E::Throttled | E::NoHosts | E::SessionMoved | E::Custom(_)
    )
}
