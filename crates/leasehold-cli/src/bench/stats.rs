//! Latency samples, percentiles, and one scenario's result (docs/BENCHMARKS.md says what `--json` prints).

use std::time::Duration;

use serde_json::{json, Value};

use super::quorum::NodeRtts;
use super::raw::Spread;
use crate::stores::Store;

/// Acquire latencies in nanoseconds, in arrival order until [`Samples::sorted`].
#[derive(Debug, Default, Clone)]
pub struct Samples(pub Vec<u64>);

impl Samples {
    pub fn push(&mut self, latency: Duration) {
        self.0
            .push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
    }

    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn sorted(mut self) -> Samples {
        self.0.sort_unstable();
        self
    }

    /// The `q` quantile (0..=1) of sorted samples, in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let last = self.0.len() - 1;
        let index = ((last as f64) * q).round() as usize;
        self.0[index.min(last)] as f64 / 1000.0
    }
}

/// Renewal figures of the `renew-10k` scenario.
#[derive(Debug, Clone)]
pub struct Renewal {
    pub locks: usize,
    pub all_held: bool,
    pub periods: u32,
    pub calls_per_period: f64,
    /// On a cluster: the requests (per-node pipelines and calls sent alone) that carried them, per period.
    pub requests_per_period: Option<f64>,
    pub cpu_seconds: f64,
    pub bytes_per_lock: f64,
}

/// Where a scenario of a quorum run ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnQuorum {
    /// The nodes of the quorum.
    pub nodes: usize,
    /// On every node (a quorum scenario; the server CPU is their sum), or on the first alone (a single-node
    /// comparison).
    pub all_nodes: bool,
}

/// One scenario's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub scenario: &'static str,
    pub processes: usize,
    pub tasks: usize,
    pub elapsed: Duration,
    pub acquisitions: u64,
    /// Sorted.
    pub samples: Samples,
    /// Acquisitions of each process, for the contended scenario.
    pub per_process: Vec<u64>,
    /// The matching floor's acquisitions per second, for leasehold scenarios.
    pub floor_rate: Option<f64>,
    /// The matching peer scenario's acquisitions per second (rslock's recipe), for leasehold scenarios.
    pub peer_rate: Option<f64>,
    /// The raw round trip's p50 in µs, for the hand-off scenario.
    pub rtt_p50_us: Option<f64>,
    pub renewal: Option<Renewal>,
    /// The server's CPU time (user + system) over the measured window, when it could be read; on a cluster, the
    /// sum over its primaries.
    pub server_cpu_s: Option<f64>,
    /// On a cluster, how many primaries `server_cpu_s` sums; on the other stores, how many servers, when more
    /// than one.
    pub cpu_primaries: Option<usize>,
    /// The client's CPU time (user + system) over the measured window: this process's, or the worker processes'
    /// together.
    pub client_cpu_s: Option<f64>,
    /// The p99 of write-lock acquisitions, for the read-write scenario.
    pub write_p99_us: Option<f64>,
    /// On a cluster, where the keys of an in-process scenario live.
    pub spread: Option<Spread>,
    /// In a quorum run: where the scenario ran.
    pub on_quorum: Option<OnQuorum>,
    /// For the uncontended scenarios of a quorum: the raw round trip to each node.
    pub node_rtts: Option<NodeRtts>,
    /// The store the scenario ran on.
    pub store: Store,
}

impl Outcome {
    /// An outcome made of `latencies_us` alone, every other measure absent (for tests of the output).
    #[cfg(test)]
    pub fn measured(scenario: &'static str, latencies_us: &[u64]) -> Outcome {
        let mut samples = Samples::default();
        for &us in latencies_us {
            samples.push(Duration::from_micros(us));
        }
        Outcome {
            scenario,
            processes: 1,
            tasks: 1,
            elapsed: Duration::from_secs(1),
            acquisitions: samples.len() as u64,
            samples: samples.sorted(),
            per_process: Vec::new(),
            floor_rate: None,
            peer_rate: None,
            rtt_p50_us: None,
            renewal: None,
            server_cpu_s: None,
            cpu_primaries: None,
            client_cpu_s: None,
            write_p99_us: None,
            spread: None,
            on_quorum: None,
            node_rtts: None,
            store: Store::Redis,
        }
    }

