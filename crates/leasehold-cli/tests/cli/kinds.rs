//! `leasehold run --permits`, `--shared`, `--exclusive` and `--fair`, and what `status` says of those kinds.

use std::process::Stdio;

use leasehold_tests::RedisServer;

use crate::{
    await_waiter, finish, leasehold, lock_exists, one_error_line, poll_until, Running, SOON,
};

/// Starts `leasehold run FLAGS NAME` with a program that prints `held FENCE` and waits for stdin to close.
fn holder(server: &RedisServer, flags: &[&str], name: &str) -> Running {
    let url = server.url();
    let mut args = vec!["run", "--redis", url.as_str()];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[
        name,
        "--",
        "sh",
        "-c",
        "echo held $LEASEHOLD_FENCE; read line; exit 0",
    ]);
    let mut command = leasehold(&args);
    command.stdin(Stdio::piped());
    let running = Running::start(command);
    let line = running.line(SOON);
    assert!(line.starts_with("held "), "{line}");
    running
}

/// `leasehold run --nonblock FLAGS NAME -- true`: its exit status.
fn try_run(server: &RedisServer, flags: &[&str], name: &str) -> (Option<i32>, String) {
    let url = server.url();
    let mut args = vec!["run", "--redis", url.as_str(), "--nonblock"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[name, "--", "true"]);
    let (code, _, stderr) = finish(leasehold(&args), SOON);
    (code, stderr)
}

#[test]
fn permits_let_that_many_runs_hold_a_name_at_once() {
    let server = RedisServer::start();
    let mut first = holder(&server, &["--permits", "2"], "exports");
    let mut second = holder(&server, &["--permits", "2"], "exports");
    let (code, stderr) = try_run(&server, &["--permits", "2"], "exports");
    assert_eq!(code, Some(75), "{stderr}");

    let (code, stdout, _) = finish(
        leasehold(&["status", "--redis", &server.url(), "exports"]),
        SOON,
    );
    assert_eq!(code, Some(0));
    assert!(
        stdout.starts_with("\"exports\" is a semaphore of 2 permits held by 2 holders"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("1 permit by ").count(), 2, "{stdout}");
    let (_, json, _) = finish(
        leasehold(&["status", "--redis", &server.url(), "--json", "exports"]),
        SOON,
    );
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["kind"], "semaphore");
    assert_eq!(json["holders"].as_array().unwrap().len(), 2);
    assert_eq!(json["permits"], 2);

    first.close_stdin();
    assert_eq!(first.code(SOON), Some(0));
    let (code, stderr) = try_run(&server, &["--permits", "2"], "exports");
    assert_eq!(code, Some(0), "{stderr}");
    second.close_stdin();
    assert_eq!(second.code(SOON), Some(0));
    assert!(!lock_exists(&server, "exports"));
}

