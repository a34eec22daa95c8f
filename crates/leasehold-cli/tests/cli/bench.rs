//! `leasehold bench`: the output is complete and well-formed, progress included (the numbers themselves are not
//! asserted).

use std::collections::BTreeSet;
use std::time::Duration;

use leasehold_tests::{slot_of, EtcdServer, RedisCluster, RedisServer, TempDir};
use serde_json::Value;

use crate::{finish, leasehold};

const SCENARIOS: [&str; 15] = [
    "floor-1",
    "peer-1",
    "uncontended-1",
    "floor-64",
    "peer-64",
    "uncontended-64",
    "floor-8p",
    "peer-8p",
    "contended-8p",
    "handoff",
    "fair-8p",
    "fair-handoff",
    "rw-8p",
    "semaphore-8p",
    "renew-10k",
];

/// Runs `leasehold bench ARGS` (which must include `--json`), expects exit 0 and one JSON line per scenario, named
/// `scenarios` in that order; returns the lines and stderr.
fn bench_lines(args: &[&str], scenarios: &[&str], within: Duration) -> (Vec<Value>, String) {
    let (code, stdout, stderr) = finish(leasehold(args), within);
    assert_eq!(code, Some(0), "bench failed: {stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(names, scenarios, "{stdout}");
    (lines, stderr)
}

#[test]
fn bench_json_covers_every_scenario_with_well_formed_fields() {
    let dir = TempDir::new("bench");
    let svg = dir.path().join("latency.svg");
    let (lines, stderr) = bench_lines(
        &[
            "bench",
            "--duration",
            "1s",
            "--json",
            "--plot",
            svg.to_str().unwrap(),
        ],
        &SCENARIOS,
        Duration::from_secs(120),
    );

    for line in &lines {
        let name = line["scenario"].as_str().unwrap();
        for field in ["processes", "tasks", "acquisitions"] {
            assert!(
                line[field].as_u64().is_some_and(|n| n > 0),
                "{name}: {field} in {line}"
            );
        }
        assert!(
            line["acquisitions_per_s"].as_f64().is_some_and(|r| r > 0.0),
            "{name}: {line}"
        );
        assert!(
            line["duration_s"].as_f64().is_some_and(|d| d > 0.0),
            "{name}: {line}"
        );
        let latency = &line["latency_us"];
        let (p50, p99, max) = (
            latency["p50"].as_f64(),
            latency["p99"].as_f64(),
            latency["max"].as_f64(),
        );
        assert!(
            p50.is_some() && p99.is_some() && max.is_some(),
            "{name}: {line}"
        );
        if name != "renew-10k" {
            let (p50, p99, max) = (p50.unwrap(), p99.unwrap(), max.unwrap());
            assert!(
                0.0 < p50 && p50 <= p99 && p99 <= max,
                "{name}: latencies out of order: {latency}"
            );
        }
        let expects = |field: &str, present: bool| {
            assert_eq!(!line[field].is_null(), present, "{name}: {field} in {line}");
        };
        expects(
            "floor_ratio",
            name.starts_with("uncontended") || name == "contended-8p" || name == "fair-8p",
        );
        expects(
            "peer_ratio",
            ["uncontended-1", "uncontended-64", "contended-8p"].contains(&name),
        );
        expects("share_min_max", name.ends_with("-8p"));
        expects("per_process", name.ends_with("-8p"));
        // The private server's CPU over each scenario's window, per lock cycle (per renewal for renew-10k).
        assert!(
            line["server_cpu_us_per_cycle"]
                .as_f64()
                .is_some_and(|us| us > 0.0),
            "{name}: {line}"
        );
        // The client's CPU per cycle: this process's, or the worker processes' together (renew-10k gives its own).
        let measured = name != "renew-10k";
        expects("client_cpu_us_per_cycle", measured);
        if measured {
            assert!(
                line["client_cpu_us_per_cycle"]
                    .as_f64()
                    .is_some_and(|us| us > 0.0),
                "{name}: {line}"
            );
        }
        expects("rtt_p50_us", name.ends_with("handoff"));
        expects("handoff_to_rtt", name.ends_with("handoff"));
        expects("renew", name == "renew-10k");
        expects("write_p99_us", name == "rw-8p");
    }
    for contended in lines
        .iter()
        .filter(|l| l["scenario"].as_str().unwrap().ends_with("-8p"))
    {
        assert_eq!(contended["per_process"].as_array().unwrap().len(), 8);
    }
    let renew = &lines[SCENARIOS.len() - 1]["renew"];
    assert_eq!(renew["locks"], 10_000);
    assert_eq!(renew["periods"], 3);
    for field in ["calls_per_period", "client_cpu_s", "client_bytes_per_lock"] {
        assert!(renew[field].as_f64().is_some(), "renew.{field} in {renew}");
    }
    assert!(renew["all_held"].is_boolean());

    // stderr is a pipe here, not a terminal: no bar, one line per scenario as it ends, saying what it measured.
    assert!(
        !stderr.contains('\x1b') && !stderr.contains('\r'),
        "{stderr:?}"
    );
    let progress: Vec<&str> = stderr.lines().collect();
    assert_eq!(progress.len(), SCENARIOS.len(), "{stderr}");
    for (i, (line, name)) in progress.iter().zip(SCENARIOS).enumerate() {
        let prefix = format!("bench [{}/{}] {name}: ", i + 1, SCENARIOS.len());
        assert!(line.starts_with(&prefix), "{line}");
        if name == "renew-10k" {
            assert!(
                line.contains("10000 locks held") && line.contains("renewal calls per period"),
                "{line}"
            );
        } else {
            let acquisitions = lines[i]["acquisitions"].as_u64().unwrap();
            assert!(
                line.contains(&format!(": {acquisitions} acquisitions in 1s, ")),
                "{line}"
            );
        }
        assert!(!line.contains(" 0 acquisitions"), "{line}");
    }

    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.trim_end().ends_with("</svg>"));
    // One curve per scenario with latency samples (renew-10k has none).
    assert_eq!(picture.matches("<polyline").count(), SCENARIOS.len() - 1);
}

