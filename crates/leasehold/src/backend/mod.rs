//! The stores a lock lives in, one folder each: `redis` (one server, a Redis Cluster, or the primary that Sentinel
//! names), `quorum` (a majority of independent Redis primaries, Redlock) and `etcd` (feature `etcd`; its recipe, not
//! yet reachable through the API). Each depends on the engine, never the
//! other way round.

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod quorum;
pub(crate) mod redis;
