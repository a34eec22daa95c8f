//! The checker: reads the histories and counts violations of the library's contract.
//!
//! What counts as a conflict depends on the lock kind ([`Rule`]): any two grants of an exclusive lock (the mutex, the
//! fair mutex), more than N of a semaphore, a write grant and any other of a read-write lock.
//!
//! - **Overlap**: a grant whose "held" interval (first to last `is_held() == true` sample) begins while conflicting
//!   grants are held. Excused
//!   (counted apart) when the later grant began within a lease of a fault that loses grants (restart without
//!   persistence, `FLUSHALL`, on a cluster the loss of the lock's primary: its replica is elected without the writes
//!   that had not reached it yet) that happened while the earlier one was held: the contract does not cover data
//!   loss, and the earlier holder learns of it at its next renewal, within a lease. A manual `CLUSTER FAILOVER` and a
//!   slot migration lose nothing, so an overlap across them is never excused. On a quorum, data loss on one node
//!   (`FLUSHALL`) excuses only the grant whose token that node held ([`Window::may_erase`]): a grant taken on a bare
//!   majority (three of five, the other two busy or silent when it was taken; renewals never add nodes) that included
//!   the node is left on two, and the node grants again at once: Redlock's own counter-example for a restart without
//!   the wait. A node killed and restarted empty only after longer than the lease ([`Fault::NodeRestart`]), and every
//!   other fault of at most two nodes, excuse nothing.
//! - **Fence regression**: a grant held after another one's held interval ended, that could not have been granted
//!   while that one was (any two of an exclusive lock, a write and any other of a read-write lock), with a lower
//!   fence. Never excused: fences are floored at the server clock, so they increase across data loss too.
//! - **Late loss**: a grant whose loss signal (not its release) resolved later than [`LATE_SLACK`] after a grant began
//!   whose held interval conflicts with it (and with every other grant not yet released or told of its loss), unless data loss came in between or the late worker was stopped (a paused process
//!   cannot be told anything until it runs again).
//! - **Stall**: the lock held by nobody, between two held intervals, for longer than the topology's stall bound
//!   ([`stall_bound`]) while no fault was in force or recovering (each fault window extended by [`recovery`]). Five
//!   workers loop on the lock, so someone always waits; a release hands over in a few milliseconds, so a longer gap
//!   in calm times means a waiter was not woken (on a quorum, whose waiters poll, that one did not poll when it
//!   promised to). (Fences regress when a snapshot restore brings back a stale counter unless each is floored at
//!   the server clock.)
//!
//! **On etcd** (topologies `etcd` and `etcd3`) every rule applies as it is, and the stall bound is one server's. What
//! differs:
//!
//! - No excuse: etcd keeps its data across a member's kill and restart (the data directory survives, and the rig
//!   kills processes, not the machine, so `--unsafe-no-fsync` loses nothing) and replicates every write to a
//!   majority before it answers, so none of its faults ([`Fault::MemberStop`], [`Fault::MemberRestart`],
//!   [`Fault::Compact`], nor the worker and path faults) loses a grant ([`Fault::loses_grants`] is false for all of
//!   them): an overlap or a late loss across any of them is a violation. Fences are create revisions, which only
//!   grow: no excuse for a regression either.
//! - The recovery allowance after a fault ([`recovery`]) is etcd's own: a holder that cannot release keeps its key
//!   until etcd expires its session lease, not until a Redis lease or queue liveness runs out.
//!
//! **On ZooKeeper** (topologies `zk` and `zk3`) the same holds, with ZooKeeper's reasons:
//!
//! - No excuse: an ensemble commits every write on a majority before it answers, and a standalone server killed and
//!   restarted keeps what it acknowledged (its transaction log reaches the kernel before it answers, and the rig
//!   kills the process, not the machine, so the harness's `forceSync=no` loses nothing: see `zookeeper.rs`). None of
//!   its faults ([`Fault::MemberStop`], [`Fault::MemberRestart`], [`Fault::SessionExpiry`], nor the worker and path
//!   faults) loses a grant. Fences are `czxid`s, which only grow.
//! - The recovery allowance is ZooKeeper's: a node whose client cannot delete it stays until ZooKeeper expires the
//!   session it belongs to ([`recovery`]).
//!
//! **On PostgreSQL and MySQL** (topologies `pg` and `mysql`) the same holds, with the SQL stores' reasons:
//!
//! - No excuse: the server answers a commit once its log record is in the kernel (PostgreSQL's `synchronous_commit`,
//!   InnoDB's `innodb_flush_log_at_trx_commit=2` in the harness), which a `SIGKILL` of the server leaves intact (the
//!   rig kills processes, not the machine), and recovery replays it: none of the faults ([`Fault::MemberStop`],
//!   [`Fault::MemberRestart`], [`Fault::SessionExpiry`], [`Fault::ConnectionsKilled`], nor the worker and path
//!   faults) loses a grant. Fences come from a WAL-logged sequence (PostgreSQL: a crash skips values, never repeats
//!   one) or the lock's committed row (MySQL), so they only grow.
//! - The stall bound is PostgreSQL's `NOTIFY` on one side and MySQL's polling on the other ([`stall_bound`]), and the
//!   recovery allowance is the sessions' own: an entry whose client cannot delete it stays until its session row
//!   expires on the server's clock ([`recovery`]).

use std::time::Duration;

use crate::history::{Fault, Grant, Window};
use crate::zookeeper::ZK_TICK;
use crate::Topology;

/// The longest a free lock may go ungranted in calm times: a hand-off is a few milliseconds; this leaves room for a
/// loaded 2-core machine, and is well below the holder's lease, which is what a missed wake-up used to cost.
pub const STALL_BOUND: Duration = Duration::from_millis(200);

/// The longest pause of a quorum waiter between two rounds before its jitter: `QuorumMutex::lock_timeout` waits the
/// shortest remaining lease a busy node reported, clamped to at least one round and at most this (quorum.rs).
pub const QUORUM_PAUSE_CAP: Duration = Duration::from_secs(1);

/// The longest pause of a MySQL waiter between two checks: `poll_interval` (backend/sql/mysql.rs) doubles from 5 ms
/// to this.
pub const MYSQL_POLL_CAP: Duration = Duration::from_millis(100);

