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
//! - [`watch`]: the watches of an acquisition and of its grant, set where they cost no round trip of their own.
//! - [`write`]: writes inside ZooKeeper guarded by the grant's node.
//!
//! # Layout, and why
//!
//! Lock `NAME` of a client with prefix `PREFIX` (default `leasehold`) is the node `/PREFIX/NAME` (under the URL's
//! chroot, when it names one): a name with `/` in it is a deeper path, as in kazoo and Curator. The lock's node and
//! its parents are containers, which ZooKeeper deletes once they are empty. Each grant is a child of it:
//!
//! ```text
//! /leasehold/orders:42/lh1-<grant>__lock__0000000007      exclusive (a mutex, a fair mutex, a writer, a reentrant root)
//! /leasehold/orders:42/lh1-s-<grant>__lock__0000000008    shared (a reader)
//! /leasehold/orders:42/lh1-p<N>-<grant>__lock__0000000009 one of N permits
//! ```
//!
//! - **Interop with kazoo.** kazoo's locks count a child when one of their markers is right before its sequence, and
//!   read nothing else of its name: `Lock` and `ReadLock` wait for `__lock__` nodes ahead, `WriteLock` for `__lock__`
//!   and `__rlock__` ones; `Lock`/`WriteLock` write `<uuid>__lock__<seq>`, `ReadLock` `<uuid>__rlock__<seq>`. Every
//!   leasehold node ends in `__lock__`, so each of kazoo's locks waits for every leasehold holder ahead of it, and
//!   leasehold reads kazoo's markers as exclusive and shared. The price: a kazoo `ReadLock` waits for a leasehold
//!   reader too (kazoo's `Lock` reads the same marker, and must not be let in beside one). A kazoo `Semaphore` counts
//!   every child of the path as a lease, so it waits for leasehold's nodes; its own leases are plain children,
//!   which leasehold cannot tell from a nested lock's node: one way only.
//! - **Curator, one way only.** leasehold counts Curator's nodes (`-lock-`, `__WRIT__`, `__READ__` before the
//!   sequence) as writers and readers, so it waits for Curator's holders. Curator does not see leasehold's: it sorts
//!   children by the text after its marker, and leasehold's names have none (kazoo's needs the place), so they sort
//!   after Curator's. Do not share a path with a Curator recipe. The whole table is in README, "ZooKeeper".
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
pub(crate) mod watch;
pub(crate) mod write;

pub(crate) use error::ZkError;