#[test]
fn another_permit_count_for_a_semaphore_in_use_is_status_65_naming_both_counts() {
    let server = RedisServer::start();
    let mut first = holder(&server, &["--permits", "2"], "exports");
    let mut second = holder(&server, &["--permits", "2"], "exports");
    for flags in [&["--nonblock"][..], &["--wait", "5s"][..]] {
        let url = server.url();
        let mut args = vec!["run", "--redis", url.as_str(), "--permits", "3"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["exports", "--", "true"]);
        let (code, stdout, stderr) = finish(leasehold(&args), SOON);
        assert_eq!(code, Some(65), "{flags:?}: {stderr}");
        assert!(stdout.is_empty(), "the program never ran: {stdout}");
        let line = one_error_line(&stderr);
        assert!(
            line.contains("exports") && line.contains(" 2 ") && line.contains(" 3"),
            "{line}"
        );
    }
    let (_, listed, _) = finish(leasehold(&["list", "--redis", &server.url()]), SOON);
    let row = listed.lines().find(|l| l.starts_with("exports")).unwrap();
    assert_eq!(row.split_whitespace().nth(2), Some("2"), "{listed}");
    let (_, json, _) = finish(
        leasehold(&["list", "--json", "--redis", &server.url()]),
        SOON,
    );
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json[0]["permits"], 2, "{json}");
    first.close_stdin();
    second.close_stdin();
    assert_eq!((first.code(SOON), second.code(SOON)), (Some(0), Some(0)));
    // Free again: the next run's count is the semaphore's.
    let (code, stderr) = try_run(&server, &["--permits", "3"], "exports");
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn permits_changes_the_count_of_a_semaphore_in_use() {
    let server = RedisServer::start();
    let url = server.url();
    let permits = |args: &[&str]| {
        let mut all = vec!["permits", "--redis", url.as_str()];
        all.extend_from_slice(args);
        finish(leasehold(&all), SOON)
    };
    // Free: nothing to store.
    let (code, stdout, stderr) = permits(&["exports", "3"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("is free"), "{stdout}");

    let mut first = holder(&server, &["--permits", "2"], "exports");
    let mut second = holder(&server, &["--permits", "2"], "exports");
    let (code, stderr) = try_run(&server, &["--permits", "3"], "exports");
    assert_eq!(code, Some(65), "{stderr}");
    let (code, stdout, stderr) = permits(&["--json", "exports", "3"]);
    assert_eq!(code, Some(0), "{stderr}");
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (answer["permits"].as_u64(), answer["previous"].as_u64()),
        (Some(3), Some(2)),
        "{answer}"
    );
    // Now a third run fits, with the new count; the old count is refused.
    let (code, stderr) = try_run(&server, &["--permits", "3"], "exports");
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = try_run(&server, &["--permits", "2"], "exports");
    assert_eq!(code, Some(65), "{stderr}");
    first.close_stdin();
    second.close_stdin();
    assert_eq!((first.code(SOON), second.code(SOON)), (Some(0), Some(0)));

    // Another kind: 65, one line; a count of 0: a usage error.
    let mut plain = holder(&server, &[], "ledger");
    let (code, _, stderr) = permits(&["ledger", "2"]);
    assert_eq!(code, Some(65), "{stderr}");
    assert!(one_error_line(&stderr).contains("ledger"), "{stderr}");
    plain.close_stdin();
    assert_eq!(plain.code(SOON), Some(0));
    let (code, _, stderr) = permits(&["exports", "0"]);
    assert_eq!(code, Some(2), "{stderr}");
}

#[test]
fn shared_runs_overlap_and_an_exclusive_one_runs_alone() {
    let server = RedisServer::start();
    let mut a = holder(&server, &["--shared"], "schema");
    let mut b = holder(&server, &["--shared"], "schema");
    let (code, stderr) = try_run(&server, &["--exclusive"], "schema");
    assert_eq!(code, Some(75), "{stderr}");
    a.close_stdin();
    b.close_stdin();
    assert_eq!((a.code(SOON), b.code(SOON)), (Some(0), Some(0)));
    let mut writer = holder(&server, &["--exclusive"], "schema");
    let (code, stderr) = try_run(&server, &["--shared"], "schema");
    assert_eq!(code, Some(75), "{stderr}");
    writer.close_stdin();
    assert_eq!(writer.code(SOON), Some(0));
}

#[test]
fn a_name_used_as_another_kind_is_status_65_and_bad_permits_a_usage_error() {
    let server = RedisServer::start();
    let mut fair = holder(&server, &["--fair"], "ledger");
    let (code, stderr) = try_run(&server, &[], "ledger");
    assert_eq!(code, Some(65), "{stderr}");
    assert!(one_error_line(&stderr).contains("ledger"), "{stderr}");
    fair.close_stdin();
    assert_eq!(fair.code(SOON), Some(0));
    for bad in ["0", "-1", "x"] {
        let (code, stderr) = try_run(&server, &["--permits", bad], "pool");
        assert_eq!(code, Some(2), "--permits {bad}: {stderr}");
    }
    let (code, stderr) = try_run(&server, &["--fair", "--shared"], "pool");
    assert_eq!(code, Some(2), "{stderr}");
}

