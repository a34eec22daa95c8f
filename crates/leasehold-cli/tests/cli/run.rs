//! `leasehold run`: mutual exclusion, conflicts, exit statuses, the environment.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use leasehold::redis;
use leasehold_tests::{RedisServer, TempDir};

use crate::{finish, leasehold, lock_exists, one_error_line, Running, LEASEHOLD, SOON};

/// Starts `leasehold run` holding `name` with a program that prints `held FENCE TOKEN` and then waits for stdin to
/// close (see [`Running::close_stdin`]).
fn holder(server: &RedisServer, name: &str, ttl: &str) -> Running {
    let mut command = leasehold(&[
        "run",
        "--redis",
        &server.url(),
        "--ttl",
        ttl,
        name,
        "--",
        "sh",
        "-c",
        "echo held $LEASEHOLD_FENCE $LEASEHOLD_TOKEN; read line; exit 0",
    ]);
    command.stdin(Stdio::piped());
    let running = Running::start(command);
    let line = running.line(SOON);
    assert!(line.starts_with("held "), "{line}");
    running
}

#[test]
fn concurrent_runs_exclude_each_other() {
    const RUNS: usize = 10;
    const INCREMENTS: usize = 3;
    let server = RedisServer::start();
    let dir = TempDir::new("cli-exclusion");
    let log = dir.path().join("sections");
    // A non-atomic increment with a pause between read and write, bracketed in a log of section boundaries.
    let program = format!(
        "echo start >> {log}; for i in $(seq {INCREMENTS}); do \
           v=$(redis-cli -p {port} GET counter); sleep 0.01; redis-cli -p {port} SET counter $((v + 1)) >/dev/null; \
         done; echo end >> {log}",
        log = log.display(),
        port = server.port()
    );
    let url = server.url();
    let mut runs: Vec<Running> = (0..RUNS)
        .map(|_| {
            Running::start(leasehold(&[
                "run", "--redis", &url, "counter", "--", "sh", "-c", &program,
            ]))
        })
        .collect();
    for run in &mut runs {
        assert_eq!(
            run.code(Duration::from_secs(60)),
            Some(0),
            "{}",
            run.stderr()
        );
    }
    let counter: i64 = redis::cmd("GET")
        .arg("counter")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(counter, (RUNS * INCREMENTS) as i64);
    let sections = std::fs::read_to_string(&log).unwrap();
    let expected: Vec<&str> = ["start", "end"].repeat(RUNS);
    assert_eq!(
        sections.lines().collect::<Vec<_>>(),
        expected,
        "sections overlapped"
    );
    assert!(!lock_exists(&server, "counter"));
}

#[test]
fn a_held_lock_gives_the_conflict_status_without_waiting_or_after_the_wait() {
    let server = RedisServer::start();
    let url = server.url();
    let mut held = holder(&server, "busy", "30s");
    let ran = "echo ran";

    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run",
            "--redis",
            &url,
            "--nonblock",
            "busy",
            "--",
            "sh",
            "-c",
            ran,
        ]),
        SOON,
    );
    assert_eq!(code, Some(75));
    assert_eq!(stdout, "", "the program must not run");
    assert!(
        one_error_line(&stderr).contains("held by another owner"),
        "{stderr}"
    );

    let (code, _, _) = finish(
        leasehold(&[
            "run",
            "--redis",
            &url,
            "-n",
            "--conflict-exit-code",
            "9",
            "busy",
            "--",
            "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(9));

    let (code, _, stderr) = finish(
        leasehold(&["run", "--redis", &url, "-n", "-q", "busy", "--", "true"]),
        SOON,
    );
    assert_eq!(
        (code, stderr.as_str()),
        (Some(75), ""),
        "--quiet says nothing"
    );

    let started = Instant::now();
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run", "--redis", &url, "--wait", "300ms", "busy", "--", "sh", "-c", ran,
        ]),
        SOON,
    );
    let waited = started.elapsed();
    assert_eq!(code, Some(75));
    assert_eq!(stdout, "");
    assert!(one_error_line(&stderr).contains("still held"), "{stderr}");
    assert!(
        waited >= Duration::from_millis(300),
        "gave up after {waited:?}"
    );
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");

    held.close_stdin();
    assert_eq!(held.code(SOON), Some(0));
    assert!(
        !lock_exists(&server, "busy"),
        "released when the program exited"
    );
}

