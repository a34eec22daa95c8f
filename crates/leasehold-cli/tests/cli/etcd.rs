//! The command on etcd (`--store etcd://…`): `run` with every kind, `status`, `list`, `release --force`, what etcd
//! cannot honour refused before connecting, and the store's errors said as Redis's are. Each test starts its own
//! etcd member.

use std::process::Stdio;
use std::time::Duration;

use leasehold_tests::{EtcdServer, TempDir, TestCa};
use serde_json::Value;

use crate::{finish, leasehold, one_error_line, Running, SOON};

/// An etcd URL where nothing listens: a command that tried to connect would fail there with 69.
const NOWHERE: &str = "etcd://127.0.0.1:1";

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
fn a_run_on_etcd_excludes_a_second_run_until_it_ends() {
    let etcd = EtcdServer::start();
    let url = etcd.url();
    let (mut first, _) = holder(&url, &[], "nightly");

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
}

#[test]
fn every_kind_runs_on_etcd_and_status_and_list_show_its_holders() {
    let etcd = EtcdServer::start();
    let url = etcd.url();

    // --ttl is the session lease: the holder's remaining lease is at most 4s, in etcd's whole seconds.
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
    let left = status["remaining_ms"].as_u64().unwrap();
    assert!(0 < left && left <= 4000, "{status}");
    assert!(status["fence"].as_u64().is_some(), "{status}");

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
    assert!(
        holders
            .iter()
            .all(|h| h["holder"]["pid"].as_u64().is_some()),
        "{status}"
    );

    // Two permits of three held, the third taken by a plain run at once, a fourth refused.
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
fn release_force_frees_an_etcd_lock_and_its_run_stops_the_program() {
    let etcd = EtcdServer::start();
    let url = etcd.url();
    // A 3 s session: a keep-alive every second finds the key gone.
    let (mut first, token) = holder(&url, &["--ttl", "3s", "--kill-after", "1s"], "stuck");
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
    assert_eq!(first.code(SOON), Some(76));
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
fn a_nested_run_on_etcd_runs_under_the_outer_grant() {
    let etcd = EtcdServer::start();
    let url = etcd.url();
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
fn what_etcd_cannot_honour_exits_2_before_connecting() {
    let dir = TempDir::new("etcd-refusals");
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
        (run(&["--ttl", "1s"]), "whole seconds of at least 2s"),
        (run(&["--ttl", "2500ms"]), "whole seconds of at least 2s"),
        (run(&["--replicas", "1"]), "--replicas is a Redis setting"),
        (
            run(&["--permits", "5000000000"]),
            "at most 4294967295 permits",
        ),
        (
            run(&["--store", NOWHERE]),
            "one etcd URL names every member",
        ),
        (
            vec![
                "run", "--store", NOWHERE, "--tls-ca", pem, "jobs", "--", "true",
            ],
            "--tls-ca is for rediss://, etcds:// and postgres://…?sslmode=require URLs",
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
            "etcd stores none",
        ),
        (vec!["demo", "--store", NOWHERE], "the demo runs on Redis"),
        (
            vec!["status", "--store", "etcd://127.0.0.1", "jobs"],
            "is not an etcd URL",
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
    let mut command = leasehold(&["run", "--ttl", "500ms", "jobs", "--", "true"]);
    command.env("LEASEHOLD_STORE", NOWHERE);
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(one_error_line(&stderr).contains("--ttl 500ms"), "{stderr}");

    // What etcd can honour goes on to connect, and an unreachable etcd is said as an unreachable Redis is: 69.
    for args in [
        &["status", "--store", NOWHERE, "jobs"][..],
        &[
            "run",
            "--store",
            NOWHERE,
            "--ttl",
            "2s",
            "--permits",
            "4",
            "jobs",
            "--",
            "true",
        ],
        &["list", "--store", NOWHERE, "--json"],
    ] {
        let (code, _, stderr) = finish(leasehold(args), SOON);
        assert_eq!(code, Some(69), "{args:?}: {stderr}");
        let line = one_error_line(&stderr);
        assert!(
            line.starts_with("leasehold: cannot connect to etcd at etcd://127.0.0.1:1: ")
                && line.ends_with("Connection refused (os error 111)"),
            "{args:?}: {line}"
        );
    }
}

#[test]
fn etcd_going_away_while_a_run_waits_ends_the_wait_with_69() {
    let mut etcd = EtcdServer::start();
    let url = etcd.url();
    let (mut first, _) = holder(&url, &["--ttl", "10s"], "busy");
    let mut waiting = Running::start(leasehold(&[
        "run", "-w", "3", "--store", &url, "busy", "--", "true",
    ]));
    // The waiter's key is in place once status counts it.
    crate::poll_until("the second run waits", || {
        status_json(&url, "busy")["waiting_clients"] == 1
    });
    etcd.kill();
    assert_eq!(waiting.code(Duration::from_secs(20)), Some(69));
    let stderr = waiting.stderr();
    assert!(
        stderr
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("leasehold: etcd at etcd://127.0.0.1:")
                && l.contains("failed while taking lock \"busy\": ")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    drop(first.take_stdin());
}

#[test]
fn a_run_reaches_etcd_over_tls_with_the_ca_it_is_given() {
    let ca = TestCa::new();
    let etcd = EtcdServer::start_tls(&ca, true);
    let url = etcd.url();
    assert!(url.starts_with("etcds://"), "{url}");
    let files = [
        ca.ca.cert_path.to_str().unwrap(),
        ca.client.cert_path.to_str().unwrap(),
        ca.client.key_path.to_str().unwrap(),
    ];
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run",
            "--store",
            &url,
            "--tls-ca",
            files[0],
            "--tls-cert",
            files[1],
            "--tls-key",
            files[2],
            "sealed",
            "--",
            "sh",
            "-c",
            "echo fence $LEASEHOLD_FENCE",
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("fence "), "{stdout}");
    // Without the client certificate the member refuses the connection: 69, as an unreachable store.
    let (code, _, stderr) = finish(
        leasehold(&[
            "run", "--store", &url, "--tls-ca", files[0], "sealed", "--", "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(69), "{stderr}");
    assert!(one_error_line(&stderr).contains("etcds://"), "{stderr}");
}
