//! The command on ZooKeeper (`--store zk://…`): `run` with every kind, `status`, `list`, `release --force`, `bench`
//! against ZooKeeper's floor, and what ZooKeeper cannot honour refused before connecting. Each test starts its own
//! standalone server (`tickTime=500`: sessions of 1 to 10 s), as the etcd tests do.

use std::process::Stdio;
use std::time::Duration;

use leasehold_tests::{TempDir, ZkServer};
use serde_json::Value;

use crate::{finish, leasehold, one_error_line, Running, SOON};

/// A ZooKeeper URL where nothing listens: a command that tried to connect would not exit 2 there.
const NOWHERE: &str = "zk://127.0.0.1:1";

/// Starts `leasehold run ARGS… NAME` with a program that prints `held FENCE TOKEN` and then waits for stdin to close
/// (see [`Running::close_stdin`]); returns once it holds the lock, with the line's token.
fn holder(url: &str, options: &[&str], name: &str) -> (Running, String) {
    let mut args = vec!["run", "--store", url];
    args.extend_from_slice(options);
    args.extend_from_slice(&[
        name,
        "--",
        "sh",
        "-c",
        "echo held $LEASEHOLD_FENCE $LEASEHOLD_TOKEN; read line; exit 0",
    ]);
    let mut command = leasehold(&args);
    command.stdin(Stdio::piped());
    let running = Running::start(command);
    let line = running.line(SOON);
    let token = line
        .strip_prefix("held ")
        .and_then(|rest| rest.split_once(' '))
        .unwrap_or_else(|| panic!("{line}"))
        .1
        .to_owned();
    (running, token)
}

