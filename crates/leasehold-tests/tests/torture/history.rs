//! The histories: what the workers logged, and the fault windows the scheduler recorded, on one clock
//! (`CLOCK_MONOTONIC`, nanoseconds).

use std::collections::BTreeMap;
use std::path::Path;

/// One grant of the lock, as its worker saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    pub worker: usize,
    pub fence: u64,
    /// What it held: `x` exclusive, `w` write, `r` read, `s` a permit.
    pub mode: char,
    /// The owner token the lock's keys hold for it.
    pub token: String,
    /// When the worker last began to wait before this grant (its `want` line): the request that granted it ran on the
    /// server after this.
    pub wanted: Option<u64>,
    /// When `lock()` returned the grant.
    pub granted: u64,
    /// The first and last `is_held() == true` samples (each stamped before the call).
    pub first_held: Option<u64>,
    pub last_held: Option<u64>,
    /// When the loss signal resolved, with its reason (`Released` is not a loss).
    pub lost: Option<(u64, String)>,
    /// When `release()` returned, with its outcome.
    pub released: Option<(u64, String)>,
    /// An election's term number (its `term` line).
    pub term: Option<u64>,
}

impl Grant {
    /// The interval in which the worker was told it held the lock, if it ever was.
    pub fn held(&self) -> Option<(u64, u64)> {
        Some((self.first_held?, self.last_held?))
    }

    /// When a real loss (not the release) was signalled.
    pub fn loss(&self) -> Option<u64> {
        self.lost
            .as_ref()
            .filter(|(_, reason)| reason != "Released")
            .map(|&(t, _)| t)
    }
}

/// What the scheduler did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGSTOP of a worker past its lease, then SIGCONT.
    Stop,
    /// SIGKILL of a worker, and a new one in its place.
    Kill,
    /// A worker's proxy swallows everything, both ways.
    Blackhole,
    /// A worker's proxy holds requests and replies back.
    Delay,
    /// `DEBUG SLEEP` on the lock server (on a cluster: the lock's primary; on a quorum: one node).
    DebugSleep,
    /// `CLIENT PAUSE` on the lock server (on a cluster: the lock's primary; on a quorum: one node).
    Pause,
    /// The lock server killed and restarted from an older snapshot: grants since then lost, the fence counter
    /// stale.
    Restart,
    /// `FLUSHALL` on the lock server (on a cluster: the lock's primary, and its replica through replication; on a
    /// quorum: one node, and only the token that node held is lost, see [`Window::erased`]).
    Flushall,
    /// `DEL` of the lock's fence counter (on a quorum: one node's).
    DelFence,
    /// Clients that join the lock's queue and vanish.
    QueueAndDie,
    /// `CLUSTER FAILOVER` on the replica of the lock's primary: the coordinated kind, in which the replica catches up
    /// before it takes over, so nothing acknowledged is lost.
    Failover,
    /// The lock's slot migrated to another primary and back, each way with a pause half-way (`IMPORTING` /
    /// `MIGRATING`); keys move with `MIGRATE`, nothing is lost.
    Migrate,
    /// `kill -9` of the lock's primary, until its replica is elected (or a `DEBUG SLEEP` that outlasted the node
    /// timeout, so that the replica was elected meanwhile). Replication is asynchronous: the replica may lack the
    /// last grants, releases and fence increments.
    PrimaryLost,
    /// A killed primary started again, until the cluster is stable with it as a replica of the elected one.
    Rejoin,
    /// `kill -9` of a quorum node, down for longer than the longest lease, then started again empty (Redlock's
    /// delayed restart): every lease it granted has ended before it answers again, or is still held on a majority
    /// without it, so it loses nothing that counts.
    NodeRestart,
    /// Every connection of a worker's path reset at once (the proxy's `cut_all`): the worker hears of it at once and
    /// connects again.
    Reset,
    /// `SIGSTOP` of an etcd member, a ZooKeeper server or the SQL server (every process of a PostgreSQL server)
    /// ([`Window::node`]; `leader`: it led when stopped, as the only server does), then `SIGCONT`: it answers nothing
    /// meanwhile (a stopped leader is replaced by an election among the others), and its clock runs on.
    MemberStop { leader: bool },
    /// `kill -9` of an etcd member, a ZooKeeper server or the SQL server ([`Window::node`]; `leader`: it led when
    /// killed), and a restart with its data directory once it was down for a while; on three members the other two
    /// keep a quorum meanwhile. Every one of these stores keeps what it acknowledged: nothing is lost.
    MemberRestart { leader: bool },
    /// etcd's history compacted up to its current revision: a watch from an older revision is cancelled. Nothing is
    /// lost but history.
    Compact,
    /// A worker's paths to every ZooKeeper server blackholed for longer than its session timeout and two ticks:
    /// ZooKeeper expires the session (its nodes go with it) while the client is cut off, and the client hears
    /// `SessionExpired` once it gets through again. On a SQL server the same with the session row: the worker's path
    /// blackholed for longer than its TTL after its last renewal, so that the row expires on the server's clock (and
    /// the next waiter deletes it with its entries). Nothing is lost that the session did not own.
    SessionExpiry,
    /// Every connection of one worker killed by the SQL server (`pg_terminate_backend`, `KILL CONNECTION`): its
    /// statements in flight fail at once (whether they committed is unknown to it), and its pool and, on PostgreSQL,
    /// its `LISTEN`ing connection connect again. Nothing is lost.
    ConnectionsKilled,
}

