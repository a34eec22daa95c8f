//! Independent server nodes for a [`leasehold::Quorum`], with the Redlock restart rule enforced.
//!
//! The rule: a node that lost its data (here: killed, restarted empty) must stay unavailable for longer than the
//! longest lease, so that no grant it forgot can still count toward a majority, and, for the fences, for longer than
//! [`leasehold::PROPOSAL_LEAD`] too, so that its counter, floored at its clock, comes back above every fence granted
//! before it went down. [`QuorumNodes::restart`] waits out whatever is left of that downtime before it brings the
//! node back; a test cannot break the rule by accident.

use std::time::{Duration, Instant};

use crate::RedisServer;

/// How long a node that lost its data must stay down, for leases up to `longest_lease`: see the module docs.
pub fn restart_downtime(longest_lease: Duration) -> Duration {
    longest_lease + leasehold::PROPOSAL_LEAD + Duration::from_millis(50)
}

/// `n` independent servers (each started as [`RedisServer::start`] does), killed on drop.
pub struct QuorumNodes {
    nodes: Vec<RedisServer>,
    longest_lease: Duration,
    killed_at: Vec<Option<Instant>>,
}

impl QuorumNodes {
    /// Starts `n` servers for locks whose leases are at most `longest_lease`.
    pub fn start(n: usize, longest_lease: Duration) -> QuorumNodes {
        QuorumNodes {
            nodes: (0..n).map(|_| RedisServer::start()).collect(),
            longest_lease,
            killed_at: vec![None; n],
        }
    }

    /// The nodes' URLs, in order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Kills node `i` (`SIGKILL`: its data is gone) and notes when.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
        self.killed_at[i].get_or_insert_with(Instant::now);
    }

    /// Brings node `i` back, empty, once it has been down for [`restart_downtime`] of the longest lease (it is
    /// killed now if it still runs); returns how long this call waited for the rule.
    pub async fn restart(&mut self, i: usize) -> Duration {
        self.kill(i);
        let killed = self.killed_at[i].take().unwrap_or_else(Instant::now);
        let up_at = killed + restart_downtime(self.longest_lease);
        let wait = up_at.saturating_duration_since(Instant::now());
        // The rule itself is a wait: nothing else tells a forgotten grant that it is over.
        tokio::time::sleep(wait).await;
        tokio::task::block_in_place(|| self.nodes[i].restart());
        wait
    }
}
