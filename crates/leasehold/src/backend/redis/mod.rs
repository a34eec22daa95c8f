//! Redis: one server, a Redis Cluster or the primary that Sentinel names. The connection and its topology, the Lua
//! scripts that do every server-side step, coalesced script calls, wake-ups by pub/sub, the checks made at connect,
//! and the releases left to a client's drop.

pub(crate) mod batch;
pub(crate) mod checks;
pub(crate) mod conn;
pub(crate) mod connect;
pub(crate) mod foreign;
pub(crate) mod keys;
pub(crate) mod orphans;
pub(crate) mod scripts;
pub(crate) mod sentinel;
pub(crate) mod store;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod topology;
pub(crate) mod wake;
