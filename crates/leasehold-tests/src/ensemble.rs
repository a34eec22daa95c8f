//! What the etcd and ZooKeeper harnesses share: members of one replicated store with a common fate, started
//! together, healed and dropped together. [`Standalone`] is one member alone, [`Ensemble`] three; both start, kill,
//! restart, pause and resume members and give their endpoints and URL the same way. A [`Store`]
//! ([`Etcd`](crate::etcd::Etcd) in `etcd.rs`, [`ZooKeeper`](crate::zookeeper::ZooKeeper) in `zookeeper.rs`) is what
//! a member keeps of its own (its peer ports) plus a few hooks: its command line and configuration, what the members
//! are told of each other, its readiness probe and how its members name their leader. The types tests name are the
//! stores' aliases, [`EtcdServer`](crate::EtcdServer), [`EtcdCluster`](crate::EtcdCluster),
//! [`ZkServer`](crate::ZkServer) and [`ZkEnsemble`](crate::ZkEnsemble).

use std::net::SocketAddr;

use crate::daemon::{poll_until, restart_on_port, Daemon};
use crate::server::{free_port, START_ATTEMPTS};

/// What differs between the replicated stores' members: implemented by [`Etcd`](crate::etcd::Etcd) and
/// [`ZooKeeper`](crate::zookeeper::ZooKeeper) only, which hold what a member keeps besides its process and its
/// client port.
pub trait Store: Sized + Clone + std::fmt::Debug {
    /// The store's name in messages: `etcd`, `ZooKeeper`. In lower case, it names a member's temporary directory
    /// (before the member's index) and its log file there (`zookeeper.log`, appended to across restarts).
    const NAME: &'static str;
    /// A member's name in messages, before its index: `etcd member`, `ZooKeeper server`.
    const MEMBER: &'static str;

    /// The scheme of the members' URL: `etcd`, `etcds`, `zk`.
    #[doc(hidden)]
    fn scheme(&self) -> &'static str;
    /// Takes free ports for the member's peers to reach it, for a start of `members` members.
    #[doc(hidden)]
    fn take_peer_ports(&mut self, members: usize);
    /// What every member is told of the others (etcd's `--initial-cluster`, ZooKeeper's `server.N` lines).
    #[doc(hidden)]
    fn peers(members: &[Member<Self>]) -> String;
    /// Runs the member, without waiting for it: the members of an ensemble must all run before any is ready.
    #[doc(hidden)]
    fn spawn(member: &mut Member<Self>, peers: &str);
    /// Whether the member answers as it should once it is ready (one poll).
    #[doc(hidden)]
    fn serves(member: &Member<Self>) -> Result<(), String>;
    /// The index of the member that leads, once the running members that are not paused agree on one (one poll).
    #[doc(hidden)]
    fn leader(members: &[Member<Self>]) -> Result<usize, String>;

    /// Whether the members just started are ready together (one poll): by default, every running one serves.
    #[doc(hidden)]
    fn ready(members: &[Member<Self>]) -> Result<(), String> {
        members
            .iter()
            .filter(|m| m.daemon.pid().is_some())
            .try_for_each(Self::serves)
    }
    /// `Some(true)` when the member failed to bind a port, `Some(false)` when it exited otherwise, `None` while it
    /// runs as it should. Only what the log grew by since `log_start` counts. By default, whether it exited.
    #[doc(hidden)]
    fn failed(member: &mut Member<Self>, log_start: u64) -> Option<bool> {
        member.daemon.exited(log_start)
    }
    /// Kills a member of a start that found its ports taken, before the start over on other ports.
    #[doc(hidden)]
    fn discard(member: &mut Member<Self>) {
        member.daemon.kill();
    }
    /// Prints to stderr what the store tells of the member beyond its log, when the thread is panicking.
    #[doc(hidden)]
    fn print_state(_member: &Member<Self>) {}
}

/// One member of a store `S`: its process, its client port, and what the store keeps of its own.
#[derive(Debug)]
#[doc(hidden)]
pub struct Member<S> {
    /// Its index, as tests name it.
    pub(crate) index: usize,
    /// The process; its directory holds the data and the log, kept across restarts, so a restarted member keeps its
    /// identity and its data.
    pub(crate) daemon: Daemon,
    pub(crate) client_port: u16,
    pub(crate) own: S,
}

impl<S: Store> Member<S> {
    fn new(index: usize, own: S) -> Member<S> {
        let store = S::NAME.to_ascii_lowercase();
        Member {
            index,
            daemon: Daemon::new(
                format!("{} {index}", S::MEMBER),
                &format!("{store}{index}"),
                format!("{store}.log"),
            ),
            client_port: 0,
            own,
        }
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }
}

