//! The lock on etcd: one member (topology `etcd`) or a Raft cluster of three (`etcd3`), and the faults of the etcd
//! mix that the rig draws in place of the Redis server's.
//!
//! Each worker reaches every member through a proxy of its own (on `etcd3`, three per worker), so that the path
//! faults cut, slow or reset one worker's way to the store without touching the others'. The store faults hit one
//! member at a time, never more (the rig injects one fault after another), so on `etcd3` two members always keep a
//! quorum: a member (any, or the leader) stopped with `SIGSTOP` or killed with `SIGKILL` and restarted with its data
//! directory, and the history compacted. None of them loses an acknowledged write (see `check.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use leasehold_tests::{EtcdCluster, EtcdServer, TcpProxy, XorShift as Rng};

use crate::history::{Fault, Window};
use crate::Topology;

fn now_ns() -> u64 {
    leasehold_tests::monotonic_ns()
}

/// The etcd members the lock lives on.
pub enum Etcd {
    One(EtcdServer),
    Three(EtcdCluster),
}

impl Etcd {
    /// Starts the members of an `etcd` or `etcd3` topology and waits until they are healthy.
    pub fn start(topology: Topology) -> Etcd {
        match topology {
            Topology::Etcd => Etcd::One(EtcdServer::start()),
            Topology::Etcd3 => Etcd::Three(EtcdCluster::start()),
            _ => unreachable!("{topology} is not an etcd topology"),
        }
    }

    /// How many members there are.
    pub fn members(&self) -> usize {
        match self {
            Etcd::One(_) => 1,
            Etcd::Three(_) => 3,
        }
    }

    /// The client address of member `i`, for the proxies in front of it.
    pub fn addr(&self, i: usize) -> SocketAddr {
        match self {
            Etcd::One(server) => server.addr(),
            Etcd::Three(cluster) => cluster.addr(i),
        }
    }

    /// The URL that reaches every member directly (not through a proxy).
    pub fn url(&self) -> String {
        match self {
            Etcd::One(server) => server.url(),
            Etcd::Three(cluster) => cluster.url(),
        }
    }

    /// Keys without a lease, which would never go away (every key of the lock lives under a session's lease).
    pub fn keys_without_lease(&self) -> Vec<String> {
        match self {
            Etcd::One(server) => server.keys_without_lease(),
            Etcd::Three(cluster) => cluster.keys_without_lease(),
        }
    }

    /// Everything member `i` logged, across its restarts.
    pub fn log(&self, i: usize) -> String {
        match self {
            Etcd::One(server) => server.log(),
            Etcd::Three(cluster) => cluster.log(i),
        }
    }

    /// The member that leads now (on one member, that one), once the running members agree on it.
    fn leader(&self) -> usize {
        match self {
            Etcd::One(_) => 0,
            Etcd::Three(cluster) => cluster.leader(),
        }
    }

    fn pause(&mut self, i: usize) {
        match self {
            Etcd::One(server) => server.pause(),
            Etcd::Three(cluster) => cluster.pause(i),
        }
    }

    fn resume(&mut self, i: usize) {
        match self {
            Etcd::One(server) => server.resume(),
            Etcd::Three(cluster) => cluster.resume(i),
        }
    }

    fn kill(&mut self, i: usize) {
        match self {
            Etcd::One(server) => server.kill(),
            Etcd::Three(cluster) => cluster.kill(i),
        }
    }

    fn restart(&mut self, i: usize) {
        match self {
            Etcd::One(server) => server.restart(),
            Etcd::Three(cluster) => cluster.restart(i),
        }
    }

    fn compact(&self) -> Option<u64> {
        match self {
            Etcd::One(server) => server.compact(),
            Etcd::Three(cluster) => cluster.compact(),
        }
    }

    /// One fault of the etcd mix, for slot `slot` of the rig's ten (2 to 8: the slots of the Redis server's faults),
    /// aimed at worker `worker` (whose proxies to the members, in member order, are `paths`) where it is a fault of a
    /// worker's path, and at one member otherwise. Returns when it was in force.
    ///
    /// - 2: the worker's paths blackholed for half a TTL to two TTLs: all of them (cut off from the store), or on
    ///   `etcd3` one time in three the path to one member only (its client must move on to another);
    /// - 3: the worker's paths slowed, each chunk held back by up to a third of a TTL, for one to four TTLs;
    /// - 4: a member, drawn at random, stopped (`SIGSTOP`) for a fifth of a TTL to two TTLs;
    /// - 5: a member, drawn at random, killed and restarted with its data after up to two TTLs down;
    /// - 6: the leader stopped or killed as in 4 or 5 (on one member, the member);
    /// - 7: the history compacted up to the current revision;
    /// - 8: every connection of the worker's paths reset.
    pub async fn fault(
        &mut self,
        slot: u64,
        worker: usize,
        paths: &[TcpProxy],
        rng: &mut Rng,
        ttl: Duration,
    ) -> Window {
        let start = now_ns();
        let (fault, target_worker, node) = match slot {
            2 => {
                let cut = rng.between(ttl / 2, ttl * 2);
                let one = (paths.len() > 1 && rng.chance(33))
                    .then(|| rng.below(paths.len() as u64) as usize);
                let cut_paths: Vec<&TcpProxy> = match one {
                    Some(member) => vec![&paths[member]],
                    None => paths.iter().collect(),
                };
                cut_paths.iter().for_each(|p| p.blackhole());
                tokio::time::sleep(cut).await;
                cut_paths.iter().for_each(|p| p.restore());
                (Fault::Blackhole, Some(worker), one)
            }
            3 => {
                let delay = rng.between(Duration::from_millis(2), ttl / 3);
                let length = rng.between(ttl, ttl * 4);
                paths.iter().for_each(|p| p.delay(delay));
                tokio::time::sleep(length).await;
                paths.iter().for_each(|p| p.delay(Duration::ZERO));
                (Fault::Delay, Some(worker), None)
            }
            4..=6 => {
                let restart = match slot {
                    4 => false,
                    5 => true,
                    _ => rng.chance(50),
                };
                let length = if restart {
                    rng.between(Duration::ZERO, ttl * 2)
                } else {
                    rng.between(ttl / 5, ttl * 2)
                };
                let drawn = rng.below(self.members() as u64) as usize;
                let leads = tokio::task::block_in_place(|| self.leader());
                let member = if slot == 6 { leads } else { drawn };
                let leader = member == leads;
                if restart {
                    tokio::task::block_in_place(|| self.kill(member));
                    tokio::time::sleep(length).await;
                    tokio::task::block_in_place(|| self.restart(member));
                    (Fault::MemberRestart { leader }, None, Some(member))
                } else {
                    self.pause(member);
                    tokio::time::sleep(length).await;
                    self.resume(member);
                    (Fault::MemberStop { leader }, None, Some(member))
                }
            }
            7 => {
                if tokio::task::block_in_place(|| self.compact()).is_none() {
                    eprintln!("torture: etcd did not answer the compaction");
                }
                (Fault::Compact, None, None)
            }
            8 => {
                paths.iter().for_each(TcpProxy::cut_all);
                (Fault::Reset, Some(worker), None)
            }
            _ => unreachable!("slot {slot} is not an etcd fault"),
        };
        Window {
            fault,
            worker: target_worker,
            node,
            erased: Vec::new(),
            start,
            end: now_ns(),
        }
    }
}
