//! `leasehold status` and `leasehold release --force`.

use std::process::Stdio;

use leasehold_tests::RedisServer;
use serde_json::Value;

use crate::{finish, leasehold, one_error_line, Running, SOON};

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
            "name": "jobs", "state": "free", "remaining_ms": null, "fence": null, "token": null, "description": null,
            "value": null, "term": null, "holder": null, "waiting_clients": 0, "kind": null, "permits": null, "holders": [],
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
    // The token carries the holder's description after a space; messages show its random part.
    let token_id = token.split(' ').next().unwrap();
    let description = token.split_once(' ').unwrap().1;
    assert!(description.starts_with("host="), "{token}");

    let (code, stdout, _) = finish(leasehold(&["status", "--redis", &url, "jobs"]), SOON);
    assert_eq!(code, Some(0));
    assert!(
        stdout.starts_with(&format!(
            "\"jobs\" is held by {description}: fence {fence}, "
        )),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(&format!("left, token {token_id}")),
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
        stdout.contains(token_id)
            && stdout.contains(&format!("fence {fence}"))
            && stdout.contains(description),
        "{stdout}"
    );

    // The holder learns at its next renewal (a third of its 1 s lease) and stops its program.
    assert_eq!(holder.code(SOON), Some(76));
    assert!(holder
        .stderr()
        .contains("lost lock \"jobs\": the lock was gone"));

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

/// Starts `leasehold run` holding `name` (with `extra` options) until its stdin closes; returns it once the program
/// runs.
fn hold(url: &str, extra: &[&str], name: &str) -> Running {
    let mut args = vec!["run", "--redis", url];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[name, "sh", "-c", "echo ready; read line; exit 0"]);
    let mut command = leasehold(&args);
    command.stdin(Stdio::piped());
    let holder = Running::start(command);
    assert_eq!(holder.line(SOON), "ready");
    holder
}

#[test]
fn status_and_list_name_the_holder_and_a_conflict_says_who_holds_the_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let mut first = hold(&url, &[], "nightly-report");
    let mut second = hold(&url, &[], "nightly-export");

    let status = status_json(&url, "nightly-report");
    let holder = &status["holder"];
    assert_eq!(holder["pid"], first.pid(), "{status}");
    assert_eq!(
        holder["program"], "sh -c echo ready; read line; exit 0",
        "{status}"
    );
    let host = nix::unistd::gethostname().unwrap();
    assert_eq!(holder["host"], host.to_str().unwrap(), "{status}");
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .unwrap()
        .name;
    assert_eq!(holder["user"], user, "{status}");
    let started = humantime::parse_rfc3339(holder["started"].as_str().unwrap()).unwrap();
    let age = std::time::SystemTime::now()
        .duration_since(started)
        .unwrap();
    assert!(age < std::time::Duration::from_secs(60), "{status}");

    // A second run is told who holds the lock.
    let (code, _, stderr) = finish(
        leasehold(&["run", "-n", "--redis", &url, "nightly-report", "true"]),
        SOON,
    );
    assert_eq!(code, Some(75), "{stderr}");
    let line = one_error_line(&stderr);
    assert!(line.contains(&format!("pid={}", first.pid())), "{line}");

    // list: both, in name order, with their holders; a pattern narrows it.
    let (code, stdout, stderr) = finish(leasehold(&["list", "--redis", &url]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("NAME") && lines[0].ends_with("HOLDER"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("nightly-export ")
            && lines[1].contains(&format!("pid={}", second.pid())),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("nightly-report ")
            && lines[2].contains(&format!("pid={}", first.pid())),
        "{stdout}"
    );
    let (code, stdout, _) = finish(
        leasehold(&["list", "--json", "--redis", &url, "*-report"]),
        SOON,
    );
    assert_eq!(code, Some(0));
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{stdout}");
    assert_eq!(listed[0]["name"], "nightly-report");
    assert_eq!(listed[0]["holder"]["pid"], first.pid());

    first.close_stdin();
    second.close_stdin();
    assert_eq!(first.code(SOON), Some(0));
    assert_eq!(second.code(SOON), Some(0));
    let (code, stdout, _) = finish(leasehold(&["list", "--redis", &url]), SOON);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "no held locks match \"*\"");
}

#[test]
fn the_prefix_option_and_variable_reach_locks_under_another_prefix() {
    let server = RedisServer::start();
    let url = server.url();
    let mut holder = hold(&url, &["--prefix", "billing"], "invoices");
    assert_eq!(status_json(&url, "invoices")["state"], "free");
    let mut command = leasehold(&["status", "--json", "--redis", &url, "invoices"]);
    command.env("LEASEHOLD_PREFIX", "billing");
    let (code, stdout, stderr) = finish(command, SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["state"], "held", "{status}");
    let (_, stdout, _) = finish(
        leasehold(&["list", "--json", "--prefix", "billing", "--redis", &url]),
        SOON,
    );
    assert_eq!(
        serde_json::from_str::<Value>(&stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1,
        "{stdout}"
    );
    let (code, _, stderr) = finish(
        leasehold(&["status", "--prefix", "bad{prefix", "--redis", &url, "x"]),
        SOON,
    );
    assert_eq!(code, Some(2), "{stderr}");
    one_error_line(&stderr);
    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
}

#[test]
fn list_escapes_control_characters_and_aligns_wide_names() {
    let server = RedisServer::start();
    let url = server.url();
    let names = [
        "ascii-job",
        "報告-日本語",
        "e\u{301}té",
        "red\u{1b}[31mjob\nline",
    ];
    let mut holders: Vec<Running> = names.iter().map(|name| hold(&url, &[], name)).collect();
    let (code, stdout, stderr) = finish(leasehold(&["list", "--redis", &url]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stdout.contains('\u{1b}'), "{stdout:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1 + names.len(),
        "one line per lock: {stdout:?}"
    );
    assert!(stdout.contains("red\\u{1b}[31mjob\\nline"), "{stdout}");
    // Every HOLDER cell starts at the same terminal column: "host=" after the padding.
    let columns: Vec<usize> = lines[1..]
        .iter()
        .map(|line| {
            let at = line.find("host=").unwrap_or_else(|| panic!("{line}"));
            unicode_width::UnicodeWidthStr::width(&line[..at])
        })
        .collect();
    assert!(
        columns.windows(2).all(|w| w[0] == w[1]),
        "{columns:?}\n{stdout}"
    );
    for holder in &mut holders {
        holder.close_stdin();
        assert_eq!(holder.code(SOON), Some(0));
    }
}