/// The stall bound of a topology. On one server and on a cluster a release wakes the next waiter: [`STALL_BOUND`].
///
/// A quorum waiter is woken by nothing yet: it polls. After a round that found the lock taken it pauses for
/// `clamp(remaining, round, 1 s) + jitter` (`QuorumMutex::lock_timeout`), where `round` is twice the per-node timeout
/// (2 × 250 ms), `remaining` the shortest lease left that a busy node reported, and `jitter` uniform below one round:
/// at most [`QUORUM_PAUSE_CAP`] + one round = 1.5 s. So once the lock is free, each waiter takes it at the latest
/// after the round it may have in flight (which saw the lock taken: at most one per-node timeout, 250 ms), its
/// longest pause (1.5 s) and the round that takes it (acquire and fence write-back: a few milliseconds in calm
/// times, given [`STALL_BOUND`] for a loaded machine): 1.95 s in all. This bound does not allow for the first waiters
/// after a release splitting the votes (all undo and pause again); the jitter makes that rare, and with four waiters
/// the next one usually comes within the bound anyway.
///
/// On etcd a release (a delete) reaches the next waiter on its watch of the key ahead of it, which then reads the keys
/// ahead once more and is granted: a few round trips, so [`STALL_BOUND`] too. The same on ZooKeeper: the delete of a
/// node fires the watch of the waiter behind it (on `exists` of that node; a permit waiter's, on the lock's children),
/// which lists the children once more and is granted.
///
/// On PostgreSQL a release deletes the entry and `NOTIFY`s the lock's name in the same transaction; every client's
/// listening connection hears it at the commit and wakes its waiters of that name, and the waiter whose turn it is
/// checks once (one statement) and is granted: [`STALL_BOUND`] too. MySQL has no notification: a waiter checks again
/// after its poll interval, 5 ms doubling to [`MYSQL_POLL_CAP`], so the release is seen at most 100 ms after it
/// committed, and the check that sees it grants: [`MYSQL_POLL_CAP`] + [`STALL_BOUND`], 300 ms. (On both, a waiter also
/// checks again 2 ms after the expiry of the entry it waits for: only a fault leaves a dead entry in the queue.) The
/// PostgreSQL bound assumes what the library promises, that a listening connection that failed is replaced: one that
/// went silent without closing (a cut path) is not noticed, its client's waiters then hear of a release only at that
/// re-check, up to a TTL later, and the checker rightly counts the wait as a stall.
pub fn stall_bound(topology: Topology) -> Duration {
    match topology {
        Topology::Single
        | Topology::Cluster
        | Topology::Etcd
        | Topology::Etcd3
        | Topology::Zk
        | Topology::Zk3
        | Topology::Pg => STALL_BOUND,
        Topology::Mysql => MYSQL_POLL_CAP + STALL_BOUND,
        Topology::Quorum => {
            let node = leasehold::DEFAULT_NODE_TIMEOUT;
            node + (QUORUM_PAUSE_CAP + node * 2) + STALL_BOUND
        }
    }
}

/// How long the scheduler keeps quiet between bursts of faults: longer than the longest recovery allowance.
pub const CALM: Duration = Duration::from_secs(8);

/// How long after a fault a gap is still explained by it. A dead or frozen client stays a live queue entry for up to
/// the liveness window (3 s) after its last heartbeat; a hand-off to it lapses after its claim (at most the lease),
/// and the next waiter's heartbeat (1 s) takes the free lock. Any other fault can cost a lost wake-up (heartbeat) or
/// a lease.
///
/// On a cluster, the windows themselves hold the slow part: the loss of the lock's primary is in force from the kill
/// until every live node agrees on the elected replica (the node timeout, 2 s, then the election: 3–5 s in all), the
/// killed node's rejoin until the cluster is stable again, a failover or migration until every node agrees on the
/// slot's new owner. After the election every waiter looks dead to the server (no heartbeat reached it for seconds,
/// and its wake-up subscription died with the node), so the loss of a primary gets a dead client's allowance; after
/// a failover, a migration or a rejoin a client follows `MOVED` on its next call and a wake-up sent to the old owner
/// costs at most a heartbeat or a claim, as for any other fault.
///
/// On etcd (`ttl` the session TTL) a grant or waiter key whose holder cannot release it (killed, stopped, cut off,
/// queued and dead, or its session lapsed while a member was down or stopped) stays until etcd expires the session's
/// lease: at most a TTL after the last keep-alive that reached the leader, plus the election timeout (1 s) by which a
/// new or restarted leader extends every lease (etcd 3.4 resets leases on promotion), found by the leader's expiry
/// scan (every 500 ms). The waiter behind it hears of the delete on its watch, or, if the watch died with a member or
/// a cut path without a word, at its re-check a TTL after it began to watch; a waiter whose own session lapsed opens
/// a new one after a back-off of at most 1 s. The longest chain, TTL + 1 s + 0.5 s + 1 s (4.5 s with the 2 s TTL),
/// with room for a loaded machine: `2 × TTL + 2 s` for every fault (6 s, below [`CALM`]).
///
/// On ZooKeeper (`ttl` the session timeout `t`, 2 s; ZooKeeper's tick 0.5 s) the same holds for a node: one whose
/// client cannot delete it (killed, stopped, cut off, queued and dead, or of a session its client gave up at the local
/// deadline, `5t/8` after its last answered `sync`, while a server was down, stopped or slow to it) stays until
/// ZooKeeper expires the session: `t` after the last request of it that the leader heard of, rounded up to the next
/// tick (ZooKeeper expires sessions in tick-wide buckets), so `t + tick`. The fault may start that count again, and
/// be over before it does: a restarted standalone server and a newly elected leader count every session afresh from
/// when they serve, and a resumed server at once expires those it did not hear of meanwhile. A restart is in force
/// until the server serves again, and the election after a kill of the leader is over in ~0.5 s, while the killed
/// server is still down; but a stopped leader is replaced ~3 s after it was stopped (followers give up on it after
/// `syncLimit`, 2.5 s), so a stop of 2.5–3 s ends up to ~0.5 s before its election: 1 s after the window, for a
/// loaded machine. The waiter behind the node hears of its delete on its watch (re-registered by its client across
/// reconnects). A waiter whose own session the fault cost (its deadline passed) queues again in a new session after a
/// back-off of at most 1 s; its connect, begun while a server was down or stopped, gives up within `t` (the connect's
/// own timeout) and runs meanwhile, so the expiry above is the longer wait. The longest chain, 1 s (a late election) +
/// `t` + tick + 1 s (a back-off), is 4.5 s with a 2 s session; with 1 s for a loaded machine (three JVMs and five
/// workers on two cores): `t + tick + 3 s` for every fault (5.5 s, below [`CALM`]). The runs of DESIGN.md's "On
/// ZooKeeper" never came within 1.9 s of it. A path slowed past the per-call timeout keeps the lock from everyone
/// while it lasts (its worker's nodes land, its sessions outlive the client's deadline): that is the fault's own time,
/// and the allowance runs from its end.
///
/// On PostgreSQL and MySQL (`ttl` the session TTL `t`, 2 s) an entry whose client cannot delete it (killed, stopped,
/// cut off, queued and dead, or of a session its client gave up at its local deadline while the server was stopped,
/// down or slow to it) stays until its session row expires on the server's clock: exactly `t` after the start of the
/// last renewal that ran (`expires_at = now() + t`, `now()` the statement's start). That renewal ran before the
/// fault's end, but for two: a stopped server runs the renewals that queued up in its sockets when it resumes (the
/// window's end), and one of a session that had not expired by then renews it, though its client may have given it
/// up; a slowed path delivers a renewal sent before the window's end up to its delay (at most `t/3`) later. So every
/// such row has expired `t + t/3` after the window. The waiter behind it checks again 2 ms after that expiry (each
/// check returns the time left on the server's clock; a MySQL waiter also polls at most [`MYSQL_POLL_CAP`] apart),
/// deletes the dead session (on PostgreSQL with a `NOTIFY` that wakes every waiter) and is granted at the next check.
/// Meanwhile a waiter whose checks failed in the fault checks again within its back-off (at most 1 s), one whose
/// session the fault cost queues again in a new session within the same back-off, a pooled connection left dead by a
/// cut path (the proxy never closes it) costs one statement's deadline (`t/4`), and PostgreSQL's listening
/// connection, once it sees its connection fail (a restart, a kill), reconnects within its own 1 s back-off and
/// wakes every waiter of its client. The longest chain,
/// `t + t/3`, then the re-check (at most 100 ms) and one more back-off if a failure came last (1 s), is 3.8 s with a
/// 2 s TTL; with 1 s for a loaded machine (the database server, five workers and the store's Redis on two cores):
/// `t + t/3 + 2 s` for every fault (4.7 s, below [`CALM`]). A slowed path keeps the lock from everyone while it
/// lasts, as on ZooKeeper (its worker's inserts and renewals land, their answers come too late): the fault's own
/// time.
pub fn recovery(fault: Fault, ttl: Duration, topology: Topology) -> u64 {
    let allowance = match (topology, fault) {
        (Topology::Etcd | Topology::Etcd3, _) => ttl * 2 + Duration::from_secs(2),
        (Topology::Zk | Topology::Zk3, _) => ttl + ZK_TICK + Duration::from_secs(3),
        (Topology::Pg | Topology::Mysql, _) => ttl + ttl / 3 + Duration::from_secs(2),
        (
            _,
            Fault::Stop | Fault::Kill | Fault::QueueAndDie | Fault::Blackhole | Fault::PrimaryLost,
        ) => Duration::from_secs(3) + Duration::from_secs(1) + ttl * 2 + Duration::from_millis(500),
        _ => ttl * 3 + Duration::from_millis(1500),
    };
    u64::try_from(allowance.as_nanos()).unwrap_or(u64::MAX)
}

