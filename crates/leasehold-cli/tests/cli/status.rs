//! `leasehold status` and `leasehold release --force`.

use std::process::Stdio;

use leasehold_tests::RedisServer;
use serde_json::Value;

use crate::{finish, leasehold, Running, SOON};

fn status_json(url: &str, name: &str) -> Value {
    let (code, stdout, stderr) =
        finish(leasehold(&["status", "--json", "--redis", url, name]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn status_shows_free_and_held_locks_and_force_release_removes_the_holder() {
    let server = RedisServer::start();
    let url = server.url();

    let (code, stdout, _) = finish(leasehold(&["status", "--redis", &url, "jobs"]), SOON);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "\"jobs\" is free (no fence on record)");
    let free = status_json(&url, "jobs");
    assert_eq!(
        free,
        serde_json::json!({
            "name": "jobs", "state": "free", "remaining_ms": null, "fence": null, "token": null, "waiting_clients": 0,
            "warnings": []
        })
    );

    let mut command = leasehold(&[
        "run",
        "--redis",
        &url,
        "--ttl",
        "1s",
        "jobs",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE $LEASEHOLD_TOKEN; read line; exit 0",
    ]);
    command.stdin(Stdio::piped());
    let mut holder = Running::start(command);
    let line = holder.line(SOON);
    let (fence, token) = line.split_once(' ').unwrap();
    let fence: u64 = fence.parse().unwrap();

    let (code, stdout, _) = finish(leasehold(&["status", "--redis", &url, "jobs"]), SOON);
    assert_eq!(code, Some(0));
    assert!(
        stdout.starts_with(&format!("\"jobs\" is held: fence {fence}, ")),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(&format!("left, token {token}")),
        "{stdout}"
    );
    let held = status_json(&url, "jobs");
    assert_eq!(held["state"], "held");
    assert_eq!(held["fence"], fence);
    assert_eq!(held["token"], token);
    let remaining = held["remaining_ms"].as_u64().unwrap();
    assert!(remaining > 0 && remaining <= 1000, "{held}");

    let (code, _, stderr) = finish(leasehold(&["release", "--redis", &url, "jobs"]), SOON);
    assert_eq!(code, Some(2), "{stderr}");
    let (code, stdout, _) = finish(
        leasehold(&["release", "--redis", &url, "--force", "jobs"]),
        SOON,
    );
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains(token) && stdout.contains(&format!("fence {fence}")),
        "{stdout}"
    );

    // The holder learns at its next renewal (a third of its 1 s lease) and stops its program.
    assert_eq!(holder.code(SOON), Some(76));
    assert!(holder
        .stderr()
        .contains("lost lock \"jobs\": the key was gone"));

    let after = status_json(&url, "jobs");
    assert_eq!(after["state"], "free");
    assert_eq!(after["fence"], fence, "the last fence stays on record");
    let (code, stdout, _) = finish(
        leasehold(&["release", "--redis", &url, "--force", "jobs"]),
        SOON,
    );
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "lock \"jobs\" was free; nothing removed");
}

#[test]
fn status_warns_when_the_server_may_evict_a_held_lock() {
    let server =
        RedisServer::start_with(&["--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru"]);
    let url = server.url();
    let (code, stdout, stderr) = finish(
        leasehold(&["status", "--json", "--redis", &url, "jobs"]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let json: Value = serde_json::from_str(&stdout).unwrap();
    let warnings = json["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{json}");
    assert!(
        warnings[0].as_str().unwrap().contains("allkeys-lru"),
        "{json}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("leasehold: warning: ") && lines[0].contains("noeviction"),
        "{stderr}"
    );
}

#[test]
fn a_redis_user_without_channel_permission_exits_69_with_one_line() {
    let server = RedisServer::start_with(&[
        "--user",
        "nochannels",
        "on",
        ">pw",
        "~*",
        "resetchannels",
        "+@all",
    ]);
    let url = format!("redis://nochannels:pw@127.0.0.1:{}", server.port());
    let (code, _, stderr) = finish(
        leasehold(&["run", "--redis", &url, "jobs", "--", "true"]),
        SOON,
    );
    assert_eq!(code, Some(69), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("&leasehold:wake:*"), "{stderr}");
}
