//! The faults of a store whose servers are members of one replicated group (etcd, ZooKeeper; one member or three),
//! or that is one server (PostgreSQL, MariaDB: one member): the rig's slots 2 to 8 but one, which each store fills
//! with a fault of its own ([`OwnFaults`]: etcd's compaction, ZooKeeper's session expiry; a SQL server fills two).
//! [`fault`] is the one entry of the rig's loop for all of them: the store's own fault where it has one, the
//! members' mix otherwise.
//!
//! Each worker reaches every member through a proxy of its own (three per worker on three members), so that the path
//! faults cut, slow or reset one worker's way to the store without touching the others'. The member faults hit one
//! member at a time, never more (the rig injects one fault after another), so on three members two always keep a
//! quorum: a member (any, or the leader) stopped with `SIGSTOP`, or killed with `SIGKILL` and restarted with its data
//! directory.

use std::net::SocketAddr;
use std::time::Duration;

use leasehold_tests::{TcpProxy, XorShift as Rng};

use crate::history::{Fault, Window};

fn now_ns() -> u64 {
    leasehold_tests::monotonic_ns()
}

/// The members of a replicated store, as the faults reach them. Every method that waits blocks the thread (call it
/// inside `block_in_place`).
pub trait Members {
    /// How many members there are.
    fn members(&self) -> usize;

    /// The client address of member `i`, for the proxies in front of it.
    fn addr(&self, i: usize) -> SocketAddr;

    /// The member that leads now (on one member, that one), once the running members agree on it.
    fn leader(&self) -> usize;

    /// Stops member `i` with `SIGSTOP`.
    fn pause(&mut self, i: usize);

    /// Continues member `i` with `SIGCONT`.
    fn resume(&mut self, i: usize);

    /// Kills member `i` with `SIGKILL`.
    fn kill(&mut self, i: usize);

    /// Starts member `i` again with its data, and waits until it serves.
    fn restart(&mut self, i: usize);
}

/// Where a fault of slot `slot` (2 to 8) is aimed: at worker `worker`, whose proxies to the members (in member order)
/// are `paths`, where it is a fault of a worker; `ttl` is the workers' lease, which the fault's lengths follow.
#[derive(Clone, Copy)]
pub struct Aim<'a> {
    pub slot: u64,
    pub worker: usize,
    pub paths: &'a [TcpProxy],
    pub ttl: Duration,
}

/// The faults a store has of its own, in slots of the members' mix that it takes over.
pub trait OwnFaults: Members {
    /// Injects the store's own fault for `aim`'s slot, and returns once it was in force: what it was, and the worker
    /// it hit. `None`, having done nothing, for a slot the store leaves to the members' mix.
    async fn own_fault(&mut self, aim: &Aim<'_>, rng: &mut Rng) -> Option<(Fault, Option<usize>)>;
}

/// Cuts `paths` off (blackholed: nothing closed, nothing answered) for `length`, then lets them through again.
pub async fn cut_off<'p>(paths: impl Iterator<Item = &'p TcpProxy> + Clone, length: Duration) {
    paths.clone().for_each(TcpProxy::blackhole);
    tokio::time::sleep(length).await;
    paths.for_each(TcpProxy::restore);
}

/// The two shapes of a replicated store in the rig: one member (etcd's `EtcdServer`, ZooKeeper's `ZkServer`) or
/// three (`EtcdCluster`, `ZkEnsemble`). [`one_or_three!`] gives it [`Members`], `url` and `log` for a store.
pub enum OneOrThree<One, Three> {
    One(One),
    Three(Three),
}

