//! The ZooKeeper store (feature `zookeeper`): one session per client, every grant an ephemeral sequential node of it,
//! kinds as admission rules over the sequence order, fences from the nodes' `czxid`.
//!
//! # Files
//!
//! - [`session`]: the session, its keeper (a `sync` every eighth of the session timeout), the local deadline and the
//!   loss signal, with the argument for the deadline.
//! - [`kind`]: the node layout, and how every client reads a node's kind and place.
//! - [`recipe`]: create (protected), check, wait, release.
//! - [`store`]: the store behind a [`Client`](crate::Client): sessions replaced after a loss, guards, `inspect`,
//!   `held_locks`, `force_release`.
//! - [`url`]: `zk://` URLs and ZooKeeper's path rules.
//! - [`write`]: writes inside ZooKeeper guarded by the grant's node.
//!
//! # Layout, and why
//!
//! Lock `NAME` of a client with prefix `PREFIX` (default `leasehold`) is the node `/PREFIX/NAME` (under the URL's
//! chroot, when it names one): a name with `/` in it is a deeper path, as in kazoo and Curator. The lock's node and
//! its parents are containers, which ZooKeeper deletes once they are empty. Each grant is a child of it:
//!
//! ```text
//! /leasehold/orders:42/lh1-<grant>__lock__0000000007     exclusive (a mutex, a fair mutex, a writer, a reentrant root)
//! /leasehold/orders:42/lh1-<grant>__rlock__0000000008    shared (a reader)
//! /leasehold/orders:42/lh1-p<N>-<grant>__sem__0000000009 one of N permits
//! ```
//!
//! - **Interop with kazoo.** kazoo's `Lock` (and `WriteLock`) writes `<uuid>__lock__<seq>` and counts the children
//!   whose names carry `__lock__` and a sequence; its `ReadLock` writes `__rlock__` and waits for the `__lock__`
//!   nodes ahead. leasehold reads those markers the same way in both directions, so a leasehold mutex and a kazoo
//!   `Lock` on the same path exclude each other, and leasehold's readers and writers share with kazoo's. A kazoo
//!   `Semaphore` is another recipe entirely (a lease node per holder) and does not meet leasehold's.
//! - **Curator, one way only.** leasehold counts Curator's nodes (`-lock-`, `__WRIT__`, `__READ__` before the
//!   sequence) as writers and readers, so it waits for Curator's holders. Curator does not see leasehold's: it sorts
//!   children by the text after `lock-`, and leasehold's names have none. Do not share a path with a Curator
//!   `InterProcessMutex`.
//! - **The grant id** (64 random bits) protects the node: a create whose answer was lost finds its node again by it,
//!   and adopts it only when the node's `ephemeralOwner` is this session (CURATOR-604 is Curator adopting without
//!   that check).
//! - **Fence** = the node's `czxid`: global, and only growing (it goes back only after a restore of an older
//!   snapshot). Never the sequence suffix, which is per parent, restarts when a container is reaped, and overflows at
//!   2³¹.

pub(crate) mod error;
pub(crate) mod kind;
pub(crate) mod recipe;
pub(crate) mod session;
pub(crate) mod store;
pub(crate) mod url;
pub(crate) mod write;

pub(crate) use error::ZkError;