    pub fn rate(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn floor_ratio(&self) -> Option<f64> {
        self.floor_rate.map(|floor| self.rate() / floor.max(1e-9))
    }

    /// This scenario's rate over the matching peer scenario's (rslock's recipe in the same run).
    pub fn peer_ratio(&self) -> Option<f64> {
        self.peer_rate.map(|peer| self.rate() / peer.max(1e-9))
    }

    /// Smallest over largest per-process share.
    pub fn share_ratio(&self) -> Option<f64> {
        let min = *self.per_process.iter().min()?;
        let max = *self.per_process.iter().max()?;
        Some(if max == 0 {
            0.0
        } else {
            min as f64 / max as f64
        })
    }

    /// Server CPU per lock cycle (acquire + release) in µs; for `renew-10k`, per lease renewed.
    pub fn server_us_per_cycle(&self) -> Option<f64> {
        let cpu = self.server_cpu_s?;
        let cycles = match &self.renewal {
            Some(r) => (r.locks as f64) * f64::from(r.periods),
            None => self.acquisitions as f64,
        };
        (cycles > 0.0).then(|| cpu * 1e6 / cycles)
    }

    /// Client CPU per lock cycle (acquire + release; per hand-off for the hand-off scenarios) in µs.
    pub fn client_us_per_cycle(&self) -> Option<f64> {
        let cpu = self.client_cpu_s?;
        let cycles = self.acquisitions as f64;
        (cycles > 0.0).then(|| cpu * 1e6 / cycles)
    }

    pub fn handoff_to_rtt(&self) -> Option<f64> {
        self.rtt_p50_us
            .map(|rtt| self.samples.quantile_us(0.5) / rtt.max(1e-9))
    }

    /// The p50 over the round trip to the slowest node of the fastest majority.
    pub fn p50_to_majority_rtt(&self) -> Option<f64> {
        self.node_rtts
            .as_ref()
            .map(|rtts| self.samples.quantile_us(0.5) / rtts.majority_us().max(1e-9))
    }

    pub fn to_json(&self) -> Value {
        let round = |x: f64| (x * 100.0).round() / 100.0;
        let mut out = json!({
            "scenario": self.scenario,
            "processes": self.processes,
            "tasks": self.tasks,
            "duration_s": round(self.elapsed.as_secs_f64()),
            "acquisitions": self.acquisitions,
            "acquisitions_per_s": round(self.rate()),
            "latency_us": {
                "p50": round(self.samples.quantile_us(0.5)),
                "p99": round(self.samples.quantile_us(0.99)),
                "max": round(self.samples.quantile_us(1.0)),
            },
            "floor_ratio": self.floor_ratio().map(round),
            "peer_ratio": self.peer_ratio().map(round),
            "per_process": if self.per_process.is_empty() { Value::Null } else { json!(self.per_process) },
            "share_min_max": self.share_ratio().map(round),
            "rtt_p50_us": self.rtt_p50_us.map(round),
            "handoff_to_rtt": self.handoff_to_rtt().map(round),
            "server_cpu_s": self.server_cpu_s.map(round),
            "server_cpu_us_per_cycle": self.server_us_per_cycle().map(round),
            "client_cpu_s": self.client_cpu_s.map(round),
            "client_cpu_us_per_cycle": self.client_us_per_cycle().map(round),
            "write_p99_us": self.write_p99_us.map(round),
            "renew": self.renewal.as_ref().map(|r| json!({
                "locks": r.locks,
                "all_held": r.all_held,
                "periods": r.periods,
                "calls_per_period": round(r.calls_per_period),
                "client_cpu_s": round(r.cpu_seconds),
                "client_bytes_per_lock": round(r.bytes_per_lock),
            })),
        });
        // Cluster runs only: the one-server shape stays as documented.
        match self.cpu_primaries {
            Some(members) if self.store != Store::Redis => {
                out["server_cpu_members"] = json!(members)
            }
            Some(primaries) => out["server_cpu_primaries"] = json!(primaries),
            None => {}
        }
        // Runs on the other stores only (etcd, ZooKeeper, PostgreSQL, MySQL), likewise.
        if self.store != Store::Redis {
            out["store"] = json!(self.store.id());
        }
        if let Some(s) = self.spread {
            out["key_spread"] = json!({
                "keys": s.keys,
                "slots": s.slots,
                "primaries": s.primaries,
                "of_primaries": s.of_primaries,
            });
        }
        // Quorum runs only, likewise.
        if let Some(q) = self.on_quorum {
            out["quorum_nodes"] = json!(q.nodes);
            // The nodes the scenario ran on, and whose CPU server_cpu_s sums.
            out["nodes_used"] = json!(if q.all_nodes { q.nodes } else { 1 });
        }
        if let Some(rtts) = &self.node_rtts {
            out["node_rtt_p50_us"] =
                json!(rtts.p50_us.iter().map(|&us| round(us)).collect::<Vec<_>>());
            out["majority"] = json!(rtts.majority);
            out["majority_rtt_us"] = json!(round(rtts.majority_us()));
            out["p50_to_majority_rtt"] = json!(self.p50_to_majority_rtt().map(round));
            out["at_once_majority_rtt_us"] = json!(round(rtts.at_once_majority_us));
            out["at_once_all_rtt_us"] = json!(round(rtts.at_once_all_us));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_from_sorted_samples() {
        let mut s = Samples::default();
        for us in [5u64, 1, 3, 2, 4] {
            s.push(Duration::from_micros(us));
        }
        let s = s.sorted();
        assert_eq!(s.quantile_us(0.0), 1.0);
        assert_eq!(s.quantile_us(0.5), 3.0);
        assert_eq!(s.quantile_us(1.0), 5.0);
        assert_eq!(Samples::default().quantile_us(0.5), 0.0);
    }

    #[test]
    fn quorum_fields_appear_in_quorum_runs_only() {
        let mut outcome = Outcome::measured("quorum-1", &[120, 140, 160]);
        let json = outcome.to_json();
        for field in [
            "quorum_nodes",
            "nodes_used",
            "node_rtt_p50_us",
            "majority",
            "majority_rtt_us",
            "p50_to_majority_rtt",
            "at_once_majority_rtt_us",
            "at_once_all_rtt_us",
        ] {
            assert!(json.get(field).is_none(), "{field} in {json}");
        }
        outcome.on_quorum = Some(OnQuorum {
            nodes: 3,
            all_nodes: true,
        });
        outcome.node_rtts = Some(NodeRtts {
            p50_us: vec![80.0, 60.0, 70.0],
            majority: 2,
            at_once_majority_us: 95.0,
            at_once_all_us: 110.0,
        });
        let json = outcome.to_json();
        assert_eq!(json["quorum_nodes"], 3);
        assert_eq!(json["nodes_used"], 3);
        assert_eq!(json["node_rtt_p50_us"], json!([80.0, 60.0, 70.0]));
        assert_eq!(json["majority"], 2);
        assert_eq!(json["majority_rtt_us"], 70.0);
        assert_eq!(json["p50_to_majority_rtt"], 2.0);
        assert_eq!(json["at_once_majority_rtt_us"], 95.0);
        assert_eq!(json["at_once_all_rtt_us"], 110.0);
        outcome.on_quorum = Some(OnQuorum {
            nodes: 3,
            all_nodes: false,
        });
        assert_eq!(outcome.to_json()["nodes_used"], 1);
    }

    #[test]
    fn etcd_runs_say_so_and_name_members_not_primaries() {
        let mut outcome = Outcome::measured("etcd-lock-1", &[600]);
        assert!(outcome.to_json().get("store").is_none());
        outcome.store = Store::Etcd;
        outcome.cpu_primaries = Some(3);
        let json = outcome.to_json();
        assert_eq!(json["store"], "etcd");
        assert_eq!(json["server_cpu_members"], 3);
        assert!(json.get("server_cpu_primaries").is_none(), "{json}");
        outcome.store = Store::ZooKeeper;
        assert_eq!(outcome.to_json()["store"], "zookeeper");
        outcome.store = Store::Postgres;
        assert_eq!(outcome.to_json()["store"], "postgres");
        outcome.store = Store::MySql;
        assert_eq!(outcome.to_json()["store"], "mysql");
    }
}