/// Implements [`Members`], `start` (given the two topologies' names), `url` (every member, directly) and `log` (member `i`'s, across its restarts) for
/// `OneOrThree<$one, $three>`, whose two harness types have the same methods, the single member's without the index.
macro_rules! one_or_three {
    ($one:ident, $three:ident, $one_topology:ident, $three_topology:ident) => {
        impl $crate::members::OneOrThree<$one, $three> {
            /// Starts the members of the store's topology of one member or of three, and waits until they serve.
            pub fn start(topology: $crate::Topology) -> Self {
                match topology {
                    $crate::Topology::$one_topology => Self::One($one::start()),
                    $crate::Topology::$three_topology => Self::Three($three::start()),
                    _ => unreachable!("{topology} is not a topology of {}", stringify!($one)),
                }
            }

            /// The URL that reaches every member directly (not through a proxy).
            pub fn url(&self) -> String {
                match self {
                    Self::One(one) => one.url(),
                    Self::Three(three) => three.url(),
                }
            }

            /// Everything member `i` logged, across its restarts.
            pub fn log(&self, i: usize) -> String {
                match self {
                    Self::One(one) => one.log(),
                    Self::Three(three) => three.log(i),
                }
            }
        }

        impl $crate::members::Members for $crate::members::OneOrThree<$one, $three> {
            fn members(&self) -> usize {
                match self {
                    Self::One(_) => 1,
                    Self::Three(_) => 3,
                }
            }

            fn addr(&self, i: usize) -> std::net::SocketAddr {
                match self {
                    Self::One(one) => one.addr(),
                    Self::Three(three) => three.addr(i),
                }
            }

            fn leader(&self) -> usize {
                match self {
                    Self::One(_) => 0,
                    Self::Three(three) => three.leader(),
                }
            }

            fn pause(&mut self, i: usize) {
                match self {
                    Self::One(one) => one.pause(),
                    Self::Three(three) => three.pause(i),
                }
            }

            fn resume(&mut self, i: usize) {
                match self {
                    Self::One(one) => one.resume(),
                    Self::Three(three) => three.resume(i),
                }
            }

            fn kill(&mut self, i: usize) {
                match self {
                    Self::One(one) => one.kill(),
                    Self::Three(three) => three.kill(i),
                }
            }

            fn restart(&mut self, i: usize) {
                match self {
                    Self::One(one) => one.restart(),
                    Self::Three(three) => three.restart(i),
                }
            }
        }
    };
}
pub(crate) use one_or_three;

/// One fault of `store`'s mix, for slot `aim.slot` of the rig's ten (2 to 8: the slots of the Redis server's
/// faults): the store's own fault where it has one for the slot ([`OwnFaults::own_fault`]), the members' mix
/// ([`mix`]) otherwise. Returns when it was in force.
pub async fn fault<S: OwnFaults>(store: &mut S, aim: &Aim<'_>, rng: &mut Rng) -> Window {
    let start = now_ns();
    let (fault, worker, node) = match store.own_fault(aim, rng).await {
        Some((fault, worker)) => (fault, worker, None),
        None => mix(store, aim, rng).await,
    };
    Window {
        fault,
        worker,
        node,
        erased: Vec::new(),
        start,
        end: now_ns(),
    }
}

/// One fault of the members' mix, for a slot the store leaves to it (2 to 8 but its own): what it was, the worker
/// and the member it hit.
///
/// - 2: the worker's paths blackholed for half a TTL to two TTLs: all of them (cut off from the store), or on three
///   members one time in three the path to one member only (its client must move on to another);
/// - 3: the worker's paths slowed, each chunk held back by up to a third of a TTL, for one to four TTLs;
/// - 4: a member, drawn at random, stopped (`SIGSTOP`) for a fifth of a TTL to two TTLs;
/// - 5: a member, drawn at random, killed and restarted with its data after up to two TTLs down;
/// - 6: the leader stopped or killed as in 4 or 5 (on one member, the member);
/// - 8: every connection of the worker's paths reset.
async fn mix<M: Members>(
    members: &mut M,
    aim: &Aim<'_>,
    rng: &mut Rng,
) -> (Fault, Option<usize>, Option<usize>) {
    let Aim {
        slot,
        worker,
        paths,
        ttl,
    } = *aim;
    match slot {
        2 => {
            let cut = rng.between(ttl / 2, ttl * 2);
            let one =
                (paths.len() > 1 && rng.chance(33)).then(|| rng.below(paths.len() as u64) as usize);
            let cut_paths: Vec<&TcpProxy> = match one {
                Some(member) => vec![&paths[member]],
                None => paths.iter().collect(),
            };
            cut_off(cut_paths.iter().copied(), cut).await;
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
            let drawn = rng.below(members.members() as u64) as usize;
            let leads = tokio::task::block_in_place(|| members.leader());
            let member = if slot == 6 { leads } else { drawn };
            let leader = member == leads;
            if restart {
                tokio::task::block_in_place(|| members.kill(member));
                tokio::time::sleep(length).await;
                tokio::task::block_in_place(|| members.restart(member));
                (Fault::MemberRestart { leader }, None, Some(member))
            } else {
                members.pause(member);
                tokio::time::sleep(length).await;
                members.resume(member);
                (Fault::MemberStop { leader }, None, Some(member))
            }
        }
        8 => {
            paths.iter().for_each(TcpProxy::cut_all);
            (Fault::Reset, Some(worker), None)
        }
        _ => unreachable!("slot {slot} is not a fault of the members' mix"),
    }
}