#[test]
fn a_nested_run_of_the_same_lock_runs_at_once_and_leaves_the_outer_lock_held() {
    let server = RedisServer::start();
    let url = server.url();
    let bin = crate::LEASEHOLD;
    // The outer program runs the same lock again (as the same kind), then says whether the lock is still held after
    // the inner run.
    for flags in [&[][..], &["--permits", "2"][..], &["--fair"][..]] {
        let script = format!(
            "{bin} run --redis {url} {} --wait 2s job -- sh -c 'echo inner $LEASEHOLD_FENCE'; \
             echo inner-exit $?; {bin} status --redis {url} job",
            flags.join(" ")
        );
        let mut args = vec!["run", "--redis", url.as_str()];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["job", "--", "sh", "-c", &script]);
        let (code, stdout, stderr) = finish(leasehold(&args), SOON);
        assert_eq!(code, Some(0), "{flags:?}: {stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert!(lines[0].starts_with("inner "), "{flags:?}: {stdout}");
        assert_eq!(lines[1], "inner-exit 0", "{flags:?}: {stdout}");
        assert!(
            lines[2].contains("held"),
            "the outer lock is still held: {stdout}"
        );
        assert!(
            !lock_exists(&server, "job"),
            "released when the outer run ended"
        );
    }
}

/// A nested run goes on under the outer grant only when that grant covers what it asks for: an exclusive grant covers
/// every kind, a read share covers `--shared`, permits cover `--permits` of the same count. Any other pair fails at
/// once with 65 and one line (waiting would wait for its own outer grant; running would break the inner kind's
/// promise, as two `--shared` runs each running a plain run inside did).
#[test]
fn a_nested_run_nests_only_under_an_outer_grant_that_covers_its_kind() {
    let server = RedisServer::start();
    let url = server.url();
    let bin = crate::LEASEHOLD;
    let cases: &[(&[&str], &[&str], bool)] = &[
        (&["--shared"], &[], false),
        (&["--shared"], &["--exclusive"], false),
        (&["--shared"], &["--permits", "2"], false),
        (&["--permits", "2"], &[], false),
        (&["--permits", "2"], &["--permits", "3"], false),
        (&["--permits", "2"], &["--shared"], false),
        (&["--shared"], &["--shared"], true),
        (&["--permits", "2"], &["--permits", "2"], true),
        (&[], &["--shared"], true),
        (&["--exclusive"], &[], true),
        (&["--exclusive"], &["--shared"], true),
        (&["--fair"], &["--fair"], true),
    ];
    for (outer, inner, nests) in cases {
        let script = format!(
            "{bin} run --redis {url} {} --wait 2s job -- sh -c 'echo inner'; echo inner-exit $?",
            inner.join(" ")
        );
        let mut args = vec!["run", "--redis", url.as_str()];
        args.extend_from_slice(outer);
        args.extend_from_slice(&["job", "--", "sh", "-c", &script]);
        let (code, stdout, stderr) = finish(leasehold(&args), SOON);
        let pair = format!("{inner:?} inside {outer:?}");
        assert_eq!(code, Some(0), "{pair}: {stderr}");
        if *nests {
            assert_eq!(stdout, "inner\ninner-exit 0", "{pair}: {stderr}");
            assert_eq!(stderr, "", "{pair}");
        } else {
            assert_eq!(stdout, "inner-exit 65", "{pair}: {stderr}");
            let line = one_error_line(&stderr);
            assert!(
                line.contains("cannot nest") && line.contains("lock \"job\""),
                "{pair}: {line}"
            );
        }
        assert!(!lock_exists(&server, "job"), "{pair}: released");
    }
}

/// Waits until `leasehold status` counts a waiting client on `name` (any kind).
fn await_waiting(server: &RedisServer, name: &str) {
    poll_until(&format!("a run waits for {name:?}"), || {
        let (_, json, _) = finish(
            leasehold(&["status", "--redis", &server.url(), "--json", name]),
            SOON,
        );
        let status: serde_json::Value = serde_json::from_str(&json).unwrap();
        status["waiting_clients"].as_u64().unwrap() > 0
    });
}

/// Starts `leasehold run FLAGS NAME` with a program that prints `ran FENCE`; it is expected to wait first.
fn waiter(server: &RedisServer, flags: &[&str], name: &str) -> Running {
    let url = server.url();
    let mut args = vec!["run", "--redis", url.as_str()];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[name, "sh", "-c", "echo ran $LEASEHOLD_FENCE"]);
    Running::start(leasehold(&args))
}