/// The members of a [`Standalone`] or an [`Ensemble`].
#[derive(Debug)]
pub(crate) struct Members<S: Store> {
    pub(crate) members: Vec<Member<S>>,
}

impl<S: Store> Members<S> {
    /// Starts `n` members, each keeping `own` of its own, on free ports, and waits until they are ready; on a taken
    /// port, starts all of them again on fresh ports, a few times over.
    fn start(n: usize, own: S) -> Members<S> {
        let mut members = Members {
            members: (0..n).map(|i| Member::new(i, own.clone())).collect(),
        };
        for _ in 0..START_ATTEMPTS {
            for member in &mut members.members {
                member.client_port = free_port();
                member.own.take_peer_ports(n);
            }
            let peers = S::peers(&members.members);
            let starts: Vec<u64> = members.members.iter().map(|m| m.daemon.log_len()).collect();
            for member in &mut members.members {
                S::spawn(member, &peers);
            }
            match members.wait_ready(&starts) {
                Ok(()) => return members,
                Err(true) => members.members.iter_mut().for_each(S::discard),
                // Dropping `members` while panicking prints the logs.
                Err(false) => panic!("{} exited before it was ready", S::NAME),
            }
        }
        panic!(
            "{} found its ports taken {START_ATTEMPTS} times in a row",
            S::NAME
        );
    }

    /// Waits until the members are ready; `Err(addr_in_use)` if one failed first.
    fn wait_ready(&mut self, log_starts: &[u64]) -> Result<(), bool> {
        poll_until(&format!("ready {}", S::NAME), || {
            for (member, &start) in self.members.iter_mut().zip(log_starts) {
                if let Some(addr_in_use) = S::failed(member, start) {
                    return Ok(Err(addr_in_use));
                }
            }
            S::ready(&self.members).map(Ok)
        })
    }

    fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    fn url(&self) -> String {
        let scheme = self.members[0].own.scheme();
        format!("{scheme}://{}", self.endpoints().join(","))
    }

    /// [`Store::leader`], polled until it holds.
    pub(crate) fn wait_leader(&self) -> usize {
        poll_until(&format!("{} leader", S::NAME), || S::leader(&self.members))
    }

    fn kill(&mut self, i: usize) {
        self.members[i].daemon.kill();
    }

    /// Kills member `i` if it runs, starts it again on its ports with its directory, and waits until it serves.
    fn restart(&mut self, i: usize) {
        self.kill(i);
        let peers = S::peers(&self.members);
        let member = &mut self.members[i];
        let name = member.daemon.name().to_owned();
        restart_on_port(&name, || {
            let start = member.daemon.log_len();
            S::spawn(member, &peers);
            poll_until(&format!("ready {name}"), || {
                match S::failed(member, start) {
                    Some(addr_in_use) => Ok(Err(addr_in_use)),
                    None => S::serves(member).map(Ok),
                }
            })
        });
    }
}

impl<S: Store> Drop for Members<S> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for member in &self.members {
                member.daemon.print_log_if_panicking(member.client_port);
                S::print_state(member);
            }
        }
        // SIGKILL works on a stopped process too.
        for member in &mut self.members {
            member.daemon.kill();
        }
    }
}

/// One member of a store alone, on private ports of 127.0.0.1, with its data in a temporary directory: see
/// [`EtcdServer`](crate::EtcdServer) and [`ZkServer`](crate::ZkServer).
///
/// Dropping the value kills the member with `SIGKILL`, reaps it and removes its directory; if the thread is
/// panicking, its log (and what the store tells of it: ZooKeeper's `stat`) is printed to stderr first. All methods
/// block the calling thread; those that wait panic with a message when the store cannot be run or the member is not
/// ready within 20 seconds.
#[derive(Debug)]
pub struct Standalone<S: Store> {
    pub(crate) members: Members<S>,
}

impl<S: Store> Standalone<S> {
    /// Starts the member, keeping `own` of its own, and waits until it is ready.
    pub(crate) fn start_with(own: S) -> Standalone<S> {
        Standalone {
            members: Members::start(1, own),
        }
    }

    /// The member.
    pub(crate) fn member(&self) -> &Member<S> {
        &self.members.members[0]
    }

    /// `127.0.0.1:PORT`, the client endpoint.
    pub fn endpoint(&self) -> String {
        self.member().endpoint()
    }