fn status_json(url: &str, name: &str) -> Value {
    let (code, stdout, stderr) =
        finish(leasehold(&["status", "--json", "--store", url, name]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn a_run_on_zookeeper_excludes_a_second_run_until_it_ends_and_a_nested_run_goes_on_under_it() {
    let zk = ZkServer::start();
    let url = zk.url();
    let (mut first, _) = holder(&url, &["--ttl", "2s"], "nightly");

    let (code, _, stderr) = finish(
        leasehold(&["run", "-n", "--store", &url, "nightly", "--", "true"]),
        SOON,
    );
    assert_eq!(code, Some(75), "{stderr}");
    let line = one_error_line(&stderr);
    assert!(
        line.starts_with("leasehold: lock \"nightly\" is held by another owner (host="),
        "{line}"
    );
    let (code, _, stderr) = finish(
        leasehold(&[
            "run", "-w", "0.3", "-E", "9", "--store", &url, "nightly", "--", "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(9), "{stderr}");
    assert!(
        one_error_line(&stderr).contains("still held after waiting 300ms"),
        "{stderr}"
    );

    // A waiting run starts as soon as the first one ends.
    let waiting = Running::start(leasehold(&[
        "run", "--store", &url, "nightly", "--", "echo", "second",
    ]));
    first.close_stdin();
    assert_eq!(first.code(SOON), Some(0), "{}", first.stderr());
    assert_eq!(waiting.line(SOON), "second");

    // A run under the lock it already holds runs at once, under the outer grant.
    let inner = format!(
        "{} run -x -n --store {url} deploy -- sh -c 'echo inner $LEASEHOLD_FENCE'; echo outer $LEASEHOLD_FENCE",
        crate::LEASEHOLD
    );
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run", "-x", "--store", &url, "deploy", "--", "sh", "-c", &inner,
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    let fence = lines[1].strip_prefix("outer ").unwrap();
    assert_eq!(lines[0], format!("inner {fence}"), "{stdout}");
}

#[test]
fn every_kind_runs_on_zookeeper_and_status_and_list_name_its_holders() {
    let zk = ZkServer::start();
    let url = zk.url();

    // ZooKeeper does not tell how long another client's session has left: no remaining lease.
    let (mut mutex, token) = holder(&url, &["--ttl", "4s"], "jobs");
    let status = status_json(&url, "jobs");
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["kind"], "mutex", "{status}");
    assert_eq!(status["token"], token.as_str(), "{status}");
    assert_eq!(
        status["holder"]["program"],
        "sh -c echo held $LEASEHOLD_FENCE $LEASEHOLD_TOKEN; read line; exit 0"
    );
    assert_eq!(status["holder"]["pid"], mutex.pid(), "{status}");
    assert!(status["remaining_ms"].is_null(), "{status}");
    assert!(status["fence"].as_u64().is_some(), "{status}");
    let (code, stdout, stderr) = finish(leasehold(&["status", "--store", &url, "jobs"]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with("\"jobs\" is held by host=") && stdout.contains("no expiry reported"),
        "{stdout}"
    );

    // Two readers at once, with their descriptions, as on Redis.
    let (mut reader_a, token_a) = holder(&url, &["--shared"], "schema");
    let (mut reader_b, _) = holder(&url, &["-s"], "schema");
    let (code, _, stderr) = finish(
        leasehold(&["run", "-x", "-n", "--store", &url, "schema", "--", "true"]),
        SOON,
    );
    assert_eq!(code, Some(75), "a writer waits for the readers: {stderr}");
    let status = status_json(&url, "schema");
    assert_eq!(status["kind"], "rw", "{status}");
    let holders = status["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{status}");
    assert!(holders.iter().all(|h| h["mode"] == "read"), "{status}");
    assert!(
        holders.iter().any(|h| h["token"] == token_a.as_str()),
        "{status}"
    );

    // Two permits of three held, the third taken at once, a fourth refused.
    let (mut permit_a, _) = holder(&url, &["--permits", "3"], "exports");
    let (mut permit_b, _) = holder(&url, &["--permits", "3"], "exports");
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run",
            "--permits",
            "3",
            "-n",
            "--store",
            &url,
            "exports",
            "--",
            "echo",
            "third",
        ]),
        SOON,
    );
    assert_eq!((code, stdout.as_str()), (Some(0), "third"), "{stderr}");
    let status = status_json(&url, "exports");
    assert_eq!(status["kind"], "semaphore", "{status}");
    assert_eq!(status["permits"], 3, "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");

    let (mut fair, _) = holder(&url, &["--fair"], "queue");
    assert_eq!(status_json(&url, "queue")["kind"], "fair");
    let (code, _, _) = finish(
        leasehold(&[
            "run", "--fair", "-n", "--store", &url, "queue", "--", "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(75));

    let (code, stdout, stderr) = finish(leasehold(&["list", "--store", &url]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|row| row[0]).collect();
    assert_eq!(
        names,
        ["NAME", "exports", "jobs", "queue", "schema"],
        "{stdout}"
    );
    assert_eq!(rows[1][1..3], ["semaphore", "3"], "{stdout}");
    assert_eq!(rows[2][1], "mutex", "{stdout}");
    assert!(
        stdout
            .lines()
            .all(|l| l.contains("host=") || l.starts_with("NAME")),
        "{stdout}"
    );
    let (code, stdout, _) = finish(leasehold(&["list", "--json", "--store", &url, "j*"]), SOON);
    assert_eq!(code, Some(0));
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{stdout}");
    assert_eq!(listed[0]["token"], token.as_str(), "{stdout}");

    for running in [
        &mut mutex,
        &mut reader_a,
        &mut reader_b,
        &mut permit_a,
        &mut permit_b,
        &mut fair,
    ] {
        running.close_stdin();
        assert_eq!(running.code(SOON), Some(0), "{}", running.stderr());
    }
    let (code, stdout, _) = finish(leasehold(&["list", "--store", &url]), SOON);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "no held locks match \"*\"");
}

#[test]
fn release_force_frees_a_zookeeper_lock_and_its_run_stops_the_program_at_once() {
    let zk = ZkServer::start();
    let url = zk.url();
    // A long session: the holder learns of the removal from the watch on its node, not from its session.
    let (mut first, token) = holder(&url, &["--ttl", "10s", "--kill-after", "1s"], "stuck");
    let (code, stdout, stderr) = finish(
        leasehold(&["release", "--force", "--store", &url, "stuck"]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let id = token.split(' ').next().unwrap();
    assert!(
        stdout.starts_with(&format!("removed lock \"stuck\": token {id} (fence ")),
        "{stdout}"
    );
    assert_eq!(first.code(Duration::from_secs(5)), Some(76));
    let lost = first.stderr();
    assert!(
        lost.starts_with("leasehold: lost lock \"stuck\": "),
        "{lost}"
    );

    let (code, stdout, stderr) = finish(
        leasehold(&["run", "-n", "--store", &url, "stuck", "--", "echo", "free"]),
        SOON,
    );
    assert_eq!((code, stdout.as_str()), (Some(0), "free"), "{stderr}");
    let (code, stdout, _) = finish(
        leasehold(&["release", "--force", "--store", &url, "stuck"]),
        SOON,
    );
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "lock \"stuck\" was free; nothing removed");
}

#[test]
fn what_zookeeper_cannot_honour_exits_2_before_connecting() {
    let dir = TempDir::new("zk-refusals");
    let pem = dir.path().join("ca.pem");
    std::fs::write(&pem, "not used").unwrap();
    let pem = pem.to_str().unwrap();
    let run = |options: &[&'static str]| {
        let mut args = vec!["run", "--store", NOWHERE];
        args.extend_from_slice(options);
        args.extend_from_slice(&["jobs", "--", "true"]);
        args
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            run(&["--ttl", "500ms"]),
            "whole milliseconds from 1s to 24d",
        ),
        (run(&["--ttl", "1500500us"]), "whole milliseconds"),
        (run(&["--ttl", "25d"]), "whole milliseconds from 1s to 24d"),
        (run(&["--replicas", "1"]), "--replicas is a Redis setting"),
        (
            run(&["--permits", "5000000000"]),
            "a ZooKeeper semaphore has at most 4294967295 permits",
        ),
        (
            run(&["--store", NOWHERE]),
            "one zk:// URL names every server of the ensemble",
        ),
        (
            vec![
                "run", "--store", NOWHERE, "--tls-ca", pem, "jobs", "--", "true",
            ],
            "leasehold reaches ZooKeeper without TLS",
        ),
        (
            vec!["status", "--store", NOWHERE, "--replicas", "2", "jobs"],
            "--replicas",
        ),
        (
            vec!["list", "--store", NOWHERE, "--tls-ca", pem],
            "--tls-ca",
        ),
        (
            vec![
                "release",
                "--force",
                "--store",
                NOWHERE,
                "--replicas",
                "1",
                "jobs",
            ],
            "--replicas",
        ),
        (
            vec!["permits", "--store", NOWHERE, "jobs", "4"],
            "ZooKeeper stores none",
        ),
        (vec!["demo", "--store", NOWHERE], "the demo runs on Redis"),
        (
            vec!["status", "--store", "zk://127.0.0.1:x", "jobs"],
            "is not a ZooKeeper URL",
        ),
        (
            vec!["bench", "--store", NOWHERE, "--scenarios", "floor-1"],
            "floor-1 does not run on ZooKeeper",
        ),
        (
            vec!["bench", "--scenarios", "zk-floor-1"],
            "zk-floor-1 needs a ZooKeeper store",
        ),
    ];
    for (args, says) in &cases {
        let (code, _, stderr) = finish(leasehold(args), SOON);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        let line = one_error_line(&stderr);
        assert!(line.contains(says), "{args:?}: {line}");
        assert!(!line.contains("cannot connect"), "{args:?}: {line}");
    }
    // The store from the environment is checked the same way.
    let mut command = leasehold(&["run", "--ttl", "999ms", "jobs", "--", "true"]);
    command.env("LEASEHOLD_STORE", NOWHERE);
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(one_error_line(&stderr).contains("--ttl 999ms"), "{stderr}");

    // What ZooKeeper can honour goes on to connect, and an unreachable ensemble exits 69 as an unreachable Redis does
    // (within the session timeout asked for: the shortest here).
    let (code, _, stderr) = finish(
        leasehold(&[
            "run",
            "--store",
            NOWHERE,
            "--ttl",
            "1s",
            "--permits",
            "4",
            "jobs",
            "--",
            "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        one_error_line(&stderr)
            .starts_with("leasehold: cannot connect to ZooKeeper at zk://127.0.0.1:1: "),
        "{stderr}"
    );
}

#[test]
fn bench_runs_on_zookeeper_against_bare_nodes() {
    let zk = ZkServer::start();
    let url = zk.url();
    let scenarios = [
        "zk-floor-1",
        "uncontended-1",
        "zk-floor-8p",
        "contended-8p",
        "handoff",
    ];
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "bench",
            "--store",
            &url,
            "--duration",
            "300ms",
            "--scenarios",
            &scenarios.join(","),
        ]),
        Duration::from_secs(90),
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stderr.lines().count(), scenarios.len(), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("scenario "), "{stdout}");
    let rows: Vec<Vec<&str>> = lines[1..=scenarios.len()]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|row| row[0]).collect();
    assert_eq!(names, scenarios, "{stdout}");
    for row in &rows {
        let rate: f64 = row[1].parse().unwrap();
        assert!(rate > 0.0, "{row:?} in {stdout}");
        // The server's CPU per cycle, read from its process: it runs on this machine.
        assert!(row[6].parse::<f64>().is_ok(), "{row:?} in {stdout}");
    }
    let ratio = |name: &str| rows.iter().find(|row| row[0] == name).unwrap()[5];
    for floor in ["zk-floor-1", "zk-floor-8p"] {
        assert_eq!(ratio(floor), "-", "{stdout}");
    }
    for measured in ["uncontended-1", "contended-8p"] {
        assert!(
            ratio(measured).parse::<f64>().is_ok_and(|r| r > 0.0),
            "{measured}: {stdout}"
        );
    }
    assert!(
        lines[1 + scenarios.len()]
            .starts_with("on ZooKeeper: × floor is against zk-floor-1, -64, -8p"),
        "{stdout}"
    );
    assert_eq!(lines.len(), scenarios.len() + 2, "{stdout}");
}