/// Scheduling slack for a loss signal: the timer fires 2 ms before the deadline, and the deadline is at least the
/// drift allowance before the server can grant anyone else; a loaded 2-core machine can still delay a task this much.
pub const LATE_SLACK: u64 = 50_000_000;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub overlaps: Vec<String>,
    pub excused_overlaps: Vec<String>,
    pub fence_regressions: Vec<String>,
    pub late_losses: Vec<String>,
    pub stalls: Vec<String>,
    /// What an election's observer said (kind `election`).
    pub observer: Option<ObserverReport>,
}

impl Report {
    pub fn violations(&self) -> usize {
        self.overlaps.len()
            + self.fence_regressions.len()
            + self.late_losses.len()
            + self.stalls.len()
            + self.observer.as_ref().map_or(0, |o| o.violations.len())
    }
}

/// What an election's observer said, held to its promises.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ObserverReport {
    /// Leaders it said with a term number.
    pub said: u64,
    /// Terms it said it missed (`observed T missed N`).
    pub missed: u64,
    /// Times it said the count went back (`missed ?`).
    pub count_lost: u64,
    pub violations: Vec<String>,
}

/// Checks an election observer's `log` (`observed T leader FENCE NUMBER|-`, `observed T vacant`,
/// `observed T missed N|?`, in the order it said them) against the workers' `grants`:
///
/// - **never back**: a leader's fence is never lower than one said before;
/// - **its own number**: a leader said with a term number has the number its worker logged for that fence;
/// - **none silently**: a term number said is the last one said, or the one after it once the misses said since are
///   added (a term that began and ended between two reads is counted); a count the store lost (`missed ?`) starts
///   the sum again;
/// - on the topologies that lose nothing (etcd, ZooKeeper, SQL), the workers' term numbers are unique and grow with
///   their fences.
pub fn observer(log: &str, grants: &[Grant], topology: Topology) -> ObserverReport {
    let mut report = ObserverReport::default();
    let by_fence: std::collections::HashMap<u64, &Grant> =
        grants.iter().map(|g| (g.fence, g)).collect();
    let mut last_fence = 0;
    // The highest term number accounted for (said, or counted as missed).
    let mut accounted: Option<u64> = None;
    for line in log.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["observed", t, "leader", fence, number] => {
                let Ok(fence) = fence.parse::<u64>() else {
                    continue; // cut short by the SIGKILL at the end
                };
                if fence < last_fence {
                    report
                        .violations
                        .push(format!("observer at {t}: fence {fence} after {last_fence}"));
                }
                last_fence = last_fence.max(fence);
                let Ok(number) = number.parse::<u64>() else {
                    continue; // a holder that is no counted campaign
                };
                report.said += 1;
                if let Some(logged) = by_fence.get(&fence).and_then(|g| g.term) {
                    if logged != number {
                        report.violations.push(format!(
                            "observer at {t}: term {number} for fence {fence}, whose worker logged term {logged}"
                        ));
                    }
                }
                if let Some(accounted) = accounted {
                    if number != accounted && number != accounted + 1 {
                        report.violations.push(format!(
                            "observer at {t}: term {number} after {accounted} accounted for: {} passed silently",
                            i128::from(number) - i128::from(accounted) - 1
                        ));
                    }
                }
                accounted = Some(number);
            }
            ["observed", _, "missed", "?"] => {
                report.count_lost += 1;
                accounted = None;
            }
            ["observed", _, "missed", n] => {
                let n: u64 = n.parse().unwrap_or(0);
                report.missed += n;
                accounted = accounted.map(|a| a + n);
            }
            _ => {}
        }
    }
    let lossless = !matches!(topology, Topology::Single | Topology::Cluster);
    if lossless {
        let mut terms: Vec<(u64, u64)> = grants
            .iter()
            .filter_map(|g| Some((g.fence, g.term?)))
            .collect();
        terms.sort_unstable();
        for pair in terms.windows(2) {
            let [(f1, t1), (f2, t2)] = pair else { continue };
            if t2 <= t1 {
                report.violations.push(format!(
                    "term {t2} (fence {f2}) after term {t1} (fence {f1}): a term number repeated or went back"
                ));
            }
        }
    }
    report
}

