//! `dlock status` and `dlock release --force`.

use std::process::Stdio;

use dlock_tests::RedisServer;
use serde_json::Value;

use crate::{dlock, finish, Running, SOON};

fn status_json(url: &str, name: &str) -> Value {
    let (code, stdout, stderr) = finish(dlock(&["status", "--json", "--redis", url, name]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn status_shows_free_and_held_locks_and_force_release_removes_the_holder() {
    let server = RedisServer::start();
    let url = server.url();

    let (code, stdout, _) = finish(dlock(&["status", "--redis", &url, "jobs"]), SOON);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "\"jobs\" is free (no fence on record)");
    let free = status_json(&url, "jobs");
    assert_eq!(
        free,
        serde_json::json!({
            "name": "jobs", "state": "free", "remaining_ms": null, "fence": null, "token": null, "waiting_clients": 0
        })
    );

    let mut command = dlock(&[
        "run",
        "--redis",
        &url,
        "--ttl",
        "1s",
        "jobs",
        "--",
        "sh",
        "-c",
        "echo $DLOCK_FENCE $DLOCK_TOKEN; read line; exit 0",
    ]);
    command.stdin(Stdio::piped());
    let mut holder = Running::start(command);
    let line = holder.line(SOON);
    let (fence, token) = line.split_once(' ').unwrap();
    let fence: u64 = fence.parse().unwrap();

    let (code, stdout, _) = finish(dlock(&["status", "--redis", &url, "jobs"]), SOON);
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

    let (code, _, stderr) = finish(dlock(&["release", "--redis", &url, "jobs"]), SOON);
    assert_eq!(code, Some(2), "{stderr}");
    let (code, stdout, _) = finish(
        dlock(&["release", "--redis", &url, "--force", "jobs"]),
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
        dlock(&["release", "--redis", &url, "--force", "jobs"]),
        SOON,
    );
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "lock \"jobs\" was free; nothing removed");
}
