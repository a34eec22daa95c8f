//! Signals sent to `leasehold`: passed on to the program, or ending a wait without running anything.

use std::process::Stdio;

use leasehold_tests::{send_signal, RedisServer, TempDir};
use nix::sys::signal::Signal;

use crate::{await_waiter, leasehold, lock_exists, Running, SOON};

#[test]
fn sigterm_reaches_the_program_and_the_lock_is_released_after_it_exits() {
    let server = RedisServer::start();
    let dir = TempDir::new("cli-signals");
    let marker = dir.path().join("marker");
    let program = format!(
        r#"trap 'echo got-term > {}; exit 0' TERM; echo ready; sleep 60 & wait"#,
        marker.display()
    );
    let mut run = Running::start(leasehold(&[
        "run",
        "--redis",
        &server.url(),
        "sig",
        "--",
        "sh",
        "-c",
        &program,
    ]));
    assert_eq!(run.line(SOON), "ready");
    assert!(lock_exists(&server, "sig"));

    send_signal(run.pid(), Signal::SIGTERM).unwrap();

    assert_eq!(
        run.code(SOON),
        Some(0),
        "the program's status, not a signal death"
    );
    assert_eq!(run.stderr(), "");
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "got-term");
    assert!(!lock_exists(&server, "sig"));
}

#[test]
fn sigint_and_sighup_end_the_program_and_leasehold_reports_128_plus_the_signal() {
    let server = RedisServer::start();
    for (signal, expected) in [(Signal::SIGINT, 130), (Signal::SIGHUP, 129)] {
        let mut run = Running::start(leasehold(&[
            "run",
            "--redis",
            &server.url(),
            "sig",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 60",
        ]));
        assert_eq!(run.line(SOON), "ready");
        send_signal(run.pid(), signal).unwrap();
        assert_eq!(run.code(SOON), Some(expected), "{signal}");
        assert!(!lock_exists(&server, "sig"));
    }
}

#[test]
fn a_signal_while_waiting_ends_the_wait_without_running_the_program() {
    let server = RedisServer::start();
    let url = server.url();
    let mut holder_command = leasehold(&[
        "run",
        "--redis",
        &url,
        "queue",
        "--",
        "sh",
        "-c",
        "echo held; read line; exit 0",
    ]);
    holder_command.stdin(Stdio::piped());
    let mut holder = Running::start(holder_command);
    assert_eq!(holder.line(SOON), "held");

    let mut waiter = Running::start(leasehold(&[
        "run", "--redis", &url, "queue", "--", "sh", "-c", "echo ran",
    ]));
    await_waiter(&server, "queue");
    send_signal(waiter.pid(), Signal::SIGTERM).unwrap();

    assert_eq!(waiter.code(SOON), Some(143));
    assert!(waiter
        .stderr()
        .contains("SIGTERM while waiting for lock \"queue\""));
    assert!(
        waiter.rest(SOON).is_empty(),
        "the program must not have run"
    );

    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
    assert!(!lock_exists(&server, "queue"));
}