#[test]
fn a_plain_run_waits_behind_a_shared_holder_and_runs_after_it() {
    let server = RedisServer::start();
    let mut reader = holder(&server, &["-s"], "schema");
    // Not 65: a plain run takes the read-write lock's write side, as flock's default -x does.
    let (code, stderr) = try_run(&server, &[], "schema");
    assert_eq!(code, Some(75), "{stderr}");
    assert!(
        one_error_line(&stderr).contains("held by another owner"),
        "{stderr}"
    );

    let mut plain = waiter(&server, &[], "schema");
    await_waiting(&server, "schema");
    // A write waiter holds later readers back.
    let (code, stderr) = try_run(&server, &["--shared"], "schema");
    assert_eq!(code, Some(75), "{stderr}");
    reader.close_stdin();
    assert_eq!(reader.code(SOON), Some(0));
    assert!(plain.line(SOON).starts_with("ran "));
    assert_eq!(plain.code(SOON), Some(0), "{}", plain.stderr());
    assert_eq!(plain.stderr(), "");
    assert!(!lock_exists(&server, "schema"));
}

#[test]
fn a_shared_or_exclusive_run_waits_behind_a_plain_holder_and_runs_after_it() {
    let server = RedisServer::start();
    for flag in ["--shared", "-x"] {
        let mut plain = holder(&server, &[], "reports");
        let (code, stderr) = try_run(&server, &[flag], "reports");
        assert_eq!(code, Some(75), "{flag}: {stderr}");
        let mut shared = waiter(&server, &[flag], "reports");
        await_waiter(&server, "reports");
        plain.close_stdin();
        assert_eq!(plain.code(SOON), Some(0));
        assert!(shared.line(SOON).starts_with("ran "), "{flag}");
        assert_eq!(shared.code(SOON), Some(0), "{flag}");
        // The release of the read-write lock is clean although a mutex was released under the name just before.
        assert_eq!(shared.stderr(), "", "{flag}");
        assert!(!lock_exists(&server, "reports"));
    }
    // The other order once more, now that the name served both kinds: a plain run after a shared one.
    let (code, stderr) = try_run(&server, &["-s"], "reports");
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = try_run(&server, &[], "reports");
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn fair_and_permits_keep_a_name_to_their_own_kind() {
    let server = RedisServer::start();
    let mut reader = holder(&server, &["--shared"], "pool");
    for flags in [&["--fair"][..], &["--permits", "2"]] {
        let (code, stderr) = try_run(&server, flags, "pool");
        assert_eq!(code, Some(65), "{flags:?}: {stderr}");
    }
    reader.close_stdin();
    assert_eq!(reader.code(SOON), Some(0));
}

#[test]
fn wait_takes_a_bare_number_of_seconds() {
    let server = RedisServer::start();
    let mut plain = holder(&server, &[], "slow");
    let started = std::time::Instant::now();
    let (code, _, stderr) = finish(
        leasehold(&[
            "run",
            "--redis",
            &server.url(),
            "-w",
            "0.5",
            "-s",
            "slow",
            "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(75), "{stderr}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(500));
    // The whole wait, not the part left when it turned to the mutex.
    assert!(
        one_error_line(&stderr).contains("after waiting 500ms"),
        "{stderr}"
    );
    plain.close_stdin();
    assert_eq!(plain.code(SOON), Some(0));
}

#[test]
fn a_nested_plain_run_under_the_write_lock_fallback_runs_at_once() {
    let server = RedisServer::start();
    let url = server.url();
    let bin = crate::LEASEHOLD;
    let mut reader = holder(&server, &["--shared"], "job");
    let script = format!(
        "{bin} run --redis {url} --wait 2s job sh -c 'echo inner $LEASEHOLD_FENCE'; echo inner-exit $?; \
         {bin} status --redis {url} job"
    );
    let outer = Running::start(leasehold(&[
        "run", "--redis", &url, "job", "sh", "-c", &script,
    ]));
    await_waiting(&server, "job");
    reader.close_stdin();
    assert_eq!(reader.code(SOON), Some(0));
    let inner = outer.line(SOON);
    assert!(inner.starts_with("inner "), "{inner}");
    assert_eq!(outer.line(SOON), "inner-exit 0");
    let status = outer.line(SOON);
    assert!(
        status.contains("read-write lock") && status.contains("held"),
        "{status}"
    );
    let mut outer = outer;
    assert_eq!(outer.code(SOON), Some(0), "{}", outer.stderr());
    assert!(!lock_exists(&server, "job"));
}