/// What a lock admits at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// One grant (the mutex, the fair mutex).
    Exclusive,
    /// N grants of one permit each (the semaphore).
    Permits(usize),
    /// Reads together, a write alone.
    ReadWrite,
}

impl Rule {
    /// The rule of a worker's lock kind (`mutex`, `fair`, `semaphore:N`, `rw`).
    pub fn of(kind: &str) -> Rule {
        match kind {
            "rw" => Rule::ReadWrite,
            _ => kind
                .strip_prefix("semaphore:")
                .and_then(|n| n.parse().ok())
                .map_or(Rule::Exclusive, Rule::Permits),
        }
    }

    /// Whether `b` may not be held while every grant of `others` is.
    fn conflicts(self, others: &[&Grant], b: &Grant) -> bool {
        match self {
            Rule::Exclusive => !others.is_empty(),
            Rule::Permits(n) => others.len() >= n,
            Rule::ReadWrite => {
                !others.is_empty() && (b.mode == 'w' || others.iter().any(|g| g.mode == 'w'))
            }
        }
    }

    /// Whether `b`, held after `a` ended, can only have been granted after `a` (so with a higher fence).
    fn ordered(self, a: &Grant, b: &Grant) -> bool {
        match self {
            Rule::Exclusive => true,
            Rule::Permits(n) => n == 1,
            Rule::ReadWrite => a.mode == 'w' || b.mode == 'w',
        }
    }
}