impl Fault {
    /// Faults after which the server no longer has a grant it acknowledged: the library promises no exclusion
    /// across them (only fences keep the store safe).
    pub fn loses_grants(self) -> bool {
        matches!(self, Fault::Restart | Fault::Flushall | Fault::PrimaryLost)
    }
}

/// A fault and when it was in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub fault: Fault,
    /// The worker it targeted, for faults of one worker.
    pub worker: Option<usize>,
    /// The quorum node it targeted, for faults of one node of a quorum; the etcd member, ZooKeeper server or SQL
    /// server, for a fault of one member (or of a worker's path to one member only).
    pub node: Option<usize>,
    /// For a fault that loses data on one quorum node: the owner tokens (a mutex's, or a read-write lock's holds)
    /// that node held when its data went. A quorum grant held on a bare majority that included the node is left on
    /// a minority, and the node can grant again at once; any other grant still has its majority. A fault that loses
    /// the data of the lock's only server (or primary) may erase any grant.
    pub erased: Vec<String>,
    pub start: u64,
    pub end: u64,
}

impl Window {
    /// Whether this fault may have taken `grant` from the lock's server(s).
    pub fn may_erase(&self, grant: &Grant) -> bool {
        self.fault.loses_grants() && (self.node.is_none() || self.erased.contains(&grant.token))
    }

    pub fn overlaps(&self, from: u64, to: u64) -> bool {
        self.start <= to && from <= self.end
    }
}

/// Reads one worker's log (every incarnation appends to its own file) into its grants, keyed by fence.
pub fn parse(worker: usize, text: &str, grants: &mut BTreeMap<u64, Grant>, stats: &mut Stats) {
    let mut wanted = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (Some(&kind), Some(Ok(t))) = (words.first(), words.get(1).map(|w| w.parse::<u64>()))
        else {
            continue; // a line cut short by a SIGKILL
        };
        let fence = words.get(2).and_then(|w| w.parse::<u64>().ok());
        let grant = |grants: &mut BTreeMap<u64, Grant>, fence: u64| -> Grant {
            grants.remove(&fence).unwrap_or(Grant {
                worker,
                fence,
                ..Grant::default()
            })
        };
        match (kind, fence) {
            ("want", _) => wanted = Some(t),
            ("grant", Some(f)) => {
                let mut g = grant(grants, f);
                g.wanted = wanted;
                g.granted = t;
                g.mode = words.get(3).and_then(|m| m.chars().next()).unwrap_or('x');
                g.token = words.get(4).map_or_else(String::new, |t| (*t).to_owned());
                grants.insert(f, g);
                stats.sections += 1;
            }
            ("held", Some(f)) => {
                let mut g = grant(grants, f);
                g.first_held = Some(g.first_held.map_or(t, |x| x.min(t)));
                g.last_held = Some(g.last_held.map_or(t, |x| x.max(t)));
                grants.insert(f, g);
            }
            ("lost", Some(f)) => {
                let mut g = grant(grants, f);
                g.lost = Some((t, words.get(3).unwrap_or(&"?").to_string()));
                grants.insert(f, g);
            }
            ("released", Some(f)) => {
                let mut g = grant(grants, f);
                g.released = Some((t, words.get(3).unwrap_or(&"?").to_string()));
                grants.insert(f, g);
            }
            ("term", Some(f)) => {
                let mut g = grant(grants, f);
                g.term = words.get(3).and_then(|n| n.parse().ok());
                grants.insert(f, g);
            }
            ("write", Some(_)) => match words.get(3) {
                Some(&"1") => stats.writes += 1,
                Some(&"0") => stats.refused += 1,
                _ => {}
            },
            ("occupied", _) => stats.occupied += 1,
            ("error", _) => stats.errors += 1,
            _ => {}
        }
    }
}

/// Counts that are reported but are not violations.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub sections: u64,
    pub writes: u64,
    pub refused: u64,
    pub occupied: u64,
    pub errors: u64,
}

/// Every worker log in `dir` (`worker-<i>-<incarnation>.log`).
pub fn read_all(dir: &Path) -> (Vec<Grant>, Stats) {
    let mut grants = BTreeMap::new();
    let mut stats = Stats::default();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(worker) = name
            .strip_prefix("worker-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|w| w.parse().ok())
        else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        parse(worker, &text, &mut grants, &mut stats);
    }
    (grants.into_values().collect(), stats)
}
