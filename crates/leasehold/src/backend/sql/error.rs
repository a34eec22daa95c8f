//! The SQL stores' own error type; the store turns it into the crate's [`Error::Store`](crate::Error::Store).

use std::time::Duration;

use crate::backend::session::EngineError;

/// What can go wrong in a SQL store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SqlError {
    /// The URL is not one the driver takes.
    #[error("invalid {store} URL: {why}")]
    InvalidUrl {
        /// Which dialect.
        store: &'static str,
        /// What is wrong with it.
        why: String,
    },

    /// A statement was not answered within its deadline.
    #[error("{store} {op} did not answer within {after:?}")]
    Timeout {
        /// Which dialect.
        store: &'static str,
        /// Which statement.
        op: &'static str,
        /// The deadline.
        after: Duration,
    },

    /// PostgreSQL refused the statement, or the connection failed.
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL {op} failed")]
    Postgres {
        /// Which statement.
        op: &'static str,
        /// What the driver reported.
        #[source]
        source: tokio_postgres::Error,
    },

    /// MySQL refused the statement, or the connection failed.
    #[cfg(feature = "mysql")]
    #[error("MySQL {op} failed")]
    MySql {
        /// Which statement.
        op: &'static str,
        /// What the driver reported.
        #[source]
        source: mysql_async::Error,
    },

    /// What the session engine reports: the session lost, an entry gone while it waited, a semaphore's count that
    /// disagrees with the entries ahead, no randomness.
    #[error(transparent)]
    Engine(#[from] EngineError),

    /// The database answered with what the library did not write (a table changed by hand).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    #[error("{store} answered unexpectedly: {what}")]
    Unexpected {
        /// Which dialect.
        store: &'static str,
        /// What was wrong.
        what: String,
    },

    /// The user lacks a right on the lease tables, or may not create them when they are missing (found when the
    /// client connected, or at a read-only client's first write): what is missing and the `GRANT` to run.
    #[error("{detail}")]
    NotPermitted {
        /// What is missing, and the statements that grant it.
        detail: String,
    },
}

impl SqlError {
    /// Whether the database did not answer, or answered that it cannot answer now.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            SqlError::Timeout { .. } => true,
            #[cfg(feature = "postgres")]
            SqlError::Postgres { source, .. } => super::postgres::is_transient(source),
            #[cfg(feature = "mysql")]
            SqlError::MySql { source, .. } => super::mysql::is_transient(source),
            SqlError::InvalidUrl { .. }
            | SqlError::Unexpected { .. }
            | SqlError::Engine(_)
            | SqlError::NotPermitted { .. } => false,
        }
    }

    /// Whether the statement failed because the session row is gone (an entry's foreign key found none).
    pub(crate) fn session_gone(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            SqlError::Postgres { source, .. } => {
                source.code() == Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION)
            }
            #[cfg(feature = "mysql")]
            SqlError::MySql {
                source: mysql_async::Error::Server(e),
                ..
            } => e.code == 1452,
            _ => false,
        }
    }
}