#[test]
fn bench_runs_on_a_cluster_with_the_server_cpu_of_every_primary() {
    let cluster = RedisCluster::start();
    // The 64 in-process tasks use the locks bench:0 … bench:63 (leasehold's keys are tagged with the name; the
    // floor's key is the bare name): they must reach every primary, or the cluster run measures one node.
    let owners: BTreeSet<usize> = (0..64)
        .map(|task| cluster.primary_of_slot(slot_of(&format!("bench:{task}"))))
        .collect();
    assert_eq!(owners.len(), 3);
    let scenarios = ["floor-1", "uncontended-64", "contended-8p"];
    let (lines, stderr) = bench_lines(
        &[
            "bench",
            "--redis",
            &cluster.url(),
            "--duration",
            "300ms",
            "--scenarios",
            &scenarios.join(","),
            "--json",
        ],
        &scenarios,
        Duration::from_secs(60),
    );
    for line in &lines {
        let name = line["scenario"].as_str().unwrap();
        assert!(
            line["acquisitions"].as_u64().is_some_and(|n| n > 0),
            "{name}: {line}"
        );
        // The server CPU is read from, and summed over, the three primaries.
        assert!(
            line["server_cpu_us_per_cycle"]
                .as_f64()
                .is_some_and(|us| us > 0.0),
            "{name}: {line}"
        );
        assert_eq!(line["server_cpu_primaries"], 3, "{name}: {line}");
    }
    let spread = &lines[1]["key_spread"];
    assert_eq!(spread["keys"], 64, "{spread}");
    assert_eq!(spread["primaries"], 3, "{spread}");
    assert_eq!(spread["of_primaries"], 3, "{spread}");
    assert!(spread["slots"].as_u64().is_some_and(|n| n > 32), "{spread}");
    assert_eq!(lines[0]["key_spread"]["keys"], 1);
    assert!(lines[2]["key_spread"].is_null(), "one key: {}", lines[2]);
    assert_eq!(
        lines[1]["floor_ratio"],
        Value::Null,
        "no floor-64 in this run"
    );
    assert_eq!(stderr.lines().count(), scenarios.len(), "{stderr}");
}

#[test]
fn bench_runs_on_a_quorum_of_private_servers() {
    let scenarios = ["quorum-floor-1", "quorum-1", "quorum-contended-8p"];
    let (lines, stderr) = bench_lines(
        &[
            "bench",
            "--quorum",
            "3",
            "--duration",
            "300ms",
            "--scenarios",
            &scenarios.join(","),
            "--json",
        ],
        &scenarios,
        Duration::from_secs(60),
    );
    for line in &lines {
        let name = line["scenario"].as_str().unwrap();
        assert!(
            line["acquisitions"].as_u64().is_some_and(|n| n > 0),
            "{name}: {line}"
        );
        assert_eq!(line["quorum_nodes"], 3, "{name}: {line}");
        // Every node's CPU, summed.
        assert_eq!(line["nodes_used"], 3, "{name}: {line}");
        assert!(
            line["server_cpu_us_per_cycle"]
                .as_f64()
                .is_some_and(|us| us > 0.0),
            "{name}: {line}"
        );
    }
    for uncontended in &lines[..2] {
        let rtts = uncontended["node_rtt_p50_us"].as_array().unwrap();
        assert_eq!(rtts.len(), 3, "{uncontended}");
        assert!(rtts.iter().all(|us| us.as_f64().is_some_and(|us| us > 0.0)));
        assert_eq!(uncontended["majority"], 2, "{uncontended}");
        for at_once in ["at_once_majority_rtt_us", "at_once_all_rtt_us"] {
            assert!(
                uncontended[at_once].as_f64().is_some_and(|us| us > 0.0),
                "{at_once} in {uncontended}"
            );
        }
        assert!(
            uncontended["p50_to_majority_rtt"]
                .as_f64()
                .is_some_and(|r| r > 0.0),
            "{uncontended}"
        );
    }
    assert!(lines[1]["floor_ratio"].as_f64().is_some(), "{}", lines[1]);
    assert_eq!(lines[2]["per_process"].as_array().unwrap().len(), 8);
    assert!(lines[2]["node_rtt_p50_us"].is_null(), "{}", lines[2]);
    assert_eq!(stderr.lines().count(), scenarios.len(), "{stderr}");
}