    /// `etcd://127.0.0.1:PORT` (`etcds://` with TLS), `zk://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.members.url()
    }

    /// The client endpoint as an address, for a [`TcpProxy`](crate::TcpProxy) in front of it.
    pub fn addr(&self) -> SocketAddr {
        self.member().addr()
    }

    /// The member's process id, or `None` while it is killed.
    pub fn pid(&self) -> Option<u32> {
        self.member().daemon.pid()
    }

    /// Kills the member with `SIGKILL` and reaps it. Does nothing if it is already killed.
    pub fn kill(&mut self) {
        self.members.kill(0);
    }

    /// Kills the member if it runs, starts it again on the same ports with the same data directory, and waits until
    /// it is ready (what survives: see the store's alias).
    ///
    /// # Panics
    ///
    /// If it is not ready within 20 seconds.
    pub fn restart(&mut self) {
        self.members.restart(0);
    }

    /// Stops the member with `SIGSTOP`, and returns once the kernel reports it stopped (a signal is delivered
    /// asynchronously): it keeps its connections and its port (the kernel still accepts connections) but answers
    /// nothing.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn pause(&mut self) {
        self.members.members[0].daemon.pause();
    }

    /// Continues a paused member with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn resume(&mut self) {
        self.members.members[0].daemon.resume();
    }

    /// Everything the member logged so far, across restarts.
    pub fn log(&self) -> String {
        self.member().daemon.log()
    }
}

/// Three members of a store on private ports of 127.0.0.1, each with its data in a temporary directory: see
/// [`EtcdCluster`](crate::EtcdCluster) and [`ZkEnsemble`](crate::ZkEnsemble).
///
/// Members are addressed by index, `0..3`. Which one leads is up to the store's election: ask
/// [`leader`](Self::leader). Dropping the value kills every member with `SIGKILL` and removes their directories; if
/// the thread is panicking, every member's log (and what the store tells of it: ZooKeeper's `stat`) is printed to
/// stderr first. All methods block the calling thread; those that wait panic with a message when the store cannot be
/// run or a wait does not end within 20 seconds.
#[derive(Debug)]
pub struct Ensemble<S: Store> {
    pub(crate) members: Members<S>,
}

impl<S: Store> Ensemble<S> {
    /// Starts three members, each keeping `own` of its own, and waits until they are ready.
    pub(crate) fn start_with(own: S) -> Ensemble<S> {
        Ensemble {
            members: Members::start(3, own),
        }
    }

    /// `127.0.0.1:PORT` of every member's client endpoint, in index order, killed ones included.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.endpoints()
    }

    /// `etcd://127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2`, `zk://…`.
    pub fn url(&self) -> String {
        self.members.url()
    }

    /// The client endpoint of member `i` as an address, for a [`TcpProxy`](crate::TcpProxy) in front of it.
    ///
    /// # Panics
    ///
    /// If `i` is not below 3, as do all methods that take a member index.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.members.members[i].addr()
    }

    /// The process id of member `i`, or `None` while it is killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.members[i].daemon.pid()
    }

    /// The index of the leader, once the running members that are not paused agree on it (how they say so: see the
    /// store's alias): after a kill of the leader this waits for the others to elect one. A paused member is not
    /// asked.
    ///
    /// # Panics
    ///
    /// If they do not agree on a running leader within 20 seconds.
    pub fn leader(&self) -> usize {
        self.members.wait_leader()
    }

    /// Kills member `i` with `SIGKILL` and reaps it, without waiting for the others to notice. Does nothing if it is
    /// already killed.
    pub fn kill(&mut self, i: usize) {
        self.members.kill(i);
    }

    /// Kills member `i` if it runs, starts it again on its ports with its data directory, and waits until it is
    /// ready: it has rejoined the others (what that takes: see the store's alias).
    ///
    /// # Panics
    ///
    /// If it is not ready within 20 seconds.
    pub fn restart(&mut self, i: usize) {
        self.members.restart(i);
    }

    /// Stops member `i` with `SIGSTOP`, and returns once the kernel reports it stopped: it keeps its connections but
    /// answers nothing, so its clients hear nothing until they move to another member, and the others elect a new
    /// leader if it led (when: see the store's alias).
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn pause(&mut self, i: usize) {
        self.members.members[i].daemon.pause();
    }

    /// Continues member `i` with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn resume(&mut self, i: usize) {
        self.members.members[i].daemon.resume();
    }

    /// Everything member `i` logged so far, across restarts.
    pub fn log(&self, i: usize) -> String {
        self.members.members[i].daemon.log()
    }
}
