//! The ZooKeeper recipe's own error type; the store turns it into the crate's [`Error::Store`](crate::Error::Store).

use std::time::Duration;

use crate::backend::session::EngineError;

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

    /// Operation `index` (from 0) of a guarded write was refused; nothing of the write was committed.
    #[error("ZooKeeper refused write {index} of a guarded write")]
    Write {
        /// Which write.
        index: usize,
        /// What ZooKeeper said.
        #[source]
        source: zookeeper_client::Error,
    },

    /// What the session engine reports: the session lost, an entry gone while it waited, a semaphore's count that
    /// disagrees with the entries ahead, no randomness.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl ZkError {
    /// Whether ZooKeeper did not answer, or answered that it cannot answer now.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            ZkError::Timeout { .. } => true,
            ZkError::ZooKeeper { source, .. } => is_transient(source),
            _ => false,
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
