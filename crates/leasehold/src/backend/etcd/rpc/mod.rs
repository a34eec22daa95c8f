//! leasehold's own etcd v3 client: a thin layer over `tonic` and the message and client code generated from our
//! trimmed copies of etcd's `.proto` files (`crates/leasehold/proto/`), checked in under [`pb`] so that building
//! leasehold needs no `protoc` (DESIGN.md, "etcd's gRPC API without protoc"). The test `etcd_proto` of
//! leasehold-tests regenerates [`pb`] from the `.proto` files, without `protoc`, and fails on any difference.
//!
//! Its surface is the few calls the recipe, the command's bench and the tests make, shaped like the `etcd-client`
//! crate's (which leasehold used before): a [`Client`] of one or more members with per-call deadlines, HTTP/2
//! keep-alive, `hasleader`, an etcd user's token on every call (authenticated again when etcd says it expired),
//! TLS through rustls; KV reads, puts, deletes and transactions; lease grant, keep-alive stream, revoke and
//! time-to-live; a watch stream; and the server-side `Lock`/`Unlock` for the bench's floor.
//!
//! # Files
//!
//! - [`client`]: connecting, the token, the metadata of every call.
//! - [`kv`]: the options of reads, puts and deletes, transactions, and what their answers say.
//! - [`lease`], [`watch`], [`lock`]: the other services.
//! - [`error`]: [`Error`], the variants the callers match.

pub mod client;
pub mod error;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod watch;

/// The messages and clients generated from `crates/leasehold/proto/` by `tonic-prost-build` (with `protox`, no
/// `protoc`): do not edit; regenerate with `LEASEHOLD_BLESS=1 cargo test -p leasehold-tests --test etcd_proto`.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic, rust_2018_idioms)]
#[rustfmt::skip]
pub mod pb {
    pub mod etcdserverpb;
    pub mod mvccpb;
    pub mod v3lockpb;
}

#[cfg(feature = "tls")]
pub use client::{Certificate, Identity, TlsOptions};
pub use client::{Client, ConnectOptions};
pub use error::Error;
pub use kv::{
    Compare, CompareOp, DeleteOptions, DeleteResponse, GetOptions, GetResponse, KeyValue,
    PutOptions, PutResponse, ResponseHeader, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
pub use lease::{
    LeaseGrantResponse, LeaseKeepAliveResponse, LeaseKeepAliveStream, LeaseKeeper,
    LeaseRevokeResponse, LeaseTimeToLiveResponse,
};
pub use lock::{LockOptions, LockResponse, UnlockResponse};
pub use watch::{Event, EventType, WatchOptions, WatchResponse, WatchStream};
