//! The stores a lock lives in, one folder each: `redis` (one server, a Redis Cluster, or the primary that Sentinel
//! names) and `quorum` (a majority of independent Redis primaries, Redlock). Each depends on the engine, never the
//! other way round.

pub(crate) mod quorum;
pub(crate) mod redis;
