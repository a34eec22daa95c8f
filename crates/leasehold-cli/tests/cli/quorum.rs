//! The command on a quorum of independent servers: `--redis` given three times.

use std::process::Stdio;

use leasehold::redis;
use leasehold_tests::RedisServer;
use serde_json::Value;

use crate::{finish, leasehold, one_error_line, Running, SOON};

/// `leasehold SUBCOMMAND --redis URL… REST…`: the subcommand `args[0]` with every node of the quorum.
fn on_quorum(urls: &[String], args: &[&str]) -> std::process::Command {
    let (head, tail) = args.split_at(1);
    let mut command: Vec<&str> = head.to_vec();
    for url in urls {
        command.extend(["--redis", url.as_str()]);
    }
    command.extend(tail);
    leasehold(&command)
}

#[test]
fn run_and_status_work_on_a_quorum_and_other_kinds_are_refused() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let with = |args: &[&str]| on_quorum(&urls, args);
    let mut holder = with(&[
        "run",
        "--ttl",
        "2s",
        "jobs",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE; read line; exit 0",
    ]);
    holder.stdin(Stdio::piped());
    let mut holder = Running::start(holder);
    let fence: u64 = holder.line(SOON).parse().unwrap();
    assert!(fence > 0);

    let (code, stdout, stderr) = finish(with(&["status", "jobs"]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with("\"jobs\" is held on the quorum"),
        "{stdout}"
    );
    assert_eq!(stdout.lines().count(), 4, "{stdout}");
    let (code, stdout, _) = finish(with(&["status", "--json", "jobs"]), SOON);
    assert_eq!(code, Some(0));
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert!(status["held_by_majority"].is_string(), "{status}");
    assert_eq!(status["nodes"].as_array().unwrap().len(), 3);

    // Busy: exit 75 without waiting.
    let (code, _, stderr) = finish(with(&["run", "-n", "jobs", "--", "true"]), SOON);
    assert_eq!(code, Some(75), "{stderr}");
    // The read-write lock exists on a quorum too; the fair kinds do not; two --redis are neither one server nor a
    // quorum.
    let (code, _, stderr) = finish(with(&["run", "--exclusive", "schema", "--", "true"]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    // Two readers at once: status names both as held on the quorum.
    let reader = || {
        let mut reader = with(&[
            "run",
            "--shared",
            "schema",
            "--",
            "sh",
            "-c",
            "echo in; read line; exit 0",
        ]);
        reader.stdin(Stdio::piped());
        let reader = Running::start(reader);
        assert_eq!(reader.line(SOON), "in");
        reader
    };
    let (mut first, mut second) = (reader(), reader());
    let (code, stdout, _) = finish(with(&["status", "--json", "schema"]), SOON);
    assert_eq!(code, Some(0));
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        status["holders_by_majority"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
    for reader in [&mut first, &mut second] {
        reader.close_stdin();
        assert_eq!(reader.code(SOON), Some(0));
    }
    let (code, _, stderr) = finish(with(&["run", "--fair", "other", "--", "true"]), SOON);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        one_error_line(&stderr).contains("the mutex and the read-write lock only"),
        "{stderr}"
    );
    // A campaign would be silently a plain run: refused instead.
    let (code, _, stderr) = finish(with(&["run", "--value", "v", "other", "--", "true"]), SOON);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(one_error_line(&stderr).contains("no elections"), "{stderr}");
    let (code, _, stderr) = finish(
        leasehold(&["status", "--redis", &urls[0], "--redis", &urls[1], "jobs"]),
        SOON,
    );
    assert_eq!(code, Some(2), "{stderr}");
    // list asks every node: the lock a majority names, with its holder's description.
    let (code, stdout, stderr) = finish(with(&["list"]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("jobs "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(row.contains("host="), "{stdout}");

    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
    let (code, stdout, _) = finish(with(&["status", "jobs"]), SOON);
    assert_eq!(code, Some(0));
    assert!(
        stdout.starts_with("\"jobs\" is not held on the quorum"),
        "{stdout}"
    );
}

#[test]
fn on_a_quorum_the_holder_is_named_kinds_share_a_name_as_with_flock_and_release_force_clears_every_node(
) {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let with = |args: &[&str]| on_quorum(&urls, args);
    let held = |args: &[&str]| {
        let mut holder = with(args);
        holder.stdin(Stdio::piped());
        let holder = Running::start(holder);
        assert_eq!(holder.line(SOON), "in");
        holder
    };
    let in_and_wait = ["sh", "-c", "echo in; read line; exit 0"];

    // A plain holder: status and the conflict line name it.
    let mut plain = held(&[&["run", "nightly", "--"][..], &in_and_wait].concat());
    let (code, stdout, _) = finish(with(&["status", "nightly"]), SOON);
    assert_eq!(code, Some(0));
    let first = stdout.lines().next().unwrap();
    assert!(first.contains(" by host="), "{stdout}");
    let (code, _, stderr) = finish(with(&["run", "-n", "nightly", "--", "true"]), SOON);
    assert_eq!(code, Some(75), "{stderr}");
    let line = one_error_line(&stderr);
    assert!(line.contains("held by another owner (host="), "{line}");

    // -s beside the plain run is kept out (75 without waiting), then waits for it and runs.
    let (code, _, stderr) = finish(with(&["run", "-n", "-s", "nightly", "--", "true"]), SOON);
    assert_eq!(code, Some(75), "a share beside a plain holder: {stderr}");
    let mut shared = with(&["run", "-s", "nightly", "--", "echo", "shared ran"]);
    shared.stdout(Stdio::piped());
    let shared = Running::start(shared);
    plain.close_stdin();
    assert_eq!(plain.code(SOON), Some(0));
    assert_eq!(shared.line(SOON), "shared ran");

    // A plain run beside -s holders takes the write lock: it waits for them, then runs.
    let mut reader = held(&[&["run", "-s", "schema", "--"][..], &in_and_wait].concat());
    let (code, _, stderr) = finish(with(&["run", "-n", "schema", "--", "true"]), SOON);
    assert_eq!(code, Some(75), "a plain run beside a share: {stderr}");
    let mut writer = with(&["run", "schema", "--", "echo", "plain ran"]);
    writer.stdout(Stdio::piped());
    let writer = Running::start(writer);
    reader.close_stdin();
    assert_eq!(reader.code(SOON), Some(0));
    assert_eq!(writer.line(SOON), "plain ran");

    // release --force removes a held lock on every node.
    let mut stuck = held(&[&["run", "stuck", "--"][..], &in_and_wait].concat());
    let (code, stdout, stderr) = finish(with(&["release", "--force", "stuck"]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with("removed lock \"stuck\" on 3 of 3 nodes"),
        "{stdout}"
    );
    for node in &nodes {
        let exists: i64 = redis::cmd("EXISTS")
            .arg("leasehold:{stuck}")
            .query(&mut node.connection())
            .unwrap();
        assert_eq!(exists, 0);
    }
    // Its holder learns at its next renewal and is stopped (76).
    assert_eq!(stuck.code(std::time::Duration::from_secs(30)), Some(76));
    stuck.close_stdin();
}
