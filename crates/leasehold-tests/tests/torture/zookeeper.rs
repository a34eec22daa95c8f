//! The lock on ZooKeeper: one standalone server (topology `zk`) or an ensemble of three (`zk3`), and the faults of the
//! ZooKeeper mix that the rig draws in place of the Redis server's.
//!
//! Each worker reaches every server through a proxy of its own (on `zk3`, three per worker). The faults are the
//! members' mix ([`members::fault`]: a worker's paths cut, slowed or reset; a server, any or the leader, stopped with
//! `SIGSTOP` or killed with `SIGKILL` and restarted with its data directory, one at a time, so that `zk3` keeps a
//! quorum), and ZooKeeper's own: a worker's session expired on the server while the worker is cut off from it.
//!
//! None of them loses an acknowledged write. An ensemble commits every write on a majority before it answers. A
//! standalone server runs with the harness's `forceSync=no`, which leaves out only the `fsync` of the transaction
//! log: ZooKeeper still writes each transaction to the log file, flushed from the JVM's buffer into the kernel,
//! before it answers (`SyncRequestProcessor::flush` calls `ZKDatabase::commit`, which flushes the log stream and
//! forces it to disk only with `forceSync`, and then hands the requests to the processor that answers). A process
//! killed with `SIGKILL` leaves the kernel's page cache intact; only the machine going down would lose those
//! writes, and the rig kills processes, not the machine (as with etcd's `--unsafe-no-fsync`). So a restarted
//! server has every node it acknowledged, and every session: it counts their timeouts afresh from its start.

use std::time::Duration;

use leasehold_tests::{XorShift as Rng, ZkEnsemble, ZkServer};

use crate::history::Fault;
use crate::members::{self, Aim, OneOrThree, OwnFaults};

/// ZooKeeper's tick in the harness (`tickTime=500`, `leasehold_tests::zookeeper`): sessions expire at tick
/// boundaries, so up to a tick after their timeout.
pub const ZK_TICK: Duration = Duration::from_millis(500);

/// The longest the workers' sessions may take to go once they are killed: the session timeout (at most 10 s in the
/// harness) and a tick, with room for a loaded machine.
const SESSIONS_GONE: Duration = Duration::from_secs(15);

/// The ZooKeeper servers the lock lives on.
pub type Zk = OneOrThree<ZkServer, ZkEnsemble>;

members::one_or_three!(ZkServer, ZkEnsemble, Zk, Zk3);

impl Zk {
    /// The sessions that hold ephemeral nodes, and their nodes, as the leader's `dump` lists them.
    fn ephemerals(&self) -> String {
        match self {
            Zk::One(server) => server.ephemerals(),
            Zk::Three(ensemble) => ensemble.ephemerals(),
        }
    }

    /// Nodes of lock `name` that no session owns, which would never go away (ZooKeeper's keys without a TTL): to be
    /// asked once every client of the lock is gone. Waits until ZooKeeper has expired every session that held an
    /// ephemeral node (a session timeout and a tick after its client's last word), then asks a client of its own for
    /// the lock's contenders: any left are not ephemeral. A session that outlives [`SESSIONS_GONE`] after its client
    /// was killed counts too, with its nodes.
    pub async fn nodes_without_session(&self, name: &str, ttl: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + SESSIONS_GONE;
        loop {
            let ephemerals = tokio::task::block_in_place(|| self.ephemerals());
            if ephemerals.starts_with("Sessions with Ephemerals (0)") {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return vec![format!(
                    "sessions that outlived their clients by {SESSIONS_GONE:?}: {}",
                    ephemerals.split_whitespace().collect::<Vec<_>>().join(" ")
                )];
            }
            // Polled: ZooKeeper tells an outsider nothing when a session expires.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let client = leasehold::Client::builder(&self.url())
            .expect("a zk:// URL")
            .session_ttl(ttl)
            .connect()
            .await
            .expect("a client of the rig's own connects to ZooKeeper");
        let info = client
            .inspect(name)
            .await
            .expect("ZooKeeper answers an inspection");
        let mut left: Vec<String> = info
            .holders
            .iter()
            .map(|holder| format!("{name}: a holder without a session, {}", holder.token))
            .collect();
        if info.waiting_clients > 0 {
            left.push(format!(
                "{name}: {} waiters without a session",
                info.waiting_clients
            ));
        }
        left
    }
}

/// ZooKeeper's own fault, in slot 7: the worker's session expired, all of its paths blackholed for longer than the
/// session timeout (`ttl`) and two ticks, so that ZooKeeper expires the session whatever the worker said last.
impl OwnFaults for Zk {
    async fn own_fault(&mut self, aim: &Aim<'_>, rng: &mut Rng) -> Option<(Fault, Option<usize>)> {
        if aim.slot != 7 {
            return None;
        }
        let cut = rng.between(aim.ttl + ZK_TICK * 2, aim.ttl * 2 + ZK_TICK * 2);
        members::cut_off(aim.paths.iter(), cut).await;
        Some((Fault::SessionExpiry, Some(aim.worker)))
    }
}
