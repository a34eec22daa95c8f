//! The lock on etcd: one member (topology `etcd`) or a Raft cluster of three (`etcd3`), and the faults of the etcd
//! mix that the rig draws in place of the Redis server's.
//!
//! Each worker reaches every member through a proxy of its own (on `etcd3`, three per worker). The faults are the
//! members' mix ([`members::fault`](crate::members::fault): a worker's paths cut, slowed or reset; a member, any or the leader, stopped with
//! `SIGSTOP` or killed with `SIGKILL` and restarted with its data directory, one at a time, so that `etcd3` keeps a
//! quorum), and etcd's own: the history compacted. None of them loses an acknowledged write (see `check.rs`).

use leasehold_tests::{EtcdCluster, EtcdServer, XorShift as Rng};

use crate::history::Fault;
use crate::members::{self, Aim, OneOrThree, OwnFaults};

/// The etcd members the lock lives on.
pub type Etcd = OneOrThree<EtcdServer, EtcdCluster>;

members::one_or_three!(EtcdServer, EtcdCluster, Etcd, Etcd3);

impl Etcd {
    /// Keys without a lease, which would never go away (every key of the lock lives under a session's lease).
    pub fn keys_without_lease(&self) -> Vec<String> {
        match self {
            Etcd::One(server) => server.keys_without_lease(),
            Etcd::Three(cluster) => cluster.keys_without_lease(),
        }
    }

    fn compact(&self) -> Option<u64> {
        match self {
            Etcd::One(server) => server.compact(),
            Etcd::Three(cluster) => cluster.compact(),
        }
    }
}

/// etcd's own fault, in slot 7: the history compacted up to the current revision.
impl OwnFaults for Etcd {
    async fn own_fault(&mut self, aim: &Aim<'_>, _rng: &mut Rng) -> Option<(Fault, Option<usize>)> {
        if aim.slot != 7 {
            return None;
        }
        if tokio::task::block_in_place(|| self.compact()).is_none() {
            eprintln!("torture: etcd did not answer the compaction");
        }
        Some((Fault::Compact, None))
    }
}
