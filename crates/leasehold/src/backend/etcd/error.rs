//! The etcd recipe's own error type, kept apart from the crate's [`Error`](crate::Error) until the backend seam
//! decides how the two meet.

use std::time::Duration;

use super::rpc;
use crate::backend::session::EngineError;

/// What can go wrong in the etcd recipe.
///
/// Callers can tell "etcd did not answer" ([`Timeout`](Self::Timeout), [`Etcd`](Self::Etcd)) from "I had it, or was
/// queued, and lost it" ([`Engine`](Self::Engine): [`EngineError::SessionLost`], [`EngineError::LostWhileWaiting`]) from "I
/// asked for something that makes no sense" ([`InvalidUrl`](Self::InvalidUrl), [`InvalidTtl`](Self::InvalidTtl),
/// [`InvalidPath`](Self::InvalidPath)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// The URL is not `etcd://host:port[,host:port…]`.
    #[error("invalid etcd URL {url:?}: {why}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },

    /// The session TTL is below 2 s or not whole seconds (see [`MIN_TTL`](super::MIN_TTL)).
    #[error("invalid etcd lease TTL {0:?}: it must be whole seconds and at least 2 s")]
    InvalidTtl(Duration),

    /// The lock path is empty, ends with `/`, or is longer than [`MAX_PATH_LEN`](super::MAX_PATH_LEN).
    #[error("invalid etcd lock path {0:?}")]
    InvalidPath(String),

    /// No endpoint answered the request within its per-call deadline, on any of the tries the request allows.
    #[error("etcd {op} did not answer within {after:?} (each try)")]
    Timeout {
        /// Which request.
        op: &'static str,
        /// The per-call deadline of each try.
        after: Duration,
    },

    /// etcd refused the request, or the connection failed in a way a retry does not mend.
    #[error("etcd {op} failed")]
    Etcd {
        /// Which request.
        op: &'static str,
        /// What the client reported.
        #[source]
        source: rpc::Error,
    },

    /// What the session engine reports: the session lost, an entry gone while it waited, a semaphore's count that
    /// disagrees with the entries ahead, no randomness.
    #[error(transparent)]
    Engine(#[from] EngineError),

    /// etcd answered something the recipe never asks for (a transaction without its responses, say).
    #[error("unexpected etcd response to {0}")]
    Protocol(&'static str),
}

impl EtcdError {
    /// Whether etcd did not answer in time ([`Timeout`](Self::Timeout)).
    pub fn is_timeout(&self) -> bool {
        matches!(self, EtcdError::Timeout { .. })
    }
}
