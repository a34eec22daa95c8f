//! The etcd lock recipe: a session lease, waiter keys ordered by create revision, admission rules per kind, a
//! final ownership check, fences from revisions. A [`Client`](crate::Client) connected with `etcd://` reaches it
//! through [`store`] (and the dispatch in `kinds/store.rs`); the recipe's own tests reach it through `leasehold::__etcd`,
//! which is not a stable interface.
//!
//! It is built client-side, with `Txn`, `Watch` and `LeaseKeepAlive`, and never with etcd's server-side `Lock` RPC:
//! on etcd 3.4 (Debian's 3.4.23) that RPC grants a waiter whose lease expired while it waited (etcd#9921, Jepsen's
//! etcd#11456), because it lacks the ownership check after the wait that 3.5 added.
//!
//! # Files
//!
//! - [`session`]: the lease, its keeper (a keep-alive every TTL/3 on one stream), the local deadline and the loss
//!   signal.
//! - [`endpoints`]: one client per member, a deadline on every call, retries on the next member.
//! - [`kind`]: the key layout and the kinds' admission rules.
//! - [`recipe`]: enqueue, check, wait, release, and the clean-up of abandoned waiter keys.
//! - [`error`]: the recipe's error type, [`EtcdError`].
//! - [`rpc`]: leasehold's own etcd client, on tonic and prost over code generated from `proto/` and checked in (no
//!   `protoc` to build).
//!
//! # Key layout, and why
//!
//! A lock is an etcd prefix `PATH/`. Each grant writes one waiter key under it, with the session's lease:
//!
//! ```text
//! PATH/<lease id, hex>/lh1.<kind>.<grant id, 16 hex digits>       kind: x (exclusive), s (shared), pN (one of N permits)
//! ```
//!
//! - **Interop with `etcdctl lock PATH`** (Go's `concurrency.Mutex`). It writes `PATH/<lease id hex>` and waits, in
//!   `waitDeletes`, until *every* key under `PATH/` with a lower create revision is deleted, whoever wrote it. So a
//!   leasehold key under `PATH/` holds it back like one of its own, and leasehold in turn reads its key (no `lh1.`
//!   leaf) as an exclusive waiter. Neither side admits while the other's earlier key exists: they exclude each other
//!   in both directions, in one FIFO order. Its key can never equal ours (ours has two more segments), so its
//!   "reuse my own key" branch never takes a leasehold key for its own.
//! - **The lease id first**, as `etcdctl` does, so `etcdctl get --prefix PATH/` shows who waits, and a session's keys
//!   sit together. **A grant id after it** (64 random bits), so two grants of one session are two keys: etcd's own
//!   `PATH/<lease>` collapses them into one (etcd#11360), which breaks a semaphore or two tasks of one process. An
//!   enqueue retried after a timeout writes the same key, finds it with its create revision, and stays idempotent.
//! - **The kind in the key**, not the value: the admission check reads keys only (`keys_only`), and every client
//!   can apply every other client's rule from the key alone. Unknown keys under the prefix (etcdctl's, a future
//!   layout's, a nested lock `PATH/sub`'s) count as exclusive: that can only make a waiter wait longer, never admit
//!   it too early.
//! - Order and fence: the key's **create revision**. It is global to the cluster and only grows, so fences strictly
//!   increase across successive holders (they go backwards only after a snapshot restore without
//!   `--bump-revision`, which 3.4.23 does not have).
//!
//! # Kinds as rules over the keys ahead
//!
//! Exclusive: no key ahead; it watches the key just ahead. Shared: every key ahead is a reader; it watches the last
//! writer ahead (a waiting writer holds back later readers). Permits(N): every key ahead is a permit and fewer than
//! N are; it watches the whole prefix, since any key ahead leaving may admit it. A permit key behind a permit key of
//! another count is refused (`EngineError::WrongPermits`), as Redis refuses a count that disagrees with the stored one.
//!
//! # The loss deadline
//!
//! See [`session`]: the send time of the last acknowledged keep-alive, plus the granted TTL, less the drift allowance
//! (1 % + 2 ms). [`Session::lost`] fires at that deadline at the latest, or earlier when etcd reports the lease gone.

pub(crate) mod endpoints;
pub(crate) mod error;
pub(crate) mod kind;
pub(crate) mod recipe;
pub mod rpc;
pub(crate) mod session;
pub(crate) mod store;

pub use crate::backend::session::{EngineError, SessionLoss};
pub use error::EtcdError;
pub use kind::{Kind, MAX_PATH_LEN};
pub use recipe::{Grant, Released};
pub use session::{Session, SessionOptions, DEFAULT_TTL, MIN_TTL};
