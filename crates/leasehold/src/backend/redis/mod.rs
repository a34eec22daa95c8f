//! Redis: one server, a Redis Cluster or the primary that Sentinel names. The connection and its topology, the Lua
//! scripts that do every server-side step, coalesced script calls, wake-ups by pub/sub, the checks made at connect,
//! and the releases left to a client's drop.
//!
//! # Files
//!
//! - The client's Redis side: `store.rs` (`RedisStore`: its state, renewals, `inspect`, `held_locks`,
//!   `force_release`), `connect.rs` (the settings checked, the endpoint resolved, the connection opened), `checks.rs`
//!   (what is checked at connect), `foreign.rs` (keys leasehold did not write).
//! - Reaching the server: `conn.rs` (the command connection), `topology.rs` (one server, Cluster, Sentinel),
//!   `sentinel.rs`, `tls.rs`, `keys.rs` (the key layout), `scripts.rs` and `scripts/*.lua`, `batch.rs` (coalesced
//!   calls).
//! - The lock kinds on Redis: `acquire.rs` (the mutex's attempt and wait, and what every acquisition shares),
//!   `queued.rs` (the queued kinds' attempt and wait), `grant.rs` (from a grant to a guard), `release.rs` (release,
//!   extension, background releases), `kinds.rs` (downgrade, `lock_as`, `set_permits`), `wake.rs` (hand-offs and
//!   wake-ups), `orphans.rs` (the releases left to the client's drop).

pub(crate) mod acquire;
pub(crate) mod batch;
pub(crate) mod checks;
pub(crate) mod conn;
pub(crate) mod connect;
pub(crate) mod foreign;
pub(crate) mod grant;
pub(crate) mod kinds;
pub(crate) mod orphans;
pub(crate) mod queued;
pub(crate) mod release;
pub(crate) mod scripts;
pub(crate) mod sentinel;
pub(crate) mod store;
pub(crate) mod topology;
pub(crate) mod wake;
