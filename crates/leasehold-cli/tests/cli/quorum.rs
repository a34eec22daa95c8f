//! The command on a quorum of independent servers: `--redis` given three times.

use std::process::Stdio;

use leasehold_tests::RedisServer;
use serde_json::Value;

use crate::{finish, leasehold, one_error_line, Running, SOON};

#[test]
fn run_and_status_work_on_a_quorum_and_other_kinds_are_refused() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let with = |args: &[&str]| {
        let mut all = Vec::new();
        for url in &urls {
            all.extend(["--redis", url.as_str()]);
        }
        let (head, tail) = args.split_at(1);
        let mut command: Vec<&str> = head.to_vec();
        command.extend(all);
        command.extend(tail);
        leasehold(&command)
    };
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
    // quorum; list takes one server.
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
    let (code, _, stderr) = finish(
        leasehold(&["status", "--redis", &urls[0], "--redis", &urls[1], "jobs"]),
        SOON,
    );
    assert_eq!(code, Some(2), "{stderr}");
    let (code, _, stderr) = finish(with(&["list"]), SOON);
    assert_eq!(code, Some(2), "{stderr}");

    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
    let (code, stdout, _) = finish(with(&["status", "jobs"]), SOON);
    assert_eq!(code, Some(0));
    assert!(
        stdout.starts_with("\"jobs\" is not held on the quorum"),
        "{stdout}"
    );
}
