//! The bench on a quorum of independent servers (Redlock): the nodes, the bare-bones Redlock floor, and the raw round
//! trip to each node that the quorum's acquire latency is compared with.
//!
//! A round of either engine sends to every node at once, so its latency is bounded below by the round trip to the
//! slowest node of the fastest majority: the majority-th smallest of the nodes' round trips.

use std::time::Duration;

use anyhow::Context as _;
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use leasehold::redis;
use tokio::time::Instant;

use super::raw::{Conn, Raw};
use super::scenario::{floor_acquire, RAW_RELEASE};
use super::stats::Samples;

/// The independent servers of a quorum run, in the order they were given (the first runs the single-node
/// comparisons).
pub struct Nodes {
    pub urls: Vec<String>,
    raws: Vec<Raw>,
}

impl Nodes {
    /// The nodes at `urls` (`redis://` URLs of independent servers, at least [`leasehold::MIN_NODES`]).
    pub fn open(urls: &[String]) -> anyhow::Result<Nodes> {
        let mut raws = Vec::new();
        for url in urls {
            raws.push(Raw::open(url)?);
        }
        Ok(Nodes {
            urls: urls.to_vec(),
            raws,
        })
    }

    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// How many nodes make a majority (as [`leasehold::Quorum::majority`]).
    pub fn majority(&self) -> usize {
        self.len() / 2 + 1
    }

    /// Every node's raw client, for the readings of the servers.
    pub fn raws(&self) -> &[Raw] {
        &self.raws
    }

    /// The floor on the quorum: one `ConnectionManager` per node, as leasehold's quorum uses.
    pub async fn floor(&self) -> anyhow::Result<QuorumFloor> {
        let mut conns = Vec::new();
        for raw in &self.raws {
            conns.push(raw.manager().await?);
        }
        Ok(QuorumFloor {
            conns,
            majority: self.majority(),
            release: redis::Script::new(RAW_RELEASE),
        })
    }

    /// leasehold's quorum on the nodes, with the defaults (prefix, per-node timeout).
    pub async fn leasehold(&self) -> anyhow::Result<leasehold::Quorum> {
        Ok(leasehold::Quorum::connect(&self.urls).await?)
    }

    /// The p50 of one raw round trip (`PING` on a `ConnectionManager`) to each node, in node order, in µs; and of a
    /// `PING` to every node at once, until the majority-th reply and until the last. Each node alone and all at once
    /// take turns for `duration`, so that a slow moment of the machine falls on every figure.
    pub async fn round_trips(&self, duration: Duration) -> anyhow::Result<NodeRtts> {
        let mut conns = Vec::new();
        for raw in &self.raws {
            conns.push(raw.manager().await?);
        }
        let majority = self.majority();
        let mut alone = vec![Samples::default(); conns.len()];
        let (mut to_majority, mut to_all) = (Samples::default(), Samples::default());
        let end = Instant::now() + duration;
        while Instant::now() < end {
            for (conn, samples) in conns.iter_mut().zip(&mut alone) {
                let started = Instant::now();
                conn.ping("").await?;
                samples.push(started.elapsed());
            }
            let started = Instant::now();
            let mut pings: FuturesUnordered<_> = conns
                .iter()
                .map(|conn| {
                    let mut conn = conn.clone();
                    async move { conn.ping("").await }
                })
                .collect();
            let mut replies = 0;
            while let Some(reply) = pings.next().await {
                reply?;
                replies += 1;
                if replies == majority {
                    to_majority.push(started.elapsed());
                }
            }
            to_all.push(started.elapsed());
        }
        Ok(NodeRtts {
            p50_us: alone
                .into_iter()
                .map(|s| s.sorted().quantile_us(0.5))
                .collect(),
            majority,
            at_once_majority_us: to_majority.sorted().quantile_us(0.5),
            at_once_all_us: to_all.sorted().quantile_us(0.5),
        })
    }
}

/// The raw round trip to each node of a quorum, and the majority.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRtts {
    /// The p50 of a `PING` to each node, in µs, in node order.
    pub p50_us: Vec<f64>,
    pub majority: usize,
    /// The p50 of a `PING` to every node at once until the majority-th reply, in µs: what the machine makes of
    /// "in parallel" (on few cores, the nodes and the client take turns).
    pub at_once_majority_us: f64,
    /// The same until the last reply.
    pub at_once_all_us: f64,
}

impl NodeRtts {
    /// The round trip to the slowest node of the fastest majority: the majority-th smallest node round trip, in µs.
    pub fn majority_us(&self) -> f64 {
        let mut sorted = self.p50_us.clone();
        sorted.sort_by(f64::total_cmp);
        sorted
            .get(self.majority.saturating_sub(1))
            .copied()
            .unwrap_or(f64::NAN)
    }
}

/// A bare-bones Redlock: `SET key token NX PX 30000` sent to every node at once, granted as soon as a majority
/// answered OK; released with the owner-checked delete on every node. No validity, no fence, no undo of a failed
/// round: what the cheapest quorum lock costs.
pub struct QuorumFloor {
    conns: Vec<Conn>,
    majority: usize,
    release: redis::Script,
}

impl QuorumFloor {
    /// Whether a majority granted `key` to `token`. The requests still out when the majority is reached are not
    /// waited for: each node runs one connection's commands in order, so the release reaches it after them.
    pub async fn acquire(&self, key: &str, token: &str) -> anyhow::Result<bool> {
        let mut votes: FuturesUnordered<_> = self
            .conns
            .iter()
            .map(|conn| {
                let mut conn = conn.clone();
                async move { floor_acquire(&mut conn, key, token).await }
            })
            .collect();
        let mut granted = 0;
        let mut failure = None;
        while let Some(vote) = votes.next().await {
            match vote {
                Ok(true) => {
                    granted += 1;
                    if granted >= self.majority {
                        return Ok(true);
                    }
                }
                Ok(false) => {}
                Err(err) => failure = Some(err),
            }
        }
        match failure {
            Some(err) => Err(err).context("the floor's SET NX PX on a quorum node"),
            None => Ok(false),
        }
    }

    /// The owner-checked delete of `key` on every node at once.
    pub async fn release(&self, key: &str, token: &str) -> anyhow::Result<()> {
        let deletes = self.conns.iter().map(|conn| {
            let mut conn = conn.clone();
            let mut invocation = self.release.key(key);
            invocation.arg(token);
            async move { invocation.invoke_async::<i64>(&mut conn).await }
        });
        for deleted in futures_util::future::join_all(deletes).await {
            deleted.context("the floor's delete on a quorum node")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_majority_round_trip_is_the_slowest_of_the_fastest_majority() {
        let rtts = NodeRtts {
            p50_us: vec![90.0, 60.0, 400.0, 70.0, 65.0],
            majority: 3,
            at_once_majority_us: 100.0,
            at_once_all_us: 500.0,
        };
        assert_eq!(rtts.majority_us(), 70.0);
        let three = NodeRtts {
            p50_us: vec![80.0, 50.0, 60.0],
            majority: 2,
            at_once_majority_us: 70.0,
            at_once_all_us: 90.0,
        };
        assert_eq!(three.majority_us(), 60.0);
    }
}
