//! The command against a real Redis Cluster (3 primaries + 3 replicas, started once for this test): `run`, a second
//! `run` that finds the lock busy, `status`, `list` and `release --force`, with `--redis redis+cluster://…`.

use std::process::Stdio;

use leasehold_tests::RedisCluster;
use serde_json::Value;

use crate::{finish, leasehold, Running, SOON};

#[test]
fn run_status_list_and_force_release_work_on_a_cluster() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    // Names on different primaries: the command follows each lock to its node.
    let names = ["orders", "billing", "mail"];
    let mut holders = Vec::new();
    for name in names {
        let mut command = leasehold(&[
            "run",
            "--redis",
            &url,
            "--ttl",
            "2s",
            name,
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE; read line; exit 0",
        ]);
        command.stdin(Stdio::piped());
        let holder = Running::start(command);
        let fence: u64 = holder.line(SOON).parse().unwrap();
        assert!(fence > 0);
        holders.push(holder);
    }
    // Busy: exit 75 without waiting.
    let (code, _, stderr) = finish(
        leasehold(&["run", "-n", "--redis", &url, "orders", "--", "true"]),
        SOON,
    );
    assert_eq!(code, Some(75), "{stderr}");

    let (code, stdout, stderr) = finish(
        leasehold(&["status", "--json", "--redis", &url, "billing"]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["state"], "held");
    assert_eq!(status["kind"], "mutex");

    // `list` walks every primary.
    let (code, stdout, stderr) = finish(leasehold(&["list", "--json", "--redis", &url]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    let mut listed: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|lock| lock["name"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, ["billing", "mail", "orders"]);

    let (code, _, stderr) = finish(
        leasehold(&["release", "--force", "--redis", &url, "mail"]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, _) = finish(leasehold(&["status", "--redis", &url, "mail"]), SOON);
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("\"mail\" is free"), "{stdout}");

    // The force-released holder learns at its next renewal that it lost the lock: it stops its program and exits 76.
    // The others end with their program's status, 0.
    for (name, mut holder) in names.into_iter().zip(holders) {
        if name == "mail" {
            assert_eq!(holder.code(SOON), Some(76), "{name}");
        } else {
            holder.close_stdin();
            assert_eq!(holder.code(SOON), Some(0), "{name}");
        }
    }
}

#[test]
fn run_with_replicas_refuses_a_grant_no_replica_acknowledges() {
    let server = leasehold_tests::RedisServer::start();
    let url = server.url();
    let (code, _, stderr) = finish(
        leasehold(&[
            "run",
            "--replicas",
            "1",
            "--redis",
            &url,
            "jobs",
            "--",
            "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(69), "{stderr}");
    assert!(stderr.contains("0 of the 1 required replicas"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[test]
fn a_redis_url_naming_one_cluster_node_works() {
    let cluster = RedisCluster::start();
    let url = format!("redis://127.0.0.1:{}", cluster.port(cluster.primaries()[0]));
    // Names on every primary, so that most of them live on another node than the one in the URL.
    for name in ["orders", "billing", "mail"] {
        let (code, _, stderr) = finish(leasehold(&["run", "--redis", &url, name, "true"]), SOON);
        assert_eq!(code, Some(0), "{name}: {stderr}");
    }
    let mut command = leasehold(&[
        "run",
        "--redis",
        &url,
        "--ttl",
        "5s",
        "billing",
        "--",
        "sh",
        "-c",
        "echo held; read line; exit 0",
    ]);
    command.stdin(Stdio::piped());
    let mut holder = Running::start(command);
    assert_eq!(holder.line(SOON), "held");
    let (code, stdout, stderr) = finish(
        leasehold(&["status", "--json", "--redis", &url, "billing"]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["state"], "held");
    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
}