#[test]
fn a_long_name_is_cut_in_messages() {
    let server = RedisServer::start();
    let name = "n".repeat(300);
    let mut held = holder(&server, &name, "30s");
    let (code, _, stderr) = finish(
        leasehold(&["run", "--redis", &server.url(), "-n", &name, "true"]),
        SOON,
    );
    assert_eq!(code, Some(75), "{stderr}");
    let line = one_error_line(&stderr);
    let cut = format!(
        "leasehold: lock \"{}\"…(300 bytes) is held by another owner (host=",
        "n".repeat(60)
    );
    assert!(line.starts_with(&cut), "{line}");
    held.close_stdin();
    assert_eq!(held.code(SOON), Some(0));
}

#[test]
fn the_programs_exit_status_passes_through() {
    let server = RedisServer::start();
    let url = server.url();
    for (program, expected) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("exit 255", 255),
        ("kill -KILL $$", 137),
        ("kill -TERM $$", 143),
    ] {
        let (code, _, stderr) = finish(
            leasehold(&["run", "--redis", &url, "status", "--", "sh", "-c", program]),
            SOON,
        );
        assert_eq!(code, Some(expected), "{program}: {stderr}");
        assert_eq!(stderr, "", "{program}");
        assert!(!lock_exists(&server, "status"));
    }
}

#[test]
fn the_program_needs_no_double_dash_and_gets_its_arguments_verbatim() {
    let server = RedisServer::start();
    let url = server.url();
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run", "--redis", &url, "-n", "verbatim", "printf", "%s|", "-la", "--ttl", "1s", "--",
            "-c",
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "-la|--ttl|1s|--|-c|");
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run", "--redis", &url, "verbatim", "--", "printf", "%s|", "-n",
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "-n|");
    assert!(!lock_exists(&server, "verbatim"));
}

#[test]
fn command_runs_a_shell_string_under_the_lock() {
    let server = RedisServer::start();
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run",
            "--redis",
            &server.url(),
            "-c",
            "echo \"$LEASEHOLD_NAME\" | tr a-z A-Z; exit 3",
            "shell-job",
        ]),
        SOON,
    );
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(stdout, "SHELL-JOB");
    assert!(!lock_exists(&server, "shell-job"));
}

#[test]
fn a_missing_program_exits_127_one_that_cannot_execute_126_and_the_lock_is_freed_at_once() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("cli-127");
    let not_executable = dir.path().join("script.sh");
    std::fs::write(&not_executable, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&not_executable, std::fs::Permissions::from_mode(0o644)).unwrap();
    for (program, expected) in [
        ("/nonexistent/program", 127),
        ("no-such-program-leasehold-test", 127),
        (not_executable.to_str().unwrap(), 126),
    ] {
        let (code, _, stderr) = finish(
            leasehold(&["run", "--redis", &url, "--ttl", "30s", "job", "--", program]),
            SOON,
        );
        assert_eq!(code, Some(expected), "{program}");
        assert!(one_error_line(&stderr).contains("cannot run"), "{stderr}");
        assert!(
            !lock_exists(&server, "job"),
            "the lock must be free at once, not after its 30 s lease"
        );
    }
}

#[test]
fn the_program_gets_the_name_token_and_a_growing_fence() {
    let server = RedisServer::start();
    let url = server.url();
    let mut fences = Vec::new();
    for _ in 0..2 {
        let (code, stdout, _) = finish(
            leasehold(&[
                "run",
                "--redis",
                &url,
                "env-check",
                "--",
                "sh",
                "-c",
                r#"printf '%s\t%s\t%s' "$LEASEHOLD_NAME" "$LEASEHOLD_TOKEN" "$LEASEHOLD_FENCE""#,
            ]),
            SOON,
        );
        assert_eq!(code, Some(0));
        let fields: Vec<&str> = stdout.split('\t').collect();
        assert_eq!(fields.len(), 3, "{stdout}");
        assert_eq!(fields[0], "env-check");
        // The token as stored in Redis: `dl1:`, 32 hex digits, then the holder's description after a space.
        let (id, description) = fields[1].split_once(' ').unwrap();
        assert!(
            id.starts_with("dl1:")
                && id.len() == 36
                && id[4..].bytes().all(|b| b.is_ascii_hexdigit()),
            "{stdout}"
        );
        assert!(
            description.starts_with("host=") && description.contains(" program=sh -c printf "),
            "{stdout}"
        );
        fences.push(fields[2].parse::<u64>().unwrap());
    }
    assert!(fences[1] > fences[0], "{fences:?}");
}