#[test]
fn bench_compares_a_quorum_of_given_servers_with_its_first_node_alone() {
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let mut args = vec!["bench".to_owned()];
    for server in &servers {
        args.extend(["--redis".to_owned(), server.url()]);
    }
    args.extend(
        [
            "--duration",
            "300ms",
            "--scenarios",
            "quorum-1,uncontended-1",
            "--json",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (lines, _) = bench_lines(
        &args,
        &["quorum-1", "uncontended-1"],
        Duration::from_secs(60),
    );
    assert_eq!(lines[0]["nodes_used"], 3);
    assert_eq!(lines[1]["nodes_used"], 1);
    assert!(lines[1]["node_rtt_p50_us"].is_null(), "{}", lines[1]);
    // uncontended-1 ran on the first server only: the others never saw a single-node lock's scripts.
    let calls: Vec<u64> = servers
        .iter()
        .map(|server| server.command_calls("evalsha"))
        .collect();
    for line in &lines {
        assert!(
            line["acquisitions"].as_u64().is_some_and(|n| n > 0),
            "{line}"
        );
    }
    let uncontended = lines[1]["acquisitions"].as_u64().unwrap();
    assert!(
        calls[0] > calls[1] + uncontended && calls[0] > calls[2] + uncontended,
        "script calls per server {calls:?}, {uncontended} single-node acquisitions"
    );
}

/// The table on etcd is checked in `stores::etcd::bench_runs_against_the_stores_floor`.
#[test]
fn bench_json_on_etcd_marks_each_scenario_as_an_etcd_run() {
    let etcd = EtcdServer::start();
    let url = etcd.url();
    // --json: one object per scenario, marked as an etcd run, the note on stderr.
    let (code, stdout, stderr) = crate::stores::bench_on(
        &url,
        "etcd-lock-1,uncontended-1",
        &["--json"],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.starts_with("bench: on etcd: "), "{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0]["scenario"], "etcd-lock-1");
    assert!(lines[0]["floor_ratio"].is_null(), "{}", lines[0]);
    assert!(
        lines[1]["floor_ratio"].as_f64().is_some_and(|r| r > 0.0),
        "{}",
        lines[1]
    );
    for line in &lines {
        assert_eq!(line["store"], "etcd", "{line}");
        assert!(
            line["acquisitions"].as_u64().is_some_and(|n| n > 0),
            "{line}"
        );
        assert!(line["server_cpu_s"].as_f64().is_some(), "{line}");
        assert!(line["server_cpu_primaries"].is_null(), "one member: {line}");
    }
}

#[test]
fn bench_rejects_two_servers_and_scenarios_of_the_other_topology() {
    for args in [
        &[
            "bench",
            "--redis",
            "redis://127.0.0.1:1",
            "--redis",
            "redis://127.0.0.1:2",
        ][..],
        &["bench", "--quorum", "2"],
        &["bench", "--quorum", "3", "--redis", "redis://127.0.0.1:1"],
        &["bench", "--scenarios", "quorum-1"],
        &["bench", "--quorum", "3", "--scenarios", "floor-1"],
        // etcd: one URL for the cluster, its own floor and no Redis scenarios; refused before connecting.
        &["bench", "--scenarios", "etcd-lock-1"],
        &[
            "bench",
            "--store",
            "etcd://127.0.0.1:1",
            "--scenarios",
            "floor-1",
        ],
        &[
            "bench",
            "--store",
            "etcd://127.0.0.1:1",
            "--scenarios",
            "peer-8p",
        ],
        &[
            "bench",
            "--store",
            "etcd://127.0.0.1:1",
            "--store",
            "etcd://127.0.0.1:2",
        ],
        &[
            "bench",
            "--store",
            "etcd://127.0.0.1:1",
            "--store",
            "redis://127.0.0.1:2",
            "--store",
            "redis://127.0.0.1:3",
        ],
        &[
            "bench",
            "--redis",
            "redis://127.0.0.1:1",
            "--redis",
            "redis://127.0.0.1:2",
            "--redis",
            "redis://127.0.0.1:1",
        ],
    ] {
        let (code, _, stderr) = finish(leasehold(args), Duration::from_secs(10));
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}

#[test]
fn bench_rejects_unknown_scenarios_and_bad_durations() {
    for args in [
        &["bench", "--scenarios", "nope"][..],
        &["bench", "--duration", "0s"],
        &["bench", "--duration", "fast"],
    ] {
        let (code, _, stderr) = finish(leasehold(args), Duration::from_secs(10));
        assert_eq!(code, Some(2), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}