/// Checks `grants` against the fault `windows`, for workers holding leases of `ttl` on a lock that admits `rule` on
/// `topology`, a free lock taking at most the topology's [`stall_bound`] to be taken again in calm times.
pub fn check(
    grants: &[Grant],
    windows: &[Window],
    ttl: Duration,
    rule: Rule,
    topology: Topology,
) -> Report {
    let stall_bound = u64::try_from(stall_bound(topology).as_nanos()).unwrap_or(u64::MAX);
    let mut report = Report::default();
    let mut held: Vec<&Grant> = grants.iter().filter(|g| g.held().is_some()).collect();
    held.sort_by_key(|g| g.first_held);
    let lease = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
    // Data loss explains a second owner from `later` on if it may have erased `earlier`, after `earlier` began and at
    // most a lease before `later`. `earlier` began on the server when its request ran, at some time after its worker
    // began to wait (its `want`): a loss that ended before the worker's first `held` sample may still have erased it
    // (the grant ran just before a `FLUSHALL`, its reply came after), so the wait's start bounds it, not that sample.
    let loses_between = |earlier: &Grant, later: u64| {
        let since = earlier.wanted.or(earlier.first_held).unwrap_or_default();
        windows.iter().any(|w| {
            w.may_erase(earlier) && w.end >= since && w.start <= later && later <= w.end + lease
        })
    };

    for (i, b) in held.iter().enumerate() {
        let (b_first, _) = b.held().unwrap_or_default();
        let active: Vec<&Grant> = held[..i]
            .iter()
            .copied()
            .filter(|a| a.held().is_some_and(|(_, a_last)| a_last >= b_first))
            .collect();
        if !rule.conflicts(&active, b) {
            continue;
        }
        let what = format!(
            "fence {} (worker {}) held from {b_first} while {} held",
            b.fence,
            b.worker,
            active
                .iter()
                .map(|a| format!(
                    "fence {} (worker {}) until {}",
                    a.fence,
                    a.worker,
                    a.last_held.unwrap_or_default()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        // Grants that data loss may have erased on the server (it happened after they began, within a lease of `b`)
        // do not count against `b`: the conflict is excused when it goes away without them.
        let unexplained: Vec<&Grant> = active
            .iter()
            .copied()
            .filter(|a| !loses_between(a, b_first))
            .collect();
        if rule.conflicts(&unexplained, b) {
            report.overlaps.push(what);
        } else {
            report.excused_overlaps.push(what);
        }
    }

    for b in &held {
        let (b_first, _) = b.held().unwrap_or_default();
        for a in &held {
            let (_, a_last) = a.held().unwrap_or_default();
            if a_last < b_first && rule.ordered(a, b) && b.fence <= a.fence {
                report.fence_regressions.push(format!(
                    "fence {} (worker {}, held from {b_first}) after fence {} (worker {}, held until {a_last})",
                    b.fence, b.worker, a.fence, a.worker
                ));
            }
        }
    }

    for b in &held {
        let (b_first, _) = b.held().unwrap_or_default();
        // Everything its holder still took as held when `b` began (told of its loss only later, or still sampling).
        let told_late = |a: &Grant| a.loss().is_some_and(|lost| lost > b_first + LATE_SLACK);
        // A late loss is excused when the worker was stopped (nothing can tell a paused process), or data loss may
        // have erased its grant: either way its lease no longer held the lock on the server.
        let excused = |a: &Grant| {
            let lost_at = a.loss().unwrap_or_default();
            let stopped = windows.iter().any(|w| {
                matches!(w.fault, Fault::Stop | Fault::Kill)
                    && w.worker == Some(a.worker)
                    && w.overlaps(b_first, lost_at)
            });
            stopped || loses_between(a, b_first)
        };
        // What `b` shares the lock with: every grant whose worker still samples it as held, and every grant told of
        // its loss only later whose lateness is not excused. An excused one occupied nothing on the server, so it
        // must not count towards the permits `b` could be granted beside (a stopped worker's lapsed permit used to
        // make the next holders look like one too many, and the innocent late one be blamed). Nor does a grant that
        // data loss may have erased before `b` began, even while its worker still samples it as held: a permit erased
        // by a `FLUSHALL` made a holder granted after it look like one too many, and the innocent one was blamed.
        let others: Vec<&Grant> = held
            .iter()
            .copied()
            .filter(|a| {
                let (a_first, a_last) = a.held().unwrap_or_default();
                a.fence != b.fence
                    && a_first < b_first
                    && !loses_between(a, b_first)
                    && (a_last >= b_first || (told_late(a) && !excused(a)))
            })
            .collect();
        if !rule.conflicts(&others, b) {
            continue;
        }
        for a in others.iter().filter(|a| told_late(a)) {
            let lost_at = a.loss().unwrap_or_default();
            if !excused(a) {
                report.late_losses.push(format!(
                    "fence {} (worker {}) was told of its loss at {lost_at}, after fence {} held from {b_first}",
                    a.fence, a.worker, b.fence
                ));
            }
        }
    }

    let mut free_since: Option<u64> = None;
    for g in &held {
        let (first, last) = g.held().unwrap_or_default();
        if let Some(since) = free_since {
            // A fault in force during the gap, or ended less than `recovery` before it, explains it.
            let quiet = !windows
                .iter()
                .any(|w| w.start <= first && since <= w.end + recovery(w.fault, ttl, topology));
            if first > since + stall_bound && quiet {
                report.stalls.push(format!(
                    "free from {since} until fence {} was held at {first} ({} ms) with no fault in force",
                    g.fence,
                    (first - since) / 1_000_000
                ));
            }
        }
        free_since = Some(free_since.map_or(last, |s| s.max(last)));
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn grant(worker: usize, fence: u64, first: u64, last: u64) -> Grant {
        Grant {
            worker,
            fence,
            granted: first * MS,
            first_held: Some(first * MS),
            last_held: Some(last * MS),
            ..Grant::default()
        }
    }

    fn window(fault: Fault, worker: Option<usize>, start: u64, end: u64) -> Window {
        Window {
            fault,
            worker,
            node: None,
            erased: Vec::new(),
            start: start * MS,
            end: end * MS,
        }
    }

    const TTL: Duration = Duration::from_millis(500);

    /// The checker on one server.
    fn check(grants: &[Grant], windows: &[Window], ttl: Duration, rule: Rule) -> Report {
        super::check(grants, windows, ttl, rule, Topology::Single)
    }

    #[test]
    fn a_clean_history_passes() {
        let grants = [
            grant(0, 10, 0, 100),
            grant(1, 20, 101, 200),
            grant(0, 30, 203, 300),
        ];
        assert_eq!(check(&grants, &[], TTL, Rule::Exclusive).violations(), 0);
    }

    #[test]
    fn intersecting_held_intervals_are_an_overlap() {
        let grants = [grant(0, 10, 0, 100), grant(1, 20, 99, 200)];
        let report = check(&grants, &[], TTL, Rule::Exclusive);
        assert_eq!(report.overlaps.len(), 1, "{report:?}");
    }

    #[test]
    fn an_overlap_across_a_restart_is_excused_but_not_across_a_pause() {
        let grants = [grant(0, 10, 0, 100), grant(1, 20, 50, 200)];
        let restart = [window(Fault::Restart, None, 40, 45)];
        let report = check(&grants, &restart, TTL, Rule::Exclusive);
        assert_eq!(
            (report.overlaps.len(), report.excused_overlaps.len()),
            (0, 1)
        );
        // Data loss long before the second owner started does not explain it.
        let long = [grant(0, 10, 0, 1_000), grant(1, 20, 990, 1_200)];
        assert_eq!(
            check(&long, &restart, TTL, Rule::Exclusive).overlaps.len(),
            1
        );
        let pause = [window(Fault::Pause, None, 40, 45)];
        assert_eq!(
            check(&grants, &pause, TTL, Rule::Exclusive).overlaps.len(),
            1
        );
    }

    #[test]
    fn an_overlap_across_the_loss_of_a_primary_is_excused_but_not_across_a_failover_or_migration() {
        // Killed at 40, the replica elected at 3 000: the grant of 0 may not have reached it.
        let lost = [window(Fault::PrimaryLost, None, 40, 3_000)];
        let grants = [grant(0, 10, 0, 3_100), grant(1, 20, 3_050, 3_200)];
        let report = check(&grants, &lost, TTL, Rule::Exclusive);
        assert_eq!(
            (report.overlaps.len(), report.excused_overlaps.len()),
            (0, 1)
        );
        // Not a second owner more than a lease after the election.
        let later = [grant(0, 10, 0, 4_000), grant(1, 20, 3_900, 4_100)];
        assert_eq!(check(&later, &lost, TTL, Rule::Exclusive).overlaps.len(), 1);
        let overlapping = [grant(0, 10, 0, 100), grant(1, 20, 50, 200)];
        for fault in [Fault::Failover, Fault::Migrate, Fault::Rejoin] {
            let window = [window(fault, None, 40, 45)];
            assert_eq!(
                check(&overlapping, &window, TTL, Rule::Exclusive)
                    .overlaps
                    .len(),
                1,
                "{fault:?} loses nothing"
            );
        }
    }

    #[test]
    fn an_election_explains_a_gap_and_its_allowance_ends() {
        let lost = [window(Fault::PrimaryLost, None, 90, 4_000)];
        let after = |first| [grant(0, 10, 0, 100), grant(1, 20, first, first + 100)];
        assert_eq!(
            check(&after(4_500), &lost, TTL, Rule::Exclusive)
                .stalls
                .len(),
            0
        );
        let allowance = recovery(Fault::PrimaryLost, TTL, Topology::Cluster) / MS;
        assert_eq!(
            check(&after(4_000 + allowance + 300), &lost, TTL, Rule::Exclusive)
                .stalls
                .len(),
            0,
            "the gap began while the fault was in force"
        );
        let late = [
            grant(0, 10, 0, 100),
            grant(1, 20, 4_000 + allowance + 100, 4_000 + allowance + 200),
            grant(2, 30, 4_000 + allowance + 500, 4_000 + allowance + 600),
        ];
        assert_eq!(
            check(&late, &lost, TTL, Rule::Exclusive).stalls.len(),
            1,
            "a gap past the allowance is a stall"
        );
    }

    #[test]
    fn a_lower_fence_later_is_a_regression_even_across_a_restart() {
        let grants = [grant(0, 30, 0, 100), grant(1, 20, 101, 200)];
        let restart = [window(Fault::Restart, None, 100, 100)];
        assert_eq!(
            check(&grants, &restart, TTL, Rule::Exclusive)
                .fence_regressions
                .len(),
            1
        );
    }

    #[test]
    fn a_loss_signalled_after_the_next_holder_started_is_late() {
        let mut a = grant(0, 10, 0, 100);
        a.lost = Some((400 * MS, "Expired".into()));
        let grants = [a.clone(), grant(1, 20, 150, 200)];
        assert_eq!(
            check(&grants, &[], TTL, Rule::Exclusive).late_losses.len(),
            1
        );
        // Not when the late worker was stopped meanwhile, nor for a release.
        let stop = [window(Fault::Stop, Some(0), 120, 390)];
        assert_eq!(
            check(&grants, &stop, TTL, Rule::Exclusive)
                .late_losses
                .len(),
            0
        );
        a.lost = Some((400 * MS, "Released".into()));
        assert_eq!(
            check(&[a, grant(1, 20, 150, 200)], &[], TTL, Rule::Exclusive)
                .late_losses
                .len(),
            0
        );
    }

    #[test]
    fn a_stopped_workers_lapsed_permit_does_not_make_the_others_late() {
        // Three permits. Worker 3 is stopped past its lease (its permit lapses on the server); worker 0 holds one,
        // worker 1 another, and worker 2 takes the third at 150; worker 0 is told of a loss (data loss elsewhere, or
        // its own lease) at 400, after 2 began: that is late only if 2 took a fourth permit, and it did not.
        let mut stale = grant(3, 5, 0, 50);
        stale.lost = Some((390 * MS, "Expired".into()));
        let mut w0 = grant(0, 10, 20, 140);
        w0.lost = Some((400 * MS, "Gone".into()));
        let grants = [stale, w0, grant(1, 15, 30, 300), grant(2, 20, 150, 300)];
        let stop = [window(Fault::Stop, Some(3), 60, 380)];
        assert_eq!(
            check(&grants, &stop, TTL, Rule::Permits(3))
                .late_losses
                .len(),
            0
        );
        // Without the stop, worker 3's permit counted until it was told: then worker 0 and 3 are both late.
        assert_eq!(
            check(&grants, &[], TTL, Rule::Permits(3)).late_losses.len(),
            2
        );
    }

    #[test]
    fn a_permit_erased_by_data_loss_does_not_make_a_later_holder_late() {
        // Two permits. Worker 3's permit (from 0) is erased by a restart at 50; its worker samples it as held until
        // 250 and is told at 260. Worker 4 waits from 58 and is granted at 60, after the loss, and worker 2 at 100:
        // two permits on the server. Worker 4 is told of a later loss at 500: not late, since nothing took a third
        // permit beside it (seen in `scripts/torture.sh 30 20261203 semaphore:2 single`, 2 runs of 4).
        let mut erased = grant(3, 5, 0, 250);
        erased.lost = Some((260 * MS, "Gone".into()));
        let mut after = grant(4, 10, 60, 300);
        after.wanted = Some(58 * MS);
        after.lost = Some((500 * MS, "Gone".into()));
        let grants = [erased, after, grant(2, 20, 100, 300)];
        let restart = [window(Fault::Restart, None, 50, 55)];
        let report = check(&grants, &restart, TTL, Rule::Permits(2));
        assert_eq!(report.late_losses.len(), 0, "{:?}", report.late_losses);
        assert_eq!(report.overlaps.len(), 0, "{:?}", report.overlaps);
        // Without the restart, worker 2 took a third permit: worker 3 and worker 4 were told too late.
        assert_eq!(
            check(&grants, &[], TTL, Rule::Permits(2)).late_losses.len(),
            2
        );
    }

    #[test]
    fn a_long_free_gap_without_faults_is_a_stall() {
        let grants = [grant(0, 10, 0, 100), grant(1, 20, 100 + 300, 700)];
        assert_eq!(check(&grants, &[], TTL, Rule::Exclusive).stalls.len(), 1);
        let kill = [window(Fault::Kill, Some(0), 90, 120)];
        assert_eq!(
            check(&grants, &kill, TTL, Rule::Exclusive).stalls.len(),
            0,
            "a gap right after a fault is excused"
        );
    }

    #[test]
    fn data_loss_between_a_grant_and_its_first_held_sample_excuses_the_next_owner() {
        // `a`'s worker began to wait at 10; its grant ran on the server, then a FLUSHALL at 50-51 erased it, and its
        // reply (so its first `held` sample) came at 60. `b` took the free lock at 70.
        let mut a = grant(0, 10, 60, 300);
        a.wanted = Some(10 * MS);
        let grants = [a.clone(), grant(1, 20, 70, 200)];
        let flush = [window(Fault::Flushall, None, 50, 51)];
        let report = check(&grants, &flush, TTL, Rule::Exclusive);
        assert_eq!(
            (report.overlaps.len(), report.excused_overlaps.len()),
            (0, 1)
        );
        // A loss that ended before the worker even began to wait cannot have erased its grant.
        a.wanted = Some(55 * MS);
        let grants = [a, grant(1, 20, 70, 200)];
        assert_eq!(
            check(&grants, &flush, TTL, Rule::Exclusive).overlaps.len(),
            1
        );
    }

    #[test]
    fn on_a_quorum_data_loss_on_one_node_excuses_only_the_grant_whose_token_it_erased() {
        let mut a = grant(0, 10, 0, 300);
        a.token = "dl1:a".into();
        let grants = [a, grant(1, 20, 100, 200)];
        let flush = |erased: Option<&str>| Window {
            node: Some(2),
            erased: erased.map(str::to_owned).into_iter().collect(),
            ..window(Fault::Flushall, None, 50, 50)
        };
        let report = check(&grants, &[flush(Some("dl1:a"))], TTL, Rule::Exclusive);
        assert_eq!(
            (report.overlaps.len(), report.excused_overlaps.len()),
            (0, 1)
        );
        for other in [flush(Some("dl1:b")), flush(None)] {
            assert_eq!(
                check(&grants, &[other], TTL, Rule::Exclusive)
                    .overlaps
                    .len(),
                1,
                "the node did not hold the earlier grant: it still has its majority"
            );
        }
        // A restart after longer than the lease loses nothing that counts.
        let restart = Window {
            node: Some(2),
            ..window(Fault::NodeRestart, None, 20, 60)
        };
        assert_eq!(
            check(&grants, &[restart], TTL, Rule::Exclusive)
                .overlaps
                .len(),
            1
        );
    }

    #[test]
    fn a_quorum_waiter_is_held_to_its_polling_promise() {
        let bound = stall_bound(Topology::Quorum);
        assert_eq!(bound, Duration::from_millis(1_950));
        let after = |gap: u64| [grant(0, 10, 0, 100), grant(1, 20, 100 + gap, 200 + gap)];
        let stalls = |gap, topology| {
            super::check(&after(gap), &[], TTL, Rule::Exclusive, topology)
                .stalls
                .len()
        };
        assert_eq!(stalls(1_500, Topology::Quorum), 0);
        assert_eq!(
            stalls(1_500, Topology::Single),
            1,
            "a hand-off on one server is woken, not polled"
        );
        assert_eq!(stalls(2_100, Topology::Quorum), 1);
    }

    #[test]
    fn on_etcd_no_fault_excuses_an_overlap_or_a_late_loss() {
        let mut a = grant(0, 10, 0, 100);
        a.lost = Some((400 * MS, "Expired".into()));
        let grants = [a, grant(1, 20, 50, 200)];
        let faults = [
            Fault::MemberRestart { leader: true },
            Fault::MemberStop { leader: true },
            Fault::Compact,
            Fault::Reset,
            Fault::Blackhole,
        ];
        for fault in faults {
            let windows = [Window {
                node: Some(0),
                ..window(fault, None, 40, 45)
            }];
            let report = super::check(
                &grants,
                &windows,
                crate::ETCD_TTL,
                Rule::Exclusive,
                Topology::Etcd3,
            );
            assert_eq!(
                (
                    report.overlaps.len(),
                    report.excused_overlaps.len(),
                    report.late_losses.len()
                ),
                (1, 0, 1),
                "{fault:?} loses nothing on etcd"
            );
        }
    }

    #[test]
    fn on_etcd_a_fault_explains_a_gap_until_a_lease_and_a_recheck_ran_out() {
        let allowance = recovery(
            Fault::MemberRestart { leader: true },
            crate::ETCD_TTL,
            Topology::Etcd,
        );
        assert_eq!(allowance / MS, 6_000);
        assert!(
            u128::from(allowance) < CALM.as_nanos(),
            "a calm spell outlasts the allowance, so that the tight bound applies in it"
        );
        // A restart until 1 000: a gap that begins within the allowance is explained however long; a gap of 300 ms
        // that begins after it is a stall.
        let restart = [window(
            Fault::MemberRestart { leader: true },
            None,
            90,
            1_000,
        )];
        let grants = [
            grant(0, 10, 0, 100),
            grant(1, 20, 6_900, 7_200),
            grant(2, 30, 7_500, 7_600),
        ];
        let report = super::check(
            &grants,
            &restart,
            crate::ETCD_TTL,
            Rule::Exclusive,
            Topology::Etcd,
        );
        assert_eq!(report.stalls.len(), 1, "{report:?}");
        assert!(report.stalls[0].contains("fence 30"), "{report:?}");
    }

    #[test]
    fn on_zookeeper_no_fault_excuses_an_overlap_or_a_late_loss() {
        let mut a = grant(0, 10, 0, 100);
        a.lost = Some((400 * MS, "Expired".into()));
        let grants = [a, grant(1, 20, 50, 200)];
        let faults = [
            Fault::MemberRestart { leader: true },
            Fault::MemberStop { leader: true },
            Fault::SessionExpiry,
            Fault::Reset,
            Fault::Blackhole,
        ];
        for topology in [Topology::Zk, Topology::Zk3] {
            for fault in faults {
                let windows = [Window {
                    node: Some(0),
                    ..window(fault, None, 40, 45)
                }];
                let report =
                    super::check(&grants, &windows, crate::ZK_TTL, Rule::Exclusive, topology);
                assert_eq!(
                    (
                        report.overlaps.len(),
                        report.excused_overlaps.len(),
                        report.late_losses.len()
                    ),
                    (1, 0, 1),
                    "{fault:?} loses nothing on {topology}"
                );
            }
        }
    }

    #[test]
    fn on_zookeeper_a_fault_explains_a_gap_until_a_session_expired_and_a_waiter_queued_again() {
        let allowance = recovery(
            Fault::MemberStop { leader: true },
            crate::ZK_TTL,
            Topology::Zk3,
        );
        assert_eq!(allowance / MS, 5_500);
        assert!(
            u128::from(allowance) < CALM.as_nanos(),
            "a calm spell outlasts the allowance, so that the tight bound applies in it"
        );
        assert_eq!(stall_bound(Topology::Zk3), STALL_BOUND);
        // A stop of the leader until 3 000: a gap that begins within the allowance is explained however long; a gap
        // of 300 ms that begins after it is a stall.
        let stop = [window(Fault::MemberStop { leader: true }, None, 90, 3_000)];
        let grants = [
            grant(0, 10, 0, 100),
            grant(1, 20, 8_400, 8_700),
            grant(2, 30, 9_000, 9_100),
        ];
        let report = super::check(
            &grants,
            &stop,
            crate::ZK_TTL,
            Rule::Exclusive,
            Topology::Zk3,
        );
        assert_eq!(report.stalls.len(), 1, "{report:?}");
        assert!(report.stalls[0].contains("fence 30"), "{report:?}");
    }

    #[test]
    fn on_sql_no_fault_excuses_an_overlap_or_a_late_loss() {
        let mut a = grant(0, 10, 0, 100);
        a.lost = Some((400 * MS, "Expired".into()));
        let grants = [a, grant(1, 20, 50, 200)];
        let faults = [
            Fault::MemberRestart { leader: true },
            Fault::MemberStop { leader: true },
            Fault::SessionExpiry,
            Fault::ConnectionsKilled,
            Fault::Reset,
            Fault::Blackhole,
            Fault::Delay,
        ];
        for topology in [Topology::Pg, Topology::Mysql] {
            for fault in faults {
                let windows = [Window {
                    node: Some(0),
                    ..window(fault, Some(0), 40, 45)
                }];
                let report =
                    super::check(&grants, &windows, crate::SQL_TTL, Rule::Exclusive, topology);
                assert_eq!(
                    (
                        report.overlaps.len(),
                        report.excused_overlaps.len(),
                        report.late_losses.len()
                    ),
                    (1, 0, 1),
                    "{fault:?} loses nothing on {topology}"
                );
            }
        }
    }

    #[test]
    fn on_sql_a_fault_explains_a_gap_until_a_session_row_expired_and_a_waiter_checked_again() {
        let allowance = recovery(
            Fault::MemberStop { leader: true },
            crate::SQL_TTL,
            Topology::Pg,
        );
        assert_eq!(allowance / MS, 4_666);
        assert_eq!(
            allowance,
            recovery(Fault::ConnectionsKilled, crate::SQL_TTL, Topology::Mysql)
        );
        assert!(
            u128::from(allowance) < CALM.as_nanos(),
            "a calm spell outlasts the allowance, so that the tight bound applies in it"
        );
        // A stop of the server until 3 000: a gap that begins within the allowance is explained however long; a gap
        // of 400 ms that begins after it is a stall, on both stores.
        let stop = [window(Fault::MemberStop { leader: true }, None, 90, 3_000)];
        let grants = [
            grant(0, 10, 0, 100),
            grant(1, 20, 7_500, 7_800),
            grant(2, 30, 8_200, 8_300),
        ];
        for topology in [Topology::Pg, Topology::Mysql] {
            let report = super::check(&grants, &stop, crate::SQL_TTL, Rule::Exclusive, topology);
            assert_eq!(report.stalls.len(), 1, "{topology}: {report:?}");
            assert!(report.stalls[0].contains("fence 30"), "{report:?}");
        }
    }

    #[test]
    fn a_mysql_waiter_is_held_to_its_polling_promise() {
        assert_eq!(stall_bound(Topology::Pg), STALL_BOUND);
        assert_eq!(stall_bound(Topology::Mysql), Duration::from_millis(300));
        let after = |gap: u64| [grant(0, 10, 0, 100), grant(1, 20, 100 + gap, 200 + gap)];
        let stalls = |gap, topology| {
            super::check(&after(gap), &[], crate::SQL_TTL, Rule::Exclusive, topology)
                .stalls
                .len()
        };
        assert_eq!(stalls(250, Topology::Mysql), 0);
        assert_eq!(
            stalls(250, Topology::Pg),
            1,
            "a hand-off on PostgreSQL is notified, not polled"
        );
        assert_eq!(stalls(350, Topology::Mysql), 1);
    }

    fn with_mode(mut g: Grant, mode: char) -> Grant {
        g.mode = mode;
        g
    }

    #[test]
    fn data_loss_excuses_only_the_grants_it_may_have_erased() {
        // Two permits: a grant from before a restart, one after it, and a third after it: only the first may have
        // been erased, so the third conflicts with nothing that the server still had.
        let grants = [
            grant(0, 10, 0, 300),
            grant(1, 20, 100, 300),
            grant(2, 30, 110, 300),
        ];
        let restart = [window(Fault::Restart, None, 50, 60)];
        let report = check(&grants, &restart, TTL, Rule::Permits(2));
        assert_eq!(
            (report.overlaps.len(), report.excused_overlaps.len()),
            (0, 1)
        );
        // Without the restart it is an overlap.
        assert_eq!(check(&grants, &[], TTL, Rule::Permits(2)).overlaps.len(), 1);
    }

    #[test]
    fn a_semaphore_admits_its_permits_and_no_more() {
        let two = [grant(0, 10, 0, 100), grant(1, 20, 50, 200)];
        assert_eq!(check(&two, &[], TTL, Rule::Permits(2)).violations(), 0);
        let three = [
            grant(0, 10, 0, 100),
            grant(1, 20, 50, 200),
            grant(2, 30, 60, 70),
        ];
        assert_eq!(check(&three, &[], TTL, Rule::Permits(2)).overlaps.len(), 1);
        // Permits are not ordered among themselves: a lower fence held later is no regression.
        let unordered = [grant(0, 20, 0, 10), grant(1, 10, 20, 30)];
        assert_eq!(
            check(&unordered, &[], TTL, Rule::Permits(2)).violations(),
            0
        );
    }

    #[test]
    fn reads_share_and_a_write_conflicts_with_everything() {
        let reads = [
            with_mode(grant(0, 10, 0, 100), 'r'),
            with_mode(grant(1, 20, 50, 200), 'r'),
        ];
        assert_eq!(check(&reads, &[], TTL, Rule::ReadWrite).violations(), 0);
        let write_in_reads = [
            with_mode(grant(0, 10, 0, 100), 'r'),
            with_mode(grant(1, 20, 50, 200), 'w'),
        ];
        assert_eq!(
            check(&write_in_reads, &[], TTL, Rule::ReadWrite)
                .overlaps
                .len(),
            1
        );
        let after_write = [
            with_mode(grant(0, 20, 0, 10), 'w'),
            with_mode(grant(1, 10, 20, 30), 'r'),
        ];
        assert_eq!(
            check(&after_write, &[], TTL, Rule::ReadWrite)
                .fence_regressions
                .len(),
            1
        );
    }
}

#[cfg(test)]
mod observer_tests {
    use super::*;

    fn term(fence: u64, number: u64) -> Grant {
        Grant {
            fence,
            term: Some(number),
            ..Grant::default()
        }
    }

    #[test]
    fn an_observer_that_keeps_its_promises_passes() {
        let grants = [term(10, 1), term(20, 2), term(30, 3), term(40, 4)];
        let log = "observed 1 vacant\nobserved 2 leader 10 1\nobserved 3 missed 2\nobserved 4 leader 40 4\n\
                   observed 5 leader 40 4\nobserved 6 vacant\n";
        let report = observer(log, &grants, Topology::Etcd);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!((report.said, report.missed), (3, 2));
    }

    #[test]
    fn each_broken_promise_is_a_violation() {
        let grants = [term(10, 1), term(20, 2), term(30, 3)];
        // A term passed silently: 1, then 3 with nothing missed between.
        let silent = observer(
            "observed 1 leader 10 1\nobserved 2 leader 30 3\n",
            &grants,
            Topology::Etcd,
        );
        assert_eq!(silent.violations.len(), 1, "{:?}", silent.violations);
        // A fence went back.
        let back = observer(
            "observed 1 leader 20 2\nobserved 2 leader 10 2\n",
            &grants,
            Topology::Etcd,
        );
        assert!(
            back.violations.iter().any(|v| v.contains("after 20")),
            "{:?}",
            back.violations
        );
        // A number that is not the worker's.
        let wrong = observer("observed 1 leader 20 7\n", &grants, Topology::Etcd);
        assert_eq!(wrong.violations.len(), 1, "{:?}", wrong.violations);
        // A lost count starts the sum again.
        let lost = observer(
            "observed 1 leader 10 1\nobserved 2 missed ?\nobserved 3 leader 30 3\n",
            &grants,
            Topology::Single,
        );
        assert_eq!((lost.violations.len(), lost.count_lost), (0, 1));
        // A repeated number where nothing is lost.
        let repeated = observer("", &[term(10, 1), term(20, 1)], Topology::Pg);
        assert_eq!(repeated.violations.len(), 1, "{:?}", repeated.violations);
        assert!(observer("", &[term(10, 1), term(20, 1)], Topology::Single)
            .violations
            .is_empty());
    }
}