#[test]
fn stdin_reaches_the_program() {
    let server = RedisServer::start();
    let mut command = leasehold(&[
        "run",
        "--redis",
        &server.url(),
        "stdin",
        "--",
        "sh",
        "-c",
        "read a; echo got $a",
    ]);
    command.stdin(Stdio::piped());
    let mut running = Running::start(command);
    running.take_stdin().write_all(b"hello\n").unwrap();
    assert_eq!(running.line(SOON), "got hello");
    assert_eq!(running.code(SOON), Some(0));
}

#[test]
fn a_program_can_read_the_terminal_and_the_shell_gets_it_back() {
    // `script` gives the shell a terminal of its own. The program runs in its own process group; without the
    // terminal handed to that group its `read` would stop it (SIGTTIN), and without the terminal handed back the
    // shell's `read` would stop the shell.
    let server = RedisServer::start();
    let inner = format!(
        "{LEASEHOLD} run --redis {} tty -- sh -c 'read x; echo got $x'; read y; echo after $y",
        server.url()
    );
    let mut command = std::process::Command::new("script");
    command
        .args(["-qec", &inner, "/dev/null"])
        .env_remove("LEASEHOLD_REDIS_URL")
        .stdin(Stdio::piped());
    let mut running = Running::start(command);
    running.take_stdin().write_all(b"hello\nworld\n").unwrap();
    assert_eq!(running.code(SOON), Some(0));
    let output = running.rest(SOON).join("\n");
    assert!(output.contains("got hello"), "{output}");
    assert!(output.contains("after world"), "{output}");
}

#[test]
fn wait_zero_tries_once_and_the_short_flags_work() {
    let server = RedisServer::start();
    let url = server.url();
    let mut holder_command = leasehold(&[
        "run",
        "--redis",
        &url,
        "busy",
        "--",
        "sh",
        "-c",
        "echo held; read line; exit 0",
    ]);
    holder_command.stdin(std::process::Stdio::piped());
    let mut holder = Running::start(holder_command);
    assert_eq!(holder.line(SOON), "held");
    // `-w 0` is a single try (as `flock -w 0`), `-E` sets the conflict status.
    let started = std::time::Instant::now();
    let (code, _, stderr) = finish(
        leasehold(&[
            "run", "--redis", &url, "-w", "0", "-E", "9", "busy", "--", "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(9), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "it waited"
    );
    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
}

#[test]
fn rust_log_shows_the_library_events() {
    let server = RedisServer::start();
    let mut command = leasehold(&["run", "--redis", &server.url(), "logged", "true"]);
    command.env("RUST_LOG", "leasehold=debug");
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("granted") && stderr.contains("lock=logged"),
        "{stderr}"
    );
    assert!(stderr.contains("released"), "{stderr}");

    // EnvFilter's syntax: a span filter picks the events inside the library's acquire span.
    let mut command = leasehold(&["run", "--redis", &server.url(), "logged", "true"]);
    command.env("RUST_LOG", "warn,[acquire]=debug");
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("not understood"), "{stderr}");
    assert!(stderr.contains("granted"), "{stderr}");

    // Without it, a clean run prints nothing.
    let (code, _, stderr) = finish(
        leasehold(&["run", "--redis", &server.url(), "logged", "true"]),
        SOON,
    );
    assert_eq!(code, Some(0));
    assert_eq!(stderr, "");

    // A value it cannot read is said once and ignored.
    let mut command = leasehold(&["run", "--redis", &server.url(), "logged", "true"]);
    command.env("RUST_LOG", "leasehold=loud");
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(one_error_line(&stderr).contains("RUST_LOG"), "{stderr}");
}
